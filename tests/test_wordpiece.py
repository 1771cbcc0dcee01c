"""The edge runtime's pure-Python WordPiece tokenizer (toolkit.runtime.wordpiece) gives the `tokenizers`
library's ids: on every calibration text, raw and as the runtime prompts it, for every tokenizer.json ttsq
ships or builds; on every Unicode code point; and on random text."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HF
from tokenizers import normalizers, pre_tokenizers

from toolkit.models.tokenizer import CONTROL_TOKENS, build_char_tokenizer
from toolkit.runtime.wordpiece import BertNormalizer, TokenizerFormatError, WordPiece, bert_pre_tokenize
from toolkit.text import prompt_text

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "toolkit" / "assets" / "voice" / "tokenizer.json"
FIXTURE = ROOT / "tests" / "fixtures" / "chattts_tiny" / "asset" / "tokenizer" / "tokenizer.json"
TEXTS = [
    json.loads(line)["text"]
    for f in sorted((ROOT / "calibration_sets").glob("*.jsonl"))
    for line in f.read_text(encoding="utf-8").splitlines()
    if line.strip()
]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """[(name, tokenizers.Tokenizer, WordPiece)] for the shipped voice, the ChatTTS fixture and a built one."""
    built = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    build_char_tokenizer("".join(TEXTS).lower(), built)  # every character known: the ## continuations get used
    out = []
    for name, path in (("shipped", SHIPPED), ("fixture", FIXTURE), ("built", built)):
        hf = HF.from_file(str(path))
        hf.no_padding()
        hf.no_truncation()
        out.append((name, hf, WordPiece.from_file(path)))
    return out


def check(pairs, texts):
    for name, hf, wp in pairs:
        for t, e in zip(texts, hf.encode_batch(texts, add_special_tokens=False)):
            assert wp.encode(t) == e.ids, (name, t)


def test_calibration_texts(pairs):
    assert len(TEXTS) > 300 and "[laugh]" in "".join(TEXTS) and "你" in "".join(TEXTS)
    check(pairs, TEXTS)
    check(pairs, [prompt_text(t, lambda tok: True) for t in TEXTS])  # the runtime's [Stts][spk_emb]... layout
    check(pairs, [t.upper() + " Ünïcödé ＡＢＣ ΣΑΣ\t\x00\u200b x" * 3 for t in TEXTS[:40]])


def test_shipped_voice_prompts(pairs):
    """What the shipped voice really reads: espeak-ng phonemes of the calibration texts."""
    from toolkit.frontend import FrontendError, frontend_for

    try:
        fe = frontend_for("espeak")
    except FrontendError as e:
        pytest.skip(str(e))
    shipped = [p for p in pairs if p[0] == "shipped"]
    check(shipped, [prompt_text(fe(t), lambda tok: True) for t in TEXTS])


def test_every_code_point():
    """Normaliser and pre-tokenizer over all of Unicode: catches tokenizers' character tables moving
    (then regenerate toolkit/runtime/bert_unicode.py with tests/fixtures/make_bert_unicode.py)."""
    s = "".join(chr(o) for o in range(0x110000) if not 0xD800 <= o <= 0xDFFF)
    assert bert_pre_tokenize(s) == [w for w, _ in pre_tokenizers.BertPreTokenizer().pre_tokenize_str(s)]
    # one base letter per code point: a run of marks Python's Unicode tables do not know yet is reordered
    # differently by NFD (see wordpiece.py)
    s = "a".join(s)
    hf = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True)
    assert BertNormalizer({})(s) == hf.normalize_str(s)


PIECES = st.one_of(
    st.text(),
    st.text(alphabet=string.ascii_letters + " .,!?你好世界ə ʃ", max_size=20),
    st.sampled_from(CONTROL_TOKENS + ["[PAD]", "[UNK]", "[Stts", "spk_emb]", "[speed_5][laugh]"]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(PIECES, max_size=6).map("".join))
def test_random_text(pairs, text):
    check(pairs, [text])


def test_long_words_and_unknowns(pairs):
    check(
        pairs,
        [
            "a" * 99,
            "a" * 100,
            "a" * 101,
            "ab" * 60 + " x",
            "zzz¤€ a€b",
            "",
            " ",
            "[Stts]" * 3,
            "x[spk_emb]y",
            "[STTS] [laugh_0][laugh_1]",
        ],
    )


def test_unsupported_formats_are_named(tmp_path):
    spec = json.loads(SHIPPED.read_text(encoding="utf-8"))
    for key, value, named in (
        ("normalizer", {"type": "NFKC"}, "NFKC"),
        ("pre_tokenizer", {"type": "ByteLevel"}, "ByteLevel"),
        ("model", {"type": "BPE", "vocab": {}}, "BPE"),
    ):
        with pytest.raises(TokenizerFormatError, match=f"{key} '{named}' is not supported"):
            WordPiece({**spec, key: value})
    tokens = [{**spec["added_tokens"][0], "lstrip": True}] + spec["added_tokens"][1:]
    with pytest.raises(TokenizerFormatError, match="lstrip"):
        WordPiece({**spec, "added_tokens": tokens})
    with pytest.raises(TokenizerFormatError, match="unknown token"):
        WordPiece({**spec, "model": {**spec["model"], "unk_token": "[NOPE]"}})
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(TokenizerFormatError, match="cannot read tokenizer"):
        WordPiece.from_file(bad)


def test_format_variants():
    """No normaliser or pre-tokenizer (tokenizers then reads the text as one word), and an added token with
    normalized=true (matched in the normalised text)."""
    spec = json.loads(SHIPPED.read_text(encoding="utf-8"))
    extra = {
        **spec["added_tokens"][0],
        "id": max(t["id"] for t in spec["added_tokens"]) + 1,
        "content": "HéLLo",
        "normalized": True,
        "special": False,
    }
    for variant in (
        {**spec, "normalizer": None, "pre_tokenizer": None},
        {**spec, "added_tokens": spec["added_tokens"] + [extra]},
    ):
        hf, wp = HF.from_str(json.dumps(variant)), WordPiece(variant)
        for t in ("ab", "A b", "[Stts]ab[Ptts]", "hello HELLO héllo", "xhellox[laugh]HeLLo"):
            assert wp.encode(t) == hf.encode(t, add_special_tokens=False).ids, (t, variant["normalizer"])

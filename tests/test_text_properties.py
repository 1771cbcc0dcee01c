"""Property tests for the text front end: normalisation, sentence splitting and tokenization hold for any text."""

import re
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.text import STRUCTURAL, USER_CONTROL, TextError, normalize, prompt_text, sentence_pieces, split_sentences

CONTROLS = ["[laugh]", "[uv_break]", "[speed_5]", "[oral_2]", "[Stts]", "[spk_emb]", "[Ptts]"]
# any unicode, with control tokens, newlines and CJK mixed in often enough to matter
pieces = st.one_of(st.text(max_size=40), st.sampled_from(CONTROLS + ["\n", "。", ", ", ". ", "我们", "[", "]"]))
texts = st.lists(pieces, max_size=12).map("".join)
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def squeeze(s: str) -> str:
    return re.sub(r"\s+", "", s)


@SETTINGS
@given(texts, st.booleans())
def test_normalize_is_clean_and_idempotent(text, control_tokens):
    try:
        out = normalize(text, control_tokens)
    except TextError:
        return  # the only error it may raise: empty text
    assert out == out.strip() and "  " not in out
    assert all(unicodedata.category(c)[0] != "C" or c == "\n" for c in out)
    assert not STRUCTURAL.search(out)  # never a structural token of the user's
    if not control_tokens:
        assert not USER_CONTROL.search(out)  # read as text
    assert normalize(out, control_tokens) == out


@SETTINGS
@given(texts, st.integers(min_value=8, max_value=200), st.booleans())
def test_splitting_loses_nothing_and_respects_the_limit(text, max_chars, control_tokens):
    try:
        norm = normalize(text, control_tokens)
    except TextError:
        return
    got = split_sentences(norm, max_chars)
    assert got, "non-empty text gave no sentences"
    assert squeeze("".join(got)) == squeeze(norm)  # nothing dropped, nothing reordered
    for p in got:
        assert len(USER_CONTROL.sub("", p).strip()) <= max_chars
        assert USER_CONTROL.sub("", p).strip()  # every piece has something to speak
    if control_tokens:  # no control token is cut in two
        assert sum(len(USER_CONTROL.findall(p)) for p in got) == len(USER_CONTROL.findall(norm))


@SETTINGS
@given(st.lists(texts, min_size=1, max_size=4))
def test_sentence_pieces_keep_text_order(batch):
    try:
        got = sentence_pieces(batch)
    except TextError:
        return
    assert [i for i, _ in got] == sorted(i for i, _ in got)


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    from toolkit.models.tokenizer import Tokenizer

    return Tokenizer(tiny_dir / "tokenizer.json")


@SETTINGS
@given(texts, st.booleans())
def test_tokenization_is_in_range_and_places_the_prompt(tokenizer, text, control_tokens):
    try:
        norm = normalize(text, control_tokens)
    except TextError:
        return
    ids, valid = tokenizer.encode([prompt_text(norm, tokenizer.has)])
    ids = ids[0][valid[0]].tolist()
    assert all(0 <= i < tokenizer.vocab_size for i in ids)
    assert ids[:2] == [tokenizer.token_id("[Stts]"), tokenizer.token_id("[spk_emb]")]
    assert ids[-1] == tokenizer.token_id("[Ptts]")
    assert ids.count(tokenizer.token_id("[spk_emb]")) == 1  # the user cannot place a second speaker slot
    if not control_tokens:
        assert tokenizer.token_id("[laugh]") not in ids

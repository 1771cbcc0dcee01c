"""BERT WordPiece tokenization read from a `tokenizer.json`, in pure Python (stdlib only).

The edge runtime's tokenizer: it gives the ids the `tokenizers` library gives (`encode(text,
add_special_tokens=False)`) for the parts of the format ttsq's tokenizers use: added tokens matched whole,
a BertNormalizer, a BertPreTokenizer and a WordPiece model. Anything else raises and names itself, rather
than tokenizing differently. tests/test_wordpiece.py checks the parity against `tokenizers`, on every code
point too. The one known difference: NFD (with strip_accents) orders a run of combining marks by Python's
Unicode tables, so marks newer than the running Python's `unicodedata` may come out in another order.
"""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

from . import bert_unicode


def char_class(spec: str) -> str:
    """ "0300-036f 0483" (inclusive hexadecimal code point ranges) -> the regex class "[\u0300-\u036f\u0483]"."""
    out = []
    for r in spec.split():
        a, _, b = r.partition("-")
        out.append(re.escape(chr(int(a, 16))) + (f"-{re.escape(chr(int(b, 16)))}" if b else ""))
    return "[" + "".join(out) + "]"


# Rust's char::is_whitespace (the White_Space property); str.isspace() differs: it takes \x1c-\x1f too
SPACE = "0009-000d 0020 0085 00a0 1680 2000-200a 2028-2029 202f 205f 3000"
# the blocks `tokenizers` treats as Chinese (it checks 2b920, not 2b820)
CJK = "3400-4dbf 4e00-9fff f900-faff 20000-2a6df 2a700-2b73f 2b740-2b81f 2b920-2ceaf 2f800-2fa1f"
# tokenizers' own character classes (bert_unicode.py), not unicodedata's: its Unicode tables are older
_CONTROL, _SPACE, _CJK, _MARK = (
    re.compile(char_class(t)) for t in (bert_unicode.CONTROL, SPACE, CJK, bert_unicode.MARK)
)
_P, _S = char_class(bert_unicode.PUNCT), char_class(SPACE)
_WORD = re.compile(f"{_P}|[^{_P[1:-1]}{_S[1:-1]}]+")  # one punctuation character, or a run of neither
# Rust lowercases character by character (so no final sigma) with newer Unicode tables than Python's
_LOWER = str.maketrans({**bert_unicode.LOWER, 0x3A3: "\u03c3"})
_NFD_KEEP = re.compile(f"([{re.escape(bert_unicode.NFD_KEEP)}])") if bert_unicode.NFD_KEEP else None


class TokenizerFormatError(ValueError):
    pass


def _nfd(s: str) -> str:
    if _NFD_KEEP is None:
        return unicodedata.normalize("NFD", s)
    # the kept characters are starters, so NFD of the pieces between them is NFD of the whole
    return "".join(p if _NFD_KEEP.fullmatch(p) else unicodedata.normalize("NFD", p) for p in _NFD_KEEP.split(s))


class BertNormalizer:
    def __init__(self, spec: dict):
        self.clean_text = spec.get("clean_text", True)
        self.chinese = spec.get("handle_chinese_chars", True)
        self.lowercase = spec.get("lowercase", True)
        strip = spec.get("strip_accents")
        self.strip_accents = self.lowercase if strip is None else strip  # unset: follows lowercase, as in BERT

    def __call__(self, s: str) -> str:
        if self.clean_text:  # drop control characters (tab, newline, return are whitespace), then unify spaces
            s = _SPACE.sub(" ", _CONTROL.sub("", s))
        if self.chinese:
            s = _CJK.sub(r" \g<0> ", s)
        if self.strip_accents:
            s = _MARK.sub("", _nfd(s))
        if self.lowercase:
            s = s.translate(_LOWER).lower()
        return s


def bert_pre_tokenize(s: str) -> list[str]:
    """Split at whitespace (dropped) and around each punctuation character (kept as its own word)."""
    return _WORD.findall(s)


class WordPiece:
    """`WordPiece.from_file("tokenizer.json").encode(text)` -> ids, as `tokenizers` gives them."""

    def __init__(self, spec: dict, source: str = "tokenizer.json"):
        def unsupported(what: str, value) -> TokenizerFormatError:
            return TokenizerFormatError(
                f"{source}: {what} {value!r} is not supported by ttsq's torch-free tokenizer "
                "(it reads BertNormalizer, BertPreTokenizer and WordPiece); re-export the model with a BERT "
                "WordPiece tokenizer"
            )

        norm, pre, model = spec.get("normalizer"), spec.get("pre_tokenizer"), spec.get("model") or {}
        if norm is not None and norm.get("type") != "BertNormalizer":
            raise unsupported("normalizer", norm.get("type"))
        if pre is not None and pre.get("type") != "BertPreTokenizer":
            raise unsupported("pre_tokenizer", pre.get("type"))
        if model.get("type") != "WordPiece":
            raise unsupported("model", model.get("type"))
        # post_processor, decoder, padding and truncation do not change encode(..., add_special_tokens=False)
        self.normalize = BertNormalizer(norm) if norm else (lambda s: s)
        self.pre_tokenize = bert_pre_tokenize if pre else (lambda s: [s] if s else [])
        self.vocab: dict[str, int] = model["vocab"]
        self.unk = model.get("unk_token", "[UNK]")
        if self.unk not in self.vocab:
            raise TokenizerFormatError(
                f"{source}: the unknown token {self.unk!r} is missing from the WordPiece "
                "vocabulary; the file is damaged, export the model again"
            )
        self.prefix = model.get("continuing_subword_prefix", "##")
        self.max_chars = model.get("max_input_chars_per_word", 100)
        decoder = spec.get("decoder") or {}
        if decoder and decoder.get("type") != "WordPiece":
            raise unsupported("decoder", decoder.get("type"))
        self.decode_prefix = decoder.get("prefix", "##")
        self.cleanup = decoder.get("cleanup", True) if decoder else None  # None: no decoder, tokens joined by spaces

        self.added: dict[str, int] = {}
        raw, normed = [], []  # added tokens matched in the raw text, and in the normalised text
        for t in spec.get("added_tokens") or []:
            flags = [k for k in ("single_word", "lstrip", "rstrip") if t.get(k)]
            if flags:
                raise unsupported(f"added token {t['content']!r} with", "/".join(flags))
            self.added[t["content"]] = t["id"]
            (normed if t.get("normalized") else raw).append(t)
        self._raw = self._matcher(t["content"] for t in raw)
        self._normed = self._matcher(self.normalize(t["content"]) for t in normed)
        self._normed_ids = {self.normalize(t["content"]): t["id"] for t in normed}
        self._tokens = {i: t for t, i in self.vocab.items()} | {i: t for t, i in self.added.items()}

    @classmethod
    def from_file(cls, path) -> "WordPiece":
        path = Path(path)
        try:
            spec = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise TokenizerFormatError(f"cannot read tokenizer {path}: {e}. Export the model again") from e
        return cls(spec, str(path))

    @staticmethod
    def _matcher(contents):
        # longest alternatives first: the regex's leftmost-first match is then `tokenizers`' leftmost-longest
        contents = sorted({c for c in contents if c}, key=len, reverse=True)
        return re.compile("|".join(map(re.escape, contents))) if contents else None

    def token_to_id(self, token: str) -> int | None:
        return self.added.get(token, self.vocab.get(token))

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece, tid in _split(text, self._raw, self.added):
            if tid is not None:
                ids.append(tid)
                continue
            for sub, sid in _split(self.normalize(piece), self._normed, self._normed_ids):
                if sid is not None:
                    ids.append(sid)
                else:
                    for word in self.pre_tokenize(sub):
                        ids.extend(self._word(word))
        return ids

    def decode(self, ids: list[int]) -> str:
        """ids -> text as `tokenizers`' decode(ids, skip_special_tokens=False) with its WordPiece decoder: a
        continuation drops its prefix, any other token after the first gets a space, and with cleanup each token
        loses the space before punctuation and English contractions. Unknown ids are skipped."""
        tokens = [self._tokens[i] for i in ids if i in self._tokens]
        if self.cleanup is None:
            return " ".join(tokens)
        out = []
        for i, t in enumerate(tokens):
            if i:
                t = t[len(self.decode_prefix) :] if t.startswith(self.decode_prefix) else " " + t
            if self.cleanup:
                for a, b in CLEANUP:
                    t = t.replace(a, b)
            out.append(t)
        return "".join(out)

    def _word(self, word: str) -> list[int]:
        """Greedy longest-match-first over the vocabulary; one [UNK] if any part has no match."""
        if len(word) > self.max_chars:
            return [self.vocab[self.unk]]
        out, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                sub = word[start:end] if start == 0 else self.prefix + word[start:end]
                if sub in self.vocab:
                    out.append(self.vocab[sub])
                    start = end
                    break
            else:
                return [self.vocab[self.unk]]
        return out


# what the WordPiece decoder's cleanup replaces, in its order (tokenizers' decoders::wordpiece::cleanup)
CLEANUP = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" do not", " don't"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


def _split(text: str, matcher, ids: dict[str, int]):
    """-> (piece, None) for text between matches and (token, id) for each whole-token match."""
    if matcher is None:
        if text:
            yield text, None
        return
    pos = 0
    for m in matcher.finditer(text):
        if m.start() > pos:
            yield text[pos : m.start()], None
        yield m.group(0), ids[m.group(0)]
        pos = m.end()
    if pos < len(text):
        yield text[pos:], None

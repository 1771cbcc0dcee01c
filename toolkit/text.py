"""Text handling before tokenization: normalisation, control tokens, sentence splitting, the prompt layout."""

from __future__ import annotations

import re
import unicodedata

# Control tokens a user may write inside text; everything else in brackets is read as plain text.
USER_CONTROL = re.compile(r"\[(?:laugh|uv_break|v_break|lbreak|pure|(?:break|oral|laugh|speed|music)_\d)\]")
# Structural tokens are ttsq's to place, never the user's.
STRUCTURAL = re.compile(r"\[(?:Stts|Ptts|spk_emb|empty_spk|Sbreak|Pbreak)\]")
SENTENCE_END = re.compile(r"(?<=[.!?;。！？；…])\s*|\n+")
SOFT_BREAK = re.compile(r"(?<=[,，、:：])\s*|\s+")
MAX_CHARS = 120  # about 10-15 s of speech: well inside the 2048-step limit
# one text of a request, checked before anything else reads it whole: about 10 hours of speech. Longer texts are
# refused (split them into several runs) instead of growing memory for minutes first
MAX_TEXT_CHARS = 500_000
PROMPT_CHARS_PER_POSITION = 4
# text that is mostly control characters, unpaired surrogates (undecodable bytes) or U+FFFD is a binary file
MAX_NON_TEXT_SHARE = 0.25


class TextError(ValueError):
    pass


def _as_text(m: re.Match) -> str:
    return f"[ {m.group(0)[1:-1]} ]"  # spaced, the tokenizer no longer matches the control token: plain text


def normalize(text: str, control_tokens: bool = False) -> str:
    """NFKC, no control characters, single spaces. `[laugh]`-style tokens are read as plain text unless
    control_tokens; structural tokens ([Stts], [spk_emb], ...) always are."""
    if not isinstance(text, str):
        raise TextError(f"text must be a string, got {type(text).__name__}")
    check_length(text)
    check_is_text(text)
    text = unicodedata.normalize("NFKC", text)
    text = STRUCTURAL.sub(_as_text, text)
    if not control_tokens:
        text = USER_CONTROL.sub(_as_text, text)
    text = "".join(c if unicodedata.category(c)[0] != "C" or c == "\n" else " " for c in text)
    text = re.sub(r"[ \t\r\f\v]+", " ", text).strip()
    if not USER_CONTROL.sub("", text).strip(" \n"):
        raise TextError("text is empty (or holds only whitespace and control tokens); give some words to speak")
    return text


def check_length(text: str, limit: int = MAX_TEXT_CHARS, what: str = "text") -> None:
    if len(text) > limit:
        raise TextError(
            f"the {what} is {len(text):,} characters long; at most {limit:,} are read at once. Split it "
            "into several shorter texts"
        )


def check_prompt_length(text: str, max_positions: int) -> None:
    """Before the front end and tokenizer read a prompt whole: a token covers at most a few characters, so a prompt
    far longer than the model's positions cannot fit them, and would only grow memory before failing."""
    check_length(text, PROMPT_CHARS_PER_POSITION * max_positions, "prompt")


def check_is_text(text: str) -> None:
    """Refuses binary data (random bytes decode to control characters, surrogates and U+FFFD)."""
    visible = [c for c in text if not c.isspace()]
    bad = sum(c == "\ufffd" or unicodedata.category(c) in ("Cc", "Cs", "Co", "Cn") for c in visible)
    if visible and bad / len(visible) > MAX_NON_TEXT_SHARE:
        raise TextError(
            f"this is not text: {bad / len(visible):.0%} of its characters are control characters or "
            "bytes that are not UTF-8 (a binary file?). Give UTF-8 text"
        )


def split_sentences(text: str, max_chars: int = MAX_CHARS) -> list[str]:
    """Split normalised text into pieces of at most max_chars, at sentence ends first, then softer breaks."""
    pieces: list[str] = []
    for sentence in filter(None, (s.strip() for s in SENTENCE_END.split(text))):
        if len(sentence) <= max_chars:
            pieces.append(sentence)
            continue
        current = ""
        for part in filter(None, SOFT_BREAK.split(sentence)):
            while len(part) > max_chars:  # no break at all (e.g. long CJK runs): cut hard
                if current:
                    pieces.append(current)
                    current = ""
                cut = _cut_at(part, max_chars)
                pieces.append(part[:cut])
                part = part[cut:]
            sep = "" if not current or _is_cjk(current[-1]) or _is_cjk(part[0]) else " "
            if len(current) + len(sep) + len(part) > max_chars:
                pieces.append(current)
                current = part
            else:
                current = current + sep + part
        if current:
            pieces.append(current)
    # merge fragments so short pieces don't each pay the prompt overhead; a piece of control tokens alone
    # ("[laugh]") joins its neighbour rather than being dropped
    merged: list[str] = []
    for p in pieces:
        if merged and (_speechless(p) or _speechless(merged[-1]) or len(merged[-1]) + 1 + len(p) <= max_chars // 2):
            merged[-1] = merged[-1] + " " + p
        else:
            merged.append(p)
    return [p for p in merged if not _speechless(p)]


def _speechless(piece: str) -> bool:
    return not USER_CONTROL.sub("", piece).strip()


def _cut_at(part: str, max_chars: int) -> int:
    """A hard cut at max_chars, moved off any control token it would split."""
    for m in USER_CONTROL.finditer(part):
        if m.start() < max_chars < m.end():
            return m.start() or m.end()
    return max_chars


def sentence_pieces(texts, max_chars: int = MAX_CHARS, control_tokens: bool = False) -> list[tuple[int, str]]:
    """(text index, sentence) for every sentence of every text, in order: the unit both engines synthesize."""
    return [(i, p) for i, t in enumerate(texts) for p in split_sentences(normalize(t, control_tokens), max_chars)]


# Reading rates for a length-only duration guess: about 4.5 Mandarin characters (one syllable each) or 14 other
# characters (letters, digits, spaces, punctuation) per second of speech.
CJK_CHARS_PER_S = 4.5
OTHER_CHARS_PER_S = 14.0


def expected_seconds(text: str) -> float:
    """Rough speech duration of `text` from its length alone; what load balancing sorts and packs by."""
    cjk = sum(_is_cjk(c) for c in text)
    return cjk / CJK_CHARS_PER_S + (len(text) - cjk) / OTHER_CHARS_PER_S


def _is_cjk(ch: str) -> bool:
    return "\u4e00" <= ch <= "\u9fff" or "\u3000" <= ch <= "\u303f"


def prompt_text(text: str, has_token, style: str = "[speed_5]", sample_text: str = "", speaker: bool = True) -> str:
    """ChatTTS's code prompt layout: [Stts][spk_emb]{sample_text}{style}{text}[Ptts], with [empty_spk] for a prompt
    without a speaker vector; tokens the vocabulary lacks are left out. sample_text is a sample-audio speaker's
    transcript (ChatTTS's txt_smp); the sample's codes follow [Ptts]."""
    style = "".join(t for t in re.findall(r"\[[^\]]+\]", style) if has_token(t))
    return f"[Stts]{'[spk_emb]' if speaker else '[empty_spk]'}{sample_text}{style}{text}[Ptts]"

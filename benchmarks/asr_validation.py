"""Validate the intelligibility metric before trusting it: espeak-ng's own audio of a text set, then degraded copies,
scored by evaluation.asr. The error rate must rise with every degradation; the clean level is espeak's reference.

    python benchmarks/asr_validation.py --set calibration_sets/eval.jsonl \\
        --out benchmarks/results/current/asr_validation
    python benchmarks/asr_validation.py --set S.jsonl --conditions clean --wavs-out DIR   # espeak's level only

Conditions: clean; noise (white, 5 dB SNR); lowpass (8th-order Butterworth at 1 kHz); shuffled (the text's words,
or Han characters, in a random order, then spoken: fluent speech with the right sounds in the wrong order);
reversed (the clean audio backwards). Writes OUT.json (per utterance: what the ASR heard) and OUT.md.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import platform
import random
import re
import subprocess
import sys
import time
import wave
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from provenance import commit  # noqa: E402  (benchmarks/, the script's own folder)

SR = 24000
VOICES = {"en": "en-us", "zh": "cmn-latn-pinyin"}
CONDITIONS = ("clean", "noise", "lowpass", "shuffled", "reversed")


def espeak(text: str, variant: str = "") -> np.ndarray:
    """espeak-ng's audio of `text` at 24 kHz, each Latin or Han run in its own voice (as ttsq's front end splits);
    variant: an espeak voice variant suffix such as "+f4" (the shipped voice's speakers are such variants)."""
    from scipy.signal import resample_poly

    from evaluation.textnorm import CONTROL_RE
    from toolkit.frontend import split_runs

    parts = []
    for lang, run in split_runs(CONTROL_RE.sub(" ", text)):
        res = subprocess.run(
            ["espeak-ng", "-v", VOICES[lang] + variant, "--stdout", run], capture_output=True, check=True
        )
        with wave.open(io.BytesIO(res.stdout)) as w:
            sr = w.getframerate()
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).astype(np.float32) / 32768.0
        g = math.gcd(SR, sr)
        parts.append(resample_poly(pcm, SR // g, sr // g))
    return np.concatenate(parts).astype(np.float32)


def shuffled_text(text: str, rng: random.Random) -> str:
    han = re.findall(r"[\u4e00-\u9fff]|[A-Za-z0-9'$%.,:]+", text)
    rng.shuffle(han)
    return ("" if re.search(r"[\u4e00-\u9fff]", text) else " ").join(han)


def degrade(cond: str, text: str, clean: np.ndarray, rng: random.Random) -> np.ndarray:
    if cond == "clean":
        return clean
    if cond == "noise":
        noise = np.random.default_rng(rng.randrange(2**32)).standard_normal(len(clean)).astype(np.float32)
        return clean + noise * np.sqrt(np.mean(clean**2) / 10 ** (5 / 10))
    if cond == "lowpass":
        from scipy.signal import butter, sosfiltfilt

        return sosfiltfilt(butter(8, 1000, fs=SR, output="sos"), clean).astype(np.float32)
    if cond == "shuffled":
        return espeak(shuffled_text(text, rng))
    if cond == "reversed":
        return clean[::-1].copy()
    raise ValueError(cond)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", default=str(ROOT / "calibration_sets" / "eval.jsonl"))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "asr_validation"))
    p.add_argument("--conditions", default=",".join(CONDITIONS))
    p.add_argument("--limit", type=int, default=None, help="records per language at most")
    p.add_argument("--asr-model", default=None)
    p.add_argument("--wavs-out", default=None, help="also write espeak's clean audio here as ID.wav")
    a = p.parse_args(argv)

    from evaluation import asr, textnorm
    from evaluation.report import INTELLIGIBILITY, _fmt
    from toolkit.textsets import load_text_set

    records = load_text_set(a.set)
    if a.limit:
        seen: dict[str, int] = {}
        records = [
            r
            for r in records
            if seen.setdefault(r.language, 0) < a.limit and not seen.__setitem__(r.language, seen[r.language] + 1)
        ]
    conds = [c.strip() for c in a.conditions.split(",") if c.strip()]
    transcriber = asr.Transcriber(a.asr_model)
    t0 = time.perf_counter()
    rows: dict[str, list[dict]] = {c: [] for c in conds}
    for i, r in enumerate(records):
        clean = espeak(r.text)
        if a.wavs_out:
            import soundfile as sf

            Path(a.wavs_out).mkdir(parents=True, exist_ok=True)
            sf.write(Path(a.wavs_out) / f"{r.id}.wav", clean, SR)
        for c in conds:
            wav = degrade(c, r.text, clean, random.Random(f"{r.id}/{c}"))
            heard = transcriber.transcribe(wav, SR, textnorm.language_of(r.text))
            e = asr.errors(r.text, heard)
            rows[c].append({"id": r.id, "text": r.text, "heard": heard, **e.__dict__, "rate": e.rate})
        print(f"\r{i + 1}/{len(records)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)

    def counts(c):
        return [
            asr.ErrorCount(**{k: v for k, v in x.items() if k not in ("id", "text", "heard", "rate")}) for x in rows[c]
        ]

    summary = {c: asr.by_language(counts(c)) for c in conds}
    res = {
        "command": " ".join(["python", "benchmarks/asr_validation.py", *(argv or sys.argv[1:])]),
        "commit": commit(),
        "hardware": f"{platform.machine()} CPU",
        "text_set": a.set,
        "records": len(records),
        "asr": transcriber.settings(),
        "wall_s": time.perf_counter() - t0,
        "summary": summary,
        "utterances": rows,
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=2, ensure_ascii=False) + "\n")
    langs = [k for k in INTELLIGIBILITY if any(k in summary[c] for c in conds)]
    lines = [
        f"# Intelligibility metric on espeak-ng audio ({Path(a.set).name}, {len(records)} records)",
        "",
        f"`{res['command']}` at commit {commit}, {res['hardware']}, {res['wall_s']:.0f} s. ASR: "
        f"{res['asr']['model']} (faster-whisper {res['asr']['versions']['faster-whisper']}, "
        f"{res['asr']['decoding']['compute_type']}, beam {res['asr']['decoding']['beam_size']}). "
        "Pooled error rate [95% bootstrap CI over utterances].",
        "",
        "| condition | " + " | ".join(INTELLIGIBILITY[k] for k in langs) + " |",
        "|---|" + "---|" * len(langs),
    ]
    for c in conds:
        lines.append(f"| {c} | " + " | ".join(_fmt(summary[c].get(k), ".3f") for k in langs) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

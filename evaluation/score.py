"""`ttsq score`: score a folder of existing WAVs against a text set with the metrics `ttsq evaluate` uses, so audio
from any system (the chattts package, espeak-ng, another TTS) compares with ttsq's on equal terms.

    ttsq score --wavs DIR --set SET.jsonl [--out scores.json] [--asr-model PATH] [--no-dnsmos]

A record's audio is DIR/ID.wav, or every DIR/ID_seed*.wav (the layout of `ttsq evaluate`'s wavs/NAME/ folders).
Reported: intelligibility (WER en, CER zh, MER mixed: pooled, with a 95% bootstrap CI over utterances), DNSMOS
OVRL, seconds of audio, and what the ASR heard for each file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def find_wavs(folder: Path, rid: str) -> list[Path]:
    exact = folder / f"{rid}.wav"
    return [exact] if exact.is_file() else sorted(folder.glob(f"{rid}_seed*.wav"))


def score_folder(
    wavs: str | Path, text_set: str | Path, asr_model: str | None = None, dnsmos: bool = True, progress=None
) -> dict:
    """-> {"asr": settings, "intelligibility": {wer|cer|mer: CI}, "dnsmos_ovrl": CI|None, "files": [...]}"""
    import soundfile as sf

    from toolkit.textsets import load_text_set

    from . import asr, metrics, textnorm
    from .runner import ci

    folder = Path(wavs)
    if not folder.is_dir():
        raise FileNotFoundError(f"--wavs {folder}: no such folder")
    records = load_text_set(text_set, purpose="scoring")
    found = {r.id: find_wavs(folder, r.id) for r in records}
    missing = [rid for rid, paths in found.items() if not paths]
    if len(missing) == len(records):
        raise FileNotFoundError(
            f"none of the {len(records)} records of {text_set} has audio in {folder} "
            f"(expected ID.wav or ID_seedN.wav, e.g. {records[0].id}.wav)"
        )
    transcriber = asr.Transcriber(asr_model)
    rows, counts, mos = [], [], []
    todo = [(r, p) for r in records for p in found[r.id]]
    for i, (r, path) in enumerate(todo):
        try:
            wav, sr = sf.read(path, dtype="float32", always_2d=True)
        except Exception as e:
            raise ValueError(f"{path}: not a readable audio file ({e})") from e
        wav = wav.mean(axis=1)
        heard = transcriber.transcribe(wav, sr, textnorm.language_of(r.text))
        e = asr.errors(r.text, heard)
        q = None
        if dnsmos:
            try:
                q = metrics.dnsmos(wav, sr)["ovrl"]
            except ValueError:  # too short or silent for DNSMOS
                pass
        counts.append(e)
        mos.append(q)
        rows.append(
            {
                "id": r.id,
                "file": path.name,
                "text": r.text,
                "heard": heard,
                "rate": e.rate,
                "seconds": len(wav) / sr,
                "dnsmos_ovrl": q,
                **{k: v for k, v in e.__dict__.items()},
            }
        )
        if progress:
            progress(i + 1, len(todo))
    return {
        "schema": "ttsq-score/1",
        "wavs": str(folder),
        "text_set": str(text_set),
        "asr": transcriber.settings(),
        "missing": missing,
        "intelligibility": asr.by_language(counts),
        "dnsmos_ovrl": ci([q for q in mos if q is not None]),
        "seconds": float(np.sum([r["seconds"] for r in rows])),
        "files": rows,
    }


def summary(res: dict) -> str:
    from .report import INTELLIGIBILITY, _fmt

    lines = ["| metric | value [95% CI] | utterances |", "|---|---|---:|"]
    for k, name in INTELLIGIBILITY.items():
        if k in res["intelligibility"]:
            c = res["intelligibility"][k]
            lines.append(f"| {name} | {_fmt(c, '.3f')} | {c['n']} |")
    if res["dnsmos_ovrl"]:
        lines.append(f"| DNSMOS OVRL | {_fmt(res['dnsmos_ovrl'])} | {res['dnsmos_ovrl']['n']} |")
    lines.append(
        f"\nASR: {res['asr']['model']}; {len(res['files'])} files, {res['seconds']:.1f} s of audio"
        + (f"; no audio for {len(res['missing'])} records" if res["missing"] else "")
    )
    return "\n".join(lines)


def add_score_parser(sub) -> None:
    s = sub.add_parser("score", help="score existing WAVs against a text set: WER/CER by an offline ASR, DNSMOS")
    s.add_argument("--wavs", required=True, help="folder of ID.wav (or ID_seedN.wav) files")
    s.add_argument("--set", required=True, help="the text set (JSONL) the audio should say")
    s.add_argument("--out", default=None, help="write the scores as JSON here (per file: what the ASR heard)")
    s.add_argument("--no-dnsmos", action="store_true", help="skip DNSMOS")
    s.add_argument("--force", action="store_true", help="overwrite an existing --out file")
    from .cli import add_asr_options

    add_asr_options(s)
    s.set_defaults(func=run_from_args)


def run_from_args(a) -> int:
    if a.no_asr:
        raise ValueError("ttsq score measures intelligibility first: drop --no-asr")
    out = Path(a.out) if a.out else None
    if out is not None and out.exists() and not a.force:
        raise FileExistsError(f"{out} already exists; pass --force or choose another --out")
    from toolkit.progress import progress_bar

    res = score_folder(a.wavs, a.set, a.asr_model, dnsmos=not a.no_dnsmos, progress=progress_bar("score"))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(json.dumps(res, indent=2, ensure_ascii=False) + "\n")
        tmp.replace(out)
    print(summary(res))
    if out is not None:
        print(f"wrote {out}", file=sys.stderr)
    return 0

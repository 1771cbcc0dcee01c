"""Argument parsing for `ttsq evaluate`; the work is in runner.py and report.py."""

from __future__ import annotations

import sys
from pathlib import Path

DEFAULT_SET = str(Path(__file__).resolve().parents[1] / "calibration_sets" / "smoke.jsonl")


def add_asr_options(s) -> None:
    s.add_argument(
        "--asr-model",
        default=None,
        help="a CTranslate2 Whisper folder for WER/CER (e.g. large-v3); default: the pinned Whisper base "
        "of the asr extra, offline",
    )
    s.add_argument("--no-asr", action="store_true", help="skip intelligibility (WER/CER)")


def add_evaluate_parser(sub, model_args) -> None:
    s = sub.add_parser("evaluate", help="compare precisions against FP32: quality, latency, memory, size")
    model_args(s)
    s.add_argument(
        "--precisions",
        default="fp32,bf16,int8,int4",
        help="comma-separated recipes (NAME@DTYPE runs a recipe's float parts in DTYPE, e.g. int8@bf16) "
        "and/or quantized artifact folders",
    )
    s.add_argument("--set", default=DEFAULT_SET, help="text set (JSONL); default: the 6-sentence smoke set")
    s.add_argument("--out", required=True, help="report folder (report.json, report.md, report.html, wavs/)")
    s.add_argument("--seeds", default="0,1", help="sampling seeds; the second gives the noise floor")
    s.add_argument("--limit", type=int, default=None, help="use only the first N records")
    s.add_argument("--max-steps", type=int, default=2048)
    s.add_argument("--repeats", type=int, default=3, help="timing repeats (medians are reported)")
    s.add_argument("--batch-size", type=int, default=8, help="sentences synthesized together (a unit of work)")
    s.add_argument("--no-dnsmos", action="store_true", help="skip DNSMOS (saves ~15 s of start-up)")
    add_asr_options(s)
    s.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes for scoring's mel-cepstra and DNSMOS (default: the usable CPU cores, shared by the ranks)",
    )
    s.add_argument(
        "--distributed",
        action="store_true",
        help="shard the set across the ranks of `torchrun --nproc-per-node N -m toolkit.cli evaluate ...`; "
        "rank 0 writes the report",
    )
    s.add_argument("--force", action="store_true", help="write into an existing --out folder")
    s.set_defaults(func=run_from_args)


def run_from_args(a) -> int:
    from toolkit.progress import progress_bar

    from .distributed import Dist, init_distributed
    from .report import markdown_table, write_report
    from .runner import EvalConfig, run_evaluation

    dist = init_distributed(a.device) if a.distributed else Dist(device=a.device)
    try:
        out = Path(a.out)
        if dist.is_main and out.exists() and any(out.iterdir()) and not a.force:
            raise FileExistsError(f"{out} already exists and is not empty; pass --force or choose another --out")
        cfg = EvalConfig(
            model=a.model,
            precisions=[p.strip() for p in a.precisions.split(",") if p.strip()],
            text_set=a.set,
            out=a.out,
            device=dist.device,
            seeds=tuple(int(s) for s in a.seeds.split(",")),
            limit=a.limit,
            max_steps=a.max_steps,
            batch_size=a.batch_size,
            repeats=a.repeats,
            dnsmos=not a.no_dnsmos,
            asr=not a.no_asr,
            asr_model=a.asr_model,
            workers=a.workers,
        )
        report, utts = run_evaluation(cfg, progress_bar("evaluate"), dist)
    finally:
        dist.close()
    if not dist.is_main:
        return 0
    write_report(report, utts, out)
    print(markdown_table(report))
    print(f"\nwrote {out}/report.md, report.json, report.html and wavs/", file=sys.stderr)
    return 0

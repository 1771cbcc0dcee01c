"""The README's main job: quantize the shipped voice with a calibration set (int8, calibrated int4 and plain
int4 for contrast), then compare every precision against FP32 on the smoke set and print the table.

    python -m evaluation.demo --out out/demo [--device cpu] [--set calibration_sets/eval.jsonl]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out/demo")
    p.add_argument("--model", default=None, help="default: the shipped voice")
    p.add_argument("--device", default="cpu")
    p.add_argument("--calib", default=str(ROOT / "calibration_sets" / "calib.jsonl"))
    p.add_argument("--calib-limit", type=int, default=8)
    p.add_argument(
        "--set",
        default=str(ROOT / "calibration_sets" / "smoke.jsonl"),
        help="evaluation set; the full one is calibration_sets/eval.jsonl",
    )
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=500, help="GPT steps per sentence at most (10.7 s of audio)")
    a = p.parse_args(argv)

    import os

    os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
    import logging
    import warnings

    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*max_new_tokens.*")

    from toolkit.progress import progress_bar
    from toolkit.quantize_job import quantize_to_artifact

    from .report import markdown_table, write_report
    from .runner import EvalConfig, run_evaluation

    out = Path(a.out)
    if out.exists():
        if not (out / ".ttsq-demo").is_file():
            raise SystemExit(f"{out} exists and was not made by this demo; choose another --out")
        shutil.rmtree(out)  # the demo's own earlier output
    out.mkdir(parents=True)
    (out / ".ttsq-demo").touch()
    t0 = time.perf_counter()
    jobs = [
        ("int8", "int8", dict(keep_sensitive=2)),
        ("int4", "int4", dict(keep_sensitive=2)),
        ("int4-rtn", "int4", dict(awq=False)),
    ]
    rows = []
    for name, recipe, opts in jobs:
        calib = a.calib if opts.get("awq", True) else None
        path, report = quantize_to_artifact(
            a.model,
            recipe,
            out / name,
            calib_set=calib,
            device=a.device,
            limit=a.calib_limit,
            max_steps=48,
            progress=progress_bar(name),
            **opts,
        )
        rows.append((name, report))
    # the plain int4 artifact is scored on the same calibration texts, for the contrast with calibrated int4
    from toolkit.precision.calibration import collect, relative_error, stage_outputs
    from toolkit.synthesizer import load_model
    from toolkit.textsets import load_text_set

    records = load_text_set(a.calib, limit=a.calib_limit, purpose="calibration")
    fp32 = load_model(a.model)
    calib = collect(fp32, [r.text for r in records], [r.speaker for r in records], max_steps=48)
    ref = stage_outputs(fp32, calib)
    print("Quantization: relative squared error of each stage's output against FP32 on the calibration texts")
    print(
        "| artifact | layers quantized | kept float | size before MiB | size after MiB |"
        " err GPT | err Decoder | err Vocos |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in rows:
        got = stage_outputs(load_model(out / name), calib)
        err = {s: relative_error(got[s], ref[s]) for s in ("gpt", "decoder", "vocos")}
        print(
            f"| {name} | {len(r.plan.quantize)} | {len(r.plan.keep)} | {r.bytes_before / 2**20:.2f} | "
            f"{r.bytes_after / 2**20:.2f} | {err['gpt']:.2e} | {err['decoder']:.2e} | {err['vocos']:.2e} |"
        )
    cfg = EvalConfig(
        model=a.model,
        precisions=["bf16", *(str(out / n) for n, _, _ in jobs[:2])],
        text_set=a.set,
        out=str(out / "report"),
        device=a.device,
        repeats=a.repeats,
        throughput_batches=(),
        max_steps=a.max_steps,
    )
    report, utts = run_evaluation(cfg, progress_bar("evaluate"))
    write_report(report, utts, out / "report")
    print()
    print(markdown_table(report))
    print(f"\nfull report: {out / 'report' / 'report.html'} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Which way of compiling the decode step is fastest: GPT steps/s per compile variant, precision and batch, on random
weights at ChatTTS's dimensions (the same measurement as `ttsq bench`: median of repeats, warm-up excluded), with the
wall time each variant spent compiling and capturing.

    python3 benchmarks/engine_variants.py --variants block,step-dynamic,step --precisions bf16,int8,int8@bf16 \
        --batches 1,64 --out benchmarks/results/current/engine_variants_h200.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from toolkit.bench import STEPS_PER_S, decode_rate, quantized_copy, random_model  # noqa: E402

VARIANTS = {  # name -> Engine arguments
    "graphs": dict(compile=False, kernels=False),
    "block": dict(compile="block", kernels=False),
    "step-dynamic": dict(compile=True, compile_options={"dynamic": True}, kernels=False),
    "step": dict(compile=True, kernels=False),  # static shapes: the whole step in one compile
    "step-autotune": dict(compile=True, compile_options={"mode": "max-autotune-no-cudagraphs"}, kernels=False),
    "kernels": dict(compile=True, kernels=True),  # toolkit/kernels.py up to KERNELS_MAX_BATCH, sampler compiled
    "kernels-graphs": dict(compile=False, kernels=True),  # the same, sampler not compiled
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="block,step-dynamic,step")
    ap.add_argument(
        "--precisions",
        default="bf16",
        help="recipes; NAME@DTYPE runs a quantized recipe's float parts in DTYPE (e.g. int8@bf16)",
    )
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--steps", type=int, default=470)
    ap.add_argument("--dims", choices=("chattts", "tiny"), default="chattts")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--budget-s", type=float, default=480, help="skip what would start after this many seconds")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    base = random_model(a.dims, dev)
    rows, t_start = [], time.perf_counter()
    for precision in a.precisions.split(","):
        model = quantized_copy(base, dev, precision)
        for variant in a.variants.split(","):
            for B in map(int, a.batches.split(",")):
                if time.perf_counter() - t_start > a.budget_s:
                    print(f"skipped {precision} {variant} b{B}: over the time budget", flush=True)
                    continue
                torch._dynamo.reset()
                t0 = time.perf_counter()
                row = dict(precision=precision, variant=variant, batch=B)
                try:
                    sps = decode_rate(model, B, a.steps, dev, **VARIANTS[variant])
                    row.update(steps_per_s=round(sps, 1), audio_s_per_s=round(sps * B / STEPS_PER_S, 1))
                except Exception as e:  # noqa: BLE001 - recorded; the other variants still run
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                row["wall_s"] = round(time.perf_counter() - t0, 1)
                rows.append(row)
                print(json.dumps(row), flush=True)
    device = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "CPU"
    result = dict(
        command="python3 " + " ".join(sys.argv),
        device=device,
        torch=torch.__version__,
        steps=a.steps,
        dims=a.dims,
        rows=rows,
    )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{'precision':10} {'variant':14} {'batch':>5} {'steps/s':>9} {'audio s/s':>9} {'wall s':>7}")
    for r in rows:
        print(
            f"{r['precision']:10} {r['variant']:14} {r['batch']:5} {r.get('steps_per_s', 'error'):>9} "
            f"{r.get('audio_s_per_s', ''):>9} {r['wall_s']:7}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

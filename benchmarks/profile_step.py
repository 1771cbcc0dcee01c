"""Where a decode step's time goes: torch.profiler over the GPT decode loop at ChatTTS's dimensions (random weights).

Prints the kernels that take the most device time per step and writes a Chrome trace (open it in Perfetto).
For the GPU-engine issue: run it at batch 1 and 64 before changing the engine, and again after.

    python3 benchmarks/profile_step.py --precision bf16 --batch 64 --variant step --out /tmp/prof [--device cuda]
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine_variants import VARIANTS  # noqa: E402
from toolkit.bench import _prompt, random_model  # noqa: E402
from toolkit.engine import Engine  # noqa: E402
from toolkit.precision import quantize  # noqa: E402
from toolkit.sampling import SamplingParams  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=128, help="decode steps profiled (after one warm-up generation)")
    ap.add_argument("--variant", choices=tuple(VARIANTS), default="graphs",
                    help="how the step is compiled (see engine_variants.py); graphs: CUDA graphs, no compile")
    ap.add_argument("--no-graphs", action="store_true", help="eager steps: one profiler row per launched kernel")
    ap.add_argument("--dims", choices=("chattts", "tiny"), default="chattts")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", type=Path, required=True, help="folder for trace.json and top.txt")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    model = copy.deepcopy(random_model(a.dims, dev))
    quantize(model, a.precision, device=dev)
    engine = Engine(model.gpt, cuda_graphs=not a.no_graphs, **VARIANTS[a.variant])
    emb, valid = _prompt(model, a.batch, 32, dev)
    params = SamplingParams(max_new_tokens=a.steps, min_new_tokens=a.steps)
    engine.generate(emb, valid, params)  # warm-up: compile, capture, cache allocation
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=activities) as prof:
        engine.generate(emb, valid, params, seed=1)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    a.out.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(a.out / "trace.json"))
    events = prof.key_averages()
    key = "self_device_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    table = events.table(sort_by=key, row_limit=a.top, max_name_column_width=70)
    total_us = sum(getattr(e, key) for e in events)
    kernels = sum(e.count for e in events if e.device_type == DeviceType.CUDA) / a.steps
    head = (f"{a.precision} batch {a.batch} {a.variant}, {'CUDA graphs' if dev.type == 'cuda' and not a.no_graphs else 'no graphs'}, "
            f"{a.steps} steps on {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'CPU'}: "
            f"{total_us / a.steps:.0f} us of {'device' if dev.type == 'cuda' else 'CPU'} time per step (self times summed)"
            + (f", {kernels:.0f} kernels per step" if dev.type == "cuda" else ""))
    (a.out / "top.txt").write_text(head + "\n" + table)
    print(head)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

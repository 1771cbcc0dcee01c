"""Where a decode step's time goes: torch.profiler over the GPT decode loop at ChatTTS's dimensions (random weights).

Prints the kernels that take the most device time per step and writes a Chrome trace (open it in Perfetto).
For the GPU-engine issue: run it at batch 1 and 64 before changing the engine, and again after.
With the Triton kernels' dependent launches, kernels overlap, so summed device times overstate the step; the
timeline (timeline.txt, or --timeline TRACE for a saved trace) gives the wall-clock view instead: the median step,
and per kernel the median time from the previous kernel's end to its own end. A dependent launch starts early and
waits, and ends after the kernel before it, so that is what it adds to the step.

    python3 benchmarks/profile_step.py --precision bf16 --batch 64 --variant step --out /tmp/prof [--device cuda]
    python3 benchmarks/profile_step.py --timeline /tmp/prof/trace.json --out /tmp/prof
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine_variants import VARIANTS  # noqa: E402

from toolkit.bench import _prompt, quantized_copy, random_model  # noqa: E402
from toolkit.engine import Engine  # noqa: E402
from toolkit.sampling import SamplingParams  # noqa: E402


def timeline(trace: Path, first: str = "_sample_feed_kernel", skip: int = 10, steps: int = 30) -> str:
    """The wall-clock view of a decode loop's trace: steps delimited by the kernel named `first` (the step's first
    launch), `steps` of them after `skip`; per kernel name, its launches per step, the medians of the time from the
    previous kernel's end to its end and of its own duration, and the first summed per step (microseconds)."""
    events = sorted(
        (e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"),
        key=lambda e: e["ts"],
    )
    starts = [i for i, e in enumerate(events) if e["name"].startswith(first)][skip : skip + steps + 1]
    if len(starts) < 2:
        raise SystemExit(f"{trace}: fewer than {skip + 2} launches of {first}; profile more --steps")
    spans = list(zip(starts, starts[1:]))  # each step's first launch and the next step's
    per: dict[str, list[tuple[float, float]]] = {}
    for a, b in spans:
        for prev, e in zip(events[a - 1 : b - 1], events[a:b]):
            per.setdefault(e["name"][:40], []).append((e["ts"] + e["dur"] - prev["ts"] - prev["dur"], e["dur"]))
    n = len(spans)
    step_us = statistics.median(events[b]["ts"] - events[a]["ts"] for a, b in spans)
    lines = [
        f"{trace}: {n} steps, median step {step_us:.1f} us, {(starts[-1] - starts[0]) / n:.0f} kernels per step",
        f"{'kernel':40} {'per step':>8} {'end to end us':>13} {'duration us':>11} {'us per step':>11}",
    ]
    for name, v in sorted(per.items(), key=lambda kv: -sum(x for x, _ in kv[1])):
        gap = statistics.median(x for x, _ in v)
        lines.append(
            f"{name:40} {len(v) / n:8.0f} {gap:13.2f} {statistics.median(d for _, d in v):11.2f} "
            f"{sum(x for x, _ in v) / n:11.1f}"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precision", default="bf16", help="a recipe; int8@bf16 runs int8 weights on bf16 activations")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=128, help="decode steps profiled (after one warm-up generation)")
    ap.add_argument(
        "--variant",
        choices=tuple(VARIANTS),
        default="graphs",
        help="how the step is compiled (see engine_variants.py); graphs: CUDA graphs, no compile",
    )
    ap.add_argument("--no-graphs", action="store_true", help="eager steps: one profiler row per launched kernel")
    ap.add_argument("--dims", choices=("chattts", "tiny"), default="chattts")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--timeline", type=Path, default=None, help="only summarise this saved trace.json (timeline.txt)")
    ap.add_argument("--out", type=Path, required=True, help="folder for trace.json, top.txt and timeline.txt")
    a = ap.parse_args(argv)
    if a.timeline:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "timeline.txt").write_text(text := timeline(a.timeline))
        print(text)
        return 0
    dev = torch.device(a.device)
    model = quantized_copy(random_model(a.dims, dev), dev, a.precision)  # also NAME@DTYPE, e.g. int8@bf16
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
    head = (
        f"{a.precision} batch {a.batch} {a.variant}, "
        f"{'CUDA graphs' if dev.type == 'cuda' and not a.no_graphs else 'no graphs'}, "
        f"{a.steps} steps on {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'CPU'}: "
        f"{total_us / a.steps:.0f} us of {'device' if dev.type == 'cuda' else 'CPU'} time per step (self times summed)"
        + (f", {kernels:.0f} kernels per step" if dev.type == "cuda" else "")
    )
    (a.out / "top.txt").write_text(head + "\n" + table)
    print(head)
    print(table)
    if dev.type == "cuda" and not a.no_graphs and a.variant.startswith("kernels"):
        (a.out / "timeline.txt").write_text(text := timeline(a.out / "trace.json"))
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

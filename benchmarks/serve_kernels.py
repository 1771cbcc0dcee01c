"""Which kernels fill `ttsq serve`'s decode step at a full batch: B one-sentence requests decoded together by
toolkit.scheduler.Scheduler (ChatTTS dimensions, random weights, EOS barred), a torch.profiler window of --window
steps taken mid-decode, per mode:
  graphs          the step replayed as CUDA graphs (what `ttsq serve` runs)
  compiled        the whole step torch.compile'd under its graphs, attention given the whole cache buffers (sliced
                  inside the compiled graph): what `ttsq serve --compile` runs
  eager           no graphs (the kernels alone, launched from the host)
Per mode: wall ms per step in the window, GPU kernel ms per step (the sum of kernel times: what the device works),
kernels per step, and the kernels that take most. The engine's own steps/s at the same batch (graphs, and its whole
step compiled) are the reference.

    python3 benchmarks/serve_kernels.py --batch 64 --modes graphs,compiled,eager --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.serve_profile import SENTENCE, run_batch  # noqa: E402
from toolkit import SamplingParams, Synthesizer  # noqa: E402
from toolkit.bench import decode_rate, random_model  # noqa: E402
from toolkit.scheduler import Scheduler  # noqa: E402
from toolkit.synthesizer import load_model  # noqa: E402


def wait_steps(sched: Scheduler, n: int, timeout: float = 120.0) -> None:
    target, t0 = sched.steps_run + n, time.perf_counter()
    while sched.steps_run < target:
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(f"the scheduler ran {sched.steps_run} steps, waited for {target}")
        time.sleep(0.0005)


def kernel_table(prof, steps: int, top: int) -> dict:
    rows = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    total_us = sum(e.self_device_time_total for e in rows)
    calls = sum(e.count for e in rows)
    rows.sort(key=lambda e: e.self_device_time_total, reverse=True)
    return {
        "kernel_ms_per_step": round(total_us / 1000 / steps, 3),
        "kernels_per_step": round(calls / steps, 1),
        "top": [
            {
                "name": e.key[:120],
                "ms_per_step": round(e.self_device_time_total / 1000 / steps, 4),
                "calls_per_step": round(e.count / steps, 2),
                "share": round(e.self_device_time_total / max(total_us, 1e-9), 3),
            }
            for e in rows[:top]
        ],
    }


def profile_mode(synth: Synthesizer, mode: str, a) -> dict:
    params = SamplingParams(min_new_tokens=a.steps, max_new_tokens=a.steps)
    sched = Scheduler(
        synth,
        slots=a.batch,
        params=params,
        max_chars=60,
        graphs=mode != "eager" and synth.device.type == "cuda",
        compile=mode == "compiled",
    )
    t0 = time.perf_counter()
    captured = sched.warm_up(lengths=a.warm_up_positions)
    out: dict = {"warm_up_s": round(time.perf_counter() - t0, 2), "graphs_captured": captured}
    run_batch(sched, a.batch, 0)  # first use: captures and compiles the warm-up left
    jobs = [sched.submit(SENTENCE, seed=a.batch + i) for i in range(a.batch)]
    wait_steps(sched, a.skip)
    s0, t0 = sched.steps_run, time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        wait_steps(sched, a.window)
        if synth.device.type == "cuda":
            torch.cuda.synchronize()
    steps, wall = sched.steps_run - s0, time.perf_counter() - t0
    for job in jobs:
        for kind, data in job.events():
            if kind == "error":
                raise data
    out.update({"window_steps": steps, "wall_ms_per_step": round(1000 * wall / steps, 3)})
    out.update(kernel_table(prof, steps, a.top))
    sched.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda (cpu: a smoke run of the eager mode, no kernel times)")
    p.add_argument("--precision", default="bf16")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--modes", default="graphs,compiled,eager")
    p.add_argument("--steps", type=int, default=235, help="steps per sentence (EOS barred)")
    p.add_argument("--skip", type=int, default=60, help="steps decoded before the window (admission, first renders)")
    p.add_argument("--window", type=int, default=100)
    p.add_argument("--warm-up-positions", type=int, default=1024)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--engine", action="store_true", help="also the engine's steps/s: graphs, and compile='step'")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    dev = torch.device(a.device)
    model = random_model("chattts", torch.device("cpu"))
    model.tokenizer = load_model().tokenizer
    synth = Synthesizer(model, dev, a.precision)
    report: dict = {"args": vars(a), "torch": torch.__version__, "device": str(dev), "modes": {}}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if dev.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(dev)
    if a.engine:
        report["engine_steps_per_s"] = {}
        for name, opts in (("graphs", {"cuda_graphs": True, "kernels": False}), ("compile_step", {"compile": True})):
            t0 = time.perf_counter()
            rate = decode_rate(synth.model, a.batch, a.steps, dev, repeats=3, **opts)
            report["engine_steps_per_s"][name] = {"rate": round(rate, 1), "s": round(time.perf_counter() - t0, 1)}
            print("engine", name, report["engine_steps_per_s"][name], flush=True)
            out.write_text(json.dumps(report, indent=1) + "\n")
    for mode in a.modes.split(","):
        try:
            report["modes"][mode] = profile_mode(synth, mode, a)
        except Exception as e:  # noqa: BLE001  one mode failing must not lose the others
            report["modes"][mode] = {"error": f"{type(e).__name__}: {e}"[:500]}
        r = report["modes"][mode]
        print(mode, json.dumps({k: v for k, v in r.items() if k != "top"}), flush=True)
        for row in r.get("top", [])[:12]:
            print("   ", json.dumps(row), flush=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        out.write_text(json.dumps(report, indent=1) + "\n")  # after each mode: a later one may not finish
    return 0


if __name__ == "__main__":
    sys.exit(main())

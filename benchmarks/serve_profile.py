"""Where the time of `ttsq serve`'s scheduler goes, without HTTP: B requests of one sentence each submitted at once to
toolkit.scheduler.Scheduler, with its decode step eager, replayed as CUDA graphs, or compiled whole (static shapes per
batch bucket) under its graphs, at ChatTTS's dimensions (random weights, EOS barred: every sentence runs
--steps steps).

Per mode and batch: wall time per step, time to first audio, audio seconds per second, and (a second pass with
`profile=True`, which drains the device around each part) the seconds per call of prefill, step, render and the
sentence-end render. The engine's own decode rate (Engine with CUDA graphs, same batch) is the reference.
--sentences K --stagger-ms M: requests of K sentences, one submitted every M ms, so that sentence ends and the
prefills of the sentences after them fall at different steps, as under a load test; --staggered K:M adds such a
run of the largest batch to each mode's simultaneous ones.

A mode is a step (eager, graphs, compiled) and Scheduler options after "+": sparse (sparse_attention), bounded
(bounded_attention), render-graphs, render-first, bucket<N> (cache_bucket=N), wait<N> (prefill_wait=N), every<N>
(render_every=N). An option not named is off (or at the Scheduler's default), so `ttsq serve --compile` is
compiled+bounded+render-graphs and `compiled` alone traces attention per cache bucket. Several modes in one process
share the compiles they have in common (inductor's cache), so an A/B of options costs one cold compile:

    python3 benchmarks/serve_profile.py --device cuda --precision bf16 --batches 1,16,64 --modes graphs,compiled \
        [--compile] --out OUT.json
    python3 benchmarks/serve_profile.py --batches 1,64 --staggered 3:4 \
        --modes compiled+bounded+render-graphs,compiled+bounded+render-graphs+render-first --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from provenance import commit  # noqa: E402  (benchmarks/, the script's own folder)

from toolkit import SamplingParams, Synthesizer  # noqa: E402
from toolkit.bench import decode_rate, random_model  # noqa: E402
from toolkit.scheduler import Scheduler  # noqa: E402
from toolkit.synthesizer import load_model  # noqa: E402

SENTENCE = "The quick brown fox jumps over the lazy dog."


def run_batch(sched: Scheduler, B: int, seed0: int, sentences: int = 1, stagger_s: float = 0.0) -> dict:
    sched.timings.clear()
    steps0 = sched.steps_run
    t0 = time.perf_counter()
    jobs = []
    for i in range(B):
        if stagger_s and i:
            time.sleep(stagger_s)
        jobs.append(sched.submit(" ".join([SENTENCE] * sentences), seed=seed0 + i))
    for job in jobs:
        for kind, data in job.events():
            if kind == "error":
                raise data
    wall = time.perf_counter() - t0
    steps = sched.steps_run - steps0
    ttfa = sorted(j.first_audio - j.submitted for j in jobs)
    audio = sum(j.samples for j in jobs) / 24000
    out = {
        "batch": B,
        "sentences": sentences,
        "stagger_ms": round(1000 * stagger_s, 1),
        "steps": steps,
        "wall_s": round(wall, 3),
        "ms_per_step": round(1000 * wall / steps, 3),
        "ttfa_p50_ms": round(1000 * statistics.median(ttfa), 1),
        "ttfa_max_ms": round(1000 * ttfa[-1], 1),
        "audio_s_per_s": round(audio / wall, 1),
    }
    if sched.profile:
        out["parts_ms_per_call"] = {k: round(1000 * s / max(n, 1), 3) for k, (s, n) in sched.timings.items()}
        out["parts_ms_per_step"] = {k: round(1000 * s / steps, 3) for k, (s, n) in sched.timings.items()}
    return out


FLAGS = ("sparse", "bounded", "render-graphs", "render-first")
NUMBERED = re.compile(r"(bucket|wait|every)(\d+)")
OPTIONS = (*FLAGS, "bucket<N>", "wait<N>", "every<N>")


def mode_options(mode: str, cuda: bool) -> dict:
    """A mode's Scheduler arguments: "compiled+render-graphs+bucket256" -> graphs, compile, render_graphs, ..."""
    step, *opts = mode.split("+")
    numbered = [NUMBERED.fullmatch(o) for o in opts]
    number = {m[1]: int(m[2]) for m in numbered if m}
    if step not in ("eager", "graphs", "compiled") or any(not m and o not in FLAGS for o, m in zip(opts, numbered)):
        raise SystemExit(f"--modes: {mode!r} is not a step (eager, graphs, compiled) with options from {OPTIONS}")
    return {
        "graphs": step != "eager" and cuda,
        "compile": step == "compiled",
        "sparse_attention": "sparse" in opts,
        "bounded_attention": "bounded" in opts,
        "render_graphs": "render-graphs" in opts and step != "eager" and cuda,
        "render_first": "render-first" in opts,
        "cache_bucket": number.get("bucket"),
        "prefill_wait": number.get("wait", 0),
        "render_every": number.get("every", 32),  # 2 * chunk: compile's default (64) only where named
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--precision", default="bf16")
    p.add_argument("--slots", type=int, default=64)
    p.add_argument("--batches", default="1,16,64")
    p.add_argument(
        "--modes",
        default="eager,graphs,compiled",
        help="eager, graphs, compiled (the scheduler's whole step), each with options after +: sparse (block-sparse "
        "attention), bounded, render-graphs, render-first, bucket<N> (e.g. compiled+render-graphs+bucket256)",
    )
    p.add_argument("--warm-up-positions", type=int, default=1024, help="cache lengths warmed up (compiled) before")
    p.add_argument("--steps", type=int, default=235)
    p.add_argument("--compile", action="store_true", help="torch.compile the GPT blocks (ttsq serve --compile)")
    p.add_argument("--sentences", type=int, default=1, help="sentences per request")
    p.add_argument("--stagger-ms", type=float, default=0.0, help="between the submissions of a batch's requests")
    p.add_argument("--staggered", default=None, help="K:M, a run of the largest batch, K sentences, M ms apart")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    dev = torch.device(a.device)
    batches = [int(b) for b in a.batches.split(",")]
    modes = {mode: mode_options(mode, dev.type == "cuda") for mode in a.modes.split(",")}
    runs = [(B, a.sentences, a.stagger_ms) for B in batches]
    if a.staggered:
        k, ms = a.staggered.split(":")
        runs.append((max(batches), int(k), float(ms)))
    model = random_model("chattts", torch.device("cpu"))
    model.tokenizer = load_model().tokenizer
    synth = Synthesizer(model, a.device, a.precision, compile="block" if a.compile else False)
    params = SamplingParams(min_new_tokens=a.steps, max_new_tokens=a.steps)
    report: dict = {"commit": commit(), "args": vars(a), "torch": torch.__version__, "modes": {}}
    if dev.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(dev)
        report["engine_steps_per_s"] = {
            B: round(
                decode_rate(
                    synth.model,
                    B,
                    a.steps,
                    dev,
                    cuda_graphs=True,
                    kernels=False,
                    repeats=2,
                    compile="block" if a.compile else False,
                ),
                1,
            )
            for B in batches
        }
        print(json.dumps(report["engine_steps_per_s"]), flush=True)
    ref = None
    for mode, options in modes.items():
        sched = Scheduler(synth, slots=a.slots, params=params, max_chars=60, **options)
        t0 = time.perf_counter()
        captured = sched.warm_up(lengths=a.warm_up_positions) if a.warm_up_positions else 0
        res: dict = {"warm_up_s": round(time.perf_counter() - t0, 2), "graphs_captured": captured, "runs": []}
        print(mode, json.dumps(res), flush=True)
        run_batch(sched, max(batches), 999)  # first-use costs (captures and compiles, without a warm-up)
        # the same two requests in every mode: how far a mode's audio is from the first mode's (bf16 rounding, and
        # the compiled step's fusions, can change a sampled code, after which the audio differs)
        audio = [
            np.concatenate([d for k, d in sched.submit(SENTENCE, seed=7 + i).events() if k == "audio"])
            for i in range(2)
        ]
        ref = ref or audio
        res["audio_vs_first_mode"] = [
            {"samples": [len(x), len(y)], "max_abs_diff": float(np.abs(x[: len(y)] - y[: len(x)]).max())}
            for x, y in zip(audio, ref)
        ]
        for profile in (False, True):
            sched.profile = profile
            for B, sentences, stagger_ms in runs:
                row = run_batch(sched, B, 1000 * B, sentences, stagger_ms / 1000)
                row["profile"] = profile
                res["runs"].append(row)
                print(mode, json.dumps(row), flush=True)
        sched.close()
        res["compactions"] = sched.compactions
        report["modes"][mode] = res
        del sched
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(report, indent=1) + "\n")  # after each mode: a later one may not finish
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Sustained load: many requests of random length, precision, batch and mode (whole or streamed) through one
process, with bad requests and (on CUDA) an out-of-memory batch mixed in. It checks that nothing errs unexpectedly,
memory does not grow, and fixed-seed output stays bit-identical from start to end.

    python3 benchmarks/soak.py --requests 1000 --device cpu --out benchmarks/results/current/soak_cpu.json
    python3 benchmarks/soak.py --requests 1000 --device cuda --precisions fp32,bf16,int8,int4 --out $OUT/soak.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from toolkit import OutOfMemory, SamplingParams, Synthesizer  # noqa: E402
from toolkit.text import TextError  # noqa: E402
from toolkit.textsets import load_text_set  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROBE = ("The probe sentence, spoken at the start and at the end.", 1234)
# (request, the error it must raise): each is followed by a normal request that must succeed
BAD = [
    (dict(texts=["   \n\t "]), TextError),
    (dict(texts=["[laugh] [uv_break]"], control_tokens=True), TextError),
    (dict(texts=[]), TextError),
    (dict(texts=["hello"], speaker="nobody-has-this-voice"), ValueError),
    (dict(texts=["hello"], batch_size=0), ValueError),
]


def rss_mib() -> float:
    """Current resident set size (Linux /proc; falls back to the peak)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * resource.getpagesize() / 2**20
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def device_mib(dev: torch.device) -> float | None:
    return torch.cuda.memory_allocated(dev) / 2**20 if dev.type == "cuda" else None


def device_snapshot(dev: torch.device) -> dict | None:
    """The allocator's statistics and NVML's view of the GPU, logged at the start and at the end."""
    if dev.type != "cuda":
        return None
    keys = (
        "allocated_bytes.all.current",
        "reserved_bytes.all.current",
        "allocated_bytes.all.peak",
        "num_alloc_retries",
        "num_ooms",
        "inactive_split_bytes.all.current",
    )
    stats = torch.cuda.memory_stats(dev)
    snap = {"torch": {k: stats.get(k) for k in keys}}
    try:
        import pynvml

        pynvml.nvmlInit()
        snap["nvml_used_bytes"] = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(dev.index or 0)).used
    except Exception as e:  # noqa: BLE001 - NVML is optional; torch's numbers stand alone
        snap["nvml_used_bytes"] = f"unavailable: {type(e).__name__}"
    return snap


def provoke_out_of_memory(synth: Synthesizer, dev: torch.device) -> int:
    """Fill the GPU to within 64 MiB of full (front-ending 10^5 texts would take longer than the soak), then ask for
    512 sentences of 2048 steps. -> 1 if that raised OutOfMemory, else 0. (With 256 MiB left and 256 sentences, the
    tiny model's bf16 KV cache, exactly 256 MiB, once fitted: that provocation provoked nothing.)"""
    torch.cuda.empty_cache()  # memory the allocator caches is not in mem_get_info's free figure
    free, _ = torch.cuda.mem_get_info(dev)
    ballast = torch.empty(max(0, free - 64 * 2**20), dtype=torch.uint8, device=dev)
    try:
        synth.synthesize(
            ["A long sentence, spoken slowly, that goes on."] * 512,
            batch_size=512,
            params=SamplingParams(max_new_tokens=2048, min_new_tokens=2048),
        )
        return 0
    except OutOfMemory:
        return 1
    finally:
        del ballast
        torch.cuda.empty_cache()


def probe(synth: Synthesizer) -> np.ndarray:
    return synth.synthesize(PROBE[0], seed=PROBE[1], params=SamplingParams(max_new_tokens=64))[0].wav


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model folder (default: the shipped voice)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--precisions", default="fp32,bf16,int8")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument(
        "--minutes",
        type=float,
        default=None,
        help="stop early, cleanly (final probes, results written), once this much wall time has passed",
    )
    ap.add_argument("--max-steps", type=int, default=96, help="upper end of each request's random max_new_tokens")
    ap.add_argument("--max-texts", type=int, default=8, help="largest number of texts in one request")
    ap.add_argument("--lengths", default="short,medium,long", help="length buckets of calibration texts to draw from")
    ap.add_argument(
        "--oom-every",
        type=int,
        default=250,
        help="on CUDA, provoke an out-of-memory error every this many requests (0: never); each one drops "
        "the engine's cache and graphs, which are then recaptured",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="JSON file to write")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")  # "reached max_new_tokens" is expected with capped lengths
    rng = random.Random(args.seed)
    texts = [r.text for r in load_text_set(ROOT / "calibration_sets" / "calib.jsonl") if r.length in args.lengths]
    synths = {
        p: Synthesizer(args.model, args.device, None if p == "fp32" else p, warmup=True)
        for p in args.precisions.split(",")
    }
    dev = next(iter(synths.values())).device
    before = {p: probe(s) for p, s in synths.items()}
    memory_at_start = device_snapshot(dev)
    counts = {
        "ok": 0,
        "streamed": 0,
        "expected_errors": 0,
        "unexpected_errors": 0,
        "oom_provoked": 0,
        "oom_recovered": 0,
        "nan_in_audio": 0,
    }
    failures, samples, audio_s = [], [], 0.0
    shapes_seen: set = set()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "python3 benchmarks/soak.py " + " ".join(sys.argv[1:] if argv is None else argv)
    t_start = time.perf_counter()
    deadline = t_start + 60 * args.minutes if args.minutes else float("inf")
    for i in range(args.requests):
        name = rng.choice(list(synths))
        synth = synths[name]
        n_texts = rng.choice([n for n in (1, 1, 1, 2, 4, 8) if n <= args.max_texts])
        batch = [" ".join(rng.sample(texts, rng.choice([1, 1, 2, 3]))) for _ in range(n_texts)]
        params = SamplingParams(max_new_tokens=rng.randint(8, args.max_steps))
        try:
            # checked first: with the default, 125, 375, ... are also 25 mod 50, and bad requests once shadowed them
            oom_turn = args.oom_every and i % args.oom_every == args.oom_every // 2
            if oom_turn and dev.type == "cuda":  # a batch beyond the GPU: OutOfMemory, then recover
                counts["oom_provoked"] += 1
                counts["oom_recovered"] += provoke_out_of_memory(synth, dev)
            elif i % 50 == 25:  # a bad request, which must fail cleanly (control tokens alone are text, unless asked)
                kwargs, expected = BAD[(i // 50) % len(BAD)]
                try:
                    synth.synthesize(**kwargs)
                    raise AssertionError(f"bad request {kwargs} was accepted")
                except expected:
                    counts["expected_errors"] += 1
            elif rng.random() < 0.25:
                wav = np.concatenate(list(synth.stream(batch[0], seed=i, params=params)))
                counts["streamed"] += 1
                counts["nan_in_audio"] += int(not np.isfinite(wav).all())
                audio_s += len(wav) / synth.sample_rate
            else:
                for u in synth.synthesize(
                    batch, seed=i, params=params, batch_size=rng.choice([1, 4, 8]), control_tokens=rng.random() < 0.5
                ):
                    counts["nan_in_audio"] += int(not np.isfinite(u.wav).all())
                    audio_s += u.duration
            counts["ok"] += 1
        except Exception as e:  # noqa: BLE001 - a soak counts every failure instead of stopping at the first
            counts["unexpected_errors"] += 1
            failures.append(f"request {i} ({name}): {type(e).__name__}: {e}")
            print(failures[-1], file=sys.stderr, flush=True)
        cached = {(prec, key) for prec, sy in synths.items() for key in sy.engine.cached_shapes()}
        shapes_seen |= cached
        done = i + 1
        last = done == args.requests or time.perf_counter() > deadline
        if i % 50 == 0 or last:
            # if host memory grows only while new step shapes (buffers, graphs) keep turning up, it is a cache filling
            samples.append(
                {
                    "request": i,
                    "rss_mib": rss_mib(),
                    "device_mib": device_mib(dev),
                    "shapes_cached": len(cached),
                    "shapes_seen": len(shapes_seen),
                    "graphs_captured": sum(sy.engine.captures for sy in synths.values()),
                }
            )
            print(
                f"{i + 1}/{args.requests} rss {samples[-1]['rss_mib']:.0f} MiB, shapes {len(cached)} cached / "
                f"{len(shapes_seen)} seen, errors {counts['unexpected_errors']}",
                flush=True,
            )
            # rewritten as it goes: a run killed by a time limit still leaves its record so far
            out.write_text(
                json.dumps(
                    {
                        "complete": False,
                        "command": command,
                        "requests": done,
                        "counts": counts,
                        "memory_samples": samples,
                        "failures": failures[:50],
                    },
                    indent=1,
                )
            )
        if last:
            break
    wall = time.perf_counter() - t_start
    after = {p: probe(s) for p, s in synths.items()}
    memory_at_end = device_snapshot(dev)
    deterministic = {p: bool(np.array_equal(before[p], after[p])) for p in synths}
    # memory growth: steady state (after the first fifth, once every shape has been seen) to the end
    steady = [s for s in samples if s["request"] >= done // 5]
    growth = steady[-1]["rss_mib"] - statistics.median(s["rss_mib"] for s in steady[: max(1, len(steady) // 4)])
    dev_growth = (steady[-1]["device_mib"] - steady[0]["device_mib"]) if dev.type == "cuda" else None
    result = {
        "complete": True,
        "command": command,
        "hardware": torch.cuda.get_device_name(dev)
        if dev.type == "cuda"
        else f"{platform.machine()} CPU, {torch.get_num_threads()} threads",
        "torch": torch.__version__,
        "model": args.model or "shipped voice",
        "precisions": list(synths),
        # cuDNN keeps a host-side plan per conv shape (the renders' random lengths), LRU-bounded by this variable
        "cudnn_plan_cache_limit": os.environ.get("TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT", "10000 (default)"),
        "requests": done,
        "requests_asked": args.requests,
        "wall_s": wall,
        "audio_s": audio_s,
        "counts": counts,
        "deterministic_probe": deterministic,
        "rss_growth_mib_steady_state": growth,
        "device_growth_mib": dev_growth,
        "device_memory_start": memory_at_start,
        "device_memory_end": memory_at_end,
        "memory_samples": samples,
        "failures": failures[:50],
    }
    out.write_text(json.dumps(result, indent=1))
    ok = (
        counts["unexpected_errors"] == 0
        and counts["nan_in_audio"] == 0
        and all(deterministic.values())
        and counts["oom_recovered"] == counts["oom_provoked"]
    )
    print(
        json.dumps(
            {
                k: result[k]
                for k in (
                    "requests",
                    "wall_s",
                    "audio_s",
                    "counts",
                    "deterministic_probe",
                    "rss_growth_mib_steady_state",
                    "device_growth_mib",
                )
            },
            indent=1,
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

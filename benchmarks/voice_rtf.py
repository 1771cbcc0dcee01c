"""CPU real-time factor of a voice, as `ttsq synth` runs it (one text per call, seed 0, the default voice).

    python benchmarks/voice_rtf.py --set calibration_sets/heldout_natural_en.jsonl --limit 20 --threads 2 \
        --out benchmarks/results/current/voice_rtf_v13_cpu [--model DIR]

Per sentence: wall-clock RTF (synthesis seconds / audio seconds) and CPU RTF (CPU seconds of the process, all its
threads, and of its espeak-ng subprocesses / audio seconds). On a shared machine the wall clock measures the neighbours
too; the CPU time does not, so with --threads T the CPU RTF / T is what the wall RTF would be on T idle cores at
perfect parallelism, and the CPU RTF itself bounds the wall RTF on T idle cores from above. The first sentence warms
up and is not counted.
Writes OUT.json and OUT.md (medians, the load average before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from provenance import commit  # noqa: E402  (benchmarks/, the script's own folder)


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the espeak-ng front end runs as a subprocess)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--model", default=None, help="default: the shipped voice")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)

    import torch

    from toolkit import Synthesizer
    from toolkit.textsets import load_text_set

    torch.set_num_threads(a.threads)
    load_before = os.getloadavg()
    synth = Synthesizer(a.model)
    records = load_text_set(a.set)[: a.limit + 1]
    rows = []
    for i, r in enumerate(records):
        w0, c0 = time.perf_counter(), cpu_seconds()
        u = synth.synthesize(r.text, seed=0)[0]
        wall, cpu = time.perf_counter() - w0, cpu_seconds() - c0
        if i:  # the first call warms up
            rows.append(
                {
                    "id": r.id,
                    "audio_s": round(u.duration, 3),
                    "wall_rtf": wall / u.duration,
                    "cpu_rtf": cpu / u.duration,
                }
            )
        print(f"\r{i + 1}/{len(records)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    med = {k: statistics.median(r[k] for r in rows) for k in ("wall_rtf", "cpu_rtf")}
    res = {
        "command": " ".join(["python", "benchmarks/voice_rtf.py", *(argv or sys.argv[1:])]),
        "commit": commit(),
        "hardware": f"{platform.machine()} CPU, {os.cpu_count()} cores",
        "torch_threads": a.threads,
        "model": a.model or "shipped voice",
        "sentences": len(rows),
        "audio_s": round(sum(r["audio_s"] for r in rows), 1),
        "median_wall_rtf": med["wall_rtf"],
        "median_cpu_rtf": med["cpu_rtf"],
        "median_cpu_rtf_per_thread": med["cpu_rtf"] / a.threads,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "per_sentence": rows,
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n")
    md = [
        f"# CPU RTF of {res['model']}",
        "",
        f"`{res['command']}` at commit {commit}, {res['hardware']}, torch threads {a.threads}, "
        f"{len(rows)} sentences ({res['audio_s']} s of audio) after one warm-up; 1-minute load average "
        f"{load_before[0]:.1f} before, {res['loadavg_after'][0]:.1f} after.",
        "",
        "| median wall RTF | median CPU RTF (all threads) | CPU RTF / threads |",
        "|---:|---:|---:|",
        f"| {med['wall_rtf']:.3f} | {med['cpu_rtf']:.3f} | {res['median_cpu_rtf_per_thread']:.3f} |",
    ]
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())

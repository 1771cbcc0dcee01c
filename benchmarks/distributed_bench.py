"""Evaluation throughput with 1 and N ranks, in one run: `ttsq evaluate --distributed` under torchrun for each rank
count, the same set, precisions and seeds. Throughput is utterances (records x precisions x seeds) synthesized and
scored per second of the sharded phase (`sharded_wall_s` in report.json: model loading, synthesis, scoring and the
gather; rank 0's timing of each precision comes after it and is left out). Also checks that every rank count gives
the same quality numbers.

    python3 benchmarks/distributed_bench.py --ranks 1,2 --set calibration_sets/eval.jsonl --out out/dist-bench
    python3 benchmarks/distributed_bench.py --ranks 1,2 --device cpu --limit 6 --max-steps 32 --out /tmp/db  # CPU check

Each rank takes cuda:LOCAL_RANK when every rank has a GPU, else the CPU (gloo). Every run gets the same
OMP_NUM_THREADS (--threads-per-rank): torch's CPU arithmetic depends on the thread count, and torchrun would give
1 thread per rank to N > 1 ranks but leave one rank all cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUALITY = (
    "decoder_vocoder",
    "gpt_teacher_forced",
    "end_to_end",
    "per_sentence",
    "within_noise_floor",
    "gap_vs_noise_floor_db",
)


def run_ranks(n: int, a, out: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(n),
        "-m",
        "toolkit.cli",
        "evaluate",
        "--distributed",
        "--precisions",
        a.precisions,
        "--set",
        a.set,
        "--seeds",
        a.seeds,
        "--max-steps",
        str(a.max_steps),
        "--batch-size",
        str(a.batch_size),
        "--repeats",
        "1",
        "--out",
        str(out),
        "--force",
    ]
    cmd += ["--model", a.model] if a.model else []
    cmd += ["--device", a.device] if a.device else []
    cmd += ["--limit", str(a.limit)] if a.limit else []
    cmd += [] if a.dnsmos else ["--no-dnsmos"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(a.threads_per_rank)}
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"{n} rank(s) failed (exit {r.returncode}):\n{r.stderr[-6000:]}")
    report = json.loads((out / "report.json").read_text())
    utterances = report["text_set"]["records"] * len(report["precisions"]) * len(report["seeds"])
    return {
        "ranks": n,
        "devices": report["devices"],
        "process_wall_s": wall,
        "sharded_wall_s": report["sharded_wall_s"],
        "utterances": utterances,
        "utterances_per_s": utterances / report["sharded_wall_s"],
        "shards": report["shards"],
        "quality": {name: {k: p.get(k) for k in QUALITY} for name, p in report["precisions"].items()},
        "noise_floor": report["noise_floor"],
        "hardware": report["hardware"],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="1,2", help="rank counts to compare; the first is the baseline")
    p.add_argument("--model", default=None, help="model folder (default: the shipped voice)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: a GPU per rank if there are enough)")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--set", default=str(ROOT / "calibration_sets" / "eval.jsonl"))
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--max-steps", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads-per-rank", type=int, default=1, help="OMP_NUM_THREADS of every rank, in every run")
    p.add_argument("--dnsmos", action="store_true", help="score DNSMOS too (slower start-up per rank)")
    p.add_argument("--out", required=True, help="folder for distributed_bench.json and each run's report")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for n in (int(x) for x in a.ranks.split(",")):
        runs.append(run_ranks(n, a, out / f"ranks{n}"))
        r = runs[-1]
        print(
            f"{n} rank(s) on {', '.join(r['devices'])}: {r['utterances']} utterances in {r['sharded_wall_s']:.1f} s "
            f"sharded ({r['process_wall_s']:.1f} s whole process): {r['utterances_per_s']:.3f} utterances/s; "
            f"per rank: "
            + ", ".join(
                f"{s['units']} units / {s['expected_audio_s']:.0f} s expected audio / {s['wall_s']:.1f} s"
                for s in r["shards"]
            ),
            flush=True,
        )
    base = runs[0]
    for r in runs:
        r["speedup"] = r["utterances_per_s"] / base["utterances_per_s"]
        r["identical_quality"] = r["quality"] == base["quality"] and r["noise_floor"] == base["noise_floor"]
        print(
            f"{r['ranks']} rank(s): {r['speedup']:.2f}x the {base['ranks']}-rank throughput; quality numbers "
            f"{'identical' if r['identical_quality'] else 'DIFFERENT'}"
        )
    import torch

    result = {
        "benchmark": "distributed evaluation throughput",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "hardware": base["hardware"],
        "torch": torch.__version__,
        "args": vars(a),
        "runs": [{k: v for k, v in r.items() if k not in ("quality", "noise_floor")} for r in runs],
    }
    (out / "distributed_bench.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out / 'distributed_bench.json'}")
    return 0 if all(r["identical_quality"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())

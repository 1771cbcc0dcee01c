"""Prefill latency with and without `Engine(prefill_graphs=True)`: the prompt's prefill plus one decode step, at
ChatTTS's dimensions (random weights), per prompt length, medians of repeats after a warm-up (which captures),
and whether both sample the same codes. The question it answers: how much of the time to first audio is the
host launching the prefill's kernels one by one (about 20 ms of a 32-token prompt on the H200 by `ttsq bench`).

    python3 benchmarks/prefill.py --precision bf16 --lengths 32,100,200 --out $OUT/prefill.json [--compile]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from toolkit.bench import _prompt, random_model  # noqa: E402
from toolkit.engine import Engine, timed  # noqa: E402
from toolkit.precision import quantize  # noqa: E402
from toolkit.sampling import SamplingParams  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--lengths", default="32,100,200", help="prompt lengths")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--compile", action="store_true", help="Engine(compile=True), as `ttsq bench --compile`")
    ap.add_argument("--dims", choices=("chattts", "tiny"), default="chattts")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    model = copy.deepcopy(random_model(a.dims, dev))
    quantize(model, a.precision, device=dev)
    params = SamplingParams(max_new_tokens=32, min_new_tokens=32)
    rows = []
    for T in map(int, a.lengths.split(",")):
        emb, valid = _prompt(model, a.batch, T, dev)
        row, codes = {"prompt": T}, {}
        for graphs in (False, True):
            engine = Engine(model.gpt, compile=a.compile, prefill_graphs=graphs)
            codes[graphs] = engine.generate(emb, valid, params, seed=0, reserve=32).codes  # warm-up: compile, capture
            times = []
            for r in range(a.repeats):
                chunks = engine.stream(emb, valid, params, seed=r, first_yield=1, reserve=32)
                times.append(timed(lambda: next(chunks), dev))
                chunks.close()
            row["prefill_graphs" if graphs else "plain"] = round(statistics.median(times) * 1e3, 3)
        row["speedup"] = round(row["plain"] / row["prefill_graphs"], 2)
        row["same_codes"] = bool(torch.equal(codes[False], codes[True]))
        rows.append(row)
        print(json.dumps(row), flush=True)
    device = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(
        json.dumps(
            dict(
                command="python3 " + " ".join(sys.argv),
                device=device,
                torch=torch.__version__,
                precision=a.precision,
                batch=a.batch,
                compile=a.compile,
                dims=a.dims,
                unit="ms, prefill plus one step, median",
                rows=rows,
            ),
            indent=1,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

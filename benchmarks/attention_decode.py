"""Decode attention in isolation: one query per row against the whole static KV cache, per implementation, at
ChatTTS's head layout (12 heads x 64). Each implementation is torch.compile'd (as in the engine's whole-step
compile); 20 calls (one per layer) are captured in one CUDA graph and replayed, so launch overhead is what a
graphed step pays. Prints microseconds per call (median of replays).

    python3 benchmarks/attention_decode.py --batches 1,64 --lengths 640,1024 --out /tmp/attn.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F


def sdpa_bool(q, k, v, valid):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=valid[:, None, None, :])


def sdpa_additive(q, k, v, valid):
    bias = torch.zeros(valid.shape, dtype=q.dtype, device=q.device).masked_fill(~valid, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias[:, None, None, :])


def explicit(q, k, v, valid):
    s = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5  # (B, H, 1, S)
    s = s.masked_fill(~valid[:, None, None, :], float("-inf"))
    return (s.softmax(-1) @ v.float()).to(q.dtype)


def flex(q, k, v, valid):
    from torch.nn.attention.flex_attention import flex_attention

    def mask_invalid(score, b, h, q_idx, kv_idx):
        return torch.where(valid[b, kv_idx], score, -float("inf"))

    return flex_attention(q, k, v, score_mod=mask_invalid)


IMPLEMENTATIONS = {f.__name__: f for f in (sdpa_bool, sdpa_additive, explicit, flex)}


def time_call(fn, args, layers: int = 20, replays: int = 50) -> float:
    for _ in range(3):  # compile and warm up outside the graph
        fn(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(layers):
            fn(*args)
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / layers)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--lengths", default="640,1024", help="cache lengths S (the engine's bucket)")
    ap.add_argument("--filled", type=float, default=0.5, help="fraction of cache slots holding real keys")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--implementations", default=",".join(IMPLEMENTATIONS))
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("attention_decode.py times CUDA graphs: run it on a GPU")
    dtype, rows = getattr(torch, a.dtype), []
    for B in map(int, a.batches.split(",")):
        for S in map(int, a.lengths.split(",")):
            q = torch.randn(B, 12, 1, 64, device="cuda", dtype=dtype)
            k, v = (torch.randn(B, 12, S, 64, device="cuda", dtype=dtype) for _ in range(2))
            valid = torch.arange(S, device="cuda")[None, :].expand(B, S) < int(S * a.filled)
            reference = explicit(q, k, v, valid).float()
            for name in a.implementations.split(","):
                row = dict(implementation=name, batch=B, cache=S)
                try:
                    fn = torch.compile(IMPLEMENTATIONS[name], fullgraph=True, dynamic=False)
                    row["max_abs_error"] = float((fn(q, k, v, valid).float() - reference).abs().max())
                    row["us_per_call"] = round(time_call(fn, (q, k, v, valid)), 2)
                except Exception as e:  # noqa: BLE001 - recorded, the others still run
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                rows.append(row)
                print(json.dumps(row), flush=True)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(
            json.dumps(
                dict(
                    command="python3 " + " ".join(sys.argv),
                    device=torch.cuda.get_device_name(),
                    torch=torch.__version__,
                    dtype=a.dtype,
                    rows=rows,
                ),
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

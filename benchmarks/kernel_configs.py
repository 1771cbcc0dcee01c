"""Launch settings for toolkit/kernels.py, and each kernel against what it replaces, at ChatTTS's dimensions (bf16,
random weights, batch 1): microseconds per call, each timed as a CUDA graph of one call per layer (20, each on its
own layer's weights and cache, as in a step, so weights stream from HBM rather than sit in L2), median of 6 replays
(results/archive/kernel_configs_h200.json: of 5, after one discarded), with the shipped launch option (programmatic
dependent launch on Hopper). Prints the best setting per kernel and, with --apply, times the decode step with them
(engine_variants.py's measurement, same run): the compiled step without the kernels, the kernels without PDL, and
the kernels. --no-sweep times the step with the shipped settings only.

    python3 benchmarks/kernel_configs.py --out benchmarks/results/archive/kernel_configs_fused_h200.json [--apply]
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from attention_decode import time_call  # noqa: E402

from toolkit import kernels  # noqa: E402
from toolkit.bench import STEPS_PER_S, decode_rate, quantized_copy, random_model  # noqa: E402

CALLS = 20  # ChatTTS's layers
# block_k 1024 holds a whole 768-wide row: with PDL it is all loaded before the wait
GEMV = [dict(block_n=n, block_k=k, warps=w) for n, k, w in itertools.product((1, 2, 4, 8), (256, 512, 1024), (2, 4, 8))]
GRID = {
    "linear": GEMV,
    "gate": GEMV,
    "qkv": [dict(pairs=p, block_k=k, warps=w) for p, k, w in itertools.product((1, 2, 4), (256, 512, 1024), (2, 4, 8))],
    "oproj": [
        dict(block_n=n, block_k=k, warps=w) for n, k, w in itertools.product((1, 2, 4, 8), (256, 512, 1024), (2, 4, 8))
    ],
    "attention": [
        dict(splits=n, block_s=s, warps=w) for n, s, w in itertools.product((4, 8, 16, 32), (16, 32, 64), (1, 2, 4))
    ],
}


def us_per_call(fn) -> float:
    """fn(i) for each layer i, captured in one CUDA graph (attention_decode.time_call); median replay time / CALLS."""
    layer = itertools.cycle(range(CALLS))  # the graph's CALLS calls see each layer once, whatever the warm-up took
    return time_call(lambda: fn(next(layer)), (), layers=CALLS, replays=6)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=int, default=1024, help="KV cache slots (the query sits at the last)")
    ap.add_argument("--apply", action="store_true", help="then time the decode step with the best settings")
    ap.add_argument("--batches", default="1,2", help="batches for --apply")
    ap.add_argument("--precision", default="bf16", help="a recipe; int8@bf16 runs int8 weights on bf16 activations")
    ap.add_argument("--no-sweep", action="store_true", help="time the shipped settings only (with --apply)")
    ap.add_argument(
        "--sweep",
        default=None,
        help="sweep only these kernels, e.g. gate,oproj (default: all; a whole "
        "sweep takes about 9 minutes on the H200)",
    )
    ap.add_argument(
        "--sample-warps",
        default="",
        help="with --apply: also time the kernels with these warps for the sampling launch, e.g. 1,2,8",
    )
    ap.add_argument(
        "--kernels-only",
        action="store_true",
        help="with --apply: leave out the compiled step and the kernels without PDL",
    )
    ap.add_argument(
        "--configs",
        type=Path,
        help="apply the settings an earlier run chose (its JSON) instead of this run's sweep; goes with --no-sweep",
    )
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    dev = torch.device("cuda")
    base = random_model("chattts", dev)
    model = quantized_copy(base, dev, a.precision)
    gpt = model.gpt
    gpt.setup_caches(1, a.cache)
    gpt.key_valid.fill_(True)
    L, D = gpt.layers, gpt.cfg.hidden
    torch.manual_seed(0)
    dtype = gpt.norm.weight.dtype  # the activations' dtype
    h = torch.randn(1, D, device=dev, dtype=dtype)
    u = torch.randn(1, gpt.cfg.intermediate, device=dev, dtype=dtype)
    slot, rope = torch.tensor([a.cache - 1], device=dev), torch.tensor([[a.cache - 1]], device=dev)
    q = kernels.qkv_rope(h, L[0], gpt.inv_freq, rope, slot)
    parts = kernels.attention(q, L[0].attention.kv_cache.k, L[0].attention.kv_cache.v, gpt.key_valid, slot)
    q4 = q[:, :, None]
    mask = gpt.key_valid[:, None, None, :]

    def cache(i):
        return L[i].attention.kv_cache

    cases = {  # name: (kernel kind, the triton call on layer i, the PyTorch calls it replaces)
        "qkv (norm, rope, cache)": (
            "qkv",
            lambda i: kernels.qkv_rope(h, L[i], gpt.inv_freq, rope, slot),
            lambda i: L[i].attention.wqkv(L[i].attention_norm(h)),
        ),
        "attention": (
            "attention",
            lambda i: kernels.attention(q, cache(i).k, cache(i).v, gpt.key_valid, slot),
            lambda i: F.scaled_dot_product_attention(q4, cache(i).k, cache(i).v, attn_mask=mask),
        ),
        "combine + o-proj + residual": (
            "oproj",
            lambda i: kernels.linear(parts, L[i].attention.wo.weight, residual=h),
            lambda i: h + L[i].attention.wo(h),
        ),
        "gate/up (norm, silu)": (
            "gate",
            lambda i: kernels.linear(h, L[i].feed_forward.w13.weight, norm=L[i].ffn_norm, gate=True),
            lambda i: L[i].feed_forward.w13(L[i].ffn_norm(h)),
        ),
        "down + residual": (
            "linear",
            lambda i: kernels.linear(u, L[i].feed_forward.w2.weight, residual=h),
            lambda i: h + L[i].feed_forward.w2(u),
        ),
    }
    rows, chosen = [], {}
    sweep_pdl = kernels.uses_pdl(dev)  # the sweep runs with the shipped launch option
    default = copy.deepcopy(kernels.CONFIGS)
    swept = {} if a.no_sweep else {n: c for n, c in cases.items() if a.sweep is None or c[0] in a.sweep.split(",")}
    for name, (kind, triton_call, torch_call) in swept.items():
        rows.append(dict(case=name, impl="pytorch (eager ops in the graph)", us=round(us_per_call(torch_call), 2)))
        for config in GRID[kind]:
            kernels.CONFIGS[kind] = config
            try:
                rows.append(dict(case=name, impl="triton", config=config, us=round(us_per_call(triton_call), 2)))
            except Exception as e:  # noqa: BLE001 - a setting the compiler refuses is recorded, not fatal
                rows.append(dict(case=name, impl="triton", config=config, error=str(e)[:120]))
        kernels.CONFIGS[kind] = default[kind]
    for kind in dict.fromkeys(c[0] for c in swept.values()):  # per kind, the least total time over its cases
        names = [n for n, c in cases.items() if c[0] == kind]
        totals = {}
        for r in rows:
            if r["case"] in names and "us" in r and r["impl"] == "triton":
                totals.setdefault(json.dumps(r["config"]), []).append(r["us"])
        best = min((sum(v), k) for k, v in totals.items() if len(v) == len(names))
        chosen[kind] = json.loads(best[1])
    print(f"{'case':26} {'pytorch us':>10} {'triton us (chosen)':>19} {'best any':>9}  chosen setting")
    for name, (kind, _, _) in swept.items():
        mine = [r for r in rows if r["case"] == name and "us" in r]
        torch_us = mine[0]["us"]
        pick = next(r["us"] for r in mine[1:] if r["config"] == chosen[kind])
        print(f"{name:26} {torch_us:10.2f} {pick:19.2f} {min(r['us'] for r in mine[1:]):9.2f}  {chosen[kind]}")
    steps = []

    def save():  # after the sweep and after each decode timing, so a call cut short keeps what it measured
        out = dict(
            command="python3 " + " ".join(sys.argv),
            device=torch.cuda.get_device_name(dev),
            torch=torch.__version__,
            triton=__import__("triton").__version__,
            calls_per_graph=CALLS,
            cache=a.cache,
            precision=a.precision,
            sweep_pdl=sweep_pdl,
            chosen=chosen,
            configs=applied,
            rows=rows,
            decode_steps=steps,
        )
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(out, indent=1) + "\n")

    if a.configs:
        chosen = json.loads(a.configs.read_text())["chosen"]
    kernels.CONFIGS.update(chosen)
    applied = copy.deepcopy(kernels.CONFIGS)  # what --apply times; each variant sets its own PDL and sampling warps
    save()
    if a.apply:
        del gpt, model
        shipped = applied["sample"]["warps"]
        kernels_on = dict(compile=True, kernels=True)
        for B in map(int, a.batches.split(",")):
            for variant, opts, pdl, warps in (
                ("step (no kernels)", dict(compile=True, kernels=False), False, shipped),
                ("kernels without PDL", kernels_on, False, shipped),
                ("kernels", kernels_on, True, shipped),
                *(
                    (f"kernels, sampling in {w} warps", kernels_on, True, int(w))
                    for w in filter(None, a.sample_warps.split(","))
                ),
            ):
                if a.kernels_only and (not opts.get("kernels") or not pdl):
                    continue
                kernels.CONFIGS["sample"] = dict(warps=warps)
                torch._dynamo.reset()
                sps = decode_rate(quantized_copy(base, dev, a.precision), B, 470, dev, kernel_pdl=pdl, **opts)
                steps.append(
                    dict(
                        variant=variant,
                        batch=B,
                        steps_per_s=round(sps, 1),
                        audio_s_per_s=round(sps * B / STEPS_PER_S, 1),
                    )
                )
                print(json.dumps(steps[-1]), flush=True)
                save()
    return 0


if __name__ == "__main__":
    sys.exit(main())

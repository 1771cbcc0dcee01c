"""Triton kernels for the small-batch GPT decode step: six launches per layer instead of about eleven.

At batch 1 a step is bound by the latency of its many small kernels, not by bytes (on the H200: 706 us and 227
kernels per step, benchmarks/README.md). Here each matmul takes in the work around it:

    RMSNorm + QKV + RoPE + KV-cache write | attention over the cache (split, then combined) | o-proj + residual
    | RMSNorm + gate/up + SiLU gate | down-proj + residual

Every program reads whole weight rows for one batch row, so the weights are read once per row (L2 serves the
rows after the first): this path is for small batches (`Engine(kernels=...)` picks it). Accumulation is fp32 and
each matmul's output is rounded to the model's dtype, as in the PyTorch path. With TRITON_INTERPRET=1 set before
this module is imported, the same kernels run on the CPU (tests/test_kernels.py).
"""
from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from torch import Tensor

try:  # programmatic dependent launch: Triton 3.3 on
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:
    gdc_launch_dependents = gdc_wait = None

from .engine import DecodeState, decode_step as pytorch_decode_step
from .models.gpt import GPT, Block, RMSNorm
from .sampling import SamplingParams, sample_codes


def _weight(w: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(data, per-row scale, per-row zero point) of a linear weight (N, K): plain floats, or torchao's int8
    weight-only Int8Tensor with one scale per output row; anything else -> a ValueError naming it."""
    if type(w) in (torch.Tensor, torch.nn.Parameter) and w.dtype in (torch.float32, torch.float16, torch.bfloat16):
        return w, None, None
    block = getattr(w, "block_size", None)
    if (type(w).__name__ == "Int8Tensor" and getattr(w, "act_quant_kwargs", 1) is None
            and block is not None and list(block) == [1, w.shape[1]]):
        return w.qdata, w.scale.reshape(-1), w.zero_point.reshape(-1)
    raise ValueError(f"the Triton decode step reads float weights or int8 weight-only ones (per row), not "
                     f"{type(w).__name__} {w.dtype}")


def supports(gpt: GPT) -> bool:
    """Weights these kernels read (floats, or int8 weight-only per row) and power-of-two heads of at least 16."""
    d = gpt.cfg.head_dim
    try:
        for layer in gpt.layers:
            for w in (layer.attention.wqkv.weight, layer.attention.wo.weight, layer.feed_forward.w13.weight,
                      layer.feed_forward.w2.weight):
                _weight(w)
    except ValueError:
        return False
    return d >= 16 and d & (d - 1) == 0


@triton.jit
def _rstd(x_row, K, eps, BLOCK_K: tl.constexpr):
    """1 / RMS of x_row[:K], fp32."""
    acc = tl.zeros((BLOCK_K,), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_row + ks, mask=ks < K, other=0.0).to(tl.float32)
        acc += x * x
    return tl.rsqrt(tl.sum(acc, 0) / K + eps)


@triton.jit
def _round(x, dt: tl.constexpr):
    """fp32 -> fp32 rounded to dt: what storing x in the model's dtype would keep. The arithmetic itself stays in
    fp32 (the interpreter cannot do half-precision arithmetic)."""
    return x.to(dt).to(tl.float32)


@triton.jit
def _gemv(x_row, g_ptr, w_ptr, s_ptr, z_ptr, rows, rows2, K, eps, NORM: tl.constexpr, QUANT: tl.constexpr,
          TWO: tl.constexpr, PDL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """(W[rows] . xn, W[rows2] . xn) as fp32 (BLOCK_N,) each, the second only when TWO (gate and up, or a rotary
    pair's halves: x is loaded and normalised once for both). xn = x rounded like RMSNorm's output
    (weight * (x * rstd)) when NORM. QUANT: W is int8, (W - zero point) * scale per row.
    With PDL the first weight tiles are loaded before waiting for the previous kernel, which never writes weights:
    the load overlaps that kernel's tail. Each tile after is loaded one step ahead of its use."""
    dt: tl.constexpr = x_row.dtype.element_ty
    ks = tl.arange(0, BLOCK_K)
    w = tl.load(w_ptr + rows[:, None] * K + ks[None, :], mask=(ks < K)[None, :], other=0)
    w2 = w
    if TWO:
        w2 = tl.load(w_ptr + rows2[:, None] * K + ks[None, :], mask=(ks < K)[None, :], other=0)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    rstd = 1.0
    if NORM:
        rstd = _rstd(x_row, K, eps, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    acc2 = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    xsum = tl.zeros((BLOCK_K,), tl.float32)  # QUANT: sum(x), for the zero points
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = ks < K
        x = tl.load(x_row + ks, mask=kmask, other=0.0).to(tl.float32)
        if NORM:
            x = _round(_round(x * rstd, dt) * tl.load(g_ptr + ks, mask=kmask, other=0.0).to(tl.float32), dt)
        acc += w.to(tl.float32) * x[None, :]
        if TWO:
            acc2 += w2.to(tl.float32) * x[None, :]
        xsum += x
        ks += BLOCK_K
        w = tl.load(w_ptr + rows[:, None] * K + ks[None, :], mask=(ks < K)[None, :], other=0)
        if TWO:
            w2 = tl.load(w_ptr + rows2[:, None] * K + ks[None, :], mask=(ks < K)[None, :], other=0)
    y = tl.sum(acc, 1)
    y2 = tl.sum(acc2, 1)
    if QUANT:
        total = tl.sum(xsum, 0)
        y = (y - tl.load(z_ptr + rows).to(tl.float32) * total) * tl.load(s_ptr + rows).to(tl.float32)
        y2 = (y2 - tl.load(z_ptr + rows2).to(tl.float32) * total) * tl.load(s_ptr + rows2).to(tl.float32)
    return y, y2


@triton.jit
def _linear_kernel(x_ptr, g_ptr, w_ptr, s_ptr, z_ptr, res_ptr, out_ptr, N, K, eps,
                   NORM: tl.constexpr, GATE: tl.constexpr, RES: tl.constexpr, QUANT: tl.constexpr,
                   PDL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[m, n] = W[n] . xn[m] (+ res[m, n]); with GATE, silu(W[n] . xn[m]) * (W[N + n] . xn[m])."""
    pid = tl.program_id(0)
    m = tl.program_id(1)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    keep = rows < N
    rows = tl.where(keep, rows, 0)
    dt: tl.constexpr = out_ptr.dtype.element_ty
    y, up = _gemv(x_ptr + m * K, g_ptr, w_ptr, s_ptr, z_ptr, rows, rows + N, K, eps, NORM, QUANT, GATE, PDL,
                  BLOCK_N, BLOCK_K)
    y = _round(y, dt)
    if GATE:
        y = _round(y / (1.0 + tl.exp(-y)), dt) * _round(up, dt)
    if RES:
        y = y + tl.load(res_ptr + m * N + rows, mask=keep, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * N + rows, y.to(dt), mask=keep)


@triton.jit
def _qkv_rope_kernel(x_ptr, g_ptr, w_ptr, s_ptr, z_ptr, inv_freq_ptr, rope_ptr, slot_ptr, q_ptr, k_ptr, v_ptr,
                     K, H, S, eps, HEAD_DIM: tl.constexpr, PAIRS: tl.constexpr, QUANT: tl.constexpr,
                     PDL: tl.constexpr, BLOCK_K: tl.constexpr):
    """PAIRS rotary pairs (rows i and i + HEAD_DIM/2 of a head) of q, k or v for batch row m: normed x times W_qkv,
    RoPE on q and k; q goes to q_ptr (M, H, HEAD_DIM), k and v into the cache (B, H, S, HEAD_DIM) at the slot.
    Programs walk the q heads, then the k heads, then the v heads."""
    HALF: tl.constexpr = HEAD_DIM // 2
    per_head: tl.constexpr = HALF // PAIRS
    j = tl.program_id(0) // per_head
    d = (tl.program_id(0) % per_head) * PAIRS + tl.arange(0, PAIRS)
    m = tl.program_id(1)
    dt: tl.constexpr = q_ptr.dtype.element_ty
    lo, hi = _gemv(x_ptr + m * K, g_ptr, w_ptr, s_ptr, z_ptr, j * HEAD_DIM + d, j * HEAD_DIM + HALF + d, K, eps,
                   True, QUANT, True, PDL, PAIRS, BLOCK_K)
    lo = _round(lo, dt)
    hi = _round(hi, dt)
    which = j // H
    head = j % H
    if which < 2:  # rotate_half: (lo, hi) -> (lo cos - hi sin, hi cos + lo sin)
        angle = tl.load(rope_ptr + m).to(tl.float32) * tl.load(inv_freq_ptr + d)
        cos = _round(tl.cos(angle), dt)
        sin = _round(tl.sin(angle), dt)
        lo, hi = lo * cos - hi * sin, hi * cos + lo * sin
    slot = tl.load(slot_ptr)
    if which == 0:
        dst = q_ptr + (m * H + head) * HEAD_DIM
    elif which == 1:
        dst = k_ptr + ((m * H + head) * S + slot) * HEAD_DIM
    else:
        dst = v_ptr + ((m * H + head) * S + slot) * HEAD_DIM
    tl.store(dst + d, lo.to(dt))
    tl.store(dst + HALF + d, hi.to(dt))


@triton.jit
def _attention_kernel(q_ptr, k_ptr, v_ptr, valid_ptr, slot_ptr, part_ptr, stat_ptr, count_ptr, out_ptr, H, S,
                      valid_stride, scale, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
                      PDL: tl.constexpr):
    """Flash-decoding in one launch: one query (head h, batch row m) against cache slots [c * BLOCK_S, +BLOCK_S)
    that are at most the query's slot, written as the block's unnormalised output (fp32), max score and softmax
    sum; the last block of a (row, head) to finish (an atomic count) combines them all -> out (M, H * HEAD_DIM) and
    resets the count. Keys are masked by key_valid (left padding) except the query's own slot, as in GPT._run's
    mask. With PDL the earlier slots' keys and values load before the wait; the own slot, just written by the
    previous kernel, is read after it."""
    h = tl.program_id(0)
    c = tl.program_id(1)
    m = tl.program_id(2)
    splits = tl.num_programs(1)
    row = m * H + h
    slot = tl.load(slot_ptr)  # written before the step's first layer: safe before the wait
    d = tl.arange(0, HEAD_DIM)
    s = c * BLOCK_S + tl.arange(0, BLOCK_S)
    seen = s <= slot  # blocks past the slot load nothing
    base = row * S * HEAD_DIM
    valid = tl.load(valid_ptr + m * valid_stride + s, mask=seen, other=0) != 0
    k = tl.load(k_ptr + base + s[:, None] * HEAD_DIM + d[None, :], mask=seen[:, None], other=0.0)
    v = tl.load(v_ptr + base + s[:, None] * HEAD_DIM + d[None, :], mask=seen[:, None], other=0.0)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    own = (s == slot)[:, None]
    k = tl.where(own, tl.load(k_ptr + base + slot * HEAD_DIM + d)[None, :], k)
    v = tl.where(own, tl.load(v_ptr + base + slot * HEAD_DIM + d)[None, :], v)
    q = tl.load(q_ptr + row * HEAD_DIM + d).to(tl.float32) * scale
    scores = tl.where((seen & valid) | (s == slot), tl.sum(k.to(tl.float32) * q[None, :], 1), float("-inf"))
    best = tl.max(scores, 0)
    p = tl.exp(scores - tl.where(best == float("-inf"), 0.0, best))  # a block with no valid key adds nothing
    part = row * splits + c
    tl.store(part_ptr + part * HEAD_DIM + d, tl.sum(p[:, None] * v.to(tl.float32), 0))
    tl.store(stat_ptr + part * 2, best)
    tl.store(stat_ptr + part * 2 + 1, tl.sum(p, 0))
    tl.debug_barrier()  # all of this program's stores issued before its (release) count
    if tl.atomic_add(count_ptr + row, 1) == splits - 1:
        cs = tl.arange(0, BLOCK_C)
        used = cs < splits
        at = row * splits + cs  # read through L2 (.cg): other programs wrote these
        maxes = tl.load(stat_ptr + at * 2, mask=used, other=float("-inf"), cache_modifier=".cg")
        sums = tl.load(stat_ptr + at * 2 + 1, mask=used, other=0.0, cache_modifier=".cg")
        scale_c = tl.exp(maxes - tl.max(maxes, 0))  # the own slot is always valid, so the max is finite
        parts = tl.load(part_ptr + at[:, None] * HEAD_DIM + d[None, :], mask=used[:, None], other=0.0,
                        cache_modifier=".cg")
        combined = tl.sum(scale_c[:, None] * parts, 0) / tl.sum(scale_c * sums, 0)
        tl.store(out_ptr + row * HEAD_DIM + d, combined.to(out_ptr.dtype.element_ty))
        tl.atomic_xchg(count_ptr + row, 0)  # ready for the next layer's launch


@triton.jit
def _rmsnorm_kernel(x_ptr, g_ptr, out_ptr, K, eps, PDL: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[m] = RMSNorm(x[m]), rounded as RMSNorm.forward rounds: the final norm in one launch."""
    m = tl.program_id(0)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    rstd = _rstd(x_ptr + m * K, K, eps, BLOCK_K)
    dt: tl.constexpr = out_ptr.dtype.element_ty
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = ks < K
        x = tl.load(x_ptr + m * K + ks, mask=kmask, other=0.0).to(tl.float32)
        y = _round(x * rstd, dt) * tl.load(g_ptr + ks, mask=kmask, other=0.0).to(tl.float32)
        tl.store(out_ptr + m * K + ks, y.to(dt), mask=kmask)


@triton.jit
def _sample_feed_kernel(logits_ptr, hist_ptr, temp_ptr, noise_ptr, step_ptr, min_new_ptr, emb_ptr, h_ptr,
                        hidden_ptr, codes_ptr, finished_ptr, lengths_ptr, x_ptr, prompt_len_ptr, rope_base_ptr,
                        slot_ptr, rope_ptr, counts_ptr, V, W, D, H, CHUNK, EOS, top_k, top_p, min_keep, log2_penalty,
                        Q: tl.constexpr, PENALTY: tl.constexpr, TOP_P: tl.constexpr, BLOCK_V: tl.constexpr,
                        BLOCK_W: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr):
    """Everything of a decode step between the code heads and the first layer, for batch row b, as
    engine.decode_step and sampling.sample_codes do it: for each codebook, temperature, repetition penalty over the
    history window, top-p inside top-k (the k best sorted), EOS barred before min_new, the draw argmax(p / noise);
    then the history, codes, hidden, finished and lengths bookkeeping, the next input (the Q code embeddings summed),
    the cache slot and RoPE positions, and zeroed attention counts for the layers."""
    b = tl.program_id(0)
    step = tl.load(step_ptr)
    j = step % CHUNK
    v = tl.arange(0, BLOCK_V)
    inside = v < V
    dd = tl.arange(0, BLOCK_D)
    dt: tl.constexpr = x_ptr.dtype.element_ty
    emb_sum = tl.zeros((BLOCK_D,), tl.float32)
    hit_eos = False
    for q in tl.static_range(Q):
        n = b * Q + q
        x = tl.load(logits_ptr + n * V + v, mask=inside, other=float("-inf")).to(tl.float32) / tl.load(temp_ptr + n)
        if PENALTY:
            w = tl.arange(0, BLOCK_W)
            hist = tl.load(hist_ptr + n * W + w, mask=w < W, other=V)  # V: an empty slot of the window
            seen = tl.sum((hist[:, None] == v[None, :]).to(tl.float32), 0)
            alpha = tl.exp2(seen * log2_penalty)
            x = tl.where(x < 0, x * alpha, x / alpha)
        top = tl.max(x, 0)
        desc = tl.sort(x, descending=True)
        rank = tl.arange(0, BLOCK_V)
        kept = top_k
        if TOP_P:
            lse = top + tl.log(tl.sum(tl.exp(x - top), 0))
            probs = tl.where(rank < top_k, tl.exp(desc - lse), 0.0)
            above = tl.cumsum(probs, 0) - probs  # probability of the better-ranked tokens
            kept = tl.maximum(tl.sum(((above < top_p) & (rank < top_k)).to(tl.int32), 0), tl.minimum(min_keep, top_k))
        cut = tl.sum(tl.where(rank == kept - 1, desc, 0.0), 0)  # the kept-th best logit
        x = tl.where(x < cut, float("-inf"), x)
        x = tl.where((v == EOS) & (step < tl.load(min_new_ptr)), float("-inf"), x)
        e = tl.exp(x - tl.max(x, 0))
        noise = tl.load(noise_ptr + (j * tl.num_programs(0) * Q + n) * V + v, mask=inside, other=1.0)
        code = tl.argmax(e / tl.sum(e, 0) / noise, 0)
        tl.store(hist_ptr + n * W + step % W, code.to(hist_ptr.dtype.element_ty))
        tl.store(codes_ptr + (b * CHUNK + j) * Q + q, code.to(codes_ptr.dtype.element_ty))
        hit_eos = hit_eos | (code == EOS)
        emb_sum += tl.load(emb_ptr + (q * V + code) * D + dd, mask=dd < D, other=0.0).to(tl.float32)
    finished = (tl.load(finished_ptr + b) != 0) | hit_eos
    tl.store(finished_ptr + b, finished.to(finished_ptr.dtype.element_ty))
    tl.store(lengths_ptr + b, tl.load(lengths_ptr + b) + (1 - finished.to(tl.int64)))
    row = tl.load(h_ptr + b * D + dd, mask=dd < D)
    tl.store(hidden_ptr + (b * CHUNK + j) * D + dd, row, mask=dd < D)
    tl.store(x_ptr + b * D + dd, emb_sum.to(dt), mask=dd < D)
    tl.store(rope_ptr + b, tl.load(rope_base_ptr + b) + step)
    if b == 0:
        tl.store(slot_ptr, tl.load(prompt_len_ptr) + step)
    hs = tl.arange(0, BLOCK_H)
    tl.store(counts_ptr + b * H + hs, tl.zeros((BLOCK_H,), tl.int32), mask=hs < H)


def _block_k(K: int, block_k: int) -> int:
    return min(triton.next_power_of_2(K), block_k)


# launch settings per kernel, chosen on the H200 with PDL (benchmarks/kernel_configs.py,
# results/kernel_configs_pdl_h200.json): whole 768-wide rows in one tile, so with PDL a program has loaded all its
# weights by the time the previous kernel ends
CONFIGS = {
    "linear": dict(block_n=1, block_k=1024, warps=4),  # o-proj, down-proj
    "gate": dict(block_n=8, block_k=512, warps=4),  # gate/up with SiLU
    "qkv": dict(pairs=2, block_k=1024, warps=2),
    "attention": dict(block_s=16, warps=1),
    "launch": dict(pdl=True),  # programmatic dependent launch, where the GPU has it (Hopper on)
}


@functools.lru_cache(maxsize=None)
def _has_pdl(device: torch.device) -> bool:
    return gdc_wait is not None and device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)


def _pdl(device: torch.device) -> dict:
    """Launch options: each kernel launched as a programmatic dependent of the one before, so it starts (and loads
    its weights) while that one finishes, and waits for it (gdc_wait) only before reading what it wrote."""
    pdl = CONFIGS["launch"]["pdl"] and _has_pdl(device)
    return dict(PDL=pdl, launch_pdl=True) if pdl else dict(PDL=False)


def linear(x: Tensor, weight: Tensor, norm: RMSNorm | None = None, residual: Tensor | None = None,
           gate: bool = False) -> Tensor:
    """x (M, K), weight (N, K) or, with gate, (2N, K) -> (M, N): (residual +) norm(x) @ weight.T, or
    silu(norm(x) @ W_gate.T) * (norm(x) @ W_up.T)."""
    M, K = x.shape
    N = weight.shape[0] // (2 if gate else 1)
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    c = CONFIGS["gate" if gate else "linear"]
    w, scale, zero = _weight(weight)
    _linear_kernel[(triton.cdiv(N, c["block_n"]), M)](
        x, norm.weight if norm is not None else x, w, w if scale is None else scale, w if zero is None else zero,
        residual if residual is not None else x, out, N, K, norm.eps if norm is not None else 0.0,
        NORM=norm is not None, GATE=gate, RES=residual is not None, QUANT=scale is not None,
        BLOCK_N=c["block_n"], BLOCK_K=_block_k(K, c["block_k"]), num_warps=c["warps"], **_pdl(x.device))
    return out


def attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, key_valid: Tensor, slot: Tensor,
              counts: Tensor | None = None) -> Tensor:
    """q (M, H, hd) for cache slot `slot` (1,), caches (B >= M, H, S, hd), key_valid (B, S) -> (M, H * hd).
    counts: M * H int32 zeros, left zero again (decode_forward shares one across layers); None: made here."""
    M, H, hd = q.shape
    S = k_cache.shape[2]
    c = CONFIGS["attention"]
    splits = triton.cdiv(S, c["block_s"])
    part = torch.empty(M, H, splits, hd, dtype=torch.float32, device=q.device)
    stat = torch.empty(M, H, splits, 2, dtype=torch.float32, device=q.device)
    counts = torch.zeros(M * H, dtype=torch.int32, device=q.device) if counts is None else counts
    out = torch.empty(M, H * hd, dtype=q.dtype, device=q.device)
    _attention_kernel[(H, splits, M)](q, k_cache, v_cache, key_valid, slot, part, stat, counts, out, H, S,
                                      key_valid.stride(0), hd ** -0.5, HEAD_DIM=hd, BLOCK_S=c["block_s"],
                                      BLOCK_C=triton.next_power_of_2(splits), num_warps=c["warps"], **_pdl(q.device))
    return out


def qkv_rope(h: Tensor, layer: Block, inv_freq: Tensor, rope_pos: Tensor, slot: Tensor) -> Tensor:
    """h (M, D) -> q (M, H, hd) after RMSNorm, W_qkv and RoPE; k and v go into the layer's cache at `slot` (1,)."""
    M, D = h.shape
    att, cache = layer.attention, layer.attention.kv_cache
    H, hd = att.heads, att.head_dim
    c = CONFIGS["qkv"]
    pairs = min(c["pairs"], hd // 2)
    q = torch.empty(M, H, hd, dtype=h.dtype, device=h.device)
    w, scale, zero = _weight(att.wqkv.weight)
    _qkv_rope_kernel[(3 * H * hd // 2 // pairs, M)](
        h, layer.attention_norm.weight, w, scale if scale is not None else w, zero if zero is not None else w,
        inv_freq, rope_pos, slot, q, cache.k, cache.v, D, H, cache.k.shape[2], layer.attention_norm.eps,
        HEAD_DIM=hd, PAIRS=pairs, QUANT=scale is not None, BLOCK_K=_block_k(D, c["block_k"]), num_warps=c["warps"],
        **_pdl(h.device))
    return q


def rmsnorm(x: Tensor, norm: RMSNorm, out: Tensor | None = None) -> Tensor:
    """norm(x) for x (M, K), into out if given (contiguous, x's shape and dtype)."""
    M, K = x.shape
    out = torch.empty_like(x) if out is None else out
    _rmsnorm_kernel[(M,)](x, norm.weight, out, K, norm.eps, BLOCK_K=_block_k(K, 1024), **_pdl(x.device))
    return out


def decode_forward(gpt: GPT, x: Tensor, input_pos: Tensor, rope_pos: Tensor, counts: Tensor | None = None,
                   out: Tensor | None = None) -> Tensor:
    """GPT.forward for one new position per row through these kernels: x (B, 1, D), input_pos (1,) cache slot,
    rope_pos (B, 1) -> final-norm hidden (B, 1, D), written into out (B, D) if given; writes the cache slot like the
    PyTorch path. counts: B * heads int32 zeros for attention (made here if None)."""
    h = x[:, 0].contiguous()
    if counts is None:
        counts = torch.zeros(h.shape[0] * gpt.cfg.heads, dtype=torch.int32, device=h.device)
    for layer in gpt.layers:
        att, ffn, cache = layer.attention, layer.feed_forward, layer.attention.kv_cache
        y = attention(qkv_rope(h, layer, gpt.inv_freq, rope_pos, input_pos), cache.k, cache.v, gpt.key_valid,
                      input_pos, counts)
        h = linear(y, att.wo.weight, residual=h)
        h = linear(linear(h, ffn.w13.weight, norm=layer.ffn_norm, gate=True), ffn.w2.weight, residual=h)
    return rmsnorm(h, gpt.norm, out)[:, None]


def fused_sampling(gpt: GPT, p: SamplingParams) -> bool:
    """Whether _sample_feed_kernel covers these settings: a top-k below the vocabulary (ChatTTS samples the best
    20 of 626) and plain code embeddings."""
    V = gpt.cfg.num_audio_tokens
    return min(max(p.top_k, p.min_keep), V) < V and type(gpt.emb_code.weight) in (torch.Tensor, torch.nn.Parameter)


def decode_step(gpt: GPT, s: DecodeState, p: SamplingParams, chunk: int, sample=sample_codes) -> None:
    """engine.decode_step through these kernels: the code heads, one launch that samples and does the step's
    bookkeeping, the layers, the final norm into s.h. Settings fused_sampling() does not cover sample with
    `sample` (PyTorch) instead."""
    if not fused_sampling(gpt, p):
        return pytorch_decode_step(gpt, s, p, chunk, sample=sample, forward=decode_forward)
    cfg = gpt.cfg
    (B, D), Q, V, H, W = s.h.shape, cfg.num_vq, cfg.num_audio_tokens, cfg.heads, s.history.shape[1]
    z = dict(device=s.h.device)
    x = torch.empty(B, D, dtype=s.h.dtype, **z)
    slot, rope = torch.empty(1, dtype=torch.long, **z), torch.empty(B, 1, dtype=torch.long, **z)
    counts = torch.empty(B * H, dtype=torch.int32, **z)
    logits = gpt.head_code(s.h)  # (B, Q * V) in the model's dtype, read as float32 like GPT.code_logits
    penalty = p.repetition_penalty
    _sample_feed_kernel[(B,)](
        logits, s.history, s.temperature, s.noise, s.step, s.min_new, gpt.emb_code.weight, s.h, s.hidden, s.codes,
        s.finished, s.lengths, x, s.prompt_len, s.rope_base, slot, rope, counts, V, W, D, H, chunk, cfg.eos_code,
        min(max(p.top_k, p.min_keep), V), p.top_p, p.min_keep, math.log2(penalty), Q=Q, PENALTY=penalty != 1.0,
        TOP_P=p.top_p < 1.0, BLOCK_V=triton.next_power_of_2(V), BLOCK_W=triton.next_power_of_2(W),
        BLOCK_D=triton.next_power_of_2(D), BLOCK_H=triton.next_power_of_2(H), num_warps=4)
    decode_forward(gpt, x[:, None], slot, rope, counts=counts, out=s.h)
    s.step += 1

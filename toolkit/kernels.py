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

import torch
import triton
import triton.language as tl
from torch import Tensor

from .models.gpt import GPT, Block, RMSNorm


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
def _rows_dot(x_row, g_ptr, w_ptr, s_ptr, z_ptr, rows, K, rstd, NORM: tl.constexpr, QUANT: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """W[rows] . xn -> (BLOCK_N,) fp32, xn = x rounded like RMSNorm's output (weight * (x * rstd)) when NORM.
    QUANT: W is int8, (W - zero point) * scale per row."""
    dt: tl.constexpr = x_row.dtype.element_ty
    acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = ks < K
        x = tl.load(x_row + ks, mask=kmask, other=0.0).to(tl.float32)
        if NORM:
            x = _round(_round(x * rstd, dt) * tl.load(g_ptr + ks, mask=kmask, other=0.0).to(tl.float32), dt)
        w = tl.load(w_ptr + rows[:, None] * K + ks[None, :], mask=kmask[None, :], other=0).to(tl.float32)
        if QUANT:
            w = w - tl.load(z_ptr + rows).to(tl.float32)[:, None]
        acc += w * x[None, :]
    if QUANT:
        return tl.sum(acc, 1) * tl.load(s_ptr + rows).to(tl.float32)
    return tl.sum(acc, 1)


@triton.jit
def _linear_kernel(x_ptr, g_ptr, w_ptr, s_ptr, z_ptr, res_ptr, out_ptr, N, K, eps,
                   NORM: tl.constexpr, GATE: tl.constexpr, RES: tl.constexpr, QUANT: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[m, n] = W[n] . xn[m] (+ res[m, n]); with GATE, silu(W[n] . xn[m]) * (W[N + n] . xn[m])."""
    pid = tl.program_id(0)
    m = tl.program_id(1)
    x_row = x_ptr + m * K
    rstd = 1.0
    if NORM:
        rstd = _rstd(x_row, K, eps, BLOCK_K)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    keep = rows < N
    rows = tl.where(keep, rows, 0)
    dt: tl.constexpr = out_ptr.dtype.element_ty
    y = _round(_rows_dot(x_row, g_ptr, w_ptr, s_ptr, z_ptr, rows, K, rstd, NORM, QUANT, BLOCK_N, BLOCK_K), dt)
    if GATE:
        up = _round(_rows_dot(x_row, g_ptr, w_ptr, s_ptr, z_ptr, rows + N, K, rstd, NORM, QUANT, BLOCK_N, BLOCK_K), dt)
        y = _round(y / (1.0 + tl.exp(-y)), dt) * up
    if RES:
        y = y + tl.load(res_ptr + m * N + rows, mask=keep, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * N + rows, y.to(dt), mask=keep)


@triton.jit
def _qkv_rope_kernel(x_ptr, g_ptr, w_ptr, s_ptr, z_ptr, inv_freq_ptr, rope_ptr, slot_ptr, q_ptr, k_ptr, v_ptr,
                     K, H, S, eps, HEAD_DIM: tl.constexpr, PAIRS: tl.constexpr, QUANT: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    """PAIRS rotary pairs (rows i and i + HEAD_DIM/2 of a head) of q, k or v for batch row m: normed x times W_qkv,
    RoPE on q and k; q goes to q_ptr (M, H, HEAD_DIM), k and v into the cache (B, H, S, HEAD_DIM) at the slot.
    Programs walk the q heads, then the k heads, then the v heads."""
    HALF: tl.constexpr = HEAD_DIM // 2
    per_head: tl.constexpr = HALF // PAIRS
    j = tl.program_id(0) // per_head
    d = (tl.program_id(0) % per_head) * PAIRS + tl.arange(0, PAIRS)
    m = tl.program_id(1)
    x_row = x_ptr + m * K
    rstd = _rstd(x_row, K, eps, BLOCK_K)
    dt: tl.constexpr = q_ptr.dtype.element_ty
    lo = _round(_rows_dot(x_row, g_ptr, w_ptr, s_ptr, z_ptr, j * HEAD_DIM + d, K, rstd, True, QUANT, PAIRS,
                          BLOCK_K), dt)
    hi = _round(_rows_dot(x_row, g_ptr, w_ptr, s_ptr, z_ptr, j * HEAD_DIM + HALF + d, K, rstd, True, QUANT, PAIRS,
                          BLOCK_K), dt)
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
def _attention_split_kernel(q_ptr, k_ptr, v_ptr, valid_ptr, slot_ptr, part_ptr, stat_ptr, H, S, valid_stride, scale,
                            HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr):
    """Flash-decoding, first half: one query (head h, batch row m) against cache slots [c * BLOCK_S, +BLOCK_S) that
    are at most the query's slot. Keys are masked by key_valid (left padding) except the query's own slot, as in
    GPT._run's mask. Writes the block's unnormalised output (fp32) and its max score and softmax sum."""
    h = tl.program_id(0)
    c = tl.program_id(1)
    m = tl.program_id(2)
    slot = tl.load(slot_ptr)
    d = tl.arange(0, HEAD_DIM)
    s = c * BLOCK_S + tl.arange(0, BLOCK_S)
    seen = s <= slot  # blocks past the slot load nothing
    q = tl.load(q_ptr + (m * H + h) * HEAD_DIM + d).to(tl.float32) * scale
    base = (m * H + h) * S * HEAD_DIM
    valid = tl.load(valid_ptr + m * valid_stride + s, mask=seen, other=0) != 0
    k = tl.load(k_ptr + base + s[:, None] * HEAD_DIM + d[None, :], mask=seen[:, None], other=0.0)
    scores = tl.where((seen & valid) | (s == slot), tl.sum(k.to(tl.float32) * q[None, :], 1), float("-inf"))
    best = tl.max(scores, 0)
    p = tl.exp(scores - tl.where(best == float("-inf"), 0.0, best))  # a block with no valid key adds nothing
    v = tl.load(v_ptr + base + s[:, None] * HEAD_DIM + d[None, :], mask=seen[:, None], other=0.0)
    part = (m * H + h) * tl.num_programs(1) + c
    tl.store(part_ptr + part * HEAD_DIM + d, tl.sum(p[:, None] * v.to(tl.float32), 0))
    tl.store(stat_ptr + part * 2, best)
    tl.store(stat_ptr + part * 2 + 1, tl.sum(p, 0))


@triton.jit
def _attention_combine_kernel(part_ptr, stat_ptr, out_ptr, SPLITS, HEAD_DIM: tl.constexpr, BLOCK_C: tl.constexpr):
    """Flash-decoding, second half: the blocks of one (batch row, head), rescaled to a common max, summed and
    normalised -> out (M, H * HEAD_DIM)."""
    row = tl.program_id(0)  # m * H + h
    c = tl.arange(0, BLOCK_C)
    d = tl.arange(0, HEAD_DIM)
    used = c < SPLITS
    best = tl.load(stat_ptr + (row * SPLITS + c) * 2, mask=used, other=float("-inf"))
    total = tl.load(stat_ptr + (row * SPLITS + c) * 2 + 1, mask=used, other=0.0)
    w = tl.exp(best - tl.max(best, 0))  # the own slot is always valid, so the max is finite
    acc = tl.load(part_ptr + (row * SPLITS + c)[:, None] * HEAD_DIM + d[None, :], mask=used[:, None], other=0.0)
    out = tl.sum(w[:, None] * acc, 0) / tl.sum(w * total, 0)
    tl.store(out_ptr + row * HEAD_DIM + d, out.to(out_ptr.dtype.element_ty))


def _block_k(K: int, block_k: int) -> int:
    return min(triton.next_power_of_2(K), block_k)


# launch settings per kernel, chosen on the H200 (benchmarks/kernel_configs.py, results/kernel_configs_h200.json):
# many small programs beat few big ones, since at batch 1 each is bound by its memory latency
CONFIGS = {
    "linear": dict(block_n=1, block_k=512, warps=8),  # o-proj, down-proj
    "gate": dict(block_n=4, block_k=512, warps=4),  # gate/up with SiLU
    "qkv": dict(pairs=1, block_k=512, warps=2),
    "attention": dict(block_s=32, warps=1),
}


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
        BLOCK_N=c["block_n"], BLOCK_K=_block_k(K, c["block_k"]), num_warps=c["warps"])
    return out


def attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, key_valid: Tensor, slot: Tensor) -> Tensor:
    """q (M, H, hd) for cache slot `slot` (1,), caches (B >= M, H, S, hd), key_valid (B, S) -> (M, H * hd)."""
    M, H, hd = q.shape
    S = k_cache.shape[2]
    c = CONFIGS["attention"]
    splits = triton.cdiv(S, c["block_s"])
    part = torch.empty(M, H, splits, hd, dtype=torch.float32, device=q.device)
    stat = torch.empty(M, H, splits, 2, dtype=torch.float32, device=q.device)
    _attention_split_kernel[(H, splits, M)](q, k_cache, v_cache, key_valid, slot, part, stat, H, S,
                                            key_valid.stride(0), hd ** -0.5, HEAD_DIM=hd, BLOCK_S=c["block_s"],
                                            num_warps=c["warps"])
    out = torch.empty(M, H * hd, dtype=q.dtype, device=q.device)
    _attention_combine_kernel[(M * H,)](part, stat, out, splits, HEAD_DIM=hd, BLOCK_C=triton.next_power_of_2(splits))
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
        HEAD_DIM=hd, PAIRS=pairs, QUANT=scale is not None, BLOCK_K=_block_k(D, c["block_k"]), num_warps=c["warps"])
    return q


def decode_forward(gpt: GPT, x: Tensor, input_pos: Tensor, rope_pos: Tensor) -> Tensor:
    """GPT.forward for one new position per row through these kernels: x (B, 1, D), input_pos (1,) cache slot,
    rope_pos (B, 1) -> final-norm hidden (B, 1, D); writes the cache slot like the PyTorch path."""
    h = x[:, 0].contiguous()
    for layer in gpt.layers:
        att, ffn, cache = layer.attention, layer.feed_forward, layer.attention.kv_cache
        y = attention(qkv_rope(h, layer, gpt.inv_freq, rope_pos, input_pos), cache.k, cache.v, gpt.key_valid,
                      input_pos)
        h = linear(y, att.wo.weight, residual=h)
        h = linear(linear(h, ffn.w13.weight, norm=layer.ffn_norm, gate=True), ffn.w2.weight, residual=h)
    return gpt.norm(h)[:, None]

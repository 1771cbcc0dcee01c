"""Triton kernels for the small-batch GPT decode step: about 103 launches per step instead of about 227.

At batch 1 a step is bound by the latency of its many small kernels, not by bytes (benchmarks/README.md). Here
each matmul takes in the work around it, five launches per layer:

    RMSNorm + QKV + RoPE + KV-cache write | attention over the cache (flash-decoding: a fixed number of runs of
    slots per head) | the runs combined + o-proj + residual | RMSNorm + gate/up + SiLU gate | down-proj + residual

and one launch (a program per codebook) does everything between the code heads and the first layer (sampling, the
step's bookkeeping, the next input's embedding). On Hopper and later each kernel is a programmatic dependent
launch: it starts while the one before finishes, loads its weights (and whatever else that kernel does not write),
and waits (gdc_wait) only before it reads that kernel's output.

Every program reads whole weight rows for one batch row, so the weights are read once per row (L2 serves the
rows after the first): this path is for small batches (`Engine(kernels=...)` picks it). Weights are floats, or
torchao's int8 (per row) or int4 (per group) weight-only ones. Accumulation is fp32 and each matmul's output is
rounded to the model's dtype, as in the PyTorch path. With TRITON_INTERPRET=1 set before
this module is imported, the same kernels run on the CPU (tests/test_kernels.py).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.nn import functional as F

try:  # programmatic dependent launch: Triton 3.3 on
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:
    gdc_launch_dependents = gdc_wait = None

from .decode import DecodeState
from .decode import decode_step as pytorch_decode_step
from .models.config import GPTConfig
from .models.gpt import GPT, Block, RMSNorm
from .sampling import SamplingParams, sample_codes
from .weights import is_int4_weight_only, is_int8_weight_only


class Weight(NamedTuple):
    """A linear weight (N, K) as _gemv reads it: data, scale, zero (QUANT 0: the float weight, no scale; 8: int8
    (N, K), one scale and zero point per row; 4: int4 bytes (N, K / 2), a scale and zero point per GROUP columns)."""

    data: Tensor
    scale: Tensor | None
    zero: Tensor | None
    quant: int
    group: int


def _int4_plain(w: Tensor) -> Weight:
    """torchao's int4 weight-only tensor (the tinygemm layouts: Int4TilePackedTo4dTensor on CUDA, Int4OpaqueTensor
    on CPU) as _gemv reads int4: column 2j in a byte's low nibble, 2j + 1 in its high one. The values are read back
    through the tensor's own matmul with an identity, so no packed layout of torchao's is decoded here; the levels
    q follow from tinygemm's (q - 8) * scale + zero."""
    N, K = w.shape
    group = w.block_size[-1]
    pairs = w.scale_and_zero[: K // group, :N].float()  # (groups, N, 2), padded past the weight's shape
    scale, zero = pairs[..., 0].T.contiguous(), pairs[..., 1].T.contiguous()  # (N, groups)
    dense = F.linear(torch.eye(K, dtype=w.scale_and_zero.dtype, device=w.device), w).T.float()  # (N, K)
    q = torch.round((dense - zero.repeat_interleave(group, 1)) / scale.repeat_interleave(group, 1)) + 8
    if K % 2 or not bool(((q >= 0) & (q <= 15)).all()):
        raise ValueError(f"the Triton decode step cannot read this {type(w).__name__} as int4 levels 0..15")
    q = q.to(torch.uint8)
    return Weight((q[:, 0::2] | (q[:, 1::2] << 4)).contiguous(), scale, zero, 4, group)


def _weight(w: Tensor) -> Weight:
    """A linear weight as _gemv reads it: plain floats; torchao's int8 weight-only Int8Tensor with one scale per
    output row; or its int4 weight-only tensors (converted once, kept with the weight: a quarter of its bf16
    bytes more on the device); anything else -> a ValueError naming it."""
    if type(w) in (torch.Tensor, torch.nn.Parameter) and w.dtype in (torch.float32, torch.float16, torch.bfloat16):
        return Weight(w, None, None, 0, 1)
    block = getattr(w, "block_size", None)
    if is_int8_weight_only(w) and block is not None and list(block) == [1, w.shape[1]]:
        return Weight(w.qdata, w.scale.reshape(-1), w.zero_point.reshape(-1), 8, 1)
    if is_int4_weight_only(w):
        if getattr(w, "_plain_int4", None) is None:
            w._plain_int4 = _int4_plain(w)
        return w._plain_int4
    raise ValueError(
        f"the Triton decode step reads float weights, int8 weight-only ones (per row) or int4 "
        f"weight-only ones, not {type(w).__name__} {w.dtype}"
    )


def supports(gpt: GPT) -> bool:
    """Weights these kernels read (floats, int8 weight-only per row, int4 weight-only) and power-of-two heads of
    at least 16."""
    d = gpt.cfg.head_dim
    try:
        for layer in gpt.layers:
            for w in (
                layer.attention.wqkv.weight,
                layer.attention.wo.weight,
                layer.feed_forward.w13.weight,
                layer.feed_forward.w2.weight,
            ):
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
def _w_tile(w_ptr, s_ptr, z_ptr, rows, k0, K, QUANT: tl.constexpr, GROUP: tl.constexpr, BLOCK_K: tl.constexpr):
    """Weight columns [k0, k0 + BLOCK_K) of `rows`, as stored; for int4 (QUANT == 4) the (BLOCK_N, BLOCK_K // 2)
    bytes that hold them and their groups' scales and zero points, (BLOCK_N, BLOCK_K // GROUP) each."""
    if QUANT == 4:
        js = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        w = tl.load(w_ptr + rows[:, None] * (K // 2) + js[None, :], mask=(js < K // 2)[None, :], other=0)
        gs = k0 // GROUP + tl.arange(0, BLOCK_K // GROUP)
        at = rows[:, None] * (K // GROUP) + gs[None, :]
        s = tl.load(s_ptr + at, mask=(gs < K // GROUP)[None, :], other=0.0)
        z = tl.load(z_ptr + at, mask=(gs < K // GROUP)[None, :], other=0.0)
        return w, s, z
    else:
        ks = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + rows[:, None] * K + ks[None, :], mask=(ks < K)[None, :], other=0)
        if QUANT == 8:  # one scale and zero point per row
            return w, tl.load(s_ptr + rows), tl.load(z_ptr + rows)
        else:
            return w, 0.0, 0.0


@triton.jit
def _dequantize(w, s, z, QUANT: tl.constexpr, GROUP: tl.constexpr, BLOCK_K: tl.constexpr):
    """A _w_tile as fp32 weights (BLOCK_N, BLOCK_K): int8 (w - zero) * scale per row; int4 as torchao's tinygemm
    layout means it, (q - 8) * scale + zero, one scale and zero per group of GROUP columns."""
    if QUANT == 4:
        BLOCK_N: tl.constexpr = w.shape[0]
        q = tl.reshape(tl.join(w & 15, w >> 4), (BLOCK_N, BLOCK_K // GROUP, GROUP)).to(tl.float32) - 8.0
        q = q * s.to(tl.float32)[:, :, None] + z.to(tl.float32)[:, :, None]
        return tl.reshape(q, (BLOCK_N, BLOCK_K))
    elif QUANT == 8:
        return (w.to(tl.float32) - z.to(tl.float32)[:, None]) * s.to(tl.float32)[:, None]
    else:
        return w.to(tl.float32)


@triton.jit
def _g_tile(g_ptr, k0, K, NORM: tl.constexpr, BLOCK_K: tl.constexpr):
    """RMSNorm's weight [k0, k0 + BLOCK_K) as fp32 (NORM), else 1."""
    if NORM:
        ks = k0 + tl.arange(0, BLOCK_K)
        return tl.load(g_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
    else:
        return 1.0


@triton.jit
def _x_tile(
    x_row,
    g,
    stat_row,
    k0,
    K,
    rstd,
    NORM: tl.constexpr,
    COMBINE: tl.constexpr,
    SPLITS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    dt: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """x[k0 : k0 + BLOCK_K] as fp32, 0 past K. NORM: rounded as RMSNorm's output, g * (x * rstd), g the weight's
    tile (_g_tile). COMBINE:
    x_row is attention's per-split outputs (heads, SPLITS, HEAD_DIM) and stat_row their (max score, softmax sum)
    pairs: x is the heads' attention output, the splits combined, rounded to dt."""
    if COMBINE:  # tiles hold whole heads (BLOCK_K is a multiple of HEAD_DIM)
        HB: tl.constexpr = BLOCK_K // HEAD_DIM
        heads = k0 // HEAD_DIM + tl.arange(0, HB)
        c = tl.arange(0, SPLITS)
        at = heads[:, None] * SPLITS + c[None, :]  # (HB, SPLITS)
        live = (heads < K // HEAD_DIM)[:, None]
        maxes = tl.load(stat_row + at * 2, mask=live, other=0.0)
        sums = tl.load(stat_row + at * 2 + 1, mask=live, other=1.0)
        weight = tl.exp(maxes - tl.max(maxes, 1)[:, None])  # each head's own slot is valid: its max is finite
        d = tl.arange(0, HEAD_DIM)
        parts = tl.load(x_row + at[:, :, None] * HEAD_DIM + d[None, None, :], mask=live[:, :, None], other=0.0)
        out = tl.sum(weight[:, :, None] * parts, 1) / tl.sum(weight * sums, 1)[:, None]  # (HB, HEAD_DIM)
        return _round(tl.reshape(out, (BLOCK_K,)), dt)
    else:
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = ks < K
        x = tl.load(x_row + ks, mask=kmask, other=0.0).to(tl.float32)
        if NORM:
            x = _round(_round(x * rstd, dt) * g, dt)
        return x


@triton.jit
def _gemv(
    x_row,
    g_ptr,
    stat_row,
    w_ptr,
    s_ptr,
    z_ptr,
    rows,
    rows2,
    K,
    eps,
    NORM: tl.constexpr,
    COMBINE: tl.constexpr,
    SPLITS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    QUANT: tl.constexpr,
    GROUP: tl.constexpr,
    TWO: tl.constexpr,
    PDL: tl.constexpr,
    dt: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """(W[rows] . x, W[rows2] . x) as fp32 (BLOCK_N,) each, the second only when TWO (gate and up, or a rotary
    pair's halves: x is loaded and normalised once for both); x as _x_tile gives it (NORM, COMBINE), rounded to dt.
    QUANT: 0 float weights; 8 int8, (W - zero point) * scale per row; 4 int4 in groups of GROUP (_dequantize).
    With PDL the first weight tiles (and the norm's) are loaded and dequantized before waiting for the previous
    kernel, which never writes weights: both overlap that kernel's tail, and after the wait only the products with x
    are left."""
    w, s, z = _w_tile(w_ptr, s_ptr, z_ptr, rows, 0, K, QUANT, GROUP, BLOCK_K)
    w = _dequantize(w, s, z, QUANT, GROUP, BLOCK_K)
    w2 = w
    if TWO:
        w2, s2, z2 = _w_tile(w_ptr, s_ptr, z_ptr, rows2, 0, K, QUANT, GROUP, BLOCK_K)
        w2 = _dequantize(w2, s2, z2, QUANT, GROUP, BLOCK_K)
    g = _g_tile(g_ptr, 0, K, NORM, BLOCK_K)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    rstd = 1.0
    if NORM:
        rstd = _rstd(x_row, K, eps, BLOCK_K)
    x = _x_tile(x_row, g, stat_row, 0, K, rstd, NORM, COMBINE, SPLITS, HEAD_DIM, dt, BLOCK_K)
    acc = w * x[None, :]
    acc2 = w2 * x[None, :]
    w, s, z = _w_tile(w_ptr, s_ptr, z_ptr, rows, BLOCK_K, K, QUANT, GROUP, BLOCK_K)
    w2, s2, z2 = w, s, z
    if TWO:
        w2, s2, z2 = _w_tile(w_ptr, s_ptr, z_ptr, rows2, BLOCK_K, K, QUANT, GROUP, BLOCK_K)
    for k0 in range(BLOCK_K, K, BLOCK_K):  # tiles after the first: each loaded one step ahead of its use
        x = _x_tile(
            x_row,
            _g_tile(g_ptr, k0, K, NORM, BLOCK_K),
            stat_row,
            k0,
            K,
            rstd,
            NORM,
            COMBINE,
            SPLITS,
            HEAD_DIM,
            dt,
            BLOCK_K,
        )
        acc += _dequantize(w, s, z, QUANT, GROUP, BLOCK_K) * x[None, :]
        if TWO:
            acc2 += _dequantize(w2, s2, z2, QUANT, GROUP, BLOCK_K) * x[None, :]
        w, s, z = _w_tile(w_ptr, s_ptr, z_ptr, rows, k0 + BLOCK_K, K, QUANT, GROUP, BLOCK_K)
        if TWO:
            w2, s2, z2 = _w_tile(w_ptr, s_ptr, z_ptr, rows2, k0 + BLOCK_K, K, QUANT, GROUP, BLOCK_K)
    y = tl.sum(acc, 1)
    y2 = tl.sum(acc2, 1)
    return y, y2


@triton.jit
def _linear_kernel(
    x_ptr,
    g_ptr,
    stat_ptr,
    w_ptr,
    s_ptr,
    z_ptr,
    res_ptr,
    out_ptr,
    N,
    K,
    eps,
    NORM: tl.constexpr,
    COMBINE: tl.constexpr,
    SPLITS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    GATE: tl.constexpr,
    RES: tl.constexpr,
    QUANT: tl.constexpr,
    GROUP: tl.constexpr,
    PDL: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out[m, n] = W[n] . x[m] (+ res[m, n]); with GATE, silu(W[n] . x[m]) * (W[N + n] . x[m]). x[m] as _gemv
    reads it: normed (NORM), or attention's splits combined (COMBINE, the o-proj)."""
    pid = tl.program_id(0)
    m = tl.program_id(1)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    keep = rows < N
    rows = tl.where(keep, rows, 0)
    dt: tl.constexpr = out_ptr.dtype.element_ty
    if RES:  # before _gemv's wait: the residual comes from an earlier launch than the one waited for (see linear)
        res = tl.load(res_ptr + m * N + rows, mask=keep, other=0.0).to(tl.float32)
    y, up = _gemv(
        x_ptr + m * K * SPLITS,
        g_ptr,
        stat_ptr + m * (K // HEAD_DIM) * SPLITS * 2,
        w_ptr,
        s_ptr,
        z_ptr,
        rows,
        rows + N,
        K,
        eps,
        NORM,
        COMBINE,
        SPLITS,
        HEAD_DIM,
        QUANT,
        GROUP,
        GATE,
        PDL,
        dt,
        BLOCK_N,
        BLOCK_K,
    )
    y = _round(y, dt)
    if GATE:
        y = _round(y / (1.0 + tl.exp(-y)), dt) * _round(up, dt)
    if RES:
        y = y + res
    tl.store(out_ptr + m * N + rows, y.to(dt), mask=keep)


@triton.jit
def _qkv_rope_kernel(
    x_ptr,
    g_ptr,
    w_ptr,
    s_ptr,
    z_ptr,
    inv_freq_ptr,
    rope_ptr,
    slot_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    K,
    H,
    S,
    eps,
    HEAD_DIM: tl.constexpr,
    PAIRS: tl.constexpr,
    QUANT: tl.constexpr,
    GROUP: tl.constexpr,
    PDL: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """PAIRS rotary pairs (rows i and i + HEAD_DIM/2 of a head) of q, k or v for batch row m: normed x times W_qkv,
    RoPE on q and k; q goes to q_ptr (M, H, HEAD_DIM), k and v into the cache (B, H, S, HEAD_DIM) at the slot.
    Programs walk the q heads, then the k heads, then the v heads."""
    HALF: tl.constexpr = HEAD_DIM // 2
    per_head: tl.constexpr = HALF // PAIRS
    j = tl.program_id(0) // per_head
    d = (tl.program_id(0) % per_head) * PAIRS + tl.arange(0, PAIRS)
    m = tl.program_id(1)
    dt: tl.constexpr = q_ptr.dtype.element_ty
    inv_freq = tl.load(inv_freq_ptr + d)  # a constant: before _gemv's wait
    lo, hi = _gemv(
        x_ptr + m * K,
        g_ptr,
        x_ptr,
        w_ptr,
        s_ptr,
        z_ptr,
        j * HEAD_DIM + d,
        j * HEAD_DIM + HALF + d,
        K,
        eps,
        True,
        False,
        1,
        HEAD_DIM,
        QUANT,
        GROUP,
        True,
        PDL,
        dt,
        PAIRS,
        BLOCK_K,
    )
    lo = _round(lo, dt)
    hi = _round(hi, dt)
    which = j // H
    head = j % H
    if which < 2:  # rotate_half: (lo, hi) -> (lo cos - hi sin, hi cos + lo sin)
        angle = tl.load(rope_ptr + m).to(tl.float32) * inv_freq
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
def _attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    valid_ptr,
    slot_ptr,
    part_ptr,
    stat_ptr,
    H,
    S,
    valid_stride,
    scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PDL: tl.constexpr,
):
    """Flash-decoding, first half: one query (head h, batch row m) against the c-th of SPLITS equal runs of the
    cache slots up to its own (BLOCK_S at a time, online softmax), written as the run's unnormalised output (fp32),
    max score and softmax sum. The o-proj combines the runs (_x_tile). Keys are masked by key_valid (left
    padding) except the query's own slot, as in GPT._run's mask. With PDL the run's first keys, values and key_valid
    load before the wait; the own slot, just written by the previous kernel, is read after it."""
    h = tl.program_id(0)
    c = tl.program_id(1)
    m = tl.program_id(2)
    splits = tl.num_programs(1)
    row = m * H + h
    slot = tl.load(slot_ptr)  # written before the step's first layer: safe before the wait
    run = tl.cdiv(slot + 1, splits)
    lo = c * run
    hi = tl.minimum(lo + run, slot + 1)
    d = tl.arange(0, HEAD_DIM)
    base = row * S * HEAD_DIM
    s = lo + tl.arange(0, BLOCK_S)
    k = tl.load(k_ptr + base + s[:, None] * HEAD_DIM + d[None, :], mask=(s < hi)[:, None], other=0.0)
    v = tl.load(v_ptr + base + s[:, None] * HEAD_DIM + d[None, :], mask=(s < hi)[:, None], other=0.0)
    valid = tl.load(valid_ptr + m * valid_stride + s, mask=s < hi, other=0) != 0  # set at prefill, not per step
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    own_k = tl.load(k_ptr + base + slot * HEAD_DIM + d)[None, :]
    own_v = tl.load(v_ptr + base + slot * HEAD_DIM + d)[None, :]
    q = tl.load(q_ptr + row * HEAD_DIM + d).to(tl.float32) * scale
    best = tl.full([], float("-inf"), tl.float32)
    total = tl.full([], 0.0, tl.float32)
    acc = tl.zeros((HEAD_DIM,), tl.float32)
    for s0 in range(lo, hi, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        seen = s < hi
        own = (s == slot)[:, None]
        k = tl.where(own, own_k, k)
        v = tl.where(own, own_v, v)
        scores = tl.where(seen & (valid | (s == slot)), tl.sum(k.to(tl.float32) * q[None, :], 1), float("-inf"))
        new_best = tl.maximum(best, tl.max(scores, 0))
        shift = tl.where(new_best == float("-inf"), 0.0, new_best)  # nothing valid yet adds nothing
        p = tl.exp(scores - shift)
        rescale = tl.exp(best - shift)
        total = total * rescale + tl.sum(p, 0)
        acc = acc * rescale + tl.sum(p[:, None] * v.to(tl.float32), 0)
        best = new_best
        s += BLOCK_S
        k = tl.load(k_ptr + base + s[:, None] * HEAD_DIM + d[None, :], mask=(s < hi)[:, None], other=0.0)
        v = tl.load(v_ptr + base + s[:, None] * HEAD_DIM + d[None, :], mask=(s < hi)[:, None], other=0.0)
        valid = tl.load(valid_ptr + m * valid_stride + s, mask=s < hi, other=0) != 0
    part = row * splits + c
    tl.store(part_ptr + part * HEAD_DIM + d, acc)
    tl.store(stat_ptr + part * 2, best)
    tl.store(stat_ptr + part * 2 + 1, total)


@triton.jit
def _rmsnorm_kernel(
    x_ptr, g_ptr, out_ptr, step_ptr, K, eps, STEP: tl.constexpr, PDL: tl.constexpr, BLOCK_K: tl.constexpr
):
    """out[m] = RMSNorm(x[m]), rounded as RMSNorm.forward rounds: the final norm in one launch. STEP: the step
    counter goes up by one too (the step's sampling launch, the only one that reads it, is done by then)."""
    m = tl.program_id(0)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    if STEP:
        if m == 0:
            tl.store(step_ptr, tl.load(step_ptr) + 1)
    rstd = _rstd(x_ptr + m * K, K, eps, BLOCK_K)
    dt: tl.constexpr = out_ptr.dtype.element_ty
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = ks < K
        x = tl.load(x_ptr + m * K + ks, mask=kmask, other=0.0).to(tl.float32)
        y = _round(x * rstd, dt) * tl.load(g_ptr + ks, mask=kmask, other=0.0).to(tl.float32)
        tl.store(out_ptr + m * K + ks, y.to(dt), mask=kmask)


@triton.jit
def _sample_feed_kernel(
    logits_ptr,
    hist_ptr,
    temp_ptr,
    noise_ptr,
    step_ptr,
    min_new_ptr,
    emb_ptr,
    h_ptr,
    hidden_ptr,
    codes_ptr,
    finished_ptr,
    lengths_ptr,
    x_ptr,
    prompt_len_ptr,
    rope_base_ptr,
    slot_ptr,
    rope_ptr,
    arrived_ptr,
    V,
    W,
    D,
    CHUNK,
    EOS,
    top_k,
    top_p,
    min_keep,
    log2_penalty,
    Q: tl.constexpr,
    PENALTY: tl.constexpr,
    TOP_P: tl.constexpr,
    PDL: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    """Everything of a decode step between the code heads and the first layer, as toolkit.decode.decode_step and
    sampling.sample_codes do it, one program per batch row b and codebook q: temperature, repetition penalty over
    the history window, top-p inside top-k, EOS barred before min_new, the draw argmax(p / noise), the history and
    codes. The last of row b's Q programs to finish (an arrival count, which it resets) then does the row's
    finished and lengths bookkeeping and writes the next input, the Q code embeddings summed.
    The k best are taken one per iteration (max with its index), k being small (ChatTTS: 20 of 626): within one
    program's row, so each iteration is one reduction over one row. With PDL everything but the logits (the launch
    before writes only those) is loaded before the wait, the penalty is built then, and what needs no code
    (hidden, cache slot, RoPE positions) is written then too."""
    b = tl.program_id(0)
    q = tl.program_id(1)
    n = b * Q + q  # row of the (B * Q, V) logits
    step = tl.load(step_ptr)
    j = step % CHUNK
    v = tl.arange(0, BLOCK_V)
    d = tl.arange(0, BLOCK_D)
    live = v < V
    temperature = tl.load(temp_ptr + n)
    noise = tl.load(noise_ptr + (j * tl.num_programs(0) * Q + n) * V + v, mask=live, other=1.0)
    if PENALTY:  # V marks an empty slot of the window
        seen = tl.zeros((BLOCK_V,), tl.float32)
        for w in tl.static_range(BLOCK_W):  # BLOCK_W == W, unrolled: the window's loads all go out at once
            seen += (v == tl.load(hist_ptr + n * W + w)).to(tl.float32)
        alpha = tl.exp2(seen * log2_penalty)
    bar_eos = step < tl.load(min_new_ptr)
    if q == 0:  # the bookkeeping that needs no code: h is the final norm's, two launches back
        tl.store(hidden_ptr + (b * CHUNK + j) * D + d, tl.load(h_ptr + b * D + d, mask=d < D), mask=d < D)
        tl.store(rope_ptr + b, tl.load(rope_base_ptr + b) + step)
        if b == 0:
            tl.store(slot_ptr, tl.load(prompt_len_ptr) + step)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    x = tl.load(logits_ptr + n * V + v, mask=live, other=float("-inf")).to(tl.float32)
    x = x / temperature
    if PENALTY:
        x = tl.where(x < 0, x * alpha, x / alpha)
    top = tl.max(x, 0)
    if TOP_P:
        lse = top + tl.log(tl.sum(tl.exp(x - top), 0))
    rest = x
    cut = top
    above = tl.full([], 0.0, tl.float32)  # probability of the better-ranked tokens
    for i in range(0, top_k):  # the i-th best (ties one by one, as topk lists them); cut = the last one kept
        best, where = tl.max(rest, 0, return_indices=True, return_indices_tie_break_left=True)
        rest = tl.where(v == where, float("-inf"), rest)
        if TOP_P:
            cut = tl.where((above < top_p) | (i < min_keep), best, cut)
            above += tl.exp(best - lse)
        else:
            cut = best
    x = tl.where(x < cut, float("-inf"), x)
    x = tl.where((v == EOS) & bar_eos, float("-inf"), x)
    e = tl.exp(x - tl.max(x, 0))
    code = tl.argmax(e / tl.sum(e, 0) / noise, 0)
    tl.store(hist_ptr + n * W + step % W, code.to(hist_ptr.dtype.element_ty))
    tl.store(codes_ptr + (b * CHUNK + j) * Q + q, code.to(codes_ptr.dtype.element_ty))
    if tl.atomic_add(arrived_ptr + b, 1, sem="acq_rel") == Q - 1:  # the row's other codes are stored and visible
        tl.store(arrived_ptr + b, 0)
        qs = tl.arange(0, BLOCK_Q)
        codes = tl.load(codes_ptr + (b * CHUNK + j) * Q + qs, mask=qs < Q, other=0).to(tl.int32)
        hit_eos = tl.max(((codes == EOS) & (qs < Q)).to(tl.int32), 0)
        finished = (tl.load(finished_ptr + b) != 0) | (hit_eos != 0)
        tl.store(finished_ptr + b, finished.to(finished_ptr.dtype.element_ty))
        tl.store(lengths_ptr + b, tl.load(lengths_ptr + b) + (1 - finished.to(tl.int64)))
        rows = tl.load(
            emb_ptr + (qs * V + codes)[:, None] * D + d[None, :], mask=(qs < Q)[:, None] & (d < D)[None, :], other=0.0
        )
        tl.store(x_ptr + b * D + d, tl.sum(rows.to(tl.float32), 0).to(x_ptr.dtype.element_ty), mask=d < D)


def _block_k(K: int, block_k: int) -> int:
    return min(triton.next_power_of_2(K), block_k)


# tile settings per kernel, chosen by benchmarks/kernel_configs.py (benchmarks/README.md): whole rows in one tile
# where it pays, so with PDL a program has loaded all its weights by the time the previous kernel ends
CONFIGS = {
    "linear": dict(block_n=2, block_k=4096, warps=4),  # down-proj (whole 3072-wide rows), code heads
    "oproj": dict(block_n=8, block_k=1024, warps=8),  # o-proj, combining attention's runs
    "gate": dict(block_n=4, block_k=512, warps=2),  # gate/up with SiLU
    "qkv": dict(pairs=2, block_k=1024, warps=2),
    "attention": dict(splits=16, block_s=32, warps=1),
    "sample": dict(warps=4),
}


@functools.lru_cache(maxsize=None)
def _has_pdl(device: torch.device) -> bool:
    return gdc_wait is not None and device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)


def uses_pdl(device: torch.device, pdl: bool = True) -> bool:
    """Whether launches on `device` asked as programmatic dependent ones (pdl) are (the GPU has them)."""
    return pdl and _has_pdl(device)


def _pdl(device: torch.device, pdl: bool) -> dict:
    """Launch options: each kernel launched as a programmatic dependent of the one before (programmatic dependent
    launch, PDL), so it starts (and loads its weights) while that one finishes, and waits for it (gdc_wait) only
    before reading what it wrote."""
    return dict(PDL=True, launch_pdl=True) if uses_pdl(device, pdl) else dict(PDL=False)


class Partials(NamedTuple):
    """Attention's runs of cache slots before they are combined: outputs (M, H, splits, hd) and (max score,
    softmax sum) pairs (M, H, splits, 2), fp32; the query's dtype, which the combined output is rounded to."""

    part: Tensor
    stat: Tensor
    dtype: torch.dtype


def _launch_weight(weight: Tensor) -> tuple[list, dict]:
    """(w, scale, zero pointers, QUANT and GROUP) for a kernel call."""
    w = _weight(weight)
    return (
        [w.data, w.data if w.scale is None else w.scale, w.data if w.zero is None else w.zero],
        dict(QUANT=w.quant, GROUP=w.group),
    )


def linear(
    x: Tensor | Partials,
    weight: Tensor,
    norm: RMSNorm | None = None,
    residual: Tensor | None = None,
    gate: bool = False,
    pdl: bool = True,
) -> Tensor:
    """x (M, K), weight (N, K) or, with gate, (2N, K) -> (M, N): (residual +) norm(x) @ weight.T, or
    silu(norm(x) @ W_gate.T) * (norm(x) @ W_up.T). x may be attention's Partials (the o-proj): combined here.
    With PDL the residual is read before waiting for the launch just before, so that launch must not write it (in
    decode_forward it comes from two or three launches back, which have finished: every program of the launch just
    before passed its own wait before this one could start)."""
    combine = isinstance(x, Partials)
    c = CONFIGS["oproj" if combine else "gate" if gate else "linear"]
    if combine:
        M, H, splits, hd = x.part.shape
        K, dtype, x_data, stat = H * hd, x.dtype, x.part, x.stat
    else:
        (M, K), dtype, x_data, stat, splits, hd = x.shape, x.dtype, x, x, 1, 1
    N = weight.shape[0] // (2 if gate else 1)
    out = torch.empty(M, N, dtype=dtype, device=x_data.device)
    w_args, w_opts = _launch_weight(weight)
    block_k = _block_k(K, max(c["block_k"], hd, w_opts["GROUP"]))
    _linear_kernel[(triton.cdiv(N, c["block_n"]), M)](
        x_data,
        norm.weight if norm is not None else x_data,
        stat,
        *w_args,
        residual if residual is not None else x_data,
        out,
        N,
        K,
        norm.eps if norm is not None else 0.0,
        NORM=norm is not None,
        COMBINE=combine,
        SPLITS=splits,
        HEAD_DIM=hd,
        GATE=gate,
        RES=residual is not None,
        BLOCK_N=c["block_n"],
        BLOCK_K=block_k,
        num_warps=c["warps"],
        **w_opts,
        **_pdl(x_data.device, pdl),
    )
    return out


def attention(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, key_valid: Tensor, slot: Tensor, pdl: bool = True
) -> Partials:
    """q (M, H, hd) for cache slot `slot` (1,), caches (B >= M, H, S, hd), key_valid (B, S) -> the Partials of
    CONFIGS["attention"]["splits"] runs of slots, which linear() combines (the o-proj)."""
    M, H, hd = q.shape
    c = CONFIGS["attention"]
    part = torch.empty(M, H, c["splits"], hd, dtype=torch.float32, device=q.device)
    stat = torch.empty(M, H, c["splits"], 2, dtype=torch.float32, device=q.device)
    _attention_kernel[(H, c["splits"], M)](
        q,
        k_cache,
        v_cache,
        key_valid,
        slot,
        part,
        stat,
        H,
        k_cache.shape[2],
        key_valid.stride(0),
        hd**-0.5,
        HEAD_DIM=hd,
        BLOCK_S=c["block_s"],
        num_warps=c["warps"],
        **_pdl(q.device, pdl),
    )
    return Partials(part, stat, q.dtype)


def qkv_rope(h: Tensor, layer: Block, inv_freq: Tensor, rope_pos: Tensor, slot: Tensor, pdl: bool = True) -> Tensor:
    """h (M, D) -> q (M, H, hd) after RMSNorm, W_qkv and RoPE; k and v go into the layer's cache at `slot` (1,)."""
    M, D = h.shape
    att, cache = layer.attention, layer.attention.kv_cache
    H, hd = att.heads, att.head_dim
    c = CONFIGS["qkv"]
    pairs = min(c["pairs"], hd // 2)
    q = torch.empty(M, H, hd, dtype=cache.k.dtype, device=h.device)
    w_args, w_opts = _launch_weight(att.wqkv.weight)
    _qkv_rope_kernel[(3 * H * hd // 2 // pairs, M)](
        h,
        layer.attention_norm.weight,
        *w_args,
        inv_freq,
        rope_pos,
        slot,
        q,
        cache.k,
        cache.v,
        D,
        H,
        cache.k.shape[2],
        layer.attention_norm.eps,
        HEAD_DIM=hd,
        PAIRS=pairs,
        BLOCK_K=_block_k(D, max(c["block_k"], w_opts["GROUP"])),
        num_warps=c["warps"],
        **w_opts,
        **_pdl(h.device, pdl),
    )
    return q


def rmsnorm(
    x: Tensor, norm: RMSNorm, out: Tensor | None = None, step: Tensor | None = None, pdl: bool = True
) -> Tensor:
    """norm(x) for x (M, K), into out if given (contiguous, x's shape and dtype); step (a 0-d counter), if given,
    goes up by one in the same launch."""
    M, K = x.shape
    out = torch.empty_like(x) if out is None else out
    _rmsnorm_kernel[(M,)](
        x,
        norm.weight,
        out,
        step if step is not None else x,
        K,
        norm.eps,
        STEP=step is not None,
        BLOCK_K=_block_k(K, 1024),
        **_pdl(x.device, pdl),
    )
    return out


def decode_forward(
    gpt: GPT,
    x: Tensor,
    input_pos: Tensor,
    rope_pos: Tensor,
    out: Tensor | None = None,
    step: Tensor | None = None,
    pdl: bool = True,
) -> Tensor:
    """GPT.forward for one new position per row through these kernels: x (B, 1, D), input_pos (1,) cache slot,
    rope_pos (B, 1) -> final-norm hidden (B, 1, D), written into out (B, D) if given; writes the cache slot like the
    PyTorch path. step, if given, goes up by one in the last launch (one launch fewer than a separate add).
    pdl: programmatic dependent launches where the GPU has them."""
    h = x[:, 0].contiguous()
    for layer in gpt.layers:
        att, ffn, cache = layer.attention, layer.feed_forward, layer.attention.kv_cache
        y = attention(
            qkv_rope(h, layer, gpt.inv_freq, rope_pos, input_pos, pdl), cache.k, cache.v, gpt.key_valid, input_pos, pdl
        )
        h = linear(y, att.wo.weight, residual=h, pdl=pdl)
        h = linear(
            linear(h, ffn.w13.weight, norm=layer.ffn_norm, gate=True, pdl=pdl), ffn.w2.weight, residual=h, pdl=pdl
        )
    return rmsnorm(h, gpt.norm, out, step, pdl)[:, None]


def fused_sampling(gpt: GPT, p: SamplingParams) -> bool:
    """Whether _sample_feed_kernel covers these settings: a top-k below the vocabulary (ChatTTS samples the best
    20 of 626) and plain code embeddings."""
    V = gpt.cfg.num_audio_tokens
    return p.top_k_for(V) < V and type(gpt.emb_code.weight) in (torch.Tensor, torch.nn.Parameter)


def decode_step(gpt: GPT, s: DecodeState, p: SamplingParams, chunk: int, sample=sample_codes, pdl: bool = True) -> None:
    """toolkit.decode.decode_step through these kernels: the code heads, one launch that samples and does the step's
    bookkeeping, the layers, the final norm into s.h (which also counts the step). Settings fused_sampling() does
    not cover sample with `sample` (PyTorch) instead."""
    if not fused_sampling(gpt, p):
        return pytorch_decode_step(gpt, s, p, chunk, sample=sample, forward=functools.partial(decode_forward, pdl=pdl))
    cfg = gpt.cfg
    (B, D), Q, V, W = s.h.shape, cfg.num_vq, cfg.num_audio_tokens, s.history.shape[1]
    z = dict(device=s.h.device)
    x = torch.empty(B, D, dtype=s.h.dtype, **z)
    slot, rope = torch.empty(1, dtype=torch.long, **z), torch.empty(B, 1, dtype=torch.long, **z)
    logits = linear(
        s.h, gpt.head_code.weight, pdl=pdl
    )  # (B, Q * V) in the model's dtype, read as float32 like code_logits
    penalty, k = p.repetition_penalty, p.top_k_for(V)
    _sample_feed_kernel[(B, Q)](
        logits,
        s.history,
        s.temperature,
        s.noise,
        s.step,
        s.min_new,
        gpt.emb_code.weight,
        s.h,
        s.hidden,
        s.codes,
        s.finished,
        s.lengths,
        x,
        s.prompt_len,
        s.rope_base,
        slot,
        rope,
        s.arrived,
        V,
        W,
        D,
        chunk,
        cfg.eos_code,
        k,
        p.top_p,
        min(p.min_keep, k),
        math.log2(penalty),
        Q=Q,
        PENALTY=penalty != 1.0,
        TOP_P=p.top_p < 1.0,
        BLOCK_Q=triton.next_power_of_2(Q),
        BLOCK_V=triton.next_power_of_2(V),
        BLOCK_D=triton.next_power_of_2(D),
        BLOCK_W=W,
        num_warps=CONFIGS["sample"]["warps"],
        **_pdl(s.h.device, pdl),
    )
    decode_forward(gpt, x[:, None], slot, rope, out=s.h, step=s.step, pdl=pdl)


def self_check(device: torch.device, pdl: bool = True) -> None:
    """Two decode steps of a tiny random GPT through these kernels (launched with or without PDL) against the
    PyTorch step, on `device`: raises where Triton, the GPU or its driver cannot run them (a launch option, an
    instruction, a compiler it lacks).
    The global random state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        gpt = (
            GPT(
                GPTConfig(
                    hidden=64,
                    layers=1,
                    heads=4,
                    intermediate=128,
                    max_positions=64,
                    num_text_tokens=8,
                    num_audio_tokens=64,
                )
            )
            .to(device)
            .eval()
            .requires_grad_(False)
        )
        h = torch.randn(1, 64)
    gpt.setup_caches(1, 16)
    gpt.key_valid.fill_(True)
    p, (Q, V) = SamplingParams(), (gpt.cfg.num_vq, gpt.cfg.num_audio_tokens)
    want, got = (DecodeState(1, 64, Q, V, p.penalty_window, 4, torch.float32, device) for _ in range(2))
    kernel_step = functools.partial(decode_step, pdl=pdl)
    for step in (pytorch_decode_step, kernel_step, pytorch_decode_step, kernel_step):
        state = want if step is pytorch_decode_step else got
        state.h.copy_(h)  # both start from the same state; they share the cache, writing near-equal values
        step(gpt, state, p, 4)
    torch.testing.assert_close(got.h, want.h, atol=1e-2, rtol=1e-2)  # sane, TF32 or not
    torch.testing.assert_close(got.codes, want.codes, atol=0, rtol=0)

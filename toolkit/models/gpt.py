"""LLaMA-style GPT with ChatTTS's text/code embeddings and heads, and a preallocated static KV cache.

Shapes: B batch, T new positions, S cache length, D hidden, H heads, K head dim, Q codebooks, V codes per book.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from .config import GPTConfig

KEY_BLOCK = 128  # cache positions per block of a decode step's block-sparse attention (GPT.forward key_first)


class KVCache(nn.Module):
    def __init__(self, batch: int, length: int, heads: int, head_dim: int, dtype, device):
        super().__init__()
        shape = (batch, heads, length, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        # in-place writes keep buffer addresses fixed, which CUDA graphs need
        B = k.shape[0]
        self.k[:B].index_copy_(2, pos, k.to(self.k.dtype))
        self.v[:B].index_copy_(2, pos, v.to(self.v.dtype))
        return self.k, self.v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """q (B, H, T, K) over the rows [0, B) of what update() returned, mask (B, 1, T, S) -> (B, H, T, K)."""
        B = q.shape[0]
        return F.scaled_dot_product_attention(q, k[:B].to(q.dtype), v[:B].to(q.dtype), attn_mask=mask)


class _Bound(threading.local):
    length: int | None = None


_BOUND = _Bound()


@contextlib.contextmanager
def attention_bound(length: int):
    """Within it, bounded_attention reads only the first `length` cache positions (this thread's calls)."""
    saved, _BOUND.length = _BOUND.length, length
    try:
        yield
    finally:
        _BOUND.length = saved


@torch.library.custom_op("ttsq::bounded_attention", mutates_args=())
def bounded_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """Masked attention of q (B, H, T, K) over the rows [0, B) of a whole cache k, v (N, H, L, K), mask (B, 1, T, L),
    reading only the positions below attention_bound's length (all where none is set). The caller vouches that the
    mask hides every key at or past that bound, so the result is the whole cache's. An op that torch.compile does not
    trace: a compiled step serves every bound, and the bound is chosen per CUDA graph captured around it."""
    B, S = q.shape[0], _BOUND.length or k.shape[2]
    k, v = k[:B, :, :S].to(q.dtype), v[:B, :, :S].to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[..., :S])


@bounded_attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    return torch.empty_like(q)


def rotate_half(x: Tensor) -> Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads, self.head_dim = cfg.heads, cfg.head_dim
        self.wqkv = nn.Linear(cfg.hidden, 3 * cfg.hidden, bias=False)  # q, k, v fused
        self.wo = nn.Linear(cfg.hidden, cfg.hidden, bias=False)
        self.kv_cache: KVCache | None = None

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | BlockMask, input_pos: Tensor, use_cache: bool
    ) -> Tensor:
        B, T, D = x.shape
        q, k, v = self.wqkv(x).view(B, T, 3, self.heads, self.head_dim).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, K)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if use_cache:
            k, v = self.kv_cache.update(input_pos, k, v)
        if isinstance(mask, BlockMask):
            y = flex_attention(q, k[:B].to(q.dtype), v[:B].to(q.dtype), block_mask=mask)
        elif use_cache:
            y = self.kv_cache.attend(q, k, v, mask)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(y.transpose(1, 2).reshape(B, T, D))


class FeedForward(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.w13 = nn.Linear(cfg.hidden, 2 * cfg.intermediate, bias=False)  # gate, up fused
        self.w2 = nn.Linear(cfg.intermediate, cfg.hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # computed in fp32 like HF Llama, so half precision keeps its range
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | BlockMask, input_pos: Tensor, use_cache: bool
    ) -> Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin, mask, input_pos, use_cache)
        return x + self.feed_forward(self.ffn_norm(x))


def call_block(
    block: Block, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | BlockMask, input_pos: Tensor, use_cache: bool
) -> Tensor:
    """A block call as a plain function: compiled once, it serves every layer (same code, same shapes)."""
    return block(x, cos, sin, mask, input_pos, use_cache)


BlockRunner = Callable[[Block, Tensor, Tensor, Tensor, Tensor, Tensor, bool], Tensor]


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        Q, V, D = cfg.num_vq, cfg.num_audio_tokens, cfg.hidden
        self.emb_text = nn.Embedding(cfg.num_text_tokens, D)
        self.emb_code = nn.Embedding(Q * V, D)  # Q tables stacked; ids are offset by q * V
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(D, cfg.rms_eps)
        self.head_text = nn.Linear(D, cfg.num_text_tokens, bias=False)
        self.head_code = nn.Linear(D, Q * V, bias=False)  # Q heads stacked
        inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("code_offsets", torch.arange(Q) * V, persistent=False)
        self.key_valid: Tensor | None = None  # (B, S) which cache slots hold real tokens

    # --- caches -------------------------------------------------------------------------------
    def setup_caches(self, batch: int, length: int, dtype=None, device=None) -> None:
        if length > self.cfg.max_positions:
            raise ValueError(f"cache length {length} exceeds max_positions {self.cfg.max_positions}")
        dtype = dtype or self.norm.weight.dtype
        device = device or self.norm.weight.device
        for layer in self.layers:
            layer.attention.kv_cache = KVCache(batch, length, self.cfg.heads, self.cfg.head_dim, dtype, device)
        self.key_valid = torch.zeros(batch, length, dtype=torch.bool, device=device)

    @property
    def cache_shape(self) -> tuple[int, int] | None:
        return None if self.key_valid is None else tuple(self.key_valid.shape)

    # --- embeddings and heads -------------------------------------------------------------------
    def embed(self, ids: Tensor, text_mask: Tensor) -> Tensor:
        """ids (B, T, Q), text_mask (B, T) -> (B, T, D). Text uses channel 0; audio sums Q codebooks."""
        text = self.emb_text(ids[..., 0].clamp(0, self.cfg.num_text_tokens - 1))
        return torch.where(text_mask[..., None], text, self.embed_codes(ids.clamp(0, self.cfg.num_audio_tokens - 1)))

    def embed_codes(self, codes: Tensor) -> Tensor:
        """codes (..., Q) -> (..., D)"""
        return self.emb_code(codes + self.code_offsets).sum(-2)

    def code_logits(self, h: Tensor) -> Tensor:
        """h (..., D) -> (..., Q, V) float32"""
        return self.head_code(h).float().unflatten(-1, (self.cfg.num_vq, self.cfg.num_audio_tokens))

    def text_logits(self, h: Tensor) -> Tensor:
        return self.head_text(h).float()

    # --- backbone -----------------------------------------------------------------------------
    def forward(
        self,
        x: Tensor,
        input_pos: Tensor,
        rope_pos: Tensor,
        run_block: BlockRunner | None = None,
        key_first: Tensor | None = None,
    ) -> Tensor:
        """Cached step or prefill. x (B, T, D) input embeddings, input_pos (T,) cache slots, rope_pos (B, T)
        -> final-norm hidden (B, T, D). Keys are the whole cache (a static shape); `key_valid` marks real ones.
        `run_block` replaces the plain call of each block (the engine passes a torch.compile'd one).
        key_first (B,): a decode step (T == 1) whose row b has no real key before cache position key_first[b]:
        attention skips the blocks of KEY_BLOCK positions wholly outside [key_first, input_pos] (flex attention;
        meant for a compiled step, where it is one fused kernel; the cache length a multiple of KEY_BLOCK)."""
        B = x.shape[0]
        return self._run(
            x, input_pos, rope_pos, self.key_valid[:B], use_cache=True, run_block=run_block, key_first=key_first
        )

    def forward_full(self, x: Tensor, valid: Tensor) -> Tensor:
        """Teacher forcing without the cache: x (B, T, D), valid (B, T) non-padding -> hidden (B, T, D)."""
        rope = (valid.long().cumsum(1) - 1).clamp(min=0)
        return self._run(x, torch.arange(x.shape[1], device=x.device), rope, valid, use_cache=False)

    def _run(
        self,
        x: Tensor,
        input_pos: Tensor,
        rope_pos: Tensor,
        key_valid: Tensor,
        use_cache: bool,
        run_block: BlockRunner | None = None,
        key_first: Tensor | None = None,
    ) -> Tensor:
        angles = rope_pos[..., None].float() * self.inv_freq  # (B, T, K/2)
        angles = torch.cat((angles, angles), dim=-1)[:, None]  # (B, 1, T, K)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        if key_first is not None:
            mask = self._decode_block_mask(key_valid, input_pos, key_first)
        else:
            slots = torch.arange(key_valid.shape[1], device=x.device)
            causal = slots[None, :] <= input_pos[:, None]  # (T, S)
            itself = slots[None, :] == input_pos[:, None]  # a padded query still sees itself: no empty softmax rows
            mask = (key_valid[:, None, None, :] & causal) | itself  # (B, 1, T, S)
        run_block = run_block or call_block
        for layer in self.layers:
            x = run_block(layer, x, cos, sin, mask, input_pos, use_cache)
        return self.norm(x)

    def _decode_block_mask(self, key_valid: Tensor, input_pos: Tensor, key_first: Tensor) -> BlockMask:
        """The mask of a decode step as flex attention's block mask: row b reads the blocks from key_first[b]'s to
        input_pos's; the first and the last through `_run`'s dense mask, those between whole (every key between a
        row's first and the step's position is real: its prompt, then one key per step)."""
        B, S = key_valid.shape
        blocks = S // KEY_BLOCK
        first = (key_first // KEY_BLOCK).to(torch.int32).clamp(0, blocks - 1)
        last = (input_pos[0] // KEY_BLOCK).to(torch.int32).expand(B).maximum(first)
        order = torch.arange(blocks, dtype=torch.int32, device=first.device)

        def per_head(t: Tensor) -> Tensor:  # (B, ...) -> (B, H, 1, ...): one query block, the same for every head
            return t[:, None, None].expand(B, self.cfg.heads, 1, *t.shape[1:]).contiguous()

        ends = torch.where(order[None, :] == 0, first[:, None], last[:, None])  # (B, blocks): first, then last
        inner = (first[:, None] + 1 + order[None, :]).clamp(max=blocks - 1)
        pos = input_pos[0]

        def keep(b, h, q, kv):
            return (key_valid[b, kv] & (kv <= pos)) | (kv == pos)

        return BlockMask.from_kv_blocks(
            per_head(torch.where(last > first, 2, 1).to(torch.int32)),
            per_head(ends),
            per_head((last - first - 1).clamp(min=0)),
            per_head(inner),
            BLOCK_SIZE=KEY_BLOCK,
            mask_mod=keep,
            seq_lengths=(1, S),
        )

"""The GPT decode loop: one prefill, then one-token steps over a preallocated static KV cache.
Sampling stays on the device; the host checks for EOS only every `check_every` steps."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import Tensor

from .models.gpt import GPT
from .sampling import SamplingParams, draw, process_logits

CACHE_BUCKET = 256  # cache lengths are rounded up to this, so new lengths rarely reallocate


@dataclass
class Chunk:
    """Steps [start, stop) of a generation; hidden (B, n, D), codes (B, n, Q)."""
    start: int
    hidden: Tensor
    codes: Tensor
    lengths: Tensor  # (B,) steps before EOS so far
    finished: Tensor  # (B,) bool


@dataclass
class Generation:
    hidden: Tensor  # (B, N, D) the state each code was sampled from (what the Decoder reads)
    codes: Tensor  # (B, N, Q)
    lengths: Tensor  # (B,) steps before EOS
    finished: Tensor  # (B,) False where max_new_tokens was hit first


class Engine:
    def __init__(self, gpt: GPT, check_every: int = 16):
        self.gpt = gpt
        self.check_every = check_every

    def _ensure_cache(self, batch: int, length: int) -> None:
        have = self.gpt.cache_shape
        length = min(-(-length // CACHE_BUCKET) * CACHE_BUCKET, self.gpt.cfg.max_positions)
        if have is None or have[0] < batch or have[1] < length:
            self.gpt.setup_caches(max(batch, have[0] if have else 0), max(length, have[1] if have else 0))
        for layer in self.gpt.layers:  # stale NaN in unused slots would leak through 0 * NaN
            layer.attention.kv_cache.k.zero_()
            layer.attention.kv_cache.v.zero_()

    @torch.inference_mode()
    def stream(self, emb: Tensor, valid: Tensor, params: SamplingParams, seed: int = 0,
               should_stop: Callable[[], bool] | None = None) -> Iterator[Chunk]:
        """emb (B, T, D) prompt embeddings, valid (B, T) non-padding -> chunks of `check_every` steps."""
        gpt, cfg = self.gpt, self.gpt.cfg
        B, T, D = emb.shape
        Q, V = cfg.num_vq, cfg.num_audio_tokens
        steps = min(params.max_new_tokens, cfg.max_positions - T)
        if steps < 1:
            raise ValueError(f"prompt of {T} tokens leaves no room to generate (max_positions {cfg.max_positions}); "
                             "split the text into shorter sentences")
        dev = emb.device
        self._ensure_cache(B, T + steps)
        gpt.key_valid[:B].fill_(True)
        gpt.key_valid[:B, :T] = valid
        rope = (valid.long().cumsum(1) - 1).clamp(min=0)
        h = gpt(emb.to(gpt.norm.weight.dtype), torch.arange(T, device=dev), rope)[:, -1]
        next_rope = valid.long().sum(1, keepdim=True)  # (B, 1)

        gen = torch.Generator(device=dev).manual_seed(int(seed))
        temperature = params.temperature_tensor(Q, dev).repeat(B)
        history = torch.full((B * Q, params.penalty_window), V, dtype=torch.long, device=dev)
        finished = torch.zeros(B, dtype=torch.bool, device=dev)
        lengths = torch.zeros(B, dtype=torch.long, device=dev)
        eos = cfg.eos_code
        start = 0
        while start < steps:
            n = min(self.check_every, steps - start)
            noise = torch.empty(n, B * Q, V, device=dev).exponential_(1, generator=gen)
            hid = torch.empty(B, n, D, device=dev, dtype=h.dtype)
            codes = torch.empty(B, n, Q, device=dev, dtype=torch.long)
            for j in range(n):
                i = start + j
                logits = process_logits(gpt.code_logits(h).view(B * Q, V), history, params, temperature)
                if i < params.min_new_tokens:
                    logits[:, eos] = float("-inf")
                ids = draw(logits, noise[j])  # (B * Q,)
                history[:, i % params.penalty_window] = ids
                ids = ids.view(B, Q)
                hid[:, j], codes[:, j] = h, ids
                finished |= (ids == eos).any(-1)
                lengths += ~finished
                if i + 1 < steps:
                    x = gpt.embed_codes(ids)[:, None].to(h.dtype)
                    h = gpt(x, torch.tensor([T + i], device=dev), next_rope + i)[:, 0]
            yield Chunk(start, hid, codes, lengths.clone(), finished.clone())
            start += n
            if bool(finished.all()) or (should_stop is not None and should_stop()):  # the one host sync
                break

    def generate(self, emb: Tensor, valid: Tensor, params: SamplingParams, seed: int = 0,
                 should_stop: Callable[[], bool] | None = None) -> Generation:
        chunks = list(self.stream(emb, valid, params, seed, should_stop))
        last = chunks[-1]
        return Generation(torch.cat([c.hidden for c in chunks], 1), torch.cat([c.codes for c in chunks], 1),
                          last.lengths, last.finished)

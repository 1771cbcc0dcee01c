"""One GPT decode step on static device buffers: the state both the engine and the Triton kernels step."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from .models.gpt import GPT, BlockRunner, call_block
from .sampling import SamplingParams, sample_codes


def vocabulary(cfg, text_eos: int | None) -> tuple[int, int]:
    """(ids per step, vocabulary size) of a generation: Q codebooks of audio codes, or one text token."""
    return (cfg.num_vq, cfg.num_audio_tokens) if text_eos is None else (1, cfg.num_text_tokens)


class DecodeState:
    """Static device buffers for one batch size and chunk length."""

    def __init__(self, B: int, D: int, Q: int, V: int, window: int, chunk: int, dtype, device):
        z = dict(device=device)
        self.h = torch.zeros(B, D, dtype=dtype, **z)
        self.step = torch.zeros((), dtype=torch.long, **z)
        self.prompt_len = torch.zeros((), dtype=torch.long, **z)
        self.min_new = torch.zeros((), dtype=torch.long, **z)
        self.rope_base = torch.zeros(B, 1, dtype=torch.long, **z)
        self.temperature = torch.ones(B * Q, **z)
        self.history = torch.full((B * Q, window), V, dtype=torch.long, **z)
        self.finished = torch.zeros(B, dtype=torch.bool, **z)
        self.lengths = torch.zeros(B, dtype=torch.long, **z)
        self.noise = torch.ones(chunk, B * Q, V, **z)
        self.hidden = torch.zeros(B, chunk, D, dtype=dtype, **z)
        self.codes = torch.zeros(B, chunk, Q, dtype=torch.long, **z)
        self.arrived = torch.zeros(B, dtype=torch.int32, **z)  # kernels.py's sampling launch counts here, back to 0


def decode_step(
    gpt: GPT,
    s: DecodeState,
    p: SamplingParams,
    chunk: int,
    run_block: BlockRunner = call_block,
    sample: Callable = sample_codes,
    forward: Callable[[GPT, Tensor, Tensor, Tensor], Tensor] | None = None,
    text_eos: int | None = None,
) -> None:
    """One decode step on static buffers: sample from s.h, record, feed the ids back.
    forward(gpt, x, cache slot, rope positions) replaces gpt's own forward (kernels.decode_forward).
    text_eos: sample one text token through the text head (refine) and stop at this id; None: Q audio codes."""
    B, Q = s.codes.shape[0], s.codes.shape[2]  # Q ids per step: the codebooks, or 1 text token
    logits = gpt.code_logits(s.h) if text_eos is None else gpt.text_logits(s.h)
    V = logits.shape[-1]
    eos = gpt.cfg.eos_code if text_eos is None else text_eos
    i = s.step
    j = (i % chunk).view(1)
    ids = sample(
        logits.view(B * Q, V), s.history, s.temperature, s.noise.index_select(0, j)[0], i, s.min_new, p, eos
    )  # (B * Q,)
    s.history.index_copy_(1, (i % p.penalty_window).view(1), ids[:, None])
    ids = ids.view(B, Q)
    s.hidden.index_copy_(1, j, s.h[:, None])
    s.codes.index_copy_(1, j, ids[:, None])
    s.finished |= (ids == eos).any(-1)
    s.lengths += ~s.finished
    x = (gpt.embed_codes(ids) if text_eos is None else gpt.emb_text(ids[:, 0]))[:, None].to(s.h.dtype)
    slot, rope = (s.prompt_len + i).view(1), s.rope_base + i
    s.h.copy_((forward(gpt, x, slot, rope) if forward else gpt(x, slot, rope, run_block))[:, 0])
    s.step += 1

"""ChatTTS-style sampling on the device: temperature, repetition penalty over a window, top-p, top-k,
EOS suppression before a minimum length, and a sync-free categorical draw."""

from __future__ import annotations

import torch
from torch import Tensor

from .params import SamplingParams


def process_logits(logits: Tensor, history: Tensor, p: SamplingParams, temperature: Tensor) -> Tensor:
    """logits (N, V) float32, history (N, W) past codes with V meaning "empty", temperature (N,) -> (N, V)."""
    N, V = logits.shape
    logits = logits / temperature[:, None]
    if p.repetition_penalty != 1.0:
        counts = torch.zeros(N, V + 1, device=logits.device, dtype=logits.dtype)
        counts.scatter_add_(1, history, torch.ones_like(history, dtype=logits.dtype))
        alpha = torch.pow(p.repetition_penalty, counts[:, :V])
        logits = torch.where(logits < 0, logits * alpha, logits / alpha)
    k = p.top_k_for(V)
    if k < V:
        # top-p then top-k (ChatTTS's order) keeps a prefix of the ranking, so the k best and the full logsumexp
        # decide it: a top-k instead of a sort of all V, which was the step's slowest kernel at batch 1
        best = logits.topk(k, dim=-1).values  # (N, k) descending
        if p.top_p < 1.0:
            probs = (best - logits.logsumexp(-1, keepdim=True)).exp()
            above = probs.cumsum(-1) - probs  # probability of the better-ranked tokens
            kept = (above < p.top_p).sum(-1, keepdim=True).clamp(min=min(p.min_keep, k))
            best = best.gather(1, kept - 1)
        logits = logits.masked_fill(logits < best[:, -1:], float("-inf"))
    elif p.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1)  # ascending
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum <= 1 - p.top_p
        drop[:, -p.min_keep :] = False
        logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return logits


def draw(logits: Tensor, noise: Tensor) -> Tensor:
    """Categorical sample without a host sync: argmax(p / E) with E ~ Exp(1) is distributed as p.
    The noise (N, V) is drawn ahead from a seeded generator, so results depend only on the seed."""
    return (logits.softmax(-1) / noise).argmax(-1)


def sample_codes(
    logits: Tensor,
    history: Tensor,
    temperature: Tensor,
    noise: Tensor,
    step: Tensor,
    min_new: Tensor,
    p: SamplingParams,
    eos_code: int,
) -> Tensor:
    """One decode step's draw: logits (N, V) float32 -> ids (N,); EOS is barred while step < min_new."""
    logits = process_logits(logits, history, p, temperature)
    eos = logits[:, eos_code]
    logits[:, eos_code] = torch.where(step < min_new, torch.full_like(eos, float("-inf")), eos)
    return draw(logits, noise)

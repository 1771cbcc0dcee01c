"""ChatTTS-style sampling on the device: temperature, repetition penalty over a window, top-p, top-k,
EOS suppression before a minimum length, and a sync-free categorical draw."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class SamplingParams:
    temperature: float | tuple[float, ...] = 0.3  # one value, or one per codebook
    top_p: float = 0.7
    top_k: int = 20
    repetition_penalty: float = 1.05
    penalty_window: int = 16
    min_keep: int = 3  # top-p/top-k never keep fewer
    max_new_tokens: int = 2048
    min_new_tokens: int = 0

    def __post_init__(self):
        temps = self.temperature if isinstance(self.temperature, (tuple, list)) else (self.temperature,)
        if any(t <= 0 for t in temps):
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 1 or self.repetition_penalty <= 0 or self.max_new_tokens < 1:
            raise ValueError("top_k and max_new_tokens must be >= 1 and repetition_penalty > 0")

    def temperature_tensor(self, num_vq: int, device) -> Tensor:
        t = self.temperature
        t = list(t) if isinstance(t, (tuple, list)) else [t] * num_vq
        if len(t) != num_vq:
            raise ValueError(f"{len(t)} temperatures given for {num_vq} codebooks")
        return torch.tensor(t, dtype=torch.float32, device=device)


def process_logits(logits: Tensor, history: Tensor, p: SamplingParams, temperature: Tensor) -> Tensor:
    """logits (N, V) float32, history (N, W) past codes with V meaning "empty", temperature (N,) -> (N, V)."""
    N, V = logits.shape
    logits = logits / temperature[:, None]
    if p.repetition_penalty != 1.0:
        counts = torch.zeros(N, V + 1, device=logits.device, dtype=logits.dtype)
        counts.scatter_add_(1, history, torch.ones_like(history, dtype=logits.dtype))
        alpha = torch.pow(p.repetition_penalty, counts[:, :V])
        logits = torch.where(logits < 0, logits * alpha, logits / alpha)
    if p.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1)  # ascending
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum <= 1 - p.top_p
        drop[:, -p.min_keep:] = False
        logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    k = min(max(p.top_k, p.min_keep), V)
    if k < V:
        kth = logits.topk(k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits


def draw(logits: Tensor, noise: Tensor) -> Tensor:
    """Categorical sample without a host sync: argmax(p / E) with E ~ Exp(1) is distributed as p.
    The noise (N, V) is drawn ahead from a seeded generator, so results depend only on the seed."""
    return (logits.softmax(-1) / noise).argmax(-1)

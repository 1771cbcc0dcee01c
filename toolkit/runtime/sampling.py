"""The torch engine's sampling in numpy: temperature (per codebook), repetition penalty over a window of past
codes, top-p, top-k (never fewer than min_keep), EOS suppression before min_new_tokens, and the draw
argmax(p / E) with E ~ Exp(1). The noise comes from numpy's PCG64, so a seed does not reproduce the torch
engine's tokens bit for bit (the distribution is the same)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class SamplingParams:
    temperature: float | tuple[float, ...] = 0.3
    top_p: float = 0.7
    top_k: int = 20
    repetition_penalty: float = 1.05
    penalty_window: int = 16
    min_keep: int = 3
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

    def temperatures(self, num_vq: int) -> np.ndarray:
        t = self.temperature
        t = list(t) if isinstance(t, (tuple, list)) else [t] * num_vq
        if len(t) != num_vq:
            raise ValueError(f"{len(t)} temperatures given for {num_vq} codebooks")
        return np.asarray(t, np.float32)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def process_logits(logits: np.ndarray, history: np.ndarray, p: SamplingParams, temperature: np.ndarray) -> np.ndarray:
    """logits (N, V) float32, history (N, W) past codes with V meaning "empty", temperature (N,) -> (N, V)."""
    N, V = logits.shape
    logits = logits / temperature[:, None]
    if p.repetition_penalty != 1.0:
        counts = np.zeros((N, V + 1), np.float32)
        np.add.at(counts, (np.arange(N)[:, None], history), 1.0)
        alpha = np.power(np.float32(p.repetition_penalty), counts[:, :V])
        logits = np.where(logits < 0, logits * alpha, logits / alpha)
    if p.top_p < 1.0:
        order = np.argsort(logits, axis=-1, kind="stable")  # ascending
        sorted_logits = np.take_along_axis(logits, order, -1)
        drop = np.cumsum(softmax(sorted_logits), -1) <= 1 - p.top_p
        drop[:, -p.min_keep:] = False
        mask = np.zeros_like(drop)
        np.put_along_axis(mask, order, drop, -1)
        logits = np.where(mask, -np.inf, logits)
    k = min(max(p.top_k, p.min_keep), V)
    if k < V:
        kth = np.partition(logits, V - k, axis=-1)[:, V - k:V - k + 1]
        logits = np.where(logits < kth, -np.inf, logits)
    return logits.astype(np.float32)


def draw(logits: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """argmax(softmax(logits) / noise), noise ~ Exp(1): a categorical sample."""
    return (softmax(logits) / noise).argmax(-1)

"""The torch engine's sampling in numpy: temperature (per codebook), repetition penalty over a window of past
codes, top-p, top-k (never fewer than min_keep), EOS suppression before min_new_tokens, and the draw
argmax(p / E) with E ~ Exp(1). The noise comes from numpy's PCG64, so a seed does not reproduce the torch
engine's tokens bit for bit (the distribution is the same)."""

from __future__ import annotations

import numpy as np

from ..params import SamplingParams  # noqa: F401  (re-exported: the runtime's public settings)


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
        drop[:, -p.min_keep :] = False
        mask = np.zeros_like(drop)
        np.put_along_axis(mask, order, drop, -1)
        logits = np.where(mask, -np.inf, logits)
    k = p.top_k_for(V)
    if k < V:
        kth = np.partition(logits, V - k, axis=-1)[:, V - k : V - k + 1]
        logits = np.where(logits < kth, -np.inf, logits)
    return logits.astype(np.float32)


def draw(logits: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """argmax(softmax(logits) / noise), noise ~ Exp(1): a categorical sample."""
    return (softmax(logits) / noise).argmax(-1)

"""numpy signal code of the runtime: the ISTFT (torch.istft center=True, Hann window) and torch-exact speaker seeds."""

from __future__ import annotations

import numpy as np


def hann(n_fft: int) -> np.ndarray:
    return (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)).astype(np.float32)  # periodic, like torch


def overlap_add(real: np.ndarray, imag: np.ndarray, n_fft: int, hop: int, window: np.ndarray):
    """real, imag (bins, F) -> (ola, env) of (F - 1) * hop + n_fft samples, ola[0] at frame 0's first sample."""
    frames = np.fft.irfft(real + 1j * imag, n=n_fft, axis=0).astype(np.float32) * window[:, None]  # (n_fft, F)
    F = frames.shape[1]
    n = (F - 1) * hop + n_fft
    ola = np.zeros(n, np.float32)
    env = np.zeros(n, np.float32)
    w2 = window**2
    if n_fft % hop == 0:  # add frame groups that don't overlap: n_fft/hop vectorised adds
        r = n_fft // hop
        for j in range(r):
            sel = frames[:, j::r]  # frames j, j+r, ... tile without overlap
            m = sel.shape[1]
            if m:
                start = j * hop
                ola[start : start + m * n_fft] += sel.T.reshape(-1)
                env[start : start + m * n_fft] += np.tile(w2, m)
    else:
        for f in range(F):
            ola[f * hop : f * hop + n_fft] += frames[:, f]
            env[f * hop : f * hop + n_fft] += w2
    return ola, env


def istft(real: np.ndarray, imag: np.ndarray, n_fft: int, hop: int, window: np.ndarray | None = None) -> np.ndarray:
    """(bins, F) -> hop * (F - 1) samples, as torch.istft(center=True)."""
    window = hann(n_fft) if window is None else window
    ola, env = overlap_add(real, imag, n_fft, hop, window)
    half = n_fft // 2
    n = hop * (real.shape[1] - 1)
    return ola[half : half + n] / np.maximum(env[half : half + n], 1e-11)


def torch_randn(seed: int, n: int) -> np.ndarray:
    """torch.randn(n, generator=torch.Generator().manual_seed(seed)) on the CPU, bit for bit up to float rounding
    of log/cos (checked to 2.4e-7), for n a multiple of 16: torch's mt19937 (seeded like numpy's legacy
    RandomState), 24-bit uniforms, then Box-Muller over blocks of 16 (cos to the first 8, sin to the last 8)."""
    if n % 16:
        raise ValueError("torch_randn reproduces torch only for n a multiple of 16")
    rs = np.random.RandomState(int(seed) & 0xFFFFFFFF)
    u = (rs.randint(0, 2**32, size=n, dtype=np.uint64) & ((1 << 24) - 1)).astype(np.float32) * np.float32(2.0**-24)
    u = u.reshape(-1, 2, 8)
    radius = np.sqrt(np.float32(-2) * np.log(np.float32(1) - u[:, 0]))
    theta = np.float32(2 * np.pi) * u[:, 1]
    return np.stack([radius * np.cos(theta), radius * np.sin(theta)], 1).reshape(n).astype(np.float32)

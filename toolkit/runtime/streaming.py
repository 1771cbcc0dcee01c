"""Exact streaming in numpy: the receptive-field window logic of toolkit.streaming.StreamRenderer.

A span of output samples depends only on a bounded window of GPT states (the Decoder's and Vocos's receptive
radius in mel frames, then the ISTFT's overlap-add), so each new chunk is rendered over just the window its
final samples need, and samples are emitted once no future state can change them."""

from __future__ import annotations

import math

import numpy as np

from .dsp import hann, overlap_add


class StreamRenderer:
    """Feed GPT states (n, D) as they arrive; get final 24 kHz samples back."""

    def __init__(self, decoder, vocos, n_fft: int, hop: int, r_dec: int, r_voc: int):
        self.decoder, self.vocos = decoder, vocos  # ONNX Runtime sessions
        self.hop, self.n_fft, self.r_dec, self.r_voc = hop, n_fft, r_dec, r_voc
        self.hidden = np.zeros((0, 0), np.float32)
        self.steps = 0
        self.emitted = 0
        self.window = hann(n_fft)

    def push(self, hidden: np.ndarray, ready=None) -> np.ndarray:
        """hidden (n, D); ready: unused here (the torch engine's CUDA event), for the shared render_stream."""
        if hidden.shape[0]:
            self.hidden = hidden.astype(np.float32) if self.steps == 0 else np.concatenate([self.hidden, hidden])
            self.steps += hidden.shape[0]
        final_spec = 2 * self.steps - self.r_dec - self.r_voc
        return self._render(self.emitted, final_spec * self.hop - self.n_fft // 2, frames=None)

    def finish(self) -> np.ndarray:
        if self.steps == 0:
            return np.zeros(0, np.float32)
        return self._render(self.emitted, self.hop * (2 * self.steps - 1), frames=2 * self.steps)

    def _render(self, t0: int, t1: int, frames: int | None) -> np.ndarray:
        if t1 <= t0:
            return np.zeros(0, np.float32)
        hop, half = self.hop, self.n_fft // 2
        known = 2 * self.steps
        f0 = max(0, (t0 - half) // hop + 1)
        f1 = min(frames or known, math.ceil((t1 + half) / hop))
        m0, m1 = max(0, f0 - self.r_voc), min(known, f1 + self.r_voc)
        s0, s1 = max(0, (m0 - self.r_dec) // 2), min(self.steps, math.ceil((m1 + self.r_dec) / 2))
        mel = self.decoder.run(None, {"hidden": self.hidden[None, s0:s1]})[0][..., m0 - 2 * s0 : m1 - 2 * s0]
        real, imag = self.vocos.run(None, {"mel": np.ascontiguousarray(mel)})
        sl = slice(f0 - m0, f1 - m0)
        ola, env = overlap_add(real[0, :, sl], imag[0, :, sl], self.n_fft, hop, self.window)
        start = f0 * hop - half
        seg = slice(t0 - start, t1 - start)
        self.emitted = t1
        return (ola[seg] / np.maximum(env[seg], 1e-11)).astype(np.float32)

"""Vocos as ONNX: mel (B, n_mels, F) -> the complex spectrum as real, imag (B, n_fft/2+1, F) float32.

The ISTFT runs outside the graph, in numpy (`toolkit.runtime.dsp.istft`): see toolkit/export/README.md for the
measurement against the in-graph variant (`build_istft_graph`: inverse-DFT MatMul + ConvTranspose1d overlap-add),
which is kept here for that measurement."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from ..models import TTSModel


class MelToSpectrum(nn.Module):
    def __init__(self, model: TTSModel):
        super().__init__()
        self.vocos = model.vocos

    def forward(self, mel: Tensor):
        v = self.vocos
        x = v.norm(v.embed(mel).transpose(1, 2)).transpose(1, 2)
        for block in v.blocks:
            x = block(x)
        x = v.out(v.final_norm(x.transpose(1, 2))).transpose(1, 2)
        log_mag, phase = x.chunk(2, dim=1)
        mag = log_mag.exp().clamp(max=1e2)
        return mag * phase.cos(), mag * phase.sin()


def export_vocos(model: TTSModel, path, opset: int) -> None:
    mel = torch.randn(1, model.cfg.vocos.n_mels, 9)
    axes = {"mel": {0: "batch", 2: "frames"}, "real": {0: "batch", 2: "frames"}, "imag": {0: "batch", 2: "frames"}}
    with torch.no_grad():
        torch.onnx.export(
            MelToSpectrum(model).eval(),
            (mel,),
            str(path),
            input_names=["mel"],
            output_names=["real", "imag"],
            dynamic_axes=axes,
            opset_version=opset,
            dynamo=False,
            do_constant_folding=True,
        )


class GraphISTFT(nn.Module):
    """torch.istft(center=True) as MatMul + ConvTranspose1d, for export (measured against numpy, not shipped)."""

    def __init__(self, n_fft: int, hop: int):
        super().__init__()
        n = np.arange(n_fft)
        k = np.arange(n_fft // 2 + 1)
        w = np.hanning(n_fft + 1)[:-1]  # periodic Hann, as torch.hann_window
        c = np.where((k == 0) | (k == n_fft // 2), 1.0, 2.0)[:, None] / n_fft
        ang = 2 * np.pi * k[:, None] * n[None, :] / n_fft
        self.register_buffer("cr", torch.tensor(c * np.cos(ang) * w, dtype=torch.float32))  # (bins, n_fft)
        self.register_buffer("ci", torch.tensor(-c * np.sin(ang) * w, dtype=torch.float32))
        self.register_buffer("eye", torch.eye(n_fft, dtype=torch.float32)[:, None, :])  # (n_fft, 1, n_fft)
        self.register_buffer("w2", torch.tensor(w**2, dtype=torch.float32)[None, :, None])
        self.n_fft, self.hop = n_fft, hop

    def forward(self, real: Tensor, imag: Tensor) -> Tensor:
        frames = (real.transpose(1, 2) @ self.cr + imag.transpose(1, 2) @ self.ci).transpose(1, 2)  # (B, n_fft, F)
        ola = nn.functional.conv_transpose1d(frames, self.eye, stride=self.hop)[:, 0]
        env = nn.functional.conv_transpose1d(self.w2.expand(1, -1, frames.shape[2]), self.eye, stride=self.hop)[:, 0]
        half = self.n_fft // 2
        n = self.hop * (frames.shape[2] - 1)
        return ola[:, half : half + n] / env[:, half : half + n].clamp(min=1e-11)


def build_istft_graph(n_fft: int, hop: int, path, opset: int = 17) -> None:
    bins = n_fft // 2 + 1
    r, i = torch.randn(1, bins, 9), torch.randn(1, bins, 9)
    axes = {"real": {0: "batch", 2: "frames"}, "imag": {0: "batch", 2: "frames"}, "wav": {0: "batch", 1: "samples"}}
    with torch.no_grad():
        torch.onnx.export(
            GraphISTFT(n_fft, hop).eval(),
            (r, i),
            str(path),
            input_names=["real", "imag"],
            output_names=["wav"],
            dynamic_axes=axes,
            opset_version=opset,
            dynamo=False,
        )

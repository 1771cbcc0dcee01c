"""Vocos vocoder: ConvNeXt backbone and ISTFT head, mel (B, 100, F) -> 24 kHz waveform (B, hop * (F - 1)).
Also the matching log-mel front end (HTK mel scale, magnitude, log clip 1e-5), used for training and metrics."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .config import VocosConfig
from .convnext import ConvNeXtBlock


class Vocos(nn.Module):
    def __init__(self, cfg: VocosConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Conv1d(cfg.n_mels, cfg.dim, 7, padding=3)
        self.norm = nn.LayerNorm(cfg.dim, eps=1e-6)
        self.blocks = nn.ModuleList(ConvNeXtBlock(cfg.dim, cfg.intermediate) for _ in range(cfg.layers))
        self.final_norm = nn.LayerNorm(cfg.dim, eps=1e-6)
        self.out = nn.Linear(cfg.dim, cfg.n_fft + 2)
        self.register_buffer("window", torch.hann_window(cfg.n_fft), persistent=False)

    def spectrum(self, mel: Tensor) -> Tensor:
        """mel (B, n_mels, F) -> complex STFT (B, n_fft/2+1, F)"""
        x = self.norm(self.embed(mel).transpose(1, 2)).transpose(1, 2)
        for block in self.blocks:
            x = block(x)
        x = self.out(self.final_norm(x.transpose(1, 2))).transpose(1, 2).float()
        log_mag, phase = x.chunk(2, dim=1)
        mag = log_mag.exp().clamp(max=1e2)
        return torch.polar(mag, phase)

    def istft(self, spec: Tensor) -> Tensor:
        # the ISTFT stays in fp32 whatever the precision of the backbone
        return torch.istft(spec, self.cfg.n_fft, self.cfg.hop, self.cfg.n_fft, self.window.float(), center=True)

    def forward(self, mel: Tensor) -> Tensor:
        return self.istft(self.spectrum(mel))

    @property
    def receptive_radius(self) -> int:
        return 3 + sum(b.receptive_radius for b in self.blocks)


def mel_filterbank(sample_rate: int, n_fft: int, n_mels: int) -> Tensor:
    """(n_fft/2+1, n_mels) triangular HTK-scale filters, unnormalised (torchaudio's defaults)."""

    def hz_to_mel(f):
        return 2595.0 * torch.log10(1.0 + f / 700.0)

    freqs = torch.linspace(0, sample_rate // 2, n_fft // 2 + 1, dtype=torch.float64)
    mel_pts = torch.linspace(0, float(hz_to_mel(torch.tensor(sample_rate / 2.0))), n_mels + 2, dtype=torch.float64)
    hz_pts = 700.0 * (10 ** (mel_pts / 2595.0) - 1.0)
    diff = hz_pts[1:] - hz_pts[:-1]
    slopes = hz_pts[None, :] - freqs[:, None]  # (n_freqs, n_mels + 2)
    down = -slopes[:, :-2] / diff[:-1]
    up = slopes[:, 2:] / diff[1:]
    return torch.clamp(torch.minimum(down, up), min=0).float()


class LogMel(nn.Module):
    """waveform (B, N) -> log-mel (B, n_mels, N // hop + 1)"""

    def __init__(self, cfg: VocosConfig):
        super().__init__()
        self.cfg = cfg
        self.register_buffer("window", torch.hann_window(cfg.n_fft), persistent=False)
        self.register_buffer("fb", mel_filterbank(cfg.sample_rate, cfg.n_fft, cfg.n_mels), persistent=False)

    def forward(self, wav: Tensor) -> Tensor:
        spec = torch.stft(
            wav.float(),
            self.cfg.n_fft,
            self.cfg.hop,
            window=self.window,
            center=True,
            pad_mode="reflect",
            return_complex=True,
        ).abs()
        return torch.log((spec.transpose(1, 2) @ self.fb).transpose(1, 2).clamp(min=1e-5))

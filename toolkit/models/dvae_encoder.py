"""DVAE encoders: 24 kHz audio -> the 4-codebook codes the GPT reads (one code per two mel frames).

- DVAEEncoder: ChatTTS's (its DVAE's encode direction; speakers from sample audio, `spk_smp`);
- VoiceEncoder: the one ttsq's voice lab trained with the shipped voice (training.voice.train).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ConvStackConfig, GFSQConfig, ModelConfig, VocosConfig
from .convnext import ConvNeXtBlock
from .decoder import ConvBody
from .vocos import LogMel


class GFSQEncoder(nn.Module):
    """features (B, dim, T) -> codes (B, G*R, T), codebook q = g * R + r: the encode direction of ChatTTS's GFSQ
    (vector-quantize-pytorch's GroupedResidualFSQ with symmetric levels and hard clamps). Per group: a projection to
    L values, a soft clamp tanh(x / c) * c with c = 1 + 1 / (level - 1), then R rounds, each quantizing what the
    previous ones left, at scale level ** -r, to the grid -1, -1 + 2 / (level - 1), ..., 1."""

    def __init__(self, cfg: GFSQConfig):
        super().__init__()
        self.cfg = cfg
        self.project_in = nn.ModuleList(nn.Linear(cfg.dim // cfg.groups, len(cfg.levels)) for _ in range(cfg.groups))
        levels = torch.tensor(cfg.levels)
        self.register_buffer("levels", levels, persistent=False)
        self.register_buffer("basis", torch.cumprod(torch.tensor([1, *cfg.levels[:-1]]), 0), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        lm1 = self.levels - 1
        clamp = 1 + 1 / lm1
        codes = []
        for g, z in enumerate(x.transpose(1, 2).float().chunk(self.cfg.groups, dim=-1)):
            z = self.project_in[g](z)  # (B, T, L)
            z = (z / clamp).tanh() * clamp
            residual = z
            for r in range(self.cfg.residuals):
                scale = self.levels.float() ** -r
                step = torch.floor(lm1 * ((residual / scale).clamp(-1, 1) + 1) / 2 + 0.5)  # 0 .. level-1
                residual = residual - (step * (2 / lm1) - 1) * scale
                codes.append((step * self.basis).sum(-1).round().long())
        return torch.stack(codes, 1)  # (B, G*R, T)


class DVAEEncoder(nn.Module):
    """ChatTTS's DVAE encoder: waveform (B, N) at 24 kHz -> log-mel / coef (B, 100, N // 256 + 1) -> conv, and a
    stride-2 conv to half the frames -> ConvNeXt body -> GFSQ codes (B, Q, F // 2)."""

    def __init__(self, dim: int, body: ConvStackConfig, gfsq: GFSQConfig, vocos: VocosConfig | None = None):
        super().__init__()
        self.logmel = LogMel(vocos or VocosConfig())  # the checkpoint's filterbank replaces its own (load_dvae_encoder)
        n_mels = self.logmel.cfg.n_mels
        self.register_buffer("coef", torch.ones(1, n_mels, 1))
        self.downsample = nn.Sequential(
            nn.Conv1d(n_mels, dim, 3, 1, 1), nn.GELU(), nn.Conv1d(dim, dim, 4, 2, 1), nn.GELU()
        )
        self.body = ConvBody(body)
        self.gfsq = GFSQEncoder(gfsq)

    @property
    def sample_rate(self) -> int:
        return self.logmel.cfg.sample_rate

    def forward(self, wav: Tensor) -> Tensor:
        mel = self.logmel(wav.float()) / self.coef
        return self.gfsq(self.body(self.downsample(mel)))


class VoiceEncoder(nn.Module):
    """The voice lab's encoder: log-mel (B, 100, 2T) -> pre-quantisation values in [-1, 1], (B, G, T, L)."""

    def __init__(self, cfg: ModelConfig, hidden: int = 256, layers: int = 3):
        super().__init__()
        self.G, self.L = cfg.gfsq.groups, len(cfg.gfsq.levels)
        self.conv_in = nn.Sequential(nn.Conv1d(cfg.vocos.n_mels, hidden, 3, padding=1), nn.GELU())
        self.blocks = nn.ModuleList(ConvNeXtBlock(hidden, 4 * hidden, 7, 1) for _ in range(layers))
        self.down = nn.Conv1d(2 * hidden, hidden, 3, padding=1)
        self.proj = nn.Conv1d(hidden, self.G * self.L, 1)

    def forward(self, mel: Tensor) -> Tensor:
        x = self.conv_in(mel)
        for b in self.blocks:
            x = b(x)
        B, H, T2 = x.shape
        x = x.view(B, H, T2 // 2, 2).permute(0, 3, 1, 2).reshape(B, 2 * H, T2 // 2)
        z = torch.tanh(self.proj(F.gelu(self.down(x))).float())  # (B, G*L, T)
        return z.view(B, self.G, self.L, -1).transpose(2, 3)


def quantise(z: Tensor, residuals: int, levels: int = 5) -> tuple[Tensor, Tensor]:
    """z (B, G, T, L) in [-1, 1] -> (straight-through value (B, G, T, L), digits (B, G, R, T, L))."""
    half = (levels - 1) / 2
    value = torch.zeros_like(z)
    digits = []
    target = z
    for r in range(residuals):
        scale = levels**-r  # as GFSQ.forward (chattts 0.2.5 parity): residual r at 5 ** -r
        d = torch.clamp(torch.round(target / scale * half), -half, half)
        digits.append((d + half).long())
        value = value + d / half * scale
        target = z - value
    return z + (value - z).detach(), torch.stack(digits, 2)


def codes_from_digits(digits: Tensor, levels: int = 5) -> Tensor:
    """digits (B, G, R, T, L) -> codes (B, T, G*R) (codebook q = g * R + r, like GFSQ)."""
    L = digits.shape[-1]
    basis = levels ** torch.arange(L, device=digits.device)
    codes = (digits * basis).sum(-1)  # (B, G, R, T)
    B, G, R, T = codes.shape
    return codes.reshape(B, G * R, T).transpose(1, 2)


class VoiceCodes(nn.Module):
    """waveform (B, N) at 24 kHz -> codes (B, Q, T) with the voice lab's encoder, as its corpus made the GPT's codes."""

    def __init__(self, cfg: ModelConfig, hidden: int = 256):
        super().__init__()
        self.logmel = LogMel(cfg.vocos)
        self.encoder = VoiceEncoder(cfg, hidden)
        self.residuals = cfg.gfsq.residuals

    @property
    def sample_rate(self) -> int:
        return self.logmel.cfg.sample_rate

    def forward(self, wav: Tensor) -> Tensor:
        mel = self.logmel(wav.float())
        mel = mel[..., : mel.shape[-1] // 2 * 2]
        _, digits = quantise(self.encoder(mel), self.residuals)
        return codes_from_digits(digits).transpose(1, 2)

"""Feature-to-mel ConvNeXt stacks: the Decoder (GPT hidden states -> mel, ChatTTS's default path) and
the DVAE decoder (4-codebook codes -> GFSQ features -> mel). Both emit 2 mel frames per GPT step."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .config import ConvStackConfig, GFSQConfig
from .convnext import ConvNeXtBlock


class ConvBody(nn.Module):
    """(B, idim, T) -> (B, odim, T): bottleneck convs in, ConvNeXt blocks, a pointwise conv out (ChatTTS's
    DVAEDecoder class, which its DVAE encoder uses too)."""

    def __init__(self, cfg: ConvStackConfig):
        super().__init__()
        self.cfg = cfg
        self.conv_in = nn.Sequential(
            nn.Conv1d(cfg.idim, cfg.bn_dim, 3, padding=1), nn.GELU(), nn.Conv1d(cfg.bn_dim, cfg.hidden, 3, padding=1)
        )
        self.blocks = nn.ModuleList(
            ConvNeXtBlock(cfg.hidden, 4 * cfg.hidden, cfg.kernel, cfg.dilation) for _ in range(cfg.layers)
        )
        self.conv_out = nn.Conv1d(cfg.hidden, cfg.odim, 1, bias=False)

    def body(self, x: Tensor) -> Tensor:
        x = self.conv_in(x)
        for block in self.blocks:
            x = block(x)
        return self.conv_out(x)

    forward = body


class ConvStack(ConvBody):
    """(B, 2*idim, T) step features -> (B, n_mels, 2T) mel."""

    def __init__(self, cfg: ConvStackConfig):
        super().__init__(cfg)
        self.out_conv = nn.Conv1d(cfg.odim, cfg.n_mels, 3, padding=1, bias=False)
        self.register_buffer("coef", torch.ones(1, cfg.n_mels, 1))

    def forward(self, feats: Tensor) -> Tensor:
        B, C, T = feats.shape
        # channel halves become the even and odd mel frames of each step
        x = feats.view(B, 2, C // 2, T).permute(0, 2, 3, 1).reshape(B, C // 2, 2 * T)
        return self.out_conv(self.body(x)) * self.coef

    @property
    def receptive_radius(self) -> int:
        """How many mel frames on each side influence one output frame."""
        return 1 + 1 + sum(b.receptive_radius for b in self.blocks) + 1


class GFSQ(nn.Module):
    """Grouped residual finite scalar quantizer, decode direction only: codes -> features."""

    def __init__(self, cfg: GFSQConfig):
        super().__init__()
        self.cfg = cfg
        levels = torch.tensor(cfg.levels)
        self.register_buffer("levels", levels, persistent=False)
        basis = torch.cumprod(torch.tensor([1, *cfg.levels[:-1]]), 0)
        self.register_buffer("basis", basis, persistent=False)
        group_dim = cfg.dim // cfg.groups
        # per group: the residual quantizers share one output projection (codebook dim -> group dim)
        self.project_out = nn.ModuleList(nn.Linear(len(cfg.levels), group_dim) for _ in range(cfg.groups))

    def forward(self, codes: Tensor) -> Tensor:
        """codes (B, G*R, T) -> features (B, dim, T)"""
        B, _, T = codes.shape
        G, R = self.cfg.groups, self.cfg.residuals
        idx = codes.view(B, G, R, T).permute(1, 0, 3, 2)  # (G, B, T, R)
        digits = (idx[..., None] // self.basis) % self.levels  # (G, B, T, R, L)
        normalised = digits * (2.0 / (self.levels - 1)) - 1.0  # symmetric grid in [-1, 1]
        # residual quantizer r works at scale levels ** -r
        scales = torch.stack([self.levels.float() ** -r for r in range(R)])  # (R, L)
        summed = (normalised * scales).sum(-2)  # (G, B, T, L)
        out = [proj(summed[g].to(proj.weight.dtype)) for g, proj in enumerate(self.project_out)]
        return torch.cat(out, dim=-1).transpose(1, 2)


class DVAEDecoder(nn.Module):
    def __init__(self, stack: ConvStackConfig, gfsq: GFSQConfig):
        super().__init__()
        self.gfsq = GFSQ(gfsq)
        self.stack = ConvStack(stack)

    def forward(self, codes: Tensor) -> Tensor:
        """codes (B, Q, T) -> mel (B, n_mels, 2T)"""
        return self.stack(self.gfsq(codes))

"""The ConvNeXt block shared by the Decoder, the DVAE decoder and the Vocos backbone. x is (B, C, T)."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int, intermediate: int, kernel: int = 7, dilation: int = 1):
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, kernel, padding=dilation * (kernel // 2), dilation=dilation, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, intermediate)
        self.pwconv2 = nn.Linear(intermediate, dim)
        self.scale = nn.Parameter(torch.ones(dim))  # layer scale

    def forward(self, x: Tensor) -> Tensor:
        y = self.norm(self.dwconv(x).transpose(1, 2))
        y = self.pwconv2(nn.functional.gelu(self.pwconv1(y))) * self.scale
        return x + y.transpose(1, 2)

    @property
    def receptive_radius(self) -> int:
        return self.dwconv.dilation[0] * (self.dwconv.kernel_size[0] // 2)

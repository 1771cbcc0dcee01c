"""Speaker embeddings: a D-vector, L2-normalised, that replaces the input embedding at `[spk_emb]`."""

from __future__ import annotations

import torch
from torch import Tensor


def random_speaker(seed: int, stat: Tensor) -> Tensor:
    """stat (2, D) = (std, mean) of the voice space -> a reproducible (D,) speaker vector."""
    g = torch.Generator().manual_seed(int(seed))
    std, mean = stat.float().cpu()
    return torch.randn(std.shape[0], generator=g) * std + mean


def chattts_speaker(seed: int, stat: Tensor) -> Tensor:
    """ChatTTS's `torch.manual_seed(seed); sample_random_speaker()`: randn(D) drawn in float16 on the CPU, times
    std plus mean, all in float16 (ChatTTS keeps spk_stat in float16) -> (D,) float16. A private generator seeded
    the same way gives the global generator's numbers, and leaves the caller's random state alone."""
    g = torch.Generator().manual_seed(int(seed))
    std, mean = stat.cpu().half()
    return torch.randn(std.shape[0], generator=g, dtype=torch.float16).mul_(std).add_(mean)


def apply_speaker(emb: Tensor, is_spk_token: Tensor, speakers: Tensor) -> Tensor:
    """emb (B, T, D), is_spk_token (B, T) bool, speakers (B, D) -> emb with the normalised speaker placed."""
    spk = (
        speakers if speakers.dtype == torch.float16 else speakers.float()
    )  # ChatTTS normalises float16 ones in float16
    spk = torch.nn.functional.normalize(spk, dim=-1).to(emb.dtype)
    return torch.where(is_spk_token[..., None], spk[:, None, :], emb)

"""Speaker embeddings: a D-vector, L2-normalised, that replaces the input embedding at `[spk_emb]`."""
from __future__ import annotations

import torch
from torch import Tensor


def random_speaker(seed: int, stat: Tensor) -> Tensor:
    """stat (2, D) = (std, mean) of the voice space -> a reproducible (D,) speaker vector."""
    g = torch.Generator().manual_seed(int(seed))
    std, mean = stat.float().cpu()
    return torch.randn(std.shape[0], generator=g) * std + mean


def apply_speaker(emb: Tensor, is_spk_token: Tensor, speakers: Tensor) -> Tensor:
    """emb (B, T, D), is_spk_token (B, T) bool, speakers (B, D) -> emb with the normalised speaker placed."""
    spk = torch.nn.functional.normalize(speakers.float(), dim=-1).to(emb.dtype)
    return torch.where(is_spk_token[..., None], spk[:, None, :], emb)

"""The whole ChatTTS-architecture model: GPT, Decoder, optional DVAE decoder, Vocos, tokenizer, voices."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .config import ModelConfig
from .decoder import ConvStack, DVAEDecoder
from .gpt import GPT
from .tokenizer import Tokenizer
from .vocos import Vocos


class TTSModel(nn.Module):
    def __init__(self, cfg: ModelConfig, tokenizer: Tokenizer | None = None):
        super().__init__()
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.gpt = GPT(cfg.gpt)
        self.decoder = ConvStack(cfg.decoder)
        self.dvae = DVAEDecoder(cfg.dvae, cfg.gfsq) if cfg.dvae is not None else None
        self.vocos = Vocos(cfg.vocos)
        D = cfg.gpt.hidden
        self.register_buffer("spk_stat", torch.stack([torch.ones(D), torch.zeros(D)]))  # (std, mean)
        self.voices: dict[str, Tensor] = {}  # named (D,) speaker vectors shipped with the model

    @property
    def default_voice(self) -> str | None:
        """The voice a synthesis given no speaker uses: the first (load_ttsq puts the manifest's default_voice
        first)."""
        return next(iter(self.voices), None)

    @property
    def sample_rate(self) -> int:
        return self.cfg.vocos.sample_rate

    def hidden_to_mel(self, hidden: Tensor) -> Tensor:
        """hidden (B, T, D) -> mel (B, n_mels, 2T)"""
        return self.decoder(hidden.transpose(1, 2).to(self.decoder.out_conv.weight.dtype))

    def codes_to_mel(self, codes: Tensor) -> Tensor:
        """codes (B, T, Q) -> mel (B, n_mels, 2T)"""
        if self.dvae is None:
            raise ValueError("this model has no DVAE decoder; decode from hidden states instead")
        return self.dvae(codes.transpose(1, 2))

    def mel_to_wav(self, mel: Tensor) -> Tensor:
        return self.vocos(mel.to(self.vocos.embed.weight.dtype))

    def parameter_counts(self) -> dict[str, int]:
        parts = {"gpt": self.gpt, "decoder": self.decoder, "vocos": self.vocos}
        if self.dvae is not None:
            parts["dvae"] = self.dvae
        return {k: sum(p.numel() for p in m.parameters()) for k, m in parts.items()}

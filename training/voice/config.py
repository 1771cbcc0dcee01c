"""The shipped voice's model sizes (and the smoke test's tiny ones), and where its DVAE encoder lives."""

from __future__ import annotations

from pathlib import Path

import toolkit
from toolkit.checkpoint import VOICE_ENCODER
from toolkit.models.config import ConvStackConfig, GFSQConfig, GPTConfig, ModelConfig, VocosConfig

ENCODER_FILE = VOICE_ENCODER  # the DVAE encoder the voice's GPT codes come from, beside the voice
SHIPPED_ENCODER = Path(toolkit.__file__).resolve().parent / "assets" / "voice" / ENCODER_FILE


def voice_config(vocab: int, smoke: bool = False) -> ModelConfig:
    if smoke:
        return ModelConfig(
            gpt=GPTConfig(hidden=64, layers=2, heads=4, intermediate=128, max_positions=768, num_text_tokens=vocab),
            decoder=ConvStackConfig(idim=32, odim=32, hidden=64, layers=2, bn_dim=16),
            dvae=ConvStackConfig(idim=32, odim=32, hidden=64, layers=2, bn_dim=16),
            gfsq=GFSQConfig(dim=64),
            vocos=VocosConfig(dim=64, intermediate=128, layers=2),
        )
    return ModelConfig(
        gpt=GPTConfig(hidden=256, layers=6, heads=4, intermediate=640, max_positions=1536, num_text_tokens=vocab),
        decoder=ConvStackConfig(idim=128, odim=128, hidden=192, layers=4, bn_dim=64),
        dvae=ConvStackConfig(idim=128, odim=128, hidden=128, layers=3, bn_dim=64),
        gfsq=GFSQConfig(dim=256),
        vocos=VocosConfig(dim=256, intermediate=768, layers=4),
    )

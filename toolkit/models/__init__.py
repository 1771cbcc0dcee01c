"""ChatTTS-architecture model code. Imports nothing else of ttsq.

The names load lazily (PEP 562): toolkit.models.config is torch-free, so the edge runtime validates an exported
model's config with the same dataclasses without importing torch."""

from .config import ConvStackConfig, GFSQConfig, GPTConfig, ModelConfig, VocosConfig, tiny

__all__ = ["ConvStackConfig", "GFSQConfig", "GPTConfig", "ModelConfig", "VocosConfig", "TTSModel", "Tokenizer", "tiny"]


def __getattr__(name):
    if name == "Tokenizer":
        from .tokenizer import Tokenizer

        return Tokenizer
    if name == "TTSModel":
        from .tts import TTSModel

        return TTSModel
    raise AttributeError(f"module 'toolkit.models' has no attribute {name!r}")

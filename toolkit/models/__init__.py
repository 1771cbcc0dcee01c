"""ChatTTS-architecture model code. Imports nothing else of ttsq."""

from .config import ConvStackConfig, GFSQConfig, GPTConfig, ModelConfig, VocosConfig, tiny
from .tokenizer import Tokenizer
from .tts import TTSModel

__all__ = ["ConvStackConfig", "GFSQConfig", "GPTConfig", "ModelConfig", "VocosConfig", "TTSModel", "Tokenizer", "tiny"]

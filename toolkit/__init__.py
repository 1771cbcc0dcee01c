"""ttsq: fast, quantized, measured inference for ChatTTS-architecture speech synthesis.

    from toolkit import Synthesizer
    wavs = Synthesizer(device="cuda", precision="int8").synthesize(["Hello there."], seed=1)
"""
from .sampling import SamplingParams
from .synthesizer import DEFAULT_MODEL, Synthesizer, Utterance, load_model

__all__ = ["DEFAULT_MODEL", "SamplingParams", "Synthesizer", "Utterance", "load_model"]

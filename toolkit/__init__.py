"""ttsq: fast, quantized, measured inference for ChatTTS-architecture speech synthesis.

    from toolkit import Synthesizer
    wavs = Synthesizer(device="cuda", precision="int8").synthesize(["Hello there."], seed=1)

The names below load lazily (PEP 562), so torch-free parts (toolkit.runtime, toolkit.text) never import torch.
"""
__all__ = ["DEFAULT_MODEL", "OutOfMemory", "SamplingParams", "Synthesizer", "Utterance", "load_model"]


def __getattr__(name):
    if name == "SamplingParams":
        from .params import SamplingParams
        return SamplingParams
    if name in ("DEFAULT_MODEL", "OutOfMemory", "Synthesizer", "Utterance", "load_model"):
        from . import synthesizer
        return getattr(synthesizer, name)
    raise AttributeError(f"module 'toolkit' has no attribute {name!r}")

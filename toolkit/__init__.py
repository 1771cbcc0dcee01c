"""ttsq: fast, quantized, measured inference for ChatTTS-architecture speech synthesis.

    from toolkit import Synthesizer
    wavs = Synthesizer(device="cuda", precision="int8").synthesize(["Hello there."], seed=1)

The names below load lazily (PEP 562), so torch-free parts (toolkit.runtime, toolkit.text) never import torch.
"""

import os

# cuDNN keeps a host-side plan for every conv input shape it meets, up to 10,000 by default, and each render length
# is a new shape: a serving process's memory grew with every request until capped (benchmarks/README.md, soak.py).
# Read at the first cuDNN conv; an explicit setting wins.
os.environ.setdefault("TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT", "256")

__all__ = ["DEFAULT_MODEL", "OutOfMemory", "SamplingParams", "Synthesizer", "Utterance", "load_model"]


def __getattr__(name):
    if name == "SamplingParams":
        from .params import SamplingParams

        return SamplingParams
    if name in ("DEFAULT_MODEL", "OutOfMemory", "Synthesizer", "Utterance", "load_model"):
        from . import synthesizer

        return getattr(synthesizer, name)
    raise AttributeError(f"module 'toolkit' has no attribute {name!r}")

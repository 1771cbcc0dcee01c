"""The torch-free edge runtime: text -> 24 kHz WAV from a folder written by `ttsq export`.

Imports only numpy, onnxruntime, soundfile (for WAV writing) and ttsq's torch-free modules (toolkit.text,
toolkit.frontend, toolkit.params; the tokenizer is the pure-Python wordpiece.py).

    from toolkit.runtime import EdgeSynthesizer
    utt = EdgeSynthesizer("voice-int8").synthesize("Hello there.", seed=1)[0]
"""

from .engine import MANIFEST, is_exported
from .sampling import SamplingParams
from .synth import EdgeSynthesizer, Utterance

__all__ = ["EdgeSynthesizer", "MANIFEST", "SamplingParams", "Utterance", "is_exported", "write_wav"]


def write_wav(path, wav, sample_rate: int) -> None:
    import soundfile as sf

    sf.write(str(path), wav, sample_rate, subtype="PCM_16")

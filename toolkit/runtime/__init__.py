"""The torch-free edge runtime: text -> 24 kHz WAV from a folder written by `ttsq export`.

Imports only numpy, onnxruntime, soundfile (for WAV writing) and ttsq's torch-free modules (toolkit.text,
toolkit.frontend, toolkit.params, toolkit.audio and toolkit.fileio: the same atomic WAV writer as the torch path;
the tokenizer is the pure-Python wordpiece.py).

    from toolkit.runtime import EdgeSynthesizer
    utt = EdgeSynthesizer("voice-int8").synthesize("Hello there.", seed=1)[0]
"""

from ..audio import wav_writer, write_wav
from .engine import MANIFEST, is_exported
from .sampling import SamplingParams
from .synth import EdgeSynthesizer, Utterance

__all__ = ["EdgeSynthesizer", "MANIFEST", "SamplingParams", "Utterance", "is_exported", "wav_writer", "write_wav"]

"""Response formats of /v1/audio/speech: wav and pcm stream as the audio is generated; mp3, opus and flac are
encoded whole by libsndfile (soundfile) once the audio is complete; OpenAI's aac has no encoder here."""

from __future__ import annotations

import io
import struct

import numpy as np

STREAMED = {"wav": "audio/wav", "pcm": "audio/pcm"}
ENCODED = {
    "mp3": ("MP3", "MPEG_LAYER_III", "audio/mpeg"),
    "opus": ("OGG", "OPUS", "audio/ogg"),
    "flac": ("FLAC", "PCM_16", "audio/flac"),
}
UNKNOWN_LENGTH = 0xFFFFFFFF  # what streamed WAVs write for sizes not known yet; players read to the end


def supported() -> list[str]:
    import soundfile as sf

    have = sf.available_formats()
    return [*STREAMED, *(f for f, (container, _, _) in ENCODED.items() if container in have)]


def format_error(fmt: str) -> str | None:
    """Why `fmt` cannot be served, or None."""
    if fmt in supported():
        return None
    if fmt == "aac":
        return (
            "response_format 'aac' is not available: no AAC encoder is installed (libsndfile writes none); "
            f"use one of {', '.join(supported())}"
        )
    return f"response_format {fmt!r} is not one of {', '.join(supported())}"


def media_type(fmt: str) -> str:
    return STREAMED.get(fmt) or ENCODED[fmt][2]


def wav_header(sample_rate: int) -> bytes:
    """A 16-bit mono PCM WAV header whose RIFF and data sizes say "unknown" (the stream's length is not known)."""
    fmt = struct.pack("<HHIIHH", 1, 1, sample_rate, sample_rate * 2, 2, 16)
    return (
        b"RIFF"
        + struct.pack("<I", UNKNOWN_LENGTH)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + b"data"
        + struct.pack("<I", UNKNOWN_LENGTH)
    )


def pcm16(samples: np.ndarray) -> bytes:
    """float32 in [-1, 1] -> 16-bit little-endian PCM, rounded as libsndfile rounds (so `ttsq synth`'s WAV matches)."""
    return np.rint(np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()


def encode(samples: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    import soundfile as sf

    container, subtype, _ = ENCODED[fmt]
    buf = io.BytesIO()
    sf.write(buf, np.clip(samples, -1.0, 1.0), sample_rate, format=container, subtype=subtype)
    return buf.getvalue()

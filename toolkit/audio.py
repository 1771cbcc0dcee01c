"""WAV output: finite audio only, written atomically (the torch-free runtime's too), never over an existing file
unless asked, never through a link or onto a device; long audio streams to the file piece by piece."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from .fileio import atomic_file, check_output_file


def check_wav_path(path: str | Path, *, force: bool = False) -> Path:
    """The checks write_wav makes of its path, for callers that would otherwise find out only after synthesizing."""
    return check_output_file(path, force=force)


def _checked(wav: np.ndarray) -> np.ndarray:
    wav = np.asarray(wav, dtype=np.float32)
    if wav.ndim != 1:
        raise ValueError(f"expected mono audio (N,), got shape {wav.shape}")
    if not np.isfinite(wav).all():
        raise ValueError("refusing to write NaN/inf audio")
    return np.clip(wav, -1.0, 1.0)


@contextlib.contextmanager
def wav_writer(path: str | Path, sample_rate: int, *, force: bool = False) -> Iterator[Callable[[np.ndarray], None]]:
    """Yields write(wav) that appends mono float audio as 16-bit PCM; the file appears at `path` only once the block
    ends without an error (a failure leaves whatever was there untouched)."""
    import soundfile as sf

    with atomic_file(path, force=force) as tmp:
        with sf.SoundFile(str(tmp), "w", samplerate=sample_rate, channels=1, format="WAV", subtype="PCM_16") as f:
            yield lambda wav: f.write(_checked(wav))


def write_wav(path: str | Path, wav: np.ndarray, sample_rate: int, *, force: bool = False) -> Path:
    wav = _checked(wav)  # before a temporary file exists
    with wav_writer(path, sample_rate, force=force) as write:
        write(wav)
    return Path(path)

"""WAV output: finite audio only, written atomically, never over an existing file unless asked."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

from .fileio import OutputExistsError, atomic_write_bytes


def check_wav_path(path: str | Path, *, force: bool = False) -> Path:
    """The checks write_wav makes of its path, for callers that would otherwise find out only after synthesizing."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder; give a file name, e.g. {path / 'out.wav'}")
    if path.exists() and not force:
        raise OutputExistsError(f"{path} already exists; pass --force to overwrite it, or choose another path")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"folder {path.parent} does not exist; create it or choose another path")
    if not os.access(path.parent, os.W_OK):
        raise PermissionError(f"cannot write in {path.parent}: permission denied; choose a writable path")
    return path


def write_wav(path: str | Path, wav: np.ndarray, sample_rate: int, *, force: bool = False) -> Path:
    import soundfile as sf

    path = check_wav_path(path, force=force)
    wav = np.asarray(wav, dtype=np.float32)
    if wav.ndim != 1:
        raise ValueError(f"expected mono audio (N,), got shape {wav.shape}")
    if not np.isfinite(wav).all():
        raise ValueError("refusing to write NaN/inf audio")
    buf = io.BytesIO()
    sf.write(buf, np.clip(wav, -1.0, 1.0), sample_rate, format="WAV", subtype="PCM_16")
    try:
        atomic_write_bytes(path, buf.getvalue())
    except PermissionError as e:
        raise PermissionError(f"cannot write {path}: permission denied; choose a writable path") from e
    return path

"""espeak-ng's speech, the voice corpus's teacher: its six voices, at 24 kHz, silence trimmed."""

from __future__ import annotations

import io
import subprocess
import wave

import numpy as np

SPEAKERS = {"m1": "", "f2": "+f2", "m3": "+m3", "f4": "+f4", "m7": "+m7", "f5": "+f5"}
VOICE = {"en": "en-us", "zh": "cmn-latn-pinyin"}
SR = 24000


def espeak_wav(text: str, lang: str, speaker: str) -> np.ndarray:
    """-> float32 mono at 24 kHz."""
    from scipy.signal import resample_poly

    voice = VOICE[lang] + SPEAKERS[speaker]
    res = subprocess.run(["espeak-ng", "-v", voice, "--stdout", text], capture_output=True, check=True)
    with wave.open(io.BytesIO(res.stdout)) as w:
        sr = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    x = pcm.astype(np.float32) / 32768.0
    if sr != SR:
        from math import gcd

        g = gcd(SR, sr)
        x = resample_poly(x, SR // g, sr // g).astype(np.float32)
    return x


def trim(x: np.ndarray, thresh: float = 1e-3, pad: int = 2400) -> np.ndarray:
    """Trim leading/trailing silence to 0.1 s."""
    idx = np.flatnonzero(np.abs(x) > thresh)
    if len(idx) == 0:
        return x
    return x[max(0, idx[0] - pad) : idx[-1] + pad]

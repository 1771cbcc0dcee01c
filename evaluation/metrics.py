"""Objective audio metrics for comparing a precision's audio with FP32's.

Every function takes mono float waveforms (1-D numpy arrays, nominally in
[-1, 1]) plus their sample rate, resamples with :func:`resample` to the rate
the metric is defined at, and raises :class:`ValueError` naming the problem
for bad input (wrong dimensionality, non-float dtype, NaN/Inf samples, empty
or too-short audio, bad sample rate).

Two kinds of comparison, since audio from identical inputs lines up sample by
sample and audio from sampled tokens does not:

* sample-aligned stages (decoder, vocoder on identical inputs):
  ``mcd(..., align="none")``, :func:`pesq_wb`, :func:`stoi`,
  :func:`log_mel_distance`. These truncate both signals to the shorter one.
* differently-timed audio (whole pipeline, sampled tokens):
  ``mcd(..., align="dtw")`` and the reference-free :func:`dnsmos`.

:func:`bootstrap_ci` / :func:`bootstrap_diff_ci` put confidence intervals on
per-utterance scores.

Only numpy is imported at module import time; scipy, librosa, pysptk, pesq,
pystoi and speechmos are imported on first use (``pip install ttsq[eval]``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "MCDSettings",
    "MCDResult",
    "mcd",
    "mel_cepstrum",
    "cepstral_distance",
    "dnsmos",
    "pesq_wb",
    "stoi",
    "log_mel_distance",
    "bootstrap_ci",
    "bootstrap_diff_ci",
    "resample",
]

Align = Literal["dtw", "none"]
FloatArray = NDArray[np.float64]

#: (10 / ln 10) * sqrt(2): converts a Euclidean mel-cepstral distance to dB.
MCD_CONST_DB: float = 10.0 / math.log(10.0) * math.sqrt(2.0)

#: ESPnet's sptk_extract: eps added to the periodogram, etype=1.
_MCEP_EPS: float = 1e-6
#: ESPnet reads wavs as int16; mcep runs on that scale (matters for the eps floor).
_INT16_SCALE: float = 32768.0
#: Refuse DTW problems larger than this many frame pairs (peak memory is about
#: 16 bytes per cell: 40M cells, e.g. 6300 x 6300 frames = 31 s each at a 5 ms
#: hop, need ~0.65 GB).
MAX_DTW_CELLS: int = 40_000_000

PESQ_SR: int = 16000
DNSMOS_SR: int = 16000
LOG_MEL_SR: int = 24000
LOG_MEL_N_FFT: int = 1024
LOG_MEL_HOP: int = 256
LOG_MEL_N_MELS: int = 100
LOG_MEL_FLOOR: float = 1e-5

#: Shortest audio accepted (seconds). PESQ needs >= 1/4 s; STOI needs 30
#: frames of 256 samples, hop 128, at 10 kHz (~0.4 s) after silence removal;
#: DNSMOS tiles short clips to 9 s, which is meaningless for tiny clips.
MIN_PESQ_SECONDS: float = 0.25
MIN_STOI_SECONDS: float = 0.4
MIN_DNSMOS_SECONDS: float = 0.5


# --------------------------------------------------------------------------
# input validation and resampling
# --------------------------------------------------------------------------


def _check_sr(sr: object, name: str = "sr") -> int:
    if isinstance(sr, (bool, np.bool_)) or not isinstance(sr, (int, np.integer)):
        if isinstance(sr, (float, np.floating)) and float(sr).is_integer() and sr > 0:
            return int(sr)
        raise ValueError(f"{name} must be a positive integer sample rate, got {sr!r}")
    if sr <= 0:
        raise ValueError(f"{name} must be a positive integer sample rate, got {sr!r}")
    return int(sr)


def _check_wav(wav: ArrayLike, name: str) -> FloatArray:
    """Return ``wav`` as a contiguous float64 1-D array or raise ValueError."""
    arr = np.asarray(wav)
    if arr.dtype.kind != "f":
        raise ValueError(f"{name} must hold floating-point samples (nominally in [-1, 1]), got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D mono audio, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty (0 samples)")
    bad = int(np.count_nonzero(~np.isfinite(arr)))
    if bad:
        raise ValueError(f"{name} contains {bad} non-finite sample(s) (NaN or Inf)")
    return np.ascontiguousarray(arr, dtype=np.float64)


def _check_min_samples(wav: FloatArray, name: str, min_samples: int, sr: int, why: str) -> None:
    if wav.shape[0] < min_samples:
        raise ValueError(
            f"{name} is too short: {wav.shape[0]} samples at {sr} Hz "
            f"({wav.shape[0] / sr:.3f} s), need at least {min_samples} ({why})"
        )


def _check_not_silent(wav: FloatArray, name: str) -> None:
    if not np.any(wav):
        raise ValueError(f"{name} is all zeros (digital silence)")


def resample(wav: ArrayLike, sr_from: int, sr_to: int) -> FloatArray:
    """Resample a mono waveform with a polyphase filter (``scipy.signal.resample_poly``).

    Returns float64. Equal rates return a float64 copy. Output length is
    ``ceil(len * sr_to / sr_from)``.
    """
    x = _check_wav(wav, "wav")
    sr_from = _check_sr(sr_from, "sr_from")
    sr_to = _check_sr(sr_to, "sr_to")
    if sr_from == sr_to:
        return x.copy()
    from scipy.signal import resample_poly

    g = math.gcd(sr_from, sr_to)
    return np.ascontiguousarray(resample_poly(x, sr_to // g, sr_from // g), dtype=np.float64)


def _prepare(wav: ArrayLike, sr: int, target_sr: int, name: str) -> FloatArray:
    x = _check_wav(wav, name)
    sr = _check_sr(sr)
    return resample(x, sr, target_sr) if sr != target_sr else x


def _prepare_pair(ref: ArrayLike, test: ArrayLike, sr: int, target_sr: int) -> tuple[FloatArray, FloatArray]:
    """Validate, resample to ``target_sr`` and truncate both to the shorter."""
    r = _prepare(ref, sr, target_sr, "ref")
    t = _prepare(test, sr, target_sr, "test")
    n = min(r.shape[0], t.shape[0])
    return r[:n], t[:n]


# --------------------------------------------------------------------------
# MCD
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class MCDSettings:
    """Mel-cepstral distortion settings (ESPnet definition, SPTK mel-cepstra).

    Mel-cepstra come from ``pysptk.mcep`` (SPTK mel-cepstral analysis, the
    iterative UELS fit) on Hamming-windowed frames, exactly as ESPnet's
    ``evaluate_mcd.py`` (``sptk_extract``) does: SPTK's power-normalised
    Hamming window, ``etype=1, eps=1e-6``, audio on the int16 scale, no
    padding (``(len - fft_size) // hop + 1`` frames). ``order`` 34 and
    ``alpha`` 0.46 are ESPnet's choice for 24 kHz. Unlike ESPnet's script we
    use a 5 ms hop (ESPnet: 256 samples) and leave c0 (energy) out of the
    distance. No silence removal (ESPnet does none either).
    """

    sample_rate: int = 24000
    order: int = 34
    alpha: float = 0.46
    frame_shift_ms: float = 5.0
    fft_size: int = 1024

    def __post_init__(self) -> None:
        _check_sr(self.sample_rate, "sample_rate")
        if not isinstance(self.order, (int, np.integer)) or self.order < 1:
            raise ValueError(f"order must be an integer >= 1, got {self.order!r}")
        if not -1.0 < float(self.alpha) < 1.0:
            raise ValueError(f"alpha must be in (-1, 1), got {self.alpha!r}")
        n = int(self.fft_size)
        if n != self.fft_size or n < 16 or n & (n - 1):
            raise ValueError(f"fft_size must be a power of two >= 16, got {self.fft_size!r}")
        if self.order >= n // 2:
            raise ValueError(f"order {self.order} must be < fft_size/2 ({n // 2})")
        if not math.isfinite(self.frame_shift_ms) or self.hop_samples < 1:
            raise ValueError(
                f"frame_shift_ms={self.frame_shift_ms!r} gives a hop below one sample at {self.sample_rate} Hz"
            )

    @property
    def hop_samples(self) -> int:
        """Frame shift in samples at :attr:`sample_rate`."""
        return int(round(self.sample_rate * self.frame_shift_ms / 1000.0))

    def describe(self) -> str:
        """One line that should accompany every reported MCD number."""
        return (
            f"MCD (ESPnet definition): SPTK mel-cepstrum via pysptk.mcep (etype=1, "
            f"eps={_MCEP_EPS:g}, int16 scale) of {self.fft_size}-sample SPTK-Hamming frames, "
            f"hop {self.hop_samples} samples ({self.frame_shift_ms:g} ms) at "
            f"{self.sample_rate} Hz, order {self.order}, alpha {self.alpha:g}, no padding; "
            f"MCD = (10/ln10)*sqrt(2*sum_d=1..{self.order} (c_d-c'_d)^2) in dB, c0 excluded, "
            f"averaged over aligned frames, no silence removal"
        )


@dataclass(frozen=True)
class MCDResult:
    """Result of :func:`mcd`. ``frames`` is the number of frame pairs averaged."""

    value_db: float
    frames: int
    settings: MCDSettings
    align: Align = "dtw"

    def describe(self) -> str:
        how = (
            "DTW (Euclidean cost, steps (1,1),(1,0),(0,1))"
            if self.align == "dtw"
            else ("frame index (truncated to the shorter)")
        )
        return f"{self.value_db:.3f} dB over {self.frames} frame pairs aligned by {how}; {self.settings.describe()}"


def _import_pysptk() -> ModuleType:
    with warnings.catch_warnings():
        # pysptk 1.0.1 imports pkg_resources (deprecated; gone in setuptools>=81).
        warnings.filterwarnings("ignore", message=".*pkg_resources.*")
        import pysptk

    return pysptk


@lru_cache(maxsize=8)
def _sptk_hamming(n: int) -> FloatArray:
    return np.asarray(_import_pysptk().sptk.hamming(n), dtype=np.float64)


def mel_cepstrum(wav: ArrayLike, sr: int, settings: MCDSettings = MCDSettings()) -> FloatArray:
    """SPTK mel-cepstra, shape ``(frames, order + 1)`` with c0 in column 0.

    Resamples to ``settings.sample_rate``. SPTK runs frame by frame in Python
    (slow on long audio), so cache the reference's cepstra and use :func:`cepstral_distance` when one
    reference is compared with many test signals.
    """
    s = settings
    x = _prepare(wav, sr, s.sample_rate, "wav")
    _check_min_samples(x, "wav", s.fft_size, s.sample_rate, "one MCD analysis frame")
    pysptk = _import_pysptk()
    hop = s.hop_samples
    n_frames = (x.shape[0] - s.fft_size) // hop + 1
    frames = np.lib.stride_tricks.sliding_window_view(x * _INT16_SCALE, s.fft_size)[::hop][:n_frames]
    windowed = frames * _sptk_hamming(s.fft_size)
    out = np.empty((n_frames, s.order + 1), dtype=np.float64)
    for i in range(n_frames):
        try:
            out[i] = pysptk.mcep(
                np.ascontiguousarray(windowed[i]),
                order=s.order,
                alpha=s.alpha,
                etype=1,
                eps=_MCEP_EPS,
            )
        except RuntimeError as exc:  # SPTK's iteration can fail on pathological frames
            raise ValueError(
                f"mel-cepstral analysis failed at frame {i} ({i * hop / s.sample_rate:.3f} s): {exc}"
            ) from exc
    return out


def _dtw_path(cost: FloatArray) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """Exact DTW on a cost matrix, steps (1,1), (1,0), (0,1), all weight 1.

    Vectorised over anti-diagonals (numpy only, no numba). Returns the index
    arrays of the optimal path from (0, 0) to (N-1, M-1).
    """
    n, m = cost.shape
    acc = np.full((n + 1, m + 1), np.inf)
    acc[0, 0] = 0.0
    for k in range(2, n + m + 1):  # k = i + j in 1-based accumulated indices
        i = np.arange(max(1, k - m), min(n, k - 1) + 1)
        j = k - i
        best = np.minimum(np.minimum(acc[i - 1, j - 1], acc[i - 1, j]), acc[i, j - 1])
        acc[i, j] = cost[i - 1, j - 1] + best
    # backtrack; ties prefer the diagonal step
    i, j = n, m
    path_i = [n - 1]
    path_j = [m - 1]
    while i > 1 or j > 1:
        diag = acc[i - 1, j - 1]
        up = acc[i - 1, j]
        left = acc[i, j - 1]
        if diag <= up and diag <= left:
            i, j = i - 1, j - 1
        elif up <= left:
            i -= 1
        else:
            j -= 1
        path_i.append(i - 1)
        path_j.append(j - 1)
    return np.asarray(path_i[::-1], dtype=np.intp), np.asarray(path_j[::-1], dtype=np.intp)


def cepstral_distance(
    ref_mc: ArrayLike,
    test_mc: ArrayLike,
    align: Align = "dtw",
    *,
    exclude_c0: bool = True,
) -> tuple[float, int]:
    """MCD in dB between two mel-cepstrum sequences ``(frames, dims)``.

    ``(10/ln10) * sqrt(2 * sum_d (c_d - c'_d)^2)`` averaged over aligned frame
    pairs; ``exclude_c0`` drops column 0 from both alignment and distance.
    ``align="none"`` pairs frames by index (truncated to the shorter);
    ``align="dtw"`` uses the exact DTW path with a Euclidean cost on the same
    coefficients. Returns ``(value_db, number_of_frame_pairs)``.
    """
    a = np.asarray(ref_mc, dtype=np.float64)
    b = np.asarray(test_mc, dtype=np.float64)
    for name, c in (("ref_mc", a), ("test_mc", b)):
        if c.ndim != 2 or c.shape[0] == 0:
            raise ValueError(f"{name} must be a non-empty (frames, dims) array, got shape {c.shape}")
        if not np.all(np.isfinite(c)):
            raise ValueError(f"{name} contains non-finite values")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"cepstra have different dims: {a.shape[1]} vs {b.shape[1]}")
    if exclude_c0:
        if a.shape[1] < 2:
            raise ValueError("need at least 2 coefficients to exclude c0")
        a, b = a[:, 1:], b[:, 1:]
    if align == "none":
        n = min(a.shape[0], b.shape[0])
        d = np.sqrt(np.sum((a[:n] - b[:n]) ** 2, axis=1))
    elif align == "dtw":
        cells = a.shape[0] * b.shape[0]
        if cells > MAX_DTW_CELLS:
            raise ValueError(
                f"DTW over {a.shape[0]} x {b.shape[0]} frames is too large "
                f"(> {MAX_DTW_CELLS} cells); split the audio into shorter pieces"
            )
        # pairwise Euclidean distances in place, without an (N, M, D) intermediate
        cost = a @ b.T
        cost *= -2.0
        cost += (a * a).sum(1)[:, None]
        cost += (b * b).sum(1)[None, :]
        np.maximum(cost, 0.0, out=cost)
        np.sqrt(cost, out=cost)
        pi, pj = _dtw_path(cost)
        d = np.sqrt(np.sum((a[pi] - b[pj]) ** 2, axis=1))  # exact, not from the Gram trick
    else:
        raise ValueError(f"align must be 'dtw' or 'none', got {align!r}")
    return float(MCD_CONST_DB * np.mean(d)), int(d.shape[0])


def mcd(
    ref: ArrayLike,
    test: ArrayLike,
    sr: int,
    settings: MCDSettings = MCDSettings(),
    align: Align = "dtw",
) -> MCDResult:
    """Mel-cepstral distortion of ``test`` against ``ref`` (both at ``sr``).

    See :class:`MCDSettings` for the definition. Use ``align="none"`` for
    sample-aligned stages and ``align="dtw"`` for differently-timed audio.
    """
    if align not in ("dtw", "none"):
        raise ValueError(f"align must be 'dtw' or 'none', got {align!r}")
    r = _check_wav(ref, "ref")
    t = _check_wav(test, "test")
    sr = _check_sr(sr)
    try:
        mc_r = mel_cepstrum(r, sr, settings)
    except ValueError as exc:
        raise ValueError(f"ref: {exc}") from exc
    try:
        mc_t = mel_cepstrum(t, sr, settings)
    except ValueError as exc:
        raise ValueError(f"test: {exc}") from exc
    value, frames = cepstral_distance(mc_r, mc_t, align=align, exclude_c0=True)
    return MCDResult(value_db=value, frames=frames, settings=settings, align=align)


# --------------------------------------------------------------------------
# PESQ, STOI, log-mel distance
# --------------------------------------------------------------------------


def pesq_wb(ref: ArrayLike, test: ArrayLike, sr: int) -> float:
    """Wide-band PESQ (ITU-T P.862.2, MOS-LQO 1.04..4.64) at 16 kHz.

    Both signals are resampled to 16 kHz and truncated to the shorter.
    """
    r, t = _prepare_pair(ref, test, sr, PESQ_SR)
    for name, x in (("ref", r), ("test", t)):
        _check_min_samples(x, name, int(MIN_PESQ_SECONDS * PESQ_SR), PESQ_SR, "PESQ needs >= 0.25 s")
    _check_not_silent(r, "ref")
    _check_not_silent(t, "test")  # pesq would divide by zero on its own
    from pesq import PesqError, pesq

    try:
        return float(pesq(PESQ_SR, r, t, "wb"))
    except (PesqError, ValueError) as exc:
        raise ValueError(f"PESQ failed: {type(exc).__name__}: {exc}") from exc


def stoi(ref: ArrayLike, test: ArrayLike, sr: int, extended: bool = False) -> float:
    """STOI (pystoi; ``extended=True`` gives ESTOI), 0..1, higher is better.

    Both signals are truncated to the shorter and passed at their own rate:
    pystoi resamples to 10 kHz with its MATLAB-compatible resampler, which
    keeps the numbers comparable with the reference implementation.
    """
    sr = _check_sr(sr)
    r, t = _prepare_pair(ref, test, sr, sr)
    for name, x in (("ref", r), ("test", t)):
        _check_min_samples(x, name, int(math.ceil(MIN_STOI_SECONDS * sr)), sr, "STOI needs 30 frames")
    _check_not_silent(r, "ref")
    from pystoi import stoi as _pystoi

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        try:
            return float(_pystoi(r, t, sr, extended=extended))
        except RuntimeWarning as exc:
            raise ValueError(f"STOI: too little non-silent reference audio ({exc})") from exc


@lru_cache(maxsize=4)
def _mel_basis(sr: int, n_fft: int, n_mels: int) -> FloatArray:
    """Triangular mel filterbank ``(n_mels, n_fft//2 + 1)``: HTK mel scale, no
    area normalisation, 0..sr/2 -- torchaudio's MelSpectrogram defaults, which
    Vocos (ChatTTS's vocoder front-end) uses; equals
    ``librosa.filters.mel(..., htk=True, norm=None)``."""
    freqs = np.linspace(0.0, sr / 2.0, n_fft // 2 + 1)
    mel_max = 2595.0 * np.log10(1.0 + (sr / 2.0) / 700.0)
    f_pts = 700.0 * (10.0 ** (np.linspace(0.0, mel_max, n_mels + 2) / 2595.0) - 1.0)
    f_diff = np.diff(f_pts)
    slopes = f_pts[None, :] - freqs[:, None]
    down = -slopes[:, :-2] / f_diff[:-1]
    up = slopes[:, 2:] / f_diff[1:]
    return np.ascontiguousarray(np.maximum(0.0, np.minimum(down, up)).T)


def _log_mel(x: FloatArray) -> FloatArray:
    """Vocos-style features: log(clip(|STFT| @ mel, 1e-5)), centre-padded, periodic Hann."""
    pad = LOG_MEL_N_FFT // 2
    xp = np.pad(x, (pad, pad), mode="reflect")
    n_frames = 1 + (xp.shape[0] - LOG_MEL_N_FFT) // LOG_MEL_HOP
    frames = np.lib.stride_tricks.sliding_window_view(xp, LOG_MEL_N_FFT)[::LOG_MEL_HOP][:n_frames]
    window = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(LOG_MEL_N_FFT) / LOG_MEL_N_FFT)
    mag = np.abs(np.fft.rfft(frames * window, axis=1))
    mel = mag @ _mel_basis(LOG_MEL_SR, LOG_MEL_N_FFT, LOG_MEL_N_MELS).T
    return np.log(np.maximum(mel, LOG_MEL_FLOOR))


def log_mel_distance(ref: ArrayLike, test: ArrayLike, sr: int) -> float:
    """Mean absolute difference of natural-log mel magnitudes (sample-aligned).

    Features match the ChatTTS/Vocos decoder front-end at 24 kHz: 100 mel bins
    (HTK, unnormalised, 0..12 kHz), n_fft 1024, hop 256, centred periodic Hann,
    magnitude (power 1), ``log(max(mel, 1e-5))``. Both signals are resampled to
    24 kHz and truncated to the shorter. 0 means identical features.
    """
    r, t = _prepare_pair(ref, test, sr, LOG_MEL_SR)
    for name, x in (("ref", r), ("test", t)):
        _check_min_samples(x, name, LOG_MEL_N_FFT, LOG_MEL_SR, "one log-mel frame")
    return float(np.mean(np.abs(_log_mel(r) - _log_mel(t))))


# --------------------------------------------------------------------------
# DNSMOS
# --------------------------------------------------------------------------


def dnsmos(wav: ArrayLike, sr: int) -> dict[str, float]:
    """Reference-free DNSMOS P.835 (+ P.808) scores via ``speechmos`` (offline).

    Resamples to 16 kHz and clips to [-1, 1]; clips shorter than 9 s are tiled
    by speechmos. Returns ``{"ovrl", "sig", "bak", "p808"}`` (MOS, 1..5).
    speechmos keeps its ONNX Runtime sessions in a module global, so they are
    created once per process and repeated calls are cheap.
    """
    x = _prepare(wav, sr, DNSMOS_SR, "wav")
    _check_min_samples(x, "wav", int(MIN_DNSMOS_SECONDS * DNSMOS_SR), DNSMOS_SR, "DNSMOS minimum")
    x = np.clip(x, -1.0, 1.0)
    from speechmos import dnsmos as _dnsmos

    out = _dnsmos.run(x, sr=DNSMOS_SR)
    return {
        "ovrl": float(out["ovrl_mos"]),
        "sig": float(out["sig_mos"]),
        "bak": float(out["bak_mos"]),
        "p808": float(out["p808_mos"]),
    }


# --------------------------------------------------------------------------
# bootstrap confidence intervals
# --------------------------------------------------------------------------


def _check_values(values: ArrayLike, name: str) -> FloatArray:
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {v.shape}")
    if v.size == 0:
        raise ValueError(f"{name} is empty")
    if not np.all(np.isfinite(v)):
        raise ValueError(f"{name} contains non-finite values")
    return v


def bootstrap_ci(
    values: ArrayLike,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Percentile bootstrap CI of the mean: returns ``(mean, lo, hi)``.

    Deterministic for a given ``seed``. Vectorised in chunks of at most
    ~4M resampled values, so memory stays bounded for large inputs.
    """
    v = _check_values(values, "values")
    if int(n_resamples) != n_resamples or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    n_resamples = int(n_resamples)
    n = v.shape[0]
    rng = np.random.default_rng(seed)
    means = np.empty(n_resamples, dtype=np.float64)
    chunk = max(1, 4_000_000 // n)
    for start in range(0, n_resamples, chunk):
        stop = min(n_resamples, start + chunk)
        idx = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = v[idx].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(means, [tail, 1.0 - tail])
    return float(v.mean()), float(lo), float(hi)


def bootstrap_diff_ci(
    a: ArrayLike,
    b: ArrayLike,
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Paired bootstrap CI of ``mean(a - b)``: returns ``(mean_diff, lo, hi)``.

    ``a[i]`` and ``b[i]`` must be scores of the same item (utterance).
    """
    x = _check_values(a, "a")
    y = _check_values(b, "b")
    if x.shape != y.shape:
        raise ValueError(f"a and b must be paired (same length), got {x.shape[0]} and {y.shape[0]}")
    return bootstrap_ci(x - y, n_resamples=n_resamples, confidence=confidence, seed=seed)

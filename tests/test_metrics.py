"""Tests for evaluation.metrics on real (espeak-ng) or speech-like synthetic audio.

Expensive things (test audio, mel-cepstra, the noise ladder, DNSMOS) are shared
at module scope so the whole file stays well under a minute on 2 cores.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("scipy")
pytest.importorskip("pysptk")

from evaluation import metrics as M  # noqa: E402

SR = 24000
SENTENCE = "The birch canoe slid on the smooth planks."
SNRS = (30, 20, 10, 0)
HAVE_ESPEAK = shutil.which("espeak-ng") is not None


# --------------------------------------------------------------------------
# test audio
# --------------------------------------------------------------------------


def _espeak(text: str, tmp: Path, *args: str) -> np.ndarray:
    import soundfile as sf

    out = tmp / f"espeak_{abs(hash((text, args)))}.wav"
    subprocess.run(["espeak-ng", *args, "-w", str(out), text], check=True, capture_output=True)
    x, sr = sf.read(out, dtype="float64")
    return M.resample(x, sr, SR)


def _synthetic_speech(seconds: float = 2.5, seed: int = 0) -> np.ndarray:
    """Fallback without espeak-ng: a glottal pulse train with intonation and
    spectral tilt through a parallel bank of three vowel formants that change
    every 120 ms, with a syllabic envelope and pauses."""
    from scipy.signal import lfilter

    rng = np.random.default_rng(seed)
    n = int(seconds * SR)
    t = np.arange(n) / SR
    f0 = 120.0 + 25.0 * np.sin(2 * np.pi * 0.7 * t) + 5.0 * np.sin(2 * np.pi * 5.0 * t)
    src = np.diff(np.floor(np.cumsum(f0) / SR), prepend=0.0)  # one impulse per period
    src = lfilter([1.0], [1.0, -0.95], src) + 0.01 * rng.standard_normal(n)
    seg = int(0.12 * SR)
    vowels = [(730, 1090, 2440), (270, 2290, 3010), (570, 840, 2410), (530, 1840, 2480), (300, 870, 2240)]
    out = np.zeros(n)
    for s0 in range(0, n, seg):
        y = src[max(0, s0 - 600) : s0 + seg]  # 25 ms of history lets the resonators ring in
        acc = np.zeros_like(y)
        for fc, bw, gain in zip(vowels[(s0 // seg) % len(vowels)], (90, 110, 160), (1.0, 0.5, 0.25)):
            r = math.exp(-math.pi * bw / SR)
            acc += gain * lfilter([1 - r * r], [1, -2 * r * math.cos(2 * math.pi * fc / SR), r * r], y)
        acc = acc[len(y) - min(seg, n - s0) :]
        out[s0 : s0 + len(acc)] = acc
    env = (np.sin(2 * np.pi * 1.1 * t + 1.0) > -0.7).astype(float)
    out *= np.convolve(env, np.hanning(1200) / np.hanning(1200).sum(), mode="same")
    return 0.5 * out / np.max(np.abs(out))


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    if HAVE_ESPEAK:
        return _espeak(SENTENCE, tmp_path_factory.mktemp("espeak"))
    return _synthetic_speech()


def _add_noise(x: np.ndarray, snr_db: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal(x.shape[0])
    noise *= math.sqrt(np.mean(x**2) / np.mean(noise**2) / 10 ** (snr_db / 10))
    return x + noise


@pytest.fixture(scope="module")
def ref_mc(speech: np.ndarray) -> np.ndarray:
    return M.mel_cepstrum(speech, SR)


@pytest.fixture(scope="module")
def ladder(speech: np.ndarray, ref_mc: np.ndarray) -> dict[str, list[float]]:
    """Every metric on clean speech (first entry) and at each SNR in SNRS."""
    rows: dict[str, list[float]] = {
        k: [] for k in ("mcd_none", "mcd_dtw", "log_mel", "pesq", "stoi", "ovrl", "bak", "p808")
    }
    for i, snr in enumerate((None, *SNRS)):
        y = speech if snr is None else _add_noise(speech, snr, seed=i)
        mc = ref_mc if snr is None else M.mel_cepstrum(y, SR)
        rows["mcd_none"].append(M.cepstral_distance(ref_mc, mc, "none")[0])
        rows["mcd_dtw"].append(M.cepstral_distance(ref_mc, mc, "dtw")[0])
        rows["log_mel"].append(M.log_mel_distance(speech, y, SR))
        rows["pesq"].append(M.pesq_wb(speech, y, SR))
        rows["stoi"].append(M.stoi(speech, y, SR))
        d = M.dnsmos(y, SR)
        for k in ("ovrl", "bak", "p808"):
            rows[k].append(d[k])
    return rows


# --------------------------------------------------------------------------
# identical inputs, noise ladder, alignment
# --------------------------------------------------------------------------


def test_identical_inputs_are_perfect(speech: np.ndarray) -> None:
    clip = speech[:SR]  # 1 s keeps the two mcd() calls cheap
    for align in ("none", "dtw"):
        res = M.mcd(clip, clip, SR, align=align)
        assert res.value_db == 0.0
        assert res.frames == (SR - 1024) // 120 + 1
        assert res.align == align and res.settings == M.MCDSettings()
        assert "c0 excluded" in res.describe()
    assert M.pesq_wb(speech, speech, SR) > 4.0
    assert M.stoi(speech, speech, SR) == pytest.approx(1.0, abs=1e-6)
    assert M.log_mel_distance(speech, speech, SR) == 0.0


@pytest.mark.parametrize(
    "metric, worse",
    [
        ("mcd_none", "up"),
        ("mcd_dtw", "up"),
        ("log_mel", "up"),
        ("pesq", "down"),
        ("stoi", "down"),
        ("ovrl", "down"),
        ("bak", "down"),
        ("p808", "down"),
    ],
)
def test_more_noise_is_monotonically_worse(ladder: dict[str, list[float]], metric: str, worse: str) -> None:
    v = np.asarray(ladder[metric])  # clean, 30, 20, 10, 0 dB SNR
    if metric in ("ovrl", "bak", "p808"):
        if not HAVE_ESPEAK:
            pytest.skip("DNSMOS is only meaningful on speech; espeak-ng is not installed")
        # DNSMOS has no reference: a little noise can lift OVRL of robotic
        # espeak speech above the clean clip, so compare the noisy levels only,
        # plus clean against 0 dB.
        assert v[0] > v[-1] + 0.5, f"{metric}: clean {v[0]} vs 0 dB {v[-1]}"
        v = v[1:]
    steps = np.diff(v) if worse == "up" else -np.diff(v)
    assert np.all(steps > 0), f"{metric} not monotonic over (clean,) {SNRS} dB: {v}"


def test_noise_ladder_magnitudes(ladder: dict[str, list[float]]) -> None:
    assert ladder["mcd_none"][0] == 0.0 and ladder["log_mel"][0] == 0.0
    assert ladder["pesq"][0] > 4.5 and ladder["pesq"][-1] < 1.5
    assert ladder["stoi"][1] > 0.97 and ladder["stoi"][-1] < 0.95
    # DTW can only shorten the distance of an index-aligned pair (its path
    # minimises the summed cost), so its mean stays close to plain's.
    for plain, dtw in zip(ladder["mcd_none"], ladder["mcd_dtw"]):
        assert dtw <= plain * 1.02 + 1e-9


def test_dtw_recovers_shifted_and_stretched_copies(speech: np.ndarray, ref_mc: np.ndarray) -> None:
    from scipy.signal import resample_poly

    shifted = np.concatenate([np.zeros(int(0.037 * SR)), speech])[: speech.shape[0]]
    stretched = resample_poly(speech, 11, 10)  # 10 % slower (and lower)
    for y in (shifted, stretched):
        mc = M.mel_cepstrum(y, SR)
        plain, _ = M.cepstral_distance(ref_mc, mc, "none")
        dtw, frames = M.cepstral_distance(ref_mc, mc, "dtw")
        assert dtw < 0.5 * plain, (dtw, plain)
        assert frames >= max(ref_mc.shape[0], mc.shape[0])


# --------------------------------------------------------------------------
# building blocks
# --------------------------------------------------------------------------


def test_cepstral_distance_formula() -> None:
    a = np.array([[5.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    b = np.array([[-3.0, 3.0, 4.0], [9.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    k = 10 / math.log(10) * math.sqrt(2)
    value, frames = M.cepstral_distance(a, b, "none")  # c0 ignored, 3rd frame truncated
    assert frames == 2 and value == pytest.approx(k * (5.0 + 0.0) / 2)
    value, _ = M.cepstral_distance(a, b, "none", exclude_c0=False)
    assert value == pytest.approx(k * (math.sqrt(64 + 25) + 8.0) / 2)


def test_dtw_is_exact_against_librosa() -> None:
    from librosa.sequence import dtw as librosa_dtw

    rng = np.random.default_rng(3)
    cost = rng.random((37, 51))
    pi, pj = M._dtw_path(cost)
    acc, _ = librosa_dtw(
        C=cost, step_sizes_sigma=np.array([[1, 1], [0, 1], [1, 0]]), weights_add=np.zeros(3), weights_mul=np.ones(3)
    )
    assert cost[pi, pj].sum() == pytest.approx(acc[-1, -1], rel=1e-12)
    assert (pi[0], pj[0], pi[-1], pj[-1]) == (0, 0, 36, 50)
    steps = np.stack([np.diff(pi), np.diff(pj)], 1)
    assert set(map(tuple, steps)) <= {(1, 1), (1, 0), (0, 1)}


def test_mel_basis_matches_librosa_htk() -> None:
    import librosa

    ours = M._mel_basis(24000, 1024, 100)
    ref = librosa.filters.mel(sr=24000, n_fft=1024, n_mels=100, htk=True, norm=None, dtype=np.float64)
    np.testing.assert_allclose(ours, ref, atol=1e-10)


def test_resample() -> None:
    t = np.arange(22050) / 22050
    x = np.sin(2 * np.pi * 440 * t)
    y = M.resample(x, 22050, 24000)
    assert y.shape == (24000,) and y.dtype == np.float64
    spec = np.abs(np.fft.rfft(y[2000:-2000] * np.hanning(20000)))
    assert np.argmax(spec) * 24000 / 20000 == pytest.approx(440, abs=2)
    same = M.resample(x, 16000, 16000)
    assert np.array_equal(same, x) and same is not x


def test_settings_describe_and_hop() -> None:
    s = M.MCDSettings()
    assert (s.sample_rate, s.order, s.alpha, s.frame_shift_ms, s.fft_size) == (24000, 34, 0.46, 5.0, 1024)
    assert s.hop_samples == 120
    d = s.describe()
    for part in ("pysptk.mcep", "order 34", "alpha 0.46", "24000 Hz", "c0 excluded", "no silence removal"):
        assert part in d
    with pytest.raises(Exception):
        s.order = 10  # frozen


def test_evaluation_import_does_not_import_torch() -> None:
    code = "import sys, evaluation.metrics; sys.exit('torch' in sys.modules or 'librosa' in sys.modules)"
    root = Path(__file__).resolve().parents[1]
    assert subprocess.run([sys.executable, "-c", code], cwd=root).returncode == 0


# --------------------------------------------------------------------------
# DNSMOS
# --------------------------------------------------------------------------


@pytest.mark.skipif(not HAVE_ESPEAK, reason="DNSMOS levels are calibrated on espeak-ng speech")
def test_dnsmos_speech_scores_above_white_noise(speech: np.ndarray) -> None:
    # 2.3 s tiles (by doubling, as DNSMOS does) to 9.2 s: one 9 s window, ~1 s of CPU
    noise = 0.1 * np.random.default_rng(7).standard_normal(int(2.3 * SR))
    s = M.dnsmos(speech, SR)
    n = M.dnsmos(noise, SR)
    assert set(s) == {"ovrl", "sig", "bak", "p808"}
    assert s["ovrl"] > 2.5 and n["ovrl"] < 1.5 and s["ovrl"] - n["ovrl"] > 1.0
    assert s["p808"] > n["p808"]


def test_dnsmos_session_is_created_once(speech: np.ndarray) -> None:
    from speechmos import dnsmos as sm

    M.dnsmos(speech, SR)
    first = sm.dnsmos
    M.dnsmos(2.0 * speech, SR)  # out-of-range input is clipped, not rejected
    assert sm.dnsmos is first


# --------------------------------------------------------------------------
# bootstrap
# --------------------------------------------------------------------------


def test_bootstrap_ci_contains_mean_and_narrows() -> None:
    rng = np.random.default_rng(0)
    small = rng.normal(3.0, 1.0, 20)
    large = rng.normal(3.0, 1.0, 2000)
    m_s, lo_s, hi_s = M.bootstrap_ci(small)
    m_l, lo_l, hi_l = M.bootstrap_ci(large)
    assert lo_s <= m_s <= hi_s and lo_l <= m_l <= hi_l
    assert m_s == pytest.approx(small.mean()) and m_l == pytest.approx(large.mean())
    assert (hi_l - lo_l) < 0.3 * (hi_s - lo_s)
    # close to the normal-theory width 2 * 1.96 * sd / sqrt(n)
    assert hi_l - lo_l == pytest.approx(2 * 1.96 * large.std() / math.sqrt(2000), rel=0.1)
    assert M.bootstrap_ci(small, seed=5) == M.bootstrap_ci(small, seed=5)
    _, lo90, hi90 = M.bootstrap_ci(small, confidence=0.90)
    assert lo90 >= lo_s and hi90 <= hi_s
    assert M.bootstrap_ci([2.0]) == (2.0, 2.0, 2.0)


def test_bootstrap_diff_ci_is_paired() -> None:
    rng = np.random.default_rng(1)
    base = rng.normal(0.0, 5.0, 50)  # large between-item spread...
    b = base
    a = base + 0.5 + rng.normal(0.0, 0.1, 50)  # ...but a tiny paired shift
    mean, lo, hi = M.bootstrap_diff_ci(a, b)
    assert 0.0 < lo < 0.5 < hi and mean == pytest.approx(np.mean(a - b))
    _, lo_u, hi_u = M.bootstrap_ci(a)  # an unpaired view would not resolve it
    assert (hi_u - lo_u) > 10 * (hi - lo)


# --------------------------------------------------------------------------
# input validation
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad, match",
    [
        (np.zeros((2, 24000)), "1-D mono"),
        (np.zeros(0), "empty"),
        (np.r_[np.zeros(24000), np.nan], "non-finite"),
        (np.r_[np.zeros(24000), np.inf], "non-finite"),
        (np.zeros(24000, dtype=np.int16), "floating-point"),
        (np.zeros(500), "too short"),
    ],
)
def test_bad_audio_is_rejected_with_clear_error(speech: np.ndarray, bad: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        M.mel_cepstrum(bad, SR)
    with pytest.raises(ValueError, match=match):
        M.log_mel_distance(speech, bad, SR)
    with pytest.raises(ValueError, match=match):
        M.pesq_wb(bad, speech, SR)
    with pytest.raises(ValueError, match=match):
        M.stoi(speech, bad, SR)
    with pytest.raises(ValueError, match=match):
        M.dnsmos(bad, SR)


def test_other_bad_arguments(speech: np.ndarray) -> None:
    with pytest.raises(ValueError, match="ref: wav is too short"):
        M.mcd(speech[:100], speech, SR)
    with pytest.raises(ValueError, match="align"):
        M.mcd(speech, speech, SR, align="linear")  # type: ignore[arg-type]
    for sr in (0, -16000, 2.5, "24000"):
        with pytest.raises(ValueError, match="sample rate"):
            M.log_mel_distance(speech, speech, sr)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="too short"):
        M.pesq_wb(speech[: SR // 5], speech[: SR // 5], SR)
    with pytest.raises(ValueError, match="too short"):
        M.stoi(speech[: SR // 4], speech[: SR // 4], SR)
    with pytest.raises(ValueError, match="all zeros"):
        M.pesq_wb(np.zeros(SR), speech[:SR], SR)
    with pytest.raises(ValueError, match="test is all zeros"):
        M.pesq_wb(speech[:SR], np.zeros(SR), SR)
    with pytest.raises(ValueError, match="alpha"):
        M.MCDSettings(alpha=1.0)
    with pytest.raises(ValueError, match="power of two"):
        M.MCDSettings(fft_size=1000)
    with pytest.raises(ValueError, match="dims"):
        M.cepstral_distance(np.zeros((3, 35)), np.zeros((3, 25)))
    with pytest.raises(ValueError, match="empty"):
        M.bootstrap_ci([])
    with pytest.raises(ValueError, match="non-finite"):
        M.bootstrap_ci([1.0, np.nan])
    with pytest.raises(ValueError, match="confidence"):
        M.bootstrap_ci([1.0, 2.0], confidence=1.5)
    with pytest.raises(ValueError, match="n_resamples"):
        M.bootstrap_ci([1.0, 2.0], n_resamples=0)
    with pytest.raises(ValueError, match="paired"):
        M.bootstrap_diff_ci([1.0, 2.0], [1.0])


# --------------------------------------------------------------------------
# cross-checks against independent implementations (skipped when absent)
# --------------------------------------------------------------------------


def test_mcd_matches_espnet_procedure(speech: np.ndarray) -> None:
    """ESPnet's evaluate_mcd recipe (int16 input, n_fft 1024, n_shift 256, mcep
    34/0.46, fastdtw, c0 included), re-implemented from its description with
    fastdtw for the alignment, must agree with ours at matched settings."""
    fastdtw = pytest.importorskip("fastdtw").fastdtw
    from scipy.signal import resample_poly
    from scipy.spatial.distance import euclidean

    pysptk = M._import_pysptk()
    k = 10 / math.log(10) * math.sqrt(2)

    def espnet_extract(x16: np.ndarray) -> np.ndarray:
        n = (len(x16) - 1024) // 256 + 1
        win = pysptk.sptk.hamming(1024)
        return np.stack(
            [pysptk.mcep(x16[256 * i : 256 * i + 1024] * win, 34, 0.46, eps=1e-6, etype=1) for i in range(n)]
        )

    def to16(x: np.ndarray) -> np.ndarray:
        return np.round(np.clip(x, -1, 32767 / 32768) * 32768).astype(np.int16).astype(np.float64)

    settings = M.MCDSettings(frame_shift_ms=256 / 24)
    ref16 = to16(speech)
    ref_esp = espnet_extract(ref16)
    ref_ours = M.mel_cepstrum(ref16 / 32768, SR, settings)
    for y in (_add_noise(speech, 10, seed=11), resample_poly(speech, 11, 10)):
        y16 = to16(y)
        t_esp = espnet_extract(y16)
        _, path = fastdtw(t_esp, ref_esp, dist=euclidean)
        p = np.asarray(path).T
        expected = np.mean(k * np.sqrt(np.sum((t_esp[p[0]] - ref_esp[p[1]]) ** 2, 1)))
        ours, _ = M.cepstral_distance(ref_ours, M.mel_cepstrum(y16 / 32768, SR, settings), "dtw", exclude_c0=False)
        assert ours == pytest.approx(expected, rel=0.02)


def test_mcd_matches_pymcd(speech: np.ndarray, tmp_path: Path) -> None:
    """pymcd (WORLD envelope at 22.05 kHz, mcep order 13, alpha 0.65, c0
    included, fastdtw) against our distance and DTW on the same features."""
    mcd_mod = pytest.importorskip("pymcd.mcd")
    pyworld = pytest.importorskip("pyworld")
    import soundfile as sf
    from scipy.signal import resample_poly

    pysptk = M._import_pysptk()

    def world_mcep(x: np.ndarray) -> np.ndarray:
        _, sp, _ = pyworld.wav2world(x.astype(np.double), fs=22050, frame_period=5.0, fft_size=512)
        return pysptk.sptk.mcep(sp, order=13, alpha=0.65, maxiter=0, etype=1, eps=1.0e-8, min_det=0.0, itype=3)

    x = M.resample(speech, SR, 22050)
    sf.write(tmp_path / "ref.wav", x, 22050, subtype="FLOAT")
    ref_mc = world_mcep(x)
    cases = [("plain", "none", np.clip(_add_noise(x, 20, seed=12), -1, 1)), ("dtw", "dtw", resample_poly(x, 11, 10))]
    for pymcd_mode, align, y in cases:
        sf.write(tmp_path / "test.wav", y, 22050, subtype="FLOAT")
        expected = mcd_mod.Calculate_MCD(MCD_mode=pymcd_mode).calculate_mcd(
            str(tmp_path / "ref.wav"), str(tmp_path / "test.wav")
        )
        ours, _ = M.cepstral_distance(ref_mc, world_mcep(y), align, exclude_c0=False)
        assert ours == pytest.approx(expected, rel=0.02)

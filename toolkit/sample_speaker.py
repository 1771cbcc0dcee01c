"""Speakers from sample audio (a WAV and what it says).

A ChatTTS checkpoint was trained to continue a sample: its speaker is the sample's DVAE codes (spk_smp) with the
transcript (txt_smp), in the prompt as ChatTTS lays it out. ttsq's voice lab trains speaker vectors only, so for its
models the speaker is the vector under which the GPT, teacher-forced, finds the sample's codes most likely: a plain
speaker vector (and string) afterwards, usable at any precision and in the edge runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .models import TTSModel
from .models.speaker import apply_speaker
from .prompt import Voice, encode_prompts, reads_audio_prompts
from .speakers import SampleSpeaker, SpeakerError
from .text import normalize

MIN_SECONDS, MAX_SECONDS = 0.5, 30.0


@dataclass
class FitSettings:
    steps: int = 30
    lr: float = 0.1


def read_sample(path: str | Path, sample_rate: int) -> np.ndarray:
    """A WAV (or any file soundfile reads) -> float32 mono at `sample_rate`, resampled if it has another rate."""
    import soundfile as sf

    path = Path(path)
    if not path.is_file():
        raise SpeakerError(f"sample audio not found: {path}")
    try:
        wav, sr = sf.read(str(path), dtype="float32", always_2d=True)
    except Exception as e:  # soundfile raises its own LibsndfileError for files it cannot parse
        raise SpeakerError(f"cannot read {path} as audio: {e}") from None
    return prepare_sample(wav.mean(1), sr, sample_rate, str(path))


def prepare_sample(wav: np.ndarray, sr: int, sample_rate: int, name: str = "the sample") -> np.ndarray:
    wav = np.asarray(wav, dtype=np.float32)
    if wav.size == 0 or not np.any(wav):
        raise SpeakerError(f"{name} holds no audio (it is empty or silent); record a few seconds of speech")
    if not np.isfinite(wav).all():
        raise SpeakerError(f"{name} holds NaN or inf samples")
    seconds = len(wav) / sr
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise SpeakerError(f"{name} is {seconds:.2f} s long; give {MIN_SECONDS:g} to {MAX_SECONDS:g} s of speech")
    return resample(wav, sr, sample_rate) if sr != sample_rate else wav


def resample(wav: np.ndarray, sr: int, to: int) -> np.ndarray:
    """Band-limited resampling in the frequency domain (the spectrum cut or zero-padded at the new Nyquist)."""
    n = round(len(wav) * to / sr)
    spec = np.fft.rfft(wav.astype(np.float64))
    keep = min(len(spec), n // 2 + 1)
    out = np.zeros(n // 2 + 1, np.complex128)
    out[:keep] = spec[:keep]
    return (np.fft.irfft(out, n) * (n / len(wav))).astype(np.float32)


def trim(wav: np.ndarray, sample_rate: int, floor_db: float = -40.0) -> np.ndarray:
    """Leading and trailing silence cut to 0.1 s (the voice lab's corpus trims its utterances so)."""
    level = np.abs(wav)
    loud = np.flatnonzero(level > level.max() * 10 ** (floor_db / 20))
    pad = sample_rate // 10
    return wav[max(0, loud[0] - pad) : loud[-1] + pad]


@torch.no_grad()
def sample_codes(encoder: torch.nn.Module, wav: np.ndarray) -> np.ndarray:
    """-> (Q, T) codes of a 24 kHz waveform."""
    device = next(encoder.buffers()).device
    return encoder(torch.from_numpy(wav).to(device)[None])[0].cpu().numpy()


def speaker_from_audio(
    model: TTSModel, encoder: torch.nn.Module, wav: np.ndarray, text: str, settings: FitSettings | None = None
) -> SampleSpeaker | np.ndarray:
    """wav float32 mono at the model's rate -> a SampleSpeaker (ChatTTS checkpoints) or a fitted (D,) vector."""
    text = text.strip()
    if not text:
        raise SpeakerError("a speaker from audio needs the sample's transcript (--text): what the recording says")
    normalize(text)  # empty or control tokens only -> a TextError naming it
    if reads_audio_prompts(model):  # the whole recording, as ChatTTS's sample_audio_speaker encodes it
        return SampleSpeaker(sample_codes(encoder, wav), text)
    return fit_vector(model, sample_codes(encoder, trim(wav, model.sample_rate)), text, settings or FitSettings())


def speaker_from_file(
    wav: str | Path,
    text: str,
    model: str | Path | None = None,
    *,
    device: str | None = "cpu",
    encoder: str | Path | None = None,
    settings: FitSettings | None = None,
    notice=None,
) -> SampleSpeaker | np.ndarray:
    """`ttsq speaker from-audio` as a call: the model (None: the shipped voice) and its DVAE encoder (or
    `encoder`) loaded on `device`, the WAV read and resampled, then speaker_from_audio. notice(message) is told
    before a vector fit, the slow part."""
    from .checkpoint import load_dvae_encoder
    from .synthesizer import DEFAULT_MODEL, load_model, resolve_device

    root = Path(model) if model else DEFAULT_MODEL
    dev = resolve_device(device)
    tts = load_model(root).to(dev)
    samples = read_sample(wav, tts.sample_rate)
    enc = load_dvae_encoder(Path(encoder) if encoder else root, tts.cfg).to(dev)
    settings = settings or FitSettings()
    if notice is not None and not reads_audio_prompts(tts):
        notice(f"fitting a speaker vector to the sample ({settings.steps} steps from each voice)...")
    return speaker_from_audio(tts, enc, samples, text, settings)


def speaker_string(spk: SampleSpeaker | np.ndarray) -> str:
    """The speaker string of speaker_from_audio's result (what --speaker takes)."""
    from .speakers import encode_vector

    return spk.to_string() if isinstance(spk, SampleSpeaker) else encode_vector(spk)


def fit_vector(model: TTSModel, codes: np.ndarray, text: str, settings: FitSettings) -> np.ndarray:
    """The speaker vector that maximises the teacher-forced likelihood of `codes` (Q, T), then EOS, after the prompt
    for `text`: Adam from each of the model's voices and from their mean direction (spk_stat's mean for a model
    without voices), keeping the likeliest end. One start alone can settle nearer another voice."""
    if getattr(model, "precision", "fp32") != "fp32":
        raise SpeakerError(
            f"fit a speaker on the fp32 model, not a {model.precision} artifact: the speaker string it "
            "gives works at every precision"
        )
    forced = TeacherForced(model, codes, text)
    if model.voices:
        voices = torch.stack([torch.nn.functional.normalize(v.float(), dim=0) for v in model.voices.values()])
        starts = torch.cat([voices, voices.mean(0, keepdim=True)])
    else:
        starts = model.spk_stat[1:2].float()
    fits = [fit_from(forced, start.to(forced.emb.device), settings) for start in starts]
    best = min(fits, key=lambda fit: fit[0])[1]
    return torch.nn.functional.normalize(best, dim=0).cpu().numpy()


def fit_from(forced: TeacherForced, start: torch.Tensor, settings: FitSettings) -> tuple[float, torch.Tensor]:
    """-> (nll, vector) after settings.steps Adam steps from `start`'s direction."""
    u = torch.nn.Parameter(torch.nn.functional.normalize(start.float(), dim=0))
    opt = torch.optim.Adam([u], lr=settings.lr)
    with torch.enable_grad():
        for _ in range(settings.steps):
            loss = forced.nll(u)
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        return float(forced.nll(u)), u.detach().float()


class TeacherForced:
    """The prompt for `text` followed by the sample's codes, embedded once; nll(speaker) is the mean cross-entropy of
    the codes (then EOS) with that speaker placed at [spk_emb]."""

    def __init__(self, model: TTSModel, codes: np.ndarray, text: str):
        gpt = self.gpt = model.gpt
        device = gpt.norm.weight.device
        target = torch.from_numpy(codes.T.astype(np.int64)).to(device)  # (T, Q)
        self.target = torch.cat([target, torch.full_like(target[:1], gpt.cfg.eos_code)])
        emb, _ = encode_prompts(model, [text], Voice(torch.zeros(gpt.cfg.hidden)))
        self.T = emb.shape[1]
        if self.T + len(self.target) > gpt.cfg.max_positions:
            raise SpeakerError(
                f"the sample and its transcript need {self.T + len(self.target)} positions, more than "
                f"this model's {gpt.cfg.max_positions}; give a shorter sample"
            )
        probe, _ = encode_prompts(model, [text], Voice(torch.ones(gpt.cfg.hidden)))
        self.emb = torch.cat([emb, gpt.embed_codes(target[None]).to(emb.dtype)], 1)
        self.is_spk = torch.zeros(self.emb.shape[:2], dtype=torch.bool, device=device)
        self.is_spk[:, : self.T] = (probe != emb).any(-1)  # where the speaker goes: [spk_emb]
        self.valid = torch.ones(self.emb.shape[:2], dtype=torch.bool, device=device)

    def nll(self, speaker: torch.Tensor) -> torch.Tensor:
        x = apply_speaker(self.emb, self.is_spk, speaker[None])
        h = self.gpt.forward_full(x, self.valid)
        logits = self.gpt.code_logits(h[0, self.T - 1 :])  # (n, Q, V)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), self.target.flatten())


def teacher_forced_nll(model: TTSModel, codes: np.ndarray, text: str, vector) -> float:
    """How unlikely the sample's codes (then EOS) are under a speaker vector: what fit_vector lowers."""
    forced = TeacherForced(model, codes, text)
    with torch.no_grad():
        return float(forced.nll(torch.as_tensor(vector).float().to(forced.emb.device)))

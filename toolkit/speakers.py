"""Speakers as ChatTTS users write them, torch-free (the edge runtime reads them too).

- a speaker string (ChatTTS 0.2): the vector's float16 bytes, lzma-compressed (raw LZMA2, preset 9 | extreme), then
  base16384 text;
- a sample-audio speaker string (ChatTTS's `spk_smp`): the sample's DVAE codes (Q, T) as little-endian uint16,
  compressed the same way, after an uncompressed 2-value uint16 shape; its transcript (`txt_smp`) travels beside it;
- a .pt / .npy / .txt file holding a vector or a string;
- `chattts-seed:N`: the vector ChatTTS draws after torch.manual_seed(N) (the engines draw it; see ChatTTSSeed);
- ttsq's own seeds (7, "7", "seed:7") and voice names, as before.
"""

from __future__ import annotations

import lzma
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .params import speaker_seed

_FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]
FILE_SUFFIXES = (".pt", ".npy", ".txt")
# base16384 writes 14 bits per character in U+4E00..U+8DFF, and marks a short tail with one of U+3D01..U+3D06
_B14 = re.compile(r"[\u4e00-\u8dff]+[\u3d01-\u3d06]?")


class SpeakerError(ValueError):
    """A speaker that cannot be read; the message names the problem and the fix."""


@dataclass(frozen=True)
class ChatTTSSeed:
    """`chattts-seed:N`: ChatTTS's `torch.manual_seed(N); sample_random_speaker()`, i.e. randn(D) drawn in float16
    by torch's CPU generator seeded N, times std plus mean of the model's spk_stat, in float16 arithmetic."""

    seed: int


@dataclass
class SampleSpeaker:
    """A speaker given by sample audio, in ChatTTS's prompt layout: the transcript comes before the text and the
    sample's codes after [Ptts], so the model continues in that voice."""

    codes: np.ndarray  # (Q, T) DVAE codes of the sample
    text: str = ""  # what the sample says

    def to_string(self) -> str:
        return encode_codes(self.codes)


# --- strings ----------------------------------------------------------------------------------------
def _b14():
    try:
        import pybase16384
    except ImportError as e:
        raise SpeakerError("ChatTTS speaker strings need the pybase16384 package: pip install pybase16384") from e
    return pybase16384


def _compress(raw: bytes) -> bytes:
    return lzma.compress(raw, format=lzma.FORMAT_RAW, filters=_FILTERS)


def _decompress(data: bytes) -> bytes:
    return lzma.decompress(data, format=lzma.FORMAT_RAW, filters=_FILTERS)


def encode_vector(vec) -> str:
    """(D,) vector -> ChatTTS speaker string (float16, as ChatTTS stores speakers)."""
    v = np.asarray(vec, dtype=np.float32).reshape(-1)
    half = v.astype(np.float16)
    if not np.isfinite(half).all():
        raise SpeakerError("the speaker vector has values that are not finite in float16 (|x| > 65504 or NaN)")
    return _b14().encode_to_string(_compress(half.tobytes()))


def encode_codes(codes) -> str:
    """(Q, T) sample codes -> ChatTTS sample-audio speaker string."""
    c = np.asarray(codes)
    if c.ndim != 2 or c.size == 0 or c.min() < 0 or c.max() > 0xFFFF or max(c.shape) > 0xFFFF:
        raise SpeakerError(f"sample codes must be a non-empty (Q, T) array of uint16 values, got shape {c.shape}")
    raw = c.astype("<u2").tobytes()
    return _b14().encode_to_string(np.array(c.shape, dtype="<u2").tobytes() + _compress(raw))


def _clean(s: str) -> str:
    return "".join(s.split())  # strings copied from chats and web pages pick up line breaks and spaces


def looks_like_string(s: str) -> bool:
    return bool(_B14.fullmatch(_clean(s)))


def decode_string(s: str) -> np.ndarray | SampleSpeaker:
    """A ChatTTS speaker string -> float16 vector (D,), or a SampleSpeaker whose text is still to be given."""
    s = _clean(s)
    if not s:
        raise SpeakerError("the speaker string is empty")
    if not _B14.fullmatch(s):
        bad = next((c for c in s if not ("\u4e00" <= c <= "\u8dff" or "\u3d01" <= c <= "\u3d06")), s[:1])
        raise SpeakerError(
            f"not a ChatTTS speaker string: it holds {bad!r} (U+{ord(bad):04X}), and base16384 text "
            "has only characters U+4E00..U+8DFF (and one tail mark U+3D01..U+3D06); copy the whole "
            "string"
        )
    data = _b14().decode_from_string(s)
    try:
        raw = _decompress(data)
    except lzma.LZMAError as first:
        try:  # a sample-audio speaker: its shape is stored before the compressed codes
            shape = tuple(int(x) for x in np.frombuffer(data[:4], dtype="<u2"))
            raw = _decompress(data[4:])
        except lzma.LZMAError:
            what = "cut short" if "ended before" in str(first) else "corrupt"
            raise SpeakerError(
                f"the ChatTTS speaker string is {what} ({len(s)} characters do not decompress: "
                f"{first}); copy the whole string again"
            ) from None
        if len(data) < 4 or len(raw) != 2 * shape[0] * shape[1] or 0 in shape:
            raise SpeakerError(
                f"the sample-audio speaker string holds {len(raw) // 2} codes, not the {shape} its "
                "header says: it is damaged; make it again (ttsq speaker from-audio)"
            )
        return SampleSpeaker(np.frombuffer(raw, dtype="<u2").astype(np.int64).reshape(shape))
    if len(raw) % 2 or not raw:
        raise SpeakerError(f"the speaker string decodes to {len(raw)} bytes, not a float16 vector: it is damaged")
    vec = np.frombuffer(raw, dtype=np.float16).copy()
    if not np.isfinite(vec).all():
        raise SpeakerError("the speaker string decodes to a vector with NaN or inf values: it is damaged")
    return vec


# --- files ------------------------------------------------------------------------------------------
def read_file(path: str | Path) -> np.ndarray | SampleSpeaker:
    """A .pt (torch.load weights_only), .npy (no pickles) or .txt file holding a vector or a speaker string."""
    path = Path(path)
    if not path.is_file():
        raise SpeakerError(f"speaker file not found: {path}")
    suffix = path.suffix.lower()
    try:
        if suffix == ".txt":
            text = path.read_text(encoding="utf-8").strip()
            if not text:
                raise SpeakerError(f"speaker file {path} is empty")
            try:
                return np.array([float(x) for x in text.replace(",", " ").split()], dtype=np.float32)
            except ValueError:
                return decode_string(text)
        if suffix == ".npy":
            obj = np.load(path, allow_pickle=False)
        elif suffix == ".pt":
            try:
                import torch
            except ImportError as e:
                raise SpeakerError(f"reading {path} needs torch; save the speaker as .npy or a string instead") from e
            obj = torch.load(path, map_location="cpu", weights_only=True)
            if isinstance(obj, dict) and len(obj) == 1:  # {"spk_emb": tensor} and the like
                obj = next(iter(obj.values()))
            if isinstance(obj, torch.Tensor):
                obj = obj.detach().float().numpy()
        else:
            raise SpeakerError(f"{path}: a speaker file must be .pt, .npy or .txt")
    except SpeakerError:
        raise
    except Exception as e:  # a pickle weights_only refuses, a corrupt or truncated file
        first = (str(e).strip().splitlines() or [""])[0]  # torch's unpickling errors run to a dozen lines
        raise SpeakerError(
            f"cannot read speaker file {path}: {type(e).__name__}: {first} (a .pt speaker must hold "
            "a tensor or a string, nothing that runs code)"
        ) from None
    if isinstance(obj, str):
        return decode_string(obj)
    arr = np.asarray(obj)
    if arr.dtype.kind == "U" and arr.size == 1:
        return decode_string(str(arr.reshape(())))
    if arr.dtype.kind not in "fiu" or arr.squeeze().ndim != 1:
        raise SpeakerError(
            f"{path} holds {arr.dtype} data of shape {arr.shape}; a speaker file holds one vector or one speaker string"
        )
    return arr.astype(np.float32).reshape(-1)


def names_a_file(speaker) -> bool:
    """Whether `speaker` would be read from a file (a server refuses those: its files are not the client's)."""
    return isinstance(speaker, str) and speaker.strip().lower().endswith(FILE_SUFFIXES)


# --- what a user wrote ------------------------------------------------------------------------------
def parse_speaker(speaker, voices=()):
    """-> int (ttsq seed), str (a voice name in `voices`), ChatTTSSeed, np.ndarray (vector) or SampleSpeaker.
    Anything else that is not a string (a tensor, a list) is returned as given, for the engine to take as a vector."""
    if isinstance(speaker, (SampleSpeaker, ChatTTSSeed)):
        return speaker
    speaker = speaker_seed(speaker)
    if not isinstance(speaker, str):
        return speaker
    if speaker in voices:
        return speaker
    m = re.fullmatch(r"chattts-seed:(.*)", speaker.strip())
    if m:
        if not re.fullmatch(r"\d+", m.group(1).strip()):
            raise SpeakerError(f"{speaker!r}: chattts-seed takes a non-negative integer, e.g. chattts-seed:2222")
        return ChatTTSSeed(int(m.group(1)) % 2**64)  # torch.manual_seed's range
    if names_a_file(speaker):
        return read_file(speaker.strip())
    if looks_like_string(speaker):
        return decode_string(speaker)
    raise SpeakerError(
        f"unknown speaker {speaker!r}: give one of this model's voices "
        f"({', '.join(sorted(voices)) or 'none'}), an integer seed, chattts-seed:N, a .pt/.npy/.txt "
        "file, or a ChatTTS speaker string"
    )


def check_vector(vec, dim: int) -> np.ndarray:
    """-> float32 (dim,), or an error that says where a vector of another size comes from."""
    v = np.asarray(vec, dtype=np.float32)
    if v.ndim == 2 and 1 in v.shape:
        v = v.reshape(-1)
    if v.shape != (dim,):
        hint = " (ChatTTS's speakers have 768)" if dim != 768 else ""
        raise SpeakerError(
            f"the speaker vector has shape {v.shape}, but this model's speakers have {dim} values"
            f"{hint}: it was made for another model"
        )
    if not np.isfinite(v).all():
        raise SpeakerError("the speaker vector holds NaN or inf values")
    if not np.any(v):
        raise SpeakerError("the speaker vector is all zeros; it has no direction to normalise")
    return v


def with_transcript(speaker, text: str | None):
    """A sample-audio speaker (string or file) given with its transcript -> SampleSpeaker; without text, unchanged."""
    if text is None:
        return speaker
    spec = parse_speaker(speaker)
    if not isinstance(spec, SampleSpeaker):
        raise SpeakerError(
            "--speaker-text is the transcript of a sample-audio speaker (ttsq speaker from-audio on a "
            "ChatTTS model); this speaker is a vector, which needs none"
        )
    spec.text = text
    return spec

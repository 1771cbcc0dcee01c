"""Sentences + speaker -> GPT prompt embeddings, in ChatTTS's layout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from .models import TTSModel
from .models.speaker import apply_speaker, chattts_speaker, random_speaker
from .refine import refine_prompt
from .speakers import ChatTTSSeed, SampleSpeaker, SpeakerError, check_vector, parse_speaker
from .text import check_prompt_length, normalize, prompt_text


@dataclass
class Voice:
    """What a speaker puts into the code prompt: a vector at [spk_emb] ([empty_spk] when None) and, for a speaker
    from sample audio (ChatTTS's spk_smp, txt_smp), the sample's transcript before the text and its codes after
    [Ptts], which the GPT then continues."""

    vector: Tensor | None
    sample_codes: Tensor | None = None  # (T, Q)
    sample_text: str = ""


def to_device(t: Tensor, device: torch.device) -> Tensor:
    """t on device; a host tensor goes to a GPU through pinned memory without waiting, so that the host does not
    wait for the work queued on the stream (a pageable copy would)."""
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def encode_prompts(model: TTSModel, sentences: Sequence[str], speaker: Tensor | Voice) -> tuple[Tensor, Tensor]:
    """-> emb (B, T, D) on the model's device with the speaker placed, valid (B, T) non-padding."""
    voice = speaker if isinstance(speaker, Voice) else Voice(speaker)
    tok, gpt = model.tokenizer, model.gpt
    from .frontend import frontend_for

    frontend = frontend_for(getattr(model, "frontend", None))  # identity unless the manifest names one
    for s in (*sentences, voice.sample_text):
        check_prompt_length(s, gpt.cfg.max_positions)
    sample_text = frontend(normalize(voice.sample_text)) if voice.sample_text.strip() else ""
    ids, valid = tok.encode(
        [
            prompt_text(frontend(s), tok.has, sample_text=sample_text, speaker=voice.vector is not None)
            for s in sentences
        ]
    )
    if int(ids.max()) >= gpt.cfg.num_text_tokens:
        raise ValueError("the tokenizer produced ids beyond the model's text vocabulary: wrong tokenizer.json?")
    device = gpt.emb_text.weight.device
    ids, valid = to_device(ids, device), to_device(valid, device)
    emb = gpt.embed(ids[..., None].expand(-1, -1, gpt.cfg.num_vq), torch.ones_like(valid))
    spk_id = tok.token_id("[spk_emb]")
    if voice.vector is not None and spk_id is not None:
        emb = apply_speaker(emb, ids == spk_id, to_device(voice.vector, device)[None].expand(len(sentences), -1))
    if voice.sample_codes is not None:  # the sample's audio follows [Ptts] in every row (rows are left-padded)
        smp = gpt.embed_codes(to_device(voice.sample_codes, device).long()).to(emb.dtype)
        emb = torch.cat([emb, smp[None].expand(len(sentences), -1, -1)], 1)
        valid = torch.cat([valid, torch.ones(len(sentences), len(smp), dtype=valid.dtype, device=device)], 1)
    return emb, valid


def encode_refine_prompts(model: TTSModel, sentences: Sequence[str], prompt: str = "") -> tuple[Tensor, Tensor]:
    """-> emb (B, T, D), valid (B, T) of refine's `[Sbreak]{sentence}[Pbreak]{prompt}`: text embeddings only."""
    gpt = model.gpt
    ids, valid = model.tokenizer.encode([refine_prompt(s, prompt) for s in sentences])
    if int(ids.max()) >= gpt.cfg.num_text_tokens:
        raise ValueError("the tokenizer produced ids beyond the model's text vocabulary: wrong tokenizer.json?")
    device = gpt.emb_text.weight.device
    return gpt.emb_text(ids.to(device)), valid.to(device)


def reads_audio_prompts(model: TTSModel) -> bool:
    """ChatTTS checkpoints were trained with sample-audio prompts; ttsq's voice lab (the models that carry a text
    front end) trains speaker vectors only, so its speakers from audio are fitted vectors (toolkit.speaker_fit)."""
    return getattr(model, "frontend", None) is None


def resolve_voice(model: TTSModel, speaker) -> Voice:
    """Any speaker resolve_speaker takes, a SampleSpeaker (codes + transcript), or a Voice as it is."""
    if isinstance(speaker, Voice):
        return speaker
    spec = parse_speaker(_default(model, speaker), model.voices)
    if not isinstance(spec, SampleSpeaker):
        return Voice(resolve_speaker(model, spec))
    if not reads_audio_prompts(model):
        raise SpeakerError(
            "this model was not trained with sample-audio prompts (ChatTTS's spk_smp); make a speaker "
            "for it from the audio with `ttsq speaker from-audio WAV --text ... --model MODEL`, which "
            "fits a speaker vector to the sample"
        )
    g = model.cfg.gpt
    codes = np.asarray(spec.codes)
    if codes.shape[0] != g.num_vq or codes.max() >= g.eos_code:
        raise SpeakerError(
            f"the sample-audio speaker holds codes of shape {codes.shape} up to {codes.max()}, but this "
            f"model reads {g.num_vq} codebooks of codes below {g.eos_code}: it was made for another model"
        )
    return Voice(None, torch.from_numpy(codes.T.astype(np.int64)), spec.text)


def resolve_speaker(model: TTSModel, speaker) -> Tensor:
    """A seed (int, "7" or "seed:7"), a voice name shipped with the model, `chattts-seed:N`, a ChatTTS speaker
    string, a .pt/.npy/.txt speaker file, or a (D,) vector -> (D,) speaker (float16 where ChatTTS's is: strings and
    chattts seeds). None picks the model's default voice, or seed 0."""
    D = model.cfg.gpt.hidden
    spec = parse_speaker(_default(model, speaker), model.voices)
    if isinstance(spec, int):
        return random_speaker(spec, model.spk_stat)
    if isinstance(spec, ChatTTSSeed):
        return chattts_speaker(spec.seed, model.spk_stat)
    if isinstance(spec, str):
        return model.voices[spec].float()
    if isinstance(spec, SampleSpeaker):
        raise SpeakerError(
            "this is a sample-audio speaker (codes of a recording), not a speaker vector; pass it "
            "to synthesize() (or --speaker with --speaker-text) instead"
        )
    if isinstance(spec, np.ndarray) and spec.dtype == np.float16:
        return torch.from_numpy(check_vector(spec, D)).half()
    if isinstance(spec, Tensor):
        spec = spec.detach().float().cpu().numpy()
    return torch.from_numpy(check_vector(spec, D))


def _default(model: TTSModel, speaker):
    if speaker is None:
        return model.default_voice if model.voices else 0
    return speaker

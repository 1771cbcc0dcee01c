"""Sentences + speaker -> GPT prompt embeddings, in ChatTTS's layout."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from .models import TTSModel
from .models.speaker import apply_speaker, random_speaker
from .params import speaker_seed
from .text import prompt_text


def encode_prompts(model: TTSModel, sentences: Sequence[str], speaker: Tensor) -> tuple[Tensor, Tensor]:
    """-> emb (B, T, D) on the model's device with the speaker placed, valid (B, T) non-padding."""
    tok, gpt = model.tokenizer, model.gpt
    from .frontend import frontend_for
    frontend = frontend_for(getattr(model, "frontend", None))  # identity unless the manifest names one
    ids, valid = tok.encode([prompt_text(frontend(s), tok.has) for s in sentences])
    if int(ids.max()) >= gpt.cfg.num_text_tokens:
        raise ValueError("the tokenizer produced ids beyond the model's text vocabulary: wrong tokenizer.json?")
    device = gpt.emb_text.weight.device
    ids, valid = ids.to(device), valid.to(device)
    emb = gpt.embed(ids[..., None].expand(-1, -1, gpt.cfg.num_vq), torch.ones_like(valid))
    spk_id = tok.token_id("[spk_emb]")
    is_spk = ids == spk_id if spk_id is not None else torch.zeros_like(valid)
    emb = apply_speaker(emb, is_spk, speaker.to(device)[None].expand(len(sentences), -1))
    return emb, valid


def resolve_speaker(model: TTSModel, speaker: int | str | Tensor | None) -> Tensor:
    """A seed (int, "7" or "seed:7"), a voice name shipped with the model, or a (D,) vector -> (D,) speaker.
    None picks the model's default voice, or seed 0."""
    D = model.cfg.gpt.hidden
    if speaker is None:
        speaker = model.default_voice if model.voices else 0
    speaker = speaker_seed(speaker)
    if isinstance(speaker, int):
        return random_speaker(speaker, model.spk_stat)
    if isinstance(speaker, str):
        if speaker not in model.voices:
            raise ValueError(f"unknown speaker {speaker!r}; this model has voices {sorted(model.voices) or 'none'}; "
                             "or give an integer seed")
        return model.voices[speaker].float()
    vec = torch.as_tensor(speaker, dtype=torch.float32)
    if vec.shape != (D,):
        raise ValueError(f"speaker vector must have shape ({D},), got {tuple(vec.shape)}")
    return vec

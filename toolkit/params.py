"""Sampling settings, shared by the torch engine and the torch-free runtime (so this module imports no torch)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class SamplingParams:
    temperature: float | tuple[float, ...] = 0.3  # one value, or one per codebook
    top_p: float = 0.7
    top_k: int = 20
    repetition_penalty: float = 1.05
    penalty_window: int = 16
    min_keep: int = 3  # top-p/top-k never keep fewer
    max_new_tokens: int = 2048
    min_new_tokens: int = 0

    def __post_init__(self):
        temps = self.temperature if isinstance(self.temperature, (tuple, list)) else (self.temperature,)
        for name, v in (
            *(("temperature", t) for t in temps),
            ("top_p", self.top_p),
            ("repetition_penalty", self.repetition_penalty),
        ):
            if not math.isfinite(v):  # NaN passes every comparison below; inf makes every logit equal
                raise ValueError(f"{name} must be a finite number, got {v}")
        if any(t <= 0 for t in temps):
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 1 or self.repetition_penalty <= 0 or self.max_new_tokens < 1:
            raise ValueError("top_k and max_new_tokens must be >= 1 and repetition_penalty > 0")
        if self.min_keep < 2:  # with one kept, barring EOS before min_new_tokens could leave nothing to draw
            raise ValueError(
                f"min_keep must be >= 2 (EOS may be barred from what top-p/top-k keep), got {self.min_keep}"
            )

    def top_k_for(self, vocab: int) -> int:
        """The k best that top-k keeps of `vocab` codes: never fewer than min_keep, never more than there are."""
        return min(max(self.top_k, self.min_keep), vocab)

    def temperatures(self, num_vq: int) -> list[float]:
        t = self.temperature
        t = list(t) if isinstance(t, (tuple, list)) else [t] * num_vq
        if len(t) != num_vq:
            raise ValueError(f"{len(t)} temperatures given for {num_vq} codebooks")
        return [float(x) for x in t]


def speaker_seed(speaker):
    """A speaker given as a seed (7, "7" or "seed:7") -> the int; anything else (a voice name, a vector) unchanged."""
    if isinstance(speaker, str):
        s = speaker.removeprefix("seed:")
        if s.lstrip("-").isdigit():
            return int(s)
    return speaker

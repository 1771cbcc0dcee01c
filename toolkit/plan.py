"""A request's texts -> batches of sentences -> one result per text. The torch engine and the torch-free edge
runtime share this plan, so both split, batch, seed and reassemble alike."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Iterator, Sequence

from .text import TextError, sentence_pieces


@dataclass
class Plan:
    texts: list[str]
    pieces: list[tuple[int, str]]  # (text index, sentence)
    batch_size: int

    @classmethod
    def make(cls, texts: str | Sequence[str], batch_size: int, max_chars: int, control_tokens: bool) -> Plan:
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts:
            raise TextError("no texts given")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        return cls(texts, sentence_pieces(texts, max_chars, control_tokens), batch_size)

    def batches(self) -> Iterator[tuple[int, list[int]]]:
        """(b, piece indices) per batch: sentences by length, so a batch pads little. Batch b is seeded seed + b."""
        order = sorted(range(len(self.pieces)), key=lambda k: len(self.pieces[k][1]))
        for b in range(0, len(order), self.batch_size):
            yield b, order[b : b + self.batch_size]

    def per_text(self, hit_limit: dict[int, bool]) -> list[list[int]]:
        """The piece indices of each text, in order; warns for a text whose sentence ran out of steps."""
        out: list[list[int]] = [[] for _ in self.texts]
        for k, (i, _) in enumerate(self.pieces):
            out[i].append(k)
        for i, ks in enumerate(out):
            if any(hit_limit[k] for k in ks):
                warnings.warn(
                    f"text {i}: a sentence reached max_new_tokens without EOS; its audio may be cut", stacklevel=3
                )
        return out


def render_stream(chunks, renderer) -> Iterator:
    """The GPT chunks of one sentence (batch of 1) -> audio pieces, each as soon as the renderer can finish it."""
    for chunk in chunks:
        n = max(0, min(chunk.hidden.shape[1], int(chunk.lengths[0]) - chunk.start))  # steps before EOS
        piece = renderer.push(chunk.hidden[0, :n], chunk.ready)
        if piece.size:
            yield piece
    tail = renderer.finish()
    if tail.size:
        yield tail

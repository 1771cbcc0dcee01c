"""A request's texts -> batches of sentences -> one result per text. The torch engine and the torch-free edge
runtime share this plan, so both split, batch, seed and reassemble alike."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

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


@dataclass
class Written:
    """What synthesize_to wrote: the whole text's totals, its audio already in the file."""

    samples: int = 0
    steps: int = 0
    hit_limit: bool = False
    timings: dict[str, float] = field(default_factory=dict)
    texts: list[str] = field(default_factory=list)  # each sentence's text as spoken (refined, with refine on)


def synthesize_to(
    synth,
    text: str,
    write: Callable,
    *,
    seed: int = 0,
    batch_size: int = 8,
    max_chars: int = 120,
    control_tokens: bool = False,
    progress: Callable[[int, int], None] | None = None,
    **kwargs,
) -> Written:
    """One text through `synth` (the torch Synthesizer or the edge runtime's), batch_size consecutive sentences at a
    time, each group's audio handed to write(wav) in order: a long text never holds all its audio in memory, and
    progress(characters done, characters in all) follows the text, so its ETA holds. A text of at most batch_size
    sentences is one group seeded `seed`: the same audio as synth.synthesize(text, seed=seed)."""
    sentences = [p for _, p in sentence_pieces([text], max_chars, control_tokens)]
    total, done = sum(map(len, sentences)), 0
    out = Written()
    for g in range(0, len(sentences), batch_size):
        group = sentences[g : g + batch_size]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            utts = synth.synthesize(
                group,
                seed=seed + g,
                batch_size=batch_size,
                max_chars=max_chars,
                control_tokens=control_tokens,
                **kwargs,
            )
        for w in caught:  # "text i" of a group is sentence g + i of this text
            if "max_new_tokens" not in str(w.message):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        for i, u in enumerate(utts):
            write(u.wav)
            out.texts.append(u.text)
            out.samples += len(u.wav)
            out.steps += u.steps
            if u.hit_limit:
                warnings.warn(
                    f"sentence {g + i + 1} reached max_new_tokens without EOS; its audio may be cut", stacklevel=2
                )
            out.hit_limit |= u.hit_limit
        for k, v in utts[0].timings.items():
            out.timings[k] = out.timings.get(k, 0.0) + v
        done += sum(map(len, group))
        if progress:
            progress(done, total)
    return out

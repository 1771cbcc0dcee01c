"""Streaming synthesis that never re-decodes the prefix.

The Decoder and Vocos are convolution stacks with a finite receptive field, and the ISTFT is an overlap-add, so
a span of output samples depends only on a bounded window of GPT states. Each new chunk of states is rendered
over just the window its final samples need (receptive radius on both sides), and the samples are emitted once
no future state can change them. The concatenated stream equals the whole-utterance decode up to float rounding.
On CUDA the rendering runs on a stream of its own, so it overlaps the GPT steps the engine has queued ahead.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import numpy as np
import torch
from torch import Tensor

from .models import TTSModel
from .plan import render_stream
from .prompt import encode_prompts, to_device
from .sampling import SamplingParams
from .text import sentence_pieces


class StreamRenderer:
    """Feed GPT states (n, D) as they arrive; get final 24 kHz samples back."""

    def __init__(self, model: TTSModel):
        self.model = model
        v = model.cfg.vocos
        self.hop, self.n_fft = v.hop, v.n_fft
        self.r_dec = model.decoder.receptive_radius  # mel frames
        self.r_voc = model.vocos.receptive_radius  # mel frames
        self.hidden: list[Tensor] = []
        self.steps = 0
        self.emitted = 0  # samples already returned
        self.window = model.vocos.window.float()
        device = self.window.device
        self.side = torch.cuda.Stream(device) if device.type == "cuda" else None
        # the fewest GPT states after which push() returns samples: ask the engine for them at that point
        self.first_audio_step = (self.r_dec + self.r_voc + self.n_fft // (2 * self.hop)) // 2 + 1

    @property
    def overlaps(self) -> bool:
        """Whether rendering runs beside the GPT steps (its own CUDA stream): worth asking the engine to run ahead."""
        return self.side is not None

    def push(self, hidden: Tensor, ready: "torch.cuda.Event | None" = None) -> np.ndarray:
        """hidden (n, D); ready: the event after which hidden is complete (Chunk.ready) on CUDA."""
        if hidden.shape[0]:
            if self.side is not None:  # wait for these states only, not for the steps queued after them
                if ready is not None:
                    self.side.wait_event(ready)
                else:
                    self.side.wait_stream(torch.cuda.current_stream(hidden.device))
                hidden.record_stream(self.side)  # the allocator must not reuse it before the side stream is done
        self._append(hidden)
        return self._render(self.emitted, self._final_sample(), frames=None)

    def _append(self, hidden: Tensor) -> None:
        if hidden.shape[0]:
            self.hidden.append(hidden)
            self.steps += hidden.shape[0]

    def _final_sample(self) -> int:
        """Samples before this one are final: no future state can change them."""
        final_spec = 2 * self.steps - self.r_dec - self.r_voc  # spectrum frames no future state can change
        return final_spec * self.hop - self.n_fft // 2

    def finish(self) -> np.ndarray:
        if self.steps == 0:
            return np.zeros(0, dtype=np.float32)
        return self._render(self.emitted, self.hop * (2 * self.steps - 1), frames=2 * self.steps)

    @torch.inference_mode()
    def _render(self, t0: int, t1: int, frames: int | None) -> np.ndarray:
        if t1 <= t0:
            return np.zeros(0, dtype=np.float32)
        with torch.cuda.stream(self.side) if self.side is not None else contextlib.nullcontext():
            s0, s1, m0, m1, f0, f1 = w = self._window(t0, t1, frames)
            mel = self.model.hidden_to_mel(self._states(s0, s1)[None])[..., m0 - 2 * s0 : m1 - 2 * s0]
            spec = self.model.vocos.spectrum(mel.to(self.model.vocos.embed.weight.dtype))[0, :, f0 - m0 : f1 - m0]
            return self._samples(spec, t0, t1, w)

    def _window(self, t0: int, t1: int, frames: int | None) -> tuple[int, int, int, int, int, int]:
        """What samples [t0, t1) need: states [s0, s1), mel frames [m0, m1), spectrum frames [f0, f1)."""
        hop, half = self.hop, self.n_fft // 2
        known = 2 * self.steps
        f0 = max(0, (t0 - half) // hop + 1)  # first frame whose window reaches t0
        f1 = min(frames or known, math.ceil((t1 + half) / hop))  # frames whose window starts before t1
        m0, m1 = max(0, f0 - self.r_voc), min(known, f1 + self.r_voc)
        s0, s1 = max(0, (m0 - self.r_dec) // 2), min(self.steps, math.ceil((m1 + self.r_dec) / 2))
        return s0, s1, m0, m1, f0, f1

    def _states(self, s0: int, s1: int) -> Tensor:
        self.hidden = [torch.cat(self.hidden)]
        return self.hidden[0][s0:s1]

    def _samples(self, spec: Tensor, t0: int, t1: int, window: tuple) -> np.ndarray:
        """spec (n_fft/2+1, f1 - f0) -> samples [t0, t1) by inverse FFT and overlap-add."""
        hop, half = self.hop, self.n_fft // 2
        f0, f1 = window[4], window[5]
        frames_t = torch.fft.irfft(spec, n=self.n_fft, dim=0) * self.window[:, None]  # (n_fft, F)
        n = (f1 - f0 - 1) * hop + self.n_fft
        fold = dict(output_size=(1, n), kernel_size=(1, self.n_fft), stride=(1, hop))
        ola = torch.nn.functional.fold(frames_t[None], **fold).view(-1)
        env = torch.nn.functional.fold(
            (self.window**2)[None, :, None].expand(1, -1, f1 - f0).contiguous(), **fold
        ).view(-1)
        start = f0 * hop - half  # sample index of ola[0]
        seg = slice(t0 - start, t1 - start)
        out = (ola[seg] / env[seg].clamp(min=1e-11)).float().cpu().numpy()
        self.emitted = t1
        return out


class Rendered:
    """Audio pieces of several renderers, rendered in batches on the current stream: on CUDA each batch's samples
    are copied to pinned host memory behind an event, so the host need not wait; pieces() waits, ready() asks."""

    def __init__(self, n: int):
        self.n = n
        self.parts: list[tuple[list[int], Tensor, np.ndarray]] = []  # (item indices, samples, piece boundaries)
        self.event: torch.cuda.Event | None = None  # after the last copy (every batch runs on one stream)

    def add(self, idx: list[int], samples: Tensor, bounds: np.ndarray) -> None:
        samples = samples.float()
        if samples.is_cuda:
            host = torch.empty(samples.shape, dtype=samples.dtype, pin_memory=True)
            host.copy_(samples, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
            samples = host
        self.parts.append((idx, samples, bounds))

    def ready(self) -> bool:
        return self.event is None or self.event.query()

    def pieces(self) -> list[np.ndarray]:
        if self.event is not None:
            self.event.synchronize()
        out = [np.zeros(0, dtype=np.float32)] * self.n
        for idx, samples, bounds in self.parts:
            flat = samples.numpy()
            for i, a, b in zip(idx, bounds[:-1], bounds[1:]):
                out[i] = flat[a:b]
        return out


@torch.inference_mode()
def push_many(items: list[tuple[StreamRenderer, Tensor]], defer: bool = False) -> list[np.ndarray] | Rendered:
    """`renderer.push(hidden)` for several renderers of one model at once (on the current stream): their windows run
    through the Decoder and Vocos as one batch, right-padded to the longest. Equal to pushing each alone up to float
    rounding: every emitted sample lies farther than the receptive radius from a window's end, so the padding, like
    the states not known yet, cannot reach it. defer: -> a Rendered whose pieces() are the audio (the host copy not
    waited for)."""
    live = []
    for r, hidden in items:
        r._append(hidden)
        t0, t1 = r.emitted, r._final_sample()
        live.append((r, t0, t1, r._window(t0, t1, None)) if t1 > t0 else None)
    out = Rendered(len(items))
    rows = [(i, *x) for i, x in enumerate(live) if x is not None]
    if rows:
        out.add([i for i, *_ in rows], *_render_windows(rows))
    return out if defer else out.pieces()


@torch.inference_mode()
def finish_many(items: list[tuple[StreamRenderer, Tensor]], defer: bool = False) -> list[np.ndarray] | Rendered:
    """`renderer.finish()` after appending `hidden` (its states not pushed yet), for several renderers at once: the
    last windows end where each one's audio does, so only windows of one shape run as a batch (no padding, which
    would reach the last samples); -> the rest of each one's audio (defer: as push_many's)."""
    groups: dict[tuple, list] = {}
    out = Rendered(len(items))
    for i, (r, hidden) in enumerate(items):
        r._append(hidden)
        if r.steps == 0:
            continue
        t0, t1 = r.emitted, r.hop * (2 * r.steps - 1)
        if t1 <= t0:
            continue
        w = r._window(t0, t1, 2 * r.steps)
        shape = (w[1] - w[0], w[2] - 2 * w[0], w[3] - 2 * w[0], w[4] - w[2], w[5] - w[2], t0 - w[4] * r.hop, t1 - t0)
        groups.setdefault(shape, []).append((i, r, t0, t1, w))
    for rows in groups.values():
        out.add([i for i, *_ in rows], *_render_windows(rows))
    return out if defer else out.pieces()


def _render_windows(rows: list[tuple]) -> tuple[Tensor, np.ndarray]:
    """(index, renderer, t0, t1, window) -> samples [t0, t1) of each, through the Decoder and Vocos as one batch
    (windows right-padded to the longest): (every row's samples in one tensor, each row's bounds in it)."""
    model = rows[0][1].model
    S = max(w[1] - w[0] for *_, w in rows)
    states = torch.stack(
        [torch.nn.functional.pad(r._states(w[0], w[1]), (0, 0, 0, S - (w[1] - w[0]))) for _, r, _, _, w in rows]
    )
    mel = model.hidden_to_mel(states)  # (B, n_mels, 2S)
    M = max(w[3] - w[2] for *_, w in rows)
    mel = torch.stack(
        [
            torch.nn.functional.pad(mel[b, :, w[2] - 2 * w[0] : w[3] - 2 * w[0]], (0, M - (w[3] - w[2])))
            for b, (*_, w) in enumerate(rows)
        ]
    )
    spec = model.vocos.spectrum(mel.to(model.vocos.embed.weight.dtype))  # (B, n_fft/2+1, M)
    # the inverse FFT and overlap-add of all rows at once: spectra right-padded with zeros, which add exact zeros
    hop, n_fft, half, window = rows[0][1].hop, rows[0][1].n_fft, rows[0][1].n_fft // 2, rows[0][1].window
    F = max(w[5] - w[4] for *_, w in rows)
    spec = torch.stack(
        [
            torch.nn.functional.pad(spec[b, :, w[4] - w[2] : w[5] - w[2]], (0, F - (w[5] - w[4])))
            for b, (*_, w) in enumerate(rows)
        ]
    )
    frames_t = torch.fft.irfft(spec, n=n_fft, dim=1) * window[:, None]  # (B, n_fft, F)
    n = (F - 1) * hop + n_fft
    fold = dict(output_size=(1, n), kernel_size=(1, n_fft), stride=(1, hop))
    ola = torch.nn.functional.fold(frames_t, **fold).view(len(rows), n)
    frames = to_device(torch.tensor([w[5] - w[4] for *_, w in rows])[:, None], spec.device)
    present = torch.arange(F, device=spec.device)[None] < frames
    env = torch.nn.functional.fold((window**2)[None, :, None] * present[:, None], **fold).view(len(rows), n)
    segs = [(t0 - (w[4] * hop - half), t1 - (w[4] * hop - half)) for _, _, t0, t1, w in rows]
    ola = ola / env.clamp(min=1e-11)
    samples = torch.cat([ola[b, a:e] for b, (a, e) in enumerate(segs)])  # one copy to the host for the batch
    for _, r, _, t1, _ in rows:
        r.emitted = t1
    return samples, np.cumsum([0] + [e - a for a, e in segs])


def stream_text(
    synth,
    text: str,
    *,
    speaker=None,
    seed: int = 0,
    params: SamplingParams | None = None,
    max_chars: int = 120,
    control_tokens: bool = False,
    refine: bool = False,
    refine_prompt: str = "",
    refine_params: SamplingParams | None = None,
) -> Iterator[np.ndarray]:
    """Yields float32 24 kHz audio pieces as the GPT produces states; sentence by sentence, each refined first
    with refine (as Synthesizer.synthesize's arguments of the same names)."""
    params = params or SamplingParams()
    spk = synth.voice(speaker)
    for i, (_, sentence) in enumerate(sentence_pieces([text], max_chars, control_tokens)):
        if refine:
            sentence = synth.refine_sentences([sentence], refine_prompt, refine_params, seed + i)[0]
        with synth.memory_guard(1):
            emb, valid = encode_prompts(synth.model, [sentence], spk)
            renderer = StreamRenderer(synth.model)
            chunks = synth.engine.stream(
                emb, valid, params, seed=seed + i, first_yield=renderer.first_audio_step, lookahead=renderer.overlaps
            )
            yield from render_stream(chunks, renderer)

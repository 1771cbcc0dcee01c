"""Streaming synthesis that never re-decodes the prefix.

The Decoder and Vocos are convolution stacks with a finite receptive field, and the ISTFT is an overlap-add, so
a span of output samples depends only on a bounded window of GPT states. Each new chunk of states is rendered
over just the window its final samples need (receptive radius on both sides), and the samples are emitted once
no future state can change them. The concatenated stream equals the whole-utterance decode up to float rounding.
On CUDA the rendering runs on a stream of its own, so it overlaps the GPT steps the engine has queued ahead.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator

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
        device = model.vocos.window.device
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
        return self._render(self.emitted, self._final_sample())

    def _append(self, hidden: Tensor) -> None:
        if hidden.shape[0]:
            self.hidden.append(hidden)
            self.steps += hidden.shape[0]

    def _final_sample(self) -> int:
        """Samples before this one are final: no future state can change them."""
        final_spec = 2 * self.steps - self.r_dec - self.r_voc  # spectrum frames no future state can change
        return final_spec * self.hop - self.n_fft // 2

    @property
    def lookback(self) -> int:
        """The most states a window reaches behind the states of the push before it: a caller that keeps the states
        itself (the scheduler's ring) keeps this many besides the new ones."""
        return -(-(2 * (self.r_dec + self.r_voc) + self.n_fft // self.hop - 1) // 2) + 1

    def finish(self) -> np.ndarray:
        if self.steps == 0:
            return np.zeros(0, dtype=np.float32)
        return self._render(self.emitted, self.end_sample)

    @property
    def end_sample(self) -> int:
        """The audio's length once no state follows: one hop per mel frame, two mel frames per state."""
        return self.hop * (2 * self.steps - 1)

    def first_state(self, t0: int) -> int:
        """The first state samples from t0 on depend on (the left end of their window; its right end is always the
        last state). Samples past the window's first n_fft / 2, its mel frames past the Decoder's radius and its
        spectrum frames past Vocos' are those of the whole utterance, so nothing needs cropping."""
        f0 = max(0, (t0 - self.n_fft // 2) // self.hop + 1)  # the first spectrum frame whose window reaches t0
        return max(0, (f0 - self.r_voc - self.r_dec) // 2)

    @torch.inference_mode()
    def _render(self, t0: int, t1: int) -> np.ndarray:
        if t1 <= t0:
            return np.zeros(0, dtype=np.float32)
        with torch.cuda.stream(self.side) if self.side is not None else contextlib.nullcontext():
            self.hidden = [torch.cat(self.hidden)]
            s0 = self.first_state(t0)
            out = Rendered(1)
            out.add([0], *render_windows(self.model, self.hidden[0][None, s0:], [(s0, t0, t1)]))
            self.emitted = t1
            return out.pieces()[0]


class Rendered:
    """Audio pieces of several renderers, rendered in batches on the current stream: on CUDA each batch's samples
    are copied to pinned host memory behind an event, so the host need not wait; pieces() waits, ready() asks."""

    def __init__(self, n: int):
        self.n = n
        self.parts: list[tuple[list[int], Tensor, list[tuple[int, int]]]] = []  # (item indices, samples, spans)
        self.event: torch.cuda.Event | None = None  # after the last copy (every batch runs on one stream)

    def add(self, idx: list[int], samples: Tensor, spans: list[tuple[int, int]]) -> None:
        """samples (len(idx), L); item idx[j]'s piece is samples[j, a:b] for (a, b) = spans[j]."""
        samples = samples.float()
        if samples.is_cuda:
            host = torch.empty(samples.shape, dtype=samples.dtype, pin_memory=True)
            host.copy_(samples, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
            samples = host
        self.parts.append((idx, samples, spans))

    def ready(self) -> bool:
        return self.event is None or self.event.query()

    def pieces(self) -> list[np.ndarray]:
        if self.event is not None:
            self.event.synchronize()
        out = [np.zeros(0, dtype=np.float32)] * self.n
        for idx, samples, spans in self.parts:
            block = samples.numpy()
            for j, (i, (a, b)) in enumerate(zip(idx, spans)):
                out[i] = block[j, a:b]
        return out


def window_samples(model: TTSModel, states: Tensor) -> Tensor:
    """states (B, S, D), each row a window of GPT states -> (B, n) the samples of each whole window: the Decoder and
    Vocos over the windows, one inverse FFT, overlap-add and its normalisation. A fixed number of kernels whatever B,
    and every shape follows from (B, S): capturable as a CUDA graph per (B, S)."""
    hop, n_fft = model.cfg.vocos.hop, model.cfg.vocos.n_fft
    mel = model.hidden_to_mel(states)  # (B, n_mels, 2S)
    spec = model.vocos.spectrum(mel.to(model.vocos.embed.weight.dtype))  # (B, n_fft/2+1, 2S)
    window = model.vocos.window.float()
    F = spec.shape[-1]
    n = (F - 1) * hop + n_fft
    fold = dict(output_size=(1, n), kernel_size=(1, n_fft), stride=(1, hop))
    ola = torch.nn.functional.fold(torch.fft.irfft(spec, n=n_fft, dim=1) * window[:, None], **fold).view(-1, n)
    env = torch.nn.functional.fold((window**2)[None, :, None].expand(1, -1, F), **fold).view(n)
    return ola / env.clamp(min=1e-11)


def window_spans(model: TTSModel, rows: list[tuple[int, int, int]]) -> tuple[int, int, list[tuple[int, int]]]:
    """rows: each window's (s0, t0, t1) -> (lo, hi, spans): the columns [lo, hi) of window_samples that hold every
    row's samples [t0, t1), and each row's span within them."""
    hop, half = model.cfg.vocos.hop, model.cfg.vocos.n_fft // 2
    # sample 0 of a window is its first frame's first sample: 2 * s0 * hop - half
    spans = [(t0 - (2 * s0 * hop - half), t1 - (2 * s0 * hop - half)) for s0, t0, t1 in rows]
    lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
    return lo, hi, [(a - lo, b - lo) for a, b in spans]


def render_windows(model: TTSModel, states: Tensor, rows: list[tuple[int, int, int]]) -> tuple[Tensor, list]:
    """states (B, S, D): each row's window of GPT states, right-padded with anything to S (B may exceed len(rows):
    padding rows); rows: each one's (s0, t0, t1), its window starting at state s0 and the samples [t0, t1) wanted of
    it. Padding reaches only samples past t1 when t1 is a final sample (StreamRenderer._final_sample): a window that
    ends the utterance (t1 its end_sample) must not be padded. -> (samples (len(rows), L), each row's span in them)."""
    lo, hi, spans = window_spans(model, rows)
    return window_samples(model, states)[: len(rows), lo:hi], spans


@dataclass
class Windows:
    """Windows of GPT states gathered for one batched render: states (B, S, D), right-padded with anything to S,
    and each row's (s0, t0, t1) for render_windows."""

    states: Tensor
    rows: list[tuple[int, int, int]]

    @staticmethod
    def cat(parts: "list[Windows]") -> "Windows":
        return Windows(torch.cat([w.states for w in parts]), [row for w in parts for row in w.rows])

    def pad_rows(self, B: int) -> "Windows":
        """The same windows with zero rows below, B in all (a captured render's batch). Rows only: a window that
        ends its utterance must keep its length, and padding rows render apart from the others."""
        extra = B - self.states.shape[0]
        if extra <= 0:
            return self
        return Windows(torch.cat([self.states, self.states.new_zeros(extra, *self.states.shape[1:])]), self.rows)


@torch.inference_mode()
def gather_ring(
    ring: Tensor,
    items: list[tuple[int, StreamRenderer, int]],
    finish: bool = False,
    pad: Callable[[int, int], tuple[int, int]] | None = None,
) -> list[tuple[list[int], Windows]]:
    """The windows several renderers render next, gathered (on the current stream) from states a caller keeps:
    state s of item (i, renderer, n) at ring[i, s % R]. Each renderer takes n new states first (they must be in the
    ring already), then counts as having emitted its window's samples: with finish, the rest of its audio, else
    what its states make final. -> (item indices, their windows) per batch; items with nothing to render are in
    none. The ring may be overwritten as soon as the gathers are queued.

    Pushes form one batch (right-padded); pad(rows, length) -> (rows, length) at least those pads it further, with
    zero rows and states (to shapes a captured render has). Finishing windows must end unpadded: each reaches back up
    to R - 1 states (past what its samples need), so all but short utterances share one length, and one batch."""
    R = ring.shape[1]
    groups: dict[int, list] = {}  # window length (0 for pushes) -> [(item, renderer, ring row, s0, t0, t1)]
    for j, (i, r, n) in enumerate(items):
        r.steps += n
        t0, t1 = r.emitted, (r.end_sample if finish else r._final_sample())
        if r.steps == 0 or t1 <= t0:
            continue
        s0 = r.first_state(t0)
        if finish:
            s0 = min(s0, max(0, r.steps - (R - 1)))
        if r.steps - s0 > R - 1:  # the state R back may be overwritten by the step queued after these
            raise RuntimeError(f"a window of {r.steps - s0} states outgrew a ring of {R}: R must exceed it")
        groups.setdefault(r.steps - s0 if finish else 0, []).append((j, r, i, s0, t0, t1))
    out = []
    for length, rows in groups.items():
        B, S = len(rows), max(r.steps - s0 for _, r, _, s0, _, _ in rows)
        if pad is not None and length == 0:
            B, S = pad(B, S)
        pos = np.full((B, S), -1, dtype=np.int64)
        for k, (_, r, _, s0, _, _) in enumerate(rows):
            pos[k, : r.steps - s0] = np.arange(s0, r.steps) % R
        pos_d = to_device(torch.from_numpy(pos), ring.device)
        ring_rows = [i for _, _, i, *_ in rows] + [0] * (B - len(rows))  # padding rows read row 0, masked to zeros
        at = to_device(torch.tensor(ring_rows)[:, None], ring.device)
        states = torch.where((pos_d >= 0)[..., None], ring[at, pos_d.clamp(min=0)], 0)
        out.append(([j for j, *_ in rows], Windows(states, [(s0, t0, t1) for *_, s0, t0, t1 in rows])))
        for _, r, _, _, _, t1 in rows:
            r.emitted = t1
    return out


@torch.inference_mode()
def render_gathered(
    model: TTSModel,
    n: int,
    batches: list[tuple[list[int], Windows]],
    side: "torch.cuda.Stream | None" = None,
    samples: Callable[[Tensor], Tensor | None] | None = None,
) -> Rendered:
    """Render gather_ring's batches for n items, on `side` when given (after what the current stream has queued).
    samples(states) may give window_samples' result itself (a captured render of that shape), or None (rendered
    here). -> the items' pieces, deferred."""
    out = Rendered(n)
    if side is not None:
        side.wait_stream(torch.cuda.current_stream(side.device))
        for _, w in batches:  # the allocator must not hand them out again before the side stream is done
            w.states.record_stream(side)
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        for idx, w in batches:
            whole = samples(w.states) if samples is not None else None
            if whole is None:
                whole = window_samples(model, w.states)
            lo, hi, spans = window_spans(model, w.rows)
            out.add(idx, whole[: len(w.rows), lo:hi], spans)
    return out


def render_ring(
    model: TTSModel,
    ring: Tensor,
    items: list[tuple[int, StreamRenderer, int]],
    finish: bool = False,
    side: "torch.cuda.Stream | None" = None,
    pad: Callable[[int, int], tuple[int, int]] | None = None,
    samples: Callable[[Tensor], Tensor | None] | None = None,
) -> Rendered:
    """gather_ring, then render_gathered: the items' pieces, deferred."""
    return render_gathered(model, len(items), gather_ring(ring, items, finish, pad), side, samples)


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

"""Continuous batching: a request joins the running decode batch at a step boundary and leaves it when done.

The scheduler owns a KV cache of `slots` rows. Active requests hold rows [0, n), so each step runs at batch n on
views of the cache, and a finished request's row is refilled by the last one (a row copy). All rows write the same
cache position `pos` per step; a request that joins is prefilled into its own row just below it, [pos - T, pos),
over keys of the row's previous owner that its mask hides, so it never waits for the others to finish. When `pos`
reaches the cache's end every row shifts left by the oldest row's start.

Each row samples with its own generator (seeded like `Engine.generate`'s batch of one), step counter and
repetition history, and attention reads a cache length bucketed as the engine's: a request served alone yields the
codes `Synthesizer.synthesize` yields at batch 1, and in company the same up to the float rounding of batched
matmuls. Audio is rendered as it comes (toolkit.streaming), the rows due at a step in one batch. The text is split
into sentences and seeded as `ttsq synth --batch-size 1` does (`Plan`); they run one after another in the request's
row.

    sched = Scheduler(Synthesizer(), slots=8)
    job = sched.submit("Hello there.", speaker="m1", seed=0)   # raises QueueFull when the queue is full
    for kind, data in job.events(): ...   # ("audio", float32 array)..., then ("end", outcome) or ("error", exc)
"""

from __future__ import annotations

import contextlib
import itertools
import math
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import torch
from torch import Tensor, nn

from .engine import CACHE_BUCKET, NumericalError
from .models.gpt import KVCache
from .plan import Plan
from .prompt import Voice, encode_prompts
from .sampling import SamplingParams, sample_codes
from .streaming import StreamRenderer, push_many
from .synthesizer import OutOfMemory, Synthesizer, _is_out_of_memory


class QueueFull(RuntimeError):
    def __init__(self, retry_after: int):
        super().__init__(f"the queue is full; retry in about {retry_after} s")
        self.retry_after = retry_after


class Closed(RuntimeError):
    """The scheduler is shutting down and takes no new requests."""


@dataclass
class Job:
    """One request: its sentences (text, seed), speaker, and what happened to it. on_event(job, kind, data) is called
    from the scheduler's thread: ("audio", float32 samples), then ("end", "done" | "cancelled") or ("error", exc)."""

    id: int
    sentences: list[tuple[str, int]]
    speaker: Voice
    on_event: Callable[[Job, str, object], None]
    submitted: float = field(default_factory=time.perf_counter)
    first_audio: float | None = None  # perf_counter times
    finished: float | None = None
    samples: int = 0  # audio emitted so far
    steps: int = 0  # GPT steps before EOS, summed over sentences
    outcome: str | None = None  # done, cancelled, failed
    _cancel: threading.Event = field(default_factory=threading.Event)
    _queue: queue.SimpleQueue | None = None  # events, when submitted without on_event

    def cancel(self) -> None:
        """Stop at the next step boundary and free the row (a no-op once finished)."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def events(self) -> Iterator[tuple[str, object]]:
        """The job's events, for a caller that submitted without on_event (blocking)."""
        while True:
            kind, data = self._queue.get()
            yield kind, data
            if kind != "audio":
                return


@dataclass
class _Row:
    job: Job
    sentence: int  # index into job.sentences
    renderer: StreamRenderer
    gen: torch.Generator
    start: int  # cache position of the prompt's first token
    T: int  # prompt length
    limit: int  # steps allowed for this sentence
    steps: int = 0
    pending: list[Tensor] = field(default_factory=list)  # states (D,) not yet rendered


class _CacheView(KVCache):
    """A window of the scheduler's cache that the model's attention writes and reads as its own KVCache."""

    def __init__(self, k: Tensor, v: Tensor):
        nn.Module.__init__(self)
        self.k, self.v = k, v


class Scheduler:
    def __init__(
        self,
        synth: Synthesizer,
        *,
        slots: int = 8,
        max_queue: int = 32,
        params: SamplingParams | None = None,
        chunk: int = 16,
        max_chars: int = 120,
        control_tokens: bool = False,
        cache_len: int | None = None,
    ):
        """slots: requests decoded together at most; max_queue: requests waiting for a slot at most (submit raises
        QueueFull beyond). chunk: steps between renders of a row (and its noise draws, as in the engine).
        cache_len: KV cache positions per row (default the model's max_positions; a sentence's prompt and steps
        must fit in it)."""
        if slots < 1 or max_queue < 0:
            raise ValueError(f"slots must be >= 1 and max_queue >= 0, got {slots} and {max_queue}")
        self.synth, self.slots, self.max_queue, self.chunk = synth, slots, max_queue, chunk
        self.params = params or SamplingParams()
        self.max_chars, self.control_tokens = max_chars, control_tokens
        gpt = self.gpt = synth.model.gpt
        cfg = gpt.cfg
        self.Q, self.V = cfg.num_vq, cfg.num_audio_tokens
        self.L = min(cache_len or cfg.max_positions, cfg.max_positions)
        dev, dtype = synth.device, gpt.norm.weight.dtype
        shape = (slots, cfg.heads, self.L, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=dev) for _ in gpt.layers]
        self.v = [torch.zeros(shape, dtype=dtype, device=dev) for _ in gpt.layers]
        self.key_valid = torch.zeros(slots, self.L, dtype=torch.bool, device=dev)
        self.h = torch.zeros(slots, cfg.hidden, dtype=dtype, device=dev)
        W = self.params.penalty_window
        self.history = torch.full((slots * self.Q, W), self.V, dtype=torch.long, device=dev)
        self.temperature = torch.tensor(self.params.temperatures(self.Q), device=dev).repeat(slots)
        self.noise = torch.ones(slots, chunk, self.Q, self.V, device=dev)
        self.min_new = torch.tensor(self.params.min_new_tokens, device=dev)
        self.run_block = synth.engine._run_block  # compiled where the synthesizer's engine compiles
        self.rows: list[_Row] = []
        self.pos = 0  # the cache position every active row writes next
        self.waiting: deque[Job] = deque()
        self.steps_run = 0  # decode steps so far (each at the batch of that moment)
        self.compactions = 0  # shifts of the cache (pos reached its end)
        self.completed: list[int] = []  # job ids in the order they ended (done, cancelled or failed)
        self._service_s = 1.0  # running mean of a job's time from admission to end, for Retry-After
        self._ids = itertools.count()
        self._cond = threading.Condition()
        self._closing = False
        self._worker = threading.Thread(target=self._run, name="ttsq-scheduler", daemon=True)
        self._worker.start()

    # --- the caller's side (any thread) -----------------------------------------------------
    @property
    def queue_depth(self) -> int:
        return len(self.waiting)

    @property
    def active(self) -> int:
        return len(self.rows)

    def plan(self, text: str, seed: int = 0) -> list[tuple[str, int]]:
        """(sentence, seed) in text order, seeded as `ttsq synth --batch-size 1` seeds them. Raises TextError."""
        plan = Plan.make(text, 1, self.max_chars, self.control_tokens)
        seeds = {idx[0]: seed + b for b, idx in plan.batches()}
        return [(s, seeds[k]) for k, (_, s) in enumerate(plan.pieces)]

    def submit(
        self, text: str, *, speaker=None, seed: int = 0, on_event: Callable[[Job, str, object], None] | None = None
    ) -> Job:
        """Queue a request. Raises TextError / ValueError for bad text or speaker, QueueFull, or Closed."""
        sentences = self.plan(text, seed)
        spk = self.synth.voice(speaker)  # a vector, or sample-audio codes with their transcript
        with self._cond:
            if self._closing:
                raise Closed("the server is shutting down")
            if len(self.waiting) >= self.max_queue + max(0, self.slots - len(self.rows)):
                raise QueueFull(self.retry_after())
            if on_event is None:
                events: queue.SimpleQueue = queue.SimpleQueue()
                job = Job(next(self._ids), sentences, spk, lambda _, *event: events.put(event), _queue=events)
            else:
                job = Job(next(self._ids), sentences, spk, on_event)
            self.waiting.append(job)
            self._cond.notify()
        return job

    def retry_after(self) -> int:
        """Seconds until a queued request would likely get a slot: the waiting jobs' service, spread over slots."""
        return max(1, min(60, math.ceil(self._service_s * (len(self.waiting) + 1) / self.slots)))

    def close(self, drain: bool = True, timeout: float | None = None) -> None:
        """Take no new requests; with drain, finish the queued and running ones first, else cancel them."""
        with self._cond:
            self._closing = True
            if not drain:
                for job in [*self.waiting, *(r.job for r in self.rows)]:
                    job.cancel()
            self._cond.notify()
        self._worker.join(timeout)

    # --- the worker ------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self.waiting and not self.rows and not self._closing:
                    self._cond.wait()
                if self._closing and not self.waiting and not self.rows:
                    return
                admit = [self.waiting.popleft() for _ in range(min(len(self.waiting), self.slots - len(self.rows)))]
            for job in admit:
                if job.cancelled:
                    self._end(job, "cancelled")
                else:
                    self._start(job, 0, len(self.rows))
            for i in reversed(range(len(self.rows))):  # leave at the step boundary
                if self.rows[i].job.cancelled:
                    self._end(self.rows[i].job, "cancelled")
                    self._remove(i)
            if self.rows:
                self._step_or_shed()

    def _start(self, job: Job, sentence: int, row: int) -> bool:
        """Prefill `sentence` of `job` into cache row `row` (a new row when row == len(rows)). A failure ends the
        job alone (-> False; the caller frees an existing row)."""
        try:
            with torch.inference_mode():
                self._prefill(job, sentence, row)
            return True
        except Exception as e:  # noqa: BLE001 - this request fails, the others go on
            self._fail(job, e)
            return False

    def _prefill(self, job: Job, sentence: int, row: int) -> None:
        gpt, synth = self.gpt, self.synth
        text, seed = job.sentences[sentence]
        emb, _ = encode_prompts(synth.model, [text], job.speaker)  # (1, T, D)
        T = emb.shape[1]
        limit = min(self.params.max_new_tokens, self.L - T)
        if limit < 1:
            raise ValueError(f"a sentence of {T} prompt tokens leaves no room to generate; use shorter sentences")
        if self.pos < T:  # room below pos for the prompt; positions >= pos are masked in every row
            self.pos = T
        start = self.pos - T
        r = _Row(
            job,
            sentence,
            StreamRenderer(synth.model),
            torch.Generator(device=synth.device).manual_seed(seed),
            start,
            T,
            limit,
        )
        self.key_valid[row] = False
        self.key_valid[row, start : self.pos] = True
        dev = synth.device
        with self._cache_view(slice(row, row + 1), self._cache_len([r])):
            h = gpt(
                emb.to(gpt.norm.weight.dtype),
                torch.arange(start, self.pos, device=dev),
                torch.arange(T, device=dev)[None],
                self.run_block,
            )[:, -1]
        self.h[row] = h[0]
        Q = self.Q
        self.history[row * Q : (row + 1) * Q] = self.V
        if row == len(self.rows):
            self.rows.append(r)
        else:
            self.rows[row] = r

    def _step_or_shed(self) -> None:
        """One decode step; an out-of-memory error sheds the newest request (the rest retry the step)."""
        try:
            with torch.inference_mode():
                self._step()
        except Exception as e:  # noqa: BLE001
            if not (isinstance(e, RuntimeError) and _is_out_of_memory(e)):
                for i in reversed(range(len(self.rows))):  # a bug: nobody's state can be trusted
                    self._fail(self.rows[i].job, e)
                    self._remove(i)
                self.pos = 0
                return
            newest = max(range(len(self.rows)), key=lambda i: self.rows[i].job.submitted)
            self._fail(self.rows[newest].job, e)
            self._remove(newest)
            if self.synth.device.type == "cuda":
                torch.cuda.empty_cache()

    def _step(self) -> None:
        rows, n, Q, V, chunk = self.rows, len(self.rows), self.Q, self.V, self.chunk
        gpt, dev = self.gpt, self.synth.device
        if self.pos >= self.L:
            self._compact()
        for i, r in enumerate(rows):  # each row's noise per chunk of its own steps, as Engine draws it
            if r.steps % chunk == 0:
                self.noise[i].exponential_(1, generator=r.gen)
        steps = torch.tensor([r.steps for r in rows], device=dev)
        noise = self.noise[torch.arange(n, device=dev), steps % chunk].view(n * Q, V)
        step_q = steps.repeat_interleave(Q)
        logits = gpt.code_logits(self.h[:n])  # (n, Q, V)
        bad = ~torch.isfinite(logits).flatten(1).all(-1)  # read with the EOS flags: no extra sync
        ids = sample_codes(
            logits.view(n * Q, V),
            self.history[: n * Q],
            self.temperature[: n * Q],
            noise,
            step_q,
            self.min_new,
            self.params,
            gpt.cfg.eos_code,
        ).view(n, Q)
        x = gpt.embed_codes(ids)[:, None].to(self.h.dtype)
        rope = torch.tensor([[r.T + r.steps] for r in rows], device=dev)
        self.key_valid[:n, self.pos] = True
        with self._cache_view(slice(0, n), self._cache_len(rows)):
            out = gpt(x, torch.tensor([self.pos], device=dev), rope, self.run_block)[:, 0]
        # committed only now: a step that failed (out of memory) leaves the state as it was, to be retried
        self.history[: n * Q].scatter_(1, (step_q % self.params.penalty_window)[:, None], ids.view(n * Q, 1))
        before = self.h[:n].clone()
        self.h[:n] = out
        self.pos += 1
        self.steps_run += 1
        eos, bad = torch.stack([(ids == gpt.cfg.eos_code).any(-1), bad]).tolist()
        done, due, ended = set(), [], []
        for i, r in enumerate(rows):
            r.steps += 1
            if bad[i]:  # NaN logits never sample EOS: the request would be noise to its step limit
                self._fail(
                    r.job,
                    NumericalError(
                        "the GPT's code logits are NaN/inf: the model's head_code or last "
                        "layers hold non-finite values, or overflowed; check the checkpoint"
                    ),
                )
                done.add(i)
                continue
            if not eos[i]:
                r.pending.append(before[i])
                r.job.steps += 1
            if eos[i] or r.steps >= r.limit:
                ended.append(i)
            elif len(r.pending) >= chunk or r.renderer.steps + len(r.pending) == r.renderer.first_audio_step:
                due.append(i)
        done.update(self._render_due([rows[i] for i in due], due))
        for i in ended:  # a sentence's end renders alone: its last window ends where the audio does, not padded
            r = rows[i]
            if not self._render_end(r):
                done.add(i)
            elif r.sentence + 1 < len(r.job.sentences):
                if not self._start(r.job, r.sentence + 1, i):
                    done.add(i)
            else:
                self._end(r.job, "done")
                done.add(i)
        for i in sorted(done, reverse=True):
            self._remove(i)

    def _render_due(self, rows: list[_Row], idx: list[int]) -> list[int]:
        """Render the rows' pending states as one batch (streaming.push_many) and emit the audio; -> the indices of
        rows whose request failed (all of them if the batch did)."""
        if not rows:
            return []
        try:
            pieces = push_many([(r.renderer, torch.stack(r.pending)) for r in rows])
        except Exception as e:  # noqa: BLE001 - these requests fail, the others go on
            for r in rows:
                self._fail(r.job, e)
            return idx
        for r, piece in zip(rows, pieces):
            r.pending = []
            self._emit(r, piece)
        return []

    def _render_end(self, r: _Row) -> bool:
        """Render the rest of the row's sentence and emit it; False if that failed (the request failed)."""
        try:
            pieces = [r.renderer.push(torch.stack(r.pending))] if r.pending else []
            r.pending = []
            pieces.append(r.renderer.finish())
        except Exception as e:  # noqa: BLE001 - a rendering failure ends this request alone
            self._fail(r.job, e)
            return False
        for piece in pieces:
            self._emit(r, piece)
        return True

    def _emit(self, r: _Row, piece: np.ndarray) -> None:
        if piece.size:
            if r.job.first_audio is None:
                r.job.first_audio = time.perf_counter()
            r.job.samples += piece.size
            r.job.on_event(r.job, "audio", piece)

    # --- bookkeeping -------------------------------------------------------------------------
    def _cache_len(self, rows: list[_Row]) -> int:
        """Cache positions attention reads: the engine's bucketed length (its next chunk's end, in CACHE_BUCKETs)."""
        need = max(r.start + r.T + min((r.steps // self.chunk + 1) * self.chunk, r.limit) for r in rows)
        need = max(need, self.pos + 1)
        return min(-(-need // CACHE_BUCKET) * CACHE_BUCKET, self.L)

    @contextlib.contextmanager
    def _cache_view(self, rows: slice, length: int):
        """The model's attention reads and writes rows `rows`, positions [0, length) of this scheduler's cache."""
        gpt = self.gpt
        saved = [layer.attention.kv_cache for layer in gpt.layers], gpt.key_valid
        for layer, k, v in zip(gpt.layers, self.k, self.v):
            layer.attention.kv_cache = _CacheView(k[rows, :, :length], v[rows, :, :length])
        gpt.key_valid = self.key_valid[rows, :length]
        try:
            yield
        finally:
            for layer, c in zip(gpt.layers, saved[0]):
                layer.attention.kv_cache = c
            gpt.key_valid = saved[1]

    def _compact(self) -> None:
        """Shift every row left by the oldest row's start, so that `pos` fits in the cache again."""
        n = len(self.rows)
        shift = min(r.start for r in self.rows)
        if shift <= 0:
            raise RuntimeError("the KV cache is full: no row can shift")  # rows never outgrow max_positions
        for k, v in zip(self.k, self.v):
            k[:n, :, : self.pos - shift] = k[:n, :, shift : self.pos].clone()
            v[:n, :, : self.pos - shift] = v[:n, :, shift : self.pos].clone()
        self.key_valid[:n, : self.pos - shift] = self.key_valid[:n, shift : self.pos].clone()
        self.key_valid[:n, self.pos - shift :] = False
        self.pos -= shift
        self.compactions += 1
        for r in self.rows:
            r.start -= shift

    def _remove(self, i: int) -> None:
        """Free row i: the last row moves into it, so active rows stay [0, n)."""
        last = len(self.rows) - 1
        if i != last:
            for k, v in zip(self.k, self.v):
                k[i] = k[last]
                v[i] = v[last]
            for t in (self.key_valid, self.h, self.noise):
                t[i] = t[last]
            Q = self.Q
            self.history[i * Q : (i + 1) * Q] = self.history[last * Q : (last + 1) * Q]
            self.rows[i] = self.rows[last]
        self.rows.pop()
        if not self.rows:
            self.pos = 0  # idle: the next request starts at the cache's beginning, as the engine does

    def _end(self, job: Job, outcome: str) -> None:
        job.outcome, job.finished = outcome, time.perf_counter()
        self._service_s += 0.2 * ((job.finished - job.submitted) - self._service_s)
        self.completed.append(job.id)
        job.on_event(job, "end", outcome)

    def _fail(self, job: Job, e: Exception) -> None:
        if isinstance(e, RuntimeError) and _is_out_of_memory(e):
            e = OutOfMemory(
                f"{self.synth.device} ran out of memory serving this request; it was dropped and the "
                "server serves on. Retry, or send shorter texts"
            )
        job.outcome, job.finished = "failed", time.perf_counter()
        self.completed.append(job.id)
        job.on_event(job, "error", e)

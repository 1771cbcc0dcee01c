"""Continuous batching: a request joins the running decode batch at a step boundary and leaves it when done.

The scheduler owns a KV cache of `slots` rows. Active requests hold rows [0, n), so each step runs at batch n on
views of the cache, and a finished request's row is refilled by the last one (a row copy). All rows write the same
cache position `pos` per step; a request that joins is prefilled into its own row just below it, [pos - T, pos),
over keys of the row's previous owner that its mask hides, so it never waits for the others to finish. When `pos`
reaches the cache's end every row shifts left by the oldest row's start.

Each row samples with its own generator (seeded like `Engine.generate`'s batch of one), step counter and
repetition history, and attention reads a cache length bucketed as the engine's: a request served alone yields the
codes `Synthesizer.synthesize` yields at batch 1, and in company the same up to the float rounding of batched
matmuls. Audio is rendered as it comes (toolkit.streaming): every `render_every` steps all rows' new states in one
batch, a row's first audio as soon as its states allow (and a request's second piece `chunk` steps after, so a
player starting on the first never runs dry before the next batch); the windows are gathered from a ring of each
row's states, so a render costs a fixed number of kernels whatever the rows. Sentences that end have their last
windows gathered at once and rendered together with the next renders, or within `chunk` steps (windows of one
length in one batch).
The text is split into sentences and seeded as `ttsq synth --batch-size 1` does (`Plan`); they run one after another
in the request's row.

A step reads and writes only fixed device buffers (each row's step counter, rope base and the write position live
on the device; the states it samples from go to a ring per row that the renders read), so on CUDA it is captured as
a CUDA graph per (batch bucket, cache bucket) and replayed: the active rows are padded to the next of a few batch
sizes (the padding rows compute on free cache rows that no one reads). On CUDA the prompts that start at a step
(requests admitted, sentences that follow) are prefilled as one left-padded batch, a graph per (batch bucket,
prompt length in PREFILL_BUCKETs). The cache compacts early when that lowers the bucket attention reads.

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
import warnings
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import torch
from torch import Tensor, nn

from .engine import CACHE_BUCKET, PREFILL_BUCKET, CaptureError, NumericalError, sync_device
from .models.gpt import KEY_BLOCK, KVCache, attention_bound, bounded_attention, call_block
from .plan import Plan
from .prompt import Voice, encode_prompts, to_device
from .sampling import SamplingParams, sample_codes
from .streaming import Rendered, StreamRenderer, Windows, gather_ring, render_gathered, render_ring, window_samples
from .synthesizer import OutOfMemory, Synthesizer, _is_out_of_memory

RENDER_WINDOW_BUCKET = 32  # a captured render's window length is a multiple of this (at most the ring's - 1)
PREFILL_GRAPH_MAX = 256  # prompts up to this many tokens prefill through graphs (longer ones, rare, without)
# with compile, the step compiles once per (batch bucket, cache bucket): fewer, coarser buckets bound the warm-up
COMPILED_BATCHES = (16, 32)  # and slots
COMPILED_CACHE_BUCKET = 2 * CACHE_BUCKET
BOUNDED_CACHE_BUCKET = CACHE_BUCKET // 4  # with bounded_attention a bucket costs a graph capture, not a compile


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
class _Ends:
    """Sentence ends waiting to be rendered together (Scheduler._flush_ends): their windows, gathered at `step`."""

    jobs: list[Job]
    last: list[bool]  # whether it was the job's last sentence
    batches: list[tuple[list[int], Windows]]
    step: int


@dataclass
class _Row:
    job: Job
    sentence: int  # index into job.sentences
    renderer: StreamRenderer
    gen: torch.Generator
    start: int  # cache position of the prompt's first token
    T: int  # prompt length
    limit: int  # steps allowed for this sentence
    steps: int = 0  # steps queued
    taken: int = 0  # steps whose outcome the host has taken in (one fewer while a step is in flight)
    pending: int = 0  # states in the ring not yet rendered (they follow the renderer's own `steps`)
    ended_at: int | None = None  # parked: its sentence ended at this step; the next one waits for its prefill


class _CacheView(KVCache):
    """A window of the scheduler's cache that the model's attention writes and reads as its own KVCache."""

    def __init__(self, k: Tensor, v: Tensor):
        nn.Module.__init__(self)
        self.k, self.v = k, v


class _RowsCache(KVCache):
    """Whole cache buffers that the model writes at its batch's rows and reads up to `length` positions: in a compiled
    step the buffers stay whole graph inputs (views sliced outside made inductor copy them: benchmarks/README.md)."""

    def __init__(self, k: Tensor, v: Tensor, length: int | None):
        nn.Module.__init__(self)
        self.k, self.v, self.length = k, v, length

    def update(self, pos: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        # written through the whole buffers, by index: a write through a view of a graph input (self.k[:B]) made
        # inductor copy the whole buffer back every step
        B = k.shape[0]
        rows = torch.arange(B, device=k.device)[:, None]
        self.k[rows, :, pos[None]] = k.transpose(1, 2).to(self.k.dtype)  # (B, T, H, K) at [rows, :, pos]
        self.v[rows, :, pos[None]] = v.transpose(1, 2).to(self.v.dtype)
        if self.length is None:
            return self.k, self.v
        return self.k[:B, :, : self.length], self.v[:B, :, : self.length]


class _BoundedRowsCache(_RowsCache):
    """_RowsCache whose attention is gpt.bounded_attention over the whole buffers: the length it reads is set around
    each captured step (attention_bound), so that one compiled step serves every cache bucket."""

    def __init__(self, k: Tensor, v: Tensor):
        super().__init__(k, v, None)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        return bounded_attention(q, k, v, mask)


def batch_buckets(slots: int, compiled: bool = False) -> list[int]:
    """The batch sizes a step runs at (active rows padded up to the next): 1, 2, 4, multiples of 8, and slots; with
    compiled, COMPILED_BATCHES and slots (each size is a compile)."""
    if compiled:
        return sorted({b for b in COMPILED_BATCHES if b < slots} | {slots})
    sizes = {b for b in (1, 2, 4) if b < slots} | set(range(8, slots, 8)) | {slots}
    return sorted(sizes)


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
        graphs: bool | None = None,
        batch_prefill: bool | None = None,
        render_every: int | None = None,
        compile: bool = False,
        sparse_attention: bool = False,
        bounded_attention: bool | None = None,
        cache_bucket: int | None = None,
        render_first: bool = False,
        render_graphs: bool | None = None,
        prefill_wait: int | None = None,
        profile: bool = False,
    ):
        """slots: requests decoded together at most; max_queue: requests waiting for a slot at most (submit raises
        QueueFull beyond). chunk: steps between renders (and a row's noise draws, as in the engine).
        cache_len: KV cache positions per row (default the model's max_positions; a sentence's prompt and steps
        must fit in it). graphs: replay each step as a CUDA graph at padded batch sizes (None: on CUDA where the
        synthesizer's engine uses graphs). batch_prefill: prefill the requests admitted together as one batch
        (None: on CUDA; elsewhere each alone, which gives synthesize()'s codes exactly). render_every: steps between
        the renders of every row's new states (default 2 * chunk, 4 * chunk with compile: fewer, larger batches cost
        less, and the steps compile makes short leave the renders the larger share). compile:
        torch.compile the whole decode step (sampler, every block, bookkeeping) with static shapes; on CUDA the
        compiled step is captured as the step's graph, and warm_up() compiles for seconds per batch bucket
        (COMPILED_BATCHES). bounded_attention (None: with compile, unless sparse_attention): the compiled step's
        attention is an op compile does not trace (gpt.bounded_attention), its cache length set per captured graph,
        so one compile per batch bucket serves every cache bucket and the buckets can be fine (BOUNDED_CACHE_BUCKET);
        without it, compile traces attention once per (batch bucket, cache bucket) at coarser buckets
        (COMPILED_CACHE_BUCKET). sparse_attention: the compiled step's attention reads only the blocks of KEY_BLOCK
        cache positions that hold each row's keys (flex attention, GPT.forward key_first; needs compile; opt-in: it
        did not pay at the cache lengths measured, benchmarks/README.md). cache_bucket: the cache lengths attention
        reads are rounded up to (default CACHE_BUCKET, COMPILED_CACHE_BUCKET with compile, BOUNDED_CACHE_BUCKET with
        bounded_attention): a finer bucket reads fewer masked positions, at one graph (and without
        bounded_attention a compile) more per bucket. render_first: the renders' CUDA stream at the highest
        priority, so that a render (a first audio) finishes before the steps queued beside it rather than sharing
        the device with them (an experiment, not yet timed). render_graphs (None: with compile and graphs):
        warm_up() also captures the push renders (Decoder, Vocos, overlap-add) as CUDA graphs per batch bucket and
        window bucket (RENDER_WINDOW_BUCKET), and sentence ends replay them padded with rows, so that a render costs
        the host one replay instead of hundreds of launches while the steps wait for it (needs graphs). prefill_wait:
        steps a request's next sentence may wait for its prefill, its row parked, so that it shares one prefill
        with others' (those waiting, and new requests: they never wait); 0 prefills it at once (None: chunk with
        compile, else 0: batched prefills pay on CUDA, where compile runs). profile:
        sync the device around prefill, step and render and add their seconds to `timings` (slower; benchmarks)."""
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
        cuda = dev.type == "cuda"
        self.graphs = (cuda and synth.engine.cuda_graphs) if graphs is None else graphs
        if self.graphs and not cuda:
            raise ValueError(f"graphs=True needs a CUDA device, not {dev}")
        self.batch_prefill = cuda if batch_prefill is None else batch_prefill
        # one row past the slots: a batched prefill's padding rows write there (SCRATCH), so its graph writes the
        # rows' caches itself whatever the batch
        shape = (slots + 1, cfg.heads, self.L, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=dev) for _ in gpt.layers]
        self.v = [torch.zeros(shape, dtype=dtype, device=dev) for _ in gpt.layers]
        self.key_valid = torch.zeros(slots + 1, self.L, dtype=torch.bool, device=dev)
        self.h = torch.zeros(slots + 1, cfg.hidden, dtype=dtype, device=dev)
        W = self.params.penalty_window
        self.history = torch.full((slots * self.Q, W), self.V, dtype=torch.long, device=dev)
        self.temperature = torch.tensor(self.params.temperatures(self.Q), device=dev).repeat(slots)
        self.noise = torch.ones(slots, chunk, self.Q, self.V, device=dev)
        self.min_new = torch.tensor(self.params.min_new_tokens, device=dev)
        # the step's per-row state on the device, so that a step reads nothing from the host
        self.render_every = render_every or (4 if compile else 2) * chunk
        # ring of the states each row sampled from, which the renders gather their windows from: the new states
        # (pending <= render_every), those a window reaches back to, and slack for the step in flight
        self.R = self.render_every + chunk + StreamRenderer(synth.model).lookback
        self.ring = torch.zeros(slots, self.R, cfg.hidden, dtype=dtype, device=dev)
        self.row_steps = torch.zeros(slots, dtype=torch.long, device=dev)  # steps of the row's sentence so far
        self.rope_base = torch.zeros(slots, dtype=torch.long, device=dev)  # its prompt length
        self.pos_d = torch.zeros((), dtype=torch.long, device=dev)
        self.flags = torch.zeros(2, slots, dtype=torch.bool, device=dev)  # EOS sampled, logits not finite
        self.rows_index = torch.arange(slots, device=dev)
        self.compiled = compile
        self.sparse_attention = sparse_attention
        if sparse_attention and not compile:
            raise ValueError("sparse_attention needs compile=True: flex attention is slow unless compiled")
        if render_graphs is None:
            render_graphs = compile and self.graphs
        if render_graphs and not self.graphs:
            raise ValueError("render_graphs needs graphs (a CUDA device with CUDA graphs on)")
        self.render_graphs = render_graphs
        if prefill_wait is None:
            prefill_wait = chunk if compile else 0
        if prefill_wait < 0:
            raise ValueError(f"prefill_wait must be >= 0 steps, got {prefill_wait}")
        self.prefill_wait = prefill_wait
        self._renders: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, Tensor, Tensor]] = {}  # (B, S) -> graph,
        # its input windows and its samples
        self._render_pool = None  # the render graphs' own: they run beside the steps' graphs, never beside each other
        self.buckets = batch_buckets(slots, compile)  # the step's
        self.prefill_buckets = batch_buckets(slots)
        if bounded_attention is None:
            bounded_attention = compile and not sparse_attention
        if bounded_attention and (not compile or sparse_attention):
            raise ValueError("bounded_attention needs compile=True and sparse_attention=False")
        self.bounded_attention = bounded_attention
        default_bucket = COMPILED_CACHE_BUCKET if compile else CACHE_BUCKET
        self.cache_bucket = cache_bucket or (BOUNDED_CACHE_BUCKET if bounded_attention else default_bucket)
        if self.cache_bucket < 1 or (sparse_attention and self.cache_bucket % KEY_BLOCK):
            raise ValueError(f"cache_bucket must be positive (a multiple of {KEY_BLOCK} with sparse_attention)")
        self._views: dict[tuple, tuple] = {}  # (rows, length) -> the cache views attention gets (one per shape)
        self._decode_core: Callable[[int], None] = self._decode_rows
        if compile:
            import torch._dynamo as dynamo

            # one compile per (batch bucket, cache bucket): past the limit dynamo would fall back to eager silently
            dynamo.config.cache_size_limit = max(dynamo.config.cache_size_limit, 256)
            dynamo.config.accumulated_cache_size_limit = max(dynamo.config.accumulated_cache_size_limit, 1024)
            self._decode_core = torch.compile(self._decode_rows, fullgraph=True, dynamic=False)
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}  # steps (nb, S), prefills ("prefill", mb, Tb)
        self._pf: dict | None = None  # the prefill graphs' buffers
        self._inflight: tuple | None = None  # the step queued last, its outcome not taken in yet
        self._pool = None  # one memory pool for every captured step (they never run at once)
        # renders run on a stream of their own beside the steps; their audio reaches the jobs through the outbox, in
        # order, once its copy to the host is done: (Rendered or None, what to do then)
        # (a priority past the device's range is clamped to its highest)
        self._side = torch.cuda.Stream(dev, priority=-100 if render_first else 0) if cuda else None
        self._outbox: deque[tuple[Rendered | None, Callable[[], None]]] = deque()
        self._ends: list[_Ends] = []  # sentence ends gathered, not yet rendered
        self.run_block = synth.engine._run_block  # compiled where the synthesizer's engine compiles
        self.rows: list[_Row] = []
        self.pos = 0  # the cache position every active row writes next
        self.waiting: deque[Job] = deque()
        self.steps_run = 0  # decode steps so far (each at the batch of that moment)
        self.compactions = 0  # shifts of the cache (pos reached its end, or a shift lowers the cache bucket)
        self.profile = profile
        self.timings: dict[str, list[float]] = {}  # with profile: name -> [seconds, calls]
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

    def warm_up(self, lengths: int | None = None, prompts: int = 128) -> int:
        """Capture the CUDA graphs now, so that no request waits for a capture: the step's for every batch bucket and
        the cache buckets up to `lengths` positions (default the whole cache), the prefill's for prompts up to
        `prompts` tokens; a no-op without graphs. Call it before any request is submitted. -> graphs captured."""
        if not self.graphs:
            return 0
        top = min(lengths or self.L, self.L)
        cb = self.cache_bucket
        sizes = sorted({min(b * cb, self.L) for b in range(1, -(-top // cb) + 1)})
        with self._cond:  # the worker idles while nothing is submitted; this keeps it from starting meanwhile
            if self.rows or self.waiting:
                raise RuntimeError("warm_up() captures on an idle scheduler: call it before submitting requests")
            before = len(self._graphs)
            with torch.inference_mode():
                for S in sizes:
                    for nb in self.buckets:
                        self._graph(nb, S)
                for Tb in range(PREFILL_BUCKET, prompts + 1, PREFILL_BUCKET):
                    for mb in self.prefill_buckets:
                        self._prefill_graph(mb, Tb)
                if self.render_graphs:
                    try:
                        for S in self._render_windows():
                            for B in self.buckets:
                                self._capture_render(B, S)
                    except CaptureError as e:
                        warnings.warn(
                            f"the scheduler's renders cannot be captured in CUDA graphs ({e}); rendering without",
                            RuntimeWarning,
                            stacklevel=2,
                        )
                        self._renders.clear()
            return len(self._graphs) - before + len(self._renders)

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
            if not self.rows:  # idle: whatever is still on its way to the host goes out now
                self._flush_ends()
                self._deliver(wait=True)
            with self._cond:
                while not self.waiting and not self.rows and not self._closing:
                    self._cond.wait()
                if self._closing and not self.waiting and not self.rows:
                    return
                admit = [self.waiting.popleft() for _ in range(min(len(self.waiting), self.slots - len(self.rows)))]
            live = []
            for job in admit:
                if job.cancelled:
                    self._end(job, "cancelled")
                else:
                    live.append(job)
            for i in reversed(range(len(self.rows))):  # leave at the step boundary
                if self.rows[i].job.cancelled:
                    self._end(self.rows[i].job, "cancelled")
                    self._remove(i)
            self._start_rows(live)
            if self.rows:
                self._step_or_shed()

    @contextlib.contextmanager
    def _timed(self, name: str):
        """With profile: the section's seconds, the device drained before and after, added to timings[name]."""
        if not self.profile:
            yield
            return
        sync_device(self.synth.device)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            sync_device(self.synth.device)
            t = self.timings.setdefault(name, [0.0, 0])
            t[0] += time.perf_counter() - t0
            t[1] += 1

    def _start(self, job: Job, sentence: int, row: int) -> bool:
        """Prefill `sentence` of `job` into cache row `row` (a new row when row == len(rows)). A failure ends the
        job alone (-> False; the caller frees an existing row)."""
        try:
            with torch.inference_mode(), self._timed("prefill"):
                self._prefill(job, sentence, row)
            return True
        except Exception as e:  # noqa: BLE001 - this request fails, the others go on
            self._fail(job, e)
            return False

    def _start_many(self, items: list[tuple[Job, int, int | None]]) -> list[bool]:
        """Prefill sentence `sentence` of each (job, sentence, row) as one batch (row None: a new row); if that
        fails, each alone, so that a failure ends only the request that caused it. -> whether each started."""
        if not items:
            return []
        if self.batch_prefill:
            n = len(self.rows)
            rows = [
                n + sum(r is None for *_, r in items[:j]) if row is None else row for j, (*_, row) in enumerate(items)
            ]
            try:
                with torch.inference_mode(), self._timed("prefill_batch"):
                    self._prefill_many([(job, k, row) for (job, k, _), row in zip(items, rows)])
                return [True] * len(items)
            except Exception as e:  # noqa: BLE001 - retried one by one below, where each failure is that request's
                del self.rows[n:]
                if isinstance(e, CaptureError):
                    warnings.warn(
                        f"the scheduler's batched prefill cannot be captured in a CUDA graph ({e}); prefilling "
                        "each request alone from now on, more slowly",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                    self.batch_prefill = False
        return [self._start(job, k, len(self.rows) if row is None else row) for job, k, row in items]

    def _new_row(self, job: Job, sentence: int, T: int) -> _Row:
        text, seed = job.sentences[sentence]
        limit = min(self.params.max_new_tokens, self.L - T - 1)  # - 1: the step it runs after its end
        if limit < 1:
            raise ValueError(f"a sentence of {T} prompt tokens leaves no room to generate; use shorter sentences")
        gen = torch.Generator(device=self.synth.device).manual_seed(seed)
        return _Row(job, sentence, StreamRenderer(self.synth.model), gen, self.pos - T, T, limit)

    def _reset_rows(self, idx: list[int], rows: list[_Row]) -> None:
        """The per-row device state of rows idx (their prompts already prefilled); an index len(rows) appends."""
        for i, r in zip(idx, rows):
            self.history[i * self.Q : (i + 1) * self.Q] = self.V
            self.row_steps[i] = 0
            self.rope_base[i] = r.T
            if i == len(self.rows):
                self.rows.append(r)
            else:
                self.rows[i] = r

    def _prefill(self, job: Job, sentence: int, row: int) -> None:
        gpt, synth = self.gpt, self.synth
        emb, _ = encode_prompts(synth.model, [job.sentences[sentence][0]], job.speaker)  # (1, T, D)
        T = emb.shape[1]
        if self.pos < T:  # room below pos for the prompt; positions >= pos are masked in every row
            self.pos = T
        r = self._new_row(job, sentence, T)
        self.key_valid[row] = False
        self.key_valid[row, r.start : self.pos] = True
        dev = synth.device
        with self._cache_view(slice(row, row + 1), self._cache_len([r])):
            h = gpt(
                emb.to(gpt.norm.weight.dtype),
                torch.arange(r.start, self.pos, device=dev),
                torch.arange(T, device=dev)[None],
                self.run_block,
            )[:, -1]
        self.h[row] = h[0]
        self._reset_rows([row], [r])

    def _prefill_many(self, items: list[tuple[Job, int, int]]) -> None:
        """Sentence `sentence` of each (job, sentence, row) into its row, as one batch: prompts left-padded to the
        longest, all ending at `pos`. They attend only to themselves, so they run over a cache of their own, copied
        into the rows' positions [pos - Tb, pos) after (padding lands there too, masked like the keys of a row's
        previous owner). With graphs, batch and length are padded to buckets and the prefill replays a graph, the
        copies included (the padding rows' go to the scratch row)."""
        synth, dev = self.synth, self.synth.device
        embs = [encode_prompts(synth.model, [job.sentences[k][0]], job.speaker)[0][0] for job, k, _ in items]
        lens = [e.shape[0] for e in embs]
        T, m = max(lens), len(items)
        graph = self.graphs and T <= PREFILL_GRAPH_MAX
        mb, Tb = (
            (next(b for b in self.prefill_buckets if b >= m), -(-T // PREFILL_BUCKET) * PREFILL_BUCKET)
            if graph
            else (m, T)
        )
        if self.pos < Tb:
            self.pos = Tb
        rows = [self._new_row(job, k, t) for (job, k, _), t in zip(items, lens)]
        buf = self._prefill_buffers() if graph else self._prefill_buffers(m, T)
        emb, valid = buf["emb"][:mb, :Tb], buf["valid"][:mb, :Tb]
        emb.zero_()
        for j, (e, t) in enumerate(zip(embs, lens)):
            emb[j, Tb - t :] = e
        pad = torch.tensor([Tb - t for t in lens] + [Tb] * (mb - m))
        valid.copy_(to_device(torch.arange(Tb)[None] >= pad[:, None], dev))
        if graph:
            prefill = self._prefill_graph(mb, Tb)  # before the rows are set: capturing writes them
        where = torch.tensor([row for *_, row in items] + [self.slots] * (mb - m))
        buf["rows"][:mb].copy_(to_device(where, dev))
        buf["span"][:Tb].copy_(to_device(torch.arange(self.pos - Tb, self.pos), dev))
        if graph:
            prefill.replay()
        else:
            self._prefill_core(buf, mb, Tb)
        self._reset_rows([row for *_, row in items], rows)

    def _prefill_buffers(self, m: int | None = None, T: int | None = None) -> dict:
        """Static inputs, outputs and own caches of a batched prefill: the scheduler's (every row, PREFILL_GRAPH_MAX
        positions; what the prefill graphs read and write), or new ones of (m, T)."""
        if m is None and self._pf is not None:
            return self._pf
        m, T = m or self.slots, T or PREFILL_GRAPH_MAX
        cfg, dev, dtype = self.gpt.cfg, self.synth.device, self.h.dtype
        buf = {
            "emb": torch.zeros(m, T, cfg.hidden, dtype=dtype, device=dev),
            "valid": torch.zeros(m, T, dtype=torch.bool, device=dev),
            "out": torch.zeros(m, cfg.hidden, dtype=dtype, device=dev),
            "rows": torch.full((m,), self.slots, device=dev),  # the cache row each prompt goes to
            "span": torch.arange(T, device=dev),  # the cache positions its Tb positions go to
            "k": [torch.zeros(m, cfg.heads, T, cfg.head_dim, dtype=dtype, device=dev) for _ in self.gpt.layers],
            "v": [torch.zeros(m, cfg.heads, T, cfg.head_dim, dtype=dtype, device=dev) for _ in self.gpt.layers],
        }
        if m == self.slots and T == PREFILL_GRAPH_MAX:
            self._pf = buf
        return buf

    def _prefill_core(self, buf: dict, mb: int, Tb: int) -> None:
        """The prefill of buf's first mb prompts of Tb positions over buf's own caches, then their keys, values, mask
        and last states copied to cache rows buf["rows"], positions buf["span"] (capturable)."""
        gpt = self.gpt
        valid = buf["valid"][:mb, :Tb]
        saved = [layer.attention.kv_cache for layer in gpt.layers], gpt.key_valid
        for layer, k, v in zip(gpt.layers, buf["k"], buf["v"]):
            layer.attention.kv_cache = _CacheView(k[:mb, :, :Tb], v[:mb, :, :Tb])
        gpt.key_valid = valid
        try:
            h = gpt(
                buf["emb"][:mb, :Tb],
                torch.arange(Tb, device=valid.device),
                (valid.long().cumsum(1) - 1).clamp(min=0),
                self.run_block,
            )
            buf["out"][:mb] = h[:, -1]
        finally:
            for layer, c in zip(gpt.layers, saved[0]):
                layer.attention.kv_cache = c
            gpt.key_valid = saved[1]
        rows, span = buf["rows"][:mb, None], buf["span"][:Tb]
        for k, v, ck, cv in zip(self.k, self.v, buf["k"], buf["v"]):
            k[rows, :, span] = ck[:mb, :, :Tb].transpose(1, 2)
            v[rows, :, span] = cv[:mb, :, :Tb].transpose(1, 2)
        self.key_valid.index_fill_(0, rows[:, 0], False)  # the keys of the row's previous owner
        self.key_valid[rows, span] = valid
        self.h[rows[:, 0]] = buf["out"][:mb]

    def _prefill_graph(self, mb: int, Tb: int) -> torch.cuda.CUDAGraph:
        """The captured prefill for (mb, Tb), captured now if new (its runs write the scratch row alone)."""
        key = ("prefill", mb, Tb)
        if key not in self._graphs:
            buf = self._prefill_buffers()
            buf["rows"].fill_(self.slots)
            self._graphs[key] = self._capture(lambda: self._prefill_core(buf, mb, Tb))
        return self._graphs[key]

    def _start_rows(self, new: list[Job]) -> None:
        """Prefill the new requests' first sentences, and the parked rows' next ones where due: with new requests,
        once every row is parked, or once one has waited prefill_wait steps; all as one batch."""
        parked = [(r.job, r.sentence + 1, i) for i, r in enumerate(self.rows) if r.ended_at is not None]
        if parked and not new and len(parked) < len(self.rows):
            if self.steps_run - min(self.rows[i].ended_at for *_, i in parked) < self.prefill_wait:
                parked = []
        started = self._start_many([(job, 0, None) for job in new] + parked)
        for i in sorted((i for (*_, i), ok in zip(parked, started[len(new) :]) if not ok), reverse=True):
            self._remove(i)  # its request failed

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
                self.pos, self._inflight = 0, None
                return
            newest = max(range(len(self.rows)), key=lambda i: self.rows[i].job.submitted)
            self._fail(self.rows[newest].job, e)
            self._remove(newest)
            if self.synth.device.type == "cuda":
                torch.cuda.empty_cache()

    def _decode(self, nb: int, S: int) -> None:
        """One decode step of rows [0, nb) over cache positions [0, S), on the static buffers alone (no host reads,
        so that it can be captured): sample from h, record, feed the codes back, advance each row and `pos_d`."""
        bound = attention_bound(S) if self.bounded_attention else contextlib.nullcontext()
        with self._cache_view(slice(0, nb), S, whole=self.compiled), bound:
            self._decode_core(nb)

    def _decode_rows(self, nb: int) -> None:
        """_decode's body, attention's cache views already in place (what compile traces)."""
        gpt, Q, V, p = self.gpt, self.Q, self.V, self.params
        steps = self.row_steps[:nb]
        rows = self.rows_index[:nb]
        noise = self.noise[rows, steps % self.chunk].view(nb * Q, V)  # each row's draws for its own step
        step_q = steps[:, None].expand(nb, Q).reshape(nb * Q)
        logits = gpt.code_logits(self.h[:nb])  # (nb, Q, V)
        self.flags[1, :nb] = ~torch.isfinite(logits).flatten(1).all(-1)
        ids = sample_codes(
            logits.view(nb * Q, V),
            self.history[: nb * Q],
            self.temperature[: nb * Q],
            noise,
            step_q,
            self.min_new,
            p,
            gpt.cfg.eos_code,
        ).view(nb, Q)
        self.flags[0, :nb] = (ids == gpt.cfg.eos_code).any(-1)
        self.ring[rows, steps % self.R] = self.h[:nb]
        x = gpt.embed_codes(ids)[:, None].to(self.h.dtype)
        slot = self.pos_d.view(1)
        self.key_valid[:nb].index_fill_(1, slot, True)
        block = call_block if self.compiled else self.run_block  # the whole step compiles: plain blocks inside
        # each row's prompt starts rope_base + steps positions before this one (stale in padding rows: harmless)
        key_first = self.pos_d - self.rope_base[:nb] - steps if self.sparse_attention else None
        out = gpt(x, slot, (self.rope_base[:nb] + steps)[:, None], block, key_first)[:, 0]
        self.history[: nb * Q].scatter_(1, (step_q % p.penalty_window)[:, None], ids.view(nb * Q, 1))
        self.h[:nb] = out
        steps += 1
        self.pos_d += 1

    def _graph(self, nb: int, S: int) -> torch.cuda.CUDAGraph:
        """The captured step for (nb, S), captured now if new. Capturing runs the step three times (warm-up and
        capture): what those runs write is put back, so rows in flight are not disturbed."""
        key = (nb, S)
        if key in self._graphs:
            return self._graphs[key]
        at = max(0, min(self.pos, S - 3))  # the three runs write positions [at, at + 3) of every row
        keep = [self.h, self.row_steps, self.pos_d, self.history, self.ring, self.flags, self.key_valid]
        keep += [c[:, :, at : at + 3] for c in (*self.k, *self.v)]
        saved = [t.clone() for t in keep]
        self.pos_d.fill_(at)
        try:
            self._graphs[key] = self._capture(lambda: self._decode(nb, S))
        finally:
            for t, old in zip(keep, saved):
                t.copy_(old)
        return self._graphs[key]

    def _capture(self, run: Callable[[], None], pool=None) -> torch.cuda.CUDAGraph:
        """run() as a CUDA graph, after two warm-up runs on a side stream (lazy inits, compiles), in `pool` (default
        the one every step and prefill graph shares: they never run at once). A kernel that refuses capture raises
        CaptureError."""
        dev = self.synth.device
        if pool is None:
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            pool = self._pool
        try:
            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                for _ in range(2):
                    run()
            torch.cuda.current_stream(dev).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: the server's threads may touch the device meanwhile (a request's speaker, say)
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                run()
        except RuntimeError as e:
            if "captur" not in str(e).lower():
                raise
            sync_device(dev)
            raise CaptureError(str(e).strip()[:160]) from e
        return graph

    def _step(self) -> None:
        """Queue the next decode step of the active rows, then take in the one queued before it: its EOS flags
        reach the host while this one runs, so the device does not wait for the host's bookkeeping. A row that ended
        at the step taken in has run this one too, for nothing."""
        launched = self._launch()
        taken, self._inflight = self._inflight, launched
        if taken is not None:
            self._take(*taken)

    def _launch(self) -> tuple[list[_Row], Tensor, object]:
        """Queue one decode step of rows [0, n) -> (those rows, their flags on the host, the event after which the
        flags are there (None off CUDA))."""
        rows, n, chunk = list(self.rows), len(self.rows), self.chunk
        if self.pos >= self.L or self._worth_compacting():
            self._compact()
        for i, r in enumerate(rows):  # each row's noise per chunk of its own steps, as Engine draws it
            if r.steps % chunk == 0:
                self.noise[i].exponential_(1, generator=r.gen)
        S = self._cache_len(rows)
        with self._timed("step"):
            self.pos_d.fill_(self.pos)
            if self.graphs:
                nb = next(b for b in self.buckets if b >= n)
                try:
                    self._graph(nb, S).replay()
                except CaptureError as e:
                    warnings.warn(
                        f"the scheduler's decode step cannot be captured in a CUDA graph ({e}); "
                        "stepping without graphs from now on, more slowly",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                    self.graphs = False
                    self._decode(n, S)
            else:
                self._decode(n, S)
            if self.synth.device.type == "cuda":
                flags = torch.empty((2, n), dtype=torch.bool, pin_memory=True).copy_(self.flags[:, :n], True)
                ready = torch.cuda.Event()
                ready.record()
            else:
                flags, ready = self.flags[:, :n].clone(), None
        for r in rows:
            r.steps += 1
        self.pos += 1
        self.steps_run += 1
        return rows, flags, ready

    def _take(self, launched: list[_Row], flags: Tensor, ready) -> None:
        """Take in a step's outcome for the rows it ran that are still here: EOS, NaN, renders, sentence ends."""
        with self._timed("wait"):
            if ready is not None:
                ready.synchronize()
        self._deliver(wait=False)
        eos, bad = flags.tolist()
        where = {id(r): i for i, r in enumerate(self.rows)}
        done, ended, early = set(), [], set()
        for j, r in enumerate(launched):
            i = where.get(id(r))
            if i is None or r.ended_at is not None:  # it left meanwhile (ended, cancelled, failed), or is parked
                continue
            r.taken += 1
            if bad[j]:  # NaN logits never sample EOS: the request would be noise to its step limit
                self._fail(
                    r.job,
                    NumericalError(
                        "the GPT's code logits are NaN/inf: the model's head_code or last "
                        "layers hold non-finite values, or overflowed; check the checkpoint"
                    ),
                )
                done.add(i)
                continue
            if not eos[j]:
                r.pending += 1
                r.job.steps += 1
            if eos[j] or r.taken >= r.limit:
                ended.append(i)
            elif (n := r.renderer.steps + r.pending) == r.renderer.first_audio_step or (
                r.sentence == 0 and n == r.renderer.first_audio_step + self.chunk
            ):
                early.add(i)
        rows = self.rows
        # all rows' new states every render_every steps; a row's first audio at once, and a request's second piece
        # `chunk` steps later: the first holds only the samples no later state can change (tens of ms), and a player
        # that starts on it would run dry waiting for the next tick
        tick = self.steps_run % self.render_every == 0
        skip = done.union(ended)
        due = [i for i, r in enumerate(rows) if r.pending and i not in skip and (tick or i in early)]
        ended = [i for i in ended if i not in done]
        # the sentences that end: their windows now (the rows go on to other sentences), their render with the next
        # renders (before them: a request's audio stays in order) or within `chunk` steps, as one batch
        with self._timed("render_end"):
            done.update(self._defer_ends(ended))
            if self._ends and (due or self.steps_run - self._ends[0].step >= self.chunk):
                failed = self._flush_ends()
                done.update(i for i, r in enumerate(rows) if r.job.id in failed)
        with self._timed("render"):
            done.update(self._render(due))
        going_on = []
        for i in ended:
            r = rows[i]
            if i in done:
                continue
            if r.sentence + 1 < len(r.job.sentences):
                going_on.append(i)
            else:  # its end goes out after its last audio (_flush_ends)
                done.add(i)
        if self.prefill_wait:  # parked: _run prefills their next sentences, with others'
            for i in going_on:
                rows[i].ended_at = self.steps_run
        else:
            started = self._start_many([(rows[i].job, rows[i].sentence + 1, i) for i in going_on])
            done.update(i for i, ok in zip(going_on, started) if not ok)
        for i in sorted(done, reverse=True):
            self._remove(i)

    def _render_windows(self) -> list[int]:
        """The window lengths a push render is padded to with render_graphs: multiples of RENDER_WINDOW_BUCKET, then
        the longest a window can be (the ring's length - 1)."""
        return sorted({*range(RENDER_WINDOW_BUCKET, self.R - 1, RENDER_WINDOW_BUCKET), self.R - 1})

    def _render_pad(self, B: int, S: int) -> tuple[int, int]:
        """A push render of B windows of up to S states -> the captured shape it is padded to."""
        return next(b for b in self.buckets if b >= B), next(w for w in self._render_windows() if w >= S)

    def _capture_render(self, B: int, S: int) -> None:
        """The render of B windows of S states (streaming.window_samples) as a CUDA graph over static windows."""
        if (B, S) in self._renders:
            return
        if self._render_pool is None:
            self._render_pool = torch.cuda.graph_pool_handle()
        windows = torch.zeros(B, S, self.gpt.cfg.hidden, dtype=self.ring.dtype, device=self.ring.device)
        out: list[Tensor] = []
        graph = self._capture(lambda: out.append(window_samples(self.synth.model, windows)), self._render_pool)
        self._renders[(B, S)] = graph, windows, out[-1]  # the captured run's samples, in the graph's memory

    def _captured_render(self, states: Tensor) -> Tensor | None:
        """window_samples(model, states) by replaying the render captured for its shape (on the current stream:
        the renders' side stream), or None where none was captured."""
        found = self._renders.get(tuple(states.shape[:2]))
        if found is None:
            return None
        graph, windows, samples = found
        windows.copy_(states)
        graph.replay()
        return samples

    def _render(self, idx: list[int]) -> list[int]:
        """Render rows idx's pending states as one batch (streaming.render_ring): the windows are gathered from the
        ring on the step's stream and rendered on the side stream on CUDA, so the steps go on meanwhile; the audio is
        emitted once on the host. -> the indices of rows whose request failed (all of them if the render did)."""
        if not idx:
            return []
        rows = [self.rows[i] for i in idx]
        try:
            items = [(i, r.renderer, r.pending) for i, r in zip(idx, rows)]
            rendered = render_ring(
                self.synth.model,
                self.ring,
                items,
                side=self._side,
                pad=self._render_pad if self._renders else None,  # padding pays only for a captured render
                samples=self._captured_render,
            )
        except Exception as e:  # noqa: BLE001 - these requests fail, the others go on
            for r in rows:
                self._fail(r.job, e)
            return idx
        jobs = [r.job for r in rows]
        for r in rows:
            r.pending = 0
        self._later(rendered, lambda: [self._emit(job, piece) for job, piece in zip(jobs, rendered.pieces())])
        return []

    def _defer_ends(self, idx: list[int]) -> list[int]:
        """Gather the last windows of rows idx's sentences, which just ended, for _flush_ends. -> the indices of rows
        whose request failed."""
        if not idx:
            return []
        rows = [self.rows[i] for i in idx]
        try:
            items = [(i, r.renderer, r.pending) for i, r in zip(idx, rows)]
            batches = gather_ring(self.ring, items, finish=True)
        except Exception as e:  # noqa: BLE001 - these requests fail, the others go on
            for r in rows:
                self._fail(r.job, e)
            return idx
        for r in rows:
            r.pending = 0
        last = [r.sentence + 1 == len(r.job.sentences) for r in rows]
        self._ends.append(_Ends([r.job for r in rows], last, batches, self.steps_run))
        return []

    def _flush_ends(self) -> set[int]:
        """Render every deferred sentence end as one batch per window length, then end the requests whose last
        sentence it was. -> the ids of requests that failed (all of them if the render did)."""
        entries, self._ends = self._ends, []
        if not entries:
            return set()
        jobs: list[Job] = []
        last: list[bool] = []
        by_length: dict[int, list] = {}
        for e in entries:
            for idx, w in e.batches:
                by_length.setdefault(w.states.shape[1], []).append(([len(jobs) + j for j in idx], w))
            jobs += e.jobs
            last += e.last
        try:
            with torch.inference_mode():
                batches = [
                    ([j for idx, _ in p for j in idx], self._end_batch(Windows.cat([w for _, w in p])))
                    for p in by_length.values()
                ]
                rendered = render_gathered(self.synth.model, len(jobs), batches, self._side, self._captured_render)
        except Exception as e:  # noqa: BLE001 - these requests fail, the others go on
            for job in {job.id: job for job in jobs}.values():
                self._fail(job, e)
            return {job.id for job in jobs}
        self._later(rendered, lambda: [self._emit(job, piece) for job, piece in zip(jobs, rendered.pieces())])
        for job, final in zip(jobs, last):
            if final:
                self._end(job, "done")
        return set()

    def _end_batch(self, w: Windows) -> Windows:
        """Sentence ends' windows padded with rows to a captured render's batch where one has their length (most
        do: an end's window reaches back the ring's length - 1), so that the render is a replay."""
        B, S = w.states.shape[:2]
        padded = next((b for b in self.buckets if b >= B), B)
        return w.pad_rows(padded) if (padded, S) in self._renders else w

    def _emit(self, job: Job, piece: np.ndarray) -> None:
        if piece.size:
            if job.first_audio is None:
                job.first_audio = time.perf_counter()
            job.samples += piece.size
            job.on_event(job, "audio", piece)

    def _later(self, rendered: Rendered | None, action: Callable[[], None]) -> None:
        """Do action once `rendered` is on the host and every action queued before it is done (so that a job's
        events keep their order: its audio, then its end)."""
        self._outbox.append((rendered, action))
        self._deliver(wait=False)

    def _deliver(self, wait: bool) -> None:
        """Do the outbox's actions in order, as far as their audio is on the host (with wait: all of them)."""
        while self._outbox:
            rendered, action = self._outbox[0]
            if not (wait or rendered is None or rendered.ready()):
                return
            self._outbox.popleft()
            action()

    # --- bookkeeping -------------------------------------------------------------------------
    def _need(self, rows: list[_Row]) -> int:
        """Cache positions the rows need until their next chunk ends (at least pos + 1)."""
        need = max(r.start + r.T + min((r.steps // self.chunk + 1) * self.chunk, r.limit) for r in rows)
        return max(need, self.pos + 1)

    def _cache_len(self, rows: list[_Row]) -> int:
        """Cache positions attention reads: the engine's bucketed length (its next chunk's end, in CACHE_BUCKETs)."""
        return min(-(-self._need(rows) // self.cache_bucket) * self.cache_bucket, self.L)

    def _worth_compacting(self) -> bool:
        """Whether shifting the rows left now lowers the cache bucket attention reads, with half a bucket of steps
        to spare: every step reads the whole bucket, positions below the oldest row included."""
        shift = self._shift()
        need = self._need(self.rows)
        return shift > 0 and need - shift + CACHE_BUCKET // 2 <= self._cache_len(self.rows) - self.cache_bucket

    @contextlib.contextmanager
    def _cache_view(self, rows: slice, length: int, whole: bool = False):
        """The model's attention reads and writes rows `rows`, positions [0, length) of this scheduler's cache
        (whole: rows from 0, as _RowsCache, which the model slices itself)."""
        gpt = self.gpt
        saved = [layer.attention.kv_cache for layer in gpt.layers], gpt.key_valid
        bounded = whole and self.bounded_attention  # the length is attention_bound's, set outside the compiled step
        key = (rows.start, rows.stop, None if bounded else length, whole)
        if key not in self._views:  # the same objects each time: a compiled step guards on what it was traced with
            if bounded:
                self._views[key] = [_BoundedRowsCache(k, v) for k, v in zip(self.k, self.v)], self.key_valid
            elif whole:
                caches = [_RowsCache(k, v, length) for k, v in zip(self.k, self.v)]
                self._views[key] = caches, self.key_valid[:, :length]
            else:
                caches = [_CacheView(k[rows, :, :length], v[rows, :, :length]) for k, v in zip(self.k, self.v)]
                self._views[key] = caches, self.key_valid[rows, :length]
        caches, gpt.key_valid = self._views[key]
        for layer, cache in zip(gpt.layers, caches):
            layer.attention.kv_cache = cache
        try:
            yield
        finally:
            for layer, c in zip(gpt.layers, saved[0]):
                layer.attention.kv_cache = c
            gpt.key_valid = saved[1]

    def _shift(self) -> int:
        """How far the rows can shift left: the oldest prompt's start, parked rows aside (their next prefill
        invalidates their keys)."""
        return min(r.start for r in self.rows if r.ended_at is None)

    def _compact(self) -> None:
        """Shift every row left by the oldest row's start, so that `pos` fits in the cache again."""
        n = len(self.rows)
        shift = self._shift()
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
            for t in (self.key_valid, self.h, self.noise, self.ring, self.row_steps, self.rope_base):
                t[i] = t[last]
            Q = self.Q
            self.history[i * Q : (i + 1) * Q] = self.history[last * Q : (last + 1) * Q]
            self.rows[i] = self.rows[last]
        self.rows.pop()
        if not self.rows:
            self.pos = 0  # idle: the next request starts at the cache's beginning, as the engine does

    def _end(self, job: Job, outcome: str) -> None:
        self._later(None, lambda: self._ended(job, outcome))

    def _ended(self, job: Job, outcome: str) -> None:
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
        self._later(None, lambda: self._failed(job, e))

    def _failed(self, job: Job, e: Exception) -> None:
        job.outcome, job.finished = "failed", time.perf_counter()
        self.completed.append(job.id)
        job.on_event(job, "error", e)

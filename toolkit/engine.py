"""The GPT decode loop: one prefill, then one-token steps over a preallocated static KV cache.

Every step reads and writes only fixed device buffers (`DecodeState`), with the step counter on the device,
so on CUDA one step is captured once as a CUDA graph per (batch, cache length, sampling settings) and replayed.
Sampling stays on the device; the host looks at the EOS flags only once per chunk of `chunk` steps, through a
pinned copy and an event, after queueing the next chunk's first LEAD_STEPS steps (so the GPU does not idle
meanwhile); with `lookahead` the whole next chunk is already queued while a streaming renderer works on this one
(on its own CUDA stream).

With `compile=True` the whole step (sampler, blocks, bookkeeping) is one torch.compile'd graph, specialised to
each batch size and cache bucket, and captured as a CUDA graph; compiling costs seconds per new (batch, bucket), so
warm up first. compile="block" compiles one block for every layer, batch and bucket: it compiles once and fuses less.
At batch <= KERNELS_MAX_BATCH on CUDA the step runs through the Triton kernels of toolkit/kernels.py instead (five
launches per layer and one for sampling and bookkeeping, nothing compiled): at batch 1 a step is bound by the
latency of its many small launches, not by bytes.

On CUDA (or with `prefill_graphs=True` anywhere) the prompt is left-padded to a multiple of PREFILL_BUCKET (padding
is masked like a batch's own). That bounds the prompt shapes a long-running server sees: cuDNN's attention keeps a
host-side plan per exact shape, in a cache that PyTorch does not bound (pytorch/pytorch#190388). At batch 1 with
graphs the prefill then replays a graph captured per (batch, padded length, cache) instead of launching every kernel
of every layer from the host. In fp32 the codes are the same with and without; in bf16 the padded shapes round
differently, so a padded prompt's samples differ (deterministically) from an unpadded one's.

What each of these choices gains, measured: benchmarks/README.md ("Why the engine is built this way")."""

from __future__ import annotations

import functools
import itertools
import os
import time
import warnings
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from .decode import DecodeState, decode_step, vocabulary
from .models.gpt import GPT, BlockRunner, call_block
from .sampling import SamplingParams, sample_codes
from .weights import is_int8_weight_only

CACHE_BUCKET = 256  # cache lengths are rounded up to this, so new lengths rarely reallocate or recapture
# captured graphs (or CPU step buffers) kept, least recently used dropped: a server that varies sampling settings
# per request would otherwise hold a graph, and its buffers, for every combination it ever saw
MAX_GRAPHS = 32
PREFILL_BUCKET = 32  # prompt lengths are padded to this (on CUDA), so a few shapes and graphs serve every prompt
# steps of the next chunk queued before the host waits on a chunk's EOS flags, so the GPU does not idle while the
# host checks them
LEAD_STEPS = 2
KERNELS_MAX_BATCH = 2  # the Triton step reads the weights once per row: from batch 4 cuBLAS's GEMMs win


class NumericalError(RuntimeError):
    """NaN/inf where a model must produce numbers (corrupt weights, or a half-precision overflow)."""


class CaptureError(RuntimeError):
    """A CUDA graph capture that a kernel refused (the message says which)."""


def sync_device(device: torch.device) -> None:
    """Wait for the device's queued work (timings, and before reading results on the host)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds fn() takes, with the device's queued work drained before and after."""
    sync_device(device)
    t0 = time.perf_counter()
    fn()
    sync_device(device)
    return time.perf_counter() - t0


@dataclass
class Chunk:
    """Steps [start, start + n) of a generation; hidden (B, n, D), codes (B, n, Q) on the device.
    lengths and finished are on the host. On CUDA, `ready` is an event recorded after the chunk's steps: work on
    another stream that reads hidden or codes must wait for it (the engine may already run the next chunk)."""

    start: int
    hidden: Tensor
    codes: Tensor
    lengths: Tensor  # (B,) steps before EOS so far
    finished: Tensor  # (B,) bool
    ready: "torch.cuda.Event | None" = None


@dataclass
class Generation:
    hidden: Tensor  # (B, N, D) the state each code was sampled from (what the Decoder reads)
    codes: Tensor  # (B, N, Q)
    lengths: Tensor  # (B,) steps before EOS
    finished: Tensor  # (B,) False where max_new_tokens was hit first


class Engine:
    def __init__(
        self,
        gpt: GPT,
        chunk: int = 16,
        cuda_graphs: bool = True,
        compile: bool | str = False,
        compile_options: dict | None = None,
        prefill_graphs: bool | None = None,
        kernels: bool | None = None,
        lead_steps: int | None = None,
        kernel_pdl: bool = True,
    ):
        """compile: False (eager), True or "step" (the whole decode step, fused across layers and with the sampler,
        static shapes: one compile per batch size and cache bucket), "block" (regional: one compiled block with
        dynamic shapes serves every layer, batch and bucket; compiles once, fuses less). Prefill runs through the
        compiled block in both modes, except for int8 weight-only models (slower compiled: see below).
        compile_options: torch.compile arguments for the step.
        prefill_graphs: pad prompts to PREFILL_BUCKET and replay the prefill as a CUDA graph (see the module doc);
        None: pad on CUDA, graphs at batch 1 where graphs run (cuda_graphs), True: pad on any device and batch
        (graphs on CUDA with cuda_graphs), False: neither.
        kernels: decode batches of up to KERNELS_MAX_BATCH rows through the Triton kernels of toolkit/kernels.py (five
        launches per layer and one for sampling, not compiled). None: on CUDA where Triton is installed, the weights
        are floats, int8 or int4 weight-only and kernels.self_check passes; True: also on CPU (under
        TRITON_INTERPRET=1); False: never.
        kernel_pdl: launch the kernels as programmatic dependent launches where the GPU has them (Hopper on);
        chosen automatically (kernels=None), a GPU or toolchain that fails only with them turns this off.
        lead_steps: a chunk is handed over (and the host waits for its EOS flags) only once this many steps of the
        next are queued, so that the GPU does not idle while the host checks; up to that many steps are discarded
        after EOS. None: LEAD_STEPS on CUDA, 0 elsewhere (on the CPU a step runs when called: nothing to hide)."""
        self.gpt = gpt
        self.kernels = kernels
        self.kernel_pdl = kernel_pdl
        self._sample: Callable = sample_codes
        self._kernel_step: Callable | None = None  # made on first use (it imports Triton)
        self.prefill_graphs = prefill_graphs
        self.chunk = chunk
        self.lead_steps = lead_steps
        self.cuda_graphs = cuda_graphs
        self._run_block: BlockRunner = call_block
        self._prefill_block: BlockRunner = call_block
        self._decode_step: Callable[[GPT, DecodeState, SamplingParams, int], None] = decode_step
        if compile:
            import torch._dynamo

            # the step compiles once per batch size x cache bucket x dtype x sampling settings: past the limit
            # (default 8) dynamo would fall back to eager silently
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
            torch._dynamo.config.accumulated_cache_size_limit = max(
                torch._dynamo.config.accumulated_cache_size_limit, 1024
            )
            # dynamic: batch and cache length change without a recompile (only batch 1 is specialised)
            self._run_block = torch.compile(call_block, fullgraph=True, dynamic=True)
            self._sample = torch.compile(sample_codes, fullgraph=True)
            # the prefill compiled too, but not for int8 weight-only models: inductor's code for torchao's int8 matmul
            # is slower there than eager ops in one CUDA graph
            if not is_int8_weight_only(gpt.layers[0].attention.wqkv.weight):
                self._prefill_block = self._run_block
            if compile == "block":
                self._decode_step = functools.partial(decode_step, run_block=self._run_block, sample=self._sample)
            else:
                # static shapes: dynamic ones are slower at large batches
                self._decode_step = torch.compile(
                    decode_step, **{"fullgraph": True, "dynamic": False, **(compile_options or {})}
                )
        self._graphs: OrderedDict[tuple, tuple[torch.cuda.CUDAGraph, object]] = OrderedDict()  # decode and prefill
        self._states: OrderedDict[tuple, DecodeState] = OrderedDict()
        self.captures = 0  # CUDA graphs captured so far, recaptures included (soak.py logs it beside host memory)

    def cached_shapes(self) -> list[tuple]:
        """Keys (batch, cache shape, dtype, sampling settings) of the step buffers and graphs kept now, oldest first."""
        return [*self._graphs, *self._states]

    def release(self) -> None:
        """Drop the KV cache, step buffers and graphs (after an out-of-memory error); the next call reallocates."""
        self._graphs.clear()
        self._states.clear()
        for layer in self.gpt.layers:
            layer.attention.kv_cache = None
        self.gpt.key_valid = None

    def _ensure_cache(self, batch: int, length: int) -> bool:
        """Make the cache hold `length` positions for `batch` rows (in buckets of CACHE_BUCKET), zeroed.
        -> whether it was reallocated."""
        gpt = self.gpt
        have = gpt.cache_shape
        length = min(-(-length // CACHE_BUCKET) * CACHE_BUCKET, gpt.cfg.max_positions)
        grown = have is None or have[0] < batch or have[1] < length
        if grown:
            gpt.setup_caches(max(batch, have[0] if have else 0), max(length, have[1] if have else 0))
            self._graphs.clear()  # captured graphs point at the old buffers
        for layer in gpt.layers:  # stale NaN in unused slots would leak through 0 * NaN
            layer.attention.kv_cache.k.zero_()
            layer.attention.kv_cache.v.zero_()
        return grown

    def _grow(self, B: int, length: int, params: SamplingParams, state: DecodeState, text_eos: int | None):
        """Mid-generation: a longer cache holding what the old one held, and the step function for it."""
        gpt = self.gpt
        old = [(l.attention.kv_cache.k, l.attention.kv_cache.v) for l in gpt.layers]
        old_valid = gpt.key_valid
        self._ensure_cache(B, length)
        step_fn, new = self._runner(B, params, gpt.norm.weight.dtype, old_valid.device, text_eos, carry=state)
        b, n = old_valid.shape  # copied after any graph capture, which scribbles on the cache
        for layer, (k, v) in zip(gpt.layers, old):
            layer.attention.kv_cache.k[:b, :, :n] = k
            layer.attention.kv_cache.v[:b, :, :n] = v
        gpt.key_valid[:b, :n] = old_valid
        gpt.key_valid[:, n:] = True
        return step_fn, new

    def _step(self, s: DecodeState, p: SamplingParams, text_eos: int | None) -> None:
        if text_eos is None and self.uses_kernels(s.h.shape[0], s.h.device):  # the kernels sample codes only
            self._kernel_step(self.gpt, s, p, self.chunk)
        else:
            self._decode_step(self.gpt, s, p, self.chunk, text_eos=text_eos)

    def uses_kernels(self, batch: int, device: torch.device) -> bool:
        """Whether a decode step of `batch` rows on `device` runs through toolkit/kernels.py. The first call that
        may use them imports Triton and checks the weights (and, chosen automatically, runs kernels.self_check);
        later calls reuse the answer, since this runs on every step without graphs."""
        if batch > KERNELS_MAX_BATCH or self.kernels is False or (self.kernels is None and device.type != "cuda"):
            return False
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError(
                f"Engine(kernels=True) on {device} runs Triton's interpreter: set TRITON_INTERPRET=1 "
                "before toolkit.kernels is first imported, or use kernels=None (CUDA only)"
            )
        if self._kernel_step is not None:
            return True
        try:
            from . import kernels
        except ImportError as e:
            if self.kernels:
                raise RuntimeError(f"Engine(kernels=True) needs Triton ({e}): pip install triton") from e
            self.kernels = False
            return False
        if not kernels.supports(self.gpt):
            if self.kernels:
                raise ValueError(
                    "Engine(kernels=True): the Triton step reads float, int8 or int4 weight-only weights "
                    "(not this recipe's) and needs a power-of-two head size of at least 16; use kernels=None"
                )
            self.kernels = False
            return False
        if self.kernels is None and not self._kernels_launch(kernels, device):
            self.kernels = False
            return False
        # not compiled: the kernels fuse more than the compiler did around them (a whole-step compile around them was
        # no faster). self._sample (compiled
        # where asked) serves the sampling settings the fused sampling launch does not cover
        self._kernel_step = functools.partial(kernels.decode_step, sample=self._sample, pdl=self.kernel_pdl)
        return True

    def _kernels_launch(self, kernels, device: torch.device) -> bool:
        """Chosen automatically, the kernels first run two steps of a tiny model against PyTorch (kernels.self_check):
        on a GPU or toolchain that Triton cannot serve, decoding goes on without them (with a warning) instead of
        failing mid-generation. Where they fail only as programmatic dependent launches, they run without PDL
        (self.kernel_pdl turns False)."""
        try:
            kernels.self_check(device, pdl=self.kernel_pdl)
            return True
        except Exception as e:  # noqa: BLE001 - any failure means the same thing here
            failure = e
        try:
            retry = kernels.uses_pdl(device, self.kernel_pdl)
        except Exception:  # noqa: BLE001 - no such device: nothing to retry
            retry = False
        if retry:
            try:
                kernels.self_check(device, pdl=False)
                warnings.warn(
                    f"the Triton decode kernels fail as programmatic dependent launches on {device} "
                    f"({type(failure).__name__}: {str(failure).strip()[:160]}); running them without",
                    RuntimeWarning,
                    stacklevel=4,
                )
                self.kernel_pdl = False
                return True
            except Exception:  # noqa: BLE001 - the first failure is the one to report
                pass
        warnings.warn(
            f"the Triton decode kernels do not run on {device} ({type(failure).__name__}: "
            f"{str(failure).strip()[:160]}); decoding without them, more slowly at batch 1",
            RuntimeWarning,
            stacklevel=4,
        )
        return False

    def _runner(
        self, B: int, p: SamplingParams, dtype, device, text_eos: int | None, carry: DecodeState | None = None
    ) -> tuple[Callable[[], None], DecodeState]:
        """The step function for this batch, cache length, sampling settings and vocabulary (codes, or text up to
        text_eos); `carry` hands over the state of a generation in flight (when the cache grew)."""
        step_fn, state = self._make_runner(B, p, dtype, device, text_eos)
        if carry is not None and carry is not state:
            for name, value in vars(carry).items():
                getattr(state, name).copy_(value)
        return step_fn, state

    def _make_runner(
        self, B: int, p: SamplingParams, dtype, device, text_eos: int | None
    ) -> tuple[Callable[[], None], DecodeState]:
        cfg = self.gpt.cfg
        key = (
            B,
            self.gpt.cache_shape,
            dtype,
            p.top_p,
            p.top_k,
            p.repetition_penalty,
            p.penalty_window,
            p.min_keep,
            text_eos,
        )
        use_graph = self.cuda_graphs and device.type == "cuda"
        Q, V = vocabulary(cfg, text_eos)

        def make():
            state = DecodeState(B, cfg.hidden, Q, V, p.penalty_window, self.chunk, dtype, device)
            return (self._graph_of(lambda: self._step(state, p, text_eos), device), state) if use_graph else state

        try:
            kept = self._kept(self._graphs if use_graph else self._states, key, make)
        except CaptureError as e:  # some kernels cannot be captured (torchao's w8a8 on CUDA is one)
            warnings.warn(
                f"this model's decode step cannot be captured in a CUDA graph ({e}); "
                "decoding without graphs from now on, more slowly",
                RuntimeWarning,
                stacklevel=4,
            )
            self.cuda_graphs = False
            self._graphs.clear()  # never replayed again
            return self._make_runner(B, p, dtype, device, text_eos)
        if not use_graph:
            return (lambda: self._step(kept, p, text_eos)), kept
        graph, state = kept
        return graph.replay, state

    def _prefill_runner(self, B: int, T: int, dtype, device) -> Callable[[Tensor, Tensor], Tensor]:
        """(emb (B, T, D), rope positions (B, T)) -> last hidden (B, D), filling cache slots [0, T): a replayed graph
        with prefill_graphs on CUDA (captured here if new; it scribbles on the cache), else a plain call."""
        gpt = self.gpt
        if not self._graphs_prefill(B, device):
            slots = torch.arange(T, device=device)
            return lambda emb, rope: gpt(emb, slots, rope, self._prefill_block)[:, -1]

        def make():
            # every tensor the graph reads is kept with it: one freed and reused would feed it garbage indices
            slots = torch.arange(T, device=device)
            emb_in = torch.zeros(B, T, gpt.cfg.hidden, dtype=dtype, device=device)
            rope_in = torch.zeros(B, T, dtype=torch.long, device=device)
            out = torch.zeros(B, gpt.cfg.hidden, dtype=dtype, device=device)
            graph = self._graph_of(lambda: out.copy_(gpt(emb_in, slots, rope_in, self._prefill_block)[:, -1]), device)
            return graph, (emb_in, rope_in, out, slots)

        try:
            graph, (emb_in, rope_in, out, _) = self._kept(self._graphs, ("prefill", B, T, gpt.cache_shape, dtype), make)
        except CaptureError as e:  # as for the decode step: keep serving, without this graph
            warnings.warn(
                f"this model's prefill cannot be captured in a CUDA graph ({e}); prefilling without graphs from now on",
                RuntimeWarning,
                stacklevel=4,
            )
            self.prefill_graphs = False
            return self._prefill_runner(B, T, dtype, device)

        def replay(emb: Tensor, rope: Tensor) -> Tensor:
            emb_in.copy_(emb)
            rope_in.copy_(rope)
            graph.replay()
            return out

        return replay

    def _pads_prompts(self, device: torch.device) -> bool:
        return device.type == "cuda" if self.prefill_graphs is None else self.prefill_graphs

    def _graphs_prefill(self, B: int, device: torch.device) -> bool:
        """By default only at batch 1: the streaming case, whose first audio waits on the prefill. A batch's prefill
        is a small part of its time, and graphs per batch size would crowd the LRU of MAX_GRAPHS."""
        if not (self._pads_prompts(device) and self.cuda_graphs and device.type == "cuda"):
            return False
        return B == 1 if self.prefill_graphs is None else True

    @staticmethod
    def _kept(kept: OrderedDict, key: tuple, make: Callable[[], object]):
        """kept[key], made if missing; the least recently used beyond MAX_GRAPHS are dropped."""
        if key not in kept:
            kept[key] = make()
            while len(kept) > MAX_GRAPHS:
                kept.popitem(last=False)
        kept.move_to_end(key)
        return kept[key]

    def _graph_of(self, run: Callable[[], object], device: torch.device) -> torch.cuda.CUDAGraph:
        """run() captured as a CUDA graph, after warm-up runs on a side stream (lazy inits, workspaces, compiles).
        A kernel that refuses capture raises CaptureError, after the device is synced, so the caller can go on
        without the graph."""
        try:
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    run()
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run()
        except RuntimeError as e:
            if "captur" not in str(e).lower():
                raise
            sync_device(device)
            raise CaptureError(str(e).strip()[:160]) from e
        self.captures += 1
        return graph

    @torch.inference_mode()
    def stream(
        self,
        emb: Tensor,
        valid: Tensor,
        params: SamplingParams,
        seed: int = 0,
        should_stop: Callable[[], bool] | None = None,
        first_yield: int | None = None,
        lookahead: bool = False,
        reserve: int = 0,
        text_eos: int | None = None,
    ) -> Iterator[Chunk]:
        """emb (B, T, D) prompt embeddings, valid (B, T) non-padding -> chunks of `chunk` steps.
        first_yield: also hand over the steps so far once `first_yield` steps exist (a streaming renderer's first
        audio needs that many, not a multiple of `chunk`); sampling is unchanged, since noise is drawn per chunk.
        lookahead: queue the next chunk's steps before handing this one over, so that on CUDA the consumer's work
        (a renderer on its own stream) overlaps them; costs up to one chunk of discarded steps after EOS.
        reserve: size the KV cache for this many steps now, not by growing it (with compile=True every cache bucket
        is a compile: a caller that knows the length saves the ones it would pass through).
        text_eos: generate text through the text head (ChatTTS's refine mode), one token per step (codes (B, n, 1)),
        until this token id; None: audio codes."""
        queue: deque[Chunk] = deque()
        launched = self._launch(emb, valid, params, seed, first_yield, reserve, text_eos)
        checks: deque[tuple[Chunk, Tensor, object]] = deque()
        for chunk in itertools.chain(launched, [None]):
            if chunk is not None:
                queue.append(chunk)
            while queue and (chunk is None or len(queue) > int(lookahead)):
                out = queue.popleft()
                if out.ready is not None:
                    out.ready.synchronize()  # its flags have reached the host; later chunks may still run
                checks.append(self._logits_check(out))
                self._read_checks(checks, wait=out.ready is None)
                yield out
                if bool(out.finished.all()) or (should_stop is not None and should_stop()):
                    self._read_checks(checks, wait=True)
                    return
        self._read_checks(checks, wait=True)

    def _logits_check(self, out: Chunk) -> tuple[Chunk, Tensor, object]:
        """Queues whether the chunk's code logits are finite at every row's steps up to its EOS: NaN logits never
        sample EOS, so a model with a NaN head would run to max_new_tokens and speak garbage. A host copy and an
        event, no sync: on CUDA the answer is read at the next chunk, when it is there anyway."""
        h = out.hidden
        dev = h.device
        upto = out.lengths.to(dev, non_blocking=True) - out.start  # a row's steps up to and with its EOS
        keep = torch.arange(h.shape[1], device=dev)[None] <= upto[:, None]
        ok = (torch.isfinite(self.gpt.code_logits(h)).flatten(2).all(-1) | ~keep).all()
        if dev.type != "cuda":
            return out, ok, None
        host = torch.empty((), dtype=torch.bool, pin_memory=True).copy_(ok, non_blocking=True)
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(dev))
        return out, host, done

    def _read_checks(self, checks: deque, wait: bool) -> None:
        while checks and (wait or checks[0][2] is None or checks[0][2].query()):
            out, ok, done = checks.popleft()
            if done is not None:
                done.synchronize()
            if not bool(ok):
                raise NumericalError(
                    f"the GPT's code logits are NaN/inf (steps {out.start}-"
                    f"{out.start + out.hidden.shape[1] - 1}): its audio would be noise that never "
                    f"ends. The head_code weights or the last layers hold non-finite values, or "
                    f"overflowed in {str(self.gpt.norm.weight.dtype).removeprefix('torch.')}"
                )

    def _launch(
        self,
        emb: Tensor,
        valid: Tensor,
        params: SamplingParams,
        seed: int,
        first_yield: int | None,
        reserve: int,
        text_eos: int | None,
    ) -> Iterator[Chunk]:
        """Prefill, then the steps of each chunk, queued (on CUDA) without waiting for them."""
        gpt, cfg = self.gpt, self.gpt.cfg
        B, T, D = emb.shape
        steps = min(params.max_new_tokens, cfg.max_positions - T)
        if steps < 1:
            raise ValueError(
                f"prompt of {T} tokens leaves no room to generate (max_positions {cfg.max_positions}); "
                "split the text into shorter sentences"
            )
        dev, dtype = emb.device, gpt.norm.weight.dtype
        if self._pads_prompts(dev):
            pad = min(-T % PREFILL_BUCKET, cfg.max_positions - T - 1)  # a step's room is never padded away
            emb, valid = F.pad(emb, (0, 0, pad, 0)), F.pad(valid, (pad, 0))  # left: the last position stays last
            steps, T = min(steps, cfg.max_positions - T - pad), T + pad
        # the cache starts at the prompt plus one bucket and grows by buckets: attention cost follows the length
        first = T + min(max(self.chunk, reserve), steps)
        self._ensure_cache(B, first)
        step_fn, s = self._runner(B, params, dtype, dev, text_eos)  # may capture, which writes the cache: prefill after
        prefill = self._prefill_runner(B, T, dtype, dev)
        self._ensure_cache(B, first)
        gpt.key_valid[:B].fill_(True)
        gpt.key_valid[:B, :T] = valid
        s.h.copy_(prefill(emb.to(dtype), (valid.long().cumsum(1) - 1).clamp(min=0)))
        s.step.zero_()
        s.prompt_len.fill_(T)
        s.min_new.fill_(params.min_new_tokens)
        s.rope_base.copy_(valid.long().sum(1, keepdim=True))
        Q, V = vocabulary(cfg, text_eos)
        s.temperature.copy_(torch.tensor(params.temperatures(Q), device=dev).repeat(B))
        s.history.fill_(V)
        s.finished.zero_()
        s.lengths.zero_()
        gen = torch.Generator(device=dev).manual_seed(int(seed))
        lead = self.lead_steps if self.lead_steps is not None else LEAD_STEPS if dev.type == "cuda" else 0
        pending: Chunk | None = None  # handed over once `lead` steps of what follows are queued
        start = 0
        while start < steps:
            if pending is not None and not lead:
                yield pending
                pending = None
            n = min(self.chunk, steps - start)
            if gpt.cache_shape[1] < T + start + n:
                step_fn, s = self._grow(B, T + start + n, params, s, text_eos)
            s.noise.exponential_(1, generator=gen)
            done = 0
            for cut in sorted({first_yield - start, n} if first_yield and 0 < first_yield - start < n else {n}):
                for i in range(cut - done):
                    if pending is not None and i == lead:
                        yield pending
                        pending = None
                    step_fn()
                if pending is not None:
                    yield pending
                pending = Chunk(
                    start + done,
                    s.hidden[:, done:cut].clone(),
                    s.codes[:, done:cut].clone(),
                    *self._to_host(s.lengths, s.finished),
                )
                done = cut
            start += n
        if pending is not None:
            yield pending

    @staticmethod
    def _to_host(*tensors: Tensor) -> tuple:
        """Host copies of small device tensors without a sync, and the event that says they have arrived."""
        if tensors[0].device.type != "cuda":
            return (*(t.clone() for t in tensors), None)
        host = tuple(torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True) for t in tensors)
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(tensors[0].device))
        return (*host, ready)

    def generate(
        self,
        emb: Tensor,
        valid: Tensor,
        params: SamplingParams,
        seed: int = 0,
        should_stop: Callable[[], bool] | None = None,
        reserve: int = 0,
        text_eos: int | None = None,
    ) -> Generation:
        chunks = list(self.stream(emb, valid, params, seed, should_stop, reserve=reserve, text_eos=text_eos))
        last, dev = chunks[-1], emb.device
        return Generation(
            torch.cat([c.hidden for c in chunks], 1),
            torch.cat([c.codes for c in chunks], 1),
            last.lengths.to(dev),
            last.finished.to(dev),
        )

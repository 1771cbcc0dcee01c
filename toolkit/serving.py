"""Synthesis on several devices: one Synthesizer replica per device, each request sent to the replica with the least
expected audio still to make. Each replica runs in its own worker thread (a BatchingSynthesizer), so callers get
futures and the devices work at the same time.

    router = Router("/path/to/ChatTTS", ["cuda:0", "cuda:1"], precision="bf16")
    futures = [router.submit(t, seed=0) for t in texts]
    wavs = [f.result().wav for f in futures]
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Sequence

from .batching import BatchingSynthesizer
from .sampling import SamplingParams
from .synthesizer import Synthesizer
from .text import expected_seconds


class Router:
    def __init__(
        self,
        model=None,
        devices: Sequence[str] = ("cuda:0",),
        precision: str | None = None,
        *,
        max_batch: int = 1,
        **synth_options,
    ):
        """max_batch 1: each request's audio equals `Synthesizer.synthesize(text, seed=seed)` on one device.
        Above 1, requests that meet on a replica with the same speaker, seed and settings share a batch (more audio
        per second; the audio then depends on the batch, as it does for BatchingSynthesizer)."""
        if not devices:
            raise ValueError("give at least one device, e.g. ['cuda:0', 'cuda:1'] or ['cpu']")
        self.replicas = [Synthesizer(model, d, precision, **synth_options) for d in devices]
        self._workers = [BatchingSynthesizer(s, max_batch=max_batch) for s in self.replicas]
        self._lock = threading.Lock()
        self.queued_s = [0.0] * len(devices)  # expected audio seconds submitted and not yet finished, per replica
        self.queued = [0] * len(devices)  # requests submitted and not yet finished
        self.routed = [0] * len(devices)  # requests sent to each replica so far

    def submit(self, text: str, *, speaker=None, seed: int = 0, params: SamplingParams | None = None) -> Future:
        """-> a Future resolving to an Utterance (or raising the synthesis error)."""
        cost = expected_seconds(text)
        with self._lock:  # least expected audio first, then the shorter queue, then the lower index
            i = min(range(len(self.replicas)), key=lambda k: (self.queued_s[k], self.queued[k], k))
            self.queued_s[i] += cost
            self.queued[i] += 1
            self.routed[i] += 1
        future = self._workers[i].submit(text, speaker=speaker, seed=seed, params=params)
        future.add_done_callback(lambda _: self._done(i, cost))
        return future

    def _done(self, i: int, cost: float) -> None:
        with self._lock:
            self.queued_s[i] -= cost
            self.queued[i] -= 1

    def close(self) -> None:
        for w in self._workers:
            w.close()

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

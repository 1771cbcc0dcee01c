"""Batching of concurrent requests: callers submit texts from any thread; one worker runs whatever has
queued up (up to `max_batch` texts with the same speaker, seed and sampling settings) as a single batch."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

from .sampling import SamplingParams
from .synthesizer import Synthesizer, Utterance


@dataclass
class _Request:
    text: str
    speaker: object
    seed: int
    params: SamplingParams
    future: Future = field(default_factory=Future)

    @property
    def key(self) -> tuple:
        """Requests with equal keys can share a batch."""
        spk = tuple(self.speaker.tolist()) if hasattr(self.speaker, "tolist") else self.speaker
        return spk, self.seed, tuple(sorted(self.params.__dict__.items()))


class BatchingSynthesizer:
    def __init__(self, synth: Synthesizer, max_batch: int = 16, wait_s: float = 0.005):
        self.synth, self.max_batch, self.wait_s = synth, max_batch, wait_s
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._worker = threading.Thread(target=self._run, name="ttsq-batcher", daemon=True)
        self._worker.start()

    def submit(self, text: str, *, speaker=None, seed: int = 0, params: SamplingParams | None = None) -> Future:
        """-> a Future resolving to an Utterance (or raising the synthesis error)."""
        req = _Request(text, speaker, seed, params or SamplingParams())
        self._queue.put(req)
        return req.future

    def close(self) -> None:
        self._queue.put(None)
        self._worker.join()

    def _run(self) -> None:
        pending: list[_Request] = []
        while True:
            first = pending.pop(0) if pending else self._queue.get()
            if first is None:
                return
            batch = [first]
            try:  # gather what arrives within wait_s
                while len(batch) < self.max_batch:
                    nxt = self._queue.get(timeout=self.wait_s)
                    if nxt is None:
                        self._queue.put(None)
                        break
                    (batch if nxt.key == first.key else pending).append(nxt)
            except queue.Empty:
                pass
            try:
                utts: list[Utterance] = self.synth.synthesize(
                    [r.text for r in batch],
                    speaker=first.speaker,
                    seed=first.seed,
                    params=first.params,
                    batch_size=len(batch),
                )
                for r, u in zip(batch, utts):
                    r.future.set_result(u)
            except Exception as e:  # every caller of the batch hears about the failure; the worker goes on
                for r in batch:
                    r.future.set_exception(e)

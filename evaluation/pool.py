"""Scoring work spread over processes: the per-waveform analyses that dominate `ttsq evaluate`'s scoring time.
Imports no torch, so the spawned workers start light."""

from __future__ import annotations

from typing import Callable

import numpy as np

from . import metrics


def cepstrum_or_error(args: tuple[np.ndarray, int]):
    """A waveform's mel-cepstra, or the ValueError's message (too short to analyse)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, user_api="blas"):  # the same single-threaded sums as the main process
        try:
            return metrics.mel_cepstrum(*args)
        except ValueError as e:
            return str(e)


def dnsmos_overall(args: tuple[np.ndarray, int]) -> float | None:
    """DNSMOS OVRL, or None where the clip is too short or silent for it."""
    try:
        return metrics.dnsmos(*args)["ovrl"]
    except ValueError:
        return None


def map_in_processes(fn: Callable, items: list, workers: int, progress: Callable[[int, int], None] | None = None):
    """[fn(x) for x in items], in order, over `workers` spawned processes (forking one that holds CUDA state is
    unsafe); in this process when workers <= 1."""
    if workers <= 1 or len(items) < 2:
        results = map(fn, items)
        pool = None
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(min(workers, len(items)), mp_context=multiprocessing.get_context("spawn"))
        results = pool.map(fn, items)
    try:
        out = []
        for r in results:
            out.append(r)
            if progress:
                progress(len(out), len(items))
        return out
    finally:
        if pool is not None:
            pool.shutdown()

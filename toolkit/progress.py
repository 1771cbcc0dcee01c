"""Progress for the command line, scripts and the GUI: one bar (or line) per stage, each with its own ETA."""

from __future__ import annotations

import sys
import time


def progress_bar(desc: str):
    """A progress callback drawing tqdm bars on stderr: call it as (done, total), or (stage, done, total) for one
    bar per stage. A finished stage's bar stays, with its time; the running one shows its rate and ETA."""
    from tqdm import tqdm

    bars = {}

    def update(stage_or_done, done_or_total, total=None):
        if total is None:  # (done, total) form
            stage, done, total = desc, stage_or_done, done_or_total
        else:
            stage, done = stage_or_done, done_or_total
        bar = bars.get(stage) or bars.setdefault(
            stage, tqdm(total=total, desc=stage, unit="it", leave=True, file=sys.stderr)
        )
        bar.n = done
        bar.refresh()
        if done >= total:
            bar.close()

    return update


def duration(seconds: float) -> str:
    """ "45 s", "3 min 20 s", "1 h 05 min"."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class StageClock:
    """Times the stages of a (stage, done, total) progress stream: how long each finished one took, and the ETA of
    the running one from its rate so far (None until its first unit is done)."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.started: dict[str, float] = {}
        self.took: dict[str, float] = {}  # finished stages, in order

    def update(self, stage: str, done: int, total: int) -> float | None:
        """-> the running stage's ETA in seconds."""
        now = self.clock()
        t0 = self.started.setdefault(stage, now)
        if done >= total:
            self.took.setdefault(stage, now - t0)
            return 0.0
        return (now - t0) / done * (total - done) if done > 0 else None

"""Progress bars for the command line and scripts (tqdm on stderr)."""
from __future__ import annotations

import sys


def progress_bar(desc: str):
    """A progress callback drawing tqdm bars on stderr: call it as (done, total), or (stage, done, total) for one
    bar per stage."""
    from tqdm import tqdm
    bars = {}

    def update(stage_or_done, done_or_total, total=None):
        if total is None:  # (done, total) form
            stage, done, total = desc, stage_or_done, done_or_total
        else:
            stage, done = stage_or_done, done_or_total
        bar = bars.get(stage) or bars.setdefault(stage, tqdm(total=total, desc=stage, unit="it", leave=False,
                                                               file=sys.stderr))
        bar.n = done
        bar.refresh()
        if done >= total:
            bar.close()
    return update

"""The commit a benchmark ran: what each result file records beside its command and hardware."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str | None:
    """TTSQ_COMMIT where it is set (a device machine's copy of .git can be stale or missing), else this checkout's
    HEAD, short; None where neither is known."""
    if os.environ.get("TTSQ_COMMIT"):
        return os.environ["TTSQ_COMMIT"]
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    except OSError:  # no git on the machine
        return None
    return out.stdout.strip() or None

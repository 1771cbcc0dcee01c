"""Entry point: `python -m gui` or `ttsq gui`."""

from __future__ import annotations

import argparse
import os
import sys


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ttsq gui", description="desktop GUI: synthesize, listen, compare precisions")
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model folder to open (default: the last one, or the shipped voice)")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: the last one)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run(args.model, args.device)


def run(model: str | None = None, device: str | None = None) -> int:
    os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
    try:
        from PySide6.QtWidgets import QApplication
    except ImportError as e:
        print(f"ttsq gui: PySide6 is missing ({e}); install the gui extra: pip install -e '.[gui]'", file=sys.stderr)
        return 2
    from .window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setOrganizationName("ttsq")
    app.setApplicationName("ttsq-gui")
    if device is not None and device != "cpu" and not device.startswith("cuda"):
        print(f"ttsq gui: unsupported device {device}; use cpu or cuda[:N]", file=sys.stderr)
        return 2
    if device == "cuda":
        device = "cuda:0"
    win = MainWindow(model=model, device=device)
    win.show()
    rc = app.exec()
    win.wait_for_workers()  # a run cancelled at close finishes its current step before the process exits
    return rc

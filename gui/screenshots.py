"""Screenshots of the main states for docs/gui/: `python -m gui.screenshots OUT_DIR --model PATH [--precisions ...]`.

Run it on a real display or under Xvfb (QT_QPA_PLATFORM=xcb); tests/test_gui.py does the latter on a tiny model.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gui.screenshots")
    p.add_argument("out")
    p.add_argument("--model", default=None)
    p.add_argument("--precisions", nargs="+", default=["fp32", "int8", "bf16"])
    p.add_argument("--text", default="Turn left at the second light.")
    p.add_argument("--max-steps", type=int, default=64)
    p.add_argument("--dnsmos", action="store_true")
    p.add_argument("--no-asr", dest="asr", action="store_false", help="leave the WER/CER column empty (faster)")
    a = p.parse_args(argv)
    os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
    from PySide6.QtCore import QSettings, QTimer
    from PySide6.QtWidgets import QApplication

    from .dialogs import ExportDialog, QuantizeDialog
    from .window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = QSettings(str(Path(tempfile.mkdtemp()) / "gui.ini"), QSettings.IniFormat)
    win = MainWindow(settings, model=a.model, device="cpu")
    win.resize(1400, 900)
    win.text.setPlainText(a.text)
    win.set_precisions(a.precisions)
    win.max_steps.setValue(a.max_steps)
    win.dnsmos.setChecked(a.dnsmos)
    win.asr.setChecked(a.asr)
    win.show()

    def pump(ms: int = 200):
        end = QTimer()
        end.setSingleShot(True)
        end.start(ms)
        while end.isActive():
            app.processEvents()

    def shot(widget, name):
        pump(300)
        widget.grab().save(str(out / name))
        print(f"wrote {out / name}")

    pump(500)
    shot(win, "01-start.png")
    win.synthesize()
    while win.busy() and not win.results:
        pump(50)
    shot(win, "02-synthesizing.png")
    while win.busy():
        pump(100)
    win.ab_button.setChecked(False)
    shot(win, "03-results.png")
    win.resize(900, 640)
    shot(win, "04-results-small-window.png")
    win.resize(1400, 900)
    for cls, name in ((QuantizeDialog, "05-quantize-dialog.png"), (ExportDialog, "06-export-dialog.png")):
        d = cls(a.model, "cpu", win)
        d.show()
        shot(d, name)
        d.close()
    win.show_error("Synthesis failed", "CheckpointError: model path not found: /no/such/model. Pass --model with a "
                   "ttsq model folder, a quantized artifact, or an official ChatTTS folder (the one holding asset/)")
    pump(300)
    win.error_box.grab().save(str(out / "07-error-dialog.png"))
    print(f"wrote {out / '07-error-dialog.png'}")
    win.error_box.close()
    win.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Screenshots of the main states for docs/gui/:
`python -m gui.screenshots OUT_DIR [--model PATH] [--precisions ...] [--artifact FOLDER]`.

With --artifact (a quantized artifact or ONNX folder of the model) it also picks the artifact after the first
comparison and synthesizes it beside its source's FP32: the walkthrough of comparing a quantized model.
Run it on a real display or under Xvfb (QT_QPA_PLATFORM=xcb) or offscreen; tests/test_gui.py runs it under Xvfb on
a tiny model.
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
    p.add_argument("--max-steps", type=int, default=2048)
    p.add_argument("--artifact", default=None, help="an artifact or ONNX folder of --model to compare with its FP32")
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=860)
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
    win.resize(a.width, a.height)
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
    win.chart_axis.setCurrentText("MCD vs FP32")  # the noise floor's band is widest here
    shot(win, "03-results.png")
    if a.artifact:
        win.set_model(a.artifact)
        win.synthesize()
        while win.busy():
            pump(100)
        if win.artifact_label() in win.results:
            win.table.select(win.artifact_label())
        shot(win, "04-artifact-vs-fp32.png")
    for name, r in win.results.items():  # what the pictures show, for the reader of the log (and the test)
        mcd = r["mcd_db"] if r["mcd_db"] is None else round(r["mcd_db"], 2)
        print(
            f"result {name}: RTF {r['rtf']:.3f}, MCD vs FP32 {mcd}"
            f" dB, WER/CER {r['asr_rate']}, from {r['model'] or 'shipped voice'}"
        )
    if win.floor:
        print(f"noise floor: MCD {win.floor['mcd_db']:.2f} dB, WER/CER {win.floor['asr_rate']}")
    win.resize(1024, 700)
    shot(win, "05-results-1024px.png")
    win.resize(a.width, a.height)
    if win.error_box is not None:
        print(f"error: {win.error_box.text()}", file=sys.stderr)
        return 1
    for cls, name in ((QuantizeDialog, "06-quantize-dialog.png"), (ExportDialog, "07-export-dialog.png")):
        d = cls(a.model, "cpu", win)
        d.show()
        shot(d, name)
        d.close()
    win.set_model("/no/such/model")
    win.synthesize()
    while win.busy():
        pump(100)
    pump(300)
    win.error_box.grab().save(str(out / "08-error-dialog.png"))
    print(f"wrote {out / '08-error-dialog.png'}")
    win.error_box.close()
    win.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

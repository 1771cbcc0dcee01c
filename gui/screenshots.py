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
    from PySide6.QtCore import QPoint, QSettings, QTimer
    from PySide6.QtGui import QPainter
    from PySide6.QtWidgets import QApplication

    from . import workers
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
    panel = win.main.widget(0)  # the left panel (a scroll area) dragged as wide as its rows need
    need = panel.widget().sizeHint().width() + 2 * panel.frameWidth() + panel.verticalScrollBar().sizeHint().width()
    win.main.setSizes([need, a.width - need])

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
    win.speaker.showPopup()  # the voice's named voices: the popup is a window of its own, drawn onto the grab
    pump(300)
    popup = win.speaker.view().window()
    pix = win.grab()
    painter = QPainter(pix)
    painter.drawPixmap(popup.mapToGlobal(QPoint(0, 0)) - win.mapToGlobal(QPoint(0, 0)), popup.grab())
    painter.end()
    pix.save(str(out / "01b-speaker-list.png"))
    win.speaker.hidePopup()
    win.synthesize()
    while win.busy() and not win.results:
        pump(50)
    shot(win, "02-synthesizing.png")
    while win.busy():
        pump(100)
    win.ab_button.setChecked(False)
    win.chart_axis.setCurrentText("MCD vs FP32")  # the noise floor's band is widest here
    shot(win, "03-results.png")
    if a.artifact:  # "Add model…": the artifact and its source's FP32 as a group of their own
        win.set_precisions(["fp32"])
        group = win.add_other(a.artifact)
        win.synthesize()
        while win.busy():
            pump(100)
        label = workers.row_name(group, Path(a.artifact).name)
        if label in win.results:
            win.table.select(label)
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
    win.main.setSizes([320, 1024 - 320])  # the window's own split at 1024 px (the left panel scrolls)
    shot(win, "05-results-1024px.png")
    win.resize(a.width, a.height)
    if win.error_box is not None:
        print(f"error: {win.error_box.text()}", file=sys.stderr)
        return 1
    d = QuantizeDialog(a.model, "cpu", win)  # int4, two layers kept in float, run until its expected time shows
    d.precision.setCurrentText("int4")
    d.keep.setValue(2)
    d.out.setText(str(Path(tempfile.mkdtemp()) / "q"))
    d.show()
    d.start()
    while d.busy() and not d.expected:
        pump(100)
    shot(d, "06-quantize-dialog.png")
    d.cancel_or_close()
    while d.busy():
        pump(100)
    d.close()
    d = ExportDialog(a.model, "cpu", win)
    d.show()
    shot(d, "07-export-dialog.png")
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

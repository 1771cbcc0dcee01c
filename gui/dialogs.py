"""Quantize and Export dialogs: `toolkit.quantize_job.quantize_to_artifact` and `toolkit.export.export_onnx`,
each in a worker thread with progress and a clear error."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QFileDialog, QFormLayout,
                               QHBoxLayout, QLabel, QLineEdit, QProgressBar, QPushButton, QSpinBox, QVBoxLayout,
                               QWidget)

from . import workers

CALIB_DIR = Path(__file__).resolve().parents[1] / "calibration_sets"


def _path_row(edit: QLineEdit, parent: QWidget, title: str) -> QWidget:
    box = QWidget()
    lay = QHBoxLayout(box)
    lay.setContentsMargins(0, 0, 0, 0)
    lay.addWidget(edit, 1)
    b = QPushButton("Browse…")
    b.clicked.connect(lambda: edit.setText(QFileDialog.getExistingDirectory(parent, title) or edit.text()))
    lay.addWidget(b)
    return box


class _JobDialog(QDialog):
    """A form, a Run button, a progress bar with the stage, Cancel/Close; the call runs in a Worker."""
    produced = Signal(str)  # the folder written
    action = "Run"

    def __init__(self, model: str | None, device: str, parent=None):
        super().__init__(parent)
        self.model = model
        self.worker: workers.Worker | None = None
        self.form = QFormLayout()
        self.precision = QComboBox()
        self.calib = QComboBox()
        self.calib.addItem("none (round to nearest)", None)
        for f in sorted(CALIB_DIR.glob("*.jsonl")):
            self.calib.addItem(f.name, str(f))
        self.out = QLineEdit()
        self.force = QCheckBox("replace an existing output folder")
        self.device = device
        self.form.addRow("Model", QLabel(model or "shipped voice"))
        self.form.addRow("Precision", self.precision)
        self.form.addRow("Calibration set", self.calib)
        self.form.addRow("Output folder", _path_row(self.out, self, "Output folder"))
        self.form.addRow("", self.force)
        self.stage = QLabel("Choose the options, then start.")
        self.stage.setWordWrap(True)
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.buttons = QDialogButtonBox()
        self.run_button = self.buttons.addButton(self.action, QDialogButtonBox.AcceptRole)
        self.close_button = self.buttons.addButton(QDialogButtonBox.Close)
        self.run_button.clicked.connect(self.start)
        self.close_button.clicked.connect(self.cancel_or_close)
        lay = QVBoxLayout(self)
        lay.addLayout(self.form)
        lay.addWidget(self.bar)
        lay.addWidget(self.stage)
        lay.addWidget(self.buttons)
        self.resize(520, self.sizeHint().height())

    def arguments(self) -> dict:  # pragma: no cover -- overridden; read on the GUI thread
        raise NotImplementedError

    def call(self, args: dict, progress):  # pragma: no cover -- overridden; runs in the worker thread
        raise NotImplementedError

    def start(self) -> None:
        if not self.out.text().strip():
            self.stage.setText("Choose an output folder.")
            return
        self.run_button.setEnabled(False)
        self.close_button.setText("Cancel")
        self.bar.setValue(0)
        self.stage.setText("starting…")
        args = self.arguments()

        def fn(emit, should_stop):
            def progress(*a):  # (stage, done, total) or (done, total)
                if should_stop():
                    raise InterruptedError("cancelled")
                stage, done, total = a if len(a) == 3 else ("", *a)
                emit("progress", (done / max(total, 1), f"{stage} {done}/{total}".strip()))
            return self.call(args, progress)

        self.worker = workers.Worker(fn)
        self.worker.event.connect(self._event)
        self.worker.done.connect(self._done)
        self.worker.failed.connect(lambda m: self._end(f"Failed: {m}"))
        self.worker.cancelled.connect(lambda: self._end("Cancelled."))
        workers.start(self.worker, self)

    def _event(self, kind, payload) -> None:
        if kind == "progress":
            frac, label = payload
            self.bar.setValue(int(1000 * frac))
            self.stage.setText(label)

    def _done(self, result) -> None:
        path = result[0] if isinstance(result, tuple) else result
        self.bar.setValue(1000)
        self._end(f"Saved {path}")
        self.produced.emit(str(path))

    def _end(self, message: str) -> None:
        self.stage.setText(message)
        self.run_button.setEnabled(True)
        self.close_button.setText("Close")

    def busy(self) -> bool:
        return self.worker is not None and self.worker.is_running()

    def cancel_or_close(self) -> None:
        if self.busy():
            self.worker.cancel()
            self.stage.setText("cancelling after the current step…")
        else:
            self.accept()

    def closeEvent(self, event) -> None:
        if self.busy():
            self.worker.cancel()
            event.ignore()
        else:
            super().closeEvent(event)


class QuantizeDialog(_JobDialog):
    action = "Quantize"

    def __init__(self, model, device, parent=None):
        super().__init__(model, device, parent)
        self.setWindowTitle("Quantize a model")
        import torch

        from toolkit.precision.recipes import RECIPES, UnsupportedRecipe, get_recipe
        self.qdevice = QComboBox()
        for d in ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]:
            self.qdevice.addItem(d)
        self.qdevice.setCurrentText(device if device in [self.qdevice.itemText(i) for i in range(self.qdevice.count())]
                                    else "cpu")
        for name in RECIPES:
            if name == "fp32":
                continue
            try:
                get_recipe(name, torch.device(self.qdevice.currentText()))
                self.precision.addItem(name)
            except UnsupportedRecipe:
                pass
        self.precision.setCurrentText("int8")
        self.limit = QSpinBox()
        self.limit.setRange(1, 10000)
        self.limit.setValue(32)
        self.form.insertRow(2, "Device", self.qdevice)
        self.form.insertRow(4, "Calibration texts", self.limit)
        self.out.setText(str(Path.cwd() / "artifacts" / "model-int8"))
        self.precision.currentTextChanged.connect(
            lambda p: self.out.setText(str(Path(self.out.text()).with_name(f"model-{p}"))))

    def arguments(self) -> dict:
        return dict(precision=self.precision.currentText(), out=self.out.text().strip(),
                    calib_set=self.calib.currentData(), device=self.qdevice.currentText(), limit=self.limit.value(),
                    force=self.force.isChecked())

    def call(self, args, progress):
        from toolkit.quantize_job import quantize_to_artifact
        return quantize_to_artifact(self.model, args.pop("precision"), args.pop("out"), progress=progress, **args)


def export_available() -> tuple[bool, str]:
    try:
        from toolkit.export import export_onnx  # noqa: F401
        return True, ""
    except ImportError as e:
        return False, f"ONNX export is unavailable in this build ({e}); install the edge extra or update ttsq."


class ExportDialog(_JobDialog):
    action = "Export"

    def __init__(self, model, device, parent=None):
        super().__init__(model, device, parent)
        self.setWindowTitle("Export to ONNX")
        for name in ("fp32", "fp16", "int8", "int4"):
            self.precision.addItem(name)
        self.out.setText(str(Path.cwd() / "exports" / "model-onnx"))
        ok, why = export_available()
        if not ok:
            self.run_button.setEnabled(False)
            self.stage.setText(why)

    def arguments(self) -> dict:
        return dict(precision=self.precision.currentText(), out=self.out.text().strip(),
                    calib_set=self.calib.currentData(), force=self.force.isChecked())

    def call(self, args, progress):
        from toolkit.export import export_onnx
        return export_onnx(self.model, args.pop("precision"), args.pop("out"), progress=progress, **args)

"""Quantize and Export dialogs: `toolkit.quantize_job.quantize_to_artifact` and `toolkit.export.export_onnx`,
each in a worker thread with progress and a clear error."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from . import workers
from .messages import for_gui

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


def calibration_sets() -> list[Path]:
    """The shipped text sets meant for calibration. The others are what evaluation scores (eval.jsonl, its subset
    smoke.jsonl, the held-out sets): calibrating on them would grade the model on its own homework."""
    return sorted(CALIB_DIR.glob("calib*.jsonl"))


def evaluation_set_named(path: str | Path) -> str | None:
    """The shipped evaluation set whose texts `path` holds (same content), or None."""
    from toolkit.textsets import set_hash

    try:
        digest = set_hash(path)
        return next(
            (
                f.name
                for f in sorted(CALIB_DIR.glob("*.jsonl"))
                if f not in calibration_sets() and set_hash(f) == digest
            ),
            None,
        )
    except (OSError, ValueError):
        return None


def default_out(folder: str, model: str | None, suffix: str) -> str:
    """folder/<model name>-<suffix>, in the current folder: the name says what was made from what."""
    name = Path(model).name if model else "shipped-voice"
    return str(Path.cwd() / folder / f"{name}-{suffix}")


class _JobDialog(QDialog):
    """A form, a Run button, the stages with a progress bar and each stage's time or ETA, Cancel/Close; the call
    runs in a Worker. Subclasses set `out_folder` and `out_suffix()` for the default output folder name."""

    produced = Signal(str)  # the folder written
    action = "Run"
    out_folder = "out"

    def __init__(self, model: str | None, device: str, parent=None):
        super().__init__(parent)
        self.model = model
        self.worker: workers.Worker | None = None
        self.form = QFormLayout()
        self.form.setRowWrapPolicy(QFormLayout.WrapLongRows)
        self.precision = QComboBox()
        self.calib = QComboBox()
        self.calib.addItem("none (round to nearest)", None)
        for f in calibration_sets():
            self.calib.addItem(f.name, str(f))
        self.calib.addItem("other file…", "other")
        self.calib.activated.connect(self._pick_calib)
        self.out = QLineEdit()
        self._auto_out = ""  # the folder name last filled in, replaced as the precision changes (a typed one is kept)
        self.force = QCheckBox("replace an existing output folder")
        self.device = device
        self.form.addRow("Model", QLabel(model or "shipped voice"))
        self.form.addRow("Precision", self.precision)
        self.form.addRow("Calibration set", self.calib)
        self.form.addRow("Output folder", _path_row(self.out, self, "Output folder"))
        self.form.addRow("", self.force)
        self.stages = QLabel()  # every stage: done (its time), running (its progress and ETA), to come
        self.stages.setTextFormat(Qt.RichText)
        self.stages.setWordWrap(True)
        self.stage = QLabel("Choose the options, then start.")
        self.stage.setWordWrap(True)
        self.stage.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.buttons = QDialogButtonBox()
        self.run_button = self.buttons.addButton(self.action, QDialogButtonBox.AcceptRole)
        self.close_button = self.buttons.addButton(QDialogButtonBox.Close)
        self.run_button.clicked.connect(self.start)
        self.close_button.clicked.connect(self.cancel_or_close)
        lay = QVBoxLayout(self)
        lay.addLayout(self.form)
        lay.addWidget(self.stages)
        lay.addWidget(self.bar)
        lay.addWidget(self.stage)
        lay.addWidget(self.buttons)
        self.precision.currentTextChanged.connect(lambda _: self._refresh_out())
        self.resize(560, self.sizeHint().height())

    def out_suffix(self) -> str:  # pragma: no cover -- overridden
        return self.precision.currentText()

    def _refresh_out(self) -> None:
        if not self.out.text().strip() or self.out.text() == self._auto_out:
            self._auto_out = default_out(self.out_folder, self.model, self.out_suffix())
            self.out.setText(self._auto_out)

    def _pick_calib(self, index: int) -> None:
        if self.calib.itemData(index) != "other":
            return
        path, _ = QFileDialog.getOpenFileName(self, "Calibration text set", str(CALIB_DIR), "Text sets (*.jsonl)")
        self.set_calib_file(path) if path else self.calib.setCurrentIndex(0)

    def set_calib_file(self, path: str) -> bool:
        """A text set of the user's: refused (with the reason) when it is one of the evaluation sets."""
        taken = evaluation_set_named(path)
        if taken:
            self.calib.setCurrentIndex(0)
            self.stage.setText(
                f"{Path(path).name} holds the texts of {taken}, which evaluation scores: calibrating on "
                "it would make the quantized model look better than it is. Pick calib.jsonl or "
                "texts of your own."
            )
            return False
        i = self.calib.findData(path)
        if i < 0:
            self.calib.insertItem(self.calib.count() - 1, Path(path).name, path)
            i = self.calib.findData(path)
        self.calib.setCurrentIndex(i)
        return True

    def planned_stages(self) -> list[str]:
        return []

    def arguments(self) -> dict:  # pragma: no cover -- overridden; read on the GUI thread
        raise NotImplementedError

    def call(self, args: dict, progress, emit):  # pragma: no cover -- overridden; runs in the worker thread
        raise NotImplementedError

    def summary(self, result) -> str:
        return ""

    def start(self) -> None:
        if not self.out.text().strip():
            self.stage.setText("Choose an output folder.")
            return
        from toolkit.progress import StageClock

        self.run_button.setEnabled(False)
        self.close_button.setText("Cancel")
        self.bar.setValue(0)
        self.stage.setText("starting…")
        self.clock = StageClock()
        self.order = list(self.planned_stages())
        self.current: tuple[str, int, int, float | None] | None = None
        self.expected: dict[str, float] = {}  # seconds per stage, as the job's probe estimated them
        self._show_stages()
        args = self.arguments()

        def fn(emit, should_stop):
            def progress(*a):  # (stage, done, total) or (done, total)
                if should_stop():
                    raise InterruptedError("cancelled")
                stage, done, total = a if len(a) == 3 else ("", *a)
                emit("progress", (stage, done, total))

            return self.call(args, progress, emit)

        self.worker = workers.Worker(fn)
        self.worker.event.connect(self._event)
        self.worker.done.connect(self._done)
        self.worker.failed.connect(lambda m: self._end(f"Failed: {for_gui(m)}"))
        self.worker.cancelled.connect(lambda: self._end("Cancelled."))
        workers.start(self.worker, self)

    def _event(self, kind, payload) -> None:
        if kind == "estimate":
            self.expected = payload
            self._show_stages()
        if kind != "progress":
            return
        stage, done, total = payload
        if stage not in self.order:
            self.order.append(stage)
        for earlier in self.order[: self.order.index(stage)]:  # a later stage began: the earlier ones are done
            if earlier in self.clock.started:
                self.clock.update(earlier, 1, 1)
        eta = self.clock.update(stage, done, total)
        self.current = (stage, done, total, eta)
        k = self.order.index(stage)
        self.bar.setValue(int(1000 * (k + done / max(total, 1)) / max(len(self.order), 1)))
        self._show_stages()

    def _show_stages(self) -> None:
        from toolkit.progress import duration

        lines = []
        if self.expected:
            lines.append(
                f"Expected time: about {duration(sum(self.expected.values()))} in all (measured by a short probe "
                "of this model on this device)"
            )
        for name in self.order:
            if name in self.clock.took:
                lines.append(f"✓ {name} ({duration(self.clock.took[name])})")
            elif self.current and self.current[0] == name:
                _, done, total, eta = self.current
                left = f", about {duration(eta)} left" if eta else ""
                lines.append(f"<b>▶ {name} {done}/{total}{left}</b>")
            else:
                guess = f" (about {duration(self.expected[name])})" if name in self.expected else ""
                lines.append(f"<span style='color:#888'>· {name}{guess}</span>")
        self.stages.setText("<br>".join(lines))

    def _done(self, result) -> None:
        path = result[0] if isinstance(result, tuple) else result
        self.bar.setValue(1000)
        for name in self.order:
            if name in self.clock.started:
                self.clock.update(name, 1, 1)
        self.current = None
        self._show_stages()
        self._end(f"Saved {path}. {self.summary(result)}".strip())
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
    out_folder = "artifacts"

    def __init__(self, model, device, parent=None):
        super().__init__(model, device, parent)
        self.setWindowTitle("Quantize a model")
        import torch

        from toolkit.precision.recipes import RECIPES, UnsupportedRecipe, get_recipe

        self.qdevice = QComboBox()
        for d in ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]:
            self.qdevice.addItem(d)
        self.qdevice.setCurrentText(
            device if device in [self.qdevice.itemText(i) for i in range(self.qdevice.count())] else "cpu"
        )
        for name in RECIPES:
            if name == "fp32":
                continue
            try:
                get_recipe(name, torch.device(self.qdevice.currentText()))
                self.precision.addItem(name)
            except UnsupportedRecipe:
                pass
        self.limit = QSpinBox()
        self.limit.setRange(1, 10000)
        self.limit.setToolTip("texts of the calibration set to generate from: the time grows with it")
        self.keep = QSpinBox()
        self.keep.setRange(0, 200)
        self.keep.setToolTip(
            "the N layers most sensitive to this precision stay in float (a sensitivity scan "
            "finds them; needs a calibration set)"
        )
        self.form.insertRow(2, "Device", self.qdevice)
        self.form.insertRow(4, "Calibration texts", self.limit)
        self.form.insertRow(5, "Keep in float", self.keep)
        self.qdevice.currentTextChanged.connect(self._device_changed)
        self.calib.currentIndexChanged.connect(self._calib_changed)
        self._device_changed(self.qdevice.currentText())
        self.calib.setCurrentIndex(max(self.calib.findText("calib.jsonl"), 0))
        self._calib_changed()
        self.precision.setCurrentText("int8")
        self._refresh_out()
        self._show_plan()
        for w in (self.precision, self.calib, self.limit, self.keep):
            changed = w.currentIndexChanged if isinstance(w, QComboBox) else w.valueChanged
            changed.connect(lambda *_: self._show_plan())

    def _device_changed(self, device: str) -> None:
        from toolkit.quantize_job import calibration_texts

        self.limit.setValue(calibration_texts(device))  # proportionate to the device: 8 on the CPU, 32 on a GPU

    def _calib_changed(self, *_) -> None:
        on = self.calib.currentData() not in (None, "other")
        self.limit.setEnabled(on)
        self.keep.setEnabled(on)

    def planned_stages(self) -> list[str]:
        from toolkit.quantize_job import plan_stages

        calibrated = self.calib.currentData() not in (None, "other")
        return plan_stages(self.precision.currentText(), calibrated, self.keep.value() if calibrated else 0)

    def _show_plan(self) -> None:
        if self.busy() or not self.precision.currentText():
            return
        calibrated = self.calib.currentData() not in (None, "other")
        cost = (
            f"Calibration generates {self.limit.value()} texts × up to 96 GPT steps, then reads them four more "
            "times or so; the time grows with the texts. "
            if calibrated
            else ""
        )
        self.stage.setText(
            cost
            + "Stages: "
            + ", ".join(self.planned_stages())
            + ". Each shows its progress and time left once it runs"
            + ("; a short probe of the model first estimates the total." if calibrated else ".")
        )

    def arguments(self) -> dict:
        calib = self.calib.currentData()
        calib = None if calib == "other" else calib
        return dict(
            precision=self.precision.currentText(),
            out=self.out.text().strip(),
            calib_set=calib,
            device=self.qdevice.currentText(),
            limit=self.limit.value(),
            keep_sensitive=self.keep.value() if calib else 0,
            force=self.force.isChecked(),
        )

    def call(self, args, progress, emit):
        from toolkit.quantize_job import quantize_to_artifact

        return quantize_to_artifact(
            self.model,
            args.pop("precision"),
            args.pop("out"),
            progress=progress,
            estimate=lambda est: emit("estimate", est),
            **args,
        )

    def summary(self, result) -> str:
        """What the run did: layers quantized, kept in float (the sensitive ones by name), skipped; the error of
        each stage against FP32 on the calibration texts; the size."""
        report = result[1]
        plan = report.plan
        kept = f" ({', '.join(plan.keep[:4])}{', …' if len(plan.keep) > 4 else ''})" if plan.keep else ""
        text = (
            f"{len(plan.quantize)} layers quantized, {len(plan.keep)} kept in float{kept}, {len(plan.skipped)} "
            f"skipped (their shape); {report.bytes_before / 2**20:.1f} → {report.bytes_after / 2**20:.1f} MiB."
        )
        if report.errors:
            text += (
                " Error against FP32 on the calibration texts: "
                + ", ".join(f"{k} {v:.1e}" for k, v in report.errors.items())
                + "."
            )
        else:
            text += " No calibration set: the error against FP32 was not measured."
        return text


def export_available() -> tuple[bool, str]:
    try:
        from toolkit.export import export_onnx  # noqa: F401

        return True, ""
    except ImportError as e:
        return False, f"ONNX export is unavailable in this build ({e}); install the edge extra or update ttsq."


class ExportDialog(_JobDialog):
    action = "Export"
    out_folder = "exports"

    def __init__(self, model, device, parent=None):
        super().__init__(model, device, parent)
        self.setWindowTitle("Export to ONNX")
        for name in ("fp32", "fp16", "int8", "int4"):
            self.precision.addItem(name)
        self.precision.setCurrentText("int8")  # the edge runtime's usual pick: a quarter of the size, CPU kernels
        self._refresh_out()
        self.stage.setText(
            f"Stages: {', '.join(self.planned_stages())}. A calibration set switches int8's Decoder "
            "and Vocos to static quantization."
        )
        ok, why = export_available()
        if not ok:
            self.run_button.setEnabled(False)
            self.stage.setText(why)

    def out_suffix(self) -> str:
        return f"onnx-{self.precision.currentText()}"

    def planned_stages(self) -> list[str]:
        calibrated = self.precision.currentText() == "int8" and self.calib.currentData() not in (None, "other")
        return [
            "export gpt",
            "export decoder",
            "export vocos",
            *(["calibrate"] if calibrated else []),
            "quantize",
            "write",
        ]

    def arguments(self) -> dict:
        calib = self.calib.currentData()
        return dict(
            precision=self.precision.currentText(),
            out=self.out.text().strip(),
            calib_set=None if calib == "other" else calib,
            force=self.force.isChecked(),
        )

    def call(self, args, progress, emit):
        from toolkit.export import export_onnx

        return export_onnx(self.model, args.pop("precision"), args.pop("out"), progress=progress, **args)

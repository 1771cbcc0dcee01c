"""The main window: pick a model, device and precisions, synthesize in a worker, listen, compare."""

from __future__ import annotations

from dataclasses import astuple
from pathlib import Path

from PySide6.QtCore import QSettings, Qt, QTimer
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QMessageBox,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from . import workers
from .player import NoOutputDevice, Player
from .widgets import COLORS, QUALITY_AXES, ComparisonTable, LatencyQualityChart, ResultView

SHIPPED = "shipped voice"
CALIB_DIR = Path(__file__).resolve().parents[1] / "calibration_sets"
DEFAULT_TEXT = "Turn left at the second light."


def sample_sentences() -> list[tuple[str, str]]:
    """(label, text) from calibration_sets/*.jsonl, a few per language and length."""
    from toolkit.textsets import load_text_set

    out, seen = [], set()
    for f in sorted(CALIB_DIR.glob("*.jsonl")):
        try:
            records = load_text_set(f)
        except Exception:  # noqa: BLE001 -- a broken set just contributes nothing
            continue
        for r in records:
            if (r.language, r.length) in seen and len(out) > 40 or r.text in {t for _, t in out}:
                continue
            seen.add((r.language, r.length))
            out.append((f"[{r.language}, {r.length}] {r.text[:60]}{'…' if len(r.text) > 60 else ''}", r.text))
    return out


class MainWindow(QMainWindow):
    def __init__(self, settings: QSettings | None = None, model: str | None = None, device: str | None = None):
        super().__init__()
        self.setWindowTitle("ttsq — precision vs latency vs quality")
        self.settings = settings or QSettings("ttsq", "ttsq-gui")
        self.worker: workers.Worker | None = None
        self.job: workers.SynthJob | None = None
        self.results: dict[str, dict] = {}  # row label -> result (workers.synthesize_precisions)
        # FP32 at seed + 1 against FP32 at seed, for this comparison: by group ("" the window's model, else the name
        # of a model added to the comparison, see other_models)
        self.floors: dict[str, dict] = {}
        self.other_models: dict[str, str | None] = {}  # models added to the comparison: group name -> path
        self.key: tuple | None = None
        self.error_box: QMessageBox | None = None
        self.warnings: list[str] = []
        self._closing = False
        self.intelligibility = workers.Intelligibility()  # one ASR for the session, loaded by the first synthesis
        self.player = Player(self)
        self.player.finished.connect(self._playback_ended)
        self._playhead = QTimer(self)
        self._playhead.setInterval(50)
        self._playhead.timeout.connect(self._move_playhead)
        self._build()
        self._load_settings(model, device)
        self._refresh_model()
        self._refresh_precisions()

    # ------------------------------------------------------------------------------------------- layout
    def _build(self) -> None:
        # left: model, device, precisions, speaker and sampling
        self.model_combo = QComboBox()
        self.model_combo.setEditable(True)
        self.model_combo.setInsertPolicy(QComboBox.NoInsert)
        self.model_combo.setToolTip(
            "the shipped voice, a ttsq model folder, a quantized artifact, an official "
            "ChatTTS folder or an exported ONNX folder"
        )
        self.model_combo.currentTextChanged.connect(lambda _: self._refresh_model())
        browse = QPushButton("Browse…")
        browse.clicked.connect(self.browse_model)
        self.model_info = QLabel()
        self.model_info.setWordWrap(True)
        self.device_combo = QComboBox()
        import torch

        for i in range(torch.cuda.device_count()):
            self.device_combo.addItem(f"cuda:{i} — {torch.cuda.get_device_name(i)}", f"cuda:{i}")
        self.device_combo.addItem("cpu", "cpu")
        self.device_combo.currentIndexChanged.connect(lambda _: self._refresh_precisions())
        self.precision_list = QListWidget()
        self.precision_list.setToolTip("check the precisions to compare; greyed ones do not run on this device")
        self.precision_note = QLabel()
        self.precision_note.setWordWrap(True)

        model_box = QGroupBox("Model")
        f = QFormLayout(model_box)
        row = QHBoxLayout()
        row.addWidget(self.model_combo, 1)
        row.addWidget(browse)
        f.addRow(row)
        f.addRow(self.model_info)
        f.addRow("Device", self.device_combo)
        self.others = QListWidget()
        self.others.setMaximumHeight(60)
        self.others.setToolTip(
            "other models in the comparison (a model folder, an artifact or an ONNX export): each runs the "
            "ticked precisions (an artifact or ONNX folder runs as it is, beside its own source's), its rows named "
            "after it and compared with its own FP32 and noise floor"
        )
        add_other = QPushButton("Add model…")
        add_other.setToolTip("add another model to the comparison: its rows join the table, chart and A/B")
        add_other.clicked.connect(lambda: self.add_other())
        self.remove_other_button = QPushButton("Remove")
        self.remove_other_button.setToolTip("take the selected model, and its rows, out of the comparison")
        self.remove_other_button.clicked.connect(lambda: self.remove_other())
        f.addRow(QLabel("Also compare:"))
        f.addRow(self.others)
        row = QHBoxLayout()
        row.addWidget(add_other)
        row.addWidget(self.remove_other_button)
        row.addStretch(1)
        f.addRow(row)
        prec_box = QGroupBox("Precisions")
        v = QVBoxLayout(prec_box)
        v.addWidget(self.precision_list)
        v.addWidget(self.precision_note)

        self.speaker = QComboBox()
        self.speaker.setEditable(True)
        self.speaker.addItems(["", "seed:7", "seed:42", "seed:1337"])
        self.speaker.lineEdit().setPlaceholderText("model default")
        self.speaker.setToolTip(
            "a voice name of the model, seed:N, chattts-seed:N (ChatTTS's random speaker N), a "
            "ChatTTS speaker string, or a .pt/.npy/.txt speaker file (…)"
        )
        self.speaker_file = QPushButton("…")
        self.speaker_file.setToolTip("pick a .pt/.npy/.txt speaker file")
        self.speaker_file.clicked.connect(self.pick_speaker_file)
        self.speaker_audio = QPushButton("from audio…")
        self.speaker_audio.setToolTip(
            "a speaker from a recording of a voice (0.5 to 30 s of WAV) and what it says, as ttsq speaker "
            "from-audio makes it: a fitted speaker vector for a ttsq voice, the sample itself for a ChatTTS model"
        )
        self.speaker_audio.clicked.connect(lambda: self.speaker_from_audio())
        # list entry -> (speaker string, its sample's transcript: a ChatTTS sample-audio speaker's, else None)
        self.audio_speakers: dict[str, tuple[str, str | None]] = {}
        self.speaker_text = QLineEdit()
        self.speaker_text.setPlaceholderText("transcript of a sample-audio speaker")
        self.speaker_text.setToolTip(
            "for a ChatTTS sample-audio speaker (ttsq speaker from-audio): what its sample says"
        )
        self.seed = QSpinBox()
        self.seed.setRange(0, 2**31 - 1)
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.01, 2.0)
        self.temperature.setSingleStep(0.05)
        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(0.01, 1.0)
        self.top_p.setSingleStep(0.05)
        self.top_k = QSpinBox()
        self.top_k.setRange(1, 1000)
        self.max_steps = QSpinBox()
        self.max_steps.setRange(1, 4096)
        self.asr = QCheckBox("Intelligibility (ASR)")
        self.asr.setToolTip(
            "WER (English), CER (Mandarin) or MER (mixed) of what an offline Whisper hears against "
            "the text typed; the first use loads the ASR (about 1 s). Needs the asr extra: "
            "pip install -e '.[asr]'"
        )
        self.noise_floor = QCheckBox("noise floor (FP32 at a second seed)")
        self.noise_floor.setToolTip(
            "FP32 once more at seed + 1, scored against FP32 at the seed: how far apart two "
            "equally good renditions are. A gap to FP32 inside that band is sampling noise, "
            "not the precision"
        )
        self.dnsmos = QCheckBox("DNSMOS (first use loads its models)")
        self.ttfa = QCheckBox("time to first audio (streams once more)")
        self.control_tokens = QCheckBox("read [laugh], [uv_break], ... as controls")
        self.control_tokens.setToolTip("ChatTTS control tokens in the text; unticked, they are read as plain text")
        self.refine = QCheckBox("refine the text first (ChatTTS checkpoints)")
        self.refine.setToolTip(
            "rewrite the text with the GPT's text head before speaking, as ChatTTS's infer() does "
            "by default (adds [uv_break], [laugh], ...); the result tab shows the refined text. "
            "Needs a ChatTTS checkpoint: the shipped voice has no trained text head"
        )
        self.refine_prompt = QLineEdit()
        self.refine_prompt.setPlaceholderText("refine prompt, e.g. [oral_2][laugh_0][break_6]")
        self.refine_prompt.setEnabled(False)
        self.refine.toggled.connect(self.refine_prompt.setEnabled)
        samp_box = QGroupBox("Speaker and sampling")
        f = QFormLayout(samp_box)
        row = QHBoxLayout()
        row.addWidget(self.speaker, 1)
        row.addWidget(self.speaker_file)
        row.addWidget(self.speaker_audio)
        f.addRow("Speaker", row)
        f.addRow("Sample text", self.speaker_text)
        f.addRow("Seed", self.seed)
        f.addRow("Temperature", self.temperature)
        f.addRow("Top-p", self.top_p)
        f.addRow("Top-k", self.top_k)
        f.addRow("Max steps", self.max_steps)
        f.addRow(self.asr)
        f.addRow(self.noise_floor)
        f.addRow(self.dnsmos)
        f.addRow(self.ttfa)
        f.addRow(self.control_tokens)
        f.addRow(self.refine)
        f.addRow(self.refine_prompt)

        left = QWidget()
        lv = QVBoxLayout(left)
        lv.addWidget(model_box)
        lv.addWidget(prec_box, 1)
        lv.addWidget(samp_box)
        scroll = QScrollArea()
        scroll.setWidget(left)
        scroll.setWidgetResizable(True)
        scroll.setMinimumWidth(280)

        # right, top: text and synthesis controls
        self.samples = QComboBox()
        self.samples.addItem("Sample sentences…", None)
        for label, text in sample_sentences():
            self.samples.addItem(label, text)
        self.samples.activated.connect(self._pick_sample)
        self.text = QPlainTextEdit()
        self.text.setPlaceholderText("Type a sentence to synthesize (Ctrl+Enter)")
        self.synth_button = QPushButton("Synthesize")
        self.synth_button.setToolTip("Ctrl+Enter")
        self.synth_button.clicked.connect(self.synthesize)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Esc")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setFormat("%p%")
        self.progress_label = QLabel("ready")
        self.progress_label.setWordWrap(True)
        self.warning_label = QLabel()  # every warning of the last run, kept until the next run
        self.warning_label.setWordWrap(True)
        self.warning_label.setStyleSheet("color: #9a5b00")
        self.warning_label.linkActivated.connect(lambda _: self.show_warnings())
        self.warning_label.hide()
        top = QWidget()
        tv = QVBoxLayout(top)
        tv.setContentsMargins(0, 0, 0, 0)
        tv.addWidget(self.samples)
        tv.addWidget(self.text, 1)
        row = QHBoxLayout()
        row.addWidget(self.synth_button)
        row.addWidget(self.cancel_button)
        row.addWidget(self.progress, 1)
        tv.addLayout(row)
        tv.addWidget(self.progress_label)
        tv.addWidget(self.warning_label)

        # right, middle: one tab per result, and playback
        self.tabs = QTabWidget()
        self.tabs.setMinimumHeight(160)
        self.placeholder = QLabel("Results appear here: a waveform and a mel spectrogram per precision.")
        self.placeholder.setAlignment(Qt.AlignCenter)
        self.tabs.addTab(self.placeholder, "no results")
        self.play_button = QPushButton("Play")
        self.play_button.setToolTip("Space")
        self.play_button.clicked.connect(self.toggle_play)
        self.a_combo, self.b_combo = QComboBox(), QComboBox()
        for combo in (self.a_combo, self.b_combo):  # wide enough for an artifact's folder name (the dialogs'
            combo.setSizeAdjustPolicy(QComboBox.AdjustToContents)  # defaults), yet the row fits 1024 px
            combo.setMinimumContentsLength(8)
            combo.setMaximumWidth(220)
        self.ab_button = QPushButton("A/B: A")
        self.ab_button.setCheckable(True)
        self.ab_button.setToolTip("plays A or B; a click switches between them at the same position (Ctrl+B)")
        self.ab_button.toggled.connect(self.switch_ab)
        self.save_wav_button = QPushButton("Save as WAV…")
        self.save_wav_button.clicked.connect(lambda: self.save_wav())
        self.audio_label = QLabel()
        mid = QWidget()
        mv = QVBoxLayout(mid)
        mv.setContentsMargins(0, 0, 0, 0)
        mv.addWidget(self.tabs, 1)
        row = QHBoxLayout()
        row.addWidget(self.play_button)
        row.addWidget(QLabel("A"))
        row.addWidget(self.a_combo)
        row.addWidget(QLabel("B"))
        row.addWidget(self.b_combo)
        row.addWidget(self.ab_button)
        row.addWidget(self.save_wav_button)
        row.addStretch(1)
        mv.addLayout(row)

        # right, bottom: table and chart
        self.table = ComparisonTable()
        self.table.itemSelectionChanged.connect(self._table_selected)
        self.chart = LatencyQualityChart()
        self.chart.picked.connect(self.table.select)  # a click on a point selects its row (and its tab, A or B)
        self.chart_axis = QComboBox()
        for label, key, _ in QUALITY_AXES:
            self.chart_axis.addItem(label, key)
        self.chart_axis.currentIndexChanged.connect(lambda _: self.chart.set_axis(self.chart_axis.currentData()))
        chart_box = QWidget()
        cv = QVBoxLayout(chart_box)
        cv.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        row.addWidget(QLabel("quality axis:"))
        row.addWidget(self.chart_axis)
        row.addStretch(1)
        cv.addLayout(row)
        cv.addWidget(self.chart, 1)
        self.bottom = QSplitter(Qt.Horizontal)
        self.bottom.addWidget(self.table)
        self.bottom.addWidget(chart_box)
        self.bottom.setStretchFactor(0, 3)
        self.bottom.setStretchFactor(1, 2)
        self.bottom.setSizes([600, 400])

        self.right = QSplitter(Qt.Vertical)
        for w in (top, mid, self.bottom):
            self.right.addWidget(w)
        self.right.setStretchFactor(0, 1)
        self.right.setStretchFactor(1, 3)
        self.right.setStretchFactor(2, 3)
        self.main = QSplitter(Qt.Horizontal)
        self.main.addWidget(scroll)
        self.main.addWidget(self.right)
        self.main.setStretchFactor(1, 1)
        self.main.setSizes([320, 1000])
        self.setCentralWidget(self.main)
        self._menus()
        self.statusBar().addPermanentWidget(self.audio_label)
        self.audio_label.setText(self.player.describe())
        self._update_buttons()

    def _menus(self) -> None:
        def act(menu, text, slot, shortcut=None):
            a = QAction(text, self)
            a.triggered.connect(slot)
            if shortcut:
                a.setShortcut(QKeySequence(shortcut))
            menu.addAction(a)
            return a

        m = self.menuBar().addMenu("&File")
        act(m, "Open model folder…", self.browse_model, "Ctrl+O")
        self.save_wav_action = act(m, "Save as WAV…", lambda: self.save_wav(), "Ctrl+S")
        self.save_report_action = act(m, "Save report…", lambda: self.save_report(), "Ctrl+R")
        m.addSeparator()
        act(m, "Quit", self.close, "Ctrl+Q")
        m = self.menuBar().addMenu("&Run")
        act(m, "Synthesize", self.synthesize)
        act(m, "Cancel", self.cancel)
        act(m, "Play / stop", self.toggle_play)
        act(m, "Clear results", self.clear_results)
        m = self.menuBar().addMenu("&Tools")
        act(m, "Quantize…", self.open_quantize)
        act(m, "Export to ONNX…", self.open_export)
        for keys in ("Ctrl+Return", "Ctrl+Enter"):
            QShortcut(QKeySequence(keys), self, self.synthesize)
        QShortcut(QKeySequence(Qt.Key_Escape), self, self.cancel)
        QShortcut(QKeySequence(Qt.Key_Space), self, self.toggle_play)
        QShortcut(QKeySequence("Ctrl+B"), self, self.ab_button.toggle)

    # ------------------------------------------------------------------------------------------- state
    def model_path(self) -> str | None:
        t = self.model_combo.currentText().strip()
        return None if t in ("", SHIPPED) else t

    def device(self) -> str:
        return self.device_combo.currentData()

    def checked_precisions(self) -> list[str]:
        return [
            self.precision_list.item(i).data(Qt.UserRole)
            for i in range(self.precision_list.count())
            if self.precision_list.item(i).checkState() == Qt.Checked
            and self.precision_list.item(i).flags() & Qt.ItemIsEnabled
        ]

    def set_precisions(self, names: list[str]) -> None:
        for i in range(self.precision_list.count()):
            it = self.precision_list.item(i)
            it.setCheckState(Qt.Checked if it.data(Qt.UserRole) in names else Qt.Unchecked)

    def busy(self) -> bool:
        return self.worker is not None

    def _refresh_model(self) -> None:
        kind, desc = workers.model_kind(self.model_path())
        self.model_combo.setToolTip(self.model_combo.currentText())
        self.model_kind = kind
        self.source_known, self.source = True, self.model_path()  # the model the precisions run on
        note = ""
        if kind in ("artifact", "onnx"):
            self.source_known, self.source, name = workers.source_of(self.model_path())
            if self.source_known:
                desc += f", made from {name}"
                note = (
                    f"The artifact runs as it is, beside these precisions of its source model ({name}): tick "
                    "fp32 to compare it with FP32."
                )
            else:
                note = (
                    f"The artifact runs as it is; {name}, so there is no FP32 to compare it with. Quantize or "
                    "export it again from its model to record it."
                )
        self.model_info.setText(desc)
        self.model_info.setStyleSheet("color: #b00020" if kind in ("missing", "invalid") else "")
        running = (self.job.model, *self.job.artifacts.values()) if self.job is not None else ()
        if self.busy() and self.job is not None and self.model_path() not in running:
            self.statusBar().showMessage(
                f"the running synthesis finishes with {self.job.model or SHIPPED}; "
                "the new model is used from the next run",
                15000,
            )
        self.precision_list.setEnabled(self.source_known)
        self.precision_note.setText(note)
        self._refresh_speakers()

    def _refresh_speakers(self) -> None:
        """The model's own voices first, then a few random speakers by seed."""
        current = self.speaker.currentText()
        voices = workers.model_voices(self.model_path())
        if not voices and self.source_known and self.source != self.model_path():  # an artifact from before ttsq
            voices = workers.model_voices(self.source)  # recorded its voices: its source's
        self.speaker.blockSignals(True)
        self.speaker.clear()
        self.speaker.addItems(["", *voices, *self.audio_speakers, "seed:7", "seed:42", "seed:1337"])
        self.speaker.setCurrentText(current)
        self.speaker.blockSignals(False)

    def _refresh_precisions(self) -> None:
        import torch

        from toolkit.precision.recipes import RECIPES, UnsupportedRecipe, get_recipe

        checked = set(self.checked_precisions()) if self.precision_list.count() else {"fp32"}
        dev = torch.device(self.device() or "cpu")
        self.precision_list.clear()
        for name, recipe in RECIPES.items():
            it = QListWidgetItem(name)
            it.setData(Qt.UserRole, name)
            try:
                get_recipe(name, dev)
                it.setToolTip(recipe.note or name)
                it.setFlags(Qt.ItemIsEnabled | Qt.ItemIsUserCheckable)
            except UnsupportedRecipe as e:
                it.setText(f"{name} — not on {dev.type}")
                it.setToolTip(str(e))
                it.setFlags(Qt.ItemIsUserCheckable)  # shown, greyed
            it.setCheckState(Qt.Checked if name in checked and it.flags() & Qt.ItemIsEnabled else Qt.Unchecked)
            self.precision_list.addItem(it)

    def _fit_bottom(self) -> None:
        """The table gets the width its columns need (no sideways scrolling) and the chart the rest, down to its
        minimum; the chart's points are labelled, so it reads at that size."""
        total = sum(self.bottom.sizes())
        if total <= 0:
            return
        need = self.table.needed_width()
        chart = max(total - need, self.chart.minimumWidth())
        self.bottom.setSizes([total - chart, chart])

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        QTimer.singleShot(0, self._fit_bottom)  # once the splitters have their new sizes

    def _update_buttons(self) -> None:
        busy = self.busy()
        self.synth_button.setEnabled(not busy)
        self.cancel_button.setEnabled(busy)
        have = bool(self.results)
        for w in (self.play_button, self.save_wav_button, self.a_combo, self.b_combo, self.ab_button):
            w.setEnabled(have)
        self.save_wav_action.setEnabled(have)
        self.save_report_action.setEnabled(have and not busy)
        self.remove_other_button.setEnabled(bool(self.other_models) and not busy)
        self.play_button.setText("Stop" if self.player.playing else "Play")

    def _pick_sample(self, index: int) -> None:
        from toolkit.text import USER_CONTROL

        text = self.samples.itemData(index)
        if text:
            self.text.setPlainText(text)
            if USER_CONTROL.search(text):  # the calibration sets write these as controls
                self.control_tokens.setChecked(True)

    def browse_model(self) -> None:
        path = QFileDialog.getExistingDirectory(
            self, "Model folder (ttsq, artifact, ChatTTS or ONNX)", self.model_path() or str(Path.cwd())
        )
        if path:
            self.set_model(path)

    def set_model(self, path: str | None) -> None:
        text = path or SHIPPED
        if self.model_combo.findText(text) < 0:
            self.model_combo.insertItem(1, text)
        self.model_combo.setCurrentText(text)

    # ------------------------------------------------------------------------------------------- synthesis
    def artifact_label(self, path: str | None = None, kind: str | None = None) -> str | None:
        """The row of the artifact or ONNX folder picked (or of `path`, of that kind): its folder name (a precision's
        name gets a suffix)."""
        if path is None:
            path, kind = self.model_path(), self.model_kind
        if kind not in ("artifact", "onnx"):
            return None
        from toolkit.precision.recipes import RECIPES

        name = Path(path).name
        return f"{name} (as is)" if name in RECIPES or name == "noise floor" else name

    def make_job(self) -> workers.SynthJob:
        from toolkit.sampling import SamplingParams

        params = SamplingParams(
            temperature=self.temperature.value(),
            top_p=self.top_p.value(),
            top_k=self.top_k.value(),
            max_new_tokens=self.max_steps.value(),
        )
        from toolkit.speakers import with_transcript

        typed = self.speaker.currentText().strip() or None
        transcript = self.speaker_text.text().strip() or None
        if typed in self.audio_speakers:  # an entry "from audio…" made: its string (and its sample's transcript)
            typed, said = self.audio_speakers[typed]
            transcript = transcript or said
        speaker = with_transcript(typed, transcript)  # a malformed speaker is an "Invalid settings" dialog now
        text = self.text.toPlainText().strip()
        label = self.artifact_label()
        refine, prompt = self.refine.isChecked(), self.refine_prompt.text().strip()
        # one comparison per sentence, settings and source model: an artifact of that model joins it
        base = self.source if self.source_known else self.model_path()
        key = (
            base,
            text,
            typed,
            transcript,
            self.seed.value(),
            astuple(params),
            self.device(),
            self.control_tokens.isChecked(),
            refine,
            prompt if refine else "",
        )
        return workers.SynthJob(
            base,
            self.device(),
            self.checked_precisions() if self.source_known else [],
            text,
            speaker,
            self.seed.value(),
            params,
            self.dnsmos.isChecked(),
            self.asr.isChecked(),
            self.ttfa.isChecked(),
            self.control_tokens.isChecked(),
            refine,
            prompt,
            intelligibility=self.intelligibility,
            key=key,
            artifacts={label: self.model_path()} if label else {},
            noise_floor=self.noise_floor.isChecked(),
        )

    def make_jobs(self) -> list[workers.SynthJob]:
        """make_job, then one job per model added to the comparison (other_models): the same sentence and
        settings; the ticked precisions on that model (an artifact's or ONNX folder's: on its source, beside it run
        as it is), its rows named after it. An artifact that does not name its source has no FP32 of its own: it
        runs alone, marked not comparable."""
        from dataclasses import replace

        main = self.make_job()
        jobs = [main]
        for group, path in self.other_models.items():
            kind, _ = workers.model_kind(path)
            known, source, why = True, path, ""
            if kind in ("artifact", "onnx"):
                known, source, why = workers.source_of(path)
            label = self.artifact_label(path, kind)
            jobs.append(
                replace(
                    main,
                    model=source if known else path,
                    precisions=self.checked_precisions() if known else [],
                    artifacts={label: path} if label else {},
                    group=group,
                    incomparable=""
                    if known
                    else f"not comparable: {why}, so there is no FP32 of its own to compare it with",
                    key=(),
                )
            )
        return jobs

    def add_other(self, path: str | None = None) -> str | None:
        """Adds a model (a folder; SHIPPED: the shipped voice) to the comparison; the next Synthesize runs it.
        -> its group name (its rows' prefix), or None when it is refused (a dialog says why)."""
        if path is None:
            path = QFileDialog.getExistingDirectory(
                self, "Another model to compare (ttsq, artifact, ChatTTS or ONNX folder)", str(Path.cwd())
            )
            if not path:
                return None
        model = None if path == SHIPPED else path
        kind, desc = workers.model_kind(model)
        if kind in ("missing", "invalid"):
            self.show_error("Cannot add this model", desc)
            return None
        same = (Path(model).resolve() if model else None) == (
            Path(self.model_path()).resolve() if self.model_path() else None
        )
        if same or model in self.other_models.values():
            self.show_error("Cannot add this model", f"{path} is in the comparison already")
            return None
        base = Path(model).name if model else SHIPPED
        group, n = base, 2
        while group in self.other_models or group in ("", workers.FP32):
            group, n = f"{base} ({n})", n + 1
        self.other_models[group] = model
        it = QListWidgetItem(f"{group}: {desc}")
        it.setData(Qt.UserRole, group)
        it.setToolTip(model or SHIPPED)
        self.others.addItem(it)
        self.others.setCurrentItem(it)
        self.statusBar().showMessage(f"{group} joins the comparison: Synthesize runs it", 15000)
        self._update_buttons()
        return group

    def remove_other(self, group: str | None = None) -> None:
        """Takes a model added to the comparison (the selected one) out of it, with its rows."""
        if group is None:
            it = self.others.currentItem()
            if it is None:
                return
            group = it.data(Qt.UserRole)
        if group not in self.other_models or self.busy():
            return
        del self.other_models[group]
        for i in range(self.others.count()):
            if self.others.item(i).data(Qt.UserRole) == group:
                self.others.takeItem(i)
                break
        self.floors.pop(group, None)
        self.chart.set_floor(None, None, group)
        for name in [n for n, r in self.results.items() if r.get("group") == group]:
            self._remove_result(name)
        self._update_buttons()

    def _remove_result(self, name: str) -> None:
        if self.player.playing and self.current_name() == name:
            self.player.stop()
        del self.results[name]
        self.table.remove_result(name)
        self.chart.remove_result(name)
        for i in range(self.tabs.count()):
            if self.tabs.tabText(i) == name:
                w = self.tabs.widget(i)
                self.tabs.removeTab(i)
                w.deleteLater()
                break
        if not self.results:
            self.tabs.addTab(self.placeholder, "no results")
        for combo in (self.a_combo, self.b_combo):
            combo.removeItem(combo.findText(name))

    def speaker_from_audio(self, wav: str | None = None, text: str | None = None) -> None:
        """A speaker from a WAV and its transcript (toolkit.sample_speaker.speaker_from_file, as ttsq speaker
        from-audio), made in a worker on the model the precisions run on; it joins the speaker list as
        "from audio: NAME" and is picked."""
        if self.busy():
            return
        if wav is None:
            wav, _ = QFileDialog.getOpenFileName(self, "Speaker sample", str(Path.cwd()), "Audio (*.wav *.flac *.ogg)")
            if not wav:
                return
        if text is None:
            from PySide6.QtWidgets import QInputDialog

            text, ok = QInputDialog.getText(self, "Speaker sample", f"What {Path(wav).name} says:")
            if not ok:
                return
        model = self.source if self.source_known else self.model_path()  # a fit needs the FP32 model
        device = self.device()
        label = f"from audio: {Path(wav).name}"

        def done(made: tuple[str, bool]) -> None:
            line, sample = made
            self.audio_speakers[label] = (line, text.strip() if sample else None)
            self._refresh_speakers()
            self.speaker.setCurrentText(label)
            self.progress.setValue(1000)
            self.progress_label.setText(f"speaker “{label}” added to the speaker list")

        def make(emit, should_stop):
            from toolkit.sample_speaker import speaker_from_file, speaker_string
            from toolkit.speakers import SampleSpeaker

            emit("progress", (0.1, f"{label}: reading the sample"))
            spk = speaker_from_file(
                wav, text, model, device=device, notice=lambda m: emit("progress", (0.3, f"{label}: {m}"))
            )
            return speaker_string(spk), isinstance(spk, SampleSpeaker)

        self.progress.setValue(0)
        self._run(make, "Could not make a speaker from the audio", done)

    def pick_speaker_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Speaker file", str(Path.cwd()), "Speakers (*.pt *.npy *.txt)")
        if path:
            self.speaker.setCurrentText(path)

    def synthesize(self) -> None:
        if self.busy():
            return
        try:
            jobs = self.make_jobs()
        except ValueError as e:
            self.show_error("Invalid settings", str(e))
            return
        job = jobs[0]
        if job.key != self.key:  # another sentence, setting or source model: a new comparison
            self.clear_results()
            self.key = job.key
        # what this comparison already has is kept, not measured again (Clear results measures it all again)
        asked = job.precisions + list(job.artifacts)
        for j in jobs:
            j.precisions = [p for p in j.precisions if workers.row_name(j.group, p) not in self.results]
            j.artifacts = {
                k: v
                for k, v in j.artifacts.items()
                if self.results.get(workers.row_name(j.group, k), {}).get("model") != v
            }
            j.noise_floor = j.noise_floor and j.group not in self.floors
            ref = self.results.get(workers.row_name(j.group, workers.FP32))
            j.reference = ref["utt"] if ref else None
        others = [j for j in jobs[1:] if j.precisions or j.artifacts]  # an added model runs what it lacks
        if asked and not job.precisions and not job.artifacts and not job.noise_floor and not others:
            self.progress_label.setText(
                "nothing new to run: every row ticked has its result for this sentence and "
                "these settings (Run ▸ Clear results measures them again)"
            )
            return
        jobs = ([job] if job.precisions or job.artifacts or job.noise_floor or not others else []) + others
        self.job = job
        self.warnings = []
        self._show_warnings()
        self._save_settings()
        self.progress.setValue(0)
        self.progress_label.setText("starting…")
        self._run(lambda emit, stop: workers.synthesize_groups(jobs, emit, stop), "Synthesis failed")

    def _run(self, fn, error_title: str, on_done=None) -> None:
        self.worker = workers.Worker(fn)
        self.worker.event.connect(self._event)
        self.worker.failed.connect(lambda m: self.show_error(error_title, m))
        self.worker.cancelled.connect(lambda: self.progress_label.setText("cancelled"))
        if on_done:
            self.worker.done.connect(on_done)
        self.worker.finished.connect(self._worker_finished)
        workers.start(self.worker, self)
        self._update_buttons()

    def cancel(self) -> None:
        if self.worker is not None:
            self.worker.cancel()
            self.progress_label.setText("cancelling after the current step…")
        elif self.player.playing:
            self.player.stop()

    def _event(self, kind: str, payload) -> None:
        if kind == "progress":
            frac, label = payload
            self.progress.setValue(int(1000 * frac))
            self.progress_label.setText(label)
        elif kind == "result":
            self.add_result(payload)
        elif kind == "floor":
            self.set_floor(payload)
        elif kind == "warning":
            self.warnings.append(payload)
            self._show_warnings()

    def _worker_finished(self) -> None:
        self.worker.wait()
        self.worker.deleteLater()
        self.worker = None
        if self.progress_label.text() not in ("cancelled",) and not self.progress_label.text().startswith("failed"):
            self.progress_label.setText(
                "done" + (f" ({len(self.warnings)} warning(s): see below the bar)" if self.warnings else "")
            )
        self._update_buttons()
        if self._closing:
            self.close()

    def _show_warnings(self) -> None:
        n = len(self.warnings)
        self.warning_label.setVisible(bool(n))
        if n:
            from html import escape

            self.warning_label.setText(
                f"⚠ {n} warning{'s' if n > 1 else ''}: {escape(self.warnings[-1])}"
                + (" <a href='#'>(all of them)</a>" if n > 1 else "")
            )
            self.warning_label.setToolTip("\n".join(self.warnings))

    def show_warnings(self) -> None:
        if self.warnings:
            self._open_box(
                QMessageBox(
                    QMessageBox.Warning, "Warnings of the last run", "\n\n".join(self.warnings), QMessageBox.Ok, self
                )
            )

    @property
    def floor(self) -> dict | None:
        """The noise floor of the window's model in this comparison."""
        return self.floors.get("")

    def set_floor(self, floor: dict) -> None:
        """A noise floor of this comparison: the window's model's is a band on the chart; each model's floor gives
        its own rows' verdicts in the table."""
        group = floor.get("group", "")
        self.floors[group] = floor
        self.chart.set_floor(floor, self.results.get(workers.row_name(group, workers.FP32)), group)
        self._refresh_verdicts()

    def _refresh_verdicts(self) -> None:
        from . import report

        for name, res in self.results.items():
            group = res.get("group", "")
            floor = self.floors.get(group)
            if not res.get("comparable", True):
                self.table.set_verdict(name, None, None, note=res.get("mcd_note", ""))
                continue
            ref = self.results.get(workers.row_name(group, workers.FP32))
            verdict = report.verdict(res, ref, floor) if floor else None
            self.table.set_verdict(name, verdict, floor, reference=report.is_reference(res))

    def add_result(self, res: dict) -> None:
        new = res["name"] not in self.results
        self.results[res["name"]] = res
        self.table.set_result(res)
        self.chart.set_result(res)
        self._refresh_verdicts()
        self._fit_bottom()
        if self.tabs.widget(0) is self.placeholder:
            self.tabs.removeTab(0)
        names = list(self.results)
        color = COLORS[names.index(res["name"]) % len(COLORS)]
        idx = next((i for i in range(self.tabs.count()) if self.tabs.tabText(i) == res["name"]), -1)
        view = ResultView(res, color)
        if idx >= 0:
            self.tabs.removeTab(idx)
            self.tabs.insertTab(idx, view, res["name"])
        else:
            idx = self.tabs.addTab(view, res["name"])
        self.tabs.setCurrentIndex(idx)
        if new:
            for combo in (self.a_combo, self.b_combo):
                combo.addItem(res["name"])
            if len(names) >= 2 and self.b_combo.currentText() == self.a_combo.currentText():
                self.b_combo.setCurrentText(res["name"])
        self._update_buttons()

    def clear_results(self) -> None:
        self.player.stop()
        self.results.clear()
        self.floors.clear()
        self.key = None
        self.table.clear_results()
        self.chart.clear_results()
        while self.tabs.count():
            w = self.tabs.widget(0)
            self.tabs.removeTab(0)
            if w is not self.placeholder:
                w.deleteLater()
        self.tabs.addTab(self.placeholder, "no results")
        self.a_combo.clear()
        self.b_combo.clear()
        self._update_buttons()

    # ------------------------------------------------------------------------------------------- playback
    def current_name(self) -> str | None:
        combo = self.b_combo if self.ab_button.isChecked() else self.a_combo
        return combo.currentText() or None

    def _table_selected(self) -> None:
        rows = self.table.selectionModel().selectedRows()
        if rows:
            name = self.table.item(rows[0].row(), 0).text()
            (self.b_combo if self.ab_button.isChecked() else self.a_combo).setCurrentText(name)
            self._show_tab(name)

    def _show_tab(self, name: str) -> None:
        for i in range(self.tabs.count()):
            if self.tabs.tabText(i) == name:
                self.tabs.setCurrentIndex(i)

    def toggle_play(self) -> None:
        if self.player.playing:
            self.player.stop()
        else:
            self.play()

    def play(self, offset_s: float = 0.0) -> bool:
        name = self.current_name()
        if name is None or name not in self.results:
            return False
        res = self.results[name]
        self._show_tab(name)
        try:
            self.player.play(res["wav"], res["sample_rate"], offset_s)
        except NoOutputDevice as e:
            self.no_output_device(str(e))
            return False
        except Exception as e:  # noqa: BLE001 -- a device error is a dialog, not a crash
            self.show_error("Playback failed", f"{type(e).__name__}: {e}")
            return False
        self._playhead.start()
        self.audio_label.setText(self.player.describe())
        self._update_buttons()
        return True

    def switch_ab(self, b: bool) -> None:
        self.ab_button.setText("A/B: B" if b else "A/B: A")
        if self.player.playing:
            self.play(self.player.position())  # the other precision at the same position
        elif self.current_name():
            self._show_tab(self.current_name())

    def _move_playhead(self) -> None:
        view = self.tabs.currentWidget()
        if isinstance(view, ResultView):
            view.waveform.playhead = self.player.position() if self.player.playing else None
            view.waveform.update()

    def _playback_ended(self) -> None:
        self._playhead.stop()
        self._move_playhead()
        self._update_buttons()

    def no_output_device(self, message: str) -> None:
        box = QMessageBox(QMessageBox.Information, "No audio output", message, QMessageBox.Close, self)
        save = box.addButton("Save as WAV…", QMessageBox.AcceptRole)
        save.clicked.connect(lambda: self.save_wav())
        self._open_box(box)

    def save_wav(self, path: str | None = None) -> Path | None:
        name = self.current_name()
        if name is None:
            return None
        res = self.results[name]
        if path is None:
            path, _ = QFileDialog.getSaveFileName(
                self, "Save as WAV", str(Path.cwd() / f"ttsq-{name}.wav"), "WAV files (*.wav)"
            )
            if not path:
                return None
        from toolkit.audio import write_wav

        try:
            out = write_wav(path, res["wav"], res["sample_rate"], force=True)  # the dialog asked about overwriting
        except (OSError, ValueError) as e:
            self.show_error("Could not save the WAV file", str(e))
            return None
        self.statusBar().showMessage(f"saved {out}", 10000)
        return out

    # ------------------------------------------------------------------------------------------- report, dialogs
    def save_report(self, folder: str | None = None) -> None:
        if not self.results or self.busy():
            return
        if folder is None:
            folder = QFileDialog.getExistingDirectory(self, "Folder for report.json, report.md, report.html")
            if not folder:
                return
        from dataclasses import replace

        from . import report

        results = list(self.results.values())
        ref = self.results.get(workers.FP32)
        job = replace(self.job, model=ref["model"] if ref else self.job.model)  # the noise floor is FP32's model's
        floor = self.floor
        floors = {g: f for g, f in self.floors.items() if g}

        def done(path):
            self.progress.setValue(1000)
            self.progress_label.setText(f"report saved to {path}")
            self.statusBar().showMessage(f"report saved to {path}", 15000)

        self._run(
            lambda emit, stop: report.save_report(job, results, folder, emit, stop, floor, floors),
            "Could not save the report",
            done,
        )

    def open_quantize(self) -> None:
        from .dialogs import QuantizeDialog

        self._dialog = QuantizeDialog(self.model_path(), self.device(), self)
        self._dialog.produced.connect(self._offer_model)
        self._dialog.open()

    def open_export(self) -> None:
        from .dialogs import ExportDialog

        self._dialog = ExportDialog(self.model_path(), self.device(), self)
        self._dialog.produced.connect(self._offer_model)
        self._dialog.open()

    def _offer_model(self, path: str) -> None:
        if self.model_combo.findText(path) < 0:
            self.model_combo.addItem(path)
        self.statusBar().showMessage(f"wrote {path}: pick it in the model list to try it", 15000)

    # ------------------------------------------------------------------------------------------- errors, settings
    def _open_box(self, box: QMessageBox) -> None:
        if self.error_box is not None:
            self.error_box.close()
        self.error_box = box
        box.setWindowModality(Qt.WindowModal)
        box.open()  # non-blocking: the window keeps running

    def show_error(self, title: str, message: str) -> None:
        from .messages import for_gui

        message = for_gui(message)  # the controls' names, not the command line's flags
        self.progress_label.setText(f"failed: {message[:120]}")
        self._open_box(QMessageBox(QMessageBox.Critical, title, message, QMessageBox.Ok, self))

    def _load_settings(self, model, device) -> None:
        s = self.settings
        self.model_combo.addItem(SHIPPED)
        for p in s.value("recent_models", [], list) or []:
            if p and self.model_combo.findText(p) < 0:
                self.model_combo.addItem(p)
        self.set_model(model if model is not None else (s.value("model", "") or None))
        dev = device or s.value("device", "")
        i = self.device_combo.findData(dev)
        self.device_combo.setCurrentIndex(i if i >= 0 else 0)
        self._refresh_precisions()
        self.set_precisions(s.value("precisions", ["fp32", "int8"], list) or ["fp32"])
        self.text.setPlainText(s.value("text", DEFAULT_TEXT))
        import json

        try:
            made = json.loads(s.value("audio_speakers", "{}") or "{}")
            self.audio_speakers = {k: (v[0], v[1]) for k, v in made.items()}
        except (ValueError, TypeError, IndexError, AttributeError):  # a damaged setting: no such speakers
            self.audio_speakers = {}
        self._refresh_speakers()
        self.speaker.setCurrentText(s.value("speaker", ""))
        self.seed.setValue(int(s.value("seed", 0)))
        self.temperature.setValue(float(s.value("temperature", 0.3)))
        self.top_p.setValue(float(s.value("top_p", 0.7)))
        self.top_k.setValue(int(s.value("top_k", 20)))
        self.max_steps.setValue(int(s.value("max_steps", 2048)))
        self.dnsmos.setChecked(s.value("dnsmos", "true") in (True, "true"))
        self.asr.setChecked(s.value("asr", "true") in (True, "true"))
        self.noise_floor.setChecked(s.value("noise_floor", "true") in (True, "true"))
        i = self.chart_axis.findData(s.value("chart_axis", QUALITY_AXES[0][1]))
        self.chart_axis.setCurrentIndex(max(i, 0))
        self.ttfa.setChecked(s.value("ttfa", "true") in (True, "true"))
        self.control_tokens.setChecked(s.value("control_tokens", "false") in (True, "true"))
        self.refine.setChecked(s.value("refine", "false") in (True, "true"))
        self.refine_prompt.setText(s.value("refine_prompt", ""))
        if s.value("geometry") is not None:
            self.restoreGeometry(s.value("geometry"))
        else:
            self.resize(1280, 860)
        for name, sp in (("split_main", self.main), ("split_right", self.right), ("split_bottom", self.bottom)):
            if s.value(name) is not None:
                sp.restoreState(s.value(name))

    def _save_settings(self) -> None:
        s = self.settings
        s.setValue("model", self.model_path() or "")
        s.setValue(
            "recent_models",
            [
                self.model_combo.itemText(i)
                for i in range(self.model_combo.count())
                if self.model_combo.itemText(i) != SHIPPED
            ][:10],
        )
        s.setValue("device", self.device())
        s.setValue("precisions", self.checked_precisions())
        s.setValue("text", self.text.toPlainText())
        s.setValue("speaker", self.speaker.currentText())
        s.setValue("audio_speakers", __import__("json").dumps(self.audio_speakers))
        for name in ("seed", "temperature", "top_p", "top_k", "max_steps"):
            s.setValue(name, getattr(self, name).value())
        s.setValue("dnsmos", self.dnsmos.isChecked())
        s.setValue("asr", self.asr.isChecked())
        s.setValue("noise_floor", self.noise_floor.isChecked())
        s.setValue("chart_axis", self.chart_axis.currentData())
        s.setValue("ttfa", self.ttfa.isChecked())
        s.setValue("control_tokens", self.control_tokens.isChecked())
        s.setValue("refine", self.refine.isChecked())
        s.setValue("refine_prompt", self.refine_prompt.text())
        s.setValue("geometry", self.saveGeometry())
        s.setValue("split_main", self.main.saveState())
        s.setValue("split_right", self.right.saveState())
        s.setValue("split_bottom", self.bottom.saveState())
        s.sync()

    def closeEvent(self, event) -> None:
        self.player.stop()
        if self.busy():  # finish (cancelled) in the background, then close: never kill a thread mid-call
            self._closing = True
            self.worker.cancel()
            self.hide()
            event.ignore()
            return
        self._save_settings()
        super().closeEvent(event)

    def wait_for_workers(self) -> None:
        if self.worker is not None:
            self.worker.cancel()
            self.worker.wait()

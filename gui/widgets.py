"""Views of results: waveform, log-mel spectrogram, the comparison table and the latency-vs-quality chart."""

from __future__ import annotations

import numpy as np
from PySide6.QtCharts import QChart, QChartView, QScatterSeries, QValueAxis
from PySide6.QtCore import QMargins, QPointF, Qt, Signal
from PySide6.QtGui import QColor, QImage, QPainter, QPen
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QLabel,
    QSizePolicy,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


def _magma_lut() -> np.ndarray:
    stops = np.array(
        [[0, 0, 4], [59, 15, 112], [140, 41, 129], [222, 73, 104], [254, 159, 109], [252, 253, 191]], dtype=np.float64
    )
    x = np.linspace(0, 1, len(stops))
    t = np.linspace(0, 1, 256)
    return np.stack([np.interp(t, x, stops[:, c]) for c in range(3)], 1).astype(np.uint8)


_LUT = _magma_lut()


class WaveformView(QWidget):
    """Min/max envelope per pixel column, with a playhead."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.wav = np.zeros(0, dtype=np.float32)
        self.sr = 24000
        self.playhead: float | None = None
        self.color = QColor(COLORS[0])
        self.setMinimumHeight(60)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Expanding)

    def set_audio(self, wav: np.ndarray, sr: int, color: str | None = None) -> None:
        self.wav, self.sr = np.asarray(wav, dtype=np.float32), sr
        if color:
            self.color = QColor(color)
        self.update()

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        p.fillRect(self.rect(), QColor("#fafafa"))
        w, h = self.width(), self.height()
        mid = h / 2
        p.setPen(QPen(QColor("#cccccc")))
        p.drawLine(0, int(mid), w, int(mid))
        if self.wav.size and w > 1:
            cols = np.array_split(self.wav, min(w, self.wav.size))
            scale = (h / 2 - 2) / max(float(np.abs(self.wav).max()), 1e-6)
            p.setPen(QPen(self.color))
            for x, c in enumerate(cols):
                p.drawLine(x, int(mid - c.max() * scale), x, int(mid - c.min() * scale))
        else:
            p.setPen(QPen(QColor("#888888")))
            p.drawText(self.rect(), Qt.AlignCenter, "no audio yet")
        if self.playhead is not None and self.wav.size:
            x = int(self.playhead * self.sr / self.wav.size * w)
            p.setPen(QPen(QColor("#d62728"), 2))
            p.drawLine(x, 0, x, h)
        p.end()


class MelView(QWidget):
    """Log-mel spectrogram (the Vocos front-end features of evaluation.metrics), low frequencies at the bottom."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.image: QImage | None = None
        self.setMinimumHeight(60)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Expanding)

    def set_audio(self, wav: np.ndarray, sr: int) -> None:
        from evaluation.metrics import _log_mel, resample

        x = np.asarray(wav, dtype=np.float64)
        if x.size < 1024:
            self.image = None
        else:
            mel = _log_mel(resample(x, sr, 24000) if sr != 24000 else x).T[::-1]  # (mels, frames)
            lo, hi = np.percentile(mel, 2), mel.max()
            idx = np.clip((mel - lo) / max(hi - lo, 1e-6) * 255, 0, 255).astype(np.uint8)
            rgb = np.ascontiguousarray(_LUT[idx])
            self._rgb = rgb  # QImage does not own the buffer
            self.image = QImage(rgb.data, rgb.shape[1], rgb.shape[0], rgb.shape[1] * 3, QImage.Format_RGB888)
        self.update()

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        if self.image is not None:
            p.setRenderHint(QPainter.SmoothPixmapTransform)
            p.drawImage(self.rect(), self.image)
        else:
            p.fillRect(self.rect(), QColor("#fafafa"))
            p.setPen(QPen(QColor("#888888")))
            p.drawText(self.rect(), Qt.AlignCenter, "no spectrogram yet")
        p.end()


class ResultView(QWidget):
    """One result: a caption, its waveform and its mel spectrogram."""

    def __init__(self, res: dict, color: str, parent=None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        cap = (
            f"{res['name']}: {res['duration_s']:.2f} s of audio, {res['steps']} GPT steps, "
            f"synthesized in {res['latency_s']:.2f} s on {res['device']}"
            + ("  (hit max steps: audio may be cut)" if res["hit_limit"] else "")
        )
        self.caption = QLabel(cap)
        self.caption.setWordWrap(True)
        self.refined = QLabel(f"refined: {res['refined']}" if res.get("refined") else "")
        self.refined.setWordWrap(True)
        self.refined.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.refined.setToolTip("the text as the GPT's text head rewrote it (refine), which the audio says")
        self.refined.setVisible(bool(res.get("refined")))
        self.waveform = WaveformView()
        self.waveform.set_audio(res["wav"], res["sample_rate"], color)
        self.mel = MelView()
        self.mel.set_audio(res["wav"], res["sample_rate"])
        lay.addWidget(self.caption)
        lay.addWidget(self.refined)
        lay.addWidget(self.waveform, 1)
        lay.addWidget(self.mel, 2)


def _fmt(v, spec: str, scale: float = 1.0) -> str:
    return "–" if v is None else format(v * scale, spec)


UNITS = {"en": "words", "zh": "characters", "mixed": "tokens (Han characters and Latin words)"}


def asr_tip(res: dict) -> str:
    """The intelligibility cell's tooltip: what the ASR heard and the edit counts, or why there is no value."""
    a = res.get("asr")
    if not a:
        return res.get("asr_note", "")
    from evaluation.asr import METRIC_NAME

    heard = f"the ASR heard: \u201c{a['heard']}\u201d" if a["heard"] else "the ASR heard nothing"
    return (
        f"{METRIC_NAME[a['language']].upper()} {res['asr_rate']:.2f} against the text typed\n{heard}\n"
        f"{a['sub']} sub, {a['dele']} del, {a['ins']} ins of {a['ref_tokens']} {UNITS[a['language']]}"
    )


#: (column, header, what it is): short two-line headers, so that the table fits beside the chart at 1024 px without
#: sideways scrolling; the audio's duration and steps are in the precision cell's tooltip and the result's caption
COLUMNS = [
    ("precision", "precision", "the precision of the model, or the artifact or ONNX folder run as it is"),
    (
        "vs floor",
        "vs\nfloor",
        "the gap to FP32 against the noise floor (FP32 against itself at a second "
        "seed): “within” when it is no larger than sampling's own spread",
    ),
    (
        "WER/CER",
        "WER/\nCER",
        "intelligibility: word (English) or character (Mandarin) error rate of what an "
        "offline ASR hears against the text; lower is better",
    ),
    ("MCD dB", "MCD\ndB", "mel-cepstral distance to FP32's audio of the same sentence and seed (DTW-aligned)"),
    ("DNSMOS", "DNS\nMOS", "predicted overall quality (1-5)"),
    ("RTF", "RTF", "real-time factor: synthesis time / audio duration (lower is faster)"),
    ("latency s", "latency\ns", "synthesis time of the whole text"),
    ("1st audio s", "1st\naudio s", "time to first audio when streaming"),
    ("MiB", "size\nMiB", "size of the weights (the folder, for an artifact or ONNX)"),
    ("GPU MiB", "GPU\nMiB", "peak GPU memory"),
]


class ComparisonTable(QTableWidget):
    COLUMNS = [c for c, _, _ in COLUMNS]
    OPTIONAL = ("DNSMOS", "GPU MiB", "vs floor")  # hidden while no row has a value

    def __init__(self, parent=None):
        super().__init__(0, len(self.COLUMNS), parent)
        self.setHorizontalHeaderLabels([h for _, h, _ in COLUMNS])
        for c, (_, _, tip) in enumerate(COLUMNS):
            self.horizontalHeaderItem(c).setToolTip(tip)
        self.verticalHeader().setVisible(False)
        self.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.setSelectionMode(QAbstractItemView.SingleSelection)
        self.setWordWrap(False)
        self.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.horizontalHeader().setStretchLastSection(False)
        self.horizontalHeader().setMinimumSectionSize(30)
        self._hide_empty()

    def needed_width(self) -> int:
        """Pixels to show every visible column without a horizontal scroll bar."""
        h = self.horizontalHeader()
        cols = sum(h.sectionSize(c) for c in range(self.columnCount()) if not self.isColumnHidden(c))
        return cols + 2 * self.frameWidth() + self.verticalScrollBar().sizeHint().width() + 2

    def row_of(self, name: str) -> int:
        return next((r for r in range(self.rowCount()) if self.item(r, 0).text() == name), -1)

    def select(self, name: str) -> None:
        r = self.row_of(name)
        if r >= 0:
            self.selectRow(r)

    def set_result(self, res: dict) -> None:
        """Adds a row, or replaces the row of the same precision."""
        row = self.row_of(res["name"])
        if row < 0:
            row = self.rowCount()
            self.insertRow(row)
        mib = 1 / 2**20
        values = {
            "precision": res["name"],
            "vs floor": "–",
            "WER/CER": _fmt(res.get("asr_rate"), ".2f"),
            "MCD dB": _fmt(res["mcd_db"], ".2f"),
            "DNSMOS": _fmt(res["dnsmos_ovrl"], ".2f"),
            "RTF": _fmt(res["rtf"], ".3g"),
            "latency s": _fmt(res["latency_s"], ".3g"),
            "1st audio s": _fmt(res["time_to_first_audio_s"], ".2f"),
            "MiB": _fmt(res["size_bytes"], ".1f", mib),
            "GPU MiB": _fmt(res["peak_gpu_bytes"], ".0f", mib),
        }
        tips = {
            "precision": f"{res.get('recipe', '')} from {res.get('model') or 'shipped voice'}: "
            f"{res['duration_s']:.2f} s of audio, {res['steps']} GPT steps"
            + (" (hit the step limit: the audio may be cut)" if res["hit_limit"] else ""),
            "WER/CER": asr_tip(res),
            "MCD dB": res.get("mcd_note", ""),
            "DNSMOS": res.get("dnsmos_note", ""),
        }
        for c, name in enumerate(self.COLUMNS):
            item = QTableWidgetItem(values[name])
            if c:
                item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
            if tips.get(name):
                item.setToolTip(tips[name])
            self.setItem(row, c, item)
        self._hide_empty()

    def set_verdict(
        self, name: str, verdict: dict | None, floor: dict | None, reference: bool = False, note: str = ""
    ) -> None:
        """The "vs floor" cell of a row: gui.report.verdict's outcome, or – without a noise floor. reference: the
        row is its model's FP32; note: why the row has no FP32 of its own model to compare with (then "n/c")."""
        row = self.row_of(name)
        if row < 0:
            return
        text, tip, color = "–", "no noise floor: tick “noise floor” and synthesize", None
        if note:
            text, tip, color = "n/c", note, "#7f7f7f"
        elif verdict is not None:
            gap = verdict.get("gap_vs_noise_floor_db")
            wer = verdict.get("asr_gap_vs_fp32")
            if reference:
                text, tip = "reference", ""
            elif gap is None and wer is None:
                text, tip = "–", "no FP32 MCD or WER to compare with"
            elif verdict["within_noise_floor"]:
                text, color = "within", "#1b7a2f"
                tip = "as far from FP32 as FP32 at another seed is: the difference is sampling noise"
            else:
                text, color = "outside", "#b00020"
                tip = "farther from FP32 than FP32 at another seed is"
            if gap is not None:
                tip += f"\nMCD gap over the floor: {gap['mean']:+.2f} dB"
            if wer is not None:
                tip += f"\nWER/CER gap to FP32: {wer['mean']:+.2f}"
        if floor is not None and floor.get("mcd_db") is not None:
            tip += (
                f"\nnoise floor: FP32 at seed {floor['seed']} against FP32 at seed {floor['seed'] - 1}: "
                f"MCD {floor['mcd_db']:.2f} dB"
                + (f", WER/CER {floor['asr_rate']:.2f}" if floor.get("asr_rate") is not None else "")
            )
        item = QTableWidgetItem(text)
        item.setTextAlignment(Qt.AlignCenter)
        item.setToolTip(tip.strip())
        if color:
            item.setForeground(QColor(color))
        self.setItem(row, self.COLUMNS.index("vs floor"), item)
        self._hide_empty()

    def _hide_empty(self) -> None:
        for name in self.OPTIONAL:
            c = self.COLUMNS.index(name)
            self.setColumnHidden(
                c,
                not any(self.item(r, c) is not None and self.item(r, c).text() != "–" for r in range(self.rowCount())),
            )

    def remove_result(self, name: str) -> None:
        row = self.row_of(name)
        if row >= 0:
            self.removeRow(row)
        self._hide_empty()

    def clear_results(self) -> None:
        self.setRowCount(0)
        self._hide_empty()


#: the chart's quality axes: (combo label, result key, axis title)
QUALITY_AXES = [
    ("WER/CER", "asr_rate", "WER/CER (lower = better)"),
    ("MCD vs FP32", "mcd_db", "MCD vs FP32 dB"),
    ("DNSMOS", "dnsmos_ovrl", "DNSMOS (higher = better)"),
]
FLOOR_NAME = "noise floor"  # the band's legend; what it is, is in the chart's tooltip


class LatencyQualityChart(QChartView):
    """One scatter series per precision, labelled: x = real-time factor (lower is faster), y = the chosen quality
    metric (`set_axis`: WER/CER by default, MCD vs FP32 or DNSMOS). A result without that metric is not plotted.
    The noise floor (`set_floor`) is a band: the values FP32 itself takes at two seeds, one per model compared (the
    window's grey, an added model's tinted and named after it). Clicking a point emits `picked(name)`."""

    picked = Signal(str)

    def __init__(self, parent=None):
        chart = QChart()
        chart.legend().setAlignment(Qt.AlignBottom)
        chart.setMargins(QMargins(4, 4, 4, 4))
        self.ax_x, self.ax_y = QValueAxis(), QValueAxis()
        self.ax_x.setTitleText("RTF (lower = faster)")
        self.ax_x.setLabelFormat("%.3g")
        self.ax_y.setLabelFormat("%.2g")
        chart.addAxis(self.ax_x, Qt.AlignBottom)
        chart.addAxis(self.ax_y, Qt.AlignLeft)
        super().__init__(chart, parent)
        self.setRenderHint(QPainter.Antialiasing)
        self.setMinimumSize(220, 200)
        self.setToolTip(
            "each precision at its real-time factor and quality; the grey band is the noise floor: the "
            "values FP32 itself takes at two seeds (a tinted one, an added model's own). Click a point to pick "
            "its row"
        )
        self.series: dict[str, QScatterSeries] = {}
        self.points: dict[str, tuple[float, float]] = {}
        self.results: dict[str, dict] = {}  # kept so that another axis can be plotted without a new run
        # noise floors by group ("": the window's model; else a model added to the comparison): (floor, its FP32 row)
        self.floors: dict[str, tuple[dict, dict | None]] = {}
        self.bands: dict[str, tuple[float, float]] = {}  # each floor on the current axis (lo, hi)
        self.band_series_of: dict[str, object] = {}
        self.axis = ""
        self.set_axis(QUALITY_AXES[0][1])

    def set_axis(self, key: str) -> None:
        """key: a result key of QUALITY_AXES (asr_rate, mcd_db, dnsmos_ovrl)."""
        self.axis = key
        self.ax_y.setTitleText(next(t for _, k, t in QUALITY_AXES if k == key))
        self._plot()

    def set_result(self, res: dict) -> None:
        self.results[res["name"]] = res
        self._plot()

    def set_floor(self, floor: dict | None, ref: dict | None, group: str = "") -> None:
        """The noise floor of a group's FP32 (`ref`, its row); None removes it."""
        if floor is None:
            self.floors.pop(group, None)
        else:
            self.floors[group] = (floor, ref)
        self._plot()

    @property
    def band(self) -> tuple[float, float] | None:
        """The window's model's floor on the current axis."""
        return self.bands.get("")

    @property
    def band_series(self):
        return self.band_series_of.get("")

    def _series(self, name: str) -> QScatterSeries:
        s = self.series.get(name)
        if s is None:  # one colour per precision, in the order they came, whatever the axis
            s = QScatterSeries()
            s.setName(name)
            s.setMarkerSize(12)
            s.setColor(QColor(COLORS[list(self.results).index(name) % len(COLORS)]))
            s.setPointLabelsFormat(name.replace("@", "(at)"))  # "@" starts a placeholder in Qt's format
            s.setPointLabelsVisible(True)
            s.setPointLabelsClipping(False)
            s.clicked.connect(lambda _pt, name=name: self.picked.emit(name))
            self.chart().addSeries(s)
            for marker in self.chart().legend().markers(s):  # the point's own label names it: the legend keeps
                marker.setVisible(False)  # the band alone
            s.attachAxis(self.ax_x)
            s.attachAxis(self.ax_y)
            self.series[name] = s
        return s

    def floor_band(self, group: str = "") -> tuple[float, float] | None:
        """(lo, hi) of a group's noise floor on the current axis: MCD from 0 (FP32 against itself) to FP32's MCD at
        the second seed; WER/CER and DNSMOS between FP32's values at the two seeds."""
        f, ref = self.floors.get(group, (None, None))
        if f is None:
            return None
        if self.axis == "mcd_db":
            return (0.0, f["mcd_db"]) if f.get("mcd_db") is not None else None
        a, b = (ref or {}).get(self.axis), f.get(self.axis)
        return (min(a, b), max(a, b)) if a is not None and b is not None else None

    def _plot(self) -> None:
        from PySide6.QtCharts import QAreaSeries, QLineSeries

        self.points = {n: (r["rtf"], r[self.axis]) for n, r in self.results.items() if r.get(self.axis) is not None}
        for name, s in self.series.items():
            s.clear()
            s.setVisible(name in self.points)
        for band in self.band_series_of.values():
            self.chart().removeSeries(band)
        self.band_series_of.clear()
        self.bands = {g: b for g in self.floors if (b := self.floor_band(g)) is not None}
        xmax = max((p[0] for p in self.points.values()), default=1.0) * 1.15 or 1
        for k, (group, (lo, hi)) in enumerate(self.bands.items()):
            pad = max(hi - lo, 1e-3) * 0.02 if hi - lo < 1e-3 else 0.0  # equal values: a visible hairline
            upper, lower = QLineSeries(), QLineSeries()
            for x in (0.0, xmax * 10):  # wider than any range the axis takes
                upper.append(x, hi + pad)
                lower.append(x, lo - pad)
            band = QAreaSeries(upper, lower)
            upper.setParent(band)
            lower.setParent(band)
            band.setName(f"{FLOOR_NAME} ({group})" if group else FLOOR_NAME)
            tint = QColor(120, 120, 120) if not group else QColor(COLORS[(k + 4) % len(COLORS)])
            band.setColor(QColor(tint.red(), tint.green(), tint.blue(), 50))
            band.setBorderColor(QColor(tint.red(), tint.green(), tint.blue(), 120))
            self.chart().addSeries(band)
            band.attachAxis(self.ax_x)
            band.attachAxis(self.ax_y)
            self.band_series_of[group] = band
        for name, (x, y) in self.points.items():
            s = self._series(name)
            s.append(QPointF(x, y))
            s.setVisible(True)
        if self.points or self.bands:
            ys = [p[1] for p in self.points.values()] + [v for b in self.bands.values() for v in b]
            self.ax_x.setRange(0, xmax)
            self.ax_y.setRange(0, max(ys) * 1.15 or 1)
            self.ax_x.applyNiceNumbers()
            self.ax_y.applyNiceNumbers()

    def remove_result(self, name: str) -> None:
        self.results.pop(name, None)
        s = self.series.pop(name, None)
        if s is not None:
            self.chart().removeSeries(s)
        self._plot()

    def clear_results(self) -> None:
        for s in self.series.values():
            self.chart().removeSeries(s)
        for band in self.band_series_of.values():
            self.chart().removeSeries(band)
        self.band_series_of.clear()
        self.bands.clear()
        self.series.clear()
        self.points.clear()
        self.results.clear()
        self.floors.clear()

"""Views of results: waveform, log-mel spectrogram, the comparison table and the latency-vs-quality chart."""
from __future__ import annotations

import numpy as np
from PySide6.QtCharts import QChart, QChartView, QScatterSeries, QValueAxis
from PySide6.QtCore import QPointF, Qt, Signal
from PySide6.QtGui import QColor, QImage, QPainter, QPen
from PySide6.QtWidgets import (QAbstractItemView, QHeaderView, QLabel, QSizePolicy, QTableWidget, QTableWidgetItem,
                               QVBoxLayout, QWidget)

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf"]


def _magma_lut() -> np.ndarray:
    stops = np.array([[0, 0, 4], [59, 15, 112], [140, 41, 129], [222, 73, 104], [254, 159, 109], [252, 253, 191]],
                     dtype=np.float64)
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
        cap = (f"{res['name']}: {res['duration_s']:.2f} s of audio, {res['steps']} GPT steps, "
               f"synthesized in {res['latency_s']:.2f} s on {res['device']}"
               + ("  (hit max steps: audio may be cut)" if res["hit_limit"] else ""))
        self.caption = QLabel(cap)
        self.caption.setWordWrap(True)
        self.waveform = WaveformView()
        self.waveform.set_audio(res["wav"], res["sample_rate"], color)
        self.mel = MelView()
        self.mel.set_audio(res["wav"], res["sample_rate"])
        lay.addWidget(self.caption)
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
    return (f"{METRIC_NAME[a['language']].upper()} {res['asr_rate']:.2f} against the text typed\n{heard}\n"
            f"{a['sub']} sub, {a['dele']} del, {a['ins']} ins of {a['ref_tokens']} {UNITS[a['language']]}")


class ComparisonTable(QTableWidget):
    # intelligibility first among the quality columns: fluent babble passes MCD and DNSMOS, not the ASR
    COLUMNS = ["precision", "first audio s", "latency s", "RTF", "WER/CER", "MCD vs FP32 dB", "DNSMOS", "size MiB",
               "GPU MiB", "audio s", "steps"]

    def __init__(self, parent=None):
        super().__init__(0, len(self.COLUMNS), parent)
        self.setHorizontalHeaderLabels(self.COLUMNS)
        self.verticalHeader().setVisible(False)
        self.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.setSelectionMode(QAbstractItemView.SingleSelection)
        self.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.horizontalHeader().setStretchLastSection(False)

    def set_result(self, res: dict) -> None:
        """Adds a row, or replaces the row of the same precision."""
        row = next((r for r in range(self.rowCount()) if self.item(r, 0).text() == res["name"]), self.rowCount())
        if row == self.rowCount():
            self.insertRow(row)
        mib = 1 / 2 ** 20
        cells = [res["name"], _fmt(res["time_to_first_audio_s"], ".3f"), _fmt(res["latency_s"], ".3f"),
                 _fmt(res["rtf"], ".3f"), _fmt(res.get("asr_rate"), ".2f"), _fmt(res["mcd_db"], ".2f"),
                 _fmt(res["dnsmos_ovrl"], ".2f"), _fmt(res["size_bytes"], ".1f", mib),
                 _fmt(res["peak_gpu_bytes"], ".0f", mib), _fmt(res["duration_s"], ".2f"), str(res["steps"])]
        col = self.COLUMNS.index
        tips = {col("WER/CER"): asr_tip(res), col("MCD vs FP32 dB"): res.get("mcd_note", ""),
                col("DNSMOS"): res.get("dnsmos_note", "")}
        for c, text in enumerate(cells):
            item = QTableWidgetItem(text)
            if c:
                item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
            if tips.get(c):
                item.setToolTip(tips[c])
            self.setItem(row, c, item)

    def clear_results(self) -> None:
        self.setRowCount(0)


#: the chart's quality axes: (combo label, result key, axis title)
QUALITY_AXES = [("WER/CER", "asr_rate", "WER/CER (lower = better)"), ("MCD vs FP32", "mcd_db", "MCD vs FP32, dB"),
                ("DNSMOS", "dnsmos_ovrl", "DNSMOS OVRL (higher = better)")]


class LatencyQualityChart(QChartView):
    """One scatter series per precision: x = real-time factor (lower is faster), y = the chosen quality metric
    (`set_axis`: WER/CER by default, MCD vs FP32 or DNSMOS). A result without that metric is not plotted."""
    hovered = Signal(str)

    def __init__(self, parent=None):
        chart = QChart()
        chart.setTitle("Latency vs quality")
        chart.legend().setAlignment(Qt.AlignBottom)
        self.ax_x, self.ax_y = QValueAxis(), QValueAxis()
        self.ax_x.setTitleText("RTF (lower = faster)")
        self.ax_x.setLabelFormat("%.3g")
        self.ax_y.setLabelFormat("%.2g")
        chart.addAxis(self.ax_x, Qt.AlignBottom)
        chart.addAxis(self.ax_y, Qt.AlignLeft)
        super().__init__(chart, parent)
        self.setRenderHint(QPainter.Antialiasing)
        self.setMinimumSize(260, 200)
        self.series: dict[str, QScatterSeries] = {}
        self.points: dict[str, tuple[float, float]] = {}
        self.results: dict[str, dict] = {}  # kept so that another axis can be plotted without a new run
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

    def _series(self, name: str) -> QScatterSeries:
        s = self.series.get(name)
        if s is None:  # one colour per precision, in the order they came, whatever the axis
            s = QScatterSeries()
            s.setName(name)
            s.setMarkerSize(12)
            s.setColor(QColor(COLORS[list(self.results).index(name) % len(COLORS)]))
            self.chart().addSeries(s)
            s.attachAxis(self.ax_x)
            s.attachAxis(self.ax_y)
            self.series[name] = s
        return s

    def _plot(self) -> None:
        self.points = {n: (r["rtf"], r[self.axis]) for n, r in self.results.items() if r.get(self.axis) is not None}
        for name, s in self.series.items():
            s.clear()
            s.setVisible(name in self.points)
        for name, (x, y) in self.points.items():
            s = self._series(name)
            s.append(QPointF(x, y))
            s.setVisible(True)
        if self.points:
            self.ax_x.setRange(0, max(p[0] for p in self.points.values()) * 1.15 or 1)
            self.ax_y.setRange(0, max(p[1] for p in self.points.values()) * 1.15 or 1)
            self.ax_x.applyNiceNumbers()
            self.ax_y.applyNiceNumbers()

    def clear_results(self) -> None:
        for s in self.series.values():
            self.chart().removeSeries(s)
        self.series.clear()
        self.points.clear()
        self.results.clear()

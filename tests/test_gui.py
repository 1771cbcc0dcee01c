"""GUI tests (pytest-qt, offscreen) on the tiny random model: synthesize two precisions, table and chart, playback
through a null audio device, cancel, close during synthesis, error dialogs, dialogs; screenshots under Xvfb."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
if "ALSA_CONFIG_PATH" not in os.environ:  # a null ALSA output so that sounddevice can "play" without a sound card
    _alsa = Path(tempfile.mkdtemp()) / "asound.conf"
    _alsa.write_text("</usr/share/alsa/alsa.conf>\npcm.!default { type null }\nctl.!default { type hw card 0 }\n")
    os.environ["ALSA_CONFIG_PATH"] = str(_alsa)

pytest.importorskip("PySide6.QtCharts")
pytest.importorskip("pytestqt")

from PySide6.QtCore import QSettings, Qt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WAIT = 600_000  # ms: a bound for a hung run, not a timing (the first run loads the ASR; at a load average of 19 on
# this 2-core machine it took over 180 s)


@pytest.fixture
def win(qtbot, tiny_dir, tmp_path):
    from gui.window import MainWindow

    settings = QSettings(str(tmp_path / "gui.ini"), QSettings.IniFormat)
    w = MainWindow(settings, model=str(tiny_dir), device="cpu")
    qtbot.addWidget(w)
    w.text.setPlainText("hello world.")
    w.max_steps.setValue(12)
    w.dnsmos.setChecked(False)
    w.asr.setChecked(False)  # the ASR takes 1-2 s an utterance here: on only where a test looks at it
    w.noise_floor.setChecked(False)  # one more FP32 run: on only where a test looks at it
    w.set_precisions(["fp32"])
    w.show()
    yield w
    w.wait_for_workers()


def _wait_idle(qtbot, w):
    qtbot.waitUntil(lambda: not w.busy(), timeout=WAIT)


def _cell(win, row: int, column: str):
    return win.table.item(row, win.table.COLUMNS.index(column))


def test_synthesize_two_precisions_table_chart_playback(qtbot, win, tmp_path):
    win.set_precisions(["fp32", "int8"])
    win.asr.setChecked(True)
    assert win.checked_precisions() == ["fp32", "int8"]
    assert (
        not win.precision_list.item(
            list(__import__("toolkit.precision.recipes", fromlist=["RECIPES"]).RECIPES).index("fp8")
        ).flags()
        & Qt.ItemIsEnabled
    )  # fp8 is greyed on the CPU
    qtbot.keyClick(win.text, Qt.Key_Return, Qt.ControlModifier)  # Ctrl+Enter synthesizes
    assert win.busy()
    _wait_idle(qtbot, win)
    assert win.error_box is None, win.error_box.text()
    assert win.table.rowCount() == 2
    assert [win.table.item(r, 0).text() for r in range(2)] == ["fp32", "int8"]
    assert _cell(win, 0, "MCD dB").text() == "0.00" and _cell(win, 1, "MCD dB").text() != "–"
    # intelligibility: a number (the tiny model speaks noise, so any value), and what the ASR heard in the tooltip
    assert win.table.COLUMNS.index("WER/CER") < win.table.COLUMNS.index("MCD dB")
    for row, name in enumerate(["fp32", "int8"]):
        r = win.results[name]
        assert float(_cell(win, row, "WER/CER").text()) == pytest.approx(r["asr_rate"], abs=0.005)
        tip = _cell(win, row, "WER/CER").toolTip()
        heard = r["asr"]["heard"]
        assert (f"the ASR heard: \u201c{heard}\u201d" if heard else "the ASR heard nothing") in tip, tip
        assert f"{r['asr']['sub']} sub, {r['asr']['dele']} del, {r['asr']['ins']} ins of 2 words" in tip, tip
        assert r["asr"]["language"] == "en" and r["asr"]["ref_tokens"] == 2  # "hello world."
    # the chart plots the chosen quality axis against RTF: WER/CER by default, then MCD, then DNSMOS (off: none)
    assert set(win.chart.points) == {"fp32", "int8"}
    assert sum(s.count() for s in win.chart.series.values()) == 2
    ys = {n: win.chart.series[n].at(0).y() for n in win.chart.series}
    assert ys == pytest.approx({n: win.results[n]["asr_rate"] for n in ys})
    win.chart_axis.setCurrentText("MCD vs FP32")
    assert {n: win.chart.series[n].at(0).y() for n in win.chart.series} == pytest.approx(
        {n: win.results[n]["mcd_db"] for n in ys}
    )
    assert "MCD" in win.chart.ax_y.titleText()
    win.chart_axis.setCurrentText("DNSMOS")
    assert not win.chart.points and not any(s.count() for s in win.chart.series.values())
    win.chart_axis.setCurrentText("WER/CER")
    assert {n: win.chart.series[n].at(0).y() for n in win.chart.series} == pytest.approx(ys)
    assert win.tabs.count() == 2 and win.progress.value() == 1000
    r = win.results["int8"]
    assert r["wav"].size > 0 and r["time_to_first_audio_s"] > 0 and r["size_bytes"] > 0
    # playback through the null device, A/B toggle, stop
    assert win.player.backend() is not None, "no audio backend even with the null ALSA device"
    win.a_combo.setCurrentText("fp32")
    win.b_combo.setCurrentText("int8")
    assert win.play()
    assert win.player.playing
    win.ab_button.toggle()
    assert win.current_name() == "int8" and win.player.playing
    qtbot.waitUntil(lambda: not win.player.playing, timeout=10_000)  # ends by itself
    # save WAV and a report in the evaluation schema
    old = os.umask(0o022)
    try:
        assert win.save_wav(str(tmp_path / "x.wav")).is_file()
    finally:
        os.umask(old)
    assert (tmp_path / "x.wav").stat().st_mode & 0o777 == 0o644  # the umask's mode, not mkstemp's 0600
    win.save_report(str(tmp_path / "report"))
    _wait_idle(qtbot, win)
    assert win.error_box is None, win.error_box.text()
    import json

    rep = json.loads((tmp_path / "report" / "report.json").read_text())
    assert rep["schema"] == "ttsq-eval/1" and set(rep["precisions"]) == {"fp32", "int8"}
    assert rep["noise_floor"]["dtw_mcd_db"] is not None
    for name in ("fp32", "int8"):  # the ASR rows in the shape of ttsq evaluate's per_sentence rows
        row = rep["precisions"][name]["per_sentence"]["gui-001"]["asr"]
        assert row == [win.results[name]["asr"]] and set(row[0]) == {
            "heard",
            "ref_tokens",
            "sub",
            "dele",
            "ins",
            "language",
        }
        assert rep["precisions"][name]["end_to_end"]["intelligibility"]["wer"]["n"] == 1
    assert rep["asr"]["model"] == "whisper-base" and "asr_gap_vs_fp32" in rep["precisions"]["int8"]
    assert "WER en" in (tmp_path / "report" / "report.md").read_text()
    assert "What the ASR heard" in (tmp_path / "report" / "report.html").read_text()


@pytest.fixture(scope="session")
def tiny_artifact(tiny_dir, tmp_path_factory) -> Path:
    """An int8 artifact of the tiny model (round to nearest: fast), which records tiny_dir as its source."""
    from toolkit.quantize_job import quantize_to_artifact

    return quantize_to_artifact(str(tiny_dir), "int8", tmp_path_factory.mktemp("art") / "tiny-q8")[0]


def test_artifact_is_compared_with_its_source_fp32(qtbot, win, tiny_dir, tiny_artifact, tmp_path):
    """Issue 40, item 4: picking an artifact keeps the FP32 results and the precision list; the artifact runs beside
    its source model's FP32, and a relaunch reopens it ready to compare."""
    win.noise_floor.setChecked(False)
    win.synthesize()
    _wait_idle(qtbot, win)
    fp32 = win.results["fp32"]
    win.set_model(str(tiny_artifact))
    assert win.model_kind == "artifact" and win.source == str(tiny_dir)
    assert win.precision_list.isEnabled() and win.checked_precisions() == ["fp32"]
    assert "fp32" in win.results and win.table.rowCount() == 1  # nothing cleared
    win.synthesize()
    _wait_idle(qtbot, win)
    assert win.error_box is None, win.error_box.text()
    assert list(win.results) == ["fp32", "tiny-q8"] and win.results["fp32"] is fp32  # FP32 kept, not run again
    art = win.results["tiny-q8"]
    assert art["model"] == str(tiny_artifact) and art["recipe"] == "int8"
    assert art["mcd_db"] is not None and art["mcd_db"] > 0 and _cell(win, 1, "MCD dB").text() != "–"
    win.chart_axis.setCurrentText("MCD vs FP32")
    assert set(win.chart.points) == {"fp32", "tiny-q8"}
    win.synthesize()  # nothing new to run
    assert not win.busy() and "nothing new" in win.progress_label.text()
    win.close()
    w2 = __import__("gui.window", fromlist=["MainWindow"]).MainWindow(
        QSettings(str(tmp_path / "gui.ini"), QSettings.IniFormat)
    )
    qtbot.addWidget(w2)
    assert w2.model_path() == str(tiny_artifact) and w2.precision_list.isEnabled()
    assert w2.checked_precisions() == ["fp32"] and w2.make_job().model == str(tiny_dir)
    assert w2.make_job().artifacts == {"tiny-q8": str(tiny_artifact)}


def test_another_model_joins_the_comparison_and_leaves(qtbot, win, tiny_dir, tiny_artifact, tmp_path):
    """Issue 40, item 4: an unrelated model added to the comparison runs beside the first; its rows are named after
    it, compared with its own FP32 and noise floor, plotted, and offered to the A/B boxes; an artifact that names no
    source is marked not comparable; removing a model takes its rows away and leaves the others."""
    import json

    from conftest import make_tiny_model

    from evaluation import metrics
    from toolkit.checkpoint import save_ttsq

    other = save_ttsq(make_tiny_model(tmp_path / "src", seed=1), tmp_path / "other-model")  # other weights
    win.set_precisions(["fp32", "int8"])
    win.noise_floor.setChecked(True)
    assert win.add_other(str(other)) == "other-model"
    assert win.add_other(str(other)) is None and "already" in win.error_box.text()  # once only
    win.error_box = None
    win.synthesize()
    _wait_idle(qtbot, win)
    assert win.error_box is None, win.error_box.text()
    rows = ["fp32", "int8", "other-model · fp32", "other-model · int8"]
    assert list(win.results) == rows
    assert [win.table.item(r, 0).text() for r in range(win.table.rowCount())] == rows
    assert win.results["other-model · int8"]["model"] == str(other)
    assert str(other) in _cell(win, 3, "precision").toolTip()
    # each model against its own FP32: the added model's int8 MCD is to its own FP32's audio
    mine, theirs = win.results["other-model · fp32"], win.results["other-model · int8"]
    assert _cell(win, 2, "MCD dB").text() == "0.00"
    assert theirs["mcd_db"] == pytest.approx(metrics.mcd(mine["wav"], theirs["wav"], mine["sample_rate"]).value_db)
    # and its own noise floor: FP32 of that model at the second seed
    mine_floor = win.floors["other-model"]["mcd_db"]
    assert set(win.floors) == {"", "other-model"} and mine_floor > 0
    assert win.floors["other-model"]["mcd_db"] != win.floor["mcd_db"]
    assert _cell(win, 2, "vs floor").text() == "reference"
    within = theirs["mcd_db"] <= win.floors["other-model"]["mcd_db"]  # the ASR is off here
    assert _cell(win, 3, "vs floor").text() == ("within" if within else "outside")
    assert f"MCD {win.floors['other-model']['mcd_db']:.2f} dB" in _cell(win, 3, "vs floor").toolTip()
    win.chart_axis.setCurrentText("MCD vs FP32")
    assert set(win.chart.points) == set(rows)
    bands = win.chart.bands  # each model's floor a band of its own
    assert set(bands) == {"", "other-model"}
    assert bands[""] == pytest.approx((0.0, win.floor["mcd_db"]))
    assert bands["other-model"] == pytest.approx((0.0, mine_floor))
    assert win.chart.band_series_of["other-model"].name() == "noise floor (other-model)"
    assert win.chart.series["other-model · int8"].pointLabelsFormat() == "other-model · int8"
    # the saved report names each row's own model folder, not the first model's for all
    win.save_report(str(tmp_path / "report"))
    _wait_idle(qtbot, win)
    assert win.error_box is None, win.error_box.text()
    rep = json.loads((tmp_path / "report" / "report.json").read_text())
    assert rep["model"] == str(tiny_dir)
    assert {n: r["model"] for n, r in rep["precisions"].items()} == {
        "fp32": str(tiny_dir),
        "int8": str(tiny_dir),
        "other-model · fp32": str(other),
        "other-model · int8": str(other),
    }
    gap = rep["precisions"]["other-model · int8"]["gap_vs_noise_floor_db"]["mean"]  # its own floor
    assert gap == pytest.approx(theirs["mcd_db"] - mine_floor)
    md = (tmp_path / "report" / "report.md").read_text()
    assert f"Models: fp32, int8: {tiny_dir}; other-model · fp32, other-model · int8: {other}." in md
    # A/B picks clips of either model
    for combo in (win.a_combo, win.b_combo):
        assert [combo.itemText(i) for i in range(combo.count())] == rows
    win.a_combo.setCurrentText("int8")
    win.b_combo.setCurrentText("other-model · int8")
    win.ab_button.setChecked(True)
    assert win.current_name() == "other-model · int8"
    assert win.tabs.tabText(win.tabs.currentIndex()) == "other-model · int8"
    win.ab_button.setChecked(False)
    # an artifact that names no source model: it runs as it is, its row marked not comparable
    orphan = tmp_path / "orphan-q8"
    shutil.copytree(tiny_artifact, orphan)
    manifest = json.loads((orphan / "manifest.json").read_text())
    del manifest["source"]
    (orphan / "manifest.json").write_text(json.dumps(manifest))
    assert win.add_other(str(orphan)) == "orphan-q8"
    fp32 = win.results["fp32"]
    win.synthesize()
    _wait_idle(qtbot, win)
    assert win.error_box is None, win.error_box.text()
    assert list(win.results) == rows + ["orphan-q8 · orphan-q8"] and win.results["fp32"] is fp32  # only it ran
    r = win.table.row_of("orphan-q8 · orphan-q8")
    assert _cell(win, r, "vs floor").text() == "n/c" and "not comparable" in _cell(win, r, "vs floor").toolTip()
    assert _cell(win, r, "MCD dB").text() == "–" and "not comparable" in _cell(win, r, "MCD dB").toolTip()
    # removing a model takes its rows, points, tabs, A/B entries and floor away, and nothing else
    win.b_combo.setCurrentText("other-model · int8")
    win.remove_other("other-model")
    left = ["fp32", "int8", "orphan-q8 · orphan-q8"]
    assert list(win.results) == left and set(win.floors) == {""}
    assert [win.table.item(r, 0).text() for r in range(win.table.rowCount())] == left
    assert set(win.chart.points) == {"fp32", "int8"} and "other-model · int8" not in win.chart.series
    assert set(win.chart.bands) == {""}
    assert [win.tabs.tabText(i) for i in range(win.tabs.count())] == left
    assert [win.b_combo.itemText(i) for i in range(win.b_combo.count())] == left
    assert [win.others.item(i).text().split(":")[0] for i in range(win.others.count())] == ["orphan-q8"]
    win.others.setCurrentRow(0)
    win.remove_other()  # the selected one
    assert list(win.results) == ["fp32", "int8"] and win.others.count() == 0
    assert not win.remove_other_button.isEnabled()


def test_noise_floor_band_verdict_labels_and_click(qtbot, win):
    """Issue 40, item 5: FP32 at a second seed gives the noise floor, a band on the chart and the table's verdict;
    points carry their names, and clicking one selects its row."""
    win.set_precisions(["fp32", "int8"])
    win.noise_floor.setChecked(True)
    win.synthesize()
    _wait_idle(qtbot, win)
    assert win.error_box is None, win.error_box.text()
    floor = win.floor
    assert floor is not None and floor["seed"] == 1 and floor["mcd_db"] > 0
    win.chart_axis.setCurrentText("MCD vs FP32")
    assert win.chart.band == pytest.approx((0.0, floor["mcd_db"])) and win.chart.band_series.isVisible()
    assert win.chart.ax_y.max() >= floor["mcd_db"]
    int8 = win.results["int8"]
    verdict = _cell(win, 1, "vs floor").text()
    assert verdict == ("within" if int8["mcd_db"] <= floor["mcd_db"] else "outside")  # the ASR is off here
    assert f"MCD {floor['mcd_db']:.2f} dB" in _cell(win, 1, "vs floor").toolTip()
    assert _cell(win, 0, "vs floor").text() == "reference"
    assert not win.table.isColumnHidden(win.table.COLUMNS.index("vs floor"))
    s = win.chart.series["int8"]
    assert s.pointLabelsVisible() and s.pointLabelsFormat() == "int8"
    s.clicked.emit(s.at(0))
    assert [i.row() for i in win.table.selectionModel().selectedRows()] == [1]
    assert win.a_combo.currentText() == "int8"
    # the report takes the floor measured here instead of measuring it again
    from gui import report

    calls = []
    real = report.measure_noise_floor
    report.measure_noise_floor = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        win.save_report(str(Path(__import__("tempfile").mkdtemp()) / "r"))
        _wait_idle(qtbot, win)
    finally:
        report.measure_noise_floor = real
    assert win.error_box is None and not calls


def test_warnings_are_the_users_and_stay(qtbot, win):
    """Issue 40, item 6: the warm-up's 8 steps warn about nothing; each run's warning names its run and all of them
    stay on screen until the next run."""
    win.set_precisions(["fp32", "int8"])
    win.noise_floor.setChecked(False)
    win.max_steps.setValue(12)
    win.synthesize()
    _wait_idle(qtbot, win)
    cut = [n for n, r in win.results.items() if r["hit_limit"]]
    assert sorted(w.split(":")[0] for w in win.warnings) == sorted(cut)  # one per run that hit the limit
    assert all("max_new_tokens" in w for w in win.warnings)
    if cut:
        assert win.warning_label.isVisible() and f"{len(cut)} warning" in win.warning_label.text()
        assert all(w in win.warning_label.toolTip() for w in win.warnings)
        win.show_warnings()
        assert all(w in win.error_box.text() for w in win.warnings)


def test_model_voices_in_the_speaker_list(qtbot, win):
    """Issue 40, item 7: the model's named voices are offered, not only seeds."""
    items = [win.speaker.itemText(i) for i in range(win.speaker.count())]
    assert "alice" in items and "seed:42" in items
    win.set_model(None)
    items = [win.speaker.itemText(i) for i in range(win.speaker.count())]
    assert {"m1", "f2", "m3", "m7"} <= set(items) and not {"f4", "f5"} & set(items)  # f4, f5 withdrawn


def test_fits_1024_pixels(qtbot, win, tiny_artifact, tmp_path):
    """Issue 40, item 7: the window fits a 1024 px screen; with results, the table shows every column without
    sideways scrolling (the precision column never scrolls away) and the A/B boxes show whole names."""
    art = tmp_path / "shipped-voice-int4-g32"  # as long a name as the dialog's defaults give
    shutil.copytree(tiny_artifact, art)
    win.set_model(str(art))
    win.set_precisions(["fp32", "int8"])
    win.synthesize()
    _wait_idle(qtbot, win)
    assert win.error_box is None, win.error_box.text()
    assert win.minimumSizeHint().width() <= 1024
    win.table.set_result({**win.results["fp32"], "dnsmos_ovrl": 2.13})  # every column of the defaults shown
    win.resize(1024, 700)
    qtbot.waitUntil(lambda: win.width() == 1024, timeout=5000)
    qtbot.wait(200)
    assert win.table.horizontalScrollBar().maximum() == 0
    fm = win.a_combo.fontMetrics()
    for combo in (win.a_combo, win.b_combo):
        widest = max(fm.horizontalAdvance(combo.itemText(i)) for i in range(combo.count()))
        assert combo.width() > widest, (combo.width(), widest)


def test_progress_moves_within_a_sentence(qtbot, win):
    """Issue 40, item 7: one sentence no longer holds the bar still until it ends: every chunk of GPT steps moves
    it, and the label counts the steps."""
    win.max_steps.setValue(96)
    seen = []
    real = win._event
    win._event = lambda kind, payload: (seen.append(payload) if kind == "progress" else None, real(kind, payload))
    win.synthesize()
    _wait_idle(qtbot, win)
    assert win.error_box is None, win.error_box.text()
    within = [(f, label) for f, label in seen if "fp32: sentence 1/1, " in label]
    assert len({label for _, label in within}) >= 3, seen  # 96 steps: several chunks of 16
    assert [f for f, _ in within] == sorted(f for f, _ in within) and within[-1][0] > within[0][0]


def test_without_the_asr_extra(qtbot, win, tmp_path, monkeypatch):
    """No asr extra: the WER/CER cell shows "–" with a tooltip naming the extra, and the run and its report go on."""
    from evaluation import asr

    def missing(*_a, **_k):
        raise asr.ASRUnavailable(asr.MISSING_EXTRA)

    monkeypatch.setattr(asr, "Transcriber", missing)
    win.asr.setChecked(True)
    win.synthesize()
    _wait_idle(qtbot, win)
    assert win.error_box is None, win.error_box.text()
    cell = _cell(win, 0, "WER/CER")
    assert cell.text() == "–" and "pip install -e '.[asr]'" in cell.toolTip()
    assert not win.chart.points  # nothing to plot on the WER/CER axis
    win.save_report(str(tmp_path / "report"))
    _wait_idle(qtbot, win)
    assert win.error_box is None, win.error_box.text()
    assert "Intelligibility not scored" in (tmp_path / "report" / "report.md").read_text()


def test_no_output_device_offers_save(qtbot, win, monkeypatch):
    win.set_precisions(["fp32"])
    win.synthesize()
    _wait_idle(qtbot, win)
    monkeypatch.setattr(win.player, "backend", lambda: None)
    assert not win.play()
    assert win.error_box is not None and win.error_box.isVisible()
    assert "No audio output" in win.error_box.text()
    assert any(b.text() == "Save as WAV…" for b in win.error_box.buttons())


def test_qt_multimedia_fallback(qtbot, monkeypatch):
    """Without PortAudio, playback goes through QtMultimedia (a pulseaudio null sink in .ci/test)."""
    import numpy as np

    from gui import player

    monkeypatch.setattr(player, "_sounddevice", lambda: None)
    p = player.Player()
    if p.backend() is None:
        pytest.skip("QtMultimedia lists no audio output (no sound server)")
    assert p.backend() == "qt"
    with qtbot.waitSignal(p.finished, timeout=5000):
        p.play(np.zeros(2400, dtype=np.float32), 24000)


def test_cancel_long_run(qtbot, win):
    win.text.setPlainText("hello world. " * 12)
    win.max_steps.setValue(2048)
    win.set_precisions(["fp32", "int8"])
    win.synthesize()
    qtbot.waitUntil(
        lambda: "synthesizing" in win.progress_label.text() or "sentence" in win.progress_label.text(), timeout=WAIT
    )
    qtbot.keyClick(win, Qt.Key_Escape)  # Esc cancels
    _wait_idle(qtbot, win)
    assert win.progress_label.text() == "cancelled"
    assert win.error_box is None and not win.results


def test_close_during_synthesis(qtbot, win):
    win.text.setPlainText("hello world. " * 12)
    win.max_steps.setValue(2048)
    win.synthesize()
    qtbot.waitUntil(
        lambda: "synthesizing" in win.progress_label.text() or "sentence" in win.progress_label.text(), timeout=WAIT
    )
    win.close()
    assert not win.isVisible()
    _wait_idle(qtbot, win)  # the worker stops at its next step; the window then closes for real


def test_switching_model_during_synthesis(qtbot, win, tiny_dir, tmp_path):
    other = tmp_path / "other-model"
    shutil.copytree(tiny_dir, other)
    win.text.setPlainText("hello world. " * 6)
    win.max_steps.setValue(64)
    win.set_precisions(["fp32", "int8"])
    win.synthesize()
    qtbot.waitUntil(
        lambda: "synthesizing" in win.progress_label.text() or "sentence" in win.progress_label.text(), timeout=WAIT
    )
    win.set_model(str(other))  # mid-run: the running job keeps its model, the next run takes the new one
    assert "next run" in win.statusBar().currentMessage()
    _wait_idle(qtbot, win)
    assert win.error_box is None, win.error_box.text()
    assert set(win.results) == {"fp32", "int8"}
    assert {r["model"] for r in win.results.values()} == {str(tiny_dir)}
    win.text.setPlainText("hello world.")
    win.max_steps.setValue(12)
    win.synthesize()
    _wait_idle(qtbot, win)
    assert win.error_box is None, win.error_box.text()
    assert {r["model"] for r in win.results.values()} == {str(other)}  # a new comparison, not a mix of models


def test_control_tokens_follow_the_checkbox(qtbot, win, tmp_path, monkeypatch):
    from toolkit.synthesizer import Synthesizer
    from toolkit.text import USER_CONTROL

    seen = []  # control_tokens of every synthesis call: the runs, warm-ups and the report's noise floor
    real = Synthesizer.synthesize
    monkeypatch.setattr(
        Synthesizer, "synthesize", lambda self, *a, **k: seen.append(k.get("control_tokens")) or real(self, *a, **k)
    )
    assert not win.control_tokens.isChecked() and not win.make_job().control_tokens  # text, unless asked
    index = next(i for i in range(1, win.samples.count()) if USER_CONTROL.search(win.samples.itemData(i)))
    win._pick_sample(index)  # a calibration sentence that writes [laugh]/[uv_break] as controls
    assert win.control_tokens.isChecked() and win.make_job().control_tokens
    win.synthesize()
    _wait_idle(qtbot, win)
    assert win.error_box is None, win.error_box.text()
    assert "fp32" in win.results
    win.save_report(str(tmp_path / "report"))
    _wait_idle(qtbot, win)
    assert win.error_box is None, win.error_box.text()
    assert len(seen) >= 3 and all(seen), seen


def test_speaker_field_takes_strings_and_files(qtbot, win, tmp_path):
    import numpy as np

    from toolkit.speakers import encode_vector

    vec = np.random.default_rng(0).standard_normal(64).astype(np.float16)
    win.speaker.setCurrentText(encode_vector(vec))  # a ChatTTS speaker string
    win.synthesize()
    _wait_idle(qtbot, win)
    assert win.error_box is None, win.error_box.text()
    assert "fp32" in win.results
    np.save(tmp_path / "short.npy", vec[:10])  # a file, but a vector made for another model
    win.speaker.setCurrentText(str(tmp_path / "short.npy"))
    win.synthesize()
    _wait_idle(qtbot, win)
    assert win.error_box is not None and "another model" in win.error_box.text()
    win.error_box = None
    win.speaker.setCurrentText(encode_vector(vec))
    win.speaker_text.setText("hello")  # a transcript only goes with a sample-audio speaker
    win.synthesize()
    assert win.error_box is not None and "sample-audio speaker" in win.error_box.text()


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
def test_speaker_from_audio_joins_the_list_and_speaks(qtbot, win, tmp_path):
    """Issue 40: "from audio…" makes a speaker from a WAV and its transcript (the library call behind ttsq speaker
    from-audio): on the shipped voice a fitted vector, which joins the speaker list, is picked, synthesizes, and is
    there again after a relaunch."""
    import numpy as np

    from toolkit.speakers import parse_speaker

    said = "Good morning, the train leaves at nine."
    wav = tmp_path / "sample.wav"
    subprocess.run(["espeak-ng", "-w", str(wav), said], check=True, capture_output=True)
    win.set_model(None)  # the shipped voice
    win.speaker_from_audio(str(wav), said)
    _wait_idle(qtbot, win)
    assert win.error_box is None, win.error_box.text()
    items = [win.speaker.itemText(i) for i in range(win.speaker.count())]
    assert "from audio: sample.wav" in items and "m1" in items
    assert win.speaker.currentText() == "from audio: sample.wav"
    job = win.make_job()
    vec = parse_speaker(job.speaker)
    assert isinstance(vec, np.ndarray) and vec.shape == (256,) and np.isfinite(vec).all()
    win.synthesize()
    _wait_idle(qtbot, win)
    assert win.error_box is None, win.error_box.text()
    assert win.results["fp32"]["wav"].size > 0 and win.job.speaker == job.speaker
    win.close()
    w2 = __import__("gui.window", fromlist=["MainWindow"]).MainWindow(
        QSettings(str(tmp_path / "gui.ini"), QSettings.IniFormat)
    )
    qtbot.addWidget(w2)
    assert w2.speaker.currentText() == "from audio: sample.wav" and w2.make_job().speaker == job.speaker


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
def test_speaker_from_audio_on_a_chattts_model_is_its_sample(qtbot, win, tmp_path):
    """On a ChatTTS checkpoint "from audio…" gives a sample-audio speaker: the list entry carries the sample's
    transcript into the synthesis, as --speaker-text does."""
    from toolkit.speakers import SampleSpeaker

    said = "Good morning, the train leaves at nine."
    wav = tmp_path / "sample.wav"
    subprocess.run(["espeak-ng", "-w", str(wav), said], check=True, capture_output=True)
    win.set_model(str(ROOT / "tests" / "fixtures" / "chattts_tiny"))
    assert win.model_kind == "chattts"
    win.speaker_from_audio(str(wav), said)
    _wait_idle(qtbot, win)
    assert win.error_box is None, win.error_box.text()
    assert win.speaker.currentText() == "from audio: sample.wav"
    job = win.make_job()
    assert isinstance(job.speaker, SampleSpeaker) and job.speaker.text == said and job.speaker.codes.shape[1] > 0
    win.synthesize()
    _wait_idle(qtbot, win)
    assert win.error_box is None, win.error_box.text()
    assert win.results["fp32"]["wav"].size > 0


def test_bad_model_path_shows_dialog(qtbot, win):
    win.set_model("/no/such/model")
    assert "not found" in win.model_info.text()
    win.synthesize()
    _wait_idle(qtbot, win)
    assert win.error_box is not None and win.error_box.isVisible()
    assert "not found" in win.error_box.text()


def test_settings_persist(qtbot, tiny_dir, tmp_path):
    from gui.window import MainWindow

    settings = QSettings(str(tmp_path / "gui.ini"), QSettings.IniFormat)
    w = MainWindow(settings, model=str(tiny_dir), device="cpu")
    qtbot.addWidget(w)
    w.set_precisions(["fp32", "bf16"])
    w.seed.setValue(7)
    assert w.asr.isChecked() and w.noise_floor.isChecked() and w.chart_axis.currentText() == "WER/CER"  # defaults
    w.asr.setChecked(False)
    w.chart_axis.setCurrentText("DNSMOS")
    w.text.setPlainText("persist me")
    w.close()
    w2 = MainWindow(QSettings(str(tmp_path / "gui.ini"), QSettings.IniFormat))
    qtbot.addWidget(w2)
    assert w2.checked_precisions() == ["fp32", "bf16"] and w2.seed.value() == 7
    assert w2.text.toPlainText() == "persist me" and w2.model_path() == str(tiny_dir)
    assert not w2.asr.isChecked() and w2.chart_axis.currentText() == "DNSMOS"
    assert "DNSMOS" in w2.chart.ax_y.titleText()


def test_quantize_dialog_writes_artifact(qtbot, win, tiny_dir, tmp_path):
    from gui.dialogs import CALIB_DIR, ExportDialog, QuantizeDialog

    d = QuantizeDialog(str(tiny_dir), "cpu", win)
    qtbot.addWidget(d)
    # only calibration texts are offered: the evaluation's own sets would contaminate it (issue 40, item 7)
    offered = {d.calib.itemText(i) for i in range(d.calib.count())}
    assert "calib.jsonl" in offered and not offered & {"eval.jsonl", "smoke.jsonl", "heldout_natural_en.jsonl"}
    copy = tmp_path / "my-texts.jsonl"
    shutil.copyfile(CALIB_DIR / "eval.jsonl", copy)
    assert not d.set_calib_file(str(copy)) and "eval.jsonl" in d.stage.text()
    assert d.calib.currentData() is None
    assert d.set_calib_file(str(CALIB_DIR / "calib.jsonl"))
    assert d.limit.value() == 8  # proportionate to the CPU
    d.limit.setValue(2)
    d.keep.setValue(1)
    d.precision.setCurrentText("int8")
    assert d.out.text().endswith(f"{tiny_dir.name}-int8")  # the default folder says what it holds
    assert (
        "Stages: calibrate, reference outputs, scale search, sensitivity, quantize, stage errors, save. Each shows "
        "its progress and time left once it runs; a short probe of the model first estimates the total."
        in d.stage.text()
    )
    d.out.setText(str(tmp_path / "q8"))
    d.precision.setCurrentText("int8")  # a folder the user typed is kept
    assert d.out.text() == str(tmp_path / "q8")
    with qtbot.waitSignal(d.produced, timeout=WAIT * 3) as sig:
        d.run_button.click()
    assert Path(sig.args[0]) == tmp_path / "q8" and (tmp_path / "q8" / "manifest.json").is_file()
    # the expected time up front (issue 40, item 3), from the probe: every long stage, each a positive finite time
    assert set(d.expected) == set(d.planned_stages()) - {"save"}, d.expected
    assert all(0 < t < float("inf") for t in d.expected.values()) and "Expected time: about " in d.stages.text()
    # every stage shown with its time, then a summary of what was kept and the stages' errors
    for stage in d.planned_stages():
        assert f"✓ {stage} (" in d.stages.text(), d.stages.text()
    assert (
        "1 kept in float (" in d.stage.text() and "Error against FP32 on the calibration texts: gpt" in d.stage.text()
    )
    d.run_button.click()  # the folder exists now: the error names the dialog's own control, not a flag
    qtbot.waitUntil(lambda: d.stage.text().startswith("Failed"), timeout=WAIT)
    assert "“replace an existing output folder”" in d.stage.text() and "--" not in d.stage.text()
    win.set_model(sig.args[0])
    # the artifact names its source: the precisions stay, for the source model, beside the artifact
    assert win.model_kind == "artifact" and win.precision_list.isEnabled() and win.source == str(tiny_dir)
    assert str(tiny_dir) in win.model_info.text()
    e = ExportDialog(str(tiny_dir), "cpu", win)  # enabled when toolkit.export exists, else says why
    qtbot.addWidget(e)
    assert e.precision.currentText() == "int8" and e.out.text().endswith(f"{tiny_dir.name}-onnx-int8")
    e.precision.setCurrentText("fp32")
    assert e.out.text().endswith(f"{tiny_dir.name}-onnx-fp32")
    from gui.dialogs import export_available

    ok, why = export_available()
    assert e.run_button.isEnabled() == ok and (ok or "unavailable" in e.stage.text())
    if ok:  # the dialog runs the same export as `ttsq export`, and the window then treats it as an ONNX model
        e.out.setText(str(tmp_path / "onnx"))
        with qtbot.waitSignal(e.produced, timeout=WAIT) as sig:
            e.run_button.click()
        assert (Path(sig.args[0]) / "onnx_manifest.json").is_file()
        assert all(f"✓ {stage} (" in e.stages.text() for stage in e.planned_stages()), e.stages.text()
        win.set_model(sig.args[0])
        assert win.model_kind == "onnx" and win.source_known and win.source == str(tiny_dir)


def test_errors_name_the_gui_controls():
    from gui.messages import for_gui

    m = for_gui("q already exists; pass --force to replace it, or choose another --out")
    assert (
        m == "q already exists; tick “replace an existing output folder” to replace it, or choose another "
        "“Output folder”"
    )
    m = for_gui(
        "x holds int4 weights packed for cuda, but the target device is cpu; run it with --device cuda, or "
        "re-quantize on this device: ttsq quantize --device cpu ..."
    )
    assert "--" not in m and "“Device” cuda" in m and "Tools ▸ Quantize… with “Device” cpu" in m
    assert for_gui("model path not found: x. Pass --model with a ttsq model folder").endswith(
        "x. Pick in the Model box a ttsq model folder"
    )


@pytest.mark.skipif(shutil.which("Xvfb") is None, reason="Xvfb is not installed")
def test_walkthrough_compares_an_int4_artifact_with_fp32_under_xvfb(tiny_dir, tmp_path):
    """Issue 40's check: the GUI under a real X server quantizes nothing itself but is handed an int4 artifact, picks
    it after an FP32 run, and shows it beside its source's FP32 with an MCD; the screenshots come from this run.
    The committed docs/gui/ pictures come from the shipped voice (README.md there); a plain run leaves the repo
    alone."""
    from toolkit.quantize_job import quantize_to_artifact

    art = quantize_to_artifact(str(tiny_dir), "int4-g32", tmp_path / "tiny-q4")[0]
    out = tmp_path / "screens"
    display = ":%d" % (90 + os.getpid() % 50)
    xvfb = subprocess.Popen(
        ["Xvfb", display, "-screen", "0", "1600x1000x24", "-nolisten", "tcp"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        env = dict(os.environ, DISPLAY=display, QT_QPA_PLATFORM="xcb", XDG_CONFIG_HOME=str(tmp_path))
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "gui.screenshots",
                str(out),
                "--model",
                str(tiny_dir),
                "--artifact",
                str(art),
                "--precisions",
                "fp32",
                "--max-steps",
                "10",
                "--no-asr",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert r.returncode == 0, r.stderr[-3000:]
    finally:
        xvfb.terminate()
        xvfb.wait()
    for name in (
        "01-start.png",
        "03-results.png",
        "04-artifact-vs-fp32.png",
        "05-results-1024px.png",
        "06-quantize-dialog.png",
        "08-error-dialog.png",
    ):
        assert (out / name).stat().st_size > 5000, name
    assert "result fp32: " in r.stdout and "noise floor: MCD " in r.stdout, r.stdout
    line = next(x for x in r.stdout.splitlines() if x.startswith("result tiny-q4 · tiny-q4: "))
    assert f"from {art}" in line and "MCD vs FP32 None" not in line, line

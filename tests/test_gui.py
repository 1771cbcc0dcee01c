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
WAIT = 40_000  # ms


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
    assert not win.precision_list.item(list(__import__("toolkit.precision.recipes", fromlist=["RECIPES"]).RECIPES)
                                       .index("fp8")).flags() & Qt.ItemIsEnabled  # fp8 is greyed on the CPU
    qtbot.keyClick(win.text, Qt.Key_Return, Qt.ControlModifier)  # Ctrl+Enter synthesizes
    assert win.busy()
    _wait_idle(qtbot, win)
    assert win.error_box is None, win.error_box.text()
    assert win.table.rowCount() == 2
    assert [win.table.item(r, 0).text() for r in range(2)] == ["fp32", "int8"]
    assert _cell(win, 0, "MCD vs FP32 dB").text() == "0.00" and _cell(win, 1, "MCD vs FP32 dB").text() != "–"
    # intelligibility: a number (the tiny model speaks noise, so any value), and what the ASR heard in the tooltip
    assert win.table.COLUMNS.index("WER/CER") < win.table.COLUMNS.index("MCD vs FP32 dB")
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
        {n: win.results[n]["mcd_db"] for n in ys})
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
    assert win.save_wav(str(tmp_path / "x.wav")).is_file()
    win.save_report(str(tmp_path / "report"))
    _wait_idle(qtbot, win)
    assert win.error_box is None, win.error_box.text()
    import json
    rep = json.loads((tmp_path / "report" / "report.json").read_text())
    assert rep["schema"] == "ttsq-eval/1" and set(rep["precisions"]) == {"fp32", "int8"}
    assert rep["noise_floor"]["dtw_mcd_db"] is not None
    for name in ("fp32", "int8"):  # the ASR rows in the shape of ttsq evaluate's per_sentence rows
        row = rep["precisions"][name]["per_sentence"]["gui-001"]["asr"]
        assert row == [win.results[name]["asr"]] and set(row[0]) == {"heard", "ref_tokens", "sub", "dele", "ins",
                                                                     "language"}
        assert rep["precisions"][name]["end_to_end"]["intelligibility"]["wer"]["n"] == 1
    assert rep["asr"]["model"] == "whisper-base" and "asr_gap_vs_fp32" in rep["precisions"]["int8"]
    assert "WER en" in (tmp_path / "report" / "report.md").read_text()
    assert "What the ASR heard" in (tmp_path / "report" / "report.html").read_text()


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
    qtbot.waitUntil(lambda: "synthesizing" in win.progress_label.text() or "sentence" in win.progress_label.text(),
                    timeout=WAIT)
    qtbot.keyClick(win, Qt.Key_Escape)  # Esc cancels
    _wait_idle(qtbot, win)
    assert win.progress_label.text() == "cancelled"
    assert win.error_box is None and not win.results


def test_close_during_synthesis(qtbot, win):
    win.text.setPlainText("hello world. " * 12)
    win.max_steps.setValue(2048)
    win.synthesize()
    qtbot.waitUntil(lambda: "synthesizing" in win.progress_label.text() or "sentence" in win.progress_label.text(),
                    timeout=WAIT)
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
    qtbot.waitUntil(lambda: "synthesizing" in win.progress_label.text() or "sentence" in win.progress_label.text(),
                    timeout=WAIT)
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
    monkeypatch.setattr(Synthesizer, "synthesize",
                        lambda self, *a, **k: seen.append(k.get("control_tokens")) or real(self, *a, **k))
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
    assert w.asr.isChecked() and w.chart_axis.currentText() == "WER/CER"  # the defaults
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
    from gui.dialogs import ExportDialog, QuantizeDialog
    d = QuantizeDialog(str(tiny_dir), "cpu", win)
    qtbot.addWidget(d)
    d.precision.setCurrentText("int8")
    d.out.setText(str(tmp_path / "q8"))
    with qtbot.waitSignal(d.produced, timeout=WAIT) as sig:
        d.run_button.click()
    assert Path(sig.args[0]) == tmp_path / "q8" and (tmp_path / "q8" / "manifest.json").is_file()
    win.set_model(sig.args[0])
    assert win.model_kind == "artifact" and not win.precision_list.isEnabled()
    e = ExportDialog(str(tiny_dir), "cpu", win)  # enabled when toolkit.export exists, else says why
    qtbot.addWidget(e)
    from gui.dialogs import export_available
    ok, why = export_available()
    assert e.run_button.isEnabled() == ok and (ok or "unavailable" in e.stage.text())
    if ok:  # the dialog runs the same export as `ttsq export`, and the window then treats it as an ONNX model
        e.precision.setCurrentText("fp32")
        e.out.setText(str(tmp_path / "onnx"))
        with qtbot.waitSignal(e.produced, timeout=WAIT) as sig:
            e.run_button.click()
        assert (Path(sig.args[0]) / "onnx_manifest.json").is_file()
        win.set_model(sig.args[0])
        assert win.model_kind == "onnx"


@pytest.mark.skipif(shutil.which("Xvfb") is None, reason="Xvfb is not installed")
def test_screenshots_under_xvfb(tiny_dir, tmp_path):
    # the committed docs/gui/ pictures come from TTSQ_GUI_SCREENSHOTS=docs/gui; a plain run leaves the repo alone
    out = Path(os.environ.get("TTSQ_GUI_SCREENSHOTS", tmp_path / "screens"))
    display = ":%d" % (90 + os.getpid() % 50)
    xvfb = subprocess.Popen(["Xvfb", display, "-screen", "0", "1600x1000x24", "-nolisten", "tcp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        env = dict(os.environ, DISPLAY=display, QT_QPA_PLATFORM="xcb", XDG_CONFIG_HOME=str(tmp_path))
        r = subprocess.run([sys.executable, "-m", "gui.screenshots", str(out), "--model", str(tiny_dir),
                            "--precisions", "fp32", "bf16", "--max-steps", "10", "--no-asr"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
    finally:
        xvfb.terminate()
        xvfb.wait()
    for name in ("01-start.png", "03-results.png", "05-quantize-dialog.png", "07-error-dialog.png"):
        assert (out / name).stat().st_size > 5000

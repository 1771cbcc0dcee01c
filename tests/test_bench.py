"""`ttsq bench` on the CPU at tiny dimensions: the report, the table, and the chattts side when it cannot run."""

import json
import sys

from toolkit import cli
from toolkit.bench import markdown, run_chattts


def test_bench_writes_report_and_table(tmp_path, capsys):
    out = tmp_path / "bench"
    args = [
        "bench",
        "--dims",
        "tiny",
        "--device",
        "cpu",
        "--precisions",
        "fp32,int8,int8@bf16,fp8",
        "--batches",
        "1,2",
        "--steps",
        "24",
        "--repeats",
        "1",
        "--out",
        str(out),
    ]
    assert cli.main(args) == 0
    rep = json.loads(out.with_suffix(".json").read_text())
    assert rep["schema"] == "ttsq-bench/1" and rep["steps"] == 24 and rep["batches"] == [1, 2]
    assert rep["compile"] is False  # by default the step is compiled on CUDA only
    for name in ("fp32", "int8", "int8@bf16"):  # NAME@DTYPE: the recipe's float parts in DTYPE
        r = rep["ttsq"][name]
        assert set(r["steps_per_s"]) == {"1", "2"} and all(v > 0 for v in r["steps_per_s"].values())
        assert r["audio_s_per_s"]["2"] > 0 and 0 < r["rtf"] and 0 < r["time_to_first_audio_s"] < 60
        parts = r["first_audio_parts"]  # where first audio's time goes
        assert parts["prefill_and_first_step_s"] > 0 and parts["render_first_audio_s"] > 0
        assert parts["first_audio_steps"] > 0
        assert r["triton_kernel_batches"] == []  # CPU: the plain step
    assert "error" in rep["ttsq"]["fp8"]  # fp8 needs a GPU: recorded, and the others still ran
    assert rep["chattts"]["1"] == {"skipped": "no --chattts-python given"}
    table = out.with_suffix(".md").read_text()
    assert "| fp32 |" in table and "| fp8 | failed" in table and table in capsys.readouterr().out
    assert cli.main(args) != 0  # existing results are kept unless --force
    assert "--force" in capsys.readouterr().err


def test_chattts_side_reports_why_it_did_not_run(tmp_path):
    assert "skipped" in run_chattts(str(tmp_path / "no-python"), 8, 1, "cpu", workdir=tmp_path)
    r = run_chattts(sys.executable, 8, 1, "cpu", workdir=tmp_path)  # this venv has no ChatTTS package
    assert "error" in r and "ChatTTS" in r["error"]


def test_ratio_to_chattts_in_the_table():
    rep = {
        "hardware": "cpu",
        "torch": "x",
        "dims": "tiny",
        "steps": 10,
        "created": "now",
        "batches": [1],
        "ttsq": {
            "fp32": {
                "weight_bytes": 2**20,
                "rtf": 0.5,
                "time_to_first_audio_s": 0.1,
                "steps_per_s": {"1": 300.0},
                "audio_s_per_s": {"1": 6.4},
                "peak_mem_bytes": {},
            }
        },
        "chattts": {"1": {"steps_per_s": 100.0}},
    }
    assert "| fp32 | 1 | 0.500 | 0.100 | 300 | 6.4 | 3.0x | – |" in markdown(rep)
    assert "Triton" not in markdown(rep)
    rep["ttsq"]["fp32"]["triton_kernel_batches"] = [1]  # what a CUDA run records where the kernels ran
    assert "Decode steps through the Triton kernels of toolkit/kernels.py: fp32 at batch 1" in markdown(rep)


def test_bench_keeps_what_it_measured_part_by_part():
    """The chattts baseline comes first and the report is handed over after every part, each batch of each
    precision included: a run cut short by a time limit still has a same-run baseline and every batch it finished,
    marked incomplete."""
    from toolkit.bench import BenchConfig, run_bench

    snapshots, said = [], []
    cfg = BenchConfig(["fp32", "bf16"], [1, 2], steps=16, device="cpu", dims="tiny", repeats=1)
    run_bench(cfg, progress=said.append, on_update=lambda r: snapshots.append(json.loads(json.dumps(r))))
    measured = [{name: sorted(row["steps_per_s"]) for name, row in s["ttsq"].items()} for s in snapshots]
    assert (
        measured
        == [{}, {"fp32": ["1"]}, {"fp32": ["1", "2"]}, {"fp32": ["1", "2"]}, {"fp32": ["1", "2"], "bf16": ["1"]}]
        + [{"fp32": ["1", "2"], "bf16": ["1", "2"]}] * 3
    )
    assert ["rtf" in s["ttsq"].get("fp32", {}) for s in snapshots] == [False] * 3 + [True] * 5  # once b1..b2 are done
    assert all(s["chattts"]["1"] and s["chattts"]["2"] for s in snapshots)
    assert [s["complete"] for s in snapshots] == [False] * 7 + [True]
    assert "incomplete" in markdown(snapshots[1]) and "incomplete" not in markdown(snapshots[-1])
    assert "| fp32 |" in markdown(snapshots[1])  # a partial row is a table row, its missing batches "–"
    assert any(m.startswith("ttsq bf16 batch 2: ") and "steps/s" in m for m in said)


def test_kernels_option_reaches_the_engine_and_the_report(tiny_dir):
    """--kernels auto|on|off: the bench records it (and says so in its table), ttsq synth hands it to the engine."""
    from toolkit import Synthesizer
    from toolkit.bench import BenchConfig, run_bench

    args = cli.build_parser().parse_args(["bench", "--kernels", "off"])
    assert cli.KERNELS[args.kernels] is False and cli.build_parser().parse_args(["bench"]).kernels == "auto"
    rep = run_bench(
        BenchConfig(["fp32"], [1], steps=8, device="cpu", dims="tiny", repeats=1, kernels=False),
        progress=lambda m: None,
    )
    assert rep["kernels"] is False and rep["ttsq"]["fp32"]["triton_kernel_batches"] == []
    assert "Triton kernels off" in markdown(rep)
    assert Synthesizer(tiny_dir, "cpu", kernels=False).engine.kernels is False

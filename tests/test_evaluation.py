"""`ttsq evaluate` end to end on the tiny model: the report schema, the files, the noise-floor mark, the CLI."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMOKE = str(ROOT / "calibration_sets" / "smoke.jsonl")


@pytest.fixture(scope="module")
def evaluated(tiny_dir, tmp_path_factory):
    from evaluation.report import write_report
    from evaluation.runner import EvalConfig, run_evaluation

    cfg = EvalConfig(
        model=str(tiny_dir),
        precisions=["int8", "bf16"],
        text_set=SMOKE,
        out="",
        device="cpu",
        limit=3,
        max_steps=24,
        repeats=1,
        throughput_batches=(1, 2),
        dnsmos=False,
    )
    report, utts = run_evaluation(cfg)
    out = write_report(report, utts, tmp_path_factory.mktemp("eval") / "report")
    return report, out


def test_report_schema(evaluated):
    report, out = evaluated
    assert report["schema"] == "ttsq-eval/1" and report["seeds"] == [0, 1]
    assert list(report["precisions"]) == ["fp32", "int8", "bf16"]
    for name, r in report["precisions"].items():
        perf = r["performance"]
        assert perf["rtf"] > 0 and perf["steps_per_s"] > 0 and perf["size_bytes"] > 0
        assert set(perf["throughput_audio_s_per_s"]) == {"1", "2"}
        assert set(perf["stage_latency_s"]) == {"gpt", "decoder", "vocoder"}
        for stat in (
            r["decoder_vocoder"]["mcd_db"],
            r["gpt_teacher_forced"]["top1_agreement"],
            r["end_to_end"]["dtw_mcd_db"],
            r["end_to_end"]["duration_ratio"],
        ):
            assert stat["lo"] <= stat["mean"] <= stat["hi"]
        assert len(r["per_sentence"]) == 3 and isinstance(r["within_noise_floor"], bool)
    fp32 = report["precisions"]["fp32"]
    assert fp32["decoder_vocoder"]["mcd_db"]["mean"] == 0 and fp32["gpt_teacher_forced"]["top1_agreement"]["mean"] == 1
    int8 = report["precisions"]["int8"]
    assert (
        0
        < int8["decoder_vocoder"]["mcd_db"]["mean"]
        < report["precisions"]["bf16"]["decoder_vocoder"]["mcd_db"]["mean"] * 10
    )
    assert int8["gpt_teacher_forced"]["kl_nats"]["mean"] > 0
    assert report["noise_floor"]["dtw_mcd_db"]["mean"] > 0  # sampling alone changes the audio


def test_report_carries_intelligibility_for_every_precision(evaluated):
    """WER/CER by the ASR for every precision, every seed's transcript per sentence, and the gap against FP32."""
    pytest.importorskip("faster_whisper", reason="the asr extra is not installed (pip install -e '.[asr]')")
    report, out = evaluated
    assert report["asr"]["model"] == "whisper-base" and report["asr"]["decoding"]["beam_size"] == 5
    for name, r in report["precisions"].items():
        rates = r["end_to_end"]["intelligibility"]
        assert set(rates) <= {"wer", "cer", "mer"} and "wer" in rates  # the smoke set's first three are English
        assert rates["wer"]["lo"] <= rates["wer"]["mean"] <= rates["wer"]["hi"]
        for row in r["per_sentence"].values():
            assert len(row["asr"]) == 2 and all(isinstance(a["heard"], str) for a in row["asr"])
        assert ("asr_gap_vs_fp32" in r) == (name != "fp32")
    md = (out / "report.md").read_text()
    assert "| WER en |" in md and "ASR: whisper-base" in md
    assert "What the ASR heard" in (out / "report.html").read_text()


def test_report_files(evaluated):
    report, out = evaluated
    assert json.loads((out / "report.json").read_text())["precisions"].keys() == report["precisions"].keys()
    md = (out / "report.md").read_text()
    assert md.count("\n| ") >= 4 and "Noise floor" in md
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3
    assert len(list((out / "wavs").rglob("*.wav"))) == 3 * 2 * 3  # precisions x seeds x sentences


def test_mcd_in_report_matches_independent_recomputation(evaluated):
    """The report's end-to-end MCD for a sentence equals MCD recomputed from the written WAVs (16-bit)."""
    import soundfile as sf

    from evaluation import metrics

    report, out = evaluated
    rid, row = next(iter(report["precisions"]["int8"]["per_sentence"].items()))
    values = []
    for s in report["seeds"]:
        ref, sr = sf.read(out / "wavs" / "fp32" / f"{rid}_seed{s}.wav", dtype="float32")
        test, _ = sf.read(out / "wavs" / "int8" / f"{rid}_seed{s}.wav", dtype="float32")
        values.append(metrics.mcd(ref, test, sr).value_db)
    assert abs(sum(values) / len(values) - row["dtw_mcd_db"]) < 0.05 + 0.02 * row["dtw_mcd_db"]


def test_cli_evaluate(tiny_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "ev"
    cmd = [
        sys.executable,
        "-m",
        "toolkit.cli",
        "evaluate",
        "--model",
        str(tiny_dir),
        "--precisions",
        "fp32,int8@bf16",
        "--set",
        SMOKE,
        "--limit",
        "2",
        "--max-steps",
        "12",
        "--repeats",
        "1",
        "--no-dnsmos",
        "--no-asr",
        "--out",
        str(out),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "| int8@bf16 |" in r.stdout and (out / "report.html").is_file()  # NAME@DTYPE: int8 on bf16 activations
    runs = json.loads((out / "report.json").read_text())["precisions"]
    assert runs["int8@bf16"]["recipe"] == "int8"
    assert runs["int8@bf16"]["performance"]["size_bytes"] < runs["fp32"]["performance"]["size_bytes"] / 2
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 2 and "--force" in r.stderr
    r = subprocess.run(cmd[:-1] + [str(tmp_path / "ev2"), "--seeds", "0"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "noise floor" in r.stderr


def test_cepstra_computed_in_worker_processes_equal_those_computed_here():
    """Scoring spreads SPTK's analysis over processes (Cepstra.prefetch): same numbers, same too-short handling."""
    import numpy as np

    from evaluation.runner import Cepstra

    rng = np.random.default_rng(0)
    wavs = [
        rng.standard_normal(12000).astype(np.float32) * 0.1,
        rng.standard_normal(7000).astype(np.float32) * 0.1,
        np.zeros(100, np.float32),
    ]  # the last is shorter than one analysis frame
    here, pooled = Cepstra(24000), Cepstra(24000)
    pooled.prefetch(wavs, workers=2)
    assert len(pooled._seen) == 3  # computed up front, not on use
    for w in wavs[:2]:
        assert np.array_equal(here(w), pooled(w))
    with pytest.raises(ValueError, match="frame"):
        pooled(wavs[2])
    assert pooled.mcd(wavs[2], wavs[0]) is None and pooled.mcd(wavs[0], wavs[1]) == here.mcd(wavs[0], wavs[1])


def test_dnsmos_in_worker_processes_equals_dnsmos_here():
    import numpy as np

    from evaluation.pool import dnsmos_overall, map_in_processes

    rng = np.random.default_rng(1)
    items = [(rng.standard_normal(16000 * 2).astype(np.float32) * 0.1, 16000), (np.zeros(10, np.float32), 16000)]
    seen = []
    pooled = map_in_processes(dnsmos_overall, items, workers=2, progress=lambda i, n: seen.append((i, n)))
    assert pooled == [dnsmos_overall(x) for x in items] and pooled[1] is None and pooled[0] > 0
    assert seen == [(1, 2), (2, 2)]

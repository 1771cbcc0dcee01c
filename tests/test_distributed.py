"""Distributed evaluation (2 gloo ranks on the CPU under torchrun) against one process, sharding, the device router."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SMOKE = str(ROOT / "calibration_sets" / "smoke.jsonl")


def test_shard_balances_and_covers_every_unit_once():
    from evaluation.distributed import shard

    costs = [5.0, 1.0, 3.0, 3.0, 2.0, 2.0, 4.0, 1.0]
    plan = shard(costs, 3)
    assert sorted(i for p in plan for i in p) == list(range(len(costs)))
    assert all(p == sorted(p) for p in plan)
    loads = [sum(costs[i] for i in p) for p in plan]
    assert max(loads) - min(loads) <= max(costs) and max(loads) <= 4 / 3 * sum(costs) / 3 + 1e-9  # LPT's bound
    assert shard(costs, 3) == plan  # every rank computes the same plan
    assert shard([1.0, 1.0], 4) == [[0], [1], [], []]
    assert shard(costs, 1) == [list(range(len(costs)))]
    with pytest.raises(ValueError, match="world_size"):
        shard(costs, 0)


def test_work_units_are_fixed_batches():
    from evaluation.runner import work_units
    from toolkit.text import expected_seconds
    from toolkit.textsets import load_text_set

    records = load_text_set(SMOKE)
    units = work_units(records, 2)
    assert sorted(i for u in units for i in u.ids) == sorted(r.id for r in records)
    by_id = {r.id: r for r in records}
    for u in units:
        assert 1 <= len(u.ids) <= 2 and {by_id[i].speaker for i in u.ids} == {u.speaker}
        assert u.expected_s == pytest.approx(sum(expected_seconds(by_id[i].text) for i in u.ids))
    assert [u.seed_offset for u in units if u.speaker == "seed:7"] == [0, 2]
    assert expected_seconds("你好世界") > expected_seconds("abcd")  # a Mandarin syllable per character


def test_distributed_without_torchrun_names_the_fix(monkeypatch):
    from evaluation.distributed import init_distributed

    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(RuntimeError, match="torchrun --nproc-per-node"):
        init_distributed()


def test_two_gloo_ranks_match_one_process(tiny_dir, tmp_path):
    """torchrun, 2 CPU ranks: the report's quality numbers equal a single-process run's exactly."""
    from evaluation.runner import EvalConfig, run_evaluation

    out = tmp_path / "dist"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "toolkit.cli",
        "evaluate",
        "--distributed",
        "--model",
        str(tiny_dir),
        "--precisions",
        "fp32,bf16",
        "--set",
        SMOKE,
        "--max-steps",
        "16",
        "--batch-size",
        "2",
        "--repeats",
        "1",
        "--no-dnsmos",
        "--no-asr",
        "--out",
        str(out),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    dist = json.loads((out / "report.json").read_text())

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank ran
    try:
        cfg = EvalConfig(
            model=str(tiny_dir),
            precisions=["fp32", "bf16"],
            text_set=SMOKE,
            out="",
            device="cpu",
            max_steps=16,
            batch_size=2,
            repeats=1,
            throughput_batches=(1,),
            dnsmos=False,
            asr=False,
        )
        single, _ = run_evaluation(cfg)
    finally:
        torch.set_num_threads(threads)
    single = json.loads(json.dumps(single, default=float))  # as written to report.json

    assert dist["schema"] == single["schema"] == "ttsq-eval/1"
    assert dist["world_size"] == 2 and dist["devices"] == ["cpu", "cpu"] and single["world_size"] == 1
    assert [s["units"] for s in dist["shards"]] == [2, 2] and sum(s["records"] for s in dist["shards"]) == 6
    assert dist["noise_floor"] == single["noise_floor"]
    ids = [json.loads(line)["id"] for line in Path(SMOKE).read_text().splitlines() if line.strip()]
    for name in ("fp32", "bf16"):
        a, b = dist["precisions"][name], single["precisions"][name]
        assert list(a["per_sentence"]) == ids  # every record once, in text-set order
        for key in (
            "decoder_vocoder",
            "gpt_teacher_forced",
            "end_to_end",
            "per_sentence",
            "within_noise_floor",
            "gap_vs_noise_floor_db",
        ):
            assert a.get(key) == b.get(key), (name, key)
    assert dist["precisions"]["bf16"]["decoder_vocoder"]["mcd_db"]["mean"] > 0
    assert len(list((out / "wavs").rglob("*.wav"))) == 2 * 2 * 6  # rank 0 wrote every rank's audio


def test_router_spreads_by_expected_audio_and_matches_one_synthesizer(tiny_dir, tiny_synth):
    from toolkit import SamplingParams
    from toolkit.serving import Router

    params = SamplingParams(max_new_tokens=16)
    texts = ["a much longer sentence with many words in it, long enough to fill a queue.", "hi.", "ok.", "你好。"]
    with Router(tiny_dir, ["cpu", "cpu"]) as router:
        gate = threading.Event()

        def held(synthesize):
            def wait_then_synthesize(*args, **kwargs):
                gate.wait()
                return synthesize(*args, **kwargs)

            return wait_then_synthesize

        for s in router.replicas:  # hold the workers so routing sees every request still queued
            s.synthesize = held(s.synthesize)
        futures = [router.submit(t, seed=3, params=params) for t in texts]
        assert router.routed == [1, 3] and router.queued == [1, 3]  # three short ones balance one long one
        assert router.queued_s[0] > router.queued_s[1] > 0
        gate.set()
        utts = [f.result(timeout=120) for f in futures]
    assert router.queued == [0, 0]
    for t, u in zip(texts, utts):
        ref = tiny_synth.synthesize(t, seed=3, params=params, batch_size=1)[0]
        assert np.array_equal(u.wav, ref.wav) and u.steps == ref.steps

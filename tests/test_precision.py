"""Recipes, calibration, artifacts and `ttsq quantize` on the tiny model (CPU)."""

import copy
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from toolkit import SamplingParams, Synthesizer, load_model
from toolkit.checkpoint import CheckpointError
from toolkit.precision import RECIPES, UnsupportedRecipe, quantize
from toolkit.precision.artifact import load_artifact, save_artifact
from toolkit.precision.calibration import collect
from toolkit.textsets import load_text_set

ROOT = Path(__file__).resolve().parents[1]
CPU_RECIPES = [n for n, r in RECIPES.items() if "cpu" in r.devices]


@pytest.fixture(scope="module")
def base(tiny_dir):
    return load_model(tiny_dir)


@pytest.fixture(scope="module")
def calib(base):
    records = load_text_set(ROOT / "calibration_sets" / "smoke.jsonl")
    return collect(base, [r.text for r in records], [r.speaker for r in records], max_steps=24)


@pytest.fixture(scope="module")
def reports(base, calib):
    out = {}
    for name in CPU_RECIPES:
        m = copy.deepcopy(base)
        out[name] = (m, quantize(m, name, device="cpu", calib=calib))
    return out


def test_every_cpu_recipe_runs_and_synthesizes(reports):
    for name, (model, report) in reports.items():
        u = Synthesizer(model, "cpu").synthesize("hello world.", params=SamplingParams(max_new_tokens=6), seed=0)[0]
        assert np.isfinite(u.wav).all() and len(u.wav) > 0, name
        assert set(report.errors) >= {"gpt", "decoder", "vocos"}, name


def test_error_order_and_sizes(reports):
    err = {n: r.errors["gpt"] + r.errors["decoder"] + r.errors["vocos"] for n, (_, r) in reports.items()}
    assert err["fp32"] == 0
    assert 0 < err["bf16"] and err["int8"] < err["int4-g32"] and err["int8"] < err["int4-g64"]
    size = {n: r.bytes_after for n, (_, r) in reports.items()}
    assert size["bf16"] < 0.6 * size["fp32"] and size["fp16"] < 0.6 * size["fp32"]
    assert size["int4-g32"] < size["int8"] < size["fp32"]  # group 128 skips most of the 64-wide tiny layers
    q = reports["int8"][1].plan
    assert "gpt.head_code" not in q.quantize and "gpt.head_text" not in q.quantize and "vocos.out" not in q.quantize
    assert any(n.startswith("gpt.layers.0.attention") for n in q.quantize)


@pytest.mark.trains
def test_calibration_beats_round_to_nearest(base, calib):
    """Same model, same int4 recipe: AWQ scaling + keeping the 3 most sensitive layers vs plain RTN."""
    rtn, cal = copy.deepcopy(base), copy.deepcopy(base)
    plain = quantize(rtn, "int4-g32", device="cpu", calib=calib, awq=False)
    tuned = quantize(cal, "int4-g32", device="cpu", calib=calib, keep_sensitive=3)
    assert len(tuned.plan.keep) == 3 and len(tuned.plan.scores) == len(plain.plan.quantize)
    for stage in ("gpt", "decoder", "vocos"):
        assert tuned.errors[stage] <= plain.errors[stage] * 1.0001, stage
    assert sum(tuned.errors.values()) < 0.9 * sum(plain.errors.values())


@pytest.mark.trains
def test_clipping_search_lowers_the_layer_error_and_restores_kept_layers(base, calib):
    """AWQ's int4 range search on heavy-tailed weights: the searched clip quantizes closer than min/max."""
    from toolkit.precision.calibration import clip_weights, fake_quant_weight, search_clipping
    from toolkit.precision.recipes import get_recipe

    recipe = get_recipe("int4-g32", torch.device("cpu"))
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(128, 64, bias=False))
    with torch.no_grad():  # heavy tails: a few large weights stretch each group's min/max range
        layer[0].weight.copy_(torch.distributions.StudentT(3.0).sample((64, 128)) * 0.02)
    x = torch.randn(512, 128)
    w = layer[0].weight.detach().clone()
    ratios = search_clipping(layer, recipe, {"0": x})["0"]
    assert ratios.shape == (64, 4) and bool((ratios <= 1).all()) and bool((ratios < 1).any())
    with torch.no_grad():
        clip_weights(layer, recipe, {"0": ratios})

    def err(q):
        return float((x @ (q - w).T).pow(2).sum())

    assert err(fake_quant_weight(layer[0].weight.detach(), recipe)) < 0.99 * err(fake_quant_weight(w, recipe))
    # in the pipeline: a layer kept in float by the sensitivity scan gets its unclipped weights back
    m = copy.deepcopy(base)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    rep = quantize(m, "int4-g32", device="cpu", calib=calib, keep_sensitive=2)
    for n in rep.plan.keep:
        assert n not in rep.plan.clipped
        if not rep.plan.alphas.get(n):  # not rescaled by AWQ either: bit-identical to the original
            assert torch.equal(dict(m.named_modules())[n].weight, before[n + ".weight"])


def test_unsupported_pairings_name_alternatives(base):
    with pytest.raises(UnsupportedRecipe, match="does not run on cpu.*int8"):
        quantize(copy.deepcopy(base), "fp8", device="cpu")
    with pytest.raises(UnsupportedRecipe, match="unknown precision"):
        quantize(copy.deepcopy(base), "int3", device="cpu")
    with pytest.raises(UnsupportedRecipe, match="applies to quantized recipes"):
        quantize(copy.deepcopy(base), "fp16", device="cpu", float_dtype="fp32")
    with pytest.raises(UnsupportedRecipe, match="unknown float dtype"):
        quantize(copy.deepcopy(base), "int8", device="cpu", float_dtype="fp64")


@pytest.mark.parametrize("name", ["int8", "w8a8", "int4"])
def test_quantize_leaves_the_process_inductor_config_alone(base, name):
    """torchao's configs set inductor options for the whole process by default; ttsq's quantize must not, or every
    later torch.compile in the user's process (other models included) runs with them."""
    from torch._inductor import config

    knobs = {
        "coordinate_descent_tuning": False,
        "coordinate_descent_check_all_directions": False,
        "force_fuse_int_mm_with_mul": False,
    }
    with config.patch(knobs):  # inductor's own way to set options for a while
        quantize(copy.deepcopy(base), name, device="cpu")
        assert {key: getattr(config, key) for key in knobs} == knobs


def test_float_dtype_runs_a_quantized_recipe_around_other_float_parts(base, tmp_path):
    """int8 weights with bf16 activations (float_dtype) quantize, synthesize and reload in that dtype."""
    model = copy.deepcopy(base)
    report = quantize(model, "int8", device="cpu", float_dtype="bf16")
    assert model.gpt.norm.weight.dtype == torch.bfloat16 and report.plan.quantize
    assert type(model.gpt.layers[0].attention.wqkv.weight).__name__ != "Parameter"  # a torchao tensor
    wav = (
        Synthesizer(model, "cpu")
        .synthesize(["Mixed precision."], seed=0, params=SamplingParams(max_new_tokens=24))[0]
        .wav
    )
    assert wav.size and np.isfinite(wav).all()
    again = load_model(save_artifact(model, tmp_path / "int8-bf16"))
    assert again.gpt.norm.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("name", ["int8", "int4", "bf16"])
def test_artifact_round_trip_is_exact(reports, tmp_path, name):
    model, _ = reports[name]
    out = save_artifact(model, tmp_path / name)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["precision"] == name and manifest["versions"]["torchao"]
    assert all(len(f["sha256"]) == 64 for f in manifest["files"].values())
    again = load_model(out)
    x = torch.randn(1, 5, model.cfg.gpt.hidden).to(model.gpt.norm.weight.dtype)
    valid = torch.ones(1, 5, dtype=torch.bool)
    assert torch.equal(model.gpt.forward_full(x, valid), again.gpt.forward_full(x, valid))
    a = Synthesizer(model, "cpu").synthesize("hi there.", params=SamplingParams(max_new_tokens=5), seed=2)[0].wav
    b = Synthesizer(out, "cpu").synthesize("hi there.", params=SamplingParams(max_new_tokens=5), seed=2)[0].wav
    assert np.array_equal(a, b)


def test_artifact_refuses_other_device_and_torchao(reports, tmp_path):
    out = save_artifact(reports["int4"][0], tmp_path / "a")
    manifest = json.loads((out / "manifest.json").read_text())
    with pytest.raises(CheckpointError, match="packed for cpu.*--device cpu"):
        load_artifact(out, manifest, device="cuda")
    manifest["versions"]["torchao"] = "0.1.0"
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="torchao 0.1"):
        load_model(out)


def test_cli_quantize(tiny_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "q"
    cmd = [
        sys.executable,
        "-m",
        "toolkit.cli",
        "quantize",
        "--model",
        str(tiny_dir),
        "--precision",
        "int8",
        "--calib",
        str(ROOT / "calibration_sets" / "smoke.jsonl"),
        "--out",
        str(out),
        "--max-steps",
        "12",
        "--keep-sensitive",
        "1",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "| int8 |" in r.stdout and "err gpt" in r.stdout
    assert "stages: calibrate, reference outputs, scale search, sensitivity, quantize, stage errors, save" in r.stderr
    # the expected time, said before the long stages start, from a probe of this model: a positive time per stage
    line = next(x for x in r.stderr.splitlines() if x.startswith("expected time: about "))
    assert r.stderr.index(line) < r.stderr.index("calibrate: "), r.stderr
    shares = re.findall(r"(calibrate|reference outputs|scale search|sensitivity|quantize|stage errors) (\d+) s", line)
    assert [s for s, _ in shares] == [
        "calibrate",
        "reference outputs",
        "scale search",
        "sensitivity",
        "quantize",
        "stage errors",
    ], line
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["calibration"]["sha256"] and list(manifest["layers"].values()).count("float (sensitive)") == 1
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2 and "--force" in r.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "text": ""}\n')
    r = subprocess.run(
        cmd[:-6] + ["--calib", str(bad), "--out", str(tmp_path / "q2")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 2 and "bad.jsonl:1:" in r.stderr and "empty" in r.stderr


def test_fp16_overflow_falls_back_to_fp32_per_stage(tiny_dir):
    """A decoder weight that overflows fp16: the stage reruns in fp32 with a warning, and the audio is finite
    and equal to an fp32 decoder's on the same states."""
    synth = Synthesizer(tiny_dir, "cpu", "fp16")
    ref = Synthesizer(tiny_dir, "cpu")
    with torch.no_grad():
        for m in (synth.model, ref.model):
            for conv in (m.decoder.conv_in[0], m.decoder.conv_in[2]):  # weights fit fp16, activations don't
                conv.weight.mul_(500)
    p = SamplingParams(max_new_tokens=8)
    with pytest.warns(RuntimeWarning, match="decoder overflowed in float16"):
        u = synth.synthesize("hello world.", seed=1, params=p)[0]
    assert np.isfinite(u.wav).all() and np.abs(u.wav).max() > 0
    seg = u.segments[0]
    expected = ref.decode(seg.hidden[None], torch.tensor([seg.hidden.shape[0]]))[0][0]
    np.testing.assert_allclose(u.wav, expected, atol=2e-2 * np.abs(expected).max())


def test_artifact_keeps_the_text_front_end(reports, tmp_path):
    model, _ = reports["int8"]
    model.frontend = "espeak"
    try:
        out = save_artifact(model, tmp_path / "fe")
    finally:
        model.frontend = None
    assert json.loads((out / "manifest.json").read_text())["frontend"] == "espeak"
    assert load_model(out).frontend == "espeak"


FRESH_PROCESS_SYNTH = """
import json, sys
import numpy as np, torch
path, out, threads = sys.argv[1:4]
torch.set_num_threads(int(threads))
from toolkit import SamplingParams, Synthesizer
preloaded = sorted(m for m in sys.modules if m.startswith("torchao.prototype"))
synth = Synthesizer(path, "cpu")
u = synth.synthesize("hi there. hello world.", params=SamplingParams(max_new_tokens=8), seed=3)[0]
kinds = sorted({type(w).__name__ for w in synth.model.state_dict().values()})
np.savez(out, wav=u.wav, codes=np.concatenate([s.codes.numpy() for s in u.segments]))
print(json.dumps({"preloaded": preloaded, "kinds": kinds}))
"""


def test_every_cpu_artifact_loads_and_speaks_the_same_in_a_fresh_process(reports, tmp_path):
    """Issue 40: an int4 artifact loaded in a new process failed ("Unsupported global: Int4OpaqueTensor"), since only
    the quantizing process had imported torchao's prototype int4 package. Each CPU recipe's artifact is loaded by its
    own fresh interpreter (which has imported no torchao module before the load), with weights_only=True as always,
    and speaks the very codes and audio that the quantized model spoke in this process at the same seed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TORCHAO_FORCE_SKIP_LOADING_SO_FILES": "1"}
    runs = {}
    for name in CPU_RECIPES:
        out = save_artifact(reports[name][0], tmp_path / name)
        runs[name] = subprocess.Popen(
            [
                sys.executable,
                "-c",
                FRESH_PROCESS_SYNTH,
                str(out),
                str(tmp_path / f"{name}.npz"),
                str(torch.get_num_threads()),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
    for name, proc in runs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{name}: {stderr[-2000:]}"
        child = json.loads(stdout.strip().splitlines()[-1])
        assert child["preloaded"] == [], (name, child)  # fresh: torchao's prototype (CPU int4) package not imported
        model = reports[name][0]
        kinds = sorted({type(w).__name__ for w in model.state_dict().values()})
        assert child["kinds"] == kinds, name  # the same tensor classes came back
        u = Synthesizer(model, "cpu").synthesize(
            "hi there. hello world.", params=SamplingParams(max_new_tokens=8), seed=3
        )[0]
        got = np.load(tmp_path / f"{name}.npz")
        assert np.array_equal(got["codes"], np.concatenate([s.codes.numpy() for s in u.segments])), name
        np.testing.assert_allclose(
            got["wav"], u.wav, rtol=0, atol=1e-6 * max(1.0, float(np.abs(u.wav).max())), err_msg=name
        )
    kinds = {name: sorted({type(w).__name__ for w in reports[name][0].state_dict().values()}) for name in runs}
    assert "Int4OpaqueTensor" in kinds["int4-g32"] and "Int8Tensor" in kinds["w8a8"]  # the test tests something


@pytest.mark.parametrize("name,keep", [("int4-g32", 1), ("int8", 0)])
def test_quantize_reports_every_stage_and_records_its_source(tiny_dir, tmp_path, name, keep):
    """Issue 40, item 3: every stage reports its own progress, in the order plan_stages announces, each ending at
    done == total (no stage sits silent after calibration); the artifact names the model it came from, and gets the
    umask's mode, not mkdtemp's 0700."""
    from toolkit.quantize_job import plan_stages, quantize_to_artifact

    seen = []
    old = os.umask(0o022)
    try:
        out, _ = quantize_to_artifact(
            str(tiny_dir),
            name,
            tmp_path / "q",
            calib_set=ROOT / "calibration_sets" / "smoke.jsonl",
            limit=2,
            max_steps=8,
            keep_sensitive=keep,
            progress=lambda *a: seen.append(a),
        )
    finally:
        os.umask(old)
    order = list(dict.fromkeys(s for s, _, _ in seen))
    assert order == plan_stages(name, True, keep) and "stage errors" in order
    for stage in order:
        steps = [(d, n) for s, d, n in seen if s == stage]
        assert steps[-1][0] == steps[-1][1] and [d for d, _ in steps] == sorted(d for d, _ in steps), stage
    assert json.loads((out / "manifest.json").read_text())["source"] == str(Path(tiny_dir).resolve())
    assert out.stat().st_mode & 0o777 == 0o755


def test_quantize_estimate_probes_the_model_and_scales_with_the_work(tiny_dir):
    """Issue 40, item 3: the expected time comes from a probe of the actual model on its device, extrapolated: a
    positive finite time for every long stage, in plan order, that grows with the texts, the steps and the layers."""
    from toolkit.quantize_job import Probe, estimate_stages, extrapolate, plan_stages
    from toolkit.synthesizer import load_model
    from toolkit.textsets import load_text_set

    stages = plan_stages("int4-g32", True, 1)
    records = load_text_set(ROOT / "calibration_sets" / "smoke.jsonl", limit=4)
    est = estimate_stages(load_model(tiny_dir), records, "int4-g32", stages, 96)
    assert list(est) == [s for s in stages if s != "save"]
    assert all(0 < t < math.inf for t in est.values()), est
    # the extrapolation itself, on fixed costs: proportional where the work is
    p = Probe(2, (0.5, 0.1), {"gpt": (0.2, 0.01), "decoder": (0.1, 0.01), "vocos": (0.1, 0.02)}, 0.01, 0.05, 100)
    layers = {"gpt.a": 100, "decoder.b": 100, "vocos.c": 50}
    one = extrapolate(p, stages, [2], 96, layers)
    assert one["calibrate"] == pytest.approx(0.5 + 0.1 * 96)
    assert one["reference outputs"] == pytest.approx(0.2 + 0.96 + 0.1 + 0.96 + 0.1 + 1.92)
    two = extrapolate(p, stages, [2, 2], 96, layers)
    for s in ("calibrate", "reference outputs", "stage errors", "sensitivity"):
        assert two[s] > 1.9 * one[s], s  # twice the batches
    short = extrapolate(p, stages, [2], 12, layers)
    assert short["calibrate"] < one["calibrate"] / 4
    more = extrapolate(p, stages, [2], 96, {**layers, "gpt.d": 100, "gpt.e": 100})
    assert more["sensitivity"] > one["sensitivity"] and more["scale search"] > one["scale search"]


def test_stage_clock_times_stages_and_gives_an_eta():
    from toolkit.progress import StageClock, duration

    now = [0.0]
    c = StageClock(clock=lambda: now[0])
    assert c.update("calibrate", 0, 8) is None  # no rate yet
    now[0] = 10.0
    assert c.update("calibrate", 2, 8) == pytest.approx(30.0)  # 5 s a text, 6 to go
    now[0] = 40.0
    assert c.update("calibrate", 8, 8) == 0.0 and c.took == {"calibrate": 40.0}
    assert duration(45) == "45 s" and duration(200) == "3 min 20 s" and duration(3900) == "1 h 05 min"

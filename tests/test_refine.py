"""refine_text: ttsq's text-head stage against what chattts 0.2.5 computed on the tiny official-layout fixture
(tests/fixtures/chattts_tiny/refine.safetensors, written by make_chattts_fixture.py), and refine through the
library, the CLI, streaming and batching; the errors of models that cannot refine."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from toolkit import SamplingParams, Synthesizer
from toolkit.checkpoint import load_official
from toolkit.engine import Engine
from toolkit.prompt import encode_refine_prompts
from toolkit.refine import RefineError, refine_params, refined_text
from toolkit.sampling import process_logits

FIXTURE = Path(__file__).parent / "fixtures" / "chattts_tiny"
ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-4
GREEDY = 1e-6  # a temperature this low leaves one token with any probability: the engine samples its argmax


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.fixture(scope="module")
def model():
    return load_official(FIXTURE)


@pytest.fixture(scope="module")
def synth(model):
    return Synthesizer(model, "cpu")


@pytest.fixture(scope="module")
def ref():
    return load_file(str(FIXTURE / "refine.safetensors"))


@pytest.fixture(scope="module")
def meta():
    return json.loads((FIXTURE / "refine.json").read_text())


CASES = ("plain", "prompt")


def greedy_ids(ref, case):
    return [[i for i in row.tolist() if i >= 0] for row in ref[f"{case}_ids"]]


@pytest.mark.parametrize("case", CASES)
def test_refine_prompt_ids_match_chattts(model, ref, meta, case):
    prompt = meta["cases"][case]["prompt"]
    ids, valid = model.tokenizer.encode([f"[Sbreak]{t}[Pbreak]{prompt}" for t in meta["texts"]])
    assert torch.equal(valid, ref[f"{case}_attention_mask"].bool())
    assert torch.equal(ids * valid, ref[f"{case}_input_ids"] * valid)
    emb, v = encode_refine_prompts(model, meta["texts"], prompt)
    assert torch.equal(v, valid) and torch.equal(emb[valid], model.gpt.emb_text(ids)[valid])
    assert model.tokenizer.token_id("[Ebreak]") == meta["eos_token"]


@pytest.mark.parametrize("case", CASES)
def test_text_head_logits_match_chattts(model, ref, meta, case):
    """The text head's logits at every step, teacher-forced on the package's greedy tokens, to 1e-4."""
    gpt = model.gpt
    emb, valid = encode_refine_prompts(model, meta["texts"], meta["cases"][case]["prompt"])
    ids = ref[f"{case}_ids"].clamp(min=0)  # every row ran all steps here (no [Ebreak]); -1 pads never read
    steps = ref[f"{case}_logits"].shape[0]
    x = torch.cat([emb, gpt.emb_text(ids[:, : steps - 1])], 1)
    h = gpt.forward_full(x, torch.cat([valid, torch.ones(len(ids), steps - 1, dtype=torch.bool)], 1))
    T = emb.shape[1]
    logits = gpt.text_logits(h[:, T - 1 :]).transpose(0, 1)  # (steps, B, V)
    assert logits.shape == ref[f"{case}_logits"].shape
    assert rel(logits, ref[f"{case}_logits"]) < TOL


@pytest.mark.parametrize("case", CASES)
def test_refine_processors_match_chattts(ref, meta, case):
    """Temperature 0.7, top-p 0.7, top-k 20 (3 kept at least) over the whole text vocabulary, as the package's
    refine applies them (no repetition penalty at RefineTextParams' 1.0)."""
    s = meta["sampling"]
    p = refine_params()
    assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty, p.min_keep, p.max_new_tokens) == (
        s["temperature"],
        s["top_p"],
        s["top_k"],
        s["repetition_penalty"],
        s["min_tokens_to_keep"],
        384,
    )
    logits = ref[f"{case}_logits"].flatten(0, 1)
    V = logits.shape[-1]
    history = torch.full((len(logits), p.penalty_window), V)
    out = process_logits(logits, history, p, torch.full((len(logits),), p.temperature))
    want = ref[f"{case}_proc_out"].flatten(0, 1)
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(out), finite)
    assert rel(out[finite], want[finite]) < TOL
    assert rel(logits / p.temperature, ref[f"{case}_proc_in"].flatten(0, 1)) < TOL


@pytest.mark.parametrize("case", CASES)
def test_greedy_refine_gives_the_packages_tokens_and_text(model, ref, meta, case):
    """ttsq's engine (static KV cache, batched with left padding) in text mode, greedy: the package's token ids,
    and the package's decoded text after its [break_0] filter."""
    c = meta["cases"][case]
    emb, valid = encode_refine_prompts(model, meta["texts"], c["prompt"])
    steps = ref[f"{case}_logits"].shape[0]
    gen = Engine(model.gpt).generate(
        emb, valid, refine_params(temperature=GREEDY, max_new_tokens=steps), text_eos=meta["eos_token"]
    )
    want = greedy_ids(ref, case)
    got = [gen.codes[j, : int(gen.lengths[j]), 0].tolist() for j in range(len(want))]
    assert got == want
    assert [refined_text(model.tokenizer, ids) for ids in got] == [t.strip() for t in c["refined"]]


def test_refine_stops_at_ebreak_and_bars_it_before_min_new_tokens(model, monkeypatch):
    """A text head that always prefers [Ebreak]: generation ends there (it is not part of the text), and never
    before min_new_tokens; a refine whose only token is the end gets a clear error, not an empty text."""
    eos = model.tokenizer.token_id("[Ebreak]")
    gpt = model.gpt
    head = gpt.text_logits
    bias = torch.zeros(gpt.cfg.num_text_tokens)
    bias[eos] = 1e4
    monkeypatch.setattr(gpt, "text_logits", lambda h: head(h) + bias)
    emb, valid = encode_refine_prompts(model, ["hello world."])
    gen = Engine(gpt).generate(emb, valid, refine_params(min_new_tokens=3, max_new_tokens=20), text_eos=eos)
    assert gen.finished.all() and gen.lengths.tolist() == [3]
    assert gen.codes[0, 3, 0] == eos and eos not in gen.codes[0, :3, 0].tolist()
    with pytest.raises(RefineError, match="no text"):
        Synthesizer(model, "cpu").refine_sentences(["hello world."], params=refine_params(max_new_tokens=20))


def test_batched_refine_equals_each_sentence_alone(model):
    """Padding a sentence into a batch changes none of its greedy tokens."""
    sentences = ["hello world, good morning!", "a much longer sentence about the weather today, rain or sunny."]
    p = refine_params(temperature=GREEDY, max_new_tokens=10)
    synth = Synthesizer(model, "cpu")
    both = synth.refine_sentences(sentences, params=p)
    alone = [synth.refine_sentences([s], params=p)[0] for s in sentences]
    assert both == alone and all(both)


def test_synthesize_and_stream_with_refine(synth):
    p = SamplingParams(max_new_tokens=12)
    rp = refine_params(max_new_tokens=10)
    text = "hello world, good morning!"
    want = synth.refine(text, params=rp, seed=2)[0]
    utt = synth.synthesize(
        text, params=p, seed=2, refine=True, refine_params=rp, refine_prompt="[oral_2][laugh_0][break_6]"
    )[0]
    assert utt.text != text and utt.wav.size == 512 * utt.steps - 256 and "refine" in utt.timings
    plain = synth.synthesize(text, params=p, seed=2, refine=True, refine_params=rp)[0]
    assert plain.text == want  # synthesize refines exactly as refine() does (same sentences, batches and seeds)
    pieces = list(synth.stream(text, params=p, seed=2, refine=True, refine_params=rp))
    np.testing.assert_allclose(np.concatenate(pieces), plain.wav, atol=1e-5 * max(1.0, np.abs(plain.wav).max()))
    # batching: three texts in one batch, each refined and spoken
    utts = synth.synthesize([text, "good night.", "thank you."], params=p, seed=2, refine=True, refine_params=rp)
    assert len(utts) == 3 and all(u.text and u.wav.size for u in utts)


def test_refine_bad_prompts_and_over_long_text(synth):
    with pytest.raises(RefineError, match="not a run of control tokens"):
        synth.refine("hello.", prompt="oral 2")
    with pytest.raises(RefineError, match=r"\[oral_11\]"):
        synth.refine("hello.", prompt="[oral_11]")
    long = "hello world " * 300  # one piece of ~600 tokens: the fixture GPT holds 512 positions
    with pytest.raises(ValueError, match="leaves no room"):
        synth.refine(long, max_chars=10_000, params=refine_params(max_new_tokens=4))


def test_shipped_voice_refuses_refine():
    """The shipped voice is ttsq's own small model: its text head was never trained, so refine is refused with a
    message saying so, before any work."""
    synth = Synthesizer(None, "cpu")
    with pytest.raises(RefineError, match="ChatTTS checkpoint"):
        synth.refine("hello.")
    with pytest.raises(RefineError, match="never trained|lacks"):
        synth.synthesize("hello.", refine=True)


def test_manifest_without_text_head_refuses_refine(tmp_path, model):
    """A ttsq folder whose manifest says text_head: false (what the voice trainer writes) is refused even with a
    ChatTTS tokenizer."""
    from toolkit.checkpoint import save_ttsq

    out = save_ttsq(model, tmp_path / "m", extra={"text_head": False})
    with pytest.raises(RefineError, match="text_head: false"):
        Synthesizer(out, "cpu").refine("hello.")
    assert Synthesizer(save_ttsq(model, tmp_path / "ok"), "cpu").refine(
        "hello.", params=refine_params(max_new_tokens=4)
    )[0]


def run_cli(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )


def test_cli_refine_and_synth_refine_on_an_official_folder(tmp_path, synth):
    r = run_cli(
        "refine",
        "hello world, good morning!",
        "--model",
        str(FIXTURE),
        "--max-steps",
        "10",
        "--seed",
        "2",
        "--device",
        "cpu",
    )
    assert r.returncode == 0, r.stderr
    assert (
        r.stdout.strip()
        == synth.refine("hello world, good morning!", seed=2, params=refine_params(max_new_tokens=10))[0]
    )
    wav = tmp_path / "out.wav"
    r = run_cli(
        "synth",
        "hello world.",
        "--model",
        str(FIXTURE),
        "--refine",
        "--refine-prompt",
        "[oral_2][laugh_0]",
        "--refine-max-steps",
        "8",
        "--max-steps",
        "10",
        "-o",
        str(wav),
        "--device",
        "cpu",
    )
    assert r.returncode == 0, r.stderr
    assert wav.is_file() and "refined: " in r.stdout


def test_cli_refine_errors_without_traceback():
    r = run_cli("refine", "hello.")  # the shipped voice
    assert r.returncode == 2 and "Traceback" not in r.stderr and "cannot refine" in r.stderr
    r = run_cli("refine", "hello.", "--model", str(FIXTURE), "--refine-prompt", "[nope_1]")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "[nope_1]" in r.stderr


@pytest.fixture(scope="module")
def edge_dir(tmp_path_factory):
    from toolkit.export import export_onnx

    return export_onnx(FIXTURE, "fp32", tmp_path_factory.mktemp("onnx") / "chattts_tiny")


def test_edge_runtime_refines_with_the_exported_text_head(edge_dir, ref, meta):
    """The export of an official folder holds text_head.onnx; the torch-free runtime's greedy refine gives the
    package's text, and synthesize/stream refine before speaking."""
    from toolkit.runtime import EdgeSynthesizer

    edge = EdgeSynthesizer(edge_dir, device="cpu")
    assert (edge_dir / "text_head.onnx").is_file()
    steps = ref["plain_logits"].shape[0]
    got = edge.refine_sentences(meta["texts"], params=refine_params(temperature=GREEDY, max_new_tokens=steps))
    assert got == [t.strip() for t in meta["cases"]["plain"]["refined"]]
    p, rp = SamplingParams(max_new_tokens=8), refine_params(max_new_tokens=6)
    utt = edge.synthesize("hello world.", params=p, refine=True, refine_params=rp, seed=1)[0]
    assert utt.text == edge.refine("hello world.", params=rp, seed=1)[0] and utt.wav.size == 512 * utt.steps - 256
    streamed = np.concatenate(list(edge.stream("hello world.", params=p, refine=True, refine_params=rp, seed=1)))
    assert streamed.shape == utt.wav.shape


def test_edge_runtime_without_a_text_head_says_so(edge_dir, tmp_path, tiny_dir):
    """An export made before refine existed (no text_head graph) names the fix; an export of a model that cannot
    refine has no text head at all."""
    import shutil

    from toolkit.export import export_onnx
    from toolkit.runtime import EdgeSynthesizer

    old = tmp_path / "old"
    shutil.copytree(edge_dir, old)
    m = json.loads((old / "onnx_manifest.json").read_text())
    del m["graphs"]["text_head"], m["files"]["text_head.onnx"]
    (old / "onnx_manifest.json").write_text(json.dumps(m))
    with pytest.raises(RefineError, match="no text_head.onnx.*export"):
        EdgeSynthesizer(old, device="cpu").refine("hello.")
    voice = export_onnx(tiny_dir, "fp32", tmp_path / "voice")
    assert not (voice / "text_head.onnx").exists()
    with pytest.raises(RefineError, match="cannot refine"):
        EdgeSynthesizer(voice, device="cpu").synthesize("hello.", refine=True)


def test_cli_synth_refine_on_an_export(edge_dir, tmp_path):
    wav = tmp_path / "edge.wav"
    r = run_cli(
        "synth",
        "hello world.",
        "--model",
        str(edge_dir),
        "--refine",
        "--refine-max-steps",
        "6",
        "--max-steps",
        "8",
        "-o",
        str(wav),
        "--device",
        "cpu",
    )
    assert r.returncode == 0, r.stderr
    assert wav.is_file() and "refined: " in r.stdout
    r = run_cli("refine", "hello world.", "--model", str(edge_dir), "--max-steps", "6", "--device", "cpu")
    assert r.returncode == 0 and r.stdout.strip(), r.stderr


def test_gui_refine_checkbox_shows_the_refined_text(qtbot, tmp_path, tiny_dir, monkeypatch):
    pytest.importorskip("PySide6.QtCharts")
    from PySide6.QtCore import QSettings

    from gui.window import MainWindow
    from toolkit import refine as refine_module

    monkeypatch.setitem(refine_module.REFINE_DEFAULTS, "max_new_tokens", 6)  # the GUI refines with ChatTTS's
    w = MainWindow(QSettings(str(tmp_path / "gui.ini"), QSettings.IniFormat), model=str(FIXTURE), device="cpu")
    qtbot.addWidget(w)
    w.text.setPlainText("hello world.")
    w.max_steps.setValue(8)
    for box in (w.dnsmos, w.asr, w.ttfa):
        box.setChecked(False)
    w.set_precisions(["fp32"])
    assert not w.refine_prompt.isEnabled()
    w.refine.setChecked(True)
    assert w.refine_prompt.isEnabled()
    w.refine_prompt.setText("[oral_2][laugh_0]")
    job = w.make_job()
    assert job.refine and job.refine_prompt == "[oral_2][laugh_0]"
    w.synthesize()
    qtbot.waitUntil(lambda: not w.busy(), timeout=120_000)
    assert w.error_box is None, w.error_box.text()
    res = w.results["fp32"]
    want = Synthesizer(FIXTURE, "cpu").refine("hello world.", prompt="[oral_2][laugh_0]")[0]
    assert res["refined"] == want
    view = w.tabs.currentWidget()
    assert view.refined.text() == f"refined: {want}" and not view.refined.isHidden()
    # the shipped-voice-like tiny model cannot refine: the dialog says why
    w.set_model(str(tiny_dir))
    w.synthesize()
    qtbot.waitUntil(lambda: not w.busy(), timeout=120_000)
    assert w.error_box is not None and "cannot refine" in w.error_box.text()
    w.wait_for_workers()

"""ONNX export (toolkit.export), its quantized variants and the torch-free runtime (toolkit.runtime),
on the tiny random model. Parity target: exported FP32 within 1e-4 (relative to the reference's peak) of torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


@pytest.fixture(scope="module")
def fp32_dir(tiny_dir, tmp_path_factory):
    from toolkit.export import export_onnx

    return export_onnx(tiny_dir, "fp32", tmp_path_factory.mktemp("onnx") / "fp32")


@pytest.fixture(scope="module")
def edge(fp32_dir):
    from toolkit.runtime import EdgeSynthesizer

    return EdgeSynthesizer(fp32_dir, threads=2)


def test_manifest_and_files(fp32_dir, tiny_dir):
    m = json.loads((fp32_dir / "onnx_manifest.json").read_text())
    assert m["format"] == "ttsq-onnx" and m["precision"] == "fp32" and m["opset"] == 17
    assert {"gpt.onnx", "decoder.onnx", "vocos.onnx", "tokenizer.json", "spk_stat.npy", "voices/alice.npy"} <= set(
        m["files"]
    )
    gpt = m["graphs"]["gpt"]
    assert [i["name"] for i in gpt["inputs"]][:6] == [
        "ids",
        "text_mask",
        "speaker",
        "spk_mask",
        "rope_pos",
        "key_valid",
    ]
    assert gpt["inputs"][6]["shape"] == ["batch", 4, "past", 16] and gpt["outputs"][0]["dtype"] == "float32"
    assert m["voices"] == {"alice": "voices/alice.npy"} and m["sampling"]["penalty_window"] == 16
    from toolkit.export import export_onnx
    from toolkit.fileio import OutputExistsError

    with pytest.raises(OutputExistsError):
        export_onnx(tiny_dir, "fp32", fp32_dir)
    with pytest.raises(ValueError, match="unknown export precision"):
        export_onnx(tiny_dir, "int3", fp32_dir.parent / "x")


def test_gpt_parity_prefill_and_steps(tiny_synth, edge):
    """Prefill (batch 2, left padding, speaker placed) then cached steps fed fixed codes, against torch
    teacher forcing (forward_full) on the same sequence."""
    from toolkit.prompt import encode_prompts

    model, gpt = tiny_synth.model, tiny_synth.model.gpt
    sentences = ["hello there, world.", "hi."]
    spk = tiny_synth.speaker_vector("alice")
    emb, valid = encode_prompts(model, sentences, spk)
    ids, valid_np = edge.encode(sentences)
    assert np.array_equal(valid_np, valid.numpy())
    B, T = valid.shape
    n = 6
    codes = torch.randint(0, 625, (B, n, 4))
    with torch.inference_mode():
        x = torch.cat([emb, gpt.embed_codes(codes)], 1)
        h_ref = gpt.forward_full(x, torch.cat([valid, torch.ones(B, n, dtype=torch.bool)], 1))
        ref = gpt.code_logits(h_ref[:, T - 1 :]).numpy()  # (B, n + 1, Q, V)
    # the runtime's own loop, fed the same codes instead of sampling
    eng = edge.engine
    import onnxruntime as ort

    past = [ort.OrtValue.ortvalue_from_numpy(np.zeros((B, 4, 0, 16), np.float32)) for _ in range(2 * eng.L)]
    spk_ids = ids == edge.tokenizer.token_id("[spk_emb]")
    rope = np.maximum(np.cumsum(valid_np, 1) - 1, 0)
    logits, h, past = eng._run(
        {
            "ids": np.repeat(ids[..., None], 4, 2),
            "text_mask": np.ones((B, T), bool),
            "speaker": np.repeat(edge.speaker_vector("alice")[None], B, 0),
            "spk_mask": spk_ids,
            "rope_pos": rope,
            "key_valid": valid_np,
        },
        past,
    )
    got, hid = [logits], [h]
    kv = valid_np
    for i in range(n):
        kv = np.concatenate([kv, np.ones((B, 1), bool)], 1)
        logits, h, past = eng._run(
            {
                "ids": codes[:, i : i + 1].numpy(),
                "text_mask": np.zeros((B, 1), bool),
                "speaker": np.zeros((B, 64), np.float32),
                "spk_mask": np.zeros((B, 1), bool),
                "rope_pos": valid_np.sum(1, keepdims=True) + i,
                "key_valid": kv,
            },
            past,
        )
        got.append(logits)
        hid.append(h)
    assert rel(np.stack(got, 1), ref) < 1e-4
    assert rel(np.stack(hid, 1), h_ref[:, T - 1 :].numpy()) < 1e-4


def test_decoder_vocos_and_stream_parity(tiny_synth, edge):
    from toolkit.runtime.dsp import istft

    model = tiny_synth.model
    hidden = torch.randn(1, 23, 64)
    with torch.inference_mode():
        mel = model.hidden_to_mel(hidden)
        wav = model.mel_to_wav(mel)[0].numpy()
        full = tiny_synth.decode(hidden, torch.tensor([23]))[0][0]
    mel_x = edge.sessions.decoder.run(None, {"hidden": hidden.numpy()})[0]
    assert rel(mel_x, mel.numpy()) < 1e-4
    real, imag = edge.sessions.vocos.run(None, {"mel": mel.numpy()})
    assert rel(istft(real[0], imag[0], 1024, 256), wav) < 1e-4
    got, _, _ = edge.decode(hidden[0].numpy(), 23)
    assert got.shape == full.shape and rel(got, full) < 1e-4
    r = edge.renderer()  # streaming in uneven pieces equals the whole decode
    pieces = [r.push(hidden[0, a:b].numpy()) for a, b in ((0, 5), (5, 6), (6, 17), (17, 23))] + [r.finish()]
    assert rel(np.concatenate(pieces), got) < 1e-5


def test_speakers_match_torch(tiny_synth, edge):
    for s in (0, 7, "seed:42"):
        assert np.abs(edge.speaker_vector(s) - tiny_synth.speaker_vector(s).numpy()).max() < 1e-5
    assert np.array_equal(edge.speaker_vector("alice"), tiny_synth.speaker_vector("alice").numpy())
    with pytest.raises(ValueError, match="unknown speaker"):
        edge.speaker_vector("bob")


def test_speaker_strings_and_samples_match_torch(tiny_synth, edge, tmp_path):
    """The runtime reads ChatTTS speaker strings, chattts-seed:N and sample-audio speakers as the torch side does."""
    from toolkit.prompt import encode_prompts
    from toolkit.runtime import SamplingParams
    from toolkit.speakers import SampleSpeaker, encode_vector

    vec = np.random.default_rng(3).standard_normal(64).astype(np.float16)
    string = encode_vector(vec)
    np.save(tmp_path / "v.npy", vec)
    for s in (string, "chattts-seed:2222", str(tmp_path / "v.npy")):
        assert np.array_equal(edge.speaker_vector(s), tiny_synth.speaker_vector(s).numpy()), s
    sample = SampleSpeaker(np.random.default_rng(4).integers(0, 625, (4, 9)), "hello")
    voice = tiny_synth.voice(sample)
    emb, valid = encode_prompts(tiny_synth.model, ["good day."], voice)
    want = tiny_synth.model.gpt.forward_full(emb, valid)[0, -1]
    spk, codes, text = edge.voice(sample)
    assert spk is None and text == "hello"
    ids, ok = edge.encode(["good day."], text, speaker=False)
    chunk = next(
        edge.engine.stream(ids, ok, np.zeros((1, 64), np.float32), None, SamplingParams(max_new_tokens=1), sample=codes)
    )
    assert rel(chunk.hidden[0, 0], want.numpy()) < 1e-4
    assert edge.synthesize("good day.", speaker=sample, params=SamplingParams(max_new_tokens=4))[0].steps > 0


def test_sampling_matches_torch():
    from toolkit.runtime.sampling import SamplingParams as NP
    from toolkit.runtime.sampling import process_logits as np_pl
    from toolkit.sampling import SamplingParams, process_logits

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 626, generator=g) * 3
    hist = torch.randint(0, 627, (8, 16), generator=g)
    temp = torch.full((8,), 0.3)
    for kw in ({}, {"top_p": 1.0}, {"top_k": 626, "top_p": 0.9}, {"repetition_penalty": 1.3}):
        ref = process_logits(logits, hist, SamplingParams(**kw), temp).numpy()
        got = np_pl(logits.numpy(), hist.numpy(), NP(**kw), temp.numpy())
        assert np.array_equal(np.isinf(ref), np.isinf(got))
        fin = np.isfinite(ref)
        assert np.allclose(ref[fin], got[fin], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precision", ["fp16", "int8", "int8-calib", "int4", "int4-hqq-b128"])
def test_quantized_exports_run(precision, tiny_dir, edge, tmp_path):
    from toolkit.export import export_onnx
    from toolkit.runtime import EdgeSynthesizer, SamplingParams

    calib = ROOT / "calibration_sets" / "smoke.jsonl" if precision == "int8-calib" else None
    out = export_onnx(
        tiny_dir, precision.removesuffix("-calib"), tmp_path / precision, calib_set=calib, calib_limit=2, calib_steps=12
    )
    m = json.loads((out / "onnx_manifest.json").read_text())
    q = m["graphs"]["gpt"]["quantization"]["method"]
    assert (
        q
        == {"fp16": "convert_float_to_float16", "int8": "quantize_dynamic", "int4": "MatMulNBitsQuantizer"}[
            precision[:4]
        ]
    )
    import onnx

    g = onnx.load(str(out / "gpt.onnx")).graph
    ops = {n.op_type for n in g.node}
    if precision.startswith("int8"):
        assert "MatMulInteger" in ops
    elif precision.startswith("int4"):
        assert sum(n.op_type == "MatMulNBits" for n in g.node) == 2 * 4 + 1  # 4 per layer + the code head
    else:
        assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in g.initializer)
    if calib:
        ops = {n.op_type for n in onnx.load(str(out / "decoder.onnx")).graph.node}
        assert "QuantizeLinear" in ops and "DequantizeLinear" in ops
        assert m["graphs"]["decoder"]["quantization"]["method"] == "quantize_static" and m["calibration"]["texts"] == 2
    synth = EdgeSynthesizer(out, threads=2)
    hidden = np.random.default_rng(0).standard_normal((12, 64)).astype(np.float32)
    wav, _, _ = synth.decode(hidden, 12)
    ref, _, _ = edge.decode(hidden, 12)
    assert wav.shape == ref.shape and np.isfinite(wav).all()
    assert rel(wav, ref) < 0.5  # random weights amplify quantization error; quality is scored in the benchmark
    utt = synth.synthesize("hello.", seed=1, params=SamplingParams(max_new_tokens=8))[0]
    assert np.isfinite(utt.wav).all() and utt.steps <= 8


BLOCKED = ("torch", "tokenizers", "onnx", "onnxscript", "torchao", "librosa")


def test_runtime_without_torch(fp32_dir, tmp_path):
    """The runtime and `ttsq synth --model EXPORTED` in a process where importing torch, tokenizers or the
    export-only packages raises: the edge runtime needs only numpy, soundfile and onnxruntime. The stubs also
    log each attempt, so an import that is tried and silently skipped fails the test too."""
    log = tmp_path / "attempts.log"
    for name in BLOCKED:
        (tmp_path / "stub" / name).mkdir(parents=True)
        (tmp_path / "stub" / name / "__init__.py").write_text(
            f"open({str(log)!r}, 'a').write({name!r} + '\\n')\nraise ImportError('{name} is blocked in this test')\n"
        )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "stub"), str(ROOT)])}
    code = (
        "from toolkit.runtime import EdgeSynthesizer, SamplingParams\n"
        f"s = EdgeSynthesizer({str(fp32_dir)!r}, threads=2)\n"
        "u = s.synthesize('hello there.', speaker='seed:3', seed=2, params=SamplingParams(max_new_tokens=10))[0]\n"
        "pieces = list(s.stream('hi.', seed=2, params=SamplingParams(max_new_tokens=10)))\n"
        "assert u.wav.size > 0 and sum(p.size for p in pieces) > 0\n"
        "print('ok', u.steps)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]
    wav = tmp_path / "out.wav"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolkit.cli",
            "synth",
            "hello.",
            "-o",
            str(wav),
            "--model",
            str(fp32_dir),
            "--max-steps",
            "10",
            "--speaker",
            "alice",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ONNX fp32" in r.stdout and wav.stat().st_size > 44
    assert not log.exists(), f"the edge runtime tried to import {sorted(set(log.read_text().split()))}"


def test_cli_export(tiny_dir, tmp_path):
    from toolkit.cli import main

    assert main(["export", "--model", str(tiny_dir), "--precision", "int8", "--out", str(tmp_path / "e")]) == 0
    assert (tmp_path / "e" / "onnx_manifest.json").is_file()
    assert main(["export", "--model", str(tiny_dir), "--precision", "int8", "--out", str(tmp_path / "e")]) == 2


def test_gui_worker_runs_an_exported_folder(fp32_dir):
    """The GUI's model picker accepts an export folder: its worker drives the torch-free runtime."""
    pytest.importorskip("PySide6")
    from gui.workers import _load_onnx, model_kind
    from toolkit import SamplingParams

    assert model_kind(str(fp32_dir))[0] == "onnx"
    synth = _load_onnx(str(fp32_dir), "cpu")
    u = synth.synthesize("hello world.", params=SamplingParams(max_new_tokens=12), seed=1)[0]
    assert u.wav.shape == (512 * u.steps - 256,) and np.isfinite(u.wav).all()
    assert next(iter(synth.stream("hello world.", params=SamplingParams(max_new_tokens=64)))).size > 0

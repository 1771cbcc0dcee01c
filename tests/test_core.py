"""Loading both layouts (and how they fail), the pipeline on the tiny model, text handling, the CLI."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from toolkit import SamplingParams, Synthesizer, load_model
from toolkit.checkpoint import CheckpointError, load_official, save_ttsq
from toolkit.text import TextError, normalize, prompt_text, split_sentences

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "chattts_tiny"
SHORT = SamplingParams(max_new_tokens=12)


# --- tokenizer and text -----------------------------------------------------------------------
def test_tokenizer_left_pads_and_keeps_control_tokens(tiny_synth):
    tok = tiny_synth.model.tokenizer
    ids, valid = tok.encode(["[Stts][spk_emb]hi[laugh][Ptts]", "[Stts][spk_emb]hello world[Ptts]"])
    assert ids.shape == valid.shape and ids.shape[0] == 2
    assert not valid[0, 0] and valid[0, -1] and valid[1].all()  # left padding
    assert tok.token_id("[laugh]") in ids[0].tolist()
    assert tok.decode(ids[1][valid[1]].tolist()).replace(" ", "").startswith("[Stts][spk_emb]")


def test_text_normalization_and_splitting():
    with pytest.raises(TextError, match="empty"):
        normalize("   \n\t ")
    with pytest.raises(TextError, match="empty"):
        normalize("[laugh] [uv_break]", control_tokens=True)
    long = "This is one sentence. " * 40
    pieces = split_sentences(normalize(long), max_chars=120)
    assert all(len(p) <= 120 for p in pieces)
    assert "".join(pieces).replace(" ", "") == long.replace(" ", "")  # nothing dropped
    cjk = "我们" * 200
    assert "".join(split_sentences(cjk, 50)) == cjk


def test_control_tokens_are_text_unless_asked(tiny_synth):
    assert normalize("ha [laugh] ok") == "ha [ laugh ] ok"
    assert normalize("ha [laugh] ok", control_tokens=True) == "ha [laugh] ok"
    assert normalize("a [Stts] b", control_tokens=True) == "a [ Stts ] b"  # structural tokens: never the user's
    assert normalize(normalize("x [uv_break] y")) == normalize("x [uv_break] y")
    tok = tiny_synth.model.tokenizer
    laugh = tok.token_id("[laugh]")
    as_text, _ = tok.encode([prompt_text(normalize("ha [laugh]"), tok.has)])
    as_control, _ = tok.encode([prompt_text(normalize("ha [laugh]", control_tokens=True), tok.has)])
    assert laugh not in as_text[0].tolist() and laugh in as_control[0].tolist()
    assert tok.token_id("[Stts]") in as_text[0].tolist()  # the prompt's own tokens are still placed


# --- loading -----------------------------------------------------------------------------------
def test_official_and_ttsq_layouts_agree(tmp_path):
    official = load_official(FIXTURE)
    saved = save_ttsq(official, tmp_path / "converted")
    manifest = json.loads((saved / "manifest.json").read_text())
    assert manifest["format"] == "ttsq" and set(manifest["files"]) == {"model.safetensors", "tokenizer.json"}
    reloaded = load_model(saved)
    for (k, a), (k2, b) in zip(official.state_dict().items(), reloaded.state_dict().items()):
        assert k == k2 and torch.equal(a, b), k


def copy_fixture(tmp_path) -> Path:
    dst = tmp_path / "chattts"
    shutil.copytree(FIXTURE / "asset", dst / "asset")
    return dst


def test_official_missing_file(tmp_path):
    root = copy_fixture(tmp_path)
    (root / "asset" / "Vocos.safetensors").unlink()
    with pytest.raises(CheckpointError, match="Vocos"):
        load_official(root)


def test_official_wrong_shape_and_extra_keys_listed_together(tmp_path):
    from safetensors.torch import load_file, save_file

    root = copy_fixture(tmp_path)
    f = root / "asset" / "Decoder.safetensors"
    state = load_file(str(f))
    state["decoder.conv_in.0.weight"] = torch.zeros(3, 3, 3)
    state["surprise.weight"] = torch.zeros(2)
    save_file(state, str(f))
    with pytest.raises(CheckpointError) as e:
        load_official(root)
    msg = str(e.value)
    assert "wrong shape" in msg and "decoder.conv_in.0.weight" in msg and "unexpected" in msg and "surprise" in msg


def test_official_truncated_file_is_named_and_untouched(tmp_path):
    root = copy_fixture(tmp_path)
    f = root / "asset" / "Embed.safetensors"
    f.write_bytes(f.read_bytes()[:1000])
    before = sorted(p.name for p in (root / "asset").iterdir())
    with pytest.raises(CheckpointError, match="Embed.safetensors.*corrupt, truncated"):
        load_official(root)
    assert sorted(p.name for p in (root / "asset").iterdir()) == before  # never renamed to .bak


def test_pt_with_code_is_refused(tmp_path):
    from toolkit.checkpoint import read_tensors

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > " + str(tmp_path / "pwned"),))

    torch.save({"x": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match="holds code"):
        read_tensors(tmp_path / "evil.pt")
    assert not (tmp_path / "pwned").exists()


def test_ttsq_missing_and_corrupt(tiny_dir, tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_model(tmp_path / "nope")
    bad = tmp_path / "bad"
    shutil.copytree(tiny_dir, bad)
    (bad / "model.safetensors").write_bytes((bad / "model.safetensors").read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="truncated"):
        load_model(bad)
    (bad / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing"):
        load_model(bad)


def test_save_never_overwrites_unasked(tiny_dir, tmp_path):
    model = load_model(tiny_dir)
    out = save_ttsq(model, tmp_path / "m")
    marker = (out / "manifest.json").read_text()
    with pytest.raises(FileExistsError, match="--force"):
        save_ttsq(model, out)
    assert (out / "manifest.json").read_text() == marker
    save_ttsq(model, out, force=True)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folders left


def test_save_fp16_weights_halve_the_file_and_load_back_as_fp32(tiny_dir, tmp_path):
    model = load_model(tiny_dir)
    full = save_ttsq(model, tmp_path / "fp32")
    half = save_ttsq(model, tmp_path / "fp16", weights_dtype=torch.float16)
    size = lambda d: (d / "model.safetensors").stat().st_size  # noqa: E731
    assert 0.45 < size(half) / size(full) < 0.55
    assert json.loads((half / "manifest.json").read_text())["weights_dtype"] == "float16"
    back = load_model(half)
    w, w_back = model.gpt.state_dict(), back.gpt.state_dict()
    for k, v in w.items():
        if v.is_floating_point():
            assert w_back[k].dtype == torch.float32
            assert torch.equal(w_back[k], v.half().float()), k
    model.gpt.norm.weight.data[0] = 1e5  # past fp16's range: refused, not stored as inf
    with pytest.raises(ValueError, match="gpt.norm.weight.*float16"):
        save_ttsq(model, tmp_path / "overflow", weights_dtype=torch.float16)
    assert not (tmp_path / "overflow").exists()


# --- pipeline ----------------------------------------------------------------------------------
def test_pipeline_shapes_lengths_and_reproducibility(tiny_synth):
    texts = ["hello world.", "你好世界，今天天气很不错。 we go!"]
    a = tiny_synth.synthesize(texts, seed=5, params=SHORT)
    b = tiny_synth.synthesize(texts, seed=5, params=SHORT)
    c = tiny_synth.synthesize(texts, seed=6, params=SHORT)
    for u in a:
        assert u.sample_rate == 24000 and u.wav.dtype == np.float32 and np.isfinite(u.wav).all()
        assert u.steps >= 1
    assert a[0].wav.shape == (512 * a[0].steps - 256,)
    assert all(np.array_equal(x.wav, y.wav) for x, y in zip(a, b))
    assert not all(np.array_equal(x.wav, y.wav) for x, y in zip(a, c))


def test_eos_in_any_codebook_stops_generation(tiny_synth, monkeypatch):
    """EOS forced on codebook 2 only: generation ends right after min_new_tokens, the EOS step not counted."""
    gpt = tiny_synth.model.gpt
    original = gpt.code_logits

    def eos_on_book_2(h):
        logits = original(h).clone()
        logits[..., 2, gpt.cfg.eos_code] += 1e4
        return logits

    monkeypatch.setattr(gpt, "code_logits", eos_on_book_2)
    u = tiny_synth.synthesize(
        ["hello.", "a longer one, to be padded."], params=SamplingParams(max_new_tokens=64, min_new_tokens=3), seed=0
    )
    assert [x.steps for x in u] == [3, 3] and not any(x.hit_limit for x in u)
    assert all(x.wav.shape == (512 * 3 - 256,) for x in u)


def test_batching_pads_without_changing_lengths(tiny_synth):
    u = tiny_synth.synthesize(["hi.", "a much longer sentence to pad against."], params=SHORT, seed=1)
    assert all(x.wav.shape == (512 * x.steps - 256,) for x in u)


def test_speakers(tiny_synth):
    v = tiny_synth.speaker_vector
    assert torch.equal(v(3), v("seed:3")) and not torch.equal(v(3), v(4))
    assert torch.equal(v("alice"), tiny_synth.model.voices["alice"])
    with pytest.raises(ValueError, match="unknown speaker"):
        v("bob")
    with pytest.raises(ValueError, match="shape"):
        v(torch.zeros(3))


def test_the_default_voice_is_kept_through_save_quantize_and_export(tmp_path):
    """A synthesis given no speaker uses the model's default voice, written in the manifest (safetensors sorts
    keys): after a reload, in a quantized artifact and in the ONNX runtime."""
    from conftest import make_tiny_model

    from toolkit.export import export_onnx
    from toolkit.precision import quantize
    from toolkit.precision.artifact import save_artifact
    from toolkit.runtime import EdgeSynthesizer

    model = make_tiny_model(tmp_path / "src")
    D = model.cfg.gpt.hidden
    model.voices = {"zed": torch.randn(D), "alice": torch.randn(D)}  # "alice" sorts first
    folder = save_ttsq(model, tmp_path / "model")
    assert json.loads((folder / "manifest.json").read_text())["default_voice"] == "zed"
    want = model.voices["zed"]
    assert torch.equal(Synthesizer(folder, "cpu").speaker_vector(None), want)
    quantize(model, "bf16", device="cpu")
    artifact = save_artifact(model, tmp_path / "bf16")
    assert torch.equal(Synthesizer(artifact, "cpu").speaker_vector(None), model.voices["zed"].float())
    edge = EdgeSynthesizer(export_onnx(folder, "fp32", tmp_path / "onnx"), threads=1)
    assert np.array_equal(edge.speaker_vector(None), want.numpy())
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "default_voice": "bob"}))
    with pytest.raises(CheckpointError, match="default voice 'bob'.*'alice', 'zed'"):
        load_model(folder)


def test_bad_inputs(tiny_synth):
    with pytest.raises(TextError):
        tiny_synth.synthesize("   ")
    with pytest.raises(TextError):
        tiny_synth.synthesize([])
    with pytest.raises(RuntimeError, match="CUDA"):
        Synthesizer(tiny_synth.model, "cuda:7" if not torch.cuda.is_available() else "cuda:99")


# --- CLI ---------------------------------------------------------------------------------------
def ttsq(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def test_cli_synth_info_and_errors(tiny_dir, tmp_path):
    out = tmp_path / "out.wav"
    r = ttsq(
        "synth",
        "hello world.",
        "-o",
        str(out),
        "--model",
        str(tiny_dir),
        "--device",
        "cpu",
        "--seed",
        "3",
        "--max-steps",
        "10",
    )
    assert r.returncode == 0, r.stderr
    data, sr = sf.read(out)
    assert sr == 24000 and data.ndim == 1 and len(data) > 0 and np.isfinite(data).all()
    r = ttsq("synth", "again", "-o", str(out), "--model", str(tiny_dir), "--max-steps", "4")
    assert r.returncode == 2 and "already exists" in r.stderr and "--force" in r.stderr
    r = ttsq("synth", "  ", "-o", str(tmp_path / "x.wav"), "--model", str(tiny_dir))
    assert r.returncode == 2 and "empty" in r.stderr and "Traceback" not in r.stderr
    r = ttsq("synth", "hi", "-o", str(tmp_path / "y.wav"), "--model", str(tmp_path / "missing"))
    assert r.returncode == 2 and "not found" in r.stderr and "Traceback" not in r.stderr
    r = ttsq("synth", "hi", "-o", str(tmp_path / "no" / "dir.wav"), "--model", str(tiny_dir), "--max-steps", "4")
    assert r.returncode == 2 and "does not exist" in r.stderr and "sentences" not in r.stderr  # said before speaking
    r = ttsq("synth", "hi", "-o", str(tmp_path), "--model", str(tiny_dir), "--max-steps", "4")
    assert r.returncode == 2 and "is a folder" in r.stderr and "sentences" not in r.stderr
    r = ttsq("info", str(tiny_dir), "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["layout"] == "ttsq" and info["parameters_total"] > 0
    assert info["voices"] == ["alice"] == [info["default_voice"]]
    r = ttsq("info", str(FIXTURE))
    assert r.returncode == 0 and "chattts" in r.stdout


def test_streaming_equals_whole_decode_without_redecoding(tiny_synth, monkeypatch):
    p = SamplingParams(max_new_tokens=150)
    text = "streaming should match the whole decode."
    full = tiny_synth.synthesize(text, seed=4, params=p)[0]
    model = tiny_synth.model
    fed = []
    original = model.hidden_to_mel
    monkeypatch.setattr(model, "hidden_to_mel", lambda h: (fed.append(h.shape[1]), original(h))[1])
    pieces = list(tiny_synth.stream(text, seed=4, params=p))
    stream = np.concatenate(pieces)
    assert stream.shape == full.wav.shape
    np.testing.assert_allclose(stream, full.wav, atol=1e-5 * max(1.0, np.abs(full.wav).max()))
    assert len(pieces) >= full.steps // 16 - 4  # audio arrives chunk by chunk, not at the end
    # each render reads only its chunk plus the receptive-field margins: linear, not quadratic, work
    margin = model.decoder.receptive_radius + model.vocos.receptive_radius + 8
    assert sum(fed) <= full.steps + len(fed) * margin
    assert len(fed) >= 3 and max(fed) <= 16 + margin + 4


def test_concurrent_requests_are_batched(tiny_synth, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    from toolkit.batching import BatchingSynthesizer

    calls = []
    original = tiny_synth.synthesize
    monkeypatch.setattr(
        tiny_synth, "synthesize", lambda texts, **kw: (calls.append(len(texts)), original(texts, **kw))[1]
    )
    batcher = BatchingSynthesizer(tiny_synth, max_batch=8, wait_s=0.2)
    p = SamplingParams(max_new_tokens=6)
    with ThreadPoolExecutor(6) as pool:
        futures = list(pool.map(lambda i: batcher.submit(f"request {i}.", params=p), range(6)))
    utts = [f.result(timeout=120) for f in futures]
    bad = batcher.submit("   ", params=p)
    with pytest.raises(TextError):
        bad.result(timeout=60)
    batcher.close()
    assert all(np.isfinite(u.wav).all() and u.steps > 0 for u in utts)
    assert len(calls) < 6 and max(calls) > 1  # fewer synthesize calls than requests


def test_cache_growth_keeps_decoding_exact(tiny_synth):
    """300 steps cross the 256-slot cache bucket: every state the engine produced equals a teacher-forced
    forward over the same prompt and codes."""
    from toolkit.engine import CACHE_BUCKET, Engine
    from toolkit.prompt import encode_prompts

    model = tiny_synth.model
    emb, valid = encode_prompts(model, ["grow the cache please."], tiny_synth.speaker_vector(0))
    engine = Engine(model.gpt)
    gen = engine.generate(emb, valid, SamplingParams(max_new_tokens=300, min_new_tokens=300), seed=0)
    assert model.gpt.cache_shape[1] > CACHE_BUCKET and gen.hidden.shape[1] == 300
    full = torch.cat([emb, model.gpt.embed_codes(gen.codes)], 1)
    ok = torch.cat([valid, torch.ones(1, 300, dtype=torch.bool)], 1)
    with torch.inference_mode():
        ref = model.gpt.forward_full(full, ok)[:, emb.shape[1] - 1 : emb.shape[1] + 299]
    torch.testing.assert_close(gen.hidden, ref, rtol=1e-4, atol=1e-4)


def test_compiled_decode_step_matches_eager(tiny_synth):
    """Engine(compile=True) (the fast GPU path, here torch.compile on the CPU) samples the same codes as the plain
    engine for the same seed, across a cache growth, and its hidden states agree to float rounding."""
    import torch._dynamo

    from toolkit.engine import Engine
    from toolkit.prompt import encode_prompts

    model = tiny_synth.model
    emb, valid = encode_prompts(model, ["compile me.", "and me, a little longer."], tiny_synth.speaker_vector(0))
    params = SamplingParams(max_new_tokens=270, min_new_tokens=270)
    plain = Engine(model.gpt).generate(emb, valid, params, seed=3)
    torch._dynamo.reset()
    try:
        fast = Engine(model.gpt, compile=True).generate(emb, valid, params, seed=3)
    finally:
        torch._dynamo.reset()
    assert torch.equal(fast.codes, plain.codes)
    torch.testing.assert_close(fast.hidden, plain.hidden, rtol=1e-4, atol=1e-4)


def test_compiled_engine_prefills_int8_weight_only_models_through_the_plain_block():
    """With compile=True an int8 weight-only model prefills through the uncompiled block (inductor's int8 matmul
    made the H200's prefill 3.6x slower, benchmarks/README.md); other models through the compiled one. The int8
    prefill gives the plain engine's states."""
    pytest.importorskip("torchao")
    from toolkit.bench import random_model
    from toolkit.engine import Engine
    from toolkit.models.gpt import call_block
    from toolkit.precision import quantize

    cpu = torch.device("cpu")
    plain = Engine(random_model("tiny", cpu).gpt, compile=True)
    assert plain._prefill_block is plain._run_block and plain._run_block is not call_block
    model = random_model("tiny", cpu)
    quantize(model, "int8", device=cpu)
    compiled = Engine(model.gpt, compile=True)
    assert compiled._prefill_block is call_block
    gpt = model.gpt
    gpt.setup_caches(1, 32)
    gpt.key_valid.fill_(True)
    emb = torch.randn(1, 6, gpt.cfg.hidden, generator=torch.Generator().manual_seed(0))
    rope = torch.arange(6)[None]
    got = compiled._prefill_runner(1, 6, emb.dtype, cpu)(emb, rope)
    want = Engine(gpt)._prefill_runner(1, 6, emb.dtype, cpu)(emb, rope)
    assert torch.equal(got, want)


def test_engine_keeps_a_bounded_number_of_step_buffers(tiny_synth):
    """Per-request sampling settings must not pile up graphs or buffers without end: least recently used go."""
    from toolkit.engine import MAX_GRAPHS, Engine
    from toolkit.prompt import encode_prompts

    model = tiny_synth.model
    emb, valid = encode_prompts(model, ["settings vary."], tiny_synth.speaker_vector(0))
    engine = Engine(model.gpt)
    first = engine.generate(emb, valid, SamplingParams(max_new_tokens=8, top_k=1), seed=0)
    for k in range(2, MAX_GRAPHS + 8):
        engine.generate(emb, valid, SamplingParams(max_new_tokens=8, top_k=k), seed=0)
    assert len(engine._states) == MAX_GRAPHS
    again = engine.generate(emb, valid, SamplingParams(max_new_tokens=8, top_k=1), seed=0)  # rebuilt after eviction
    assert torch.equal(again.codes, first.codes)


def test_first_streamed_audio_comes_at_the_earliest_step_it_can(tiny_synth):
    """The engine hands over the states once the renderer's first samples are final (not at the next multiple of
    the chunk), and doing so changes no sampled code."""
    from toolkit.engine import Engine
    from toolkit.plan import render_stream
    from toolkit.prompt import encode_prompts
    from toolkit.streaming import StreamRenderer

    model = tiny_synth.model
    emb, valid = encode_prompts(model, ["first audio, as early as it can be."], tiny_synth.speaker_vector(0))
    params = SamplingParams(max_new_tokens=120, min_new_tokens=120)
    probe = StreamRenderer(model)
    k = probe.first_audio_step
    engine = Engine(model.gpt)
    assert k % engine.chunk  # the test needs a first audio step inside a chunk
    plain = engine.generate(emb, valid, params, seed=5)
    assert probe.push(plain.hidden[0, : k - 1]).size == 0  # one state fewer gives no final sample
    assert StreamRenderer(model).push(plain.hidden[0, :k]).size > 0
    chunks = list(engine.stream(emb, valid, params, seed=5, first_yield=k))
    assert sum(c.hidden.shape[1] for c in chunks if c.start < k) == k and any(
        c.start + c.hidden.shape[1] == k for c in chunks
    )
    assert torch.equal(torch.cat([c.codes for c in chunks], 1), plain.codes)
    renderer = StreamRenderer(model)
    stream = render_stream(iter(chunks), renderer)
    next(stream)
    assert renderer.steps == k


def test_warmup_prepares_every_cache_bucket_it_is_asked_for(tiny_synth):
    """warmup(steps=N) grows the KV cache to hold N steps now, so a request of that length reallocates nothing."""
    from toolkit.engine import CACHE_BUCKET

    tiny_synth.engine.release()
    tiny_synth.warmup(batch_sizes=(2,), steps=CACHE_BUCKET + 10)
    batch, length = tiny_synth.model.gpt.cache_shape
    assert batch == 2 and length >= 2 * CACHE_BUCKET
    cache = tiny_synth.model.gpt.layers[0].attention.kv_cache.k
    tiny_synth.synthesize(["a", "b"], params=SamplingParams(max_new_tokens=CACHE_BUCKET, min_new_tokens=CACHE_BUCKET))
    assert tiny_synth.model.gpt.layers[0].attention.kv_cache.k is cache


def assert_same_chunks(want: list, got: list) -> None:
    """Two streams handed over the same chunks: starts, codes, states and EOS books."""
    assert len(want) == len(got)
    for x, y in zip(want, got):
        assert x.start == y.start and torch.equal(x.codes, y.codes) and torch.equal(x.hidden, y.hidden)
        assert torch.equal(x.lengths, y.lengths) and torch.equal(x.finished, y.finished)


def test_engine_lookahead_hands_over_the_same_chunks_and_stops_at_the_same_one(tiny_synth):
    """stream(lookahead=True) queues the next chunk before handing one over (so a CUDA renderer overlaps it): the
    chunks handed over, and where EOS or should_stop ends the stream, must not change."""
    from toolkit.engine import Engine
    from toolkit.prompt import encode_prompts

    emb, valid = encode_prompts(tiny_synth.model, ["look ahead."], tiny_synth.speaker_vector(0))
    engine = Engine(tiny_synth.model.gpt)
    params = SamplingParams(max_new_tokens=200, temperature=1.0, top_p=1.0)
    ended_by_eos = 0
    for seed in range(6):
        plain = list(engine.stream(emb, valid, params, seed=seed))
        assert_same_chunks(plain, list(engine.stream(emb, valid, params, seed=seed, lookahead=True)))
        ended_by_eos += bool(plain[-1].finished.all()) and plain[-1].start + plain[-1].codes.shape[1] < 200
        calls = []
        stopped = list(
            engine.stream(
                emb, valid, params, seed=seed, lookahead=True, should_stop=lambda: calls.append(1) or len(calls) >= 2
            )
        )
        assert len(stopped) == min(2, len(plain))
    assert ended_by_eos  # the early end was exercised, not only max_new_tokens


def test_engine_lead_steps_queue_the_next_chunk_before_handing_one_over(tiny_synth):
    """With lead_steps=L a chunk is handed over only once L steps of the next are queued (on CUDA the GPU then
    never idles while the host checks EOS). The chunks, and where EOS or should_stop ends the stream, are those of
    lead_steps=0, first_yield's early piece included."""
    from toolkit.engine import Engine
    from toolkit.prompt import encode_prompts

    emb, valid = encode_prompts(tiny_synth.model, ["lead steps."], tiny_synth.speaker_vector(0))
    params = SamplingParams(max_new_tokens=100, temperature=1.0, top_p=1.0)
    plain_engine = Engine(tiny_synth.model.gpt, lead_steps=0)
    # where the pieces handed over end: at first_yield, at each multiple of the chunk and at max_new_tokens
    ends = sorted({5, 100, *range(plain_engine.chunk, 100, plain_engine.chunk)})
    ended_by_eos = 0
    for lead in (2, 5):
        engine = Engine(tiny_synth.model.gpt, lead_steps=lead)
        ran = []
        step = engine._step
        engine._step = lambda *a: ran.append(1) or step(*a)
        for seed in range(4):
            plain = list(plain_engine.stream(emb, valid, params, seed=seed, first_yield=5))
            ran.clear()
            ahead = []
            for c in engine.stream(emb, valid, params, seed=seed, first_yield=5):
                end = c.start + c.codes.shape[1]
                # the steps run when a chunk arrives: its own, plus `lead` of the next piece (or all of a shorter one)
                following = next((e - end for e in ends if e > end), 0)
                assert len(ran) == end + min(lead, following)
                ahead.append(c)
            assert_same_chunks(plain, ahead)
            ended_by_eos += bool(plain[-1].finished.all()) and plain[-1].start + plain[-1].codes.shape[1] < 100
            calls = []
            stopped = list(
                engine.stream(emb, valid, params, seed=seed, should_stop=lambda: calls.append(1) or len(calls) >= 2)
            )
            assert len(stopped) == min(2, len(plain))
    assert ended_by_eos  # the early end was exercised, not only max_new_tokens


def test_reserve_sizes_the_cache_once_and_changes_nothing_else(tiny_synth):
    """reserve=N allocates the KV cache for N steps up front (one compile per batch under compile=True), so the
    generation never grows it, and samples the same codes as a generation that grows it."""
    from toolkit.engine import Engine
    from toolkit.prompt import encode_prompts

    emb, valid = encode_prompts(tiny_synth.model, ["reserve it."], tiny_synth.speaker_vector(0))
    engine = Engine(tiny_synth.model.gpt)
    params = SamplingParams(max_new_tokens=300, min_new_tokens=300)
    grows = []
    grow = engine._grow
    engine._grow = lambda *a: grows.append(1) or grow(*a)
    engine.release()
    grown = engine.generate(emb, valid, params, seed=1)
    assert grows
    grows.clear()
    engine.release()
    reserved = engine.generate(emb, valid, params, seed=1, reserve=300)
    assert not grows
    assert torch.equal(reserved.codes, grown.codes)
    torch.testing.assert_close(reserved.hidden, grown.hidden, rtol=1e-4, atol=1e-4)


def test_top_k_first_sampler_keeps_what_a_full_sort_keeps():
    # the top-k path must mask exactly what top-p over the full sort followed by top-k masks
    from toolkit.sampling import process_logits

    g = torch.Generator().manual_seed(0)
    N, V = 32, 626
    for scale, top_p, top_k in [(1.0, 0.7, 20), (6.0, 0.7, 20), (3.0, 0.95, 50), (8.0, 0.2, 3), (0.1, 0.99, 20)]:
        logits = torch.randn(N, V, generator=g) * scale
        history, temperature = torch.full((N, 4), V), torch.ones(N)
        fast = process_logits(logits, history, SamplingParams(top_p=top_p, top_k=top_k), temperature)
        by_sort = process_logits(logits, history, SamplingParams(top_p=top_p, top_k=V), temperature)
        kth = by_sort.topk(top_k, dim=-1).values[:, -1:]
        by_sort = by_sort.masked_fill(by_sort < kth, float("-inf"))
        assert torch.equal(fast.isinf(), by_sort.isinf()), (scale, top_p, top_k)
        kept = (~fast.isinf()).sum(-1)
        assert int(kept.min()) >= 3 and int(kept.max()) <= top_k


def test_sampler_always_leaves_a_code_to_draw_while_eos_is_barred():
    """EOS alone inside top-p, and barred by min_new_tokens: min_keep >= 2 keeps another code to draw."""
    from toolkit.sampling import sample_codes

    V, eos = 626, 625
    logits = torch.full((4, V), -5.0)
    logits[:, eos] = 30.0  # top-p keeps EOS alone, then min_keep tops it up
    history, temperature, noise = torch.full((4, 16), V), torch.ones(4), torch.ones(4, V)
    ids = sample_codes(logits, history, temperature, noise, torch.tensor(0), torch.tensor(5), SamplingParams(), eos)
    assert ids.ne(eos).all() and ids.lt(V).all()
    with pytest.raises(ValueError, match="min_keep must be >= 2"):
        SamplingParams(min_keep=1)


def test_prefill_padded_to_its_bucket_samples_the_same_codes(tiny_synth):
    """prefill_graphs pads each prompt on the left to a PREFILL_BUCKET multiple (so that a few captured graphs serve
    every prompt length on CUDA); the padding is masked, so generation is unchanged, for a batch of unequal prompts
    too, and a prompt that nearly fills max_positions still leaves a step."""
    from toolkit.engine import PREFILL_BUCKET, Engine
    from toolkit.prompt import encode_prompts

    model = tiny_synth.model
    emb, valid = encode_prompts(
        model, ["a short one.", "and a somewhat longer prompt, to pad unevenly."], tiny_synth.speaker_vector(0)
    )
    assert emb.shape[1] % PREFILL_BUCKET  # so that padding happens
    params = SamplingParams(max_new_tokens=40, min_new_tokens=40)
    plain = Engine(model.gpt).generate(emb, valid, params, seed=3)
    padded_engine = Engine(model.gpt, prefill_graphs=True)
    padded = padded_engine.generate(emb, valid, params, seed=3)
    assert model.gpt.cache_shape[1] % 256 == 0 and torch.equal(padded.codes, plain.codes)
    torch.testing.assert_close(padded.hidden, plain.hidden, rtol=1e-4, atol=1e-4)
    T = model.gpt.cfg.max_positions - 5  # a bucket's padding would leave no room: padding stops one short
    long_prompt = emb[:1, -1:].expand(1, T, -1).contiguous()
    near_full = padded_engine.generate(
        long_prompt, torch.ones(1, T, dtype=torch.bool), SamplingParams(max_new_tokens=50, min_new_tokens=50), seed=3
    )
    assert near_full.codes.shape[1] == 1

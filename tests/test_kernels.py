"""The Triton decode step (toolkit/kernels.py) against the PyTorch one. Without a GPU the kernels run under Triton's
interpreter (numpy, slow: tiny model, few steps); on CUDA the same tests run compiled."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are defined, so set before the import
pytest.importorskip("triton")

from toolkit import (
    decode,  # noqa: E402
    kernels,  # noqa: E402
)
from toolkit import engine as engine_module  # noqa: E402
from toolkit.bench import _prompt, random_model  # noqa: E402
from toolkit.engine import Engine  # noqa: E402
from toolkit.models.config import GPTConfig  # noqa: E402
from toolkit.models.gpt import GPT  # noqa: E402
from toolkit.precision import quantize  # noqa: E402
from toolkit.sampling import SamplingParams  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(autouse=True)
def fewer_programs_under_the_interpreter(monkeypatch):
    """The interpreter runs programs one after another: bigger blocks keep it fast (the kernels take any setting;
    on CUDA the shipped ones run). Attention keeps small runs and blocks, so that each run loops over blocks and
    several runs are combined."""
    if DEVICE.type == "cpu":
        monkeypatch.setattr(
            kernels,
            "CONFIGS",
            dict(
                kernels.CONFIGS,
                linear=dict(block_n=16, block_k=64, warps=1),
                gate=dict(block_n=16, block_k=64, warps=1),
                qkv=dict(pairs=8, block_k=64, warps=1),
                oproj=dict(block_n=16, block_k=64, warps=1),
                attention=dict(splits=4, block_s=4, warps=1),
            ),
        )


def odd_widths_gpt() -> GPT:
    """Widths that no block size divides (48 = 3 heads of 16, FFN 80), like the shipped voice's FFN of 640."""
    torch.manual_seed(0)
    cfg = GPTConfig(hidden=48, layers=2, heads=3, intermediate=80, max_positions=256, num_text_tokens=32)
    return GPT(cfg).to(DEVICE).eval().requires_grad_(False)


def small_vocab_gpt() -> GPT:
    """100 codes per codebook instead of 626: the sampler sorts a 128-wide row, which the interpreter can afford."""
    torch.manual_seed(0)
    cfg = GPTConfig(
        hidden=64, layers=2, heads=4, intermediate=128, max_positions=256, num_text_tokens=32, num_audio_tokens=100
    )
    return GPT(cfg).to(DEVICE).eval().requires_grad_(False)


@pytest.mark.parametrize(
    "dtype, atol, dims",
    [
        (torch.float32, 1e-5, "tiny"),
        (torch.bfloat16, 0.1, "tiny"),
        (torch.float16, 0.02, "tiny"),
        (torch.float32, 1e-5, "odd"),
    ],
)
def test_decode_forward_matches_the_pytorch_forward_and_writes_the_same_cache(dtype, atol, dims):
    gpt = (random_model("tiny", DEVICE).gpt if dims == "tiny" else odd_widths_gpt()).to(dtype)
    B, S, slot = 2, 64, 20
    gpt.setup_caches(B, S)
    torch.manual_seed(1)
    for layer in gpt.layers:
        layer.attention.kv_cache.k.normal_()
        layer.attention.kv_cache.v.normal_()
    gpt.key_valid.fill_(True)
    gpt.key_valid[1, :5] = False  # row 1 was left-padded: its first 5 slots must not be attended
    x = torch.randn(B, 1, gpt.cfg.hidden, dtype=dtype, device=DEVICE)
    pos, rope = torch.tensor([slot], device=DEVICE), torch.tensor([[slot], [slot - 5]], device=DEVICE)
    before = [(l.attention.kv_cache.k.clone(), l.attention.kv_cache.v.clone()) for l in gpt.layers]
    want = gpt(x, pos, rope)
    want_cache = [(l.attention.kv_cache.k.clone(), l.attention.kv_cache.v.clone()) for l in gpt.layers]
    for layer, (k, v) in zip(gpt.layers, before):
        layer.attention.kv_cache.k.copy_(k)
        layer.attention.kv_cache.v.copy_(v)
    got = kernels.decode_forward(gpt, x, pos, rope)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=0)
    for layer, (k, v) in zip(gpt.layers, want_cache):
        torch.testing.assert_close(layer.attention.kv_cache.k.float(), k.float(), atol=atol, rtol=0)
        torch.testing.assert_close(layer.attention.kv_cache.v.float(), v.float(), atol=atol, rtol=0)
    # only the new slot was written
    assert torch.equal(gpt.layers[0].attention.kv_cache.k[:, :, :slot], before[0][0][:, :, :slot])


def test_engine_with_kernels_samples_the_same_codes(monkeypatch):
    monkeypatch.setattr(engine_module, "CACHE_BUCKET", 8)  # the cache grows mid-generation (CPU: 32 -> 48 slots)
    gpt = small_vocab_gpt()
    emb = torch.randn(2, 12, gpt.cfg.hidden, generator=torch.Generator().manual_seed(0)).to(DEVICE) * 0.1
    valid = torch.ones(2, 12, dtype=torch.bool, device=DEVICE)
    valid[1, :3] = False
    p = SamplingParams(max_new_tokens=30, min_new_tokens=30)
    want = Engine(gpt, kernels=False).generate(emb, valid, p, seed=3)
    got = Engine(gpt, kernels=True).generate(emb, valid, p, seed=3)
    assert torch.equal(got.codes, want.codes)
    torch.testing.assert_close(got.hidden, want.hidden, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "params, dtype",
    [
        (SamplingParams(), torch.float32),
        (SamplingParams(top_p=1.0, repetition_penalty=1.0, top_k=5), torch.float32),
        (SamplingParams(temperature=(0.3, 0.7, 1.0, 0.5), top_p=0.3, min_keep=2), torch.float32),
        (SamplingParams(), torch.bfloat16),
        (SamplingParams(top_k=100, top_p=0.9), torch.float32),
    ],
)  # top_k = the vocabulary: PyTorch samples instead
def test_fused_sampling_step_does_what_the_pytorch_step_does(params, dtype):
    """One launch samples, keeps the books and embeds the codes: every buffer of the state ends as the PyTorch
    step leaves it, over steps where EOS is first barred (min_new) and then taken. Each step starts both from the
    same hidden state, since the two forwards round differently (to 1e-5 in fp32, 0.1 in bf16)."""
    gpt = small_vocab_gpt().to(dtype)
    Q, V, eos = gpt.cfg.num_vq, gpt.cfg.num_audio_tokens, gpt.cfg.eos_code
    assert kernels.fused_sampling(gpt, params) == (params.top_k < V)
    eos_rows = torch.arange(Q) * V + eos
    with torch.no_grad():  # every codebook's EOS logit is 50 * h[:, 0]: row 1 wants EOS, row 0 never
        gpt.head_code.weight[eos_rows] = 0
        gpt.head_code.weight[eos_rows, 0] = 50.0
    B, chunk = 2, 4
    gpt.setup_caches(B, 32)
    gpt.key_valid.fill_(True)
    states = []
    for _ in range(2):
        s = decode.DecodeState(B, gpt.cfg.hidden, Q, V, params.penalty_window, chunk, dtype, DEVICE)
        g = torch.Generator().manual_seed(5)
        s.h.copy_(torch.randn(B, gpt.cfg.hidden, generator=g))
        s.noise.copy_(torch.empty(s.noise.shape).exponential_(generator=g))
        s.temperature.copy_(torch.tensor(params.temperature).reshape(1, -1).expand(B, Q).reshape(-1))
        s.history[:, :5] = torch.randint(0, V, (s.history.shape[0], 5), generator=g)
        s.prompt_len.fill_(6)
        s.rope_base.copy_(torch.tensor([[6], [3]]))
        s.min_new.fill_(2)
        states.append(s)
    want, got = states
    for step in range(4):
        for s in states:
            s.h[:, 0] = torch.tensor([-3.0, 3.0])
        got.h.copy_(want.h)  # the same state to sample from: the forwards round differently (1e-5 in fp32)
        cache = [(l.attention.kv_cache.k.clone(), l.attention.kv_cache.v.clone()) for l in gpt.layers]
        decode.decode_step(gpt, want, params, chunk)
        for layer, (k, v) in zip(gpt.layers, cache):  # the same cache for both
            layer.attention.kv_cache.k.copy_(k)
            layer.attention.kv_cache.v.copy_(v)
        kernels.decode_step(gpt, got, params, chunk)
        for name, value in vars(want).items():
            atol = 0.1 if name == "h" and dtype != torch.float32 else 1e-5
            torch.testing.assert_close(getattr(got, name), value, atol=atol, rtol=0, msg=f"{name} at step {step}")
    assert not got.arrived.any()  # the sampling launch's arrival counts are left at zero
    # row 1 drew EOS as soon as min_new allowed it (step 2), and stays finished; row 0 never drew it
    assert want.finished.tolist() == [False, True] and want.lengths.tolist() == [4, 2]
    assert want.codes[1, 2].eq(eos).all() and not want.codes[1, :2].eq(eos).any() and not want.codes[0].eq(eos).any()


@pytest.mark.parametrize("recipe", ["int8", "int4-g32"])
def test_weight_only_step_matches_torchao_forward(recipe):
    """int8 per row, and int4 read back from torchao's tinygemm layout into the kernels' own (levels, group
    scales and zero points): the step agrees with torchao's matmuls."""
    pytest.importorskip("torchao")
    model = random_model("tiny", DEVICE)
    quantize(model, recipe, device=DEVICE)
    gpt = model.gpt
    assert kernels.supports(gpt)
    assert {kernels._weight(layer.feed_forward.w2.weight).quant for layer in gpt.layers} == {int(recipe[3])}
    gpt.setup_caches(1, 32)
    gpt.key_valid.fill_(True)
    dtype = gpt.norm.weight.dtype
    x = torch.randn(1, 1, gpt.cfg.hidden, dtype=dtype, device=DEVICE)
    pos, rope = torch.tensor([7], device=DEVICE), torch.tensor([[7]], device=DEVICE)
    want = gpt(x, pos, rope)
    got = kernels.decode_forward(gpt, x, pos, rope)
    torch.testing.assert_close(got.float(), want.float(), atol=1e-4 if dtype == torch.float32 else 0.1, rtol=0)


def test_kernels_refuse_other_quantized_weights_by_name():
    pytest.importorskip("torchao")
    model = random_model("tiny", DEVICE)
    quantize(model, "w8a8", device=DEVICE)  # int8 activations too: not what the kernels compute
    assert not kernels.supports(model.gpt)
    emb, valid = _prompt(model, 1, 4, DEVICE)
    with pytest.raises(ValueError, match="float, int8 or int4 weight-only"):
        Engine(model.gpt, kernels=True).generate(emb, valid, SamplingParams(max_new_tokens=2))
    assert Engine(model.gpt).generate(emb, valid, SamplingParams(max_new_tokens=2)).codes.shape[1] == 2


def test_kernels_chosen_automatically_fall_back_with_a_warning_where_they_cannot_run(monkeypatch):
    model = random_model("tiny", torch.device("cpu"))
    engine = Engine(model.gpt)  # kernels=None: on CUDA only, after one trial launch

    def broken(*args, **kwargs):
        raise RuntimeError("no compiler for this GPU")

    monkeypatch.setattr(kernels, "linear", broken)
    # here the trial launch fails: without CUDA at its first tensor, with CUDA in the patched kernel
    with pytest.warns(RuntimeWarning, match="Triton decode kernels do not run on cuda"):
        assert not engine.uses_kernels(1, torch.device("cuda"))
    assert engine.kernels is False
    emb, valid = _prompt(model, 1, 4, torch.device("cpu"))
    assert Engine(model.gpt, kernels=True).uses_kernels(1, DEVICE)  # asked for: no trial, no fallback
    assert engine.generate(emb, valid, SamplingParams(max_new_tokens=3, min_new_tokens=3)).codes.shape[1] == 3


def test_kernels_asked_for_on_cpu_without_the_interpreter_say_how(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    engine = Engine(random_model("tiny", torch.device("cpu")).gpt, kernels=True)
    with pytest.raises(RuntimeError, match="set TRITON_INTERPRET=1"):
        engine.uses_kernels(1, torch.device("cpu"))


def test_kernels_that_fail_only_as_dependent_launches_run_without_them(monkeypatch):
    """A toolchain that cannot do programmatic dependent launch (here the interpreter, told the CPU has it) keeps
    the kernels, launched plainly, with a warning; the check is two real steps against PyTorch."""
    if DEVICE.type == "cuda":
        pytest.skip("needs the interpreter, which has no gdc_wait")
    monkeypatch.setattr(kernels, "_has_pdl", lambda device: True)
    engine = Engine(small_vocab_gpt())
    with pytest.warns(RuntimeWarning, match="fail as programmatic dependent launches"):
        assert engine._kernels_launch(kernels, DEVICE)
    assert engine.kernel_pdl is False and not kernels.uses_pdl(DEVICE, engine.kernel_pdl)
    assert kernels.uses_pdl(DEVICE)  # the engine chose; the module's settings are as they were
    kernels.self_check(DEVICE, pdl=False)  # without PDL it runs

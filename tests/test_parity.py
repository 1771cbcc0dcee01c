"""ttsq against reference outputs that the `chattts` 0.2.5 package computed on random weights saved in the
official layout (tests/fixtures/make_chattts_fixture.py). Every output must match to 1e-4 relative error."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from toolkit.checkpoint import load_official
from toolkit.engine import Engine
from toolkit.models.speaker import apply_speaker
from toolkit.models.vocos import LogMel
from toolkit.prompt import encode_prompts
from toolkit.sampling import SamplingParams, process_logits

FIXTURE = Path(__file__).parent / "fixtures" / "chattts_tiny"
TOL = 1e-4


def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.fixture(scope="module")
def model():
    return load_official(FIXTURE)


@pytest.fixture(scope="module")
def ref():
    return load_file(str(FIXTURE / "reference.safetensors"))


@pytest.fixture(scope="module")
def meta():
    return json.loads((FIXTURE / "reference.json").read_text())


def test_tokenizer_matches_chattts(model, ref, meta):
    ids, valid = model.tokenizer.encode(meta["texts_decorated"])
    assert torch.equal(ids, ref["input_ids"][..., 0] * ref["attention_mask"])
    assert torch.equal(valid, ref["attention_mask"].bool())
    assert model.tokenizer.token_id("[spk_emb]") == meta["spk_emb_token_id"]


def test_prompt_embeddings_match(model, ref, meta):
    emb, valid = encode_prompts(model, meta["texts"], ref["spk_emb"])
    m = valid
    assert rel(emb[m], ref["emb"][m]) < TOL
    # the generic embed (text rows on channel 0, code rows summed) plus speaker placement
    e = model.gpt.embed(ref["input_ids"], ref["text_mask"])
    e = apply_speaker(e, ref["input_ids"][..., 0] == meta["spk_emb_token_id"], ref["spk_emb"][None].expand(2, -1))
    assert rel(e[m], ref["emb"][m]) < TOL


def test_gpt_hidden_and_logits(model, ref):
    m = ref["attention_mask"].bool()
    h = model.gpt.forward_full(ref["emb"], m)
    assert rel(h[m], ref["hidden"][m]) < TOL
    assert rel(model.gpt.text_logits(h)[m], ref["logits_text"][m]) < TOL
    assert rel(model.gpt.code_logits(h).permute(0, 1, 3, 2)[m], ref["logits_code"][m]) < TOL


def test_kv_cache_decoding_matches_full_forward(model, ref):
    """Prefill, then one cached step per code, as the engine runs it, against ChatTTS's states."""
    gpt = model.gpt
    m = ref["attention_mask"].bool()
    B, T, _ = ref["emb"].shape
    codes = ref["cont_codes"]
    Engine(gpt)._ensure_cache(B, T + codes.shape[1])
    gpt.key_valid[:B].fill_(True)
    gpt.key_valid[:B, :T] = m
    rope = (m.long().cumsum(1) - 1).clamp(min=0)
    states = [gpt(ref["emb"], torch.arange(T), rope)]
    for i in range(codes.shape[1]):
        x = gpt.embed_codes(codes[:, i])[:, None]
        states.append(gpt(x, torch.tensor([T + i]), m.long().sum(1, keepdim=True) + i))
    h = torch.cat(states, 1)
    full_mask = torch.cat([m, torch.ones(B, codes.shape[1], dtype=torch.bool)], 1)
    assert rel(h[full_mask], ref["hidden_cont"][full_mask]) < TOL


def test_decoder_dvae_vocos(model, ref):
    assert rel(model.decoder(ref["decoder_in"]), ref["decoder_mel"]) < TOL
    assert rel(model.dvae(ref["dvae_codes"]), ref["dvae_mel"]) < TOL
    assert rel(model.vocos(ref["vocos_mel_in"]), ref["vocos_wav"]) < TOL
    assert rel(LogMel(model.cfg.vocos)(ref["vocos_audio_in"]), ref["vocos_features"]) < TOL


def test_hidden_to_mel_layout(model, ref):
    """The Decoder reads (B, T, D) states: the TTSModel entry point transposes as ChatTTS's decode does."""
    assert rel(model.hidden_to_mel(ref["decoder_in"].transpose(1, 2)), ref["decoder_mel"]) < TOL


def test_sampling_processors(ref, meta):
    s = meta["sampling"]
    p = SamplingParams(
        temperature=1.0,
        top_p=s["top_p"],
        top_k=s["top_k"],
        repetition_penalty=s["repetition_penalty"],
        penalty_window=s["repetition_window"],
    )
    history = ref["proc_past_ids"][:, -p.penalty_window :]
    out = process_logits(ref["proc_logits"], history, p, torch.ones(len(history)))
    finite = torch.isfinite(ref["proc_out"])
    assert torch.equal(torch.isfinite(out), finite)
    assert rel(out[finite], ref["proc_out"][finite]) < TOL
    p3 = SamplingParams(
        temperature=s["temperature"],
        top_p=s["top_p"],
        top_k=s["top_k"],
        repetition_penalty=s["repetition_penalty"],
        penalty_window=s["repetition_window"],
    )
    out3 = process_logits(ref["proc_logits"], history, p3, torch.full((len(history),), s["temperature"]))
    finite = torch.isfinite(ref["proc_out_t03"])
    assert torch.equal(torch.isfinite(out3), finite)
    assert rel(out3[finite], ref["proc_out_t03"][finite]) < TOL


def test_chattts_folder_synthesizes(model):
    from toolkit import SamplingParams as SP
    from toolkit import Synthesizer

    u = Synthesizer(model, "cpu").synthesize("Hello, tiny test!", params=SP(max_new_tokens=8), seed=3)[0]
    assert u.wav.shape == (512 * u.steps - 256,) and torch.isfinite(torch.from_numpy(u.wav)).all()

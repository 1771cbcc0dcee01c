"""The GPT as one ONNX graph that does both the prefill and the decode step (weights stored once).

Inputs (B batch, T new positions, P cached positions, P may be 0 for the prefill):
  ids        (B, T, Q) int64   text ids copied on the Q channels, or Q audio codes
  text_mask  (B, T)    bool    True where ids are text (channel 0 is read), False where they are codes
  speaker    (B, D)    float32 speaker vector (normalised in the graph) ...
  spk_mask   (B, T)    bool    ... placed where True (the [spk_emb] token)
  rope_pos   (B, T)    int64   rotary positions (real tokens counted, left padding skipped)
  key_valid  (B, P+T)  bool    which keys are real tokens (False: left padding)
  past_k_i / past_v_i (B, H, P, K) float32, i = 0..L-1
Outputs:
  logits  (B, Q, V) float32  code logits of the last new position
  hidden  (B, D)    float32  final-norm state of the last new position (what the Decoder reads)
  present_k_i / present_v_i (B, H, P+T, K): the cache grown by T (fed back as the next past)
New query t (absolute slot P+t) sees key s if key_valid[s] and s <= P+t, and always itself: the torch engine's mask.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..models.gpt import GPT, rotate_half


class GPTStep(nn.Module):
    def __init__(self, gpt: GPT):
        super().__init__()
        self.gpt = gpt
        self.cfg = gpt.cfg

    def forward(
        self,
        ids: Tensor,
        text_mask: Tensor,
        speaker: Tensor,
        spk_mask: Tensor,
        rope_pos: Tensor,
        key_valid: Tensor,
        *past: Tensor,
    ):
        gpt, cfg = self.gpt, self.cfg
        B, T = ids.shape[0], ids.shape[1]
        H, K = cfg.heads, cfg.head_dim
        x = gpt.embed(ids, text_mask)
        spk = speaker / speaker.norm(dim=-1, keepdim=True).clamp(min=1e-12)
        x = torch.where(spk_mask[..., None], spk[:, None, :], x)
        angles = rope_pos[..., None].float() * gpt.inv_freq
        angles = torch.cat((angles, angles), dim=-1)[:, None]  # (B, 1, T, K)
        cos, sin = angles.cos(), angles.sin()
        S = key_valid.shape[1]
        P = S - T
        slots = torch.arange(S, device=ids.device)
        qpos = torch.arange(T, device=ids.device) + P
        causal = slots[None, :] <= qpos[:, None]
        itself = slots[None, :] == qpos[:, None]
        mask = (key_valid[:, None, None, :] & causal) | itself  # (B, 1, T, S)
        scale = K**-0.5
        presents = []
        for i, layer in enumerate(gpt.layers):
            att = layer.attention
            h = layer.attention_norm(x)
            q, k, v = att.wqkv(h).view(B, T, 3, H, K).unbind(2)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k = torch.cat([past[2 * i], k], dim=2)
            v = torch.cat([past[2 * i + 1], v], dim=2)
            presents += [k, v]
            scores = (q @ k.transpose(2, 3)) * scale
            scores = scores.masked_fill(~mask, float("-inf"))
            y = scores.softmax(-1) @ v
            x = x + att.wo(y.transpose(1, 2).reshape(B, T, cfg.hidden))
            x = x + layer.feed_forward(layer.ffn_norm(x))
        h = gpt.norm(x)[:, -1]
        return (gpt.code_logits(h), h, *presents)


def io_names(layers: int) -> tuple[list[str], list[str]]:
    past = [f"past_{kv}_{i}" for i in range(layers) for kv in "kv"]
    present = [f"present_{kv}_{i}" for i in range(layers) for kv in "kv"]
    return ["ids", "text_mask", "speaker", "spk_mask", "rope_pos", "key_valid", *past], ["logits", "hidden", *present]


class TextHead(nn.Module):
    """hidden (B, D) float32 -> text logits (B, V_text) float32: what refine samples from, a graph of its own so
    that the code steps do not pay for it."""

    def __init__(self, gpt: GPT):
        super().__init__()
        self.gpt = gpt

    def forward(self, hidden: Tensor) -> Tensor:
        return self.gpt.text_logits(hidden)


def export_text_head(gpt: GPT, path, opset: int) -> None:
    with torch.no_grad():
        torch.onnx.export(
            TextHead(gpt).eval(),
            (torch.randn(2, gpt.cfg.hidden),),
            str(path),
            input_names=["hidden"],
            output_names=["logits"],
            dynamic_axes={"hidden": {0: "batch"}, "logits": {0: "batch"}},
            opset_version=opset,
            dynamo=False,
            do_constant_folding=True,
        )


def export_gpt(gpt: GPT, path, opset: int) -> None:
    cfg = gpt.cfg
    B, T, P = 2, 5, 3
    H, K, Q, D = cfg.heads, cfg.head_dim, cfg.num_vq, cfg.hidden
    ids = torch.randint(0, 10, (B, T, Q))
    args = (
        ids,
        torch.ones(B, T, dtype=torch.bool),
        torch.randn(B, D),
        torch.zeros(B, T, dtype=torch.bool),
        torch.arange(P, P + T).repeat(B, 1),
        torch.ones(B, P + T, dtype=torch.bool),
        *[torch.randn(B, H, P, K) for _ in range(2 * cfg.layers)],
    )
    inputs, outputs = io_names(cfg.layers)
    axes = {
        "ids": {0: "batch", 1: "new"},
        "text_mask": {0: "batch", 1: "new"},
        "speaker": {0: "batch"},
        "spk_mask": {0: "batch", 1: "new"},
        "rope_pos": {0: "batch", 1: "new"},
        "key_valid": {0: "batch", 1: "total"},
        "logits": {0: "batch"},
        "hidden": {0: "batch"},
    }
    axes.update({n: {0: "batch", 2: "past"} for n in inputs[6:]})
    axes.update({n: {0: "batch", 2: "total"} for n in outputs[2:]})
    with torch.no_grad():
        torch.onnx.export(
            GPTStep(gpt).eval(),
            args,
            str(path),
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=axes,
            opset_version=opset,
            dynamo=False,
            do_constant_folding=True,
        )

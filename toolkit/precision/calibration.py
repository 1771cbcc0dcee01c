"""Calibration: run a text set through the FP32 model, record what each stage sees, then
(a) activation-aware scaling (AWQ for weight-only, SmoothQuant-style for W8A8) folded into the previous op, and
(b) a per-layer sensitivity scan that keeps the most fragile layers in higher precision."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import Tensor, nn

from ..engine import Engine
from ..models import TTSModel
from ..prompt import encode_prompts, resolve_speaker
from ..sampling import SamplingParams
from .recipes import Recipe, stage_of

MAX_ROWS = 2048  # activation rows kept per layer for the scale search


@dataclass
class CalibrationData:
    gpt: list[tuple[Tensor, Tensor]]  # teacher-forcing batches: emb (B, T, D), valid (B, T)
    decoder: list[Tensor]  # FP32 hidden states (B, N, D)
    vocos: list[Tensor]  # FP32 mels (B, n_mels, F)
    texts: int = 0


def speaker_for_label(model: TTSModel, label: str) -> Tensor:
    try:
        return resolve_speaker(model, label)
    except ValueError:  # a label this model has no voice for: a stable seed from its name
        return resolve_speaker(model, zlib.crc32(label.encode()))


@torch.inference_mode()
def collect(
    model: TTSModel,
    texts: Sequence[str],
    speakers: Sequence[str],
    *,
    max_steps: int = 96,
    batch_size: int = 8,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> CalibrationData:
    """Generates FP32 codes for each text (one speaker per batch), so later passes are teacher-forced on them."""
    engine, gpt = Engine(model.gpt), model.gpt
    groups: dict[str, list[str]] = {}
    for t, s in zip(texts, speakers):
        groups.setdefault(s, []).append(t)
    data = CalibrationData([], [], [], len(texts))
    done = 0
    for label, items in groups.items():
        spk = speaker_for_label(model, label)
        for b in range(0, len(items), batch_size):
            batch = items[b : b + batch_size]
            emb, valid = encode_prompts(model, batch, spk)
            gen = engine.generate(emb, valid, SamplingParams(max_new_tokens=max_steps), seed=seed + b)
            steps = torch.arange(gen.codes.shape[1], device=valid.device)[None] <= gen.lengths[:, None]
            data.gpt.append(
                (torch.cat([emb, gpt.embed_codes(gen.codes).to(emb.dtype)], 1), torch.cat([valid, steps], 1))
            )
            data.decoder.append(gen.hidden.float())
            data.vocos.append(model.hidden_to_mel(gen.hidden).float())
            done += len(batch)
            if progress:
                progress(done, len(texts))
    return data


@torch.inference_mode()
def stage_outputs(
    model: TTSModel, data: CalibrationData, stages: Sequence[str] = ("gpt", "decoder", "vocos", "dvae")
) -> dict[str, list[Tensor]]:
    """What each stage produces on the calibration inputs: GPT hidden (valid positions), mel, waveform."""
    out: dict[str, list[Tensor]] = {}
    if "gpt" in stages:
        dt = model.gpt.norm.weight.dtype
        out["gpt"] = [model.gpt.forward_full(e.to(dt), v)[v].float() for e, v in data.gpt]
    if "decoder" in stages:
        out["decoder"] = [model.hidden_to_mel(h).float() for h in data.decoder]
    if "vocos" in stages:
        out["vocos"] = [model.mel_to_wav(m).float() for m in data.vocos]
    if "dvae" in stages and model.dvae is not None:
        g = torch.Generator().manual_seed(0)
        codes = torch.randint(0, model.cfg.gpt.num_audio_tokens - 1, (2, 64, model.cfg.gpt.num_vq), generator=g)
        out["dvae"] = [model.codes_to_mel(codes.to(model.vocos.embed.weight.device)).float()]
    return out


def relative_error(test: list[Tensor], ref: list[Tensor]) -> float:
    """sum ||test - ref||^2 / sum ||ref||^2 over all calibration batches."""
    num = sum(float((t - r).pow(2).sum()) for t, r in zip(test, ref))
    den = sum(float(r.pow(2).sum()) for r in ref)
    return num / max(den, 1e-30)


# --- simulated quantization, used only to choose scales and rank layers --------------------------------
def fake_quant_weight(w: Tensor, recipe: Recipe) -> Tensor:
    w = w.float()
    if recipe.weights == "int8":
        scale = w.abs().amax(1, keepdim=True).clamp(min=1e-8) / 127
        return (w / scale).round().clamp(-128, 127) * scale
    if recipe.weights == "int4":
        g = w.view(w.shape[0], -1, recipe.group_size)
        lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
        scale = (hi - lo).clamp(min=1e-8) / 15
        return (((g - lo) / scale).round().clamp(0, 15) * scale + lo).view_as(w)
    if recipe.weights == "fp8":
        scale = w.abs().amax(1, keepdim=True).clamp(min=1e-8) / 448
        return (w / scale).to(torch.float8_e4m3fn).float() * scale
    return w


def fake_quant_act(x: Tensor, recipe: Recipe) -> Tensor:
    if recipe.activations != "int8":
        return x
    scale = x.abs().amax(-1, keepdim=True).clamp(min=1e-8) / 127
    return (x / scale).round().clamp(-128, 127) * scale


def takes(recipe: Recipe, linear: nn.Linear) -> bool:
    return recipe.weights != "int4" or linear.in_features % recipe.group_size == 0


# --- activation statistics ---------------------------------------------------------------------
@torch.inference_mode()
def record_inputs(model: TTSModel, data: CalibrationData, names: Sequence[str]) -> dict[str, Tensor]:
    """Up to MAX_ROWS input rows per Linear, sampled evenly from the calibration passes."""
    seen: dict[str, list[Tensor]] = {n: [] for n in names}
    modules = dict(model.named_modules())
    hooks = [
        modules[n].register_forward_pre_hook(
            lambda m, a, n=n: seen[n].append(a[0].reshape(-1, a[0].shape[-1]).float().cpu())
        )
        for n in names
    ]
    try:
        stage_outputs(model, data, sorted({stage_of(n) for n in names}))
    finally:
        for h in hooks:
            h.remove()
    out = {}
    for n, rows in seen.items():
        x = torch.cat(rows)
        if len(x) > MAX_ROWS:
            x = x[torch.linspace(0, len(x) - 1, MAX_ROWS).long()]
        out[n] = x
    return out


def fold_target(model: TTSModel, name: str) -> tuple[Tensor, ...] | None:
    """The parameters that produce this Linear's input, linearly per channel: dividing them by s
    and multiplying the Linear's columns by s leaves the float model unchanged."""
    mods = dict(model.named_modules())
    parent, leaf = name.rsplit(".", 1)
    if leaf == "wqkv":
        return (mods[parent.rsplit(".", 1)[0] + ".attention_norm"].weight,)
    if leaf == "w13":
        return (mods[parent.rsplit(".", 1)[0] + ".ffn_norm"].weight,)
    if leaf == "wo":  # attention output is linear in v: fold into the v rows of wqkv
        w = mods[parent + ".wqkv"].weight
        return (w[2 * w.shape[1] :],)
    if leaf == "w2":  # silu(gate) * up is linear in up: fold into the up rows of w13
        w = mods[parent + ".w13"].weight
        return (w[w.shape[0] // 2 :],)
    if leaf == "pwconv1":
        norm = mods[parent + ".norm"]
        return (norm.weight, norm.bias)
    return None  # pwconv2 follows a GELU: nothing to fold into


@torch.inference_mode()
def activation_aware_scale(
    model: TTSModel,
    recipe: Recipe,
    inputs: dict[str, Tensor],
    grid: Sequence[float] = tuple(i / 10 for i in range(11)),
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, float]:
    """Per Linear, pick alpha on a grid to minimise ||Q(W s) (x / s) - W x|| on calibration rows, with
    s = mean|x|^alpha (AWQ; for W8A8 s = max|x|^alpha / max|W|^(1-alpha), SmoothQuant). Returns chosen alphas."""
    mods = dict(model.named_modules())
    chosen = {}
    for i, (name, x) in enumerate(inputs.items()):
        if progress:
            progress(i, len(inputs))
        lin, target = mods[name], fold_target(model, name)
        if target is None or not takes(recipe, lin):
            continue
        w = lin.weight.float().cpu()
        ref = x @ w.T
        if recipe.activations == "int8":
            act, wmax = x.abs().amax(0).clamp(min=1e-5), w.abs().amax(0).clamp(min=1e-5)
        else:
            act, wmax = x.abs().mean(0).clamp(min=1e-5), None
        best, best_err = 0.0, None
        for alpha in grid:
            s = act.pow(alpha) / (wmax.pow(1 - alpha) if wmax is not None else 1)
            s = s / (s.max() * s.min()).sqrt()
            err = float((fake_quant_act(x / s, recipe) @ fake_quant_weight(w * s, recipe).T - ref).pow(2).mean())
            if best_err is None or err < best_err - 1e-12 * abs(best_err):
                best, best_err = alpha, err
        if best > 0:
            s = act.pow(best) / (wmax.pow(1 - best) if wmax is not None else 1)
            s = (s / (s.max() * s.min()).sqrt()).to(lin.weight.device)
            lin.weight.mul_(s.to(lin.weight.dtype))
            for p in target:
                p.div_(s.to(p.dtype) if p.dim() == 1 else s.to(p.dtype)[:, None])
        chosen[name] = best
    return chosen


@torch.inference_mode()
def search_clipping(
    model: TTSModel,
    recipe: Recipe,
    inputs: dict[str, Tensor],
    rows: int = 256,
    ratios: Sequence[float] = tuple(1 - i / 20 for i in range(10)),
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Tensor]:
    """AWQ's clipping search for int4: per output row and group, the shrink r of the [min, max] range that
    minimises ||(Q(clip(W)) - W) x|| on calibration rows (a narrower range rounds finer; outliers pay).
    -> {name: r (O, G)}; apply with `clip_weights`. Leaves the model unchanged."""
    if recipe.weights != "int4":
        return {}
    mods = dict(model.named_modules())
    found = {}
    for i, (name, x) in enumerate(inputs.items()):
        if progress:
            progress(i, len(inputs))
        lin = mods[name]
        if not takes(recipe, lin):
            continue
        x = x[torch.linspace(0, len(x) - 1, min(rows, len(x))).long()]
        w = lin.weight.float().cpu()
        O, K = w.shape
        xg = x.view(len(x), -1, recipe.group_size)  # (N, G, gs)
        best_err = best_r = None
        for r in ratios:
            q = fake_quant_weight(_clip(w, recipe.group_size, torch.full((O, K // recipe.group_size), r)), recipe)
            err = torch.einsum("ngk,ogk->nog", xg, (q - w).view(O, -1, recipe.group_size)).pow(2).sum(0)  # (O, G)
            if best_err is None:
                best_err, best_r = err, torch.full_like(err, r)
            else:
                better = err < best_err
                best_err, best_r = torch.where(better, err, best_err), torch.where(better, r, best_r)
        found[name] = best_r
    return found


def _clip(w: Tensor, group: int, r: Tensor) -> Tensor:
    g = w.view(w.shape[0], -1, group)
    lo, hi = g.amin(-1, keepdim=True) * r[..., None], g.amax(-1, keepdim=True) * r[..., None]
    return torch.maximum(torch.minimum(g, hi), lo).view_as(w)


@torch.inference_mode()
def clip_weights(model: TTSModel, recipe: Recipe, ratios: dict[str, Tensor]) -> None:
    mods = dict(model.named_modules())
    for name, r in ratios.items():
        w = mods[name].weight
        w.copy_(_clip(w.float(), recipe.group_size, r.to(w.device)).to(w.dtype))


@torch.inference_mode()
def sensitivity(
    model: TTSModel,
    recipe: Recipe,
    data: CalibrationData,
    names: Sequence[str],
    reference: dict[str, list[Tensor]],
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, float]:
    """Each layer's stage-output error when it alone is (simulated-)quantized."""
    mods = dict(model.named_modules())
    scores = {}
    for i, name in enumerate(names):
        lin = mods[name]
        saved = lin.weight.detach().clone()
        lin.weight.copy_(fake_quant_weight(saved, recipe).to(saved.dtype))
        stage = stage_of(name)
        scores[name] = relative_error(stage_outputs(model, data, [stage])[stage], reference[stage])
        lin.weight.copy_(saved)
        if progress:
            progress(i + 1, len(names))
    return scores


@torch.inference_mode()
def simulated_errors(
    model: TTSModel, recipe: Recipe, data: CalibrationData, names: Sequence[str], reference: dict[str, list[Tensor]]
) -> dict[str, float]:
    """Stage errors with all `names` (simulated-)quantized at once; weights are restored afterwards."""
    mods = dict(model.named_modules())
    saved = {n: mods[n].weight.detach().clone() for n in names}
    try:
        for n in names:
            mods[n].weight.copy_(fake_quant_weight(saved[n], recipe).to(saved[n].dtype))
        out = stage_outputs(model, data, sorted({stage_of(n) for n in names}))
    finally:
        for n in names:
            mods[n].weight.copy_(saved[n])
    return {s: relative_error(out[s], reference[s]) for s in out}


@dataclass
class LayerPlan:
    quantize: list[str] = field(default_factory=list)
    keep: list[str] = field(default_factory=list)  # kept in higher precision, most sensitive first
    skipped: list[str] = field(default_factory=list)  # shapes the recipe cannot take
    scores: dict[str, float] = field(default_factory=dict)
    alphas: dict[str, float] = field(default_factory=dict)
    clipped: dict[str, float] = field(default_factory=dict)  # int4 layers with a searched range: mean shrink

"""Precision recipes applied as module swaps: `quantize(model, "int4", device=..., calib=...)`."""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from ..models import TTSModel
from .calibration import (
    CalibrationData,
    LayerPlan,
    activation_aware_scale,
    clip_weights,
    record_inputs,
    relative_error,
    search_clipping,
    sensitivity,
    simulated_errors,
    stage_outputs,
    takes,
)
from .recipes import RECIPES, Recipe, UnsupportedRecipe, get_recipe, quantizable_linears, stage_of, torchao_config

__all__ = ["RECIPES", "QuantReport", "Recipe", "UnsupportedRecipe", "quantize", "split_precision", "state_bytes"]


def split_precision(name: str) -> tuple[str, str | None]:
    """ "int8@bf16" -> ("int8", "bf16"): a recipe, and the dtype its float parts and activations run in (None: the
    recipe's own), for the commands that take a list of precisions (bench, evaluate)."""
    recipe, _, float_dtype = name.partition("@")
    return recipe, float_dtype or None


@dataclass
class QuantReport:
    precision: str
    device: str
    plan: LayerPlan
    errors: dict[str, float] = field(default_factory=dict)  # per stage, relative to FP32 on the calibration set
    bytes_before: int = 0
    bytes_after: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def state_bytes(model: torch.nn.Module) -> int:
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.tell()


def where_it_helps(
    model: TTSModel,
    recipe: Recipe,
    calib: CalibrationData,
    names: list[str],
    reference: dict,
    change: Callable[[Callable[[int, int], None]], dict],
    step: Callable[[int, int], None],
) -> dict:
    """Apply `change(step)` (in place; it returns {layer: choice} and reports its layers through `step`), then undo
    it for every stage whose simulated error did not go down: the per-layer objectives can disagree with the stage
    output. `step(done, total)` counts the layers plus the two simulated passes."""
    n = len(names) + 2
    step(0, n)
    before = simulated_errors(model, recipe, calib, names, reference)
    snapshot = {k: v.detach().clone() for k, v in model.state_dict().items()}
    chosen = change(lambda i, _: step(1 + i, n))
    step(n - 1, n)
    after = simulated_errors(model, recipe, calib, names, reference)
    worse = [s for s in after if after[s] >= before[s]]
    if worse:
        model.load_state_dict({k: v for k, v in snapshot.items() if stage_of(k) in worse}, strict=False)
        chosen = {n: a for n, a in chosen.items() if stage_of(n) not in worse}
    step(n, n)
    return chosen


def calibrate(
    model: TTSModel,
    recipe: Recipe,
    calib: CalibrationData,
    names: list[str],
    reference: dict,
    plan: LayerPlan,
    progress: Callable[[str, int, int], None],
) -> dict:
    """Activation-aware scaling, then (int4) the clipping search; each kept per stage only where it helps.
    -> the original weights of clipped layers (clipping is not lossless: a layer kept in float gets them back)."""
    plan.alphas = where_it_helps(
        model,
        recipe,
        calib,
        names,
        reference,
        lambda step: activation_aware_scale(model, recipe, record_inputs(model, calib, names), progress=step),
        lambda i, n: progress("scale search", i, n),
    )
    if recipe.weights != "int4":
        return {}
    mods = dict(model.named_modules())
    unclipped = {}

    def clip(step):
        ratios = search_clipping(model, recipe, record_inputs(model, calib, names), progress=step)
        unclipped.update({n: mods[n].weight.detach().clone() for n in ratios})
        clip_weights(model, recipe, ratios)
        return ratios

    ratios = where_it_helps(
        model, recipe, calib, names, reference, clip, lambda i, n: progress("clipping search", i, n)
    )
    plan.clipped = {n: round(float(r.mean()), 4) for n, r in ratios.items()}
    return {n: unclipped[n] for n in ratios}


def quantize(
    model: TTSModel,
    precision: str,
    *,
    device: torch.device | str | None = None,
    calib: CalibrationData | None = None,
    awq: bool = True,
    keep_sensitive: int = 0,
    target_error: float | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    float_dtype: str | None = None,
) -> QuantReport:
    """Apply a recipe in place. With calibration data: activation-aware scaling (unless awq=False), then the
    `keep_sensitive` most sensitive layers (or as many as `target_error` needs) stay in higher precision.
    float_dtype ("fp32", "bf16", "fp16"): what the non-quantized parts and activations run in, where the recipe's
    kernels allow (default: the recipe's)."""
    device = torch.device(device) if device is not None else model.gpt.norm.weight.device
    recipe = get_recipe(precision, device)
    dtype = recipe.compute_dtype(device, float_dtype)  # checked before the slow part
    progress = progress or (lambda *_: None)
    report = QuantReport(precision, device.type, LayerPlan(), bytes_before=state_bytes(model))
    if calib is not None:
        progress("reference outputs", 0, 1)
    reference = stage_outputs(model, calib) if calib is not None else None
    if calib is not None:
        progress("reference outputs", 1, 1)
    plan = report.plan
    if recipe.is_quantized:
        mods = dict(model.named_modules())
        names = quantizable_linears(model)
        plan.skipped = [n for n in names if not takes(recipe, mods[n])]
        names = [n for n in names if n not in plan.skipped]
        unclipped = (
            calibrate(model, recipe, calib, names, reference, plan, progress) if calib is not None and awq else {}
        )
        if calib is not None and (keep_sensitive > 0 or target_error is not None):
            plan.scores = sensitivity(
                model, recipe, calib, names, reference, lambda i, n: progress("sensitivity", i, n)
            )
            # the DVAE decoder is off the default synthesis path: it never takes the high-precision budget
            ranked = sorted((n for n in names if stage_of(n) != "dvae"), key=plan.scores.get, reverse=True)
            keep = ranked[:keep_sensitive]
            if target_error is not None:  # per-layer errors add up roughly: keep until the rest fits the target
                rest = ranked[::-1]
                while rest and sum(plan.scores[n] for n in rest) > target_error:
                    keep.append(rest.pop()) if rest[-1] not in keep else rest.pop()
            plan.keep = [n for n in ranked if n in set(keep)]
        plan.quantize = [n for n in names if n not in plan.keep]
        for n in set(plan.keep) & set(unclipped):  # kept in float: its full range back
            mods[n].weight.copy_(unclipped[n])
            del plan.clipped[n]
    model.to(device=device, dtype=dtype)
    if recipe.is_quantized and plan.quantize:
        from torchao.quantization import quantize_

        chosen = set(plan.quantize)
        configs: dict[int, object] = {}
        mods = dict(model.named_modules())
        for n in plan.quantize:  # one config per input width (int4 configs do not depend on it, but stay safe)
            k = mods[n].in_features
            configs.setdefault(k, torchao_config(recipe, device, k))
        for i, (k, cfg) in enumerate(configs.items()):
            progress("quantize", i, len(configs))
            quantize_(model, cfg, filter_fn=lambda m, fqn, k=k: fqn in chosen and m.in_features == k)
        progress("quantize", len(configs), len(configs))
    if calib is not None:
        progress("stage errors", 0, 1)
        after = stage_outputs(model, calib)
        report.errors = {s: relative_error(after[s], reference[s]) for s in after}
        progress("stage errors", 1, 1)
    report.bytes_after = state_bytes(model)
    model.precision = precision
    model.quant_report = report
    return report

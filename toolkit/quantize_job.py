"""`ttsq quantize` as a library call: load, calibrate on a text set, quantize, save the artifact."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .fileio import check_output_dir
from .precision import QuantReport, quantize
from .precision.artifact import save_artifact
from .precision.calibration import collect
from .synthesizer import load_model, resolve_device, source_name
from .textsets import load_text_set, set_hash

#: calibration texts by device kind: each text costs a generation and four teacher-forced passes, which a CPU
#: runs about as fast as a GPU runs a few dozen (--limit sets it)
CALIB_TEXTS = {"cpu": 8, "cuda": 32}


def calibration_texts(device: str | None) -> int:
    return CALIB_TEXTS.get(resolve_device(device).type, 32)


def plan_stages(
    precision: str, calibrated: bool, keep_sensitive: int = 0, target_error: float | None = None, awq: bool = True
) -> list[str]:
    """The stages quantize_to_artifact reports through progress(stage, done, total), in order."""
    from .precision import RECIPES

    recipe = RECIPES[precision]
    stages = ["calibrate", "reference outputs"] if calibrated else []
    if calibrated and recipe.is_quantized and awq:
        stages += ["scale search"] + (["clipping search"] if recipe.weights == "int4" else [])
    if calibrated and recipe.is_quantized and (keep_sensitive > 0 or target_error is not None):
        stages.append("sensitivity")
    if recipe.is_quantized:
        stages.append("quantize")
    return stages + (["stage errors"] if calibrated else []) + ["save"]


@dataclass
class Probe:
    """Costs measured on the model and device (seconds): one calibration batch of `batch` texts generated for a
    few steps, and one teacher-forced pass of each stage over it, each as (fixed, per GPT step) from two lengths;
    and, for the largest layer to quantize (`layer_elems` weights), a simulated quantization and a matmul of
    MAX_ROWS rows, its real quantization, and what its quantized kernel adds to the float one on those rows (the
    stage errors run the quantized model); `prompt`: the probe batch's prompt positions."""

    batch: int
    generate: tuple[float, float]
    stages: dict[str, tuple[float, float]] = field(default_factory=dict)
    fake_quant_s: float = 0.0
    matmul_s: float = 0.0
    layer_elems: int = 1
    quantize_s: float = 0.0
    kernel_extra_s: float = 0.0
    prompt: int = 0


def _timed(fn, device, repeat: int = 1) -> float:
    """The shortest of `repeat` timed calls (a shared machine only ever adds time)."""
    import torch

    best = float("inf")
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best


def _line(t_a: float, t_b: float, a: int, b: int) -> tuple[float, float]:
    """(fixed, per step) through two timings; timing noise must not make a step free or cost negative time."""
    per = max((t_b - t_a) / (b - a), t_b / b / 4)
    return max(t_a - a * per, 0.0), per


def _kernel(module, x, precision: str, float_dtype: str | None) -> tuple[float, float]:
    """(seconds to quantize a copy of `module`, what its quantized forward adds to its float one's time on `x`)."""
    import copy

    import torch
    from torch import nn
    from torchao.quantization import quantize_

    from .precision import RECIPES
    from .precision.recipes import get_recipe, torchao_config

    device = x.device
    recipe = get_recipe(precision, device)
    dtype = recipe.compute_dtype(device, float_dtype)
    lin = nn.Sequential(copy.deepcopy(module).to(dtype))
    x = x.to(dtype)
    cfg = torchao_config(RECIPES[precision], device, module.in_features)
    with torch.no_grad():
        plain = _timed(lambda: lin(x), device, 3)
        took = _timed(lambda: quantize_(lin, cfg), device)
        quantized = _timed(lambda: lin(x), device, 3)
    return took, max(quantized - plain, 0.0)


def probe(
    model,
    texts: list[str],
    speakers: list[str],
    precision: str,
    layer: str | None,
    float_dtype: str | None = None,
    steps: tuple[int, int] = (2, 6),
) -> Probe:
    """Times a few calibration steps and stage passes on `model` (on its device), and the layer search's work on
    `layer` (the largest to quantize; None: nothing to quantize), for `extrapolate`. It costs about a fifth of one
    calibration batch, and leaves the model as it was."""
    import torch

    from .precision import RECIPES
    from .precision.calibration import MAX_ROWS, collect, fake_quant_act, fake_quant_weight, stage_outputs

    device = model.gpt.norm.weight.device
    first = [t for t, s in zip(texts, speakers) if s == speakers[0]][:8]  # collect's first batch
    spk = [speakers[0]] * len(first)
    a, b = steps
    data = {}
    collect(model, first[:1], spk[:1], max_steps=1)  # warm-up: first-call costs are not per step
    t = {n: _timed(lambda n=n: data.__setitem__(n, collect(model, first, spk, max_steps=n)), device, 2) for n in steps}
    stages = ["gpt", "decoder", "vocos"] + (["dvae"] if model.dvae is not None else [])
    fits = {}
    for s in stages:
        stage_outputs(model, data[a], [s])  # warm-up
        t_a, t_b = (_timed(lambda n=n: stage_outputs(model, data[n], [s]), device, 3) for n in steps)
        fits[s] = ((t_a + t_b) / 2, 0.0) if s == "dvae" else _line(t_a, t_b, a, b)  # dvae: a fixed input
    fq = mm = took = extra = 0.0
    elems = 1
    if layer is not None:
        recipe = RECIPES[precision]
        module = dict(model.named_modules())[layer]
        w = module.weight.detach().float()
        x = torch.randn(MAX_ROWS, w.shape[1], device=w.device)
        fq = _timed(lambda: fake_quant_weight(w, recipe), device, 3)
        mm = _timed(lambda: fake_quant_act(x, recipe) @ w.T, device, 3)
        elems = w.numel()
        took, extra = _kernel(module, x, precision, float_dtype)
    prompt = data[b].gpt[0][0].shape[1] - b
    return Probe(len(first), _line(t[a], t[b], a, b), fits, fq, mm, elems, took, extra, prompt)


def extrapolate(
    p: Probe,
    stages: list[str],
    batches: list[int],
    max_steps: int,
    layers: dict[str, int],
) -> dict[str, float]:
    """Seconds per stage of `stages` (plan_stages' names; "save" is not estimated) for calibration batches of
    `batches` texts each at up to `max_steps` GPT steps, and `layers` {name: weights} to search and quantize."""
    from .precision.calibration import MAX_ROWS
    from .precision.recipes import stage_of

    # a batch smaller than the probe's costs about as much (per-step overheads); a larger one, more per text
    units = sum(max(n / max(p.batch, 1), 1.0) for n in batches)

    def over_set(fit: tuple[float, float], per_batch: bool = True) -> float:
        return (fit[0] + fit[1] * max_steps) * (units if per_batch else 1.0)

    passes = {s: over_set(fit, s != "dvae") for s, fit in p.stages.items()}  # each stage once over the set
    every = sum(passes.values())
    touched = sum(passes.get(s, 0.0) for s in {stage_of(n) for n in layers})
    elems = sum(layers.values()) / max(p.layer_elems, 1)  # all layers, in units of the probed one
    fq, mm = p.fake_quant_s * elems, p.matmul_s * elems
    out = {
        "calibrate": over_set(p.generate),
        "reference outputs": every,
        # record_inputs, then simulated errors before and after (where_it_helps): three passes, plus the grid
        "scale search": 3 * touched + 2 * fq + 11 * (fq + mm),
        "clipping search": 3 * touched + 2 * fq + 10 * (fq + mm * 256 / 2048),
        "sensitivity": sum(passes.get(stage_of(n), 0.0) for n in layers) + fq,
        "quantize": p.quantize_s * elems,
        # the quantized model's passes: what its kernels add, per row of the set (its GPT positions, as a bound)
        "stage errors": every + p.kernel_extra_s * elems * units * p.batch * (p.prompt + max_steps) / MAX_ROWS,
    }
    return {s: out[s] for s in stages if s in out}


def estimate_stages(
    model, records, precision: str, stages: list[str], max_steps: int, float_dtype: str | None = None
) -> dict[str, float]:
    """Probe `model` on its device, then extrapolate to quantize_to_artifact's stages for these calibration
    records (toolkit.textsets records)."""
    from .precision import RECIPES, quantizable_linears
    from .precision.calibration import takes

    recipe = RECIPES[precision]
    mods = dict(model.named_modules())
    layers = {}
    if recipe.is_quantized:
        layers = {n: mods[n].weight.numel() for n in quantizable_linears(model) if takes(recipe, mods[n])}
    texts, speakers = [r.text for r in records], [r.speaker for r in records]
    groups: dict[str, int] = {}
    for s in speakers:
        groups[s] = groups.get(s, 0) + 1
    batches = [min(8, n - b) for n in groups.values() for b in range(0, n, 8)]  # as collect batches them
    big = max(layers, key=layers.get, default=None)
    return extrapolate(probe(model, texts, speakers, precision, big, float_dtype), stages, batches, max_steps, layers)


def describe_estimate(est: dict[str, float], device: str | None) -> str:
    """One line for the CLI and the GUI: the expected total, then each stage's share."""
    from .progress import duration

    parts = ", ".join(f"{s} {duration(t)}" for s, t in est.items())
    return (
        f"expected time: about {duration(sum(est.values()))} ({parts}; from a short probe of this model on "
        f"{resolve_device(device)}, counting every text to its step limit; the bars below give each stage's ETA)"
    )


def quantize_to_artifact(
    model_path: str | Path | None,
    precision: str,
    out: str | Path,
    *,
    calib_set: str | Path | None = None,
    device: str | None = "cpu",
    limit: int | None = None,
    max_steps: int = 96,
    awq: bool = True,
    keep_sensitive: int = 0,
    target_error: float | None = None,
    force: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
    float_dtype: str | None = None,
    estimate: Callable[[dict[str, float]], None] | None = None,
) -> tuple[Path, QuantReport]:
    """Load, calibrate on `limit` texts of `calib_set` (default: calibration_texts(device)), quantize, save.
    progress(stage, done, total) for each of plan_stages(...), in order. estimate({stage: seconds}): the expected
    time of the long stages, from a quick probe (estimate_stages), called before they start (with a calib_set)."""
    dev = resolve_device(device)
    out = Path(out)
    check_output_dir(out, force=force)  # fail before the slow part
    model = load_model(model_path, "cpu").to(dev)
    calib, calib_meta = None, {}
    if calib_set is not None:
        records = load_text_set(
            calib_set, limit=limit if limit is not None else calibration_texts(device), purpose="calibration"
        )
        if estimate is not None:
            stages = plan_stages(precision, True, keep_sensitive, target_error, awq)
            estimate(estimate_stages(model, records, precision, stages, max_steps, float_dtype))
        step = (lambda i, n: progress("calibrate", i, n)) if progress else None
        calib = collect(
            model, [r.text for r in records], [r.speaker for r in records], max_steps=max_steps, progress=step
        )
        calib_meta = {
            "file": str(calib_set),
            "sha256": set_hash(calib_set),
            "texts": len(records),
            "max_steps": max_steps,
        }
    report = quantize(
        model,
        precision,
        device=dev,
        calib=calib,
        awq=awq,
        keep_sensitive=keep_sensitive,
        target_error=target_error,
        progress=progress,
        float_dtype=float_dtype,
    )
    if progress:
        progress("save", 0, 1)
    path = save_artifact(model, out, force=force, calib=calib_meta, source=source_name(model_path))
    if progress:
        progress("save", 1, 1)
    return path, report

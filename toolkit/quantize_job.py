"""`ttsq quantize` as a library call: load, calibrate on a text set, quantize, save the artifact."""

from __future__ import annotations

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
) -> tuple[Path, QuantReport]:
    """Load, calibrate on `limit` texts of `calib_set` (default: calibration_texts(device)), quantize, save.
    progress(stage, done, total) for each of plan_stages(...), in order."""
    dev = resolve_device(device)
    out = Path(out)
    check_output_dir(out, force=force)  # fail before the slow part
    model = load_model(model_path, "cpu").to(dev)
    calib, calib_meta = None, {}
    if calib_set is not None:
        records = load_text_set(
            calib_set, limit=limit if limit is not None else calibration_texts(device), purpose="calibration"
        )
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

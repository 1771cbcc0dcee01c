"""`ttsq quantize` as a library call: load, calibrate on a text set, quantize, save the artifact."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from .precision import QuantReport, quantize
from .precision.artifact import save_artifact
from .precision.calibration import collect
from .synthesizer import load_model, resolve_device
from .textsets import load_text_set, set_hash


def quantize_to_artifact(model_path: str | Path | None, precision: str, out: str | Path, *,
                         calib_set: str | Path | None = None, device: str | None = "cpu", limit: int | None = 32,
                         max_steps: int = 96, awq: bool = True, keep_sensitive: int = 0,
                         target_error: float | None = None, force: bool = False,
                         progress: Callable[[str, int, int], None] | None = None,
                         float_dtype: str | None = None) -> tuple[Path, QuantReport]:
    dev = resolve_device(device)
    out = Path(out)
    if out.exists() and not force:  # fail before the slow part
        raise FileExistsError(f"{out} already exists; pass --force to replace it, or choose another --out")
    model = load_model(model_path, "cpu").to(dev)
    calib, calib_meta = None, {}
    if calib_set is not None:
        records = load_text_set(calib_set)[:limit]
        step = (lambda i, n: progress("calibrate", i, n)) if progress else None
        calib = collect(model, [r.text for r in records], [r.speaker for r in records], max_steps=max_steps,
                        progress=step)
        calib_meta = {"file": str(calib_set), "sha256": set_hash(calib_set), "texts": len(records),
                      "max_steps": max_steps}
    report = quantize(model, precision, device=dev, calib=calib, awq=awq, keep_sensitive=keep_sensitive,
                      target_error=target_error, progress=progress, float_dtype=float_dtype)
    return save_artifact(model, out, force=force, calib=calib_meta), report

"""Quantized artifacts: a folder with model.pt (a state dict of torchao tensors, read with weights_only=True),
tokenizer.json and a manifest holding the recipe, per-layer decisions, calibration hash, versions and checksums."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from ..checkpoint import (
    CheckpointError,
    file_of,
    load_strict,
    model_config,
    read_manifest,
    split_state,
    verify_files,
    write_manifest,
)
from ..fileio import atomic_dir
from ..models import Tokenizer, TTSModel
from .recipes import RECIPES, tensor_classes


def _versions() -> dict[str, str]:
    import torchao

    return {"torch": torch.__version__.split("+")[0], "torchao": torchao.__version__}


def save_artifact(
    model: TTSModel, out: str | Path, *, force: bool = False, calib: dict | None = None, source: str | None = None
) -> Path:
    """source: the model quantized (toolkit.synthesizer.source_name), so that the artifact can be compared with it."""
    report = getattr(model, "quant_report", None)
    if report is None:
        raise ValueError("the model was not quantized with toolkit.precision.quantize")
    out = Path(out)
    with atomic_dir(out, force=force) as tmp:
        with open(tmp / "model.pt", "wb") as f:  # a Python file: a full disk raises ENOSPC, not an opaque torch error
            torch.save(split_state(model), f)
        shutil.copyfile(model.tokenizer.path, tmp / "tokenizer.json")
        plan = report.plan
        layers = {
            **{n: report.precision for n in plan.quantize},
            **{n: "float (sensitive)" for n in plan.keep},
            **{n: "float (shape)" for n in plan.skipped},
        }
        write_manifest(
            tmp,
            {
                "precision": report.precision,
                "recipe": dict(RECIPES[report.precision].__dict__),
                "source": source,
                "frontend": getattr(model, "frontend", None),
                "voices": sorted(getattr(model, "voices", {}) or {}),
                "text_head": getattr(model, "text_head", True),
                "device_kind": report.device,
                "dtype": str(model.gpt.norm.weight.dtype).removeprefix("torch."),
                "config": model.cfg.to_dict(),
                "layers": layers,
                "awq_alphas": plan.alphas,
                "int4_clip_ratios": plan.clipped,
                "sensitivity": plan.scores,
                "calibration": calib or {},
                "errors": report.errors,
                "bytes_fp32": report.bytes_before,
                "bytes_quantized": report.bytes_after,
                "versions": _versions(),
            },
        )
    return out


def load_artifact(root: Path, manifest: dict | None = None, device: torch.device | str = "cpu") -> TTSModel:
    manifest = manifest or read_manifest(root)
    device = torch.device(device)
    precision = manifest.get("precision")
    if precision not in RECIPES:
        raise CheckpointError(f"{root}: unknown precision {precision!r} in the manifest")
    kind = manifest.get("device_kind", "cpu")
    if RECIPES[precision].is_quantized and kind != device.type:
        raise CheckpointError(
            f"{root} holds {precision} weights packed for {kind}, but the target device is "
            f"{device.type}; run it with --device {kind}, or re-quantize on this device: "
            f"ttsq quantize --device {device.type} ..."
        )
    if RECIPES[precision].is_quantized:
        import torchao

        have, made = torchao.__version__.split(".")[:2], manifest.get("versions", {}).get("torchao", "").split(".")[:2]
        if have != made:
            raise CheckpointError(
                f"{root} was written with torchao {'.'.join(made)}, this is torchao "
                f"{torchao.__version__}; install torchao=={'.'.join(made)}.* or re-quantize"
            )
    cfg = model_config(root, manifest)
    dtype = manifest.get("dtype", "float32")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise CheckpointError(f"{root / 'manifest.json'}: dtype {dtype!r} is not float32, bfloat16 or float16")
    verify_files(root, manifest)
    import torchao.quantization  # noqa: F401  registers its tensor subclasses as safe globals

    # the recipe's own classes, by name: an allow-list for this load only (never an unsafe load), and the import of
    # modules that nothing else imports in a fresh process (the CPU int4 tensor's prototype package)
    allowed = tensor_classes(RECIPES[precision], kind) if RECIPES[precision].is_quantized else []
    try:
        with torch.serialization.safe_globals(allowed):
            state = torch.load(file_of(root, "model.pt"), map_location=device, weights_only=True)
    except Exception as e:
        raise CheckpointError(
            f"cannot read {root / 'model.pt'}: {type(e).__name__}: {e}. The artifact is corrupt "
            "or was not written by ttsq; re-create it with ttsq quantize"
        ) from e
    model = TTSModel(cfg, Tokenizer(file_of(root, "tokenizer.json")))
    model.to(device=device, dtype=getattr(torch, dtype))
    model.voices = {k[len("voice.") :]: state.pop(k) for k in list(state) if k.startswith("voice.")}
    load_strict(model, state, f"artifact {root}", assign=True)
    model.precision = precision
    return model.eval().requires_grad_(False)

"""Precision recipes as data, and the policy that says which modules each recipe touches."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")  # quiets CUDA .so errors on CPU-only hosts


FLOAT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Recipe:
    name: str
    weights: str  # fp32 | fp16 | bf16 | int8 | int4 | fp8
    activations: str = "float"  # float | int8 | fp8 (dynamic, per token)
    group_size: int | None = None  # int4 only
    hqq: bool = False  # int4: HQQ qparams instead of min/max
    devices: tuple[str, ...] = ("cpu", "cuda")
    note: str = ""

    @property
    def is_quantized(self) -> bool:
        return self.weights in ("int8", "int4", "fp8")

    def compute_dtype(self, device: torch.device, float_dtype: str | None = None) -> torch.dtype:
        """The float dtype the non-quantized parts (and the activations) run in; float_dtype overrides it for a
        quantized recipe where its kernels allow."""
        if self.weights in ("fp16", "bf16"):
            if float_dtype not in (None, self.weights):
                raise UnsupportedRecipe(f"--float-dtype applies to quantized recipes; {self.name} is {self.weights}")
            return FLOAT_DTYPES[self.weights]
        if device.type == "cuda" and self.weights in ("int4", "fp8"):
            if float_dtype not in (None, "bf16"):
                raise UnsupportedRecipe(
                    f"{self.name} on CUDA runs its float parts in bf16 only (its kernels take "
                    "nothing else); drop --float-dtype or pass bf16"
                )
            return torch.bfloat16
        if float_dtype is not None and float_dtype not in FLOAT_DTYPES:
            raise UnsupportedRecipe(f"unknown float dtype {float_dtype!r}; choose one of {', '.join(FLOAT_DTYPES)}")
        return FLOAT_DTYPES[float_dtype or "fp32"]


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in [
        Recipe("fp32", "fp32"),
        Recipe("fp16", "fp16", note="norms, logits, mel coefficients and ISTFT stay fp32"),
        Recipe("bf16", "bf16", note="norms, logits, mel coefficients and ISTFT stay fp32"),
        Recipe("int8", "int8", note="int8 weight-only, per output channel"),
        Recipe("w8a8", "int8", "int8", note="int8 weights and dynamic int8 activations; pays off at batch >= 16"),
        Recipe("int4", "int4", group_size=128, note="int4 weight-only, groups of 128"),
        Recipe("int4-g32", "int4", group_size=32, note="int4 weight-only, groups of 32"),
        Recipe("int4-g64", "int4", group_size=64, note="int4 weight-only, groups of 64"),
        Recipe("int4-hqq", "int4", group_size=128, hqq=True, note="int4 with HQQ qparams"),
        Recipe("fp8", "fp8", "fp8", devices=("cuda",), note="fp8 e4m3 weights and activations; needs sm89+"),
    ]
}


class UnsupportedRecipe(ValueError):
    pass


def get_recipe(name: str, device: torch.device) -> Recipe:
    if name not in RECIPES:
        raise UnsupportedRecipe(f"unknown precision {name!r}; choose one of {', '.join(RECIPES)}")
    r = RECIPES[name]
    if device.type not in r.devices:
        ok = [n for n, x in RECIPES.items() if device.type in x.devices]
        raise UnsupportedRecipe(
            f"precision {name} does not run on {device.type}; on {device.type} use one of "
            f"{', '.join(ok)}" + (", or run on --device cuda" if device.type == "cpu" else "")
        )
    if r.weights == "fp8" and device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        raise UnsupportedRecipe("fp8 needs an Ada/Hopper GPU (compute capability 8.9+); use int8 or bf16")
    if r.weights == "int4" and device.type == "cuda" and r.group_size not in (32, 64, 128, 256):
        raise UnsupportedRecipe("int4 on CUDA takes group sizes 32, 64, 128 or 256")
    return r


# --- policy: which Linear layers a recipe quantizes -------------------------------------------------
# Embeddings, heads (text/code logits, the Vocos spectrum head), norms and the ISTFT stay high precision.
KEEP_FLOAT = ("gpt.head_text", "gpt.head_code", "vocos.out")


def tensor_classes(recipe: Recipe, device_type: str) -> list[type]:
    """The torchao tensor subclasses (and the objects they pickle) that an artifact of `recipe`, packed for
    `device_type`, holds: the allow-list that torch.load(weights_only=True) needs to read its model.pt. Importing
    them here also matters: a class whose module was never imported (torchao's CPU int4 lives in a prototype
    package that `import torchao.quantization` does not load) cannot be named by the unpickler at all."""
    from torchao import quantization as q
    from torchao.quantization.quant_primitives import MappingType
    from torchao.quantization.quantize_.workflows.int8.int8_tensor import QuantizeTensorToInt8Kwargs

    if recipe.weights == "int8":
        return [q.Int8Tensor] + (
            [QuantizeTensorToInt8Kwargs, q.PerRow, MappingType] if recipe.activations == "int8" else []
        )
    if recipe.weights == "int4":
        if device_type == "cuda":
            return [q.Int4TilePackedTo4dTensor]
        from torchao.prototype.quantization.int4 import Int4OpaqueTensor

        return [Int4OpaqueTensor]
    if recipe.weights == "fp8":
        from torchao.quantization.quantize_.common.kernel_preference import KernelPreference
        from torchao.quantization.quantize_.workflows.float8.float8_tensor import QuantizeTensorToFloat8Kwargs

        return [q.Float8Tensor, QuantizeTensorToFloat8Kwargs, q.PerRow, KernelPreference]
    return []


def quantizable_linears(model: nn.Module) -> list[str]:
    return [
        n
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear) and n not in KEEP_FLOAT and not n.startswith("dvae.gfsq")
    ]


def stage_of(name: str) -> str:
    return name.split(".", 1)[0]


def torchao_config(recipe: Recipe, device: torch.device, in_features: int):
    """The torchao config for one Linear, or None where the recipe cannot take its shape."""
    from torchao import quantization as q

    # set_inductor_config=False: torchao's default sets process-wide inductor options (coordinate-descent tuning in
    # all directions, among others) on every quantize_, which slows every later torch.compile in the process
    keep = {"set_inductor_config": False}
    if recipe.weights == "int8":
        return (
            q.Int8DynamicActivationInt8WeightConfig(**keep)
            if recipe.activations == "int8"
            else q.Int8WeightOnlyConfig(**keep)
        )
    if recipe.weights == "fp8":
        return q.Float8DynamicActivationFloat8WeightConfig(granularity=q.PerRow(), **keep)
    if recipe.weights == "int4":
        if in_features % recipe.group_size:
            return None
        from torchao.quantization.quantize_.workflows import Int4ChooseQParamsAlgorithm

        algo = Int4ChooseQParamsAlgorithm.HQQ if recipe.hqq else Int4ChooseQParamsAlgorithm.TINYGEMM
        if device.type == "cuda":
            return q.Int4WeightOnlyConfig(
                group_size=recipe.group_size,
                int4_packing_format="tile_packed_to_4d",
                int4_choose_qparams_algorithm=algo,
                **keep,
            )
        from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig

        return PrototypeInt4WeightOnlyConfig(group_size=recipe.group_size, int4_choose_qparams_algorithm=algo, **keep)
    raise UnsupportedRecipe(f"{recipe.name} is not a torchao recipe")

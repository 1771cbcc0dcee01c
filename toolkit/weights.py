"""What kind of weight a tensor is: torchao's weight-only tensor subclasses told apart by name, so that the engine
and the Triton kernels can ask without importing torchao or the precision recipes (which sit above them)."""

from __future__ import annotations

import torch

INT4_WEIGHT_ONLY = ("Int4TilePackedTo4dTensor", "Int4OpaqueTensor")  # torchao's tinygemm layouts: CUDA, CPU


def is_int8_weight_only(w: torch.Tensor) -> bool:
    """Whether w is torchao's int8 weight-only tensor (an Int8Tensor that does not quantize activations)."""
    return type(w).__name__ == "Int8Tensor" and getattr(w, "act_quant_kwargs", 1) is None


def is_int4_weight_only(w: torch.Tensor) -> bool:
    """Whether w is one of torchao's int4 weight-only tensors."""
    return type(w).__name__ in INT4_WEIGHT_ONLY

"""ONNX Runtime quantization of the exported fp32 graphs (see README.md for what was measured and chosen).

- fp16: `convert_float_to_float16(keep_io_types=True)`; norms, exp and the rotary/mask index math stay fp32.
- int8: dynamic int8 on MatMul for every graph (weights int8 per channel, activations quantized per call);
  with a calibration set, the Decoder and Vocos get static QDQ int8 instead, calibrated on recorded activations.
  Convs stay float: measured slower in int8 on this CPU (README).
- int4: `MatMulNBitsQuantizer` on the GPT's MatMuls (block 32 or 128, RTN or HQQ); the Decoder and Vocos as int8.
"""

from __future__ import annotations

import contextlib
import logging
import re
from pathlib import Path
from typing import Iterable

import numpy as np
import onnx

FP16_BLOCK = ["Pow", "ReduceMean", "Sqrt", "Reciprocal", "Exp", "Sin", "Cos", "CumSum", "Range", "Clip"]


@contextlib.contextmanager
def _quiet():
    """onnxruntime.quantization logs a pre-processing suggestion on the root logger for every graph."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def parse_precision(precision: str) -> dict:
    """fp32 | fp16 | int8 | int4[-hqq][-b32|-b128] -> {"name", "kind", "block", "algo"}."""
    p = precision.lower().strip()
    m = re.fullmatch(r"(fp32|fp16|int8|int4)((?:-(?:rtn|hqq|b32|b128))*)", p)
    if not m:
        raise ValueError(
            f"unknown export precision {precision!r}; use fp32, fp16, int8, int4, int4-hqq, int4-b128 or int4-hqq-b128"
        )
    opts = set(filter(None, m.group(2).split("-")))
    if opts and m.group(1) != "int4":
        raise ValueError(f"{precision!r}: block size and algorithm options apply to int4 only")
    return {
        "name": p,
        "kind": m.group(1),
        "block": 128 if "b128" in opts else 32,
        "algo": "hqq" if "hqq" in opts else "rtn",
    }


def to_fp16(src: Path, dst: Path) -> dict:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True, op_block_list=FP16_BLOCK)
    onnx.save(model, str(dst))
    return {"method": "convert_float_to_float16", "keep_io_types": True, "fp32_ops": FP16_BLOCK}


def int8_dynamic(src: Path, dst: Path, op_types: Iterable[str] = ("MatMul",)) -> dict:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _quiet():
        quantize_dynamic(
            str(src),
            str(dst),
            op_types_to_quantize=list(op_types),
            per_channel=True,
            weight_type=QuantType.QInt8,
            extra_options={"MatMulConstBOnly": True},
        )
    return {"method": "quantize_dynamic", "op_types": list(op_types), "weights": "int8 per channel"}


class RecordedReader:
    """A `CalibrationDataReader` over recorded activations: a list of {input name: array} feeds."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]):
        self.feeds = list(feeds)
        self._it = iter(self.feeds)

    def get_next(self):
        return next(self._it, None)

    def rewind(self):
        self._it = iter(self.feeds)


def int8_static(
    src: Path, dst: Path, feeds: list[dict[str, np.ndarray]], op_types: Iterable[str] = ("MatMul",)
) -> dict:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(RecordedReader, CalibrationDataReader):
        pass

    with _quiet():
        quantize_static(
            str(src),
            str(dst),
            Reader(feeds),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=list(op_types),
            per_channel=True,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={"MatMulConstBOnly": True, "ActivationSymmetric": True},
        )
    return {
        "method": "quantize_static",
        "format": "QDQ",
        "op_types": list(op_types),
        "calibration": "MinMax",
        "batches": len(feeds),
    }


def int4(src: Path, dst: Path, block: int = 32, algo: str = "rtn", accuracy_level: int = 4) -> dict:
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        HQQWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    if algo == "hqq":
        cfg = HQQWeightOnlyQuantConfig(block_size=block, bits=4)
    else:
        cfg = DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=True, accuracy_level=accuracy_level, bits=4)
    q = MatMulNBitsQuantizer(
        onnx.load(str(src)), bits=4, block_size=block, is_symmetric=True, accuracy_level=accuracy_level, algo_config=cfg
    )
    with _quiet():
        q.process()
    q.model.save_model_to_file(str(dst), use_external_data_format=False)
    return {
        "method": "MatMulNBitsQuantizer",
        "bits": 4,
        "block_size": block,
        "algo": algo,
        "accuracy_level": accuracy_level,
        "op_types": ["MatMul"],
    }

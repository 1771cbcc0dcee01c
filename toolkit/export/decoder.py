"""The Decoder (ConvNeXt stack) as ONNX: hidden (B, N, D) float32 -> mel (B, n_mels, 2N) float32."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..models import TTSModel


class HiddenToMel(nn.Module):
    def __init__(self, model: TTSModel):
        super().__init__()
        self.decoder = model.decoder

    def forward(self, hidden: Tensor) -> Tensor:
        return self.decoder(hidden.transpose(1, 2))


def export_decoder(model: TTSModel, path, opset: int) -> None:
    x = torch.randn(1, 7, model.cfg.gpt.hidden)
    with torch.no_grad():
        torch.onnx.export(
            HiddenToMel(model).eval(),
            (x,),
            str(path),
            input_names=["hidden"],
            output_names=["mel"],
            dynamic_axes={"hidden": {0: "batch", 1: "steps"}, "mel": {0: "batch", 2: "frames"}},
            opset_version=opset,
            dynamo=False,
            do_constant_folding=True,
        )

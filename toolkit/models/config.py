"""Model dimensions as small dataclasses. Defaults are ChatTTS's; `tiny()` is for tests."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields


@dataclass
class GPTConfig:
    hidden: int = 768
    layers: int = 20
    heads: int = 12
    intermediate: int = 3072
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_positions: int = 4096
    num_text_tokens: int = 21178
    num_audio_tokens: int = 626  # the last code is EOS
    num_vq: int = 4

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def eos_code(self) -> int:
        return self.num_audio_tokens - 1


@dataclass
class ConvStackConfig:
    """ConvNeXt stack that maps features to a 100-bin mel (ChatTTS's Decoder and DVAE decoder)."""

    idim: int = 384
    odim: int = 384
    hidden: int = 512
    layers: int = 12
    bn_dim: int = 128
    kernel: int = 7
    dilation: int = 2
    n_mels: int = 100


@dataclass
class GFSQConfig:
    dim: int = 1024
    levels: tuple[int, ...] = (5, 5, 5, 5)
    groups: int = 2
    residuals: int = 2


@dataclass
class VocosConfig:
    n_mels: int = 100
    dim: int = 512
    intermediate: int = 1536
    layers: int = 8
    n_fft: int = 1024
    hop: int = 256
    sample_rate: int = 24000


@dataclass
class ModelConfig:
    gpt: GPTConfig = field(default_factory=GPTConfig)
    decoder: ConvStackConfig = field(default_factory=ConvStackConfig)
    dvae: ConvStackConfig | None = None
    gfsq: GFSQConfig | None = None
    vocos: VocosConfig = field(default_factory=VocosConfig)

    @property
    def samples_per_step(self) -> int:
        return 2 * self.vocos.hop  # two mel frames per GPT step

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        def build(kind, value):
            if value is None:
                return None
            if not isinstance(value, dict):
                raise ValueError(f"{kind.__name__} must be a JSON object, got {value!r}")
            unknown = set(value) - {f.name for f in fields(kind)}
            if unknown:
                raise ValueError(f"unknown {kind.__name__} fields {sorted(unknown)}")
            for f in fields(kind):
                if f.name in value:
                    _check_type(f"{kind.__name__}.{f.name}", f.type, value[f.name])
            if "levels" in value:
                value = {**value, "levels": tuple(value["levels"])}
            return kind(**value)

        if not isinstance(d, dict) or not {"gpt", "decoder", "vocos"} <= set(d):
            raise ValueError("the config needs gpt, decoder and vocos objects")

        gpt = build(GPTConfig, d["gpt"])
        if gpt.heads < 1 or gpt.hidden % gpt.heads or gpt.num_vq < 1 or gpt.num_audio_tokens < 2:
            raise ValueError(
                f"GPTConfig: hidden {gpt.hidden} must split into heads ({gpt.heads}), with at least one "
                f"codebook ({gpt.num_vq}) of two codes or more ({gpt.num_audio_tokens})"
            )
        return cls(
            gpt=gpt,
            decoder=build(ConvStackConfig, d["decoder"]),
            dvae=build(ConvStackConfig, d.get("dvae")),
            gfsq=build(GFSQConfig, d.get("gfsq")),
            vocos=build(VocosConfig, d["vocos"]),
        )


def _check_type(name: str, annotation: str, value) -> None:
    """A manifest's value against its field's annotation ("int", "float", "tuple[int, ...]"): a clear error naming
    the field instead of a TypeError deep inside the model's construction."""
    ok = {
        "int": lambda v: type(v) is int and v >= 0,
        "float": lambda v: type(v) in (int, float) and math.isfinite(v),
        "tuple[int, ...]": lambda v: isinstance(v, (list, tuple)) and all(type(x) is int and x > 0 for x in v),
    }.get(annotation)
    if ok is not None and not ok(value):
        want = {
            "int": "a non-negative integer",
            "float": "a finite number",
            "tuple[int, ...]": "a list of positive integers",
        }[annotation]
        raise ValueError(f"{name} must be {want}, got {value!r} ({type(value).__name__})")


def tiny(num_text_tokens: int = 1024) -> ModelConfig:
    """A few-MB model with every code path of the full one, for tests."""
    return ModelConfig(
        gpt=GPTConfig(
            hidden=64, layers=2, heads=4, intermediate=128, max_positions=512, num_text_tokens=num_text_tokens
        ),
        decoder=ConvStackConfig(idim=32, odim=32, hidden=64, layers=2, bn_dim=16),
        dvae=ConvStackConfig(idim=32, odim=32, hidden=64, layers=2, bn_dim=16),
        gfsq=GFSQConfig(dim=64),
        vocos=VocosConfig(dim=64, intermediate=128, layers=2),
    )

"""Checkpoint I/O: official ChatTTS asset folders (read only, never renamed or rejected for their hash)
and ttsq's own folder format (manifest.json + model.safetensors + tokenizer.json), loaded strictly."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .fileio import atomic_dir, member
from .models import ModelConfig, Tokenizer, TTSModel
from .models.config import ConvStackConfig, GFSQConfig, GPTConfig, VocosConfig

FORMAT = "ttsq"
FORMAT_VERSION = 1
ASSETS = Path(__file__).parent / "assets"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names every problem and the fix."""


# --- reading tensors -----------------------------------------------------------------------------
def read_tensors(path: Path) -> dict[str, Tensor]:
    """safetensors, or a .pt read with weights_only=True (a pickle never runs code here)."""
    if not path.is_file():
        raise CheckpointError(f"missing checkpoint file: {path}")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(
            f"cannot read {path}: {type(e).__name__}: {e}. The file is corrupt, truncated, or (for .pt) "
            "holds code or objects other than tensors; re-export or re-download it"
        ) from e
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise CheckpointError(f"{path} does not hold a flat dict of tensors")
    return obj


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_strict(model: torch.nn.Module, state: dict[str, Tensor], source: str, assign: bool = False) -> None:
    """Load with one error that lists every missing, unexpected and mis-shaped tensor."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = sorted(
        f"{k}: file {tuple(state[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in set(state) & set(expected)
        if state[k].shape != expected[k].shape
    )
    if missing or unexpected or wrong:
        lines = [f"{source} does not match the model architecture:"]
        for title, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong)):
            if items:
                lines.append(
                    f"  {title} ({len(items)}): " + ", ".join(items[:12]) + (" ..." if len(items) > 12 else "")
                )
        lines.append("  Is this a ChatTTS-architecture checkpoint, and are all its files from the same release?")
        raise CheckpointError("\n".join(lines))
    model.load_state_dict(state, strict=True, assign=assign)


# --- official ChatTTS layout ---------------------------------------------------------------------
def _fold_weight_norm(g: Tensor, v: Tensor) -> Tensor:
    return g * v / v.norm(dim=1, keepdim=True)


def _pick(state: dict, path: Path, name: str) -> Tensor:
    if name not in state:
        raise CheckpointError(f"{path} lacks tensor {name!r}")
    return state[name]


def _official_file(asset: Path, stem: str) -> Path:
    for ext in (".safetensors", ".pt"):
        if (asset / f"{stem}{ext}").is_file():
            return asset / f"{stem}{ext}"
    raise CheckpointError(
        f"missing {asset / stem}.safetensors: an official ChatTTS asset folder holds "
        "gpt/, tokenizer/, Embed, DVAE, Decoder and Vocos .safetensors"
    )


DVAE_UNUSED = ("encoder.", "downsample_conv.", "preprocessor_mel.", "vq_layer.")  # encode direction only


def _convstack_keys(state: dict, prefix: str, out: str, unused: tuple[str, ...] = ()) -> dict[str, Tensor]:
    """ChatTTS DVAE-class keys -> ttsq ConvStack keys; unknown keys pass through so strict loading lists them."""
    mapped = {}
    for k, v in state.items():
        if k.startswith(unused):
            continue
        if k.startswith(prefix + "decoder."):
            k2 = k[len(prefix + "decoder.") :]
            k2 = re.sub(r"^decoder_block\.(\d+)\.weight$", r"blocks.\1.scale", k2)
            k2 = re.sub(r"^decoder_block\.", "blocks.", k2)
            mapped[out + k2] = v
        elif k in (prefix + "out_conv.weight", prefix + "coef"):
            mapped[out + k[len(prefix) :]] = v
        else:
            mapped[out + "<file>." + k] = v
    return mapped


def convstack_config(state: dict, prefix: str, idim: int) -> ConvStackConfig:
    """The ConvStack config whose shapes the state's `prefix` weights have (widths, layers, kernel)."""
    layers = len({k.split(".")[1] for k in state if k.startswith(prefix + "blocks.")})
    hidden, bn_dim, _ = state[prefix + "conv_in.2.weight"].shape
    odim = state[prefix + "conv_out.weight"].shape[0]
    dw = state[prefix + "blocks.0.dwconv.weight"] if layers else None
    kernel = dw.shape[-1] if dw is not None else 7
    n_mels = state[prefix + "out_conv.weight"].shape[0] if prefix + "out_conv.weight" in state else 100
    return ConvStackConfig(
        idim=idim, odim=odim, hidden=hidden, layers=layers, bn_dim=bn_dim, kernel=kernel, n_mels=n_mels
    )


def _vocos_keys(state: dict) -> dict[str, Tensor]:
    mapped = {}
    for k, v in state.items():
        if k.startswith("feature_extractor.") or k == "head.istft.window":
            continue  # recomputed, not learned
        k2 = k.replace("backbone.convnext.", "blocks.").replace("backbone.final_layer_norm.", "final_norm.")
        k2 = k2.replace("backbone.", "").replace("head.out.", "out.")
        k2 = re.sub(r"^(blocks\.\d+)\.gamma$", r"\1.scale", k2)
        mapped["vocos." + k2] = v
    return mapped


def _most_common(shapes: list[tuple]) -> tuple | None:
    return max(set(shapes), key=shapes.count) if shapes else None


def check_official_shapes(
    hf: dict, gpt: dict[str, Tensor], embed: dict[str, Tensor], n_layers: int, gpt_file: Path, embed_file: Path
) -> None:
    """Every block and embedding tensor against the shape the config implies, each mismatch named by key, before
    anything is concatenated ("Sizes of tensors must match" named nothing). The widths come from config.json where
    it gives them, else from what most tensors agree on, so a wrong block 0 is blamed on block 0."""
    D = hf.get("hidden_size") or (embed["emb_text.weight"].shape[1] if "emb_text.weight" in embed else None)
    ffn = [
        tuple(gpt[f"layers.{i}.mlp.gate_proj.weight"].shape)
        for i in range(n_layers)
        if f"layers.{i}.mlp.gate_proj.weight" in gpt
    ]
    I = hf.get("intermediate_size") or (_most_common(ffn) or (None,))[0]
    codes = [tuple(v.shape) for k, v in embed.items() if re.fullmatch(r"emb_code\.\d+\.weight", k)]
    V = (_most_common(codes) or (None,))[0]
    want: dict[str, tuple[Path, tuple]] = {}
    for i in range(n_layers):
        p = f"layers.{i}."
        want.update({f"{p}self_attn.{x}_proj.weight": (gpt_file, (D, D)) for x in "qkvo"})
        want.update({f"{p}mlp.{x}_proj.weight": (gpt_file, (I, D)) for x in ("gate", "up")})
        want[f"{p}mlp.down_proj.weight"] = (gpt_file, (D, I))
        want.update({f"{p}{x}_layernorm.weight": (gpt_file, (D,)) for x in ("input", "post_attention")})
    want["norm.weight"] = (gpt_file, (D,))
    want.update({k: (embed_file, (V, D)) for k in embed if re.fullmatch(r"emb_code\.\d+\.weight", k)})
    if "emb_text.weight" in embed:
        want["emb_text.weight"] = (embed_file, (embed["emb_text.weight"].shape[0], D))
    wrong = []
    for key, (file, shape) in want.items():
        have = (gpt if file == gpt_file else embed).get(key)
        if have is not None and tuple(have.shape) != shape:
            wrong.append(f"  {file.name}: {key} has shape {tuple(have.shape)}, expected {shape}")
    if wrong:
        raise CheckpointError(
            f"{gpt_file.parent.parent}: {len(wrong)} tensor(s) do not fit the model (hidden {D}, "
            f"ffn {I}, {V} codes per codebook):\n"
            + "\n".join(wrong[:12])
            + ("\n  ..." if len(wrong) > 12 else "")
            + "\n  The files are damaged or mixed from different models; re-download them"
        )


def load_official(root: Path) -> TTSModel:
    asset = root / "asset" if (root / "asset").is_dir() else root
    cfg_path = asset / "gpt" / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"missing {cfg_path}: not an official ChatTTS asset folder")
    try:
        hf = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{cfg_path} is not valid JSON: {e}") from e
    heads = hf.get("num_attention_heads", 12)
    if hf.get("num_key_value_heads", heads) != heads:
        raise CheckpointError(f"{cfg_path}: grouped-query attention is not a ChatTTS architecture")

    gpt_file = asset / "gpt" / "model.safetensors"
    gpt_state = read_tensors(gpt_file if gpt_file.is_file() else _official_file(asset / "gpt", "model"))
    embed_file = _official_file(asset, "Embed")
    embed = read_tensors(embed_file)
    decoder = read_tensors(_official_file(asset, "Decoder"))
    vocos = read_tensors(_official_file(asset, "Vocos"))
    dvae_path = next((asset / f"DVAE{e}" for e in (".safetensors", ".pt") if (asset / f"DVAE{e}").is_file()), None)
    dvae = read_tensors(dvae_path) if dvae_path else None

    state: dict[str, Tensor] = {}
    n_layers = hf.get("num_hidden_layers", 20)
    check_official_shapes(hf, gpt_state, embed, n_layers, gpt_file, embed_file)
    for i in range(n_layers):
        p = f"layers.{i}."
        try:
            state[f"gpt.{p}attention.wqkv.weight"] = torch.cat(
                [gpt_state.pop(f"{p}self_attn.{x}_proj.weight") for x in "qkv"]
            )
            state[f"gpt.{p}attention.wo.weight"] = gpt_state.pop(f"{p}self_attn.o_proj.weight")
            state[f"gpt.{p}feed_forward.w13.weight"] = torch.cat(
                [gpt_state.pop(f"{p}mlp.{x}_proj.weight") for x in ("gate", "up")]
            )
            state[f"gpt.{p}feed_forward.w2.weight"] = gpt_state.pop(f"{p}mlp.down_proj.weight")
            state[f"gpt.{p}attention_norm.weight"] = gpt_state.pop(f"{p}input_layernorm.weight")
            state[f"gpt.{p}ffn_norm.weight"] = gpt_state.pop(f"{p}post_attention_layernorm.weight")
        except KeyError as e:
            raise CheckpointError(f"{gpt_file} lacks {e.args[0]!r} (config.json says {n_layers} layers)") from e
    state["gpt.norm.weight"] = _pick(gpt_state, gpt_file, "norm.weight")
    gpt_state.pop("norm.weight")
    gpt_state.pop("embed_tokens.weight", None)  # unused by ChatTTS
    if gpt_state:
        raise CheckpointError(f"{gpt_file} has unexpected tensors: {sorted(gpt_state)[:12]}")

    n_vq = len({k.split(".")[1] for k in embed if k.startswith("emb_code.")})
    state["gpt.emb_text.weight"] = _pick(embed, asset / "Embed", "emb_text.weight")
    state["gpt.emb_code.weight"] = torch.cat(
        [_pick(embed, asset / "Embed", f"emb_code.{i}.weight") for i in range(n_vq)]
    )

    def head(name):
        base = f"{name}.parametrizations.weight."
        if base + "original0" in embed:
            return _fold_weight_norm(embed[base + "original0"], embed[base + "original1"])
        return _pick(embed, asset / "Embed", f"{name}.weight")  # already folded

    state["gpt.head_text.weight"] = head("head_text")
    state["gpt.head_code.weight"] = torch.cat([head(f"head_code.{i}") for i in range(n_vq)])
    known_embed = {"emb_text.weight"} | {k for k in embed if k.startswith(("emb_code.", "head_text.", "head_code."))}
    if set(embed) - known_embed:
        raise CheckpointError(f"{asset / 'Embed'} has unexpected tensors: {sorted(set(embed) - known_embed)[:12]}")

    state.update(_convstack_keys(decoder, "", "decoder."))
    state.update(_vocos_keys(vocos))

    dvae_cfg = gfsq_cfg = None
    if dvae is not None:
        state.update(_convstack_keys(dvae, "", "dvae.stack.", DVAE_UNUSED))
        groups = sorted({int(k.split(".")[3]) for k in dvae if k.startswith("vq_layer.quantizer.rvqs.")})
        for g in groups:
            for t in ("weight", "bias"):
                state[f"dvae.gfsq.project_out.{g}.{t}"] = dvae[f"vq_layer.quantizer.rvqs.{g}.project_out.{t}"]
        proj = state["dvae.gfsq.project_out.0.weight"]
        dvae_cfg = convstack_config(
            {k[len("dvae.stack.") :]: v for k, v in state.items() if k.startswith("dvae.stack.")}, "", proj.shape[0]
        )
        levels = tuple(
            int(x) for x in dvae.get("vq_layer.quantizer.rvqs.0.layers.0._levels", torch.tensor([5, 5, 5, 5]))
        )
        if len(levels) != proj.shape[1]:
            levels = (5,) * proj.shape[1]
        residuals = (
            len({k.split(".")[5] for k in dvae if re.match(r"vq_layer\.quantizer\.rvqs\.0\.layers\.\d+\.", k)}) or 2
        )
        gfsq_cfg = GFSQConfig(dim=proj.shape[0] * len(groups), levels=levels, groups=len(groups), residuals=residuals)

    D = state["gpt.emb_text.weight"].shape[1]
    cfg = ModelConfig(
        gpt=GPTConfig(
            hidden=D,
            layers=n_layers,
            heads=heads,
            intermediate=state["gpt.layers.0.feed_forward.w2.weight"].shape[1],
            rms_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=float(hf.get("rope_theta", (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
            max_positions=hf.get("max_position_embeddings", 4096),
            num_text_tokens=state["gpt.emb_text.weight"].shape[0],
            num_audio_tokens=state["gpt.emb_code.weight"].shape[0] // n_vq,
            num_vq=n_vq,
        ),
        decoder=convstack_config(
            {k[len("decoder.") :]: v for k, v in state.items() if k.startswith("decoder.")}, "", D // 2
        ),
        dvae=dvae_cfg,
        gfsq=gfsq_cfg,
        vocos=VocosConfig(
            n_mels=state["vocos.embed.weight"].shape[1],
            dim=state["vocos.embed.weight"].shape[0],
            intermediate=state["vocos.blocks.0.pwconv1.weight"].shape[0],
            layers=len({k.split(".")[2] for k in state if k.startswith("vocos.blocks.")}),
            n_fft=state["vocos.out.weight"].shape[0] - 2,
        ),
    )
    tokenizer = Tokenizer(asset / "tokenizer" / "tokenizer.json")
    model = TTSModel(cfg, tokenizer)
    stat_file = ASSETS / "chattts_spk_stat.npy"
    if D == 768 and stat_file.is_file():
        state["spk_stat"] = torch.from_numpy(np.load(stat_file)).float().view(2, D)
    else:
        state["spk_stat"] = model.spk_stat
    load_strict(model, state, f"ChatTTS folder {root}")
    return model.eval().requires_grad_(False)


# --- ttsq format -------------------------------------------------------------------------------
# (key, allowed types, in words) of the manifest fields read before the config
MANIFEST_TYPES = (
    ("format_version", int, "an integer"),
    ("precision", str, "a string"),
    ("frontend", (str, type(None)), "a string or null"),
    ("default_voice", (str, type(None)), "a string or null"),
    ("config", dict, "an object"),
    ("files", dict, "an object"),
    ("recipe", dict, "an object"),
    ("device_kind", str, "a string"),
    ("dtype", str, "a string"),
)


def read_manifest(root: Path) -> dict:
    path = root / "manifest.json"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"cannot read {path}: {e}. Re-create the model folder (ttsq quantize / save)") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(
            f"{path} is not a ttsq manifest (format={manifest.get('format') if isinstance(manifest, dict) else None!r})"
        )
    for key, kinds, what in MANIFEST_TYPES:
        if key in manifest and not isinstance(manifest[key], kinds) or isinstance(manifest.get(key), bool):
            raise CheckpointError(f"{path}: {key!r} must be {what}, got {manifest[key]!r}; re-create the model folder")
    if manifest.get("format_version", 0) > FORMAT_VERSION:
        raise CheckpointError(f"{path} was written by a newer ttsq (format {manifest['format_version']}); upgrade ttsq")
    return manifest


def verify_files(root: Path, manifest: dict) -> None:
    """Missing files fail; a changed hash only warns, since the files are the user's."""
    files = manifest.get("files", {})
    if not isinstance(files, dict) or not all(isinstance(m, dict) for m in files.values()):
        raise CheckpointError(f"{root / 'manifest.json'}: files must map names to objects; re-create the folder")
    for name, meta in files.items():
        f = file_of(root, name)
        if not f.is_file():
            raise CheckpointError(f"{f} is listed in the manifest but missing")
        if type(meta.get("bytes", 0)) is not int or not isinstance(meta.get("sha256", ""), str):
            raise CheckpointError(f"{root / 'manifest.json'}: {name!r} needs an integer bytes and a string sha256")
        if f.stat().st_size != meta.get("bytes", f.stat().st_size):
            raise CheckpointError(
                f"{f} has {f.stat().st_size} bytes but the manifest says {meta['bytes']}: "
                "the file is truncated or was replaced; re-create it"
            )
        if meta.get("sha256") and sha256_file(f) != meta["sha256"]:
            warnings.warn(
                f"{f} differs from the sha256 in its manifest: it was modified or corrupted after it was written",
                stacklevel=3,
            )


def file_of(root: Path, name) -> Path:
    """A file of a ttsq folder, confined to it (fileio.member), with the loader's error type."""
    try:
        return member(root, name)
    except ValueError as e:
        raise CheckpointError(str(e)) from None


def model_config(root: Path, manifest: dict) -> ModelConfig:
    """The manifest's config, its types checked: an edited manifest gets an error naming the field."""
    try:
        return ModelConfig.from_dict(manifest["config"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{root / 'manifest.json'} has a bad config: {e}. Re-create the model folder") from e


def split_state(model: TTSModel) -> dict[str, Tensor]:
    """The state dict plus the named voices (as voice.NAME), which are not module state."""
    state = dict(model.state_dict())
    for name, vec in model.voices.items():
        state[f"voice.{name}"] = vec
    return state


def default_voice_first(voices: dict[str, Tensor], default: str | None, named_in: str) -> dict[str, Tensor]:
    """The voices with `default` first: a synthesis given no speaker uses the first voice, and safetensors stores
    keys sorted, so the manifest writes the default down (default_voice)."""
    if default is None:
        return voices
    if default not in voices:
        raise CheckpointError(
            f"{named_in} names the default voice {default!r}, but the model's voices are "
            f"{sorted(voices) or 'none'}: name one of those"
        )
    return {default: voices[default], **{k: v for k, v in voices.items() if k != default}}


def load_ttsq(root: Path, manifest: dict | None = None) -> TTSModel:
    manifest = manifest or read_manifest(root)
    cfg = model_config(root, manifest)
    verify_files(root, manifest)
    model = TTSModel(cfg, Tokenizer(file_of(root, "tokenizer.json")))
    state = read_tensors(file_of(root, "model.safetensors"))
    voices = {k[len("voice.") :]: state.pop(k) for k in list(state) if k.startswith("voice.")}
    load_strict(model, {k: v.float() if v.is_floating_point() else v for k, v in state.items()}, f"ttsq model {root}")
    model.voices = default_voice_first(voices, manifest.get("default_voice"), str(root / "manifest.json"))
    return model.eval().requires_grad_(False)


def save_ttsq(
    model: TTSModel,
    out: str | Path,
    *,
    force: bool = False,
    extra: dict | None = None,
    weights_dtype: torch.dtype = torch.float32,
) -> Path:
    """Write the weights atomically: a temporary folder, then a rename. An existing folder needs force.
    weights_dtype=torch.float16 stores them at half the size; load_ttsq widens them to fp32 again, so the model
    still computes (and is the reference) at fp32, with fp16-rounded weights."""
    from safetensors.torch import save_file

    out = Path(out)
    dtype_name = str(weights_dtype).removeprefix("torch.")
    state = {}
    for k, v in split_state(model).items():
        v = v.detach().cpu()
        if v.is_floating_point() and v.dtype != weights_dtype:
            narrow = v.to(weights_dtype)
            if (torch.isfinite(v) & ~torch.isfinite(narrow)).any():  # a NaN already there is kept, not refused
                raise ValueError(f"{k} does not fit in {dtype_name} (a value overflows): save it in float32")
            v = narrow
        state[k] = v.contiguous()
    with atomic_dir(out, force=force) as tmp:
        save_file(state, str(tmp / "model.safetensors"))
        shutil.copyfile(model.tokenizer.path, tmp / "tokenizer.json")
        write_manifest(
            tmp,
            {
                "precision": "fp32",
                "weights_dtype": dtype_name,
                "config": model.cfg.to_dict(),
                "frontend": getattr(model, "frontend", None),
                "text_head": getattr(model, "text_head", True),
                "default_voice": model.default_voice,
                **(extra or {}),
            },
        )
    return out


def write_manifest(folder: Path, fields: dict) -> dict:
    files = {
        f.name: {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
        for f in sorted(folder.iterdir())
        if f.is_file() and f.name != "manifest.json"
    }
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, **fields, "files": files}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return manifest


def detect_layout(root: Path) -> str:
    if not root.exists():
        raise CheckpointError(
            f"model path not found: {root}. Pass --model with a ttsq model folder, a "
            "quantized artifact, or an official ChatTTS folder (the one holding asset/)"
        )
    if (root / "manifest.json").is_file():
        return "ttsq"
    if (root / "asset" / "gpt").is_dir() or (root / "gpt" / "config.json").is_file():
        return "chattts"
    raise CheckpointError(
        f"{root} is neither a ttsq model folder (manifest.json) nor an official ChatTTS folder (asset/gpt/config.json)"
    )


# --- DVAE encoders (speakers from sample audio) -------------------------------------------------------
VOICE_ENCODER = "dvae_encoder.safetensors"  # the voice lab's encoder, beside its model (toolkit/assets/voice)


def load_dvae_encoder(root: str | Path, cfg: ModelConfig):
    """The DVAE encoder of a model folder: ChatTTS's from asset/DVAE (its encoder keys), or a voice-lab model's
    dvae_encoder.safetensors. -> a module mapping a 24 kHz waveform (B, N) to codes (B, Q, T)."""
    from .models.dvae_encoder import DVAEEncoder, VoiceCodes

    root = Path(root)
    voice_file = root if root.suffix == ".safetensors" else root / VOICE_ENCODER
    if voice_file.is_file():
        state = {k: v.float() for k, v in read_tensors(voice_file).items()}
        hidden = state["conv_in.0.weight"].shape[0] if "conv_in.0.weight" in state else 256
        enc = VoiceCodes(cfg, hidden)
        load_strict(enc.encoder, state, str(voice_file))
        return enc.eval().requires_grad_(False)
    if detect_layout(root) != "chattts":
        raise CheckpointError(
            f"{root} has no DVAE encoder: an official ChatTTS folder keeps it in asset/DVAE, a voice "
            f"lab model in {VOICE_ENCODER}; copy the one the model was trained with beside it"
        )
    asset = root / "asset" if (root / "asset").is_dir() else root
    dvae = read_tensors(_official_file(asset, "DVAE"))
    if "downsample_conv.0.weight" not in dvae or cfg.gfsq is None:
        raise CheckpointError(
            f"{asset / 'DVAE'} holds no encoder (downsample_conv.*, encoder.*, vq_layer.*): this "
            "release of the DVAE decodes only"
        )
    state = {"coef": dvae["coef"].view(1, -1, 1)}
    for k, v in dvae.items():
        if k.startswith("downsample_conv."):
            state["downsample." + k[len("downsample_conv.") :]] = v
        elif k.startswith("encoder."):
            k2 = re.sub(r"^decoder_block\.(\d+)\.weight$", r"blocks.\1.scale", k[len("encoder.") :])
            state["body." + k2.replace("decoder_block.", "blocks.")] = v
        elif m := re.fullmatch(r"vq_layer\.quantizer\.rvqs\.(\d+)\.project_in\.(weight|bias)", k):
            state[f"gfsq.project_in.{m[1]}.{m[2]}"] = v
    body = {k[len("body.") :]: v for k, v in state.items() if k.startswith("body.")}
    body_cfg = convstack_config(body, "", body["conv_in.0.weight"].shape[1])
    dim = dvae["downsample_conv.0.weight"].shape[0]
    gfsq = GFSQConfig(dim=body_cfg.odim, levels=cfg.gfsq.levels, groups=cfg.gfsq.groups, residuals=cfg.gfsq.residuals)
    enc = DVAEEncoder(dim, body_cfg, gfsq, cfg.vocos)
    load_strict(enc, state, f"the DVAE encoder of {asset / 'DVAE'}")
    fb = dvae.get("preprocessor_mel.mel_spec.mel_scale.fb")
    if fb is not None and fb.shape == enc.logmel.fb.shape:
        enc.logmel.fb.copy_(fb)  # torchaudio's float32 filterbank, to the last bit
    return enc.eval().requires_grad_(False)

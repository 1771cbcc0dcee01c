"""Export a ttsq model to ONNX (fp32, fp16, int8, int4) for the torch-free runtime in `toolkit.runtime`.

    from toolkit.export import export_onnx
    export_onnx("toolkit/assets/voice", "int8", "voice-int8")

The folder holds gpt.onnx (prefill and decode step in one graph, the KV cache as explicit inputs/outputs),
decoder.onnx, vocos.onnx (mel -> complex spectrum; the ISTFT runs in numpy), tokenizer.json, spk_stat.npy,
voices/*.npy and onnx_manifest.json; and text_head.onnx (GPT state -> text logits, for refine) where the model
has a trained text head (a ChatTTS checkpoint). See README.md in this folder.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Callable

import numpy as np

MANIFEST = "onnx_manifest.json"
FORMAT = "ttsq-onnx"
FORMAT_VERSION = 1
OPSET = 17
GRAPHS = ("gpt", "decoder", "vocos")

__all__ = ["export_onnx", "MANIFEST", "OPSET"]


def _io(path: Path) -> dict:
    import onnx

    m = onnx.load(str(path), load_external_data=False)

    def desc(v):
        t = v.type.tensor_type
        dims = [d.dim_param or d.dim_value for d in t.shape.dim]
        return {"name": v.name, "shape": dims, "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name}

    inits = {i.name for i in m.graph.initializer}
    return {
        "inputs": [desc(v) for v in m.graph.input if v.name not in inits],
        "outputs": [desc(v) for v in m.graph.output],
    }


def _record_activations(model, model_dir, calib_set, limit: int, max_steps: int, progress=None):
    """Run the torch model on calibration texts; record the Decoder's and Vocos's inputs."""
    import torch

    from ..sampling import SamplingParams
    from ..synthesizer import Synthesizer
    from ..textsets import load_text_set, set_hash

    records = load_text_set(calib_set, limit=limit, purpose="calibration")
    synth = Synthesizer(model, "cpu")
    params = SamplingParams(max_new_tokens=max_steps)
    dec, voc = [], []
    with torch.inference_mode():
        for i, r in enumerate(records):
            speaker = r.speaker if r.speaker else None
            try:
                utt = synth.synthesize(r.text, speaker=speaker, seed=i, params=params)[0]
            except ValueError:  # e.g. a named voice this model lacks
                utt = synth.synthesize(r.text, seed=i, params=params)[0]
            for seg in utt.segments:
                if seg.hidden.shape[0] == 0:
                    continue
                h = seg.hidden[None].float()
                dec.append({"hidden": h.numpy()})
                voc.append({"mel": model.hidden_to_mel(h).float().numpy()})
            if progress:
                progress("calibrate", i + 1, len(records))
    meta = {"file": str(calib_set), "sha256": set_hash(calib_set), "texts": len(records), "max_steps": max_steps}
    return dec, voc, meta


def export_onnx(
    model_path,
    precision: str,
    out,
    *,
    calib_set=None,
    force: bool = False,
    progress: Callable[[str, int, int], None] | None = None,
    calib_limit: int = 16,
    calib_steps: int = 64,
) -> Path:
    """Export `model_path` (a ttsq folder or an official ChatTTS folder; None = the shipped voice) at `precision`
    (fp32, fp16, int8, int4, int4-hqq, int4-b128, int4-hqq-b128) to the folder `out`, atomically.
    `calib_set` (a JSONL text set) switches the int8 Decoder/Vocos to static QDQ calibrated on recorded
    activations. `progress(stage, done, total)` is called per stage. Returns `out`."""
    import torch

    from ..fileio import atomic_dir, check_output_dir, work_dir
    from ..refine import RefineError, check_refinable
    from ..synthesizer import DEFAULT_MODEL, load_model
    from . import quantize as q
    from .decoder import export_decoder
    from .gpt import export_gpt, export_text_head
    from .vocos import export_vocos

    spec = q.parse_precision(precision)
    out = Path(out)
    check_output_dir(out, force=force)  # fail before the slow part
    model_path = Path(model_path) if model_path is not None else DEFAULT_MODEL
    step = progress or (lambda *a: None)
    stages = ["export gpt", "export decoder", "export vocos", "quantize", "write"]
    model = load_model(model_path).float().eval()
    if model.tokenizer is None:
        raise ValueError(f"{model_path} has no tokenizer.json; the runtime needs one")
    try:  # refine reads the text head: exported only where it was trained
        check_refinable(model.tokenizer, getattr(model, "text_head", True))
        graphs = (*GRAPHS, "text_head")
    except RefineError:
        graphs = GRAPHS
    t0 = time.perf_counter()
    quant: dict[str, dict] = {}
    with work_dir("export") as work, atomic_dir(out, force=force) as tmp:
        work = Path(work)
        with torch.no_grad():
            step(stages[0], 0, 1)
            export_gpt(model.gpt, work / "gpt.onnx", OPSET)
            step(stages[0], 1, 1)
            step(stages[1], 0, 1)
            export_decoder(model, work / "decoder.onnx", OPSET)
            step(stages[1], 1, 1)
            step(stages[2], 0, 1)
            export_vocos(model, work / "vocos.onnx", OPSET)
            step(stages[2], 1, 1)
            if "text_head" in graphs:
                export_text_head(model.gpt, work / "text_head.onnx", OPSET)
        kind = spec["kind"]
        feeds = None
        calib_meta = None
        if kind == "int8" and calib_set is not None:
            dec_feeds, voc_feeds, calib_meta = _record_activations(
                model, model_path, calib_set, calib_limit, calib_steps, progress
            )
            feeds = {"decoder": dec_feeds, "vocos": voc_feeds}
        for i, g in enumerate(graphs):
            step(stages[3], i, len(graphs))
            src, dst = work / f"{g}.onnx", tmp / f"{g}.onnx"
            if kind == "fp32" or (g == "text_head" and kind != "fp16"):  # kept float, as the torch recipes keep it
                shutil.copyfile(src, dst)
                quant[g] = {"method": "none"}
            elif kind == "fp16":
                quant[g] = q.to_fp16(src, dst)
            elif kind == "int8":
                if feeds is not None and g != "gpt" and feeds[g]:
                    quant[g] = q.int8_static(src, dst, feeds[g])
                else:
                    quant[g] = q.int8_dynamic(src, dst)
            else:  # int4: the GPT's MatMuls in 4 bits; the convolution stacks' MatMuls in int8
                quant[g] = q.int4(src, dst, spec["block"], spec["algo"]) if g == "gpt" else q.int8_dynamic(src, dst)
        step(stages[3], len(graphs), len(graphs))
        step(stages[4], 0, 1)
        shutil.copyfile(model.tokenizer.path, tmp / "tokenizer.json")
        np.save(tmp / "spk_stat.npy", model.spk_stat.float().numpy())
        voices = {}
        if model.voices:
            (tmp / "voices").mkdir()
            for name, vec in model.voices.items():
                np.save(tmp / "voices" / f"{name}.npy", vec.float().numpy())
                voices[name] = f"voices/{name}.npy"
        manifest = _manifest(model, spec, quant, tmp, voices, calib_meta, model_path, graphs)
        manifest["export_seconds"] = round(time.perf_counter() - t0, 2)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        step(stages[4], 1, 1)
    return out


def _manifest(model, spec, quant, folder: Path, voices, calib_meta, source, graphs=GRAPHS) -> dict:
    import dataclasses

    from ..checkpoint import sha256_file
    from ..sampling import SamplingParams
    from ..synthesizer import source_name

    tok = model.tokenizer
    files = {}
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = f.relative_to(folder).as_posix()
        files[rel] = {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
    g = model.cfg.gpt
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "precision": spec["name"],
        "opset": OPSET,
        "source": source_name(source),
        "graphs": {
            name: {"file": f"{name}.onnx", **_io(folder / f"{name}.onnx"), "quantization": quant[name]}
            for name in graphs
        },
        "decode": {
            "cache": "grown: present_* (B,H,P+T,K) of one call is the next call's past_*",
            "prefill": "ids = text ids on all Q channels, text_mask True, past length 0",
            "step": "ids = the sampled codes (B,1,Q), text_mask False, key_valid appended with True",
            "hidden": "the state each code is sampled from; the Decoder reads these",
        },
        "istft": {
            "where": "numpy",
            "n_fft": model.cfg.vocos.n_fft,
            "hop": model.cfg.vocos.hop,
            "window": "hann",
            "center": True,
        },
        "streaming": {"decoder_radius": model.decoder.receptive_radius, "vocos_radius": model.vocos.receptive_radius},
        "config": model.cfg.to_dict(),
        "tokenizer": "tokenizer.json",
        "special_tokens": {
            t: tok.token_id(t)
            for t in ("[spk_emb]", "[Stts]", "[Ptts]", "[speed_5]", "[Sbreak]", "[Pbreak]", "[Ebreak]", "[break_0]")
            if tok.has(t)
        },
        "text_head": getattr(model, "text_head", True),
        "pad_id": tok.pad_id,
        "spk_stat": "spk_stat.npy",
        "voices": voices,
        "frontend": getattr(model, "frontend", None) or "none",
        "sample_rate": model.cfg.vocos.sample_rate,
        "sampling": dataclasses.asdict(SamplingParams()),
        "eos_code": g.eos_code,
        "calibration": calib_meta,
        "files": files,
    }

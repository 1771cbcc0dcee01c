"""ONNX Runtime sessions of an exported folder, and the GPT decode loop over the grown KV cache."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import onnxruntime as ort

from ..fileio import member
from ..models.config import ModelConfig
from .sampling import SamplingParams, draw, process_logits

MANIFEST = "onnx_manifest.json"


def is_exported(path) -> bool:
    return path is not None and (Path(path) / MANIFEST).is_file()


def read_manifest(root: Path) -> dict:
    """The export's manifest with its types checked and every file it names confined to the folder (fileio.member);
    the files the runtime reads are replaced by their paths: graphs[g]["file"], tokenizer, spk_stat, voices."""
    root = Path(root)
    path = root / MANIFEST
    try:
        m = json.loads(member(root, MANIFEST, MANIFEST).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read {path}: {e}. Re-export the model (ttsq export)") from e
    if not isinstance(m, dict) or m.get("format") != "ttsq-onnx":
        raise ValueError(f"{path} is not a ttsq ONNX manifest")
    try:
        ModelConfig.from_dict(m.get("config"))  # the same field checks as the torch loader's
        _check(
            m,
            {
                "precision": str,
                "files": dict,
                "graphs": dict,
                "tokenizer": str,
                "spk_stat": str,
                "voices": dict,
                "sample_rate": int,
                "pad_id": int,
                "istft": dict,
                "streaming": dict,
            },
        )
        _check(m["istft"], {"n_fft": int, "hop": int})
        _check(m["streaming"], {"decoder_radius": int, "vocos_radius": int})
        for g in ("gpt", "decoder", "vocos"):
            _check(m["graphs"].get(g), {"file": str})
    except ValueError as e:
        raise ValueError(f"{path}: {e}. Re-export the model (ttsq export)") from None
    for name, meta in m["files"].items():
        f = member(root, name, MANIFEST)
        size = meta.get("bytes") if isinstance(meta, dict) else None
        if type(size) is not int:
            raise ValueError(f"{path}: files[{name!r}] needs an integer bytes; re-export")
        if not f.is_file() or f.stat().st_size != size:
            raise ValueError(f"{f} is missing or has the wrong size (manifest says {size} bytes); re-export")
    for g in ("gpt", "decoder", "vocos"):
        m["graphs"][g]["file"] = member(root, m["graphs"][g]["file"], MANIFEST)
    m["tokenizer"], m["spk_stat"] = member(root, m["tokenizer"], MANIFEST), member(root, m["spk_stat"], MANIFEST)
    m["voices"] = {k: member(root, v, MANIFEST) for k, v in m["voices"].items()}
    return m


def _check(d, types: dict[str, type]) -> None:
    if not isinstance(d, dict):
        raise ValueError(f"expected an object with {', '.join(types)}, got {d!r}")
    for key, kind in types.items():
        if key not in d and key in ("pad_id", "voices"):
            continue
        if key not in d or not isinstance(d[key], kind) or isinstance(d[key], bool):
            raise ValueError(
                f"{key!r} must be {'an integer' if kind is int else 'a ' + kind.__name__}, got {d.get(key)!r}"
            )


def pick_providers(prefer: str | None = None) -> tuple[list[str], str | None]:
    """CUDA when this onnxruntime build offers it, else CPU (with a one-line note)."""
    have = ort.get_available_providers()
    prefer = (prefer or "").split(":")[0] or None
    if prefer == "cpu":
        return ["CPUExecutionProvider"], None
    if "CUDAExecutionProvider" in have:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"], None
    if prefer == "cuda":
        raise RuntimeError(
            "CUDA asked for, but this onnxruntime has no CUDAExecutionProvider "
            "(install onnxruntime-gpu instead of onnxruntime)"
        )
    return ["CPUExecutionProvider"], "ttsq runtime: CUDA execution provider not available, running ONNX Runtime on CPU"


@dataclass
class Generation:
    hidden: np.ndarray  # (B, N, D) float32
    codes: np.ndarray  # (B, N, Q) int64
    lengths: np.ndarray  # (B,)
    finished: np.ndarray  # (B,) bool


@dataclass
class Chunk:
    start: int
    hidden: np.ndarray  # (B, n, D)
    codes: np.ndarray  # (B, n, Q)
    lengths: np.ndarray
    finished: np.ndarray
    ready: None = None  # the torch engine's CUDA event; numpy work is done when handed over


class Sessions:
    def __init__(self, root: Path, manifest: dict, threads: int | None = None, device: str | None = None):
        self.providers, self.note = pick_providers(device)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
        graphs = manifest["graphs"]  # paths checked by read_manifest
        self.gpt = ort.InferenceSession(str(graphs["gpt"]["file"]), opts, providers=self.providers)
        self.decoder = ort.InferenceSession(str(graphs["decoder"]["file"]), opts, providers=self.providers)
        self.vocos = ort.InferenceSession(str(graphs["vocos"]["file"]), opts, providers=self.providers)
        head = manifest["graphs"].get("text_head")  # exported where the model has a trained text head (refine)
        self.text_head = (
            ort.InferenceSession(str(member(root, head["file"], MANIFEST)), opts, providers=self.providers)
            if head
            else None
        )


class Engine:
    def __init__(self, sessions: Sessions, cfg: dict, chunk: int = 16):
        self.s = sessions
        g = cfg["gpt"]
        self.L, self.H, self.D = g["layers"], g["heads"], g["hidden"]
        self.K = self.D // self.H
        self.Q, self.V = g["num_vq"], g["num_audio_tokens"]
        self.V_text = g["num_text_tokens"]
        self.eos = self.V - 1
        self.max_positions = g["max_positions"]
        self.chunk = chunk
        self._outs = [o.name for o in self.s.gpt.get_outputs()]

    def _run(self, feeds: dict[str, np.ndarray], past: list) -> tuple[np.ndarray, np.ndarray, list]:
        vals = {k: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v)) for k, v in feeds.items()}
        for i in range(self.L):
            vals[f"past_k_{i}"], vals[f"past_v_{i}"] = past[2 * i], past[2 * i + 1]
        out = self.s.gpt.run_with_ort_values(self._outs, vals)
        return out[0].numpy(), out[1].numpy(), list(out[2:])

    def stream(
        self,
        ids: np.ndarray,
        valid: np.ndarray,
        speaker: np.ndarray,
        spk_id: int | None,
        params: SamplingParams,
        seed: int = 0,
        should_stop: Callable[[], bool] | None = None,
        sample: np.ndarray | None = None,
        text_eos: int | None = None,
    ) -> Iterator[Chunk]:
        """ids (B, T) left-padded text ids, valid (B, T) bool, speaker (B, D) -> chunks of `chunk` steps.
        sample (S, Q): a sample-audio speaker's codes, placed after every row's text (ChatTTS's spk_smp).
        text_eos: generate text tokens through text_head.onnx (refine), one per step (codes (B, n, 1)), until this
        id; None: audio codes."""
        B = ids.shape[0]
        text = text_eos is not None
        Q, V = (1, self.V_text) if text else (self.Q, self.V)
        eos = text_eos if text else self.eos
        spk_mask = ids == spk_id if spk_id is not None else np.zeros_like(valid)
        prompt, text_mask = np.repeat(ids[..., None], self.Q, 2).astype(np.int64), np.ones(ids.shape, bool)
        if sample is not None:
            S = len(sample)
            prompt = np.concatenate([prompt, np.repeat(sample[None].astype(np.int64), B, 0)], 1)
            text_mask = np.concatenate([text_mask, np.zeros((B, S), bool)], 1)
            valid = np.concatenate([valid, np.ones((B, S), bool)], 1)
            spk_mask = np.concatenate([spk_mask, np.zeros((B, S), bool)], 1)
        T = prompt.shape[1]
        steps = min(params.max_new_tokens, self.max_positions - T)
        if steps < 1:
            raise ValueError(
                f"prompt of {T} tokens leaves no room to generate (max_positions {self.max_positions}); "
                "split the text into shorter sentences"
            )
        empty = np.zeros((B, self.H, 0, self.K), np.float32)
        past = [ort.OrtValue.ortvalue_from_numpy(empty) for _ in range(2 * self.L)]
        rope = np.maximum(np.cumsum(valid.astype(np.int64), 1) - 1, 0)
        key_valid = valid.astype(bool)
        logits, h, past = self._run(
            {
                "ids": prompt,
                "text_mask": text_mask,
                "speaker": speaker.astype(np.float32),
                "spk_mask": spk_mask.astype(bool),
                "rope_pos": rope,
                "key_valid": key_valid,
            },
            past,
        )
        rope_base = valid.sum(1, keepdims=True).astype(np.int64)
        temps = np.tile(np.asarray(params.temperatures(Q), np.float32), B)
        history = np.full((B * Q, params.penalty_window), V, np.int64)
        finished = np.zeros(B, bool)
        lengths = np.zeros(B, np.int64)
        rng = np.random.default_rng(int(seed))
        no_text = np.zeros((B, 1), bool)
        step_mask = np.ones((B, 1), bool) if text else no_text  # text tokens are read from channel 0 of Q
        zeros_spk = np.zeros((B, self.D), np.float32)
        start = 0
        hid, cod = [], []
        for i in range(steps):
            if text:
                logits = self.s.text_head.run(None, {"hidden": np.ascontiguousarray(h, np.float32)})[0]
            if not np.isfinite(logits.reshape(B, -1)[~finished]).all():  # NaN never samples EOS: noise to the end
                raise FloatingPointError(
                    f"the GPT's code logits are NaN/inf at step {i}: the exported model's "
                    "head_code or last layers hold non-finite values; re-export it"
                )
            lg = process_logits(logits.reshape(B * Q, V), history, params, temps)
            if i < params.min_new_tokens:
                lg[:, eos] = -np.inf
            codes = draw(lg, rng.standard_exponential((B * Q, V), dtype=np.float32))
            history[:, i % params.penalty_window] = codes
            codes = codes.reshape(B, Q)
            hid.append(h)
            cod.append(codes)
            finished |= (codes == eos).any(-1)
            lengths += ~finished
            done = bool(finished.all()) or i == steps - 1
            if done or len(hid) == self.chunk:
                yield Chunk(start, np.stack(hid, 1), np.stack(cod, 1), lengths.copy(), finished.copy())
                start += len(hid)
                hid, cod = [], []
                if done or (should_stop is not None and should_stop()):
                    return
            key_valid = np.concatenate([key_valid, np.ones((B, 1), bool)], 1)
            fed = np.repeat(codes, self.Q, 1) if text else codes  # (B, Q)
            logits, h, past = self._run(
                {
                    "ids": fed[:, None].astype(np.int64),
                    "text_mask": step_mask,
                    "speaker": zeros_spk,
                    "spk_mask": no_text,
                    "rope_pos": rope_base + i,
                    "key_valid": key_valid,
                },
                past,
            )

    def generate(self, *args, **kwargs) -> Generation:
        chunks = list(self.stream(*args, **kwargs))
        last = chunks[-1]
        return Generation(
            np.concatenate([c.hidden for c in chunks], 1),
            np.concatenate([c.codes for c in chunks], 1),
            last.lengths,
            last.finished,
        )

"""The one library API: model path + device + precision -> `synthesize(texts)` -> 24 kHz waveforms."""

from __future__ import annotations

import contextlib
import copy
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
from torch import Tensor

from . import checkpoint
from .engine import Engine, NumericalError, sync_device
from .models import TTSModel
from .plan import Plan
from .prompt import Voice, encode_prompts, encode_refine_prompts, resolve_speaker, resolve_voice
from .refine import EOS, check_prompt, check_refinable, refine_params, refine_plan, refined_texts
from .sampling import SamplingParams

DEFAULT_MODEL = Path(__file__).parent / "assets" / "voice"
SHIPPED_VOICE = "shipped voice"  # how a manifest names DEFAULT_MODEL as a source: its path differs per install


def source_name(path: str | Path | None) -> str:
    """What an artifact or export records as the model it came from: an absolute path, or SHIPPED_VOICE."""
    if path is None or Path(path).resolve() == DEFAULT_MODEL.resolve():
        return SHIPPED_VOICE
    return str(Path(path).resolve())


def source_path(name: str | None) -> Path | None:
    """The model a manifest's "source" names (source_name's inverse; older exports wrote the shipped voice's path):
    DEFAULT_MODEL, an existing folder, or None when it is not recorded or no longer there."""
    if not name:
        return None
    if name == SHIPPED_VOICE:
        return DEFAULT_MODEL
    return Path(name) if Path(name).is_dir() else None


class OutOfMemory(RuntimeError):
    """The device ran out of memory; the synthesizer has released its buffers and serves the next request."""


def _is_out_of_memory(e: RuntimeError) -> bool:  # CUDA raises OutOfMemoryError, the CPU allocator a RuntimeError
    return isinstance(e, torch.OutOfMemoryError) or "can't allocate memory" in str(e)


@dataclass
class Segment:
    """One sentence of an utterance, with what the GPT produced for it (on the CPU)."""

    text: str
    codes: Tensor  # (n, Q) sampled codes before EOS
    hidden: Tensor  # (n, D) float32 states the Decoder read


@dataclass
class Utterance:
    wav: np.ndarray  # float32 mono at `sample_rate`
    sample_rate: int
    steps: int  # GPT steps before EOS, summed over the text's sentences
    hit_limit: bool  # some sentence ran to max_new_tokens without EOS
    timings: dict[str, float] = field(default_factory=dict)  # seconds: gpt, decoder, vocoder, total (refine)
    segments: list[Segment] = field(default_factory=list)

    @property
    def duration(self) -> float:
        return len(self.wav) / self.sample_rate

    @property
    def text(self) -> str:
        """What the GPT read, sentence by sentence: the refined text when synthesized with refine."""
        return " ".join(s.text for s in self.segments)


def resolve_device(device: str | torch.device | None) -> torch.device:
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"device {dev} asked for, but this torch build sees no CUDA GPU; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise RuntimeError(f"device {dev} does not exist: {torch.cuda.device_count()} CUDA device(s) visible")
    elif dev.type != "cpu":
        raise RuntimeError(f"unsupported device {dev}; use cpu or cuda[:N]")
    return dev


def load_model(path: str | Path | None = None, device: torch.device | str = "cpu") -> TTSModel:
    """A ttsq folder (fp32 or a quantized artifact) or an official ChatTTS folder; the shipped voice by default."""
    root = Path(path) if path is not None else DEFAULT_MODEL
    layout = checkpoint.detect_layout(root)
    if layout == "chattts":
        return checkpoint.load_official(root)
    manifest = checkpoint.read_manifest(root)
    if manifest.get("precision", "fp32") != "fp32" or "recipe" in manifest:
        from .precision.artifact import load_artifact

        model = load_artifact(root, manifest, device)
    else:
        model = checkpoint.load_ttsq(root, manifest)
    model.frontend = manifest.get("frontend")  # the text front end the model was trained with (e.g. "espeak")
    model.text_head = manifest.get("text_head", True)  # False: the GPT's text head was never trained (no refine)
    return model


class Synthesizer:
    def __init__(
        self,
        model: str | Path | TTSModel | None = None,
        device: str | None = None,
        precision: str | None = None,
        *,
        warmup: bool = False,
        compile: bool = False,
        kernels: bool | None = None,
        **recipe_options,
    ):
        """compile: torch.compile the decode step of batches the Triton kernels do not take (costs a compile of
        seconds at the first request of each batch size and cache bucket, so pair it with warmup).
        kernels: the Triton decode step (toolkit/kernels.py) at batch <= 2: None uses it on CUDA where it runs,
        False turns it off, True insists on it (Engine's `kernels`)."""
        self.device = resolve_device(device)
        self.model = model if isinstance(model, TTSModel) else load_model(model, self.device)
        if self.model.tokenizer is None:
            raise ValueError("the model has no tokenizer")
        self.model.to(self.device)
        if precision is not None:
            from .precision import quantize

            quantize(self.model, precision, device=self.device, **recipe_options)
        self.precision = precision or getattr(self.model, "precision", "fp32")
        self.engine = Engine(self.model.gpt, compile=compile, kernels=kernels)
        self._fp32: dict[str, torch.nn.Module] = {}  # stages that overflowed in half precision
        if warmup:
            self.warmup()

    def warmup(self, batch_sizes: Sequence[int] = (1,), steps: int | None = None) -> None:
        """Allocate the KV cache and capture (and compile) the decode graphs now, so the first request pays nothing
        extra: every cache bucket up to `steps` GPT steps (default: the first bucket only)."""
        n = steps or self.engine.chunk + 1
        for b in batch_sizes:
            with warnings.catch_warnings():  # "reached max_new_tokens": meant to, here
                warnings.simplefilter("ignore")
                self.synthesize(
                    ["warm up."] * b, batch_size=b, params=SamplingParams(max_new_tokens=n, min_new_tokens=n)
                )

    def _fallback(self, stage: str) -> torch.nn.Module:
        """An fp32 copy of a half-precision stage that produced inf/NaN (made once, then reused)."""
        module = getattr(self.model, stage)
        dtype = next(module.parameters()).dtype
        if dtype not in (torch.float16, torch.bfloat16):
            raise NumericalError(f"the {stage} produced NaN/inf at {dtype}; the checkpoint itself may be broken")
        if stage not in self._fp32:
            warnings.warn(
                f"the {stage} overflowed in {str(dtype).removeprefix('torch.')}: this stage now runs "
                "in fp32 (the rest keeps its precision)",
                RuntimeWarning,
                stacklevel=3,
            )
            self._fp32[stage] = copy.deepcopy(module).float()
        return self._fp32[stage]

    @contextlib.contextmanager
    def memory_guard(self, batch: int):
        """Turns an allocation failure into OutOfMemory after freeing what the failed request held."""
        try:
            yield
        except RuntimeError as e:  # torch.OutOfMemoryError is one
            if not _is_out_of_memory(e):
                raise
            self.engine.release()
            free = ""
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
                have, total = torch.cuda.mem_get_info(self.device)
                free = f"; {have / 2**30:.1f} of {total / 2**30:.1f} GiB free now"
            raise OutOfMemory(
                f"{self.device} ran out of memory on a batch of {batch} sentence(s){free}. Pass a "
                "smaller batch_size (--batch-size), shorter texts or max_new_tokens, or a smaller "
                "precision (int8, int4); this synthesizer has released its buffers and serves the "
                "next request"
            ) from None

    def _generate(self, emb: Tensor, valid: Tensor, params: SamplingParams, seed: int, should_stop):
        try:
            gen = self.engine.generate(emb, valid, params, seed=seed, should_stop=should_stop)
        except NumericalError as e:  # non-finite logits: in half precision an overflow, which fp32 may avoid
            gen, why = None, e
        else:
            steps = torch.arange(gen.hidden.shape[1], device=self.device)[None] < gen.lengths[:, None]
            why = None if torch.isfinite(gen.hidden[steps]).all() else "NaN/inf states"
        if why is not None:
            if next(self.model.gpt.parameters()).dtype not in (torch.float16, torch.bfloat16):
                raise NumericalError(f"{why}; the checkpoint itself may be broken (re-create or re-download it)")
            gen = Engine(self._fallback("gpt")).generate(emb.float(), valid, params, seed=seed, should_stop=should_stop)
        return gen

    @property
    def sample_rate(self) -> int:
        return self.model.sample_rate

    def speaker_vector(self, speaker: int | str | Tensor | None) -> Tensor:
        return resolve_speaker(self.model, speaker)

    def voice(self, speaker) -> Voice:
        """What `speaker` puts into the prompt: any speaker_vector takes, or a SampleSpeaker (sample-audio codes with
        their transcript; toolkit.speakers), for models trained with them (ChatTTS's)."""
        return resolve_voice(self.model, speaker)

    @torch.inference_mode()
    def decode(self, hidden: Tensor, lengths: Tensor) -> tuple[list[np.ndarray], dict[str, float]]:
        """hidden (B, N, D) -> one waveform of 512 * n - 256 samples per row, n = lengths[row].
        Rows are decoded one by one at their own length, so the audio never depends on what it was batched with
        (and streaming can reproduce it exactly)."""
        timing = {"decoder": 0.0, "vocoder": 0.0}
        out = []
        for row, n in zip(hidden, lengths.tolist()):
            if n == 0:
                out.append(np.zeros(0, dtype=np.float32))
                continue
            t0 = time.perf_counter()
            mel = self.model.hidden_to_mel(row[None, :n])
            if not torch.isfinite(mel).all():
                mel = self._fallback("decoder")(row[None, :n].transpose(1, 2).float())
            sync_device(self.device)
            t1 = time.perf_counter()
            wav = self.model.mel_to_wav(mel.float())[0]
            if not torch.isfinite(wav).all():
                wav = self._fallback("vocos")(mel.float())[0]
            sync_device(self.device)
            timing["decoder"] += t1 - t0
            timing["vocoder"] += time.perf_counter() - t1
            if not torch.isfinite(wav).all():  # NaN never reaches the audio
                raise NumericalError("non-finite audio even in fp32: the checkpoint may be corrupt")
            out.append(wav.cpu().numpy().astype(np.float32))
        return out, timing

    def check_refine(self, prompt: str = "") -> None:
        """RefineError unless this model can refine (a trained text head) and `prompt` is a run of its tokens."""
        check_refinable(self.model.tokenizer, getattr(self.model, "text_head", True))
        check_prompt(self.model.tokenizer, prompt)

    @torch.inference_mode()
    def refine_sentences(
        self,
        sentences: Sequence[str],
        prompt: str = "",
        params: SamplingParams | None = None,
        seed: int = 0,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[str]:
        """One batch of sentences -> their texts as ChatTTS's refine_text rewrites them (toolkit.refine): the
        engine generates text tokens through the GPT's text head until [Ebreak]."""
        self.check_refine(prompt)
        params = params or refine_params()
        with self.memory_guard(len(sentences)):
            emb, valid = encode_refine_prompts(self.model, sentences, prompt)
            gen = self.engine.generate(
                emb, valid, params, seed=seed, should_stop=should_stop, text_eos=self.model.tokenizer.token_id(EOS)
            )
        rows = [gen.codes[j, : int(gen.lengths[j]), 0].tolist() for j in range(len(sentences))]
        return refined_texts(self.model.tokenizer, sentences, rows, gen.finished.tolist(), params.max_new_tokens)

    def refine(
        self,
        texts: str | Sequence[str],
        *,
        prompt: str = "",
        seed: int = 0,
        params: SamplingParams | None = None,
        batch_size: int = 8,
        max_chars: int = 120,
        control_tokens: bool = False,
    ) -> list[str]:
        """Each text refined as synthesize(refine=True) would refine it (same sentences, batches and seeds):
        one string per text, its refined sentences joined by spaces."""
        plan = Plan.make(texts, batch_size, max_chars, control_tokens)
        self.check_refine(prompt)
        return refine_plan(plan, lambda sentences, b: self.refine_sentences(sentences, prompt, params, seed + b))

    @torch.inference_mode()
    def synthesize(
        self,
        texts: str | Sequence[str],
        *,
        speaker=None,
        seed: int = 0,
        params: SamplingParams | None = None,
        batch_size: int = 8,
        max_chars: int = 120,
        control_tokens: bool = False,
        progress: Callable[[int, int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        refine: bool = False,
        refine_prompt: str = "",
        refine_params: SamplingParams | None = None,
    ) -> list[Utterance]:
        """Each text is split into sentences, sentences are batched with padding, and the audio of each
        text is returned whole. `progress(done, total)` is called per batch of sentences. `[laugh]`-style
        tokens in the text are read as text unless control_tokens.
        refine: first rewrite each batch of sentences with the text head, as ChatTTS's infer() does by default
        (refine_prompt e.g. "[oral_2][laugh_0][break_6]"; refine_params default to ChatTTS's); the segments
        (and Utterance.text) hold the refined text."""
        plan = Plan.make(texts, batch_size, max_chars, control_tokens)
        params = params or SamplingParams()
        spk = self.voice(speaker)
        if refine:  # before any work: a model without a text head fails at once
            self.check_refine(refine_prompt)
        pieces = plan.pieces
        wavs: dict[int, np.ndarray] = {}
        segs: dict[int, Segment] = {}
        steps: dict[int, int] = {}
        limit: dict[int, bool] = {}
        timing = {"gpt": 0.0, "decoder": 0.0, "vocoder": 0.0, **({"refine": 0.0} if refine else {})}
        t_start = time.perf_counter()
        for b, idx in plan.batches():
            t0 = time.perf_counter()
            sentences = [pieces[k][1] for k in idx]
            if refine:
                sentences = self.refine_sentences(sentences, refine_prompt, refine_params, seed + b, should_stop)
                sync_device(self.device)
                timing["refine"] += time.perf_counter() - t0
                t0 = time.perf_counter()
            with self.memory_guard(len(idx)):
                emb, valid = encode_prompts(self.model, sentences, spk)
                gen = self._generate(emb, valid, params, seed + b, should_stop)
                sync_device(self.device)
                timing["gpt"] += time.perf_counter() - t0
                out, t = self.decode(gen.hidden, gen.lengths)
            for key in t:
                timing[key] += t[key]
            for j, k in enumerate(idx):
                wavs[k], steps[k], limit[k] = out[j], int(gen.lengths[j]), not bool(gen.finished[j])
                n = steps[k]
                segs[k] = Segment(sentences[j], gen.codes[j, :n].cpu(), gen.hidden[j, :n].float().cpu())
            if progress:
                progress(b + len(idx), len(pieces))
            if should_stop is not None and should_stop():
                raise InterruptedError("synthesis cancelled")
        timing["total"] = time.perf_counter() - t_start
        return [
            Utterance(
                np.concatenate([wavs[k] for k in ks]),
                self.sample_rate,
                sum(steps[k] for k in ks),
                any(limit[k] for k in ks),
                dict(timing),
                [segs[k] for k in ks],
            )
            for ks in plan.per_text(limit)
        ]

    @torch.inference_mode()
    def teacher_force(self, segment: Segment, speaker=None) -> Tensor:
        """Code logits (n, Q, V) float32 of this model for the steps of `segment`, fed its own codes."""
        gpt = self.model.gpt
        emb, _ = encode_prompts(self.model, [segment.text], self.voice(speaker))
        T, n = emb.shape[1], segment.codes.shape[0]
        x = torch.cat([emb, gpt.embed_codes(segment.codes[None].to(self.device)).to(emb.dtype)], 1)
        h = gpt.forward_full(x.to(gpt.norm.weight.dtype), torch.ones(x.shape[:2], dtype=torch.bool, device=self.device))
        return gpt.code_logits(h[0, T - 1 : T - 1 + n]).float().cpu()

    def stream(self, text: str, **kwargs) -> Iterator[np.ndarray]:
        """Yields audio as it is generated (see toolkit.streaming)."""
        from .streaming import stream_text

        return stream_text(self, text, **kwargs)

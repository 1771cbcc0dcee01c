"""Text -> 24 kHz audio from an exported folder, with numpy and ONNX Runtime only (no torch)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from ..plan import Plan, render_stream
from ..refine import EOS, check_prompt, check_refinable, refine_params, refine_plan, refine_prompt, refined_texts
from ..speakers import ChatTTSSeed, SampleSpeaker, SpeakerError, check_vector, parse_speaker
from ..text import check_prompt_length, normalize, prompt_text, sentence_pieces
from .dsp import istft, torch_randn
from .engine import Engine, Sessions, read_manifest
from .sampling import SamplingParams
from .streaming import StreamRenderer
from .wordpiece import WordPiece


@dataclass
class Utterance:
    wav: np.ndarray
    sample_rate: int
    steps: int
    hit_limit: bool
    timings: dict[str, float] = field(default_factory=dict)
    text: str = ""  # what the GPT read, sentence by sentence: the refined text when synthesized with refine

    @property
    def duration(self) -> float:
        return len(self.wav) / self.sample_rate


class Tokenizer:
    def __init__(self, path: Path, pad_id: int):
        self._tok = WordPiece.from_file(path)
        self.pad_id = pad_id

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def has(self, token: str) -> bool:
        return self._tok.token_to_id(token) is not None

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids))

    def encode(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """-> ids (B, T) int64 and mask (B, T) bool, left-padded like the torch tokenizer."""
        seqs = [self._tok.encode(t) for t in texts]
        T = max(len(s) for s in seqs)
        ids = np.full((len(seqs), T), self.pad_id, np.int64)
        mask = np.zeros((len(seqs), T), bool)
        for i, s in enumerate(seqs):
            if s:
                ids[i, T - len(s) :] = s
                mask[i, T - len(s) :] = True
        return ids, mask


class EdgeSynthesizer:
    """The torch-free counterpart of toolkit.Synthesizer for a folder written by `ttsq export`."""

    def __init__(self, root, threads: int | None = None, device: str | None = None):
        self.root = Path(root)
        self.manifest = m = read_manifest(self.root)
        self.precision = m["precision"]
        self.cfg = m["config"]
        self.sessions = Sessions(self.root, m, threads, device)
        self.provider_note = self.sessions.note
        self.engine = Engine(self.sessions, self.cfg)
        self.tokenizer = Tokenizer(m["tokenizer"], m.get("pad_id", 0))  # paths confined by read_manifest
        self.spk_stat = np.load(m["spk_stat"]).astype(np.float32)  # (2, D): std, mean
        self.voices = {k: np.load(v).astype(np.float32) for k, v in m.get("voices", {}).items()}
        from ..frontend import frontend_for

        self.frontend = frontend_for(m.get("frontend"))
        self.sample_rate = m["sample_rate"]
        self.n_fft, self.hop = m["istft"]["n_fft"], m["istft"]["hop"]

    # --- prompt and speaker ---------------------------------------------------------------------------
    def speaker_vector(self, speaker=None) -> np.ndarray:
        """What the torch Synthesizer's speaker_vector takes, to the same vector: a seed (int, "7", "seed:7"), a voice
        name, chattts-seed:N, a ChatTTS speaker string, a .npy/.txt (or, with torch, .pt) file, or a (D,) vector."""
        D = self.cfg["gpt"]["hidden"]
        spec = parse_speaker(next(iter(self.voices), 0) if speaker is None else speaker, self.voices)
        if isinstance(spec, (int, np.integer)):
            std, mean = self.spk_stat
            z = torch_randn(int(spec), D) if D % 16 == 0 else np.random.default_rng(int(spec)).standard_normal(D)
            return (z * std + mean).astype(np.float32)
        if isinstance(spec, ChatTTSSeed):  # float16 throughout, as ChatTTS draws it
            if D % 16:
                raise SpeakerError(f"chattts-seed needs speakers of a multiple of 16 values; this model's have {D}")
            std, mean = self.spk_stat.astype(np.float16)
            return torch_randn(spec.seed, D).astype(np.float16) * std + mean
        if isinstance(spec, str):
            return self.voices[spec]
        if isinstance(spec, SampleSpeaker):
            raise SpeakerError(
                "this is a sample-audio speaker (codes of a recording), not a speaker vector; pass it "
                "to synthesize() (or --speaker with --speaker-text) instead"
            )
        vec = check_vector(spec, D)
        return vec.astype(np.float16) if np.asarray(spec).dtype == np.float16 else vec

    def voice(self, speaker=None) -> tuple[np.ndarray | None, np.ndarray | None, str]:
        """-> (speaker vector or None for [empty_spk], sample codes (S, Q) or None, sample transcript)."""
        spec = speaker if speaker is None else parse_speaker(speaker, self.voices)
        if not isinstance(spec, SampleSpeaker):
            return self.speaker_vector(spec), None, ""
        g = self.cfg["gpt"]
        if self.manifest.get("frontend", "none") not in (None, "none"):
            raise SpeakerError(
                "this model was not trained with sample-audio prompts (ChatTTS's spk_smp); make a "
                "speaker vector for it with `ttsq speaker from-audio WAV --text ... --model MODEL`"
            )
        if spec.codes.shape[0] != g["num_vq"] or spec.codes.max() >= g["num_audio_tokens"] - 1:
            raise SpeakerError(
                f"the sample-audio speaker holds codes of shape {spec.codes.shape}: it was made for another model"
            )
        return None, spec.codes.T.astype(np.int64), spec.text

    def encode(
        self, sentences: Sequence[str], sample_text: str = "", speaker: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        tok = self.tokenizer
        for s in (*sentences, sample_text):
            check_prompt_length(s, self.cfg["gpt"]["max_positions"])
        smp = self.frontend(normalize(sample_text)) if sample_text.strip() else ""
        ids, valid = tok.encode(
            [prompt_text(self.frontend(s), tok.has, sample_text=smp, speaker=speaker) for s in sentences]
        )
        if int(ids.max()) >= self.cfg["gpt"]["num_text_tokens"]:
            raise ValueError("the tokenizer produced ids beyond the model's text vocabulary: wrong tokenizer.json?")
        return ids, valid

    # --- refine ---------------------------------------------------------------------------------------
    def check_refine(self, prompt: str = "") -> None:
        """RefineError unless this export can refine (it holds text_head.onnx) and `prompt` is a run of its tokens."""
        no_head = (
            None
            if self.sessions.text_head is not None
            else (
                f"{self.root} has no text_head.onnx: it was exported by a ttsq without refine support; export the "
                "ChatTTS checkpoint again (ttsq export) to refine here"
            )
        )
        check_refinable(self.tokenizer, self.manifest.get("text_head", True), no_head)
        check_prompt(self.tokenizer, prompt)

    def refine_sentences(
        self, sentences: Sequence[str], prompt: str = "", params: SamplingParams | None = None, seed: int = 0
    ) -> list[str]:
        """One batch of sentences -> their refined texts (toolkit.refine), through gpt.onnx and text_head.onnx."""
        self.check_refine(prompt)
        params = params or refine_params()
        ids, valid = self.tokenizer.encode([refine_prompt(s, prompt) for s in sentences])
        speaker = np.zeros((len(sentences), self.cfg["gpt"]["hidden"]), np.float32)
        gen = self.engine.generate(ids, valid, speaker, None, params, seed=seed, text_eos=self.tokenizer.token_id(EOS))
        rows = [gen.codes[j, : int(gen.lengths[j]), 0].tolist() for j in range(len(sentences))]
        return refined_texts(self.tokenizer, sentences, rows, gen.finished.tolist(), params.max_new_tokens)

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
        """As toolkit.Synthesizer.refine: one refined string per text."""
        plan = Plan.make(texts, batch_size, max_chars, control_tokens)
        self.check_refine(prompt)
        return refine_plan(plan, lambda sentences, b: self.refine_sentences(sentences, prompt, params, seed + b))

    # --- decoding -----------------------------------------------------------------------------------
    def decode(self, hidden: np.ndarray, n: int) -> tuple[np.ndarray, float, float]:
        """hidden (N, D) -> 512 * n - 256 samples, (wav, decoder s, vocoder s)."""
        if n == 0:
            return np.zeros(0, np.float32), 0.0, 0.0
        t0 = time.perf_counter()
        mel = self.sessions.decoder.run(None, {"hidden": np.ascontiguousarray(hidden[None, :n], np.float32)})[0]
        t1 = time.perf_counter()
        real, imag = self.sessions.vocos.run(None, {"mel": mel})
        wav = istft(real[0], imag[0], self.n_fft, self.hop)
        if not np.isfinite(wav).all():
            raise FloatingPointError("non-finite audio from the exported model")
        return wav.astype(np.float32), t1 - t0, time.perf_counter() - t1

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
        refine: bool = False,
        refine_prompt: str = "",
        refine_params: SamplingParams | None = None,
    ) -> list[Utterance]:
        """As toolkit.Synthesizer.synthesize; refine rewrites each batch of sentences first (Utterance.text)."""
        plan = Plan.make(texts, batch_size, max_chars, control_tokens)
        params = params or SamplingParams()
        spk, sample, sample_text = self.voice(speaker)
        if refine:
            self.check_refine(refine_prompt)
        pieces = plan.pieces
        wavs, steps, limit = {}, {}, {}
        timing = {"gpt": 0.0, "decoder": 0.0, "vocoder": 0.0}
        t_start = time.perf_counter()
        spk_id = self.tokenizer.token_id("[spk_emb]") if spk is not None else None
        spk = np.zeros(self.cfg["gpt"]["hidden"], np.float32) if spk is None else spk
        texts_read = {}
        for b, idx in plan.batches():
            t0 = time.perf_counter()
            sentences = [pieces[k][1] for k in idx]
            if refine:
                sentences = self.refine_sentences(sentences, refine_prompt, refine_params, seed + b)
                timing["refine"] = timing.get("refine", 0.0) + time.perf_counter() - t0
                t0 = time.perf_counter()
            texts_read.update(zip(idx, sentences))
            ids, valid = self.encode(sentences, sample_text, spk_id is not None)
            gen = self.engine.generate(
                ids, valid, np.repeat(spk[None], len(idx), 0), spk_id, params, seed=seed + b, sample=sample
            )
            timing["gpt"] += time.perf_counter() - t0
            for j, k in enumerate(idx):
                n = int(gen.lengths[j])
                wavs[k], td, tv = self.decode(gen.hidden[j], n)
                timing["decoder"] += td
                timing["vocoder"] += tv
                steps[k], limit[k] = n, not bool(gen.finished[j])
            if progress:
                progress(b + len(idx), len(pieces))
        timing["total"] = time.perf_counter() - t_start
        return [
            Utterance(
                np.concatenate([wavs[k] for k in ks]),
                self.sample_rate,
                sum(steps[k] for k in ks),
                any(limit[k] for k in ks),
                dict(timing),
                " ".join(texts_read[k] for k in ks),
            )
            for ks in plan.per_text(limit)
        ]

    def renderer(self) -> StreamRenderer:
        s = self.manifest["streaming"]
        return StreamRenderer(
            self.sessions.decoder, self.sessions.vocos, self.n_fft, self.hop, s["decoder_radius"], s["vocos_radius"]
        )

    def stream(
        self,
        text: str,
        *,
        speaker=None,
        seed: int = 0,
        params: SamplingParams | None = None,
        max_chars: int = 120,
        control_tokens: bool = False,
        refine: bool = False,
        refine_prompt: str = "",
        refine_params: SamplingParams | None = None,
    ) -> Iterator[np.ndarray]:
        """Yields float32 audio pieces as the GPT produces states, sentence by sentence (each refined first with
        refine)."""
        params = params or SamplingParams()
        spk, sample, sample_text = self.voice(speaker)
        spk_id = self.tokenizer.token_id("[spk_emb]") if spk is not None else None
        spk = np.zeros(self.cfg["gpt"]["hidden"], np.float32) if spk is None else spk
        for i, (_, sentence) in enumerate(sentence_pieces([text], max_chars, control_tokens)):
            if refine:
                sentence = self.refine_sentences([sentence], refine_prompt, refine_params, seed + i)[0]
            ids, valid = self.encode([sentence], sample_text, spk_id is not None)
            yield from render_stream(
                self.engine.stream(ids, valid, spk[None], spk_id, params, seed=seed + i, sample=sample), self.renderer()
            )

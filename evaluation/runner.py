"""`ttsq evaluate`: every precision against FP32 on the same texts and seeds, stage by stage.

Stages (each compared with FP32 on identical inputs where it can be):
  decoder+vocoder  FP32 GPT states -> each precision's Decoder and Vocos; sample-aligned MCD, PESQ, STOI, log-mel
  gpt              each precision teacher-forced on FP32's codes; top-1 agreement and KL(FP32 || precision)
  end to end       fixed seeds; DTW-MCD against FP32 at the same seed, duration ratio, DNSMOS
  noise floor      FP32 against FP32 at another seed: what sampling alone changes
"""
from __future__ import annotations

import math
import statistics
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from toolkit import SamplingParams, Synthesizer, Utterance
from toolkit.precision import state_bytes
from toolkit.textsets import TextRecord, load_text_set, set_hash

from . import metrics


@dataclass
class EvalConfig:
    model: str | None  # None: the shipped voice
    precisions: list[str]  # recipe names (applied at load) or artifact folders
    text_set: str
    out: str
    device: str | None = None
    seeds: tuple[int, ...] = (0, 1)
    limit: int | None = None
    max_steps: int = 2048
    batch_size: int = 8
    repeats: int = 3  # timing repeats; medians are reported
    throughput_batches: tuple[int, ...] = (1, 8)
    dnsmos: bool = True


@dataclass
class PrecisionRun:
    name: str
    synth: Synthesizer
    size_bytes: int
    utts: dict[int, dict[str, Utterance]] = field(default_factory=dict)  # seed -> record id -> utterance


def _label(entry: str) -> str:
    p = Path(entry)
    return p.name if (p / "manifest.json").is_file() else entry


def _load(cfg: EvalConfig, entry: str) -> PrecisionRun:
    path = Path(entry)
    if (path / "manifest.json").is_file():
        synth = Synthesizer(path, cfg.device)
        size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    else:
        synth = Synthesizer(cfg.model, cfg.device, None if entry == "fp32" else entry)
        size = state_bytes(synth.model)
    return PrecisionRun(_label(entry), synth, size)


def speaker_of(synth: Synthesizer, label: str):
    try:
        return synth.speaker_vector(label)
    except ValueError:  # a voice this model lacks: a stable seed from the label
        return synth.speaker_vector(zlib.crc32(label.encode()))


def synthesize_records(run: PrecisionRun, records: list[TextRecord], seed: int, params: SamplingParams,
                       batch_size: int) -> dict[str, Utterance]:
    """Records grouped by speaker, batched; the same grouping for every precision."""
    out: dict[str, Utterance] = {}
    groups: dict[str, list[TextRecord]] = {}
    for r in records:
        groups.setdefault(r.speaker, []).append(r)
    for label, recs in sorted(groups.items()):
        utts = run.synth.synthesize([r.text for r in recs], speaker=speaker_of(run.synth, label), seed=seed,
                                    params=params, batch_size=batch_size)
        out.update({r.id: u for r, u in zip(recs, utts)})
    return out


def _sync(synth: Synthesizer):
    if synth.device.type == "cuda":
        torch.cuda.synchronize(synth.device)


def measure_performance(run: PrecisionRun, records: list[TextRecord], cfg: EvalConfig,
                        params: SamplingParams) -> dict:
    """Warm-up excluded; medians over repeats, at batch 1, on the first few records."""
    synth = run.synth
    probe = records[: min(2, len(records))]
    synth.synthesize(probe[0].text, seed=0, params=params)  # warm-up
    if synth.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(synth.device)
    lat, rtf, sps, first, stage = [], [], [], [], {"gpt": [], "decoder": [], "vocoder": []}
    for _ in range(cfg.repeats):
        for r in probe:
            _sync(synth)
            u = synth.synthesize(r.text, speaker=speaker_of(synth, r.speaker), seed=0, params=params)[0]
            t = u.timings
            lat.append(t["total"])
            rtf.append(t["total"] / max(u.duration, 1e-9))
            sps.append(u.steps / max(t["gpt"], 1e-9))
            _sync(synth)
            t0 = time.perf_counter()
            for _piece in synth.stream(r.text, speaker=speaker_of(synth, r.speaker), seed=0, params=params):
                _sync(synth)
                first.append(time.perf_counter() - t0)  # streaming: the first audio piece
                break
            for k in stage:
                stage[k].append(t[k])
    throughput = {}
    texts = [r.text for r in records]
    for b in cfg.throughput_batches:
        batch = (texts * math.ceil(b / len(texts)))[:b]
        _sync(synth)
        t0 = time.perf_counter()
        utts = synth.synthesize(batch, seed=0, params=params, batch_size=b)
        _sync(synth)
        wall = time.perf_counter() - t0
        throughput[str(b)] = sum(u.duration for u in utts) / wall
    perf = {
        "latency_s": statistics.median(lat), "rtf": statistics.median(rtf), "steps_per_s": statistics.median(sps),
        "time_to_first_audio_s": statistics.median(first),
        "stage_latency_s": {k: statistics.median(v) for k, v in stage.items()},
        "throughput_audio_s_per_s": throughput, "size_bytes": run.size_bytes,
        "peak_gpu_bytes_torch": None, "peak_gpu_bytes_nvml": None,
    }
    if synth.device.type == "cuda":
        perf["peak_gpu_bytes_torch"] = torch.cuda.max_memory_allocated(synth.device)
        try:
            import pynvml
            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(synth.device.index or 0)
            perf["peak_gpu_bytes_nvml"] = pynvml.nvmlDeviceGetMemoryInfo(h).used
        except Exception:  # NVML is optional: torch's numbers stand alone
            pass
    return perf


class Cepstra:
    """Mel-cepstra computed once per waveform: every precision is scored against the same FP32 audio."""

    def __init__(self, sr: int):
        self.sr, self._seen = sr, {}

    def __call__(self, wav: np.ndarray) -> np.ndarray:
        hit = self._seen.get(id(wav))
        if hit is None or hit[0] is not wav:
            hit = self._seen[id(wav)] = (wav, metrics.mel_cepstrum(wav, self.sr))
        return hit[1]

    def mcd(self, ref: np.ndarray, test: np.ndarray, align: str = "dtw") -> float | None:
        try:
            return metrics.cepstral_distance(self(ref), self(test), align=align)[0]
        except ValueError:  # too short to analyse
            return None


def ci(values: list[float]) -> dict | None:
    vals = [v for v in values if v is not None and np.isfinite(v)]
    if not vals:
        return None
    mean, lo, hi = metrics.bootstrap_ci(vals)
    return {"mean": mean, "lo": lo, "hi": hi, "n": len(vals)}


def _safe(fn, *args):
    try:
        return fn(*args)
    except ValueError:  # too short or silent for this metric: left out, counted in n
        return None


def decode_segments(run: PrecisionRun, utts: dict[str, Utterance]) -> dict[tuple[str, int], np.ndarray]:
    """This precision's Decoder and Vocos on the given GPT states, segment by segment."""
    out = {}
    for rid, u in utts.items():
        for k, seg in enumerate(u.segments):
            if seg.hidden.shape[0] >= 2:
                n = torch.tensor([seg.hidden.shape[0]])
                out[rid, k] = run.synth.decode(seg.hidden[None].to(run.synth.device), n)[0][0]
    return out


def stage_decoder(ref_wavs: dict, run: PrecisionRun, utts: dict[str, Utterance], cep: Cepstra) -> dict:
    rows = {"mcd_db": [], "pesq_wb": [], "stoi": [], "log_mel_l1": []}
    sr = cep.sr
    for key, b in decode_segments(run, utts).items():
        a = ref_wavs[key]
        rows["mcd_db"].append(0.0 if a is b or np.array_equal(a, b) else cep.mcd(a, b, align="none"))
        rows["pesq_wb"].append(_safe(metrics.pesq_wb, a, b, sr))
        rows["stoi"].append(_safe(metrics.stoi, a, b, sr))
        rows["log_mel_l1"].append(_safe(metrics.log_mel_distance, a, b, sr))
    return {k: ci(v) for k, v in rows.items()}


def stage_gpt(ref: PrecisionRun, run: PrecisionRun, utts: dict[str, Utterance], records: dict[str, TextRecord]) -> dict:
    agree, kl = [], []
    for rid, u in utts.items():
        spk = speaker_of(ref.synth, records[rid].speaker)
        for seg in u.segments:
            if seg.codes.shape[0] == 0:
                continue
            lp = torch.log_softmax(ref.synth.teacher_force(seg, spk), -1)
            lq = torch.log_softmax(run.synth.teacher_force(seg, spk), -1)
            agree.append(float((lp.argmax(-1) == lq.argmax(-1)).float().mean()))
            kl.append(float((lp.exp() * (lp - lq)).sum(-1).mean()))
    return {"top1_agreement": ci(agree), "kl_nats": ci(kl)}


def end_to_end(ref: PrecisionRun, run: PrecisionRun, seeds, cep: Cepstra, with_dnsmos: bool) -> tuple[dict, dict]:
    sr = cep.sr
    mcd, dur, mos = [], [], []
    per_sentence = {}
    for rid in ref.utts[seeds[0]]:
        m = [cep.mcd(ref.utts[s][rid].wav, run.utts[s][rid].wav) for s in seeds] if run is not ref else []
        m = [x for x in m if x is not None]
        d = [run.utts[s][rid].duration / max(ref.utts[s][rid].duration, 1e-9) for s in seeds]
        q = _safe(lambda: metrics.dnsmos(run.utts[seeds[0]][rid].wav, sr)["ovrl"]) if with_dnsmos else None
        if run is ref:  # FP32 against itself is 0 by construction; its spread comes from the noise floor
            m = [0.0]
        mcd.append(float(np.mean(m)) if m else None)
        dur.append(float(np.mean(d)))
        mos.append(q)
        per_sentence[rid] = {"dtw_mcd_db": mcd[-1], "duration_ratio": dur[-1], "dnsmos_ovrl": q,
                             "steps": run.utts[seeds[0]][rid].steps, "hit_limit": run.utts[seeds[0]][rid].hit_limit}
    return {"dtw_mcd_db": ci(mcd), "duration_ratio": ci(dur), "dnsmos_ovrl": ci(mos),
            "eos_rate": float(np.mean([not v["hit_limit"] for v in per_sentence.values()]))}, per_sentence


def noise_floor(ref: PrecisionRun, seeds, cep: Cepstra) -> tuple[dict, dict[str, float]]:
    """FP32 at seed[1] against FP32 at seed[0]: sampling noise alone."""
    s0, s1 = seeds[0], seeds[1]
    per = {rid: cep.mcd(ref.utts[s0][rid].wav, ref.utts[s1][rid].wav) for rid in ref.utts[s0]}
    dur = [ref.utts[s1][r].duration / max(ref.utts[s0][r].duration, 1e-9) for r in ref.utts[s0]]
    return {"dtw_mcd_db": ci(list(per.values())), "duration_ratio": ci(dur)}, per


def run_evaluation(cfg: EvalConfig, progress: Callable[[str, int, int], None] | None = None) -> tuple[dict, dict]:
    """-> (report dict, {precision: {seed: {id: Utterance}}}) ; writes nothing."""
    if len(cfg.seeds) < 2:
        raise ValueError("give at least two seeds: the second measures FP32's own seed-to-seed noise floor")
    records = load_text_set(cfg.text_set)[: cfg.limit]
    by_id = {r.id: r for r in records}
    params = SamplingParams(max_new_tokens=cfg.max_steps)
    entries = list(dict.fromkeys(["fp32", *cfg.precisions]))
    runs: list[PrecisionRun] = []
    results: dict[str, dict] = {}
    step = 0
    for entry in entries:
        run = _load(cfg, entry)
        runs.append(run)
        for seed in cfg.seeds:
            if progress:
                progress("synthesize", step, len(entries) * len(cfg.seeds))
            run.utts[seed] = synthesize_records(run, records, seed, params, cfg.batch_size)
            step += 1
    if progress:
        progress("synthesize", step, step)
    ref = runs[0]
    sr = ref.synth.sample_rate
    cep = Cepstra(sr)
    floor, floor_per = noise_floor(ref, cfg.seeds, cep)
    ref_wavs = decode_segments(ref, ref.utts[cfg.seeds[0]])
    for i, run in enumerate(runs):
        if progress:
            progress("score", i, len(runs))
        e2e, per_sentence = end_to_end(ref, run, cfg.seeds, cep, cfg.dnsmos)
        res = {
            "precision": run.name, "recipe": getattr(run.synth, "precision", run.name),
            "performance": measure_performance(run, records, cfg, params),
            "decoder_vocoder": stage_decoder(ref_wavs, run, ref.utts[cfg.seeds[0]], cep),
            "gpt_teacher_forced": stage_gpt(ref, run, ref.utts[cfg.seeds[0]], by_id),
            "end_to_end": e2e, "per_sentence": per_sentence,
        }
        # within the noise floor: the paired MCD gap to FP32's own seed spread is not above zero
        pairs = [(per_sentence[r]["dtw_mcd_db"], floor_per[r]) for r in per_sentence
                 if per_sentence[r]["dtw_mcd_db"] is not None and floor_per.get(r) is not None]
        if run is ref or not pairs:
            res["within_noise_floor"] = run is ref
        else:
            diff = metrics.bootstrap_diff_ci([a for a, _ in pairs], [b for _, b in pairs])
            res["gap_vs_noise_floor_db"] = {"mean": diff[0], "lo": diff[1], "hi": diff[2]}
            res["within_noise_floor"] = diff[1] <= 0.0
        results[run.name] = res
    if progress:
        progress("score", len(runs), len(runs))
    import platform
    report = {
        "schema": "ttsq-eval/1",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": cfg.model or "shipped voice",
        "text_set": {"file": cfg.text_set, "sha256": set_hash(cfg.text_set), "records": len(records)},
        "seeds": list(cfg.seeds), "device": str(ref.synth.device),
        "hardware": torch.cuda.get_device_name(ref.synth.device) if ref.synth.device.type == "cuda"
        else f"{platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)",
        "versions": {"torch": torch.__version__},
        "mcd_settings": metrics.MCDSettings().describe(),
        "sampling": params.__dict__,
        "noise_floor": floor,
        "precisions": results,
    }
    return report, {r.name: r.utts for r in runs}

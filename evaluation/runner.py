"""`ttsq evaluate`: every precision against FP32 on the same texts and seeds, stage by stage.

Stages (each compared with FP32 on identical inputs where it can be):
  decoder+vocoder  FP32 GPT states -> each precision's Decoder and Vocos; sample-aligned MCD, PESQ, STOI, log-mel
  gpt              each precision teacher-forced on FP32's codes; top-1 agreement and KL(FP32 || precision)
  end to end       fixed seeds; intelligibility (an offline ASR's WER/CER against the input text, every seed),
                   DTW-MCD against FP32 at the same seed, duration ratio, DNSMOS
  noise floor      FP32 against FP32 at another seed: what sampling alone changes

Texts are synthesized in fixed work units (batches); under torchrun (`--distributed`) the ranks share the units out,
score what they made, and rank 0 gathers the per-record scores into the same report (evaluation/distributed.py).
"""

from __future__ import annotations

import math
import os
import statistics
import time
import zlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from toolkit import SamplingParams, Synthesizer, Utterance
from toolkit.engine import sync_device, timed
from toolkit.precision import split_precision, state_bytes
from toolkit.text import expected_seconds
from toolkit.textsets import TextRecord, load_text_set, set_hash

from . import asr, metrics, textnorm
from .distributed import Dist, shard
from .pool import cepstrum_or_error, dnsmos_overall, map_in_processes

TEXT_SET = dict(control_tokens=True)  # text sets write [laugh], [uv_break], ... as controls (calibration_sets/README)


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
    asr: bool = True  # WER/CER by an offline ASR; skipped with a warning when the asr extra is missing
    asr_model: str | None = None  # a CTranslate2 Whisper folder; None: the pinned Whisper base
    workers: int | None = None  # processes for scoring's mel-cepstra and DNSMOS; None: the usable cores / ranks


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
        recipe, float_dtype = split_precision(entry)  # int8@bf16: int8 weights on bf16 activations
        synth = Synthesizer(cfg.model, cfg.device, None if entry == "fp32" else recipe, float_dtype=float_dtype)
        size = state_bytes(synth.model)
    return PrecisionRun(_label(entry), synth, size)


def speaker_of(synth: Synthesizer, label: str):
    try:
        return synth.speaker_vector(label)
    except ValueError:  # a voice this model lacks: a stable seed from the label
        return synth.speaker_vector(zlib.crc32(label.encode()))


@dataclass(frozen=True)
class WorkUnit:
    """Records synthesized together as one call, for every precision and seed. A record's audio depends on the batch
    it is in and the batch's seed, so ranks share out whole units, never single records."""

    speaker: str
    ids: tuple[str, ...]
    seed_offset: int
    expected_s: float  # expected audio seconds: what sharding balances


def work_units(records: list[TextRecord], batch_size: int) -> list[WorkUnit]:
    """Per speaker (labels sorted), records by expected duration (similar lengths pad less), `batch_size` at a time.
    The k-th record of a speaker starts a unit seeded seed + k, as Synthesizer.synthesize seeds its batches."""
    groups: dict[str, list[TextRecord]] = {}
    for r in records:
        groups.setdefault(r.speaker, []).append(r)
    units = []
    for label, recs in sorted(groups.items()):
        recs = sorted(recs, key=lambda r: expected_seconds(r.text))
        for k in range(0, len(recs), batch_size):
            chunk = recs[k : k + batch_size]
            units.append(WorkUnit(label, tuple(r.id for r in chunk), k, sum(expected_seconds(r.text) for r in chunk)))
    return units


def synthesize_units(
    run: PrecisionRun,
    units: list[WorkUnit],
    by_id: dict[str, TextRecord],
    seed: int,
    params: SamplingParams,
    batch_size: int,
) -> dict[str, Utterance]:
    out: dict[str, Utterance] = {}
    for u in units:
        utts = run.synth.synthesize(
            [by_id[i].text for i in u.ids],
            speaker=speaker_of(run.synth, u.speaker),
            seed=seed + u.seed_offset,
            params=params,
            batch_size=batch_size,
            **TEXT_SET,
        )
        out.update(zip(u.ids, utts))
    return out


def measure_performance(run: PrecisionRun, records: list[TextRecord], cfg: EvalConfig, params: SamplingParams) -> dict:
    """Warm-up excluded; medians over repeats, at batch 1, on the first few records."""
    synth = run.synth
    probe = records[: min(2, len(records))]
    synth.synthesize(probe[0].text, seed=0, params=params, **TEXT_SET)  # warm-up
    if synth.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(synth.device)
    lat, rtf, sps, first, stage = [], [], [], [], {"gpt": [], "decoder": [], "vocoder": []}
    for _ in range(cfg.repeats):
        for r in probe:
            sync_device(synth.device)
            u = synth.synthesize(r.text, speaker=speaker_of(synth, r.speaker), seed=0, params=params, **TEXT_SET)[0]
            t = u.timings
            lat.append(t["total"])
            rtf.append(t["total"] / max(u.duration, 1e-9))
            sps.append(u.steps / max(t["gpt"], 1e-9))
            sync_device(synth.device)
            t0 = time.perf_counter()
            for _piece in synth.stream(r.text, speaker=speaker_of(synth, r.speaker), seed=0, params=params, **TEXT_SET):
                sync_device(synth.device)
                first.append(time.perf_counter() - t0)  # streaming: the first audio piece
                break
            for k in stage:
                stage[k].append(t[k])
    throughput = {}
    texts = [r.text for r in records]
    for b in cfg.throughput_batches:
        batch = (texts * math.ceil(b / len(texts)))[:b]

        def run_batch():
            return synth.synthesize(batch, seed=0, params=params, batch_size=b, **TEXT_SET)

        audio_s = sum(u.duration for u in run_batch())  # also warms up this batch size's buffers and graphs
        throughput[str(b)] = statistics.median(audio_s / timed(run_batch, synth.device) for _ in range(cfg.repeats))
    perf = {
        "latency_s": statistics.median(lat),
        "rtf": statistics.median(rtf),
        "steps_per_s": statistics.median(sps),
        "time_to_first_audio_s": statistics.median(first),
        "stage_latency_s": {k: statistics.median(v) for k, v in stage.items()},
        "throughput_audio_s_per_s": throughput,
        "size_bytes": run.size_bytes,
        "peak_gpu_bytes_torch": None,
        "peak_gpu_bytes_nvml": None,
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
    """Mel-cepstra computed once per waveform: every precision is scored against the same FP32 audio.
    SPTK's analysis is the slow part of scoring (about 0.5 s per second of audio on one core), so `prefetch`
    spreads the waveforms over worker processes first; results are the same as computing them here."""

    def __init__(self, sr: int):
        self.sr, self._seen = sr, {}

    def __call__(self, wav: np.ndarray) -> np.ndarray:
        hit = self._seen.get(id(wav))
        if hit is None or hit[0] is not wav:
            hit = self._seen[id(wav)] = (wav, cepstrum_or_error((wav, self.sr)))
        if isinstance(hit[1], str):  # the analysis' error, kept for every caller
            raise ValueError(hit[1])
        return hit[1]

    def prefetch(
        self, wavs: list[np.ndarray], workers: int, progress: Callable[[int, int], None] | None = None
    ) -> None:
        """Compute the cepstra of `wavs` in `workers` processes now (with 1, leave them to be computed on use)."""
        if workers <= 1:
            return
        todo = list({id(w): w for w in wavs if self._seen.get(id(w), (None,))[0] is not w}.values())
        for w, c in zip(todo, map_in_processes(cepstrum_or_error, [(w, self.sr) for w in todo], workers, progress)):
            self._seen[id(w)] = (w, c)

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


DECODER_METRICS = ("mcd_db", "pesq_wb", "stoi", "log_mel_l1")
GPT_METRICS = ("top1_agreement", "kl_nats")


# Scores are kept per record (a list per segment for the stage-wise ones) so that each rank scores what it
# synthesized; the CIs are taken once, over every record in text-set order (`pool`, `summarize`).


def stage_decoder(ref_wavs: dict, wavs: dict, cep: Cepstra, ids) -> dict:
    """ref_wavs, wavs: {(record id, segment): FP32's and this precision's Decoder+Vocos audio on the same GPT states}
    -> {record id: {metric: [one value per segment]}} for every id in `ids`"""
    rows = {rid: {k: [] for k in DECODER_METRICS} for rid in ids}
    sr = cep.sr
    for (rid, k), b in wavs.items():
        a, row = ref_wavs[rid, k], rows[rid]
        row["mcd_db"].append(0.0 if a is b or np.array_equal(a, b) else cep.mcd(a, b, align="none"))
        row["pesq_wb"].append(_safe(metrics.pesq_wb, a, b, sr))
        row["stoi"].append(_safe(metrics.stoi, a, b, sr))
        row["log_mel_l1"].append(_safe(metrics.log_mel_distance, a, b, sr))
    return rows


def stage_gpt(ref: PrecisionRun, run: PrecisionRun, utts: dict[str, Utterance], records: dict[str, TextRecord]) -> dict:
    """-> {record id: {metric: [one value per segment]}}"""
    rows = {rid: {k: [] for k in GPT_METRICS} for rid in utts}
    for rid, u in utts.items():
        spk = speaker_of(ref.synth, records[rid].speaker)
        agree, kl = rows[rid]["top1_agreement"], rows[rid]["kl_nats"]
        for seg in u.segments:
            if seg.codes.shape[0] == 0:
                continue
            lp = torch.log_softmax(ref.synth.teacher_force(seg, spk), -1)
            lq = torch.log_softmax(run.synth.teacher_force(seg, spk), -1)
            agree.append(float((lp.argmax(-1) == lq.argmax(-1)).float().mean()))
            kl.append(float((lp.exp() * (lp - lq)).sum(-1).mean()))
    return rows


def load_transcriber(cfg: EvalConfig) -> asr.Transcriber | None:
    """The ASR, or None (with a warning naming the extra) when it is not installed and no model was asked for."""
    if not cfg.asr:
        return None
    try:
        return asr.Transcriber(cfg.asr_model)
    except asr.ASRUnavailable as e:
        if cfg.asr_model:
            raise
        import warnings

        warnings.warn(f"intelligibility not scored: {e}")
        return None


def transcribe(
    transcriber: asr.Transcriber,
    runs: list[PrecisionRun],
    records: dict[str, TextRecord],
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, dict[str, list[dict]]]:
    """-> {precision: {record id: [one row per seed: what the ASR heard and its edit operations]}}"""
    items = [(run, s, rid, u) for run in runs for s, by in run.utts.items() for rid, u in by.items()]
    out: dict[str, dict[str, list[dict]]] = {}
    for i, (run, _s, rid, u) in enumerate(items):
        text = records[rid].text
        heard = transcriber.transcribe(u.wav, u.sample_rate, textnorm.language_of(text))
        out.setdefault(run.name, {}).setdefault(rid, []).append({"heard": heard, **asdict(asr.errors(text, heard))})
        if progress:
            progress(i + 1, len(items))
    return out


def asr_counts(rows: dict[str, dict], order: list[str]) -> list[asr.ErrorCount]:
    """Every record's per-seed ASR rows (from per_sentence) as ErrorCounts, in `order`."""
    return [
        asr.ErrorCount(**{k: v for k, v in a.items() if k != "heard"})
        for rid in order
        for a in rows[rid].get("asr") or []
    ]


def end_to_end(
    ref: PrecisionRun,
    run: PrecisionRun,
    seeds,
    cep: Cepstra,
    mos: dict[str, float | None] | None,
    heard: dict[str, list[dict]] | None,
) -> dict:
    """mos: {record id: DNSMOS OVRL of this precision's first-seed audio} (None: not scored);
    heard: {record id: [ASR row per seed]} (None: not scored) -> {record id: the per_sentence row}"""
    per_sentence = {}
    for rid in ref.utts[seeds[0]]:
        m = [cep.mcd(ref.utts[s][rid].wav, run.utts[s][rid].wav) for s in seeds] if run is not ref else []
        m = [x for x in m if x is not None]
        d = [run.utts[s][rid].duration / max(ref.utts[s][rid].duration, 1e-9) for s in seeds]
        q = mos[rid] if mos is not None else None
        if run is ref:  # FP32 against itself is 0 by construction; its spread comes from the noise floor
            m = [0.0]
        per_sentence[rid] = {
            "dtw_mcd_db": float(np.mean(m)) if m else None,
            "duration_ratio": float(np.mean(d)),
            "dnsmos_ovrl": q,
            "steps": run.utts[seeds[0]][rid].steps,
            "hit_limit": run.utts[seeds[0]][rid].hit_limit,
            "asr": heard[rid] if heard is not None else None,
        }
    return per_sentence


def floor_rows(ref: PrecisionRun, seeds, cep: Cepstra) -> dict[str, dict]:
    """FP32 at seed[1] against FP32 at seed[0], per record: sampling noise alone."""
    s0, s1 = seeds[0], seeds[1]
    return {
        rid: {
            "dtw_mcd_db": cep.mcd(ref.utts[s0][rid].wav, ref.utts[s1][rid].wav),
            "duration_ratio": ref.utts[s1][rid].duration / max(ref.utts[s0][rid].duration, 1e-9),
        }
        for rid in ref.utts[s0]
    }


def pool(rows: dict[str, dict], order: list[str], key: str) -> list:
    """One value (or list of values) per record, flattened in `order`."""
    out = []
    for rid in order:
        v = rows[rid][key]
        out += v if isinstance(v, list) else [v]
    return out


def floor_cis(rows: dict[str, dict], order: list[str]) -> dict:
    return {k: ci(pool(rows, order, k)) for k in ("dtw_mcd_db", "duration_ratio")}


def noise_floor(ref: PrecisionRun, seeds, cep: Cepstra) -> tuple[dict, dict[str, float]]:
    """-> (CIs, {record id: DTW-MCD}) of FP32 at seed[1] against FP32 at seed[0]."""
    rows = floor_rows(ref, seeds, cep)
    return floor_cis(rows, list(rows)), {rid: r["dtw_mcd_db"] for rid, r in rows.items()}


def floor_verdict(pairs: list[tuple[float, float]], is_reference: bool) -> dict:
    """Within the noise floor: the paired gap (precision's DTW-MCD - FP32's seed-to-seed DTW-MCD, per sentence)
    is not above zero at 95%. -> within_noise_floor, plus gap_vs_noise_floor_db when there is a gap to take."""
    if is_reference or not pairs:
        return {"within_noise_floor": is_reference}
    diff = metrics.bootstrap_diff_ci([a for a, _ in pairs], [b for _, b in pairs])
    return {
        "gap_vs_noise_floor_db": {"mean": diff[0], "lo": diff[1], "hi": diff[2]},
        "within_noise_floor": diff[1] <= 0.0,
    }


def asr_verdict(per_sentence: dict, ref_per_sentence: dict, order: list[str], is_reference: bool) -> dict:
    """The paired gap of the pooled ASR error rate against FP32 (same texts and seeds). A precision whose gap is
    above zero at 95% says words less well than FP32: it is outside the noise floor whatever its MCD."""
    mine, ref = asr_counts(per_sentence, order), asr_counts(ref_per_sentence, order)
    if is_reference or not mine or len(mine) != len(ref):
        return {}
    gap = asr.rate_diff_ci(mine, ref)
    return {"asr_gap_vs_fp32": gap} if gap else {}


def summarize(
    scores: dict[str, dict],
    floor: dict[str, dict],
    order: list[str],
    is_reference: bool,
    ref_scores: dict | None = None,
) -> dict:
    """One precision's stage CIs and noise-floor verdict from its per-record scores (ref_scores: FP32's)."""
    per_sentence = {rid: scores["end_to_end"][rid] for rid in order}
    e2e = {k: ci(pool(per_sentence, order, k)) for k in ("dtw_mcd_db", "duration_ratio", "dnsmos_ovrl")}
    e2e["intelligibility"] = asr.by_language(asr_counts(per_sentence, order)) or None
    e2e["eos_rate"] = float(np.mean([not v["hit_limit"] for v in per_sentence.values()]))
    res = {
        "decoder_vocoder": {k: ci(pool(scores["decoder_vocoder"], order, k)) for k in DECODER_METRICS},
        "gpt_teacher_forced": {k: ci(pool(scores["gpt_teacher_forced"], order, k)) for k in GPT_METRICS},
        "end_to_end": e2e,
        "per_sentence": per_sentence,
    }
    pairs = [
        (per_sentence[r]["dtw_mcd_db"], floor[r]["dtw_mcd_db"])
        for r in order
        if per_sentence[r]["dtw_mcd_db"] is not None and floor[r]["dtw_mcd_db"] is not None
    ]
    verdict = floor_verdict(pairs, is_reference)
    if ref_scores is not None:
        verdict.update(asr_verdict(per_sentence, ref_scores["end_to_end"], order, is_reference))
        if "asr_gap_vs_fp32" in verdict:
            verdict["within_noise_floor"] &= verdict["asr_gap_vs_fp32"]["lo"] <= 0.0
    return {**res, **verdict}


def _merge(parts: list[dict]) -> dict:
    """Rank shards {record id: value} -> one dict (record ids are disjoint across ranks)."""
    return {rid: v for p in parts for rid, v in p.items()}


def run_evaluation(
    cfg: EvalConfig, progress: Callable[[str, int, int], None] | None = None, dist: Dist | None = None
) -> tuple[dict, dict] | tuple[None, None]:
    """-> (report dict, {precision: {seed: {id: Utterance}}}) ; writes nothing.
    With `dist` (torchrun), each rank synthesizes and scores its shard of work units and gets (None, None); rank 0
    gathers the per-record scores and audio, takes the CIs over all records, and times each precision alone."""
    dist = dist or Dist()
    if len(cfg.seeds) < 2:
        raise ValueError("give at least two seeds: the second measures FP32's own seed-to-seed noise floor")
    if cfg.batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    records = load_text_set(cfg.text_set, limit=cfg.limit, purpose="evaluation")
    by_id = {r.id: r for r in records}
    order = [r.id for r in records]
    params = SamplingParams(max_new_tokens=cfg.max_steps)
    units = work_units(records, cfg.batch_size)
    mine = [units[i] for i in shard([u.expected_s for u in units], dist.world_size)[dist.rank]]
    entries = list(dict.fromkeys(["fp32", *cfg.precisions]))
    if not dist.is_main:
        progress = None
    t0 = time.perf_counter()
    runs: list[PrecisionRun] = []
    step = 0
    for entry in entries:
        run = _load(cfg, entry)
        runs.append(run)
        for seed in cfg.seeds:
            if progress:
                progress("synthesize", step, len(entries) * len(cfg.seeds))
            run.utts[seed] = synthesize_units(run, mine, by_id, seed, params, cfg.batch_size)
            step += 1
    if progress:
        progress("synthesize", step, step)
    ref = runs[0]
    cep = Cepstra(ref.synth.sample_rate)
    ref_utts = ref.utts[cfg.seeds[0]]
    ref_wavs = decode_segments(ref, ref_utts)
    decoded = {run.name: ref_wavs if run is ref else decode_segments(run, ref_utts) for run in runs}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)  # not on macOS
    workers = cfg.workers or max(1, cores // dist.world_size)
    cep.prefetch(
        [
            *ref_wavs.values(),
            *(w for run in runs if run is not ref for w in decoded[run.name].values()),
            *(u.wav for run in runs for by in run.utts.values() for u in by.values()),
        ],
        workers,
        (lambda i, n: progress("cepstra", i, n)) if progress else None,
    )
    mos = {}
    if cfg.dnsmos:
        first = [(run.name, rid, u.wav) for run in runs for rid, u in run.utts[cfg.seeds[0]].items()]
        values = map_in_processes(
            dnsmos_overall,
            [(w, cep.sr) for _, _, w in first],
            workers,
            (lambda i, n: progress("dnsmos", i, n)) if progress else None,
        )
        for (name, rid, _), q in zip(first, values):
            mos.setdefault(name, {})[rid] = q
    heard = {}
    transcriber = load_transcriber(cfg)
    if transcriber is not None:
        heard = transcribe(transcriber, runs, by_id, (lambda i, n: progress("asr", i, n)) if progress else None)
    scores = {}
    # numpy's BLAS sums in an order that depends on its thread count, which torchrun sets to 1 per rank: one
    # thread everywhere keeps the scores of a sharded run equal to a single process's
    from threadpoolctl import threadpool_limits  # comes with librosa (the eval extra)

    with threadpool_limits(1, user_api="blas"):
        for i, run in enumerate(runs):
            if progress:
                progress("score", i, len(runs))
            scores[run.name] = {
                "decoder_vocoder": stage_decoder(ref_wavs, decoded[run.name], cep, ref_utts),
                "gpt_teacher_forced": stage_gpt(ref, run, ref_utts, by_id),
                "end_to_end": end_to_end(
                    ref, run, cfg.seeds, cep, mos.get(run.name), heard.get(run.name) if transcriber else None
                ),
            }
        floor = floor_rows(ref, cfg.seeds, cep)
    if progress:
        progress("score", len(runs), len(runs))
    part = {
        "scores": scores,
        "floor": floor,
        # audio for the WAVs and plots; GPT codes and states stay where they were made
        "utts": {
            r.name: {s: {rid: replace(u, segments=[]) for rid, u in by.items()} for s, by in r.utts.items()}
            for r in runs
        },
        "shard": {
            "device": str(ref.synth.device),
            "units": len(mine),
            "records": sum(len(u.ids) for u in mine),
            "expected_audio_s": sum(u.expected_s for u in mine),
            "wall_s": time.perf_counter() - t0,
        },
    }
    parts = dist.gather(part)
    if parts is None:
        return None, None
    sharded_wall = time.perf_counter() - t0
    floor = _merge([p["floor"] for p in parts])
    floor_ci = floor_cis(floor, order)
    results: dict[str, dict] = {}
    merged = {
        run.name: {stage: _merge([p["scores"][run.name][stage] for p in parts]) for stage in scores[run.name]}
        for run in runs
    }
    for i, run in enumerate(runs):  # timed on rank 0 alone, after every rank is done
        if progress:
            progress("time", i, len(runs))
        results[run.name] = {
            "precision": run.name,
            "recipe": getattr(run.synth, "precision", run.name),
            "performance": measure_performance(run, records, cfg, params),
            **summarize(merged[run.name], floor, order, run is ref, merged[ref.name]),
        }
    if progress:
        progress("time", len(runs), len(runs))
    utts = {}
    for r in runs:
        for s in cfg.seeds:
            by_id = _merge([p["utts"][r.name][s] for p in parts])
            utts.setdefault(r.name, {})[s] = {rid: by_id[rid] for rid in order}
    import platform

    report = {
        "schema": "ttsq-eval/1",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "model": cfg.model or "shipped voice",
        "text_set": {"file": cfg.text_set, "sha256": set_hash(cfg.text_set), "records": len(records)},
        "texts": {r.id: r.text for r in records},
        "seeds": list(cfg.seeds),
        "device": str(ref.synth.device),
        "hardware": torch.cuda.get_device_name(ref.synth.device)
        if ref.synth.device.type == "cuda"
        else f"{platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)",
        "versions": {"torch": torch.__version__},
        "mcd_settings": metrics.MCDSettings().describe(),
        "asr": transcriber.settings() if transcriber else None,
        "sampling": params.__dict__,
        "world_size": dist.world_size,
        "devices": [p["shard"]["device"] for p in parts],
        "shards": [{k: v for k, v in p["shard"].items() if k != "device"} for p in parts],
        "sharded_wall_s": sharded_wall,
        "noise_floor": floor_ci,
        "precisions": results,
    }
    return report, utts

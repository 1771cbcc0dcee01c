"""A report dict in the evaluation schema (ttsq-eval/1) from what the GUI measured; written by evaluation.report.

Nothing already measured is computed again. What the GUI does not measure (the decoder+vocoder and teacher-forced
GPT stages, PESQ/STOI) is null, as the schema allows; `ttsq evaluate` fills those. The FP32 noise floor (FP32 at
seed+1 against seed) is measured here, with evaluation.runner's own function, so that the gap to FP32 means
something. What the ASR heard (the worker's intelligibility score) goes in per_sentence "asr" rows shaped like
`ttsq evaluate`'s, so the same writers show the WER/CER column, its gap to FP32 and "What the ASR heard".
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

RID = "gui-001"  # the one sentence of a GUI comparison


def is_reference(res: dict) -> bool:
    """The FP32 row of its model, which the other rows of that model are compared with."""
    return res.get("precision", res["name"]) == "fp32"


def measure_noise_floor(job, reference_utt, emit=None, should_stop=None, synth=None) -> dict:
    """FP32 at seed+1 vs FP32 at seed, via evaluation.runner.noise_floor. synth: job.model's FP32 Synthesizer, if
    one is loaded. -> {"floor": CIs, "per": {RID: DTW-MCD}, "utt": the seed+1 Utterance}."""
    from evaluation.runner import Cepstra, PrecisionRun, noise_floor
    from toolkit.synthesizer import Synthesizer

    if emit:
        emit("progress", (0.1, "fp32 at another seed (noise floor)"))
    synth = synth or Synthesizer(job.model, job.device)
    other = synth.synthesize(
        job.text,
        speaker=job.speaker,
        seed=job.seed + 1,
        params=job.params,
        control_tokens=job.control_tokens,
        should_stop=should_stop,
        refine=job.refine,
        refine_prompt=job.refine_prompt,
    )[0]
    run = PrecisionRun("fp32", synth, 0, {job.seed: {RID: reference_utt}, job.seed + 1: {RID: other}})
    floor, per = noise_floor(run, (job.seed, job.seed + 1), Cepstra(reference_utt.sample_rate))
    return {"floor": floor, "per": per, "utt": other}


def verdict(res: dict, ref: dict | None, floor: dict | None) -> dict:
    """The report's verdict for one GUI result against FP32 (`ref`) and the noise floor, as `ttsq evaluate` gives
    it: within_noise_floor, gap_vs_noise_floor_db, asr_gap_vs_fp32 (evaluation.runner's functions, one sentence)."""
    from evaluation.runner import asr_verdict, floor_verdict

    is_ref = is_reference(res)
    floor_mcd = (floor or {}).get("per", {}).get(RID)
    pairs = [(res["mcd_db"], floor_mcd)] if res["mcd_db"] is not None and floor_mcd is not None else []
    out = floor_verdict(pairs, is_ref)
    rows = {RID: {"asr": [res["asr"]] if res.get("asr") else None}}
    ref_rows = {RID: {"asr": [ref["asr"]] if ref and ref.get("asr") else None}}
    out.update(asr_verdict(rows, ref_rows, [RID], is_ref))
    if "asr_gap_vs_fp32" in out:  # as in ttsq evaluate: a precision that loses words is outside the floor
        out["within_noise_floor"] &= out["asr_gap_vs_fp32"]["lo"] <= 0.0
    return out


def build_report(
    job, results: list[dict], floor: dict | None, floors: dict[str, dict] | None = None
) -> tuple[dict, dict]:
    """-> (report, utts) for evaluation.report.write_report. The rows of a model added to the comparison (their
    "group") are compared with that model's own FP32 and noise floor (`floors` by group), not the first model's;
    every row names the folder it ran ("model"), as the report's top-level "model" is the first model's only."""
    import torch

    from evaluation import asr, metrics
    from evaluation.runner import asr_counts, ci

    refs = {r.get("group", ""): r for r in results if is_reference(r)}
    floors = {**(floors or {}), "": floor}
    precisions = {}
    for r in results:
        ref = refs.get(r.get("group", ""))
        dur_ratio = r["duration_s"] / max(ref["duration_s"], 1e-9) if ref else None
        t = r["timings"]
        perf = {
            "latency_s": r["latency_s"],
            "rtf": r["rtf"],
            "steps_per_s": r["steps"] / max(t.get("gpt", 0), 1e-9),
            "time_to_first_audio_s": r["time_to_first_audio_s"],
            "stage_latency_s": {k: t.get(k) for k in ("gpt", "decoder", "vocoder")},
            "throughput_audio_s_per_s": {"1": r["duration_s"] / max(r["latency_s"], 1e-9)},
            "size_bytes": r["size_bytes"],
            "peak_gpu_bytes_torch": r["peak_gpu_bytes"],
            "peak_gpu_bytes_nvml": None,
        }
        per_sentence = {
            RID: {
                "dtw_mcd_db": r["mcd_db"],
                "duration_ratio": dur_ratio,
                "dnsmos_ovrl": r["dnsmos_ovrl"],
                "steps": r["steps"],
                "hit_limit": r["hit_limit"],
                "asr": [r["asr"]] if r.get("asr") else None,
            }
        }  # one seed: one row
        res = {
            "precision": r["name"],
            "recipe": r["recipe"],
            "model": r["model"] or "shipped voice",  # the folder this row ran: a model, an artifact or ONNX folder
            "performance": perf,
            "decoder_vocoder": {"mcd_db": None, "pesq_wb": None, "stoi": None, "log_mel_l1": None},
            "gpt_teacher_forced": {"top1_agreement": None, "kl_nats": None},
            "end_to_end": {
                "dtw_mcd_db": ci([r["mcd_db"]]),
                "duration_ratio": ci([dur_ratio]),
                "dnsmos_ovrl": ci([r["dnsmos_ovrl"]]),
                "intelligibility": asr.by_language(asr_counts(per_sentence, [RID])) or None,
                "eos_rate": float(not r["hit_limit"]),
            },
            "per_sentence": per_sentence,
        }
        precisions[r["name"]] = {**res, **verdict(r, ref, floors.get(r.get("group", "")))}
    device = results[0]["device"] if results else job.device
    report = {
        "schema": "ttsq-eval/1",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "source": "ttsq gui (one sentence; decoder+vocoder and GPT stages not measured: run ttsq evaluate)",
        "model": job.model or "shipped voice",
        "text_set": {"file": "(typed in the GUI)", "sha256": None, "records": 1, "text": job.text},
        "texts": {RID: job.text},
        "seeds": [job.seed, job.seed + 1],
        "device": device,
        "hardware": torch.cuda.get_device_name(torch.device(device))
        if device.startswith("cuda")
        else f"{platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)",
        "versions": {"torch": torch.__version__},
        "mcd_settings": metrics.MCDSettings().describe(),
        "asr": next((r["asr_settings"] for r in results if r.get("asr_settings")), None),
        "sampling": dict(job.params.__dict__),
        "noise_floor": (floor or {}).get("floor") or {"dtw_mcd_db": None, "duration_ratio": None},
        "precisions": precisions,
    }
    utts = {r["name"]: {job.seed: {RID: r["utt"]}} for r in results}
    return report, utts


def save_report(
    job,
    results: list[dict],
    out: str | Path,
    emit=None,
    should_stop=None,
    floor: dict | None = None,
    floors: dict[str, dict] | None = None,
) -> Path:
    """floor: the noise floor the window already measured (measure_noise_floor's dict); measured here otherwise.
    floors: those of the models added to the comparison, by group (build_report)."""
    from evaluation.report import write_report

    ref = next((r for r in results if r["name"] == "fp32"), None)
    if floor is None and ref is not None:
        floor = measure_noise_floor(job, ref["utt"], emit, should_stop)
    if emit:
        emit("progress", (0.7, "writing report"))
    report, utts = build_report(job, results, floor, floors)
    return write_report(report, utts, out)

"""Precision benchmark at ChatTTS's real dimensions with random weights (so the numbers carry to real checkpoints).

For every recipe: decode steps/s at batch 1 (CUDA graphs vs eager), audio throughput at batches 8 and 64,
end-to-end RTF for a 10 s utterance (470 steps + Decoder + Vocos), peak memory, weight bytes, and the error of
each stage against FP32 on identical inputs (GPT teacher-forced hidden states, Decoder mel, Vocos waveform).

    python benchmarks/gpu_bench.py --out benchmarks/results/current/gpu_precisions.json [--device cuda] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from toolkit.bench import STEPS_PER_S, decode_rate, random_model, utterance_timing  # noqa: E402
from toolkit.precision import quantize, state_bytes  # noqa: E402
from toolkit.precision.calibration import relative_error  # noqa: E402

STEPS_10S = 470  # 10 s of audio at 46.875 steps/s


def stage_inputs(model, dev):
    g = torch.Generator(device="cpu").manual_seed(1)
    D = model.cfg.gpt.hidden
    x = (torch.randn(2, 96, D, generator=g) * 0.1).to(dev)
    valid = torch.ones(2, 96, dtype=torch.bool, device=dev)
    hid = torch.randn(2, 64, D, generator=g).to(dev)
    return x, valid, hid


@torch.inference_mode()
def stage_outputs(model, inputs):
    x, valid, hid = inputs
    dt = model.gpt.norm.weight.dtype
    h = model.gpt.forward_full(x.to(dt), valid).float()
    mel = model.hidden_to_mel(hid).float()
    return {"gpt": [h], "decoder": [mel], "vocos": [model.mel_to_wav(mel).float()]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/current/gpu_precisions.json")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--precisions", default="fp32,bf16,fp16,int8,int4,int4-hqq,fp8,w8a8")
    ap.add_argument("--batches", default="8,64")
    ap.add_argument("--quick", action="store_true", help="tiny dimensions, for a CPU smoke run")
    a = ap.parse_args()
    dev = torch.device(a.device)
    base = random_model("tiny" if a.quick else "chattts", dev)
    inputs = stage_inputs(base, dev)
    ref = stage_outputs(base, inputs)
    batches = [int(b) for b in a.batches.split(",")]
    results = {}
    for name in a.precisions.split(","):
        row = {}
        try:
            model = copy.deepcopy(base)
            quantize(model, name, device=dev)
            row["weight_bytes"] = state_bytes(model)
            out = stage_outputs(model, inputs)
            row["rel_error"] = {s: relative_error(out[s], ref[s]) for s in out}
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
            row["steps_per_s_b1_graph"] = decode_rate(model, 1, STEPS_10S, dev, cuda_graphs=True)
            if dev.type == "cuda":
                row["peak_mem_b1_bytes"] = torch.cuda.max_memory_allocated(dev)
            row["steps_per_s_b1_eager"] = decode_rate(model, 1, 64, dev, cuda_graphs=False, repeats=1)
            row["rtf_10s_b1"], row["time_to_first_audio_s"] = utterance_timing(model, STEPS_10S, dev)
            for b in batches:
                if dev.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(dev)
                sps = decode_rate(model, b, 235, dev, repeats=1)
                row[f"audio_s_per_s_gpt_b{b}"] = sps * b / STEPS_PER_S
                if dev.type == "cuda":
                    row[f"peak_mem_b{b}_bytes"] = torch.cuda.max_memory_allocated(dev)
            del model
        except Exception as e:  # record and go on: one recipe failing must not hide the others
            row["error"] = f"{type(e).__name__}: {e}"[:500]
        results[name] = row
        print(name, json.dumps(row), flush=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    report = {
        "command": " ".join(sys.argv),
        "device": str(dev),
        "hardware": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor(),
        "torch": torch.__version__,
        "config": "ChatTTS dims, random weights" if not a.quick else "tiny",
        "steps_per_10s": STEPS_10S,
        "results": results,
    }
    try:
        import torchao

        report["torchao"] = torchao.__version__
    except ImportError:
        pass
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=2) + "\n")
    print(
        "\n| precision | weights MiB | steps/s b1 graph | steps/s b1 eager | RTF 10 s | audio s/s b8 | audio s/s b64 | "
        "peak MiB b1 | err gpt | err decoder | err vocos |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, r in results.items():
        if "error" in r:
            print(f"| {n} | failed: {r['error'][:80]} |")
            continue
        e = r["rel_error"]
        print(
            f"| {n} | {r['weight_bytes'] / 2**20:.0f} | {r['steps_per_s_b1_graph']:.0f} |"
            f" {r['steps_per_s_b1_eager']:.0f} | "
            f"{r['rtf_10s_b1']:.4f} | {r.get('audio_s_per_s_gpt_b8', 0):.0f} |"
            f" {r.get('audio_s_per_s_gpt_b64', 0):.0f} | "
            f"{r.get('peak_mem_b1_bytes', 0) / 2**20:.0f} | {e['gpt']:.1e} | {e['decoder']:.1e} | {e['vocos']:.1e} |"
        )


if __name__ == "__main__":
    main()

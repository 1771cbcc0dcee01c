"""`ttsq bench`: ttsq's engine and the `chattts` package side by side in one run, on random weights at the same
dimensions and the same number of GPT steps (EOS suppressed), for every precision and batch size.

ttsq side, per precision: GPT steps/s at each batch (medians of repeats, warm-up and graph capture excluded), audio
seconds per second, end-to-end RTF of one utterance (GPT + Decoder + Vocos), time to first audio when streaming,
peak memory (what the precision allocates on top of what the run held before its copy was made), weight bytes.
chattts side: its GPT.generate at each batch, run in a subprocess with the Python given by --chattts-python (a venv
holding chattts 0.2.5; ttsq never imports it). The ratio is taken per batch.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import os
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .engine import Engine, sync_device, timed
from .models import ModelConfig, TTSModel, tiny
from .plan import render_stream
from .precision import quantize, split_precision, state_bytes
from .sampling import SamplingParams
from .streaming import StreamRenderer

STEPS_PER_S = 46.875  # GPT steps per second of audio


@dataclass
class BenchConfig:
    precisions: list[str] = field(default_factory=lambda: ["fp32", "bf16", "fp16", "int8", "int8@bf16", "int4"])
    batches: list[int] = field(default_factory=lambda: [1, 8, 64])
    steps: int = 470  # 10 s of audio
    device: str | None = None
    dims: str = "chattts"  # or "tiny" (CI)
    repeats: int = 3
    prompt: int = 32
    compile: bool | None = None  # torch.compile the decode step under the CUDA graphs; None: on CUDA only
    kernels: bool | None = None  # the Triton decode step at batch <= 2: None where it runs (CUDA), or forced on/off
    chattts_python: str | None = None
    chattts_timeout: int = 1800


def random_model(dims: str, device: torch.device) -> TTSModel:
    """Random weights at ChatTTS's dimensions (or tiny ones), with ChatTTS-like layer scales."""
    torch.manual_seed(0)
    cfg = ModelConfig(dvae=None, gfsq=None) if dims == "chattts" else tiny()
    model = TTSModel(cfg).to(device).eval().requires_grad_(False)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("scale"):
                p.fill_(0.1)
    return model


def _prompt(model: TTSModel, B: int, T: int, dev: torch.device):
    g = torch.Generator().manual_seed(0)
    emb = (torch.randn(B, T, model.cfg.gpt.hidden, generator=g) * 0.1).to(dev, model.gpt.norm.weight.dtype)
    return emb, torch.ones(B, T, dtype=torch.bool, device=dev)


def decode_rate(
    model: TTSModel, B: int, steps: int, dev: torch.device, *, prompt: int = 32, repeats: int = 3, **engine_options
) -> float:
    """GPT steps/s for B sequences of exactly `steps` codes; the first run (warm-up, compile, capture) is not timed.
    engine_options: Engine arguments (cuda_graphs, compile, ...)."""
    eng = Engine(model.gpt, **engine_options)
    emb, valid = _prompt(model, B, prompt, dev)
    p = SamplingParams(max_new_tokens=steps, min_new_tokens=steps)
    eng.generate(emb, valid, p, reserve=steps)  # one cache size: one compile per batch with compile=True
    times = [timed(lambda: eng.generate(emb, valid, p, seed=r, reserve=steps), dev) for r in range(repeats)]
    return steps / statistics.median(times)


def utterance_timing(
    model: TTSModel,
    steps: int,
    dev: torch.device,
    *,
    prompt: int = 32,
    repeats: int = 3,
    compile: bool = False,
    kernels: bool | None = None,
    parts: dict | None = None,
) -> tuple[float, float]:
    """(RTF of one whole utterance: GPT + Decoder + Vocos, time to first audio when streaming), medians.
    parts: filled with where first audio's time goes, medians too: the prefill plus one step, and
    one render of the states first audio needs (timed apart, each between syncs)."""
    eng = Engine(model.gpt, compile=compile, kernels=kernels)
    emb, valid = _prompt(model, 1, prompt, dev)
    p = SamplingParams(max_new_tokens=steps, min_new_tokens=steps)
    first_audio_steps = StreamRenderer(model).first_audio_step
    rtf, first, prefill, render = [], [], [], []
    for r in range(repeats + 1):  # the first round warms up
        sync_device(dev)
        t0 = time.perf_counter()
        gen = eng.generate(emb, valid, p, seed=r, reserve=steps)
        wav = model.mel_to_wav(model.hidden_to_mel(gen.hidden).float())
        sync_device(dev)
        wall = time.perf_counter() - t0
        t0 = time.perf_counter()
        renderer = StreamRenderer(model)
        pieces = render_stream(
            eng.stream(
                emb, valid, p, seed=r, first_yield=renderer.first_audio_step, lookahead=renderer.overlaps, reserve=steps
            ),
            renderer,
        )
        next(pieces)
        first_audio = time.perf_counter() - t0
        pieces.close()
        chunks = eng.stream(emb, valid, p, seed=r, first_yield=1, reserve=steps)  # handed over after one step
        t_prefill = timed(lambda: next(chunks), dev)
        chunks.close()
        states = gen.hidden[0, :first_audio_steps]
        t_render = timed(lambda: StreamRenderer(model).push(states), dev)
        if r:
            rtf.append(wall / (wav.shape[-1] / model.sample_rate))
            first.append(first_audio)
            prefill.append(t_prefill)
            render.append(t_render)
    if parts is not None:
        parts.update(
            prefill_and_first_step_s=statistics.median(prefill),
            first_audio_steps=first_audio_steps,
            render_first_audio_s=statistics.median(render),
        )
    return statistics.median(rtf), statistics.median(first)


def quantized_copy(base: TTSModel, dev: torch.device, precision: str) -> TTSModel:
    """A copy of base in a recipe; NAME@DTYPE runs the recipe's float parts (and activations) in DTYPE, e.g.
    int8@bf16 for int8 weights on bf16 activations."""
    model = copy.deepcopy(base)
    recipe, float_dtype = split_precision(precision)
    quantize(model, recipe, device=dev, float_dtype=float_dtype)
    return model


def bench_precision(base: TTSModel, name: str, cfg: BenchConfig, dev: torch.device, on_batch=None) -> dict:
    """One precision's row. on_batch(row, B) is called after each batch, so a run cut short keeps the batches that
    finished (one compile per batch size can take minutes)."""
    # peak memory counts what this precision allocates, not the fp32 base it is copied from or whatever earlier
    # precisions left allocated: later precisions of a run used to read higher (int4 2503 MiB third, 1525 first)
    held = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0
    model = quantized_copy(base, dev, name)
    probe = Engine(model.gpt, kernels=cfg.kernels)  # decode_rate's engines decide the same way
    row: dict = {
        "weight_bytes": state_bytes(model),
        "steps_per_s": {},
        "audio_s_per_s": {},
        "peak_mem_bytes": {},
        "triton_kernel_batches": [B for B in cfg.batches if probe.uses_kernels(B, dev)],
    }
    if row["triton_kernel_batches"]:  # the launch settings they ran with, for the record
        from . import kernels  # imported by uses_kernels already (Triton is there)

        row["triton_kernel_configs"] = dict(copy.deepcopy(kernels.CONFIGS), launch=dict(pdl=probe.kernel_pdl))
    for B in cfg.batches:
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        try:  # a recipe may not take every batch (torchao's w8a8 needs more than 16 rows on CUDA)
            sps = decode_rate(
                model,
                B,
                cfg.steps,
                dev,
                prompt=cfg.prompt,
                repeats=cfg.repeats,
                compile=cfg.compile,
                kernels=cfg.kernels,
            )
        except Exception as e:  # noqa: BLE001 - recorded per batch; the other batches still run
            row.setdefault("errors", {})[str(B)] = f"{type(e).__name__}: {e}"[:300]
        else:
            row.setdefault("bench_wall_s", {})[str(B)] = round(time.perf_counter() - t0, 1)  # incl. compile, capture
            row["steps_per_s"][str(B)] = sps
            row["audio_s_per_s"][str(B)] = sps * B / STEPS_PER_S
            if dev.type == "cuda":
                row["peak_mem_bytes"][str(B)] = torch.cuda.max_memory_allocated(dev) - held
        if on_batch:
            on_batch(row, B)
    if "1" in row["steps_per_s"]:  # RTF and first audio are batch-1 figures
        row["first_audio_parts"] = {}
        row["rtf"], row["time_to_first_audio_s"] = utterance_timing(
            model,
            cfg.steps,
            dev,
            prompt=cfg.prompt,
            repeats=cfg.repeats,
            compile=cfg.compile,
            kernels=cfg.kernels,
            parts=row["first_audio_parts"],
        )
    if not row["steps_per_s"]:
        raise RuntimeError("no batch size ran: " + "; ".join(row.get("errors", {}).values()))
    return row


# The chattts side, run by another interpreter: argv = steps batch device dims. Prints one JSON line.
CHATTTS_SCRIPT = r'''
import json, logging, sys, time
from dataclasses import asdict
import torch
steps, B, device, dims = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
from ChatTTS.config import Config
from ChatTTS.model.embed import Embed
from ChatTTS.model.gpt import GPT
from transformers import LlamaModel
cfg = Config()
if dims == "tiny":  # ttsq's tiny() GPT
    cfg.gpt.hidden_size, cfg.gpt.intermediate_size, cfg.gpt.num_attention_heads = 64, 128, 4
    cfg.gpt.num_hidden_layers, cfg.gpt.max_position_embeddings, cfg.embed.hidden_size = 2, 512, 64
torch.manual_seed(0)
embed = Embed(cfg.embed.hidden_size, cfg.embed.num_audio_tokens, cfg.embed.num_text_tokens, cfg.embed.num_vq)
gpt = GPT(asdict(cfg.gpt), embed.eval(), device=torch.device(device), device_gpt=torch.device(device),
          logger=logging.getLogger("chattts"))
gpt.gpt = LlamaModel(gpt.llama_config).eval()
gpt, embed = gpt.to(device), embed.to(device)
T = 32
ids = torch.randint(0, 1000, (B, T, cfg.gpt.num_vq), device=device)
ids[..., 1:] = ids[..., :1]
mask = torch.ones(B, T, dtype=torch.bool, device=device)
sync = (lambda: torch.cuda.synchronize()) if device.startswith("cuda") else (lambda: None)
def run():
    with torch.inference_mode():
        emb = embed(ids, mask)
        sync(); t0 = time.perf_counter()
        res = list(gpt.generate(emb, ids, temperature=torch.tensor([0.3] * 4, device=device), eos_token=625,
                                attention_mask=mask, max_new_token=steps, min_new_token=steps, infer_text=False,
                                return_hidden=True, stream=False, show_tqdm=False, manual_seed=0))[-1]
        sync()
        return time.perf_counter() - t0, len(res.ids[0])
run()  # warm-up
dt, n = run()
peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else None
rss = [int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:")]
print(json.dumps({"steps": n, "gpt_s": dt, "steps_per_s": n / dt, "peak_mem_bytes": peak,
                  "peak_rss_mib": rss[0] if rss else None, "threads": torch.get_num_threads(),
                  "torch": torch.__version__}))
'''


def run_chattts(
    python: str,
    steps: int,
    batch: int,
    device: str,
    dims: str = "chattts",
    timeout: int = 1800,
    threads: int | None = None,
    workdir: Path | None = None,
) -> dict:
    """The `chattts` package's GPT for `steps` steps at `batch`, in a subprocess: {"steps_per_s", ...} or
    {"error"/"skipped": why}."""
    workdir = Path(workdir or os.environ.get("TMPDIR", "/tmp"))
    script = workdir / "ttsq_chattts_bench.py"
    script.write_text(CHATTTS_SCRIPT)
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    try:
        r = subprocess.run(
            [python, str(script), str(steps), str(batch), device, dims],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            cwd=workdir,
        )
    except FileNotFoundError:
        return {"skipped": f"no Python at {python}"}
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    if r.returncode:
        return {"error": r.stderr.strip()[-1200:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_bench(cfg: BenchConfig, progress=print, on_update=None) -> dict:
    """The chattts side first, then ttsq per precision. on_update(report) is called after each part, with
    report["complete"] False until the end, so a run cut short keeps what it measured, baseline included."""
    dev = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if cfg.compile is None:  # the fast GPU path; on the CPU compiling costs more than it saves in a bench
        cfg = dataclasses.replace(cfg, compile=dev.type == "cuda")
    report = {
        "schema": "ttsq-bench/1",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": str(dev),
        "hardware": torch.cuda.get_device_name(dev)
        if dev.type == "cuda"
        else f"{platform.machine()} CPU, {torch.get_num_threads()} threads",
        "torch": torch.__version__,
        "dims": cfg.dims,
        "steps": cfg.steps,
        "batches": cfg.batches,
        "compile": cfg.compile,
        "kernels": cfg.kernels,
        "ttsq": {},
        "chattts": {},
        "complete": False,
    }
    update = on_update or (lambda r: None)
    for B in cfg.batches:
        report["chattts"][str(B)] = (
            run_chattts(
                cfg.chattts_python,
                cfg.steps,
                B,
                str(dev),
                cfg.dims,
                cfg.chattts_timeout,
                torch.get_num_threads() if dev.type == "cpu" else None,
            )
            if cfg.chattts_python
            else {"skipped": "no --chattts-python given"}
        )
        progress(f"chattts batch {B}: {json.dumps(report['chattts'][str(B)])[:300]}")
    update(report)
    base = random_model(cfg.dims, dev)

    def batch_done(name: str, row: dict, B: int) -> None:
        report["ttsq"][name] = row
        done = row["steps_per_s"].get(str(B))
        progress(
            f"ttsq {name} batch {B}: "
            + (
                f"{done:.0f} steps/s in {row['bench_wall_s'][str(B)]} s with compile and capture"
                if done
                else f"failed: {row['errors'][str(B)]}"
            )
        )
        update(report)

    for name in cfg.precisions:
        try:
            report["ttsq"][name] = bench_precision(base, name, cfg, dev, functools.partial(batch_done, name))
        except Exception as e:  # noqa: BLE001 - one recipe failing (e.g. fp8 on CPU) must not hide the others
            report["ttsq"][name] = {"error": f"{type(e).__name__}: {e}"[:400]}
        progress(f"ttsq {name}: {json.dumps(report['ttsq'][name])}")
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        update(report)
    report["complete"] = True
    update(report)
    return report


def markdown(report: dict) -> str:
    batches = [str(b) for b in report["batches"]]
    head = (
        ["precision", "weights MiB", "RTF", "first audio s"]
        + [f"steps/s b{b}" for b in batches]
        + [f"audio s/s b{b}" for b in batches]
        + [f"x chattts b{b}" for b in batches]
        + [f"peak MiB b{b}" for b in batches]
    )
    mode = "CUDA graphs + torch.compile" if report.get("compile") else "CUDA graphs (no torch.compile)"
    if report.get("kernels") is not None:
        mode += ", Triton kernels " + ("forced on" if report["kernels"] else "off")
    lines = [
        f"ttsq bench: {report['hardware']}, torch {report['torch']}, {report['dims']} dimensions, random weights, "
        f"{report['steps']} GPT steps, ttsq engine: {mode}, {report['created']}"
        + ("" if report.get("complete", True) else " (incomplete: the run has not finished, or was cut short)"),
        "",
        "| " + " | ".join(head) + " |",
        "|---" * len(head) + "|",
    ]
    ref = report["chattts"]
    for name, r in report["ttsq"].items():
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error'][:100]} |")
            continue
        sps = r["steps_per_s"]
        ratio = [
            f"{sps[b] / ref[b]['steps_per_s']:.1f}x" if b in sps and "steps_per_s" in ref.get(b, {}) else "–"
            for b in batches
        ]
        mem = [f"{r['peak_mem_bytes'][b] / 2**20:.0f}" if b in r["peak_mem_bytes"] else "–" for b in batches]
        at_b1 = [f"{r['rtf']:.3f}", f"{r['time_to_first_audio_s']:.3f}"] if "rtf" in r else ["–", "–"]
        lines.append(
            "| "
            + " | ".join(
                [name, f"{r['weight_bytes'] / 2**20:.0f}"]
                + at_b1
                + [f"{sps[b]:.0f}" if b in sps else "–" for b in batches]
                + [f"{r['audio_s_per_s'][b]:.1f}" if b in sps else "–" for b in batches]
                + ratio
                + mem
            )
            + " |"
        )
    cells = [
        f"b{b}: "
        + (
            f"{ref[b]['steps_per_s']:.1f} steps/s"
            if "steps_per_s" in ref[b]
            else ref[b].get("skipped") or "failed: " + ref[b].get("error", "")[-200:]
        )
        for b in batches
        if b in ref
    ]
    lines += ["", "chattts package, same run: " + "; ".join(cells)]
    parts = []
    for name, r in report["ttsq"].items():
        if f := r.get("first_audio_parts"):
            parts.append(
                f"{name}: prefill + 1 step {f['prefill_and_first_step_s'] * 1e3:.1f} ms, "
                f"render of the first {f['first_audio_steps']} states {f['render_first_audio_s'] * 1e3:.1f} ms"
            )
    if parts:
        lines += ["", "Where first audio goes (batch 1, each part timed alone): " + "; ".join(parts)]
    fused = [
        f"{name} at batch {', '.join(map(str, r['triton_kernel_batches']))}"
        for name, r in report["ttsq"].items()
        if r.get("triton_kernel_batches")
    ]
    if fused:
        lines += ["", "Decode steps through the Triton kernels of toolkit/kernels.py: " + "; ".join(fused)]
    return "\n".join(lines) + "\n"

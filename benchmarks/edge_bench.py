#!/usr/bin/env python
"""Edge benchmark: ONNX Runtime on the CPU with the torch-free runtime (toolkit.runtime), per export precision.

    .venv/bin/python benchmarks/edge_bench.py --threads 2 --out benchmarks/results/current/edge_cpu

Models: the shipped voice (real weights, natural EOS), and ChatTTS dimensions with random weights (a fixed number
of GPT steps: min_new_tokens = max_new_tokens = --steps). Per precision: file sizes, load time, RTF, GPT steps/s,
time to first audio when streaming, peak RSS (each run in its own torch-free process). For the voice, quality
against torch FP32: DNSMOS of each precision's own synthesis, DTW-MCD against the torch FP32 synthesis of the same
text and seed (FP32's own seed-to-seed spread given for scale), and a sample-aligned MCD of the Decoder+Vocos on
identical GPT states. Also: ISTFT in numpy vs in the graph, Conv int8 vs float in the Decoder/Vocos, and the
`chattts` package (reference venv) on the CPU for the same number of GPT steps.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away."
REFENV = Path("/work/refenv/bin/python")


def peak_rss_mib() -> float:
    """VmHWM of this process (ru_maxrss would carry the forking parent's high-water mark across exec)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


# --------------------------------------------------------------------------------------- child (torch-free)
def child(a) -> None:
    import numpy as np

    from toolkit.runtime import EdgeSynthesizer, SamplingParams

    t0 = time.perf_counter()
    s = EdgeSynthesizer(a.child, threads=a.threads, device="cpu")
    load = time.perf_counter() - t0
    fixed = a.steps if a.fixed else 0
    params = SamplingParams(max_new_tokens=a.steps if a.fixed else 1024, min_new_tokens=fixed)
    s.synthesize(TEXT, seed=a.seed, speaker=a.speaker, params=params)  # warm-up at full length: steady state is timed
    runs = []
    for r in range(a.repeats):
        utt = s.synthesize(TEXT, seed=a.seed, speaker=a.speaker, params=params)[0]
        runs.append(utt)
    median = sorted(runs, key=lambda u: u.timings["total"])[len(runs) // 2]  # the box is noisy
    t = median.timings
    t0 = time.perf_counter()
    ttfa, n = None, 0
    for piece in s.stream(TEXT, seed=a.seed, speaker=a.speaker, params=params):
        if ttfa is None:
            ttfa = time.perf_counter() - t0
        n += piece.size
    stream_total = time.perf_counter() - t0
    if a.save_wav:
        np.save(a.save_wav, median.wav)
    print(
        json.dumps(
            {
                "load_s": round(load, 3),
                "audio_s": round(median.duration, 3),
                "steps": median.steps,
                "total_s": round(t["total"], 3),
                "rtf": round(t["total"] / median.duration, 3),
                "gpt_s": round(t["gpt"], 3),
                "gpt_steps_per_s": round(median.steps / t["gpt"], 2),
                "decoder_s": round(t["decoder"], 3),
                "vocoder_s": round(t["vocoder"], 3),
                "stream_ttfa_s": round(ttfa, 3),
                "stream_total_s": round(stream_total, 3),
                "stream_rtf": round(stream_total / (n / s.sample_rate), 3),
                "peak_rss_mib": peak_rss_mib(),
                "all_totals_s": [round(u.timings["total"], 3) for u in runs],
            }
        )
    )


def run_child(folder: Path, a, fixed: bool, speaker: str | None, save_wav: Path | None = None) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        str(folder),
        "--threads",
        str(a.threads),
        "--steps",
        str(a.steps),
        "--repeats",
        str(a.repeats),
        "--seed",
        str(a.seed),
    ]
    cmd += ["--fixed"] if fixed else []
    cmd += ["--speaker", speaker] if speaker else []
    cmd += ["--save-wav", str(save_wav)] if save_wav else []
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads)}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode:
        return {"error": r.stderr[-1500:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------- parent
def sizes(folder: Path) -> dict:
    m = json.loads((folder / "onnx_manifest.json").read_text())
    out = {k: v["bytes"] for k, v in m["files"].items() if k.endswith(".onnx")}
    out["total_onnx"] = sum(out.values())
    return out


def snapshot_voice(src: Path, dst: Path) -> Path | None:
    """Copy the shipped voice once it is complete; drop old exports of it when its weights changed."""
    try:
        m = json.loads((src / "manifest.json").read_text())
        files = {k: v["sha256"] for k, v in m["files"].items()}
        if not all((src / k).is_file() for k in files):
            return dst if (dst / "manifest.json").is_file() else None
        old = json.loads((dst / "manifest.json").read_text())["files"] if (dst / "manifest.json").is_file() else None
        if old is None or {k: v["sha256"] for k, v in old.items()} != files:
            tmp = dst.with_name(dst.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(src, tmp)
            shutil.rmtree(dst, ignore_errors=True)
            tmp.rename(dst)
            for f in dst.parent.glob("voice-*"):  # exports and results of the previous weights
                shutil.rmtree(f, ignore_errors=True) if f.is_dir() else f.unlink()
        return dst
    except (OSError, KeyError, json.JSONDecodeError):
        return None


def build_full(work: Path) -> Path:
    import torch

    from toolkit.checkpoint import save_ttsq
    from toolkit.models import ModelConfig, TTSModel
    from toolkit.models.tokenizer import build_char_tokenizer

    dst = work / "chattts_dims"
    if (dst / "manifest.json").is_file():
        return dst
    import string

    tok = build_char_tokenizer(string.ascii_lowercase + string.digits + string.punctuation, work / "tok.json")
    torch.manual_seed(0)
    model = TTSModel(ModelConfig(), tok).eval()
    std = torch.full((768,), 0.02)
    model.spk_stat.copy_(torch.stack([std, torch.zeros(768)]))
    return save_ttsq(model, dst)


def export(src: Path, precision: str, dst: Path, reuse: bool) -> float:
    from toolkit.export import export_onnx

    if reuse and (dst / "onnx_manifest.json").is_file():
        return json.loads((dst / "onnx_manifest.json").read_text()).get("export_seconds", float("nan"))
    t0 = time.perf_counter()
    export_onnx(src, precision, dst, force=True)
    return round(time.perf_counter() - t0, 1)


def quality(voice: Path, folders: dict[str, Path], a, wavs: dict[str, Path]) -> dict:
    """The voice: torch FP32 vs each exported precision."""
    import numpy as np
    import torch

    from evaluation.metrics import dnsmos, mcd
    from toolkit import SamplingParams, Synthesizer
    from toolkit.runtime import EdgeSynthesizer

    torch.set_num_threads(a.threads)
    synth = Synthesizer(voice, "cpu")
    p = SamplingParams(max_new_tokens=1024)
    ref = synth.synthesize(TEXT, seed=a.seed, params=p)[0]
    other = synth.synthesize(TEXT, seed=a.seed + 1, params=p)[0]
    sr = ref.sample_rate
    hidden = torch.cat([s.hidden for s in ref.segments])[None]
    stage_ref = synth.decode(hidden, torch.tensor([hidden.shape[1]]))[0][0]
    out = {
        "torch_fp32": {
            "dnsmos": dnsmos(ref.wav, sr),
            "duration_s": round(ref.duration, 2),
            "mcd_dtw_db_seed_spread": round(mcd(ref.wav, other.wav, sr).value_db, 3),
        }
    }
    for prec, folder in folders.items():
        e = EdgeSynthesizer(folder, threads=a.threads, device="cpu")
        wav = (
            np.load(wavs[prec])
            if prec in wavs and wavs[prec].is_file()
            else e.synthesize(TEXT, seed=a.seed, params=p)[0].wav
        )
        stage, _, _ = e.decode(hidden[0].numpy(), hidden.shape[1])
        out[prec] = {
            "dnsmos": dnsmos(wav, sr),
            "duration_ratio": round(len(wav) / len(ref.wav), 3),
            "mcd_dtw_db_vs_torch_fp32": round(mcd(ref.wav, wav, sr).value_db, 3),
            "stage_mcd_db_decoder_vocos": round(mcd(stage_ref, stage, sr, align="none").value_db, 3),
        }
    return out


def micro(full: Path, work: Path, a) -> dict:
    """ISTFT numpy vs graph, and Conv int8 vs float in the Decoder/Vocos, at ChatTTS dimensions."""
    import numpy as np
    import onnxruntime as ort

    from toolkit.export.quantize import int8_dynamic
    from toolkit.export.vocos import build_istft_graph
    from toolkit.runtime.dsp import istft

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = a.threads

    def timeit(fn, n=5):
        fn()
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return round(min(ts) * 1000, 2)

    res = {}
    F = 2 * 470 + 1  # 10 s of audio
    rng = np.random.default_rng(0)
    real, imag = rng.standard_normal((2, 1, 513, F)).astype(np.float32)
    g = work / "istft.onnx"
    build_istft_graph(1024, 256, g)
    sess = ort.InferenceSession(str(g), opts, providers=["CPUExecutionProvider"])
    a_np = istft(real[0], imag[0], 1024, 256)
    a_g = sess.run(None, {"real": real, "imag": imag})[0][0]
    res["istft_10s_ms"] = {
        "numpy": timeit(lambda: istft(real[0], imag[0], 1024, 256)),
        "onnx_graph": timeit(lambda: sess.run(None, {"real": real, "imag": imag})),
        "max_abs_diff": float(np.abs(a_np - a_g).max()),
    }
    fp32 = work / "chattts_dims-fp32"
    conv = {}
    for g_name, feed in (
        ("decoder", {"hidden": rng.standard_normal((1, 470, 768)).astype(np.float32)}),
        ("vocos", {"mel": rng.standard_normal((1, 100, 940)).astype(np.float32)}),
    ):
        src = fp32 / f"{g_name}.onnx"
        row = {}
        for label, ops in (("fp32", None), ("int8_matmul", ("MatMul",)), ("int8_matmul_conv", ("MatMul", "Conv"))):
            path = src
            if ops:
                path = work / f"{g_name}-{label}.onnx"
                int8_dynamic(src, path, ops)
            s = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
            row[label + "_ms"] = timeit(lambda: s.run(None, feed), 3)
        conv[g_name + "_10s"] = row
    res["conv_int8"] = conv
    return res


def chattts(a, work: Path) -> dict:
    """The `chattts` package's GPT for the same steps at batch 1 on this CPU (toolkit.bench runs it)."""
    from toolkit.bench import STEPS_PER_S, run_chattts

    if not REFENV.is_file():
        return {"skipped": f"no reference venv at {REFENV} (tests/fixtures/make_refenv.sh makes one)"}
    r = run_chattts(str(REFENV), a.steps, 1, "cpu", timeout=a.chattts_timeout, threads=a.threads, workdir=work)
    if "steps_per_s" not in r:
        return r
    return {
        "steps": r["steps"],
        "gpt_s": round(r["gpt_s"], 3),
        "gpt_steps_per_s": round(r["steps_per_s"], 2),
        "rtf_gpt_only": round(r["gpt_s"] / (r["steps"] / STEPS_PER_S), 3),
        "threads": r["threads"],
        "peak_rss_mib": round(r["peak_rss_mib"], 1),
    }


def hardware() -> dict:
    import onnxruntime as ort

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }


def markdown(res: dict) -> str:
    L = [
        f"# Edge benchmark (ONNX Runtime, CPU, {res['args']['threads']} threads)",
        "",
        f"Command: `{res['command']}`  ",
        f"Hardware: {res['hardware']['cpu']}, {res['hardware']['cores']} cores, "
        f"{res['hardware']['mem_gib']} GiB; onnxruntime {res['hardware']['onnxruntime']}; {res['date']}; "
        f"load average {res['hardware'].get('loadavg_start')} at start, {res['hardware'].get('loadavg_end')} at end "
        "(other jobs shared the 2 cores)",
        "",
        "Reproduce from scratch: `.venv/bin/python benchmarks/edge_bench.py --threads 2` (about 25 min here). "
        "`--reuse` keeps exports and per-folder timings in `--work`, and a skipped stage keeps the previous "
        "file's numbers (marked `from_run` in the JSON).",
        "",
        "RTF = synthesis time / audio duration (lower is faster; < 1 is faster than real time). TTFA = time to "
        "first audio when streaming. Peak RSS of a torch-free process that loads the folder and synthesizes. "
        "Timings are the median run of `--repeats` (the machine is noisy; streaming is timed once).",
        "",
    ]
    for model, rows in res["models"].items():
        about = {
            "voice": f"the shipped voice (model.safetensors sha256 {res.get('voice_model_sha256', '?')[:12]}...), "
            "natural EOS, median of the repeats",
            "chattts_dims": f"ChatTTS dimensions, random weights, a fixed {res['args']['steps']} GPT steps "
            f"({res['args']['steps'] / 46.875:.2f} s of audio)",
        }.get(model, model)
        L += [
            f"## {model}: {about}",
            "",
            "| precision | ONNX MiB | gpt / decoder / vocos MiB | export s | load s | GPT steps/s | "
            "RTF | stream TTFA s | stream RTF | peak RSS MiB |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for prec, r in rows.items():
            s, b = r["sizes"], r["bench"]
            if "error" in b:
                L.append(f"| {prec} | {s['total_onnx'] / 2**20:.1f} | | {r['export_s']} | error: {b['error'][-80:]} |")
                continue
            L.append(
                f"| {prec} | {s['total_onnx'] / 2**20:.1f} | {s['gpt.onnx'] / 2**20:.1f} / "
                f"{s['decoder.onnx'] / 2**20:.1f} / {s['vocos.onnx'] / 2**20:.1f} | {r['export_s']} | {b['load_s']} | "
                f"{b['gpt_steps_per_s']} | {b['rtf']} | {b['stream_ttfa_s']} |"
                f" {b['stream_rtf']} | {b['peak_rss_mib']} |"
            )
        L.append("")
    if res.get("quality"):
        q = res["quality"]
        L += [
            "## Quality of the shipped voice against torch FP32",
            "",
            f"Text: \"{TEXT}\", seed {res['args']['seed']}. MCD: SPTK mel-cepstrum (evaluation.metrics defaults); "
            f"torch FP32's own seed-to-seed DTW-MCD is {q['torch_fp32']['mcd_dtw_db_seed_spread']} dB. "
            "Stage MCD = Decoder+Vocos on identical GPT states, sample aligned.",
            "",
            "| variant | DNSMOS ovrl | sig | bak | DTW-MCD vs torch fp32 dB | stage MCD dB | duration ratio |",
            "|---|---|---|---|---|---|---|",
        ]
        for k, v in q.items():
            if not isinstance(v, dict):  # from_run
                continue
            d = v["dnsmos"]
            L.append(
                f"| {k} | {d['ovrl']:.2f} | {d['sig']:.2f} | {d['bak']:.2f} |"
                f" {v.get('mcd_dtw_db_vs_torch_fp32', '-')} | "
                f"{v.get('stage_mcd_db_decoder_vocos', '-')} | {v.get('duration_ratio', 1.0)} |"
            )
        L.append("")
    if res.get("micro"):
        m = res["micro"]
        L += [
            "## Design measurements (ChatTTS dimensions, 10 s of audio)",
            "",
            f"ISTFT: numpy {m['istft_10s_ms']['numpy']} ms vs in-graph (MatMul + ConvTranspose1d) "
            f"{m['istft_10s_ms']['onnx_graph']} ms (max diff {m['istft_10s_ms']['max_abs_diff']:.1e}).",
            "",
            "| graph | fp32 ms | int8 MatMul ms | int8 MatMul+Conv ms |",
            "|---|---|---|---|",
        ]
        for g, r in m["conv_int8"].items():  # noqa: B007
            L.append(f"| {g} | {r['fp32_ms']} | {r['int8_matmul_ms']} | {r['int8_matmul_conv_ms']} |")
        L.append("")
    if res.get("chattts"):
        c = res["chattts"]
        L += [
            "## The `chattts` 0.2.5 package on the same CPU (GPT only, random weights, ChatTTS dimensions)",
            "",
            f"```\n{json.dumps(c)}\n```",
            "",
        ]
        if "gpt_steps_per_s" in c:
            for prec, r in res["models"].get("chattts_dims", {}).items():
                b = r["bench"]
                if "gpt_steps_per_s" in b:
                    L.append(
                        f"- ttsq ONNX {prec}: GPT {b['gpt_steps_per_s'] / c['gpt_steps_per_s']:.2f}x the "
                        "package's steps/s"
                    )
            L.append("")
    return "\n".join(L)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--child")
    p.add_argument("--fixed", action="store_true")
    p.add_argument("--speaker")
    p.add_argument("--save-wav")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=94, help="GPT steps for the random model (94 = 2 s of audio)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--precisions", default="fp32,fp16,int8,int4")
    p.add_argument("--models", default="voice,chattts_dims")
    p.add_argument("--voice", default=str(ROOT / "toolkit" / "assets" / "voice"), help="the voice model folder")
    p.add_argument("--work", default=None, help="keep exports here (reused with --reuse)")
    p.add_argument("--reuse", action="store_true")
    p.add_argument(
        "--skip",
        default="",
        help="comma list of: quality, micro, chattts (a skipped stage keeps the "
        "numbers of the previous --out file, marked from_run)",
    )
    p.add_argument("--chattts-timeout", type=int, default=900)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "edge_cpu"))
    a = p.parse_args()
    if a.child:
        return child(a)
    work = Path(a.work or tempfile.mkdtemp(prefix="edge-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, a.skip.split(",")))
    res = {
        "command": "python benchmarks/edge_bench.py " + " ".join(sys.argv[1:]),
        "hardware": hardware(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "args": vars(a),
        "models": {},
    }
    sources = {}
    if "voice" in a.models:  # a snapshot, so exports and the torch reference read the same weights
        voice = snapshot_voice(Path(a.voice), work / "voice_src")
        if voice is None:
            print("the shipped voice is incomplete right now (being replaced?): skipped", file=sys.stderr)
            a.models = ",".join(m for m in a.models.split(",") if m != "voice")
        else:
            sources["voice"] = voice
            res["voice_model_sha256"] = json.loads((voice / "manifest.json").read_text())["files"]["model.safetensors"][
                "sha256"
            ]
    if "chattts_dims" in a.models:
        sources["chattts_dims"] = build_full(work)
    wavs: dict[str, Path] = {}
    for model in a.models.split(","):
        res["models"][model] = {}
        for prec in a.precisions.split(","):
            folder = work / f"{model}-{prec}"
            print(f"[{model} {prec}] export ...", file=sys.stderr, flush=True)
            fresh = not (a.reuse and (folder / "onnx_manifest.json").is_file())
            t = export(sources[model], prec, folder, a.reuse)
            wav = work / f"{model}-{prec}.npy" if model == "voice" else None
            cache = work / f"{model}-{prec}.bench.json"
            if not fresh and cache.is_file():
                bench = json.loads(cache.read_text())
            else:
                bench = run_child(folder, a, fixed=model != "voice", speaker=None, save_wav=wav)
                if "error" not in bench:
                    cache.write_text(json.dumps(bench))
            if wav is not None:
                wavs[prec] = wav
            res["models"][model][prec] = {"export_s": t, "sizes": sizes(folder), "bench": bench}
            print(f"[{model} {prec}] {json.dumps(res['models'][model][prec])}", file=sys.stderr, flush=True)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    prev = json.loads(out.with_suffix(".json").read_text()) if out.with_suffix(".json").is_file() else {}

    def save():
        res["hardware"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        out.with_suffix(".json").write_text(json.dumps(res, indent=2) + "\n")
        out.with_suffix(".md").write_text(markdown(res) + "\n")

    save()
    stages = [
        (
            "quality",
            "voice" in sources,
            lambda: quality(sources["voice"], {p_: work / f"voice-{p_}" for p_ in a.precisions.split(",")}, a, wavs),
        ),
        (
            "micro",
            "chattts_dims" in sources and "fp32" in a.precisions,
            lambda: micro(sources["chattts_dims"], work, a),
        ),
        ("chattts", True, lambda: chattts(a, work)),
    ]
    for name, wanted, fn in stages:
        if name in skip or not wanted:
            if name in prev:  # keep the last run's numbers for a stage skipped this time
                res[name] = {"from_run": prev.get("date"), **prev[name]} if isinstance(prev[name], dict) else prev[name]
            continue
        print(f"[{name}] ...", file=sys.stderr, flush=True)
        try:
            res[name] = fn()
        except Exception as e:  # one failing stage keeps the others' numbers
            res[name + "_error"] = f"{type(e).__name__}: {e}"
        save()
    save()
    print(markdown(res))


if __name__ == "__main__":
    main()

"""The `ttsq` command line: a thin layer over the library API."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from pathlib import Path

from .progress import progress_bar

KERNELS = {"auto": None, "on": True, "off": False}  # --kernels -> Engine(kernels=...)


def add_kernels_option(s) -> None:
    s.add_argument(
        "--kernels",
        choices=tuple(KERNELS),
        default="auto",
        help="the Triton decode step at batch <= 2: auto (on CUDA where it runs), on, or off",
    )


def read_text(arg: str) -> str:
    """The text argument, or standard input for "-": read as UTF-8 (undecodable bytes become U+FFFD, which the text
    check counts), at most MAX_TEXT_CHARS characters' worth, so a huge or endless input fails fast."""
    from .text import MAX_TEXT_CHARS, check_length

    if arg != "-":
        return arg
    data = sys.stdin.buffer.read(4 * MAX_TEXT_CHARS + 1)  # UTF-8 takes at most 4 bytes a character
    text = data.decode("utf-8", errors="replace")
    check_length(text, what="standard input")
    return text


def _refine_args(a) -> dict:
    """synth's --refine options -> synthesize()'s keyword arguments (the torch and the edge runtime take the same)."""
    from .refine import refine_params

    return {
        "refine": a.refine,
        "refine_prompt": a.refine_prompt,
        "refine_params": refine_params(max_new_tokens=a.refine_max_steps),
    }


def cmd_refine(a) -> int:
    text = sys.stdin.read() if a.text == "-" else a.text
    from .refine import refine_params

    params = refine_params(temperature=a.temperature, top_p=a.top_p, top_k=a.top_k, max_new_tokens=a.max_steps)
    kwargs = dict(
        prompt=a.refine_prompt, seed=a.seed, params=params, batch_size=a.batch_size, control_tokens=a.control_tokens
    )
    if a.model and (Path(a.model) / "onnx_manifest.json").is_file():
        from .runtime import EdgeSynthesizer

        print(EdgeSynthesizer(a.model, device=a.device).refine(text, **kwargs)[0])
        return 0
    from . import Synthesizer

    print(Synthesizer(a.model, a.device, a.precision).refine(text, **kwargs)[0])
    return 0


def cmd_synth(a) -> int:
    from .audio import check_wav_path, wav_writer
    from .plan import synthesize_to
    from .speakers import with_transcript
    from .text import normalize

    text = read_text(a.text)
    normalize(text, a.control_tokens)  # a binary or empty input is refused before the model loads
    out = check_wav_path(a.output, force=a.force)  # before the model loads and the text is spoken
    speaker = with_transcript(a.speaker, a.speaker_text)  # a bad speaker fails before the model loads
    params = dict(temperature=a.temperature, top_p=a.top_p, top_k=a.top_k, max_new_tokens=a.max_steps)
    if a.model and (Path(a.model) / "onnx_manifest.json").is_file():  # a `ttsq export` folder: torch-free runtime
        from .runtime import EdgeSynthesizer, SamplingParams

        if a.precision is not None:
            raise ValueError(f"{a.model} is an exported ONNX folder at a fixed precision; drop --precision")
        synth = EdgeSynthesizer(a.model, device=a.device)
        if synth.provider_note:
            print(synth.provider_note, file=sys.stderr)
        note = f", ONNX {synth.precision}"
    else:
        from . import SamplingParams, Synthesizer

        synth = Synthesizer(a.model, a.device, a.precision, compile=a.compile, kernels=KERNELS[a.kernels])
        note = ""
    with wav_writer(out, synth.sample_rate, force=a.force) as write:  # the audio streams to the file
        r = synthesize_to(
            synth,
            text,
            write,
            speaker=speaker,
            seed=a.seed,
            params=SamplingParams(**params),
            batch_size=a.batch_size,
            control_tokens=a.control_tokens,
            progress=progress_bar("characters"),
            **_refine_args(a),
        )
    if a.refine:
        print(f"refined: {' '.join(r.texts)}")
    duration = r.samples / synth.sample_rate
    total = r.timings.get("total", 0.0)
    print(
        f"wrote {out}: {duration:.2f} s at {synth.sample_rate} Hz, {r.steps} steps, "
        f"{total:.2f} s to synthesize (RTF {total / max(duration, 1e-9):.3f}{note})"
        + (" [hit max steps]" if r.hit_limit else "")
    )
    return 0


def cmd_speaker_sample(a) -> int:
    import secrets

    import numpy as np
    import torch

    from .checkpoint import ASSETS
    from .models.speaker import chattts_speaker
    from .speakers import encode_vector

    seed = a.seed if a.seed is not None else secrets.randbelow(2**32)
    if a.model:
        from .synthesizer import load_model

        stat = load_model(a.model).spk_stat
    else:  # ChatTTS's own spk_stat: the string is the one `chat.sample_random_speaker()` gives after manual_seed
        stat = torch.from_numpy(np.load(ASSETS / "chattts_spk_stat.npy")).view(2, -1)
    print(encode_vector(chattts_speaker(seed, stat).numpy()))
    if a.seed is None:
        print(f"(chattts-seed:{seed})", file=sys.stderr)
    return 0


def cmd_speaker_from_audio(a) -> int:
    from .fileio import OutputExistsError
    from .sample_speaker import FitSettings, speaker_from_file, speaker_string
    from .speakers import SampleSpeaker

    if a.out and Path(a.out).exists() and not a.force:
        raise OutputExistsError(f"{a.out} already exists; pass --force to overwrite it, or choose another path")
    spk = speaker_from_file(
        a.wav,
        a.text,
        a.model,
        device=a.device,
        encoder=a.encoder,
        settings=FitSettings(steps=a.steps),
        notice=lambda m: print(m, file=sys.stderr, flush=True),
    )
    line = speaker_string(spk)
    if isinstance(spk, SampleSpeaker):
        hint = (
            f"a sample-audio speaker ({spk.codes.shape[1]} code frames): synthesize with --speaker STRING "
            "--speaker-text TRANSCRIPT"
        )
    else:
        hint = f"a speaker vector ({len(spk)} values) fitted to the sample: synthesize with --speaker STRING"
    if a.out:
        from .fileio import atomic_write_bytes

        atomic_write_bytes(Path(a.out), (line + "\n").encode())
        hint += f"; written to {a.out}"
    else:
        print(line)
    print(hint, file=sys.stderr)
    return 0


def cmd_speaker_decode(a) -> int:
    from .speakers import SampleSpeaker, parse_speaker

    spec = parse_speaker(a.speaker)
    if isinstance(spec, SampleSpeaker):
        print(json.dumps({"kind": "sample-audio", "shape": list(spec.codes.shape), "codes": spec.codes.tolist()}))
    elif hasattr(spec, "dtype"):
        print(
            json.dumps(
                {"kind": "vector", "dim": len(spec), "dtype": str(spec.dtype), "vector": [float(x) for x in spec]}
            )
        )
    else:
        raise ValueError(f"{a.speaker!r} is a seed or a voice name, not a speaker string or file")
    return 0


def cmd_export(a) -> int:
    from .export import export_onnx

    out = export_onnx(a.model, a.precision, a.out, calib_set=a.calib, force=a.force, progress=progress_bar("export"))
    files = json.loads((out / "onnx_manifest.json").read_text())["files"]
    size = sum(f["bytes"] for f in files.values())
    print(
        f"wrote {out} ({a.precision}, {size / 2**20:.1f} MiB): "
        + ", ".join(f"{k} {v['bytes'] / 2**20:.1f} MiB" for k, v in files.items() if k.endswith(".onnx"))
    )
    return 0


def cmd_info(a) -> int:
    from . import checkpoint
    from .synthesizer import load_model

    root = Path(a.path)
    layout = checkpoint.detect_layout(root)
    model = load_model(root)
    manifest = checkpoint.read_manifest(root) if layout == "ttsq" else {}
    size = sum(f.lstat().st_size for f in root.rglob("*") if f.is_file() and not f.is_symlink())
    counts = model.parameter_counts()
    info = {
        "path": str(root),
        "layout": layout,
        "precision": manifest.get("precision", "fp32"),
        "size_bytes": size,
        "parameters": counts,
        "parameters_total": sum(counts.values()),
        "voices": sorted(model.voices),
        "default_voice": model.default_voice,
        "frontend": manifest.get("frontend"),
        "source": manifest.get("source"),
        "config": model.cfg.to_dict(),
    }
    if a.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"{root}  ({layout}, {info['precision']}, {size / 2**20:.1f} MiB on disk)")
    if info["source"]:
        print(f"  quantized from: {info['source']}")
    for k, v in counts.items():
        print(f"  {k:8s} {v / 1e6:8.2f} M parameters")
    print(f"  total    {info['parameters_total'] / 1e6:8.2f} M")
    g = model.cfg.gpt
    print(
        f"  gpt: hidden {g.hidden}, {g.layers} layers, {g.heads} heads, ffn {g.intermediate}, "
        f"text vocab {g.num_text_tokens}, {g.num_vq} x {g.num_audio_tokens} codes"
    )
    voices = f"{', '.join(info['voices'])} (default {info['default_voice']})" if info["voices"] else None
    print(f"  voices: {voices or '(random speakers from seeds)'}")
    if manifest.get("layers"):
        from collections import Counter

        print("  layers: " + ", ".join(f"{n} {p}" for p, n in Counter(manifest["layers"].values()).items()))
    return 0


def cmd_quantize(a) -> int:
    from .quantize_job import calibration_texts, describe_estimate, plan_stages, quantize_to_artifact

    limit = a.limit if a.limit is not None else calibration_texts(a.device)
    stages = plan_stages(a.precision, a.calib is not None, a.keep_sensitive, a.target_error, not a.no_awq)
    if a.calib is not None:  # the cost up front: it scales with texts x steps
        print(
            f"quantize {a.precision}: calibrating on {limit} texts of {a.calib} x up to {a.max_steps} GPT steps "
            f"(--limit, --max-steps); stages: {', '.join(stages)}. Each stage shows its own progress and ETA.",
            file=sys.stderr,
            flush=True,
        )
    out, report = quantize_to_artifact(
        a.model,
        a.precision,
        a.out,
        calib_set=a.calib,
        device=a.device,
        limit=limit,
        max_steps=a.max_steps,
        awq=not a.no_awq,
        keep_sensitive=a.keep_sensitive,
        target_error=a.target_error,
        force=a.force,
        progress=progress_bar("quantize"),
        float_dtype=a.float_dtype,
        estimate=lambda est: print(describe_estimate(est, a.device), file=sys.stderr, flush=True),
    )
    plan = report.plan
    print(f"wrote {out}")
    print(
        "| precision | quantized layers | kept float (sensitive) | skipped (shape) | size before | size after | "
        + " | ".join(f"err {s}" for s in report.errors)
        + " |"
    )
    print("|---" * (6 + len(report.errors)) + "|")
    print(
        f"| {a.precision} | {len(plan.quantize)} | {len(plan.keep)} | {len(plan.skipped)} | "
        f"{report.bytes_before / 2**20:.2f} MiB | {report.bytes_after / 2**20:.2f} MiB | "
        + " | ".join(f"{v:.2e}" for v in report.errors.values())
        + " |"
    )
    if not report.errors:
        print("(no --calib set: errors against FP32 were not measured)")
    return 0


def cmd_evaluate(a) -> int:
    from evaluation.cli import run_from_args

    return run_from_args(a)


def cmd_bench(a) -> int:
    from .bench import BenchConfig, markdown, run_bench
    from .fileio import atomic_write_bytes

    out = Path(a.out)
    if out.with_suffix(".json").exists() and not a.force:
        raise FileExistsError(
            f"{out.with_suffix('.json')} already exists; pass --force to replace it, or another --out"
        )
    cfg = BenchConfig(
        [p for p in a.precisions.split(",") if p],
        [int(b) for b in a.batches.split(",")],
        a.steps,
        a.device,
        a.dims,
        a.repeats,
        chattts_python=a.chattts_python,
        compile=a.compile,
        kernels=KERNELS[a.kernels],
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "ttsq bench " + " ".join(sys.argv[2:])

    def write(report: dict) -> None:  # after every part, so a run that is cut short keeps what it measured
        report["command"] = command
        atomic_write_bytes(out.with_suffix(".json"), (json.dumps(report, indent=1) + "\n").encode())
        atomic_write_bytes(out.with_suffix(".md"), markdown(report).encode())

    report = run_bench(cfg, progress=lambda m: print(m, file=sys.stderr, flush=True), on_update=write)
    print(markdown(report))
    return 0


def cmd_serve(a) -> int:
    try:
        from .server.main import ServeOptions, serve
    except ImportError as e:
        raise ImportError(f"ttsq serve needs the serve extra ({e}): pip install 'ttsq[serve]'") from None
    return serve(
        ServeOptions(a.model, a.precision, a.device, a.host, a.port, a.slots, a.max_queue, a.max_input_chars, a.compile)
    )


def cmd_gui(a) -> int:
    from gui.app import run

    return run(a.model, a.device)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ttsq", description="Fast, quantized, measured ChatTTS-architecture TTS")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)

    def refine_prompt_args(s):
        s.add_argument(
            "--refine-prompt",
            default="",
            metavar="P",
            help="steers the refine, as ChatTTS's RefineTextParams.prompt, e.g. [oral_2][laugh_0][break_6]",
        )

    def model_args(s):
        s.add_argument(
            "--model",
            help="ttsq model folder, quantized artifact or official ChatTTS folder (default: the shipped voice)",
        )
        s.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if available)")

    s = sub.add_parser("synth", help="text to a 24 kHz WAV")
    s.add_argument("text", help="the text, or - to read standard input")
    s.add_argument("-o", "--output", required=True, help="WAV file to write")
    model_args(s)
    s.add_argument("--precision", default=None, help="apply a recipe at load (fp32, fp16, bf16, int8, int4, ...)")
    s.add_argument("--seed", type=int, default=0, help="sampling seed")
    s.add_argument(
        "--speaker",
        default=None,
        help="a voice name of the model, an integer seed, chattts-seed:N (ChatTTS's random speaker N), a "
        "ChatTTS speaker string, or a .pt/.npy/.txt file holding a vector or a string",
    )
    s.add_argument(
        "--speaker-text",
        default=None,
        help="the transcript of a sample-audio speaker (from `ttsq speaker from-audio` on a ChatTTS model)",
    )
    s.add_argument("--temperature", type=float, default=0.3)
    s.add_argument("--top-p", type=float, default=0.7)
    s.add_argument("--top-k", type=int, default=20)
    s.add_argument("--max-steps", type=int, default=2048, help="GPT steps per sentence at most")
    s.add_argument("--batch-size", type=int, default=8, help="sentences per batch")
    s.add_argument(
        "--control-tokens",
        action="store_true",
        help="read [laugh], [uv_break], [speed_N], ... in the text as ChatTTS controls (default: as text)",
    )
    s.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the decode step: faster per step on a GPU, after a compile of seconds "
        "for each batch size and 256-step cache bucket it meets (worth it for long or many texts)",
    )
    add_kernels_option(s)
    s.add_argument("--force", action="store_true", help="overwrite an existing output file")
    s.add_argument(
        "--refine",
        action="store_true",
        help="first rewrite the text with the GPT's text head, as ChatTTS's infer() does by default "
        "(adds [uv_break], [laugh], ...; needs a ChatTTS checkpoint)",
    )
    refine_prompt_args(s)
    s.add_argument("--refine-max-steps", type=int, default=384, help="text tokens per refined sentence at most")
    s.set_defaults(func=cmd_synth)

    s = sub.add_parser("speaker", help="ChatTTS speaker strings: sample one, make one from audio, decode one")
    ssub = s.add_subparsers(dest="speaker_command", required=True)
    t = ssub.add_parser("sample", help="print a random speaker string, as ChatTTS's sample_random_speaker()")
    t.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the torch.manual_seed ChatTTS would be given (default: a random one, printed on stderr)",
    )
    t.add_argument("--model", help="draw from this model's speaker statistics (default: ChatTTS's, 768 values)")
    t.set_defaults(func=cmd_speaker_sample)
    t = ssub.add_parser("from-audio", help="a speaker from a recording and its transcript")
    t.add_argument("wav", help="the recording (WAV; other sample rates are resampled to the model's)")
    t.add_argument("--text", required=True, help="what the recording says")
    model_args(t)
    t.add_argument("--encoder", help="the DVAE encoder's folder or file (default: the model's own)")
    t.add_argument(
        "--steps",
        type=int,
        default=30,
        help="optimisation steps of the fitted vector, from each of the model's voices (ttsq voices)",
    )
    t.add_argument("-o", "--out", help="write the string to this file instead of standard output")
    t.add_argument("--force", action="store_true", help="overwrite an existing --out file")
    t.set_defaults(func=cmd_speaker_from_audio)
    t = ssub.add_parser("decode", help="print a speaker string's (or file's) vector or codes as JSON")
    t.add_argument("speaker")
    t.set_defaults(func=cmd_speaker_decode)

    s = sub.add_parser(
        "refine", help="print the text as ChatTTS's refine_text rewrites it (needs a ChatTTS checkpoint's text head)"
    )
    s.add_argument("text", help="the text, or - to read standard input")
    model_args(s)
    s.add_argument("--precision", default=None, help="apply a recipe at load (fp32, fp16, bf16, int8, int4, ...)")
    refine_prompt_args(s)
    s.add_argument("--seed", type=int, default=0, help="sampling seed")
    s.add_argument("--temperature", type=float, default=0.7)
    s.add_argument("--top-p", type=float, default=0.7)
    s.add_argument("--top-k", type=int, default=20)
    s.add_argument("--max-steps", type=int, default=384, help="text tokens per sentence at most")
    s.add_argument("--batch-size", type=int, default=8, help="sentences per batch")
    s.add_argument(
        "--control-tokens",
        action="store_true",
        help="read [laugh], [uv_break], ... in the text as ChatTTS controls (default: as text)",
    )
    s.set_defaults(func=cmd_refine)

    s = sub.add_parser("info", help="config, parameter counts, precision and size of a model")
    s.add_argument("path")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_info)

    s = sub.add_parser("quantize", help="quantize with a calibration set and save a reloadable artifact")
    model_args(s)
    s.add_argument("--precision", required=True)
    s.add_argument("--calib", help="calibration set (JSONL); without it: plain round-to-nearest")
    s.add_argument("--out", required=True, help="artifact folder to write (atomically)")
    s.add_argument(
        "--limit",
        type=int,
        default=None,
        help="calibration texts to use (default: 8 on the CPU, 32 on a GPU; the time grows with it)",
    )
    s.add_argument("--max-steps", type=int, default=96, help="GPT steps generated per calibration text")
    s.add_argument("--keep-sensitive", type=int, default=0, help="keep the N most sensitive layers in float")
    s.add_argument(
        "--target-error",
        type=float,
        default=None,
        help="keep layers in float until the summed per-layer relative error is below this",
    )
    s.add_argument("--no-awq", action="store_true", help="skip activation-aware scaling")
    s.add_argument(
        "--float-dtype",
        choices=("fp32", "bf16", "fp16"),
        default=None,
        help="what the non-quantized parts and activations run in (default: the recipe's: fp32, or bf16 "
        "for int4/fp8 on CUDA)",
    )
    s.add_argument("--force", action="store_true", help="replace an existing --out folder")
    s.set_defaults(func=cmd_quantize, device="cpu")

    s = sub.add_parser("export", help="export to ONNX (fp32, fp16, int8, int4) for the torch-free runtime")
    s.add_argument("--model", help="ttsq model folder or official ChatTTS folder (default: the shipped voice)")
    s.add_argument(
        "--precision",
        required=True,
        help="fp32, fp16, int8, int4 (int4-hqq, int4-b128, int4-hqq-b128: algorithm and block size)",
    )
    s.add_argument("--out", required=True, help="folder to write (atomically)")
    s.add_argument("--calib", help="calibration set (JSONL): int8 Decoder/Vocos become static QDQ")
    s.add_argument("--force", action="store_true", help="replace an existing --out folder")
    s.set_defaults(func=cmd_export)

    s = sub.add_parser("bench", help="ttsq and the chattts package side by side: steps/s, RTF, first audio, memory")
    s.add_argument(
        "--precisions",
        default="fp32,bf16,fp16,int8,int8@bf16,int4",
        help="recipes; NAME@DTYPE runs a quantized recipe's float parts in DTYPE (int8@bf16)",
    )
    s.add_argument("--batches", default="1,8,64")
    s.add_argument("--steps", type=int, default=470, help="GPT steps per sequence (470 = 10 s of audio)")
    s.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda if available)")
    s.add_argument("--dims", choices=("chattts", "tiny"), default="chattts", help="random weights at these dimensions")
    s.add_argument("--repeats", type=int, default=3, help="timed runs per figure (medians)")
    s.add_argument(
        "--chattts-python",
        help="a Python that can `import ChatTTS` (e.g. a venv made by "
        "tests/fixtures/make_refenv.sh); without it the chattts side is skipped",
    )
    s.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch.compile ttsq's decode step under its CUDA graphs (the fast GPU path; compile time is "
        "excluded from the timings); default: on CUDA only",
    )
    add_kernels_option(s)
    s.add_argument("--out", default="benchmarks/results/current/bench", help="writes OUT.json and OUT.md")
    s.add_argument("--force", action="store_true", help="replace existing results")
    s.set_defaults(func=cmd_bench)

    s = sub.add_parser("serve", help="an OpenAI-compatible streaming speech server (POST /v1/audio/speech)")
    model_args(s)
    s.add_argument("--precision", default=None, help="apply a recipe at load (fp32, fp16, bf16, int8, int4, ...)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--slots", type=int, default=8, help="requests decoded together at most (continuous batching)")
    s.add_argument(
        "--max-queue", type=int, default=32, help="requests waiting for a slot at most; beyond, 429 with Retry-After"
    )
    s.add_argument("--max-input-chars", type=int, default=4096, help="longer inputs get 413")
    s.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the scheduler's whole decode step, once per batch bucket (a warm-up of a minute or "
        "more), its attention bounded per cache bucket, renders replayed as CUDA graphs in batches every 64 "
        "steps, next sentences' prefills shared: faster per step and to first audio than graphs alone, at 1 and at "
        "64 streams as measured (benchmarks/README.md)",
    )
    s.set_defaults(func=cmd_serve)

    s = sub.add_parser("gui", help="desktop GUI: synthesize, listen, compare precisions (needs the gui extra)")
    s.add_argument("--model", default=None, help="model folder to open (default: the last one, or the shipped voice)")
    s.add_argument("--device", default=None, help="cpu or cuda[:N] (default: the last one)")
    s.set_defaults(func=cmd_gui)

    try:
        from evaluation.cli import add_evaluate_parser
        from evaluation.score import add_score_parser

        add_evaluate_parser(sub, model_args)
        add_score_parser(sub)
    except ImportError:
        pass
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TORCHAO_FORCE_SKIP_LOADING_SO_FILES", "1")
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)  # torchao registration chatter
    logging.getLogger("torchao").setLevel(logging.ERROR)
    args = build_parser().parse_args(argv)
    if not args.debug:
        warnings.filterwarnings("default")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("ttsq: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, RuntimeError, ImportError, ArithmeticError) as e:
        if args.debug:
            raise
        print(f"ttsq: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""Load test of `ttsq serve` on loopback: N concurrent streaming clients with random text lengths, against a
baseline in the same run (the same server, requests sent one at a time). Bounded in requests and in time.

The server runs in a subprocess of this script (its own interpreter, as `ttsq serve` would), on 127.0.0.1 only.
Reported: p50/p95 time to first audio (request sent to first body byte), per-stream RTF (request sent to last byte,
over the audio's duration), aggregate audio seconds per wall second, errors, server memory before and after. The
aggregate is given twice: over the whole phase (ramp and drain included: the last clients finish alone), and over
the time while every client was busy (from the start until the first client found no request left to send), which
is the rate at N concurrent streams.

    # CPU, the shipped voice
    python3 benchmarks/serve_load.py --device cpu --clients 4 --slots 4 --requests 16 --baseline-requests 4 \\
        --out benchmarks/results/current/serve_load_cpu.json
    # GPU, random weights at ChatTTS's dimensions (EOS barred: each sentence runs --steps-per-sentence steps)
    python3 benchmarks/serve_load.py --dims chattts --device cuda --precision bf16 --clients 64 --slots 64 ...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from provenance import commit  # noqa: E402  (benchmarks/, the script's own folder)

SAMPLE_RATE = 24000
WORDS = (
    "the quick brown fox jumps over a lazy dog near river bank bright sunny morning everyone went out play "
    "children ran across green fields while parents talked quietly under tall trees later that day wind "
    "picked up dark clouds rolled from west we walked home slowly birds sang station coffee tea good night "
    "sleep well old mill village market bread warm summer evening light"
).split()


def random_text(rng: random.Random, words: int) -> str:
    """`words` words in sentences of 6-14 words."""
    out, left = [], words
    while left > 0:
        n = min(left, rng.randint(6, 14))
        s = " ".join(rng.choice(WORDS) for _ in range(n))
        out.append(s[0].upper() + s[1:] + ".")
        left -= n
    return " ".join(out)


# --- the server side (a subprocess) -------------------------------------------------------------
def serve(a) -> None:
    import torch
    import uvicorn
    from serve_profile import mode_options  # benchmarks/, beside this script

    from toolkit import SamplingParams, Synthesizer
    from toolkit.scheduler import Scheduler
    from toolkit.server.app import ServerConfig, create_app, warm_up_http

    if a.dims == "chattts":
        from toolkit.bench import random_model
        from toolkit.synthesizer import load_model

        model = random_model("chattts", torch.device("cpu"))
        model.tokenizer = load_model().tokenizer  # the shipped voice's: its ids fit the random text embedding
        params = SamplingParams(min_new_tokens=a.steps_per_sentence, max_new_tokens=a.steps_per_sentence)
    else:
        model, params = a.model, SamplingParams()
    synth = Synthesizer(model, a.device, a.precision, compile=False)  # --compile: the scheduler's step
    cuda = torch.device(a.device).type == "cuda"
    options = mode_options(a.mode, cuda) if a.mode else {"compile": a.compile}  # no mode: `ttsq serve`'s scheduler
    scheduler = Scheduler(synth, slots=a.slots, max_queue=a.max_queue, params=params, max_chars=a.max_chars, **options)
    t0 = time.perf_counter()
    captured = scheduler.warm_up(a.warm_up_positions)
    print(f"warm-up: {captured} step graphs captured in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    jobs = [scheduler.submit("Warm up the server.", seed=i) for i in range(min(a.slots, 4))]
    for job in jobs:
        for _ in job.events():
            pass
    cfg = ServerConfig("bench", 1 << 20)
    warm_up_http(scheduler, cfg)  # as `ttsq serve` does
    app = create_app(scheduler, cfg)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=30)).run(sockets=[sock])


# --- the client side ---------------------------------------------------------------------------
async def one_request(client, text: str, seed: int) -> dict:
    t0 = time.perf_counter()
    row = {"chars": len(text), "status": None, "ttfa_s": None, "audio_s": 0.0, "total_s": None, "error": None}
    row["arrivals"] = arrivals = []  # (perf_counter time, bytes) of each body chunk
    try:
        async with client.stream(
            "POST", "/v1/audio/speech", json={"model": "bench", "input": text, "seed": seed, "response_format": "pcm"}
        ) as r:
            row["status"] = r.status_code
            if r.status_code != 200:
                row["error"] = f"HTTP {r.status_code}: {(await r.aread())[:200].decode(errors='replace')}"
                return row
            n = 0
            async for chunk in r.aiter_raw():
                now = time.perf_counter()
                if chunk:
                    if row["ttfa_s"] is None:
                        row["ttfa_s"] = now - t0
                    # playback started `play_s` after sending plays this chunk's first sample at play_s + n / rate:
                    # the least play_s at which no chunk arrives late (the player never stalls)
                    row["play_s"] = max(row.get("play_s", 0.0), now - t0 - n / 2 / SAMPLE_RATE)
                n += len(chunk)
                arrivals.append((now, len(chunk)))
        row["total_s"] = time.perf_counter() - t0
        row["audio_s"] = n / 2 / SAMPLE_RATE
    except Exception as e:  # noqa: BLE001 - counted, not fatal
        row["error"] = f"{type(e).__name__}: {e}"
    return row


def phase(
    url: str,
    clients: int,
    requests: int,
    time_limit: float,
    rng: random.Random,
    words: tuple[int, int],
    seed0: int,
    processes: int = 1,
) -> dict:
    """`clients` loops sending requests until `requests` were sent or `time_limit` passed (a request in flight at
    the limit is abandoned after a grace period and counted as an error). processes > 1 spreads the clients and the
    requests (round robin) over that many processes, so that one interpreter's event loop does not delay the
    streams it reads: their clocks are the same (perf_counter is the system's monotonic clock)."""
    texts = [random_text(rng, rng.randint(*words)) for _ in range(requests)]
    jobs = [(i, texts[i], seed0 + i) for i in range(requests)]
    if processes <= 1:
        t_start = time.perf_counter()
        rows, busy_until = asyncio.run(drive(url, clients, clients, jobs, t_start, time_limit))
    else:
        import multiprocessing

        t_start = time.perf_counter() + 5.0  # every process started and imported by then
        parts = [
            (url, clients // processes + (k < clients % processes), clients, jobs[k::processes], t_start, time_limit)
            for k in range(processes)
        ]
        with multiprocessing.get_context("spawn").Pool(processes) as pool:
            done = pool.map(drive_in_process, parts)
        rows = [row for part, _ in done for row in part]
        busy_until = min((b for _, b in done if b is not None), default=None)
    wall = time.perf_counter() - t_start
    return summarize(rows, wall, clients, t_start, busy_until)


def drive_in_process(args: tuple) -> tuple[list[dict], float | None]:
    return asyncio.run(drive(*args))


async def drive(
    url: str, clients: int, burst: int, jobs: list[tuple[int, str, int]], t_start: float, time_limit: float
) -> tuple[list[dict], float | None]:
    """`clients` loops sending jobs (index, text, seed) in order from t_start on -> each request's row, and when the
    first loop found nothing left to send (fewer streams after it). Requests with index < burst are the opening
    burst (sent at once); the rest join a running batch."""
    import httpx

    await asyncio.sleep(max(0.0, t_start - time.perf_counter()))
    rows: list[dict] = []
    next_j = 0
    busy_until = None
    deadline = t_start + time_limit
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(time_limit + 60), limits=limits) as client:

        async def worker():
            nonlocal next_j, busy_until
            while next_j < len(jobs) and time.perf_counter() < deadline:
                i, text, seed = jobs[next_j]
                next_j += 1
                sent = time.perf_counter() - t_start
                try:
                    row = await asyncio.wait_for(one_request(client, text, seed), deadline + 30 - time.perf_counter())
                except asyncio.TimeoutError:
                    row = {"chars": len(text), "status": None, "error": "past the time limit"}
                rows.append({**row, "i": i, "sent_s": round(sent, 4), "burst": i < burst})
            busy_until = busy_until or time.perf_counter()

        await asyncio.gather(*(worker() for _ in range(clients)))
    return rows, busy_until


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def summarize(rows: list[dict], wall: float, clients: int, t_start: float, busy_until: float) -> dict:
    ok = [r for r in rows if r.get("error") is None and r.get("audio_s")]
    busy = busy_until - t_start
    busy_bytes = sum(n for r in ok for t, n in r["arrivals"] if t <= busy_until)
    ttfa = [r["ttfa_s"] for r in ok]
    burst = [r["ttfa_s"] for r in ok if r["burst"]]
    joined = [r["ttfa_s"] for r in ok if not r["burst"]]
    play = [r["play_s"] for r in ok]
    rtf = [r["total_s"] / r["audio_s"] for r in ok]
    audio = sum(r["audio_s"] for r in ok)
    errors: dict[str, int] = {}
    for r in rows:
        if r.get("error"):
            key = r["error"].split(":")[0]
            errors[key] = errors.get(key, 0) + 1
    return {
        "clients": clients,
        "requests": len(rows),
        "ok": len(ok),
        "errors": errors,
        "wall_s": round(wall, 2),
        "ttfa_p50_s": pct(ttfa, 0.5),
        "ttfa_p95_s": pct(ttfa, 0.95),
        "ttfa_max_s": max(ttfa, default=None),
        "ttfa_burst_p50_s": pct(burst, 0.5),
        "ttfa_burst_p95_s": pct(burst, 0.95),
        "ttfa_joining_p50_s": pct(joined, 0.5),
        "ttfa_joining_p95_s": pct(joined, 0.95),
        "play_p50_s": pct(play, 0.5),
        "play_p95_s": pct(play, 0.95),
        "rtf_p50": pct(rtf, 0.5),
        "rtf_p95": pct(rtf, 0.95),
        "rtf_max": max(rtf, default=None),
        "streams_faster_than_real_time": sum(x < 1 for x in rtf),
        "audio_s": round(audio, 2),
        "audio_s_per_s": round(audio / wall, 3) if wall else None,
        "all_busy_s": round(busy, 2),
        "audio_s_per_s_all_busy": round(busy_bytes / 2 / SAMPLE_RATE / busy, 3) if busy > 0 else None,
        "mean_chars": round(statistics.mean(r["chars"] for r in rows), 1) if rows else None,
        "per_request": [
            {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items() if k != "arrivals"}
            for r in sorted(rows, key=lambda r: r["i"])
        ],
    }


def scrape(url: str) -> tuple[dict, dict[float, float]]:
    """Memory figures from the server's /metrics, and its time-to-first-audio histogram (bucket bound -> count)."""
    import httpx

    text = httpx.get(url + "/metrics", timeout=30).text
    keep = ("process_resident_memory_bytes", "ttsq_device_memory_allocated_bytes", "ttsq_device_memory_peak_bytes")
    out: dict = {}
    hists: dict[str, dict[float, float]] = {"ttfa": {}, "ttfb": {}}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in keep:
            out[name.replace("_bytes", "_mib")] = round(float(value) / 2**20, 1)
        for key, metric in (("ttfa", "ttsq_time_to_first_audio_seconds"), ("ttfb", "ttsq_time_to_first_byte_seconds")):
            if name.startswith(metric + '_bucket{le="'):
                hists[key][float(name.split('"')[1])] = float(value)
    return out, hists


def server_times(before: dict[str, dict[float, float]], after: dict[str, dict[float, float]]) -> dict:
    """The server's own times over a phase, from its histograms: to first audio (request received to first audio
    rendered) and to first byte (to its bytes handed to the HTTP server), without the client and the network."""
    return {key: histogram_quantiles(before[key], after[key]) for key in after}


def histogram_quantiles(before: dict[float, float], after: dict[float, float]) -> dict:
    """p50/p95 of a Prometheus histogram's observations between two scrapes, as the bucket bounds they fall under,
    and the share within 150 ms."""
    counts = sorted((b, after[b] - before.get(b, 0.0)) for b in after)  # cumulative, +inf last
    n = counts[-1][1] if counts else 0
    if not n:
        return {}

    def bound(q: float) -> float:
        return next(b for b, c in counts if c >= q * n)

    return {"p50_at_most_s": bound(0.5), "p95_at_most_s": bound(0.95), "within_150ms": round(dict(counts)[0.15] / n, 3)}


def hardware(device: str) -> dict:
    info = {
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "load_avg_at_start": os.getloadavg(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        if device.startswith("cuda") and torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def markdown(report: dict) -> str:
    a = report["args"]
    lines = [
        f"# serve_load: {a['dims']} dims, {a['device']}, {a['precision'] or 'fp32'}, {a['slots']} slots",
        "",
        f"command: `{report['command']}`  ",
        f"commit: {report['commit']}  ",
        f"hardware: {json.dumps(report['hardware'])}",
        "",
        "| phase | clients | ok/requests | errors | TTFA p50 | TTFA p95 | RTF p50 | RTF p95 | RTF max | "
        "faster than real time | audio s/s | audio s/s, all clients busy |",
        "|---" * 12 + "|",
    ]

    def f(x):
        return "-" if x is None else f"{x:.3f}"

    for name in ("baseline", "load"):
        p = report[name]
        lines.append(
            f"| {name} | {p['clients']} | {p['ok']}/{p['requests']} | {p['errors'] or 0} | "
            f"{f(p['ttfa_p50_s'])} s | {f(p['ttfa_p95_s'])} s | {f(p['rtf_p50'])} | {f(p['rtf_p95'])} | "
            f"{f(p['rtf_max'])} | {p['streams_faster_than_real_time']}/{p['ok']} | {p['audio_s_per_s']} | "
            f"{p['audio_s_per_s_all_busy']} (first {p['all_busy_s']} s) |"
        )
    lines += [
        "",
        "audio s/s: all the phase's audio over its wall time; all clients busy: the audio that arrived before the "
        "first client found no request left, over that time.  ",
        "TTFA is the client's (request sent to first audio byte). The server's own, from its histograms (ttfa: "
        "request received to first audio rendered; ttfb: to its bytes handed to the HTTP server): "
        f"baseline {report['baseline'].get('server')}, load {report['load'].get('server')}.",
        "",
        "| phase | TTFA p50 / p95, the opening burst (sent at once) | TTFA p50 / p95, joining a running batch | "
        "playback start p50 / p95 |",
        "|---|---|---|---|",
        *(
            f"| {name} | {f(report[name]['ttfa_burst_p50_s'])} / {f(report[name]['ttfa_burst_p95_s'])} s | "
            f"{f(report[name]['ttfa_joining_p50_s'])} / {f(report[name]['ttfa_joining_p95_s'])} s | "
            f"{f(report[name]['play_p50_s'])} / {f(report[name]['play_p95_s'])} s |"
            for name in ("baseline", "load")
        ),
        "",
        "Playback start: the least delay after sending at which a player could start and never stall on a chunk "
        "that arrives late (at least the TTFA).",
        "",
        f"server memory before: {report['memory_before']}  ",
        f"after: {report['memory_after']}",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model", default=None, help="model folder (default: the shipped voice); ignored with --dims chattts"
    )
    p.add_argument(
        "--dims",
        choices=("shipped", "chattts"),
        default="shipped",
        help="chattts: random weights at ChatTTS's dimensions (no download)",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default=None)
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the scheduler's whole step (ttsq serve --compile)",
    )
    p.add_argument(
        "--mode",
        default=None,
        help="the scheduler's step and options as serve_profile.py's modes, e.g. compiled+bounded+render-graphs "
        "(default: the scheduler `ttsq serve` runs, with --compile as its --compile)",
    )
    p.add_argument(
        "--warm-up-positions",
        type=int,
        default=None,
        help="capture (and compile) the step for cache lengths up to this before serving (default: the whole cache)",
    )
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--max-queue", type=int, default=256)
    p.add_argument("--max-chars", type=int, default=120, help="sentence length the server splits at")
    p.add_argument(
        "--steps-per-sentence",
        type=int,
        default=235,
        help="--dims chattts: GPT steps per sentence (EOS barred; 235 steps = 5 s of audio)",
    )
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--requests", type=int, default=16, help="requests of the concurrent phase at most")
    p.add_argument("--baseline-requests", type=int, default=4, help="requests of the one-at-a-time phase")
    p.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="spread the concurrent phase's clients over this many processes (one event loop reading every stream "
        "delays some of them; TTFA is the client's)",
    )
    p.add_argument("--time-limit", type=float, default=600, help="seconds per phase at most")
    p.add_argument("--words", type=int, nargs=2, default=(4, 30), metavar=("MIN", "MAX"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="writes OUT (JSON) and OUT with .md")
    p.add_argument("--serve-only", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve_only:
        serve(a)
        return 0
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [x for x in sys.argv[1:]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve-only", *argv], stdout=subprocess.PIPE, env=env, text=True
    )
    try:
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"the server did not start (exit {proc.wait()})")
        url = f"http://127.0.0.1:{int(line.split()[1])}"
        rng = random.Random(a.seed)
        before, hist0 = scrape(url)
        print("baseline (one at a time)...", file=sys.stderr, flush=True)
        baseline = phase(url, 1, a.baseline_requests, a.time_limit, rng, tuple(a.words), 10_000)
        _, hist1 = scrape(url)
        baseline["server"] = server_times(hist0, hist1)
        print(json.dumps(baseline), file=sys.stderr, flush=True)
        print(f"load ({a.clients} concurrent)...", file=sys.stderr, flush=True)
        load = phase(url, a.clients, a.requests, a.time_limit, rng, tuple(a.words), 20_000, a.client_processes)
        after, hist2 = scrape(url)
        load["server"] = server_times(hist1, hist2)
        print(json.dumps(load), file=sys.stderr, flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    report = {
        "command": "python3 benchmarks/serve_load.py " + " ".join(argv),
        "commit": commit(),
        "hardware": hardware(a.device),
        "args": {k: v for k, v in vars(a).items() if k != "serve_only"},
        "baseline": baseline,
        "load": load,
        "memory_before": before,
        "memory_after": after,
    }
    out.write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`ttsq serve`: the OpenAI schema and its errors, streaming equal to `ttsq synth`, cancel on disconnect, 429 under
overload, continuous batching, an injected out-of-memory error, graceful shutdown. Real uvicorn servers on loopback
ports, the shipped voice on the CPU. Orders of events are asserted, never durations (timeouts are generous)."""

from __future__ import annotations

import functools
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from toolkit.scheduler import Scheduler  # noqa: E402
from toolkit.server.app import ServerConfig, create_app  # noqa: E402
from toolkit.synthesizer import Synthesizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHORT = "Hello there, how are you today?"
# about 10 s of speech in three sentences: hundreds of steps after its first audio, whatever the machine's speed
LONG = (
    "The quick brown fox jumps over the lazy dog near the old river bank. It was a bright and sunny morning, "
    "and everyone went out to play. The children ran across the green fields."
)
TIMEOUT = httpx.Timeout(300.0)


def job_audio(job) -> np.ndarray:
    """A scheduler job's audio, its chunks joined (waits for its end)."""
    return np.concatenate([d for k, d in job.events() if k == "audio"])


def served_alone(synth: Synthesizer, texts: list[str], **options) -> list[np.ndarray]:
    """Each text's audio through a scheduler of one slot, seeded by its index."""
    alone = Scheduler(synth, slots=1, **options)
    audio = [job_audio(alone.submit(t, seed=i)) for i, t in enumerate(texts)]
    alone.close()
    return audio


class LiveServer:
    """The app on a real uvicorn in a thread, on a free loopback port."""

    def __init__(self, slots: int = 4, max_queue: int = 4, max_input_chars: int = 4096):
        synth = Synthesizer(device="cpu")  # its own model: the scheduler borrows the model's attention caches
        self.scheduler = Scheduler(synth, slots=slots, max_queue=max_queue)
        self.app = create_app(self.scheduler, ServerConfig("ttsq-voice", max_input_chars))
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 120
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.05)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.client = httpx.Client(base_url=self.url, timeout=TIMEOUT)

    def speech(self, **body) -> httpx.Response:
        return self.client.post("/v1/audio/speech", json={"model": "tts-1", **body})

    def wait_until(self, condition, what: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.02)

    def close(self) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(60)


@pytest.fixture(scope="module")
def server():
    s = LiveServer()
    yield s
    s.close()


@functools.lru_cache(maxsize=None)
def long_reference() -> np.ndarray:
    """LONG in the default voice, seed 0, as `ttsq synth --batch-size 1` makes it."""
    return Synthesizer(device="cpu").synthesize(LONG, seed=0, batch_size=1)[0].wav


def wav_samples(body: bytes) -> np.ndarray:
    x, sr = sf.read(io.BytesIO(body), dtype="int16")
    assert sr == 24000
    return x


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{") and line.split(" ")[0] == name:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize(
    "body, status, param, says",
    [
        (b"{not json", 400, None, "not valid JSON"),
        (b"[1, 2]", 400, None, "JSON object"),
        (json.dumps({"model": "tts-1", "voice": "m1"}).encode(), 400, "input", "Field required"),
        (json.dumps({"model": "tts-1", "input": 5}).encode(), 400, "input", "string"),
        (json.dumps({"model": "whisper-1", "input": "Hi."}).encode(), 400, "model", "not served"),
        (json.dumps({"model": "tts-1", "input": "Hi.", "voice": "alloy"}).encode(), 400, "voice", "m1"),
        (
            json.dumps({"model": "tts-1", "input": "Hi.", "voice": "/etc/hosts.txt"}).encode(),
            400,
            "voice",
            "reads no files",
        ),
        (json.dumps({"model": "tts-1", "input": "Hi.", "voice": "乀嗲梿"}).encode(), 400, "voice", "cut short"),
        (
            json.dumps({"model": "tts-1", "input": "Hi.", "response_format": "aac"}).encode(),
            400,
            "response_format",
            "AAC",
        ),
        (
            json.dumps({"model": "tts-1", "input": "Hi.", "response_format": "ogg"}).encode(),
            400,
            "response_format",
            "wav",
        ),
        (json.dumps({"model": "tts-1", "input": "Hi.", "speed": 1.5}).encode(), 400, "speed", "only 1.0"),
        (json.dumps({"model": "tts-1", "input": "Hi.", "speed": 9}).encode(), 400, "speed", "between"),
        (json.dumps({"model": "tts-1", "input": "  \n "}).encode(), 400, "input", "empty"),
        (json.dumps({"model": "tts-1", "input": "Hi.", "colour": "red"}).encode(), 400, "colour", "Extra inputs"),
        (json.dumps({"model": "tts-1", "input": "word " * 1000}).encode(), 413, "input", "limit of 4096"),
    ],
)
def test_bad_requests_get_clear_errors_and_the_server_serves_on(server, body, status, param, says):
    r = server.client.post("/v1/audio/speech", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and says in err["message"], err
    assert server.client.get("/health").json()["status"] == "ok"


def test_models_health_and_metrics(server):
    assert [m["id"] for m in server.client.get("/v1/models").json()["data"]] == ["ttsq-voice"]
    health = server.client.get("/health").json()
    assert health["slots"] == 4 and health["queue_depth"] == 0
    assert server.speech(input="Hi there.", voice="seed:7", response_format="pcm").status_code == 200
    text = server.client.get("/metrics").text
    for name in (
        "ttsq_queue_depth",
        "ttsq_active_requests",
        "ttsq_time_to_first_audio_seconds_count",
        "ttsq_time_to_first_byte_seconds_count",
        "ttsq_rtf_count",
        "ttsq_audio_seconds_total",
        "process_resident_memory_bytes",
    ):
        assert name in text, name
    assert metric(text, "ttsq_time_to_first_audio_seconds_count") >= 1
    assert metric(text, "ttsq_time_to_first_byte_seconds_count") >= 1
    assert metric(text, "ttsq_audio_seconds_total") > 0.3


def test_ttsq_serve_warms_up_through_a_throwaway_app_and_counts_no_request():
    """`ttsq serve`'s build: one request end to end before serving (so the first client's path has run once), through
    an app of its own: the served app's metrics start at zero, and the scheduler stays open."""
    from toolkit.server.main import ServeOptions, build

    app = build(ServeOptions(device="cpu", slots=1))
    sched = app.state.scheduler
    try:
        assert len(sched.completed) == 1  # the warm-up request
        text = app.state.metrics.render().decode()
        assert "\nttsq_time_to_first_audio_seconds_count 0.0\n" in text
        assert "ttsq_requests_total{" not in text
        assert job_audio(sched.submit("Hi.")).size > 0
    finally:
        sched.close()


def test_stream_arrives_in_pieces_and_equals_ttsq_synth(server, tmp_path):
    out = tmp_path / "synth.wav"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "toolkit.cli",
            "synth",
            SHORT,
            "-o",
            str(out),
            "--device",
            "cpu",
            "--seed",
            "3",
            "--speaker",
            "m1",
        ],
        check=True,
        cwd=ROOT,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    reference, _ = sf.read(out, dtype="int16")
    with server.client.stream(
        "POST",
        "/v1/audio/speech",
        json={"model": "tts-1", "input": SHORT, "voice": "m1", "seed": 3, "response_format": "wav"},
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "audio/wav"
        chunks = list(r.iter_raw())
    body = b"".join(chunks)
    assert body[:4] == b"RIFF" and body[36:40] == b"data"
    assert len(chunks) > 2  # header and audio went out piece by piece
    streamed = wav_samples(body)
    assert len(streamed) == len(reference)
    assert np.abs(streamed.astype(int) - reference).max() <= 2  # int16 steps: float rounding of the streamed render
    pcm = server.speech(input=SHORT, voice="m1", seed=3, response_format="pcm")
    assert pcm.headers["content-type"] == "audio/pcm" and len(pcm.content) == len(body) - 44
    # the same audio up to float rounding: the renders' windows start where the step count stood at each render
    assert np.abs(np.frombuffer(pcm.content, "<i2").astype(int) - streamed).max() <= 2


def test_multi_sentence_text_equals_synth_at_batch_1_and_first_audio_comes_early(server):
    reference = long_reference()
    with server.client.stream(
        "POST", "/v1/audio/speech", json={"model": "tts-1", "input": LONG, "response_format": "pcm"}
    ) as r:
        pieces = r.iter_raw()
        first = next(pieces)
        running = server.scheduler.active  # the first audio arrived while the request still decodes
        body = first + b"".join(pieces)
    assert running == 1
    got = np.frombuffer(body, "<i2")
    want = np.rint(np.clip(reference, -1, 1) * 32767)
    assert len(got) == len(want) and np.abs(got - want).max() <= 2


def test_other_formats_decode_to_the_same_length(server):
    wav = wav_samples(server.speech(input="Hi there.", voice="m1", response_format="wav").content)
    for fmt, mime in (("flac", "audio/flac"), ("mp3", "audio/mpeg"), ("opus", "audio/ogg")):
        r = server.speech(input="Hi there.", voice="m1", response_format=fmt)
        assert r.status_code == 200 and r.headers["content-type"] == mime
        x, sr = sf.read(io.BytesIO(r.content))
        assert sr == 24000 and abs(len(x) - len(wav)) < 0.1 * len(wav) + 2000, fmt  # codecs pad a little


def test_disconnect_cancels_the_request_and_frees_its_slot(server):
    before = metric(server.client.get("/metrics").text, 'ttsq_requests_total{outcome="cancelled"}')
    with server.client.stream(
        "POST", "/v1/audio/speech", json={"model": "tts-1", "input": LONG, "response_format": "pcm"}
    ) as r:
        pieces = r.iter_raw()
        next(pieces)
        assert server.scheduler.active == 1
    server.wait_until(lambda: server.scheduler.active == 0, "the slot to be freed")
    after = metric(server.client.get("/metrics").text, 'ttsq_requests_total{outcome="cancelled"}')
    assert after == before + 1
    assert server.speech(input="Hi.", response_format="pcm").status_code == 200


def test_short_request_joins_the_running_batch_and_finishes_first(server):
    sched = server.scheduler
    with server.client.stream(
        "POST", "/v1/audio/speech", json={"model": "tts-1", "input": LONG, "response_format": "pcm"}
    ) as long:
        long_pieces = long.iter_raw()
        head = next(long_pieces)
        short = server.speech(input="Hi there.", response_format="pcm")  # sent while the long one decodes
        assert short.status_code == 200 and len(short.content) > 0
        short_done = list(sched.completed)
        assert sched.active == 1  # the long one is still decoding after the short one ended
        body = head + b"".join(long_pieces)
    assert len(body) > 10 * len(short.content)
    assert sched.completed[-1] not in short_done  # the long request ended after the short one


def test_full_queue_gets_429_with_retry_after_and_the_server_recovers():
    s = LiveServer(slots=1, max_queue=1)
    try:
        with s.client.stream(
            "POST", "/v1/audio/speech", json={"model": "tts-1", "input": LONG, "response_format": "pcm"}
        ) as running:
            pieces = running.iter_raw()  # kept: a dropped iterator closes the response
            next(pieces)  # in the only slot
            queued: dict = {}
            t = threading.Thread(target=lambda: queued.setdefault("r", s.speech(input="Hi.", response_format="pcm")))
            t.start()
            s.wait_until(lambda: s.scheduler.queue_depth == 1, "the second request to queue")
            r = s.speech(input="Hi.", response_format="pcm")
            assert r.status_code == 429, r.text
            assert int(r.headers["Retry-After"]) >= 1 and "capacity" in r.json()["error"]["message"]
        t.join(300)  # the running one was cancelled by leaving: the queued one gets its slot
        assert queued["r"].status_code == 200 and len(queued["r"].content) > 0
        assert s.speech(input="Hi.", response_format="pcm").status_code == 200
    finally:
        s.close()


def test_out_of_memory_fails_that_request_alone():
    s = LiveServer(slots=2)
    sched, step = s.scheduler, s.scheduler._step
    fired = threading.Event()

    def step_that_runs_out_of_memory_once():  # the first step with a second request in the batch
        if len(sched.rows) == 2 and not fired.is_set():
            fired.set()
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        step()

    sched._step = step_that_runs_out_of_memory_once
    try:
        with s.client.stream(
            "POST", "/v1/audio/speech", json={"model": "tts-1", "input": LONG, "response_format": "pcm"}
        ) as first:
            pieces = first.iter_raw()
            head = next(pieces)
            newest = s.speech(input="Hi there.", response_format="pcm")
            assert fired.is_set()
            assert newest.status_code == 503 and newest.json()["error"]["code"] == "out_of_memory"
            assert "serves on" in newest.json()["error"]["message"]
            body = head + b"".join(pieces)  # the one already running finishes whole
        assert len(body) // 2 == len(long_reference())
        assert s.speech(input="Hi there.", response_format="pcm").status_code == 200
        text = s.client.get("/metrics").text
        assert metric(text, 'ttsq_requests_total{outcome="failed"}') == 1
    finally:
        s.close()


def test_prefill_failure_fails_that_request_alone(server):
    sched, prefill = server.scheduler, server.scheduler._prefill

    def prefill_that_fails_for_one_text(job, sentence, row):
        if job.sentences[sentence][0].startswith("Fail"):
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        prefill(job, sentence, row)

    sched._prefill = prefill_that_fails_for_one_text
    try:
        r = server.speech(input="Fail here.", response_format="wav")
        assert r.status_code == 503 and "Retry-After" in r.headers
        assert server.speech(input="Hi there.", response_format="wav").status_code == 200
    finally:
        sched._prefill = prefill


def test_scheduler_compacts_its_cache_and_keeps_each_requests_audio():
    """24 requests through 2 slots of a 256-position cache: rows join as others leave, `pos` passes the cache's end
    (several times over: the property must not depend on how fast a voice speaks), the rows shift, and every request
    still gets the audio it gets alone."""
    synth = Synthesizer(device="cpu")
    texts = [
        "The quick brown fox jumps.",
        "Hello there, how are you?",
        "It was a sunny morning.",
        "Come and play.",
        "The river runs past the mill.",
        "Good night, sleep well.",
        "Dark clouds rolled in.",
        "Hi.",
        "Birds sang in the tall trees.",
        "Where is the station?",
        "Tea or coffee?",
        "We walked home slowly.",
    ] * 2  # the second twelve with other seeds
    alone = Scheduler(synth, slots=1, cache_len=256)
    want = [job_audio(alone.submit(t, seed=i)) for i, t in enumerate(texts)]
    alone.close()
    assert alone.compactions == 0
    sched = Scheduler(synth, slots=2, max_queue=len(texts), cache_len=256)
    jobs = [sched.submit(t, seed=i) for i, t in enumerate(texts)]
    got = [job_audio(j) for j in jobs]
    sched.close()
    assert sched.compactions >= 1
    for g, w in zip(got, want):
        assert len(g) == len(w) and np.abs(g - w).max() < 1e-3


def test_sigterm_lets_the_stream_in_flight_finish(tmp_path):
    port_probe = __import__("socket").socket()
    port_probe.bind(("127.0.0.1", 0))
    port = port_probe.getsockname()[1]
    port_probe.close()
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolkit.cli", "serve", "--device", "cpu", "--port", str(port), "--slots", "2"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT)
        deadline = time.monotonic() + 180
        while True:
            try:
                if client.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "ttsq serve did not start"
            time.sleep(0.2)
        with client.stream(
            "POST", "/v1/audio/speech", json={"model": "tts-1", "input": LONG, "response_format": "pcm"}
        ) as r:
            pieces = r.iter_raw()
            head = next(pieces)
            proc.send_signal(signal.SIGTERM)
            body = head + b"".join(pieces)  # raises if the stream is cut
        assert len(body) // 2 == len(long_reference())
        # uvicorn re-raises the signal once it has shut down gracefully (the lifespan drained the scheduler)
        assert proc.wait(120) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("padded", [False, True])
def test_batched_rendering_from_a_ring_equals_each_renderer_alone(padded):
    """streaming.render_ring (the scheduler's batched render, windows gathered from a ring of states) against
    push() and finish() per renderer, on real GPT states of two sentences pushed in chunks of different sizes (the
    windows in a batch differ in length), through a ring barely larger than a window, so that positions wrap and
    the finishing windows reach back to the ring's limit. padded: the pushes padded with zero rows and states, the
    ends with zero rows, to the shapes of captured renders (Scheduler(render_graphs=True)), their samples from a
    `samples` callable."""
    from toolkit.streaming import StreamRenderer, gather_ring, render_gathered, render_ring, window_samples

    calls = []

    def samples(states):  # what a captured render of that shape would give
        calls.append(tuple(states.shape[:2]))
        return window_samples(synth.model, states)

    extra = dict(pad=lambda B, S: (B + 2, S + 5), samples=samples) if padded else {}

    synth = Synthesizer(device="cpu")
    utts = synth.synthesize(
        ["Hello there, how are you today?", "The river runs past the old mill."], seed=1, batch_size=1
    )
    states = [u.segments[0].hidden for u in utts]  # (n, D) float32
    alone = [StreamRenderer(synth.model) for _ in states]
    together = [StreamRenderer(synth.model) for _ in states]
    sizes = (16, 11)
    R = max(sizes) + together[0].lookback + 1
    assert all(len(h) > R for h in states)  # the ring wraps, and the finishing windows are cut at R - 1
    ring = torch.zeros(2, R, states[0].shape[1])
    got: list[list[np.ndarray]] = [[], []]
    want: list[list[np.ndarray]] = [[], []]
    for k in range(max(-(-len(h) // n) for h, n in zip(states, sizes))):
        parts = [h[k * n : (k + 1) * n] for h, n in zip(states, sizes)]
        for i, (r, part) in enumerate(zip(alone, parts)):
            want[i].append(r.push(part))
            for j, state in enumerate(part):
                ring[i, (k * sizes[i] + j) % R] = state
        items = [(i, r, len(part)) for i, (r, part) in enumerate(zip(together, parts))]
        for i, piece in enumerate(render_ring(synth.model, ring, items, **extra).pieces()):
            got[i].append(piece)
    ends = gather_ring(ring, [(i, r, 0) for i, r in enumerate(together)], finish=True)
    if padded:  # the ends padded with rows only (Scheduler._end_batch): their windows keep their length
        ends = [(idx, w.pad_rows(len(w.rows) + 3)) for idx, w in ends]
    tails = render_gathered(synth.model, 2, ends, samples=extra.get("samples")).pieces()
    assert not padded or sum(B > 2 for B, _ in calls) > 2  # the pushes went through `samples`, padded
    assert not padded or any(B == len(w.rows) + 3 for B, _ in calls for _, w in ends)  # and the ends
    for i in range(2):
        g = np.concatenate(got[i] + [tails[i]])
        w = np.concatenate(want[i] + [alone[i].finish()])
        assert len(g) == len(w) == len(utts[i].wav)
        assert np.abs(g - w).max() < 1e-4 and sum(p.size > 0 for p in got[i]) > 2
        assert np.abs(w - utts[i].wav).max() < 1e-4  # and push() the whole utterance's decode


def test_prompts_prefilled_as_one_batch_get_the_audio_each_gets_alone():
    """batch_prefill (the default on CUDA, here forced on the CPU): requests admitted together, and sentences that
    follow one another at the same step, are prefilled as one left-padded batch over a cache of their own, then
    copied into their rows. Each request's audio must still equal its audio served alone."""
    synth = Synthesizer(device="cpu")
    texts = ["Hello there, how are you today?", "The river runs past the old mill. It was sunny.", "Hi."]
    want = served_alone(synth, texts, batch_prefill=False)
    sched = Scheduler(synth, slots=4, max_queue=8, batch_prefill=True, profile=True)
    with sched._cond:  # held (it is reentrant), so that the worker admits all three at one step boundary
        jobs = [sched.submit(t, seed=i) for i, t in enumerate(texts)]
    got = [job_audio(j) for j in jobs]
    sched.close()
    assert sched.timings["prefill_batch"][1] >= 1 and "prefill" not in sched.timings
    for g, w in zip(got, want):
        assert len(g) == len(w) and np.abs(g - w).max() < 1e-3


def test_next_sentences_parked_for_a_shared_prefill_keep_each_requests_audio():
    """prefill_wait: a request's next sentence waits, its row parked (stepping for nothing), to be prefilled in one
    batch with others'. Here it waits until every row is parked, so several rows' next sentences share prefills that
    prefill_wait=0 runs one by one; each request's audio must still equal its audio served alone, across shifts of
    the cache (which leave parked rows' stale keys behind)."""
    synth = Synthesizer(device="cpu")
    texts = [
        "Hello there, how are you today? The river runs past the old mill. It was sunny.",
        "Hi. We walked home slowly, talking about the long winter.",
        "Tea or coffee? Dark clouds rolled in over the hills. Come and play.",
    ]  # three sentences each at max_chars=40
    cache_len = 128  # short: the rows shift left (compact) while some are parked
    want = served_alone(synth, texts, batch_prefill=False, max_chars=40, cache_len=cache_len)
    calls = {}
    for wait in (0, 10_000):
        sched = Scheduler(
            synth,
            slots=4,
            max_queue=8,
            max_chars=40,
            cache_len=cache_len,
            batch_prefill=True,
            prefill_wait=wait,
            profile=True,
        )
        with sched._cond:  # all three admitted at one step boundary
            jobs = [sched.submit(t, seed=i) for i, t in enumerate(texts)]
        got = [job_audio(j) for j in jobs]
        sched.close()
        calls[wait] = sched.timings["prefill_batch"][1]
        assert sched.compactions >= 1
        for g, w in zip(got, want):
            assert len(g) == len(w) and np.abs(g - w).max() < 1e-3, wait
    # waiting for every row: one prefill per round of sentences, where at once each sentence end had its own
    assert calls[10_000] <= 3 < calls[0], calls


def test_a_requests_second_piece_follows_its_first_within_a_chunk_of_steps():
    """The first audio holds only the samples no later state can change (a few hops); a player that starts on it
    needs the next piece before the render cadence (render_every steps) comes round. The request's second piece is
    rendered `chunk` steps after its first: exactly chunk steps of audio (2 mel frames of hop samples each), even
    with a cadence far longer, and the stream still equals the request served with the default cadence (to float
    rounding: the windows differ)."""
    synth = Synthesizer(device="cpu")
    hop = synth.model.cfg.vocos.hop
    pieces = {}
    for every in (None, 128):
        sched = Scheduler(synth, slots=1, render_every=every)
        job = sched.submit(LONG, seed=3)
        pieces[every] = [d for k, d in job.events() if k == "audio"]
        sched.close()
    first, second = (len(x) for x in pieces[128][:2])
    assert 0 < first < 4 * hop and second == sched.chunk * 2 * hop, (first, second)
    a, b = (np.concatenate(x) for x in pieces.values())
    assert len(a) == len(b) and np.abs(a - b).max() < 1e-4  # float rounding of other render windows


def test_compiled_step_gives_the_uncompiled_audio_with_dense_and_block_sparse_attention():
    """Scheduler(compile=True), what `ttsq serve --compile` runs: the whole decode step through torch.compile, its
    attention an op of its own reading the cache up to a bound set per step (bounded_attention, the default), or
    traced by compile, reading every row's whole bucket, or with sparse_attention only the blocks of cache positions
    that hold each row's keys (flex attention). Two requests decoded together, one of two
    sentences (its second prompt starts past the first block of 128 positions while the other row's started in it),
    must get the audio the uncompiled step gives them (fp32 on the CPU: the fused kernels round differently)."""
    from toolkit.models.gpt import KEY_BLOCK

    synth = Synthesizer(device="cpu")
    texts = ["Hello there, how are you today? The river runs past the old mill.", "It was a sunny day."]

    def serve(**options) -> tuple[list[np.ndarray], int]:
        sched = Scheduler(synth, slots=2, max_queue=4, **options)
        with sched._cond:  # both admitted at one step boundary, so that they decode as one batch
            jobs = [sched.submit(t, seed=i) for i, t in enumerate(texts)]
        out = [job_audio(j) for j in jobs]
        sched.close()
        return out, sched.steps_run

    want, steps = serve(compile=False)
    assert steps > KEY_BLOCK + 40  # the second sentence's prompt lies past the first block
    bounded = {"compile": True}  # the default: cache buckets of 64 positions, several per sentence
    traced = {"compile": True, "bounded_attention": False}
    for options in (traced, {"compile": True, "sparse_attention": True}, {"cache_bucket": 32}, bounded):
        compiles = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        got, _ = serve(**options)  # a finer bucket reads fewer of the masked positions: the same audio
        for g, w in zip(got, want):
            assert len(g) == len(w) and np.abs(g - w).max() < 1e-3, options
        if options is bounded:  # one compile per batch bucket (1 and 2 rows), whatever the cache length
            assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - compiles <= 2


def test_scheduler_options_that_need_graphs_or_compile_say_so_on_the_cpu():
    """Options that only exist with CUDA graphs or a compiled step fail at construction with the reason, not later."""
    synth = Synthesizer(device="cpu")
    with pytest.raises(ValueError, match="render_graphs needs graphs"):
        Scheduler(synth, slots=1, render_graphs=True)
    with pytest.raises(ValueError, match="sparse_attention needs compile"):
        Scheduler(synth, slots=1, sparse_attention=True)
    with pytest.raises(ValueError, match="graphs=True needs a CUDA device"):
        Scheduler(synth, slots=1, graphs=True)
    with pytest.raises(ValueError, match="bounded_attention needs compile=True"):
        Scheduler(synth, slots=1, bounded_attention=True)
    # compile's defaults: bounded attention unless sparse; render graphs only where there are graphs (CUDA)
    for options, bounded in (({}, True), ({"sparse_attention": True}, False)):
        sched = Scheduler(synth, slots=1, compile=True, **options)
        sched.close()
        assert sched.bounded_attention is bounded and not sched.render_graphs
        # and batched prefills and renders: next sentences wait a chunk to share a prefill, renders every 4 chunks
        assert (sched.prefill_wait, sched.render_every) == (sched.chunk, 4 * sched.chunk)
    sched = Scheduler(synth, slots=1)
    sched.close()
    assert (sched.prefill_wait, sched.render_every) == (0, 2 * sched.chunk)
    with pytest.raises(ValueError, match="prefill_wait must be >= 0"):
        Scheduler(synth, slots=1, prefill_wait=-1)
    with pytest.raises(ValueError, match="cache_bucket must be positive"):
        Scheduler(synth, slots=1, cache_bucket=-1)
    with pytest.raises(ValueError, match="a multiple of 128 with sparse_attention"):
        Scheduler(synth, slots=1, compile=True, sparse_attention=True, cache_bucket=96)

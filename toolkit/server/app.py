"""The ASGI app: OpenAI's `POST /v1/audio/speech`, `GET /v1/models`, `GET /health`, `GET /metrics`.

Requests go to a Scheduler (continuous batching on one device). The response starts once the request's first audio
is rendered, so a failure before it (bad voice, out of memory) still gets a proper status; wav and pcm then stream
piece by piece. A client that disconnects cancels its request, which leaves the batch at the next step.
Errors use OpenAI's shape: {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from ..scheduler import Closed, Job, QueueFull, Scheduler
from ..speakers import names_a_file
from ..synthesizer import OutOfMemory
from ..text import TextError
from . import formats
from .metrics import ServerMetrics

OPENAI_MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")  # accepted as names of the one model served
MAX_INPUT_CHARS = 4096  # OpenAI's limit for `input`


class SpeechRequest(BaseModel):
    """OpenAI's speech request; `seed` is ttsq's (sampling seed, as `ttsq synth --seed`)."""

    model_config = ConfigDict(extra="forbid")
    model: str
    input: str
    voice: str | int | None = None  # a voice of the model, a seed ("7", "seed:7") or what toolkit's speakers accept
    response_format: str = "mp3"  # OpenAI's default
    speed: float = 1.0
    seed: int = 0
    instructions: str | None = None
    stream_format: str | None = None


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None, headers: dict | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers

    def response(self) -> JSONResponse:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        body = {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


@dataclass
class ServerConfig:
    model_id: str = "ttsq"
    max_input_chars: int = MAX_INPUT_CHARS


def parse_request(body: bytes, cfg: ServerConfig) -> SpeechRequest:
    """The request body -> a SpeechRequest, or ApiError 400 / 413 saying what is wrong and how to fix it."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(
            400,
            f"the body is not valid JSON ({e}); send a JSON object such as "
            '{"model": "tts-1", "input": "Hello.", "voice": "m1", "response_format": "wav"}',
        ) from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the body must be a JSON object, got {type(data).__name__}")
    try:
        req = SpeechRequest.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(x) for x in err["loc"]) or None
        raise ApiError(
            400,
            f"{field}: {err['msg']}" + (f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""),
            param=field,
        ) from None
    if req.model not in (cfg.model_id, *OPENAI_MODELS):
        raise ApiError(
            400,
            f"model {req.model!r} is not served here; use {cfg.model_id!r} "
            f"(or one of {', '.join(OPENAI_MODELS)}, which name it too)",
            "model",
            "model_not_found",
        )
    if len(req.input) > cfg.max_input_chars:
        raise ApiError(
            413,
            f"input has {len(req.input)} characters, more than this server's limit of "
            f"{cfg.max_input_chars}; split the text into several requests",
            "input",
        )
    if (why := formats.format_error(req.response_format)) is not None:
        raise ApiError(400, why, "response_format")
    if not 0.25 <= req.speed <= 4.0:
        raise ApiError(400, f"speed must be between 0.25 and 4.0, got {req.speed}", "speed")
    if req.speed != 1.0:
        raise ApiError(
            400,
            "speed: only 1.0 is supported; ttsq models have no trained speed control (resample the audio on your side)",
            "speed",
        )
    if req.instructions:
        raise ApiError(400, "instructions are not supported by ttsq models; leave the field out", "instructions")
    if req.stream_format not in (None, "audio"):
        raise ApiError(
            400,
            f"stream_format {req.stream_format!r} is not supported; leave it out (wav and pcm stream as raw audio)",
            "stream_format",
        )
    return req


def error_of(exc: BaseException) -> ApiError:
    """A job's failure -> the status its client sees (when it fails before the first audio)."""
    if isinstance(exc, OutOfMemory):
        return ApiError(503, str(exc), code="out_of_memory", headers={"Retry-After": "1"})
    if isinstance(exc, ValueError):
        return ApiError(400, str(exc))
    return ApiError(500, f"synthesis failed: {type(exc).__name__}: {exc}")


def create_app(scheduler: Scheduler, cfg: ServerConfig | None = None) -> FastAPI:
    """The app over a running scheduler; the app's shutdown drains it (requests in flight finish)."""
    cfg = cfg or ServerConfig()
    metrics = ServerMetrics(scheduler)
    sample_rate = scheduler.synth.sample_rate

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        await asyncio.to_thread(scheduler.close, True)  # uvicorn has let the open streams finish by now

    app = FastAPI(title="ttsq", lifespan=lifespan)
    app.state.scheduler, app.state.metrics, app.state.config = scheduler, metrics, cfg

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError):
        if exc.status >= 400 and exc.status != 503:
            metrics.rejected.labels(str(exc.status)).inc()
        return exc.response()

    @app.get("/health")
    async def health():
        closing = scheduler._closing
        body = {
            "status": "draining" if closing else "ok",
            "model": cfg.model_id,
            "queue_depth": scheduler.queue_depth,
            "active": scheduler.active,
            "slots": scheduler.slots,
            "max_queue": scheduler.max_queue,
        }
        return JSONResponse(body, status_code=503 if closing else 200)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": cfg.model_id, "object": "model", "created": 0, "owned_by": "ttsq"}]}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/audio/speech")
    async def speech(request: Request):
        req = parse_request(await request.body(), cfg)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def on_event(job: Job, kind: str, data: object) -> None:  # the scheduler's thread
            metrics.job_event(job, kind)
            loop.call_soon_threadsafe(events.put_nowait, (kind, data))

        if names_a_file(req.voice):
            raise ApiError(
                400, "voice: the server reads no files for a speaker; send the speaker string itself", "voice"
            )
        try:
            job = scheduler.submit(req.input, speaker=req.voice, seed=req.seed, on_event=on_event)
        except TextError as e:
            raise ApiError(400, f"input: {e}", "input") from None
        except QueueFull as e:
            raise ApiError(
                429,
                f"{e}: the server is at capacity ({scheduler.slots} running, {scheduler.max_queue} queued)",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(e.retry_after)},
            )
        except Closed as e:
            raise ApiError(503, f"{e}; retry on another replica or later", headers={"Retry-After": "5"}) from None
        except ValueError as e:  # the speaker
            raise ApiError(400, f"voice: {e}", "voice") from None
        first = await _first_event(events, request)
        if first is None:  # the client left while queued
            job.cancel()
            return Response(status_code=204)
        kind, data = first
        if kind == "error":
            raise error_of(data)
        if req.response_format in formats.STREAMED:
            return StreamingResponse(
                _stream(job, first, events, req.response_format, sample_rate, metrics.first_byte),
                media_type=formats.media_type(req.response_format),
            )
        pieces = []
        try:
            while kind == "audio":
                pieces.append(data)
                kind, data = await events.get()
        finally:
            job.cancel()  # a no-op once ended; frees the slot if this handler is cancelled
        if kind == "error":
            raise error_of(data)
        body = await asyncio.to_thread(formats.encode, np.concatenate(pieces), sample_rate, req.response_format)
        metrics.first_byte(job)
        return Response(body, media_type=formats.media_type(req.response_format))

    return app


def warm_up_http(scheduler: Scheduler, cfg: ServerConfig) -> None:
    """Serve one streamed request through a throwaway app in this process (httpx's ASGI transport): the first
    request's way from first audio to its first bytes runs code for the first time (tens of ms), which a client
    would otherwise wait for. The throwaway app's metrics go with it, and its lifespan never runs (the scheduler
    stays open)."""
    import httpx

    async def one_request() -> None:
        transport = httpx.ASGITransport(app=create_app(scheduler, cfg))
        async with httpx.AsyncClient(transport=transport, base_url="http://warm-up") as client:
            body = {"model": cfg.model_id, "input": "Warm up.", "response_format": "pcm"}
            async with client.stream("POST", "/v1/audio/speech", json=body) as r:
                async for _ in r.aiter_raw():
                    pass
                if r.status_code != 200:
                    raise RuntimeError(f"the server's warm-up request got HTTP {r.status_code}")

    # a thread of its own: the caller may be inside an event loop already (a Ray Serve replica builds the app there)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, one_request()).result()


async def _first_event(events: asyncio.Queue, request: Request):
    """The job's first event, or None if the client disconnects first."""
    get = asyncio.ensure_future(events.get())
    gone = asyncio.ensure_future(_disconnect(request))
    done, _ = await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
    gone.cancel()
    if get in done:
        return get.result()
    get.cancel()
    return None


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _stream(
    job: Job, first, events: asyncio.Queue, fmt: str, sample_rate: int, on_first_bytes: Callable[[Job], None]
):
    """The response body: a WAV header (wav), then 16-bit PCM of each piece as the scheduler renders it. A failure
    mid-stream aborts the response (the status is sent already); a disconnect cancels the job (finally)."""
    try:
        if fmt == "wav":
            yield formats.wav_header(sample_rate)
        kind, data = first
        on_first_bytes(job)
        while kind == "audio":
            yield formats.pcm16(data)
            kind, data = await events.get()
        if kind == "error":
            raise data
    finally:
        job.cancel()

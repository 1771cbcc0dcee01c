"""`ttsq serve`: load the model, warm it up, and serve the app with uvicorn until SIGINT/SIGTERM (which lets the
requests in flight finish)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class ServeOptions:
    model: str | None = None
    precision: str | None = None
    device: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    slots: int = 8
    max_queue: int = 32
    max_input_chars: int = 4096
    compile: bool = False
    graceful_s: float = 60.0  # at shutdown, how long requests in flight may take to finish


def model_id(model: str | None) -> str:
    return Path(model).name if model else "ttsq-voice"


def build(opts: ServeOptions):
    """The app and its scheduler, model loaded and warmed up (the first request pays no allocation)."""
    from ..scheduler import Scheduler
    from ..synthesizer import Synthesizer
    from .app import ServerConfig, create_app, warm_up_http

    synth = Synthesizer(opts.model, opts.device, opts.precision, compile=False)  # --compile: the scheduler's step
    scheduler = Scheduler(synth, slots=opts.slots, max_queue=opts.max_queue, compile=opts.compile)
    scheduler.warm_up()  # the step's CUDA graphs (compiled with --compile), every batch and cache bucket
    cfg = ServerConfig(model_id(opts.model), opts.max_input_chars)
    warm_up_http(scheduler, cfg)  # one request end to end: the first client's finds every path run once
    return create_app(scheduler, cfg)


def serve(opts: ServeOptions) -> int:
    import uvicorn

    app = build(opts)
    print(
        f"ttsq serve: {app.state.config.model_id} on {app.state.scheduler.synth.device} "
        f"({app.state.scheduler.synth.precision}), {opts.slots} slots; POST http://{opts.host}:{opts.port}"
        "/v1/audio/speech",
        flush=True,
    )
    uvicorn.run(app, host=opts.host, port=opts.port, timeout_graceful_shutdown=opts.graceful_s, log_level="info")
    return 0

"""Beyond one machine: the same app as a Ray Serve deployment, one replica per GPU, autoscaled on queue depth.

Ray Serve's proxy spreads requests over the replicas and its autoscaler adds or removes replicas to keep each one's
ongoing requests (its decode batch plus its queue) near `target_ongoing`. Each replica is the app of `ttsq serve`
(a Scheduler on its own GPU), so streaming, errors and metrics are the same. Needs the `ray` extra.

    ray start --head                                   # on each machine: `ray start --address HEAD:6379 --num-gpus N`
    python -m toolkit.server.ray_app --device cuda --precision bf16 --min-replicas 1 --max-replicas 8 --port 8000
"""

from __future__ import annotations

import argparse
import sys

from .main import ServeOptions


def deployment(
    opts: ServeOptions, *, min_replicas: int = 1, max_replicas: int = 1, target_ongoing: float | None = None
):
    """A bound Ray Serve application of the app; on CUDA each replica holds one GPU (Ray sets its visible device).
    target_ongoing: the requests per replica the autoscaler aims at (default: its slots, a full decode batch)."""
    from ray import serve

    gpu = opts.device is None or opts.device.startswith("cuda")

    def asgi_app():  # runs in each replica: loads the model there, on the GPU Ray gave it
        from .main import build

        return build(ServeOptions(**{**vars(opts), "device": "cuda" if gpu else opts.device}))

    @serve.deployment(
        name="ttsq",
        ray_actor_options={"num_gpus": 1} if gpu else {"num_cpus": 1},
        # beyond a replica's slots and queue, requests wait in Ray's proxy instead of getting the replica's 429
        max_ongoing_requests=opts.slots + opts.max_queue,
        autoscaling_config={
            "min_replicas": min_replicas,
            "max_replicas": max_replicas,
            "target_ongoing_requests": target_ongoing or opts.slots,
            "upscale_delay_s": 10,
            "downscale_delay_s": 120,
        },
        graceful_shutdown_timeout_s=opts.graceful_s,
    )
    @serve.ingress(asgi_app)
    class TTSQ:
        pass

    return TTSQ.bind()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m toolkit.server.ray_app",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model")
    p.add_argument("--precision")
    p.add_argument("--device", default=None, help="cuda (one GPU per replica, the default) or cpu")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--max-queue", type=int, default=32)
    p.add_argument("--min-replicas", type=int, default=1)
    p.add_argument("--max-replicas", type=int, default=1)
    p.add_argument("--address", default=None, help="a running Ray cluster (default: RAY_ADDRESS, else a local one)")
    a = p.parse_args(argv)
    import ray
    from ray import serve

    ray.init(address=a.address)
    serve.start(http_options={"host": a.host, "port": a.port})
    opts = ServeOptions(a.model, a.precision, a.device, a.host, a.port, a.slots, a.max_queue)
    serve.run(
        deployment(opts, min_replicas=a.min_replicas, max_replicas=a.max_replicas),
        name="ttsq",
        route_prefix="/",
        blocking=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The Ray Serve deployment of `ttsq serve` (toolkit/server/ray_app.py) on a local Ray on the CPU: one replica of the
shipped voice streams the same audio as `ttsq serve`'s own app, and answers bad input alike."""

from __future__ import annotations

import socket

import numpy as np
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
httpx = pytest.importorskip("httpx")

from toolkit.server.main import ServeOptions  # noqa: E402
from toolkit.server.ray_app import deployment  # noqa: E402
from toolkit.synthesizer import Synthesizer  # noqa: E402

TEXT = "Hello there, how are you today?"


@pytest.fixture(scope="module")
def ray_url():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        app = deployment(ServeOptions(device="cpu", slots=2, max_queue=4), min_replicas=1, max_replicas=2)
        serve.run(app, name="ttsq", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def test_ray_replica_streams_the_same_audio_and_reports_its_queue(ray_url):
    with httpx.Client(base_url=ray_url, timeout=300) as client:
        assert client.get("/health").json()["slots"] == 2
        with client.stream(
            "POST",
            "/v1/audio/speech",
            json={"model": "tts-1", "input": TEXT, "voice": "m1", "seed": 3, "response_format": "pcm"},
        ) as r:
            assert r.status_code == 200 and r.headers["content-type"] == "audio/pcm"
            body = b"".join(r.iter_raw())
        want = Synthesizer(device="cpu").synthesize(TEXT, speaker="m1", seed=3)[0].wav
        got = np.frombuffer(body, "<i2")
        assert len(got) == len(want) and np.abs(got - np.rint(np.clip(want, -1, 1) * 32767)).max() <= 2
        bad = client.post("/v1/audio/speech", content=b"{oops", headers={"content-type": "application/json"})
        assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
        assert "ttsq_queue_depth" in client.get("/metrics").text


def test_ray_deployment_autoscales_on_ongoing_requests():
    app = deployment(ServeOptions(device="cpu", slots=8, max_queue=32), min_replicas=1, max_replicas=4)
    cfg = app._bound_deployment._deployment_config
    assert cfg.autoscaling_config.min_replicas == 1 and cfg.autoscaling_config.max_replicas == 4
    assert cfg.autoscaling_config.target_ongoing_requests == 8  # a replica's full decode batch
    assert cfg.max_ongoing_requests == 40
    gpu = deployment(ServeOptions(device="cuda"))._bound_deployment.ray_actor_options
    assert gpu["num_gpus"] == 1

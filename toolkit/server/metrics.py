"""Prometheus metrics of the speech server (prometheus_client, one registry per app)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

from ..scheduler import Job, Scheduler

# time to first audio: the streaming user's wait; buckets from 25 ms (the GPU target's range) to a minute
TTFA_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.125, 0.15, 0.175, 0.2, 0.25, 0.3, 0.4, 0.5, 1, 2, 5, 10, 30, 60)
RTF_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 5, 10)


class ServerMetrics:
    def __init__(self, scheduler: Scheduler):
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)  # process_resident_memory_bytes, cpu seconds, open fds
        self.requests = Counter("ttsq_requests", "speech requests by outcome", ["outcome"], registry=r)
        self.rejected = Counter(
            "ttsq_rejected", "speech requests refused before queueing, by HTTP status", ["status"], registry=r
        )
        self.ttfa = Histogram(
            "ttsq_time_to_first_audio_seconds",
            "request received to first audio rendered",
            buckets=TTFA_BUCKETS,
            registry=r,
        )
        self.ttfb = Histogram(
            "ttsq_time_to_first_byte_seconds",
            "request received to its first audio bytes handed to the HTTP server (first audio plus the event loop's "
            "delay in taking it)",
            buckets=TTFA_BUCKETS,
            registry=r,
        )
        self.rtf = Histogram(
            "ttsq_rtf", "request received to last audio, over the audio's duration", buckets=RTF_BUCKETS, registry=r
        )
        self.audio = Counter("ttsq_audio_seconds", "audio seconds generated", registry=r)
        self.steps = Counter("ttsq_gpt_steps", "GPT steps before EOS, over all requests", registry=r)
        Gauge("ttsq_queue_depth", "requests waiting for a decode slot", registry=r).set_function(
            lambda: scheduler.queue_depth
        )
        Gauge("ttsq_active_requests", "requests in the running decode batch", registry=r).set_function(
            lambda: scheduler.active
        )
        Gauge("ttsq_slots", "decode slots (the batch's largest size)", registry=r).set_function(lambda: scheduler.slots)
        device = scheduler.synth.device
        if device.type == "cuda":
            import torch

            Gauge("ttsq_device_memory_allocated_bytes", "torch tensors on the device", registry=r).set_function(
                lambda: torch.cuda.memory_allocated(device)
            )
            Gauge("ttsq_device_memory_peak_bytes", "peak of torch tensors on the device", registry=r).set_function(
                lambda: torch.cuda.max_memory_allocated(device)
            )
        self.sample_rate = scheduler.synth.sample_rate

    def job_event(self, job: Job, kind: str) -> None:
        """Called with each job event (from the scheduler's thread; prometheus_client is thread-safe)."""
        if kind in ("end", "error"):
            self.requests.labels(job.outcome).inc()
            if job.first_audio is not None:
                self.ttfa.observe(job.first_audio - job.submitted)
            seconds = job.samples / self.sample_rate
            self.audio.inc(seconds)
            self.steps.inc(job.steps)
            if job.outcome == "done" and seconds > 0:
                self.rtf.observe((job.finished - job.submitted) / seconds)

    def first_byte(self, job: Job) -> None:
        """Called (on the event loop) as the job's first audio bytes go to the HTTP server."""
        self.ttfb.observe(time.perf_counter() - job.submitted)

    def render(self) -> bytes:
        return generate_latest(self.registry)

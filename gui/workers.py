"""Background work: every model call of the GUI runs here, in a worker thread, never on the GUI thread.

`Worker(fn)` runs `fn(emit, should_stop)` in its own thread; `emit(kind, payload)` reaches the GUI thread as the
`event` signal, and the outcome arrives as `done(result)`, `failed(message)` or `cancelled()`.
`synthesize_precisions` is the Synthesize job: one result dict per precision, measured with the library API.
`Intelligibility` holds the ASR (evaluation.asr) of a window's session, loaded once, on first use, in a worker.
"""
from __future__ import annotations

import copy
import queue
import threading
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from PySide6.QtCore import QObject, QTimer, Signal

FP32 = "fp32"


class Worker(QObject):
    """Runs `fn(emit, should_stop)` in a Python thread. The thread never touches Qt: it puts events in a queue that
    a QTimer on the GUI thread drains, and the signals below are emitted from the GUI thread. (Queued signals
    emitted from another thread crash PySide6 6.12.0 with a refcount error, so this design avoids them.)"""
    event = Signal(str, object)  # kind, payload
    done = Signal(object)
    failed = Signal(str)
    cancelled = Signal()
    finished = Signal()  # after done/failed/cancelled

    def __init__(self, fn: Callable[[Callable[[str, object], None], Callable[[], bool]], object], parent=None):
        super().__init__(parent)
        self._fn = fn
        self._stop = threading.Event()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._timer = QTimer(self)
        self._timer.setInterval(30)
        self._timer.timeout.connect(self._drain)

    def start(self) -> "Worker":
        self._thread = threading.Thread(target=self._run, name="ttsq-gui-worker", daemon=True)
        self._thread.start()
        self._timer.start()
        return self

    def cancel(self) -> None:
        self._stop.set()

    def should_stop(self) -> bool:
        return self._stop.is_set()

    def is_running(self) -> bool:
        return self._thread is not None and (self._thread.is_alive() or self._timer.isActive())

    def wait(self, timeout: float | None = None) -> None:
        """Blocks until the thread ends (its pending events are still delivered by the timer)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        put = self._queue.put
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = self._fn(lambda kind, payload=None: put(("event", (kind, payload))), self.should_stop)
            for w in caught:
                put(("event", ("warning", str(w.message))))
            put(("done", result))
        except InterruptedError:
            put(("cancelled", None))
        except BaseException as e:  # noqa: BLE001 -- every failure becomes a dialog, never a crash
            if self._stop.is_set():
                put(("cancelled", None))
            else:
                traceback.print_exc()
                put(("failed", f"{type(e).__name__}: {e}"))
        finally:
            put(("finished", None))

    def _drain(self) -> None:
        while True:
            try:
                what, payload = self._queue.get_nowait()
            except queue.Empty:
                return
            if what == "event":
                self.event.emit(*payload)
            elif what == "done":
                self.done.emit(payload)
            elif what == "failed":
                self.failed.emit(payload)
            elif what == "cancelled":
                self.cancelled.emit()
            else:
                self._timer.stop()
                self.finished.emit()
                return


def start(worker: Worker, parent: QObject | None = None) -> Worker:
    if parent is not None:
        worker.setParent(parent)
    return worker.start()


# ----------------------------------------------------------------------------------------------- synthesis
@dataclass
class SynthJob:
    model: str | None  # None: the shipped voice
    device: str
    precisions: list[str]
    text: str
    speaker: str | None = None
    seed: int = 0
    params: object = None  # toolkit.SamplingParams
    dnsmos: bool = True
    asr: bool = True  # WER/CER of each utterance against the text, by an offline ASR (the asr extra)
    time_to_first_audio: bool = True
    control_tokens: bool = False  # read [laugh], [uv_break], ... as controls, not as text
    reference: object = None  # an FP32 Utterance of the same sentence, from an earlier run
    intelligibility: "Intelligibility | None" = None  # the window's ASR session; None: one for this job
    key: tuple = field(default_factory=tuple)


class Intelligibility:
    """The ASR of a session: a Transcriber made on first use (about 1 s to load, so once, not per utterance) in the
    worker thread, then kept. When the asr extra is missing each use says so again (it may be installed meanwhile)."""

    def __init__(self):
        self._transcriber = None
        self._lock = threading.Lock()  # loaded once even if two jobs ask at the same time

    def transcriber(self):
        """-> evaluation.asr.Transcriber; raises ASRUnavailable, naming the extra, when it is not installed."""
        with self._lock:
            if self._transcriber is None:
                from evaluation import asr
                self._transcriber = asr.Transcriber()
            return self._transcriber

    def score(self, text: str, wav, sr: int) -> tuple[str, object]:
        """-> (what the ASR heard, evaluation.asr.ErrorCount against `text`)."""
        from evaluation import asr, textnorm
        heard = self.transcriber().transcribe(wav, sr, textnorm.language_of(text))
        return heard, asr.errors(text, heard)


def model_kind(path: str | None) -> tuple[str, str]:
    """(kind, description) of a model path: shipped | ttsq | artifact | chattts | onnx | missing | invalid."""
    from toolkit import checkpoint
    from toolkit.synthesizer import DEFAULT_MODEL

    root = Path(path) if path else DEFAULT_MODEL
    if not root.exists():
        return "missing", f"not found: {root}"
    if root.is_dir() and any(root.glob("*.onnx")) and not (root / "manifest.json").is_file():
        return "onnx", "exported ONNX folder"
    try:
        layout = checkpoint.detect_layout(root)
    except Exception as e:  # noqa: BLE001
        return "invalid", str(e)
    if layout == "chattts":
        return "chattts", "official ChatTTS folder"
    m = checkpoint.read_manifest(root)
    if any(root.glob("*.onnx")):
        return "onnx", "exported ONNX folder"
    if m.get("precision", "fp32") != "fp32" or "recipe" in m:
        return "artifact", f"quantized artifact ({m.get('precision', m.get('recipe'))})"
    return ("shipped" if not path else "ttsq"), ("shipped voice" if not path else "ttsq model (fp32)")


def _folder_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


class _EdgeAdapter:
    """The torch-free runtime (`toolkit.runtime.EdgeSynthesizer`) behind the Synthesizer calls the worker makes."""

    def __init__(self, path: str, device: str):
        import torch
        from toolkit.runtime import EdgeSynthesizer
        self.edge = EdgeSynthesizer(path, device=device)
        self.precision = f"onnx {self.edge.precision}"
        self.device = torch.device("cpu") if "CUDA" not in str(self.edge.sessions.providers) else torch.device("cuda")

    def synthesize(self, text, *, should_stop=None, **kwargs):
        if should_stop is not None and should_stop():
            raise InterruptedError("synthesis cancelled")
        return self.edge.synthesize(text, **kwargs)

    def stream(self, text, **kwargs):
        return self.edge.stream(text, **kwargs)


def _load_onnx(path: str, device: str):
    return _EdgeAdapter(path, device)


def synthesize_precisions(job: SynthJob, emit, should_stop) -> list[dict]:
    """For each precision: load, warm up, synthesize (with progress and cancel), time to first audio (stream),
    then MCD against FP32 and DNSMOS from evaluation.metrics. Emits ("result", dict) as each one is ready."""
    import torch

    from toolkit.precision import state_bytes
    from toolkit.synthesizer import Synthesizer, load_model

    kind, _ = model_kind(job.model)
    if kind in ("missing", "invalid"):
        from toolkit.checkpoint import detect_layout
        detect_layout(Path(job.model or ""))  # raises the library's own message
    names = [FP32] + [p for p in job.precisions if p != FP32] if FP32 in job.precisions else list(job.precisions)
    if kind in ("artifact", "onnx"):
        names = [Path(job.model).name]
    if not names:
        raise ValueError("pick at least one precision")
    if not job.text.strip():
        raise ValueError("type a sentence to synthesize")
    phases = 5  # load, warm-up, synthesize, first audio, metrics
    total = len(names) * phases

    def step(i: int, phase: int, label: str, frac: float = 0.0):
        emit("progress", ((i * phases + phase + frac) / total, label))

    same = dict(speaker=job.speaker, seed=job.seed, control_tokens=job.control_tokens)  # every call, every precision
    asr = (job.intelligibility or Intelligibility()) if job.asr else None
    base = None
    reference = job.reference
    results = []
    for i, name in enumerate(names):
        if should_stop():
            raise InterruptedError
        step(i, 0, f"{name}: loading")
        if kind == "onnx":
            synth, size = _load_onnx(job.model, job.device), _folder_bytes(Path(job.model))
        elif kind == "artifact":
            synth = Synthesizer(job.model, job.device)
            size = _folder_bytes(Path(job.model))
        else:
            if base is None:
                base = load_model(job.model, "cpu")
            model = copy.deepcopy(base) if i < len(names) - 1 else base
            synth = Synthesizer(model, job.device, None if name == FP32 else name)
            size = state_bytes(synth.model)
        dev = synth.device
        step(i, 1, f"{name}: warm-up")
        synth.synthesize(job.text, **same,
                         params=replace(job.params, max_new_tokens=min(8, job.params.max_new_tokens),
                                        min_new_tokens=0), should_stop=should_stop)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        step(i, 2, f"{name}: synthesizing")
        t0 = time.perf_counter()
        utt = synth.synthesize(job.text, **same, params=job.params, should_stop=should_stop,
                               progress=lambda d, n: step(i, 2, f"{name}: sentence {d}/{n}", d / max(n, 1)))[0]
        latency = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
        ttfa = None
        if job.time_to_first_audio and not should_stop():
            step(i, 3, f"{name}: time to first audio")
            t0 = time.perf_counter()
            pieces = synth.stream(job.text, **same, params=job.params)
            for _ in pieces:
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                ttfa = time.perf_counter() - t0
                break
            pieces.close()
        if should_stop():
            raise InterruptedError
        step(i, 4, f"{name}: scoring")
        res = {"name": name, "recipe": synth.precision, "utt": utt, "wav": utt.wav, "sample_rate": utt.sample_rate,
               "duration_s": utt.duration, "steps": utt.steps, "hit_limit": utt.hit_limit,
               "timings": dict(utt.timings), "latency_s": latency, "rtf": latency / max(utt.duration, 1e-9),
               "time_to_first_audio_s": ttfa, "size_bytes": size, "peak_gpu_bytes": peak, "device": str(dev),
               "mcd_db": None, "mcd_note": "", "dnsmos_ovrl": None, "dnsmos_note": "",
               "asr_rate": None, "asr": None, "asr_note": "", "asr_settings": None}
        _score(res, reference, job.dnsmos)
        _score_asr(res, spoken_text(job), asr)
        if name == FP32:
            reference = utt
        results.append(res)
        emit("result", res)
        del synth
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    emit("progress", (1.0, "done"))
    return results


def _score(res: dict, reference, with_dnsmos: bool) -> None:
    """MCD (DTW, SPTK settings) against the FP32 utterance of the same sentence, and DNSMOS: evaluation.metrics."""
    from evaluation import metrics

    sr = res["sample_rate"]
    if res["name"] == FP32:
        res["mcd_db"], res["mcd_note"] = 0.0, "the reference"
    elif reference is None:
        res["mcd_note"] = "no FP32 result for this sentence: add fp32 to compare"
    else:
        try:
            res["mcd_db"] = metrics.mcd(reference.wav, res["wav"], sr).value_db
        except (ValueError, ImportError) as e:
            res["mcd_note"] = str(e)
    if with_dnsmos:
        try:
            res["dnsmos_ovrl"] = metrics.dnsmos(res["wav"], sr)["ovrl"]
        except (ValueError, ImportError) as e:
            res["dnsmos_note"] = str(e)
    else:
        res["dnsmos_note"] = "DNSMOS is off"


def spoken_text(job: SynthJob) -> str:
    """What the audio should say: the text typed, less the control tokens when they are read as controls."""
    from toolkit.text import USER_CONTROL
    return USER_CONTROL.sub(" ", job.text) if job.control_tokens else job.text


def _score_asr(res: dict, text: str, asr: Intelligibility | None) -> None:
    """The error rate (WER en, CER zh, MER mixed) of what the ASR heard against `text`, with the row in the shape of
    `ttsq evaluate`'s per_sentence "asr" rows. Without the asr extra the value stays None and the note names it."""
    from evaluation.asr import ASRUnavailable
    if asr is None:
        res["asr_note"] = "intelligibility (ASR) is off"
        return
    try:
        heard, count = asr.score(text, res["wav"], res["sample_rate"])
    except ASRUnavailable as e:
        res["asr_note"] = str(e)
        return
    except (ValueError, RuntimeError, ImportError) as e:  # a clip the ASR cannot take is a note, not a failed run
        res["asr_note"] = f"ASR failed: {type(e).__name__}: {e}"
        return
    res["asr_rate"] = count.rate
    res["asr"] = {"heard": heard, **asdict(count)}
    res["asr_settings"] = asr.transcriber().settings()

"""Background work: every model call of the GUI runs here, in a worker thread, never on the GUI thread.

`Worker(fn)` runs `fn(emit, should_stop)` in its own thread; `emit(kind, payload)` reaches the GUI thread as the
`event` signal, and the outcome arrives as `done(result)`, `failed(message)` or `cancelled()`.
`synthesize_precisions` is the Synthesize job: one result dict per precision, measured with the library API.
`Intelligibility` holds the ASR (evaluation.asr) of a window's session, loaded once, on first use, in a worker.
"""

from __future__ import annotations

import contextlib
import copy
import queue
import re
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
    model: str | None  # the model the precisions run on (None: the shipped voice); an artifact's source model
    device: str
    precisions: list[str]  # recipes applied to `model` at load
    text: str
    speaker: object = None  # as typed (a name, seed, string or file), or a toolkit.speakers.SampleSpeaker
    seed: int = 0
    params: object = None  # toolkit.SamplingParams
    dnsmos: bool = True
    asr: bool = True  # WER/CER of each utterance against the text, by an offline ASR (the asr extra)
    time_to_first_audio: bool = True
    control_tokens: bool = False  # read [laugh], [uv_break], ... as controls, not as text
    refine: bool = False  # rewrite the text with the GPT's text head first (ChatTTS's refine_text)
    refine_prompt: str = ""  # e.g. [oral_2][laugh_0][break_6]
    reference: object = None  # an FP32 Utterance of the same sentence, from an earlier run
    intelligibility: "Intelligibility | None" = None  # the window's ASR session; None: one for this job
    key: tuple = field(default_factory=tuple)
    artifacts: dict[str, str] = field(default_factory=dict)  # {row label: quantized artifact or ONNX folder}, as is
    noise_floor: bool = False  # also FP32 at seed + 1, scored against FP32 at seed: sampling's own spread
    group: str = ""  # another model added to the comparison: its name, which prefixes its rows (row_name)
    incomparable: str = ""  # why this group has no FP32 of its own to compare with (its rows say so)


def row_name(group: str, name: str) -> str:
    """A row's label: the precision (or artifact) name, after its model's name for a model added to the comparison."""
    return f"{group} · {name}" if group else name


def synthesize_groups(jobs: list[SynthJob], emit, should_stop) -> list[dict]:
    """synthesize_precisions for each job in turn (the window's model, then each model added to the comparison),
    with one progress bar over them all."""
    out = []
    for i, job in enumerate(jobs):

        def scaled(kind, payload=None, i=i):
            if kind == "progress":
                frac, label = payload
                payload = ((i + frac) / len(jobs), label)
            emit(kind, payload)

        out += synthesize_precisions(job, scaled, should_stop)
    return out


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


def _manifest(root: Path) -> dict:
    import json

    for name in ("onnx_manifest.json", "manifest.json"):
        if (root / name).is_file():
            try:
                return json.loads((root / name).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return {}
    return {}


def model_kind(path: str | None) -> tuple[str, str]:
    """(kind, description) of a model path: shipped | ttsq | artifact | chattts | onnx | missing | invalid."""
    from toolkit import checkpoint
    from toolkit.synthesizer import DEFAULT_MODEL

    root = Path(path) if path else DEFAULT_MODEL
    if not root.exists():
        return "missing", f"not found: {root}"
    if root.is_dir() and any(root.glob("*.onnx")) and not (root / "manifest.json").is_file():
        return "onnx", f"exported ONNX folder ({_manifest(root).get('precision', '?')})"
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


def source_of(path: str) -> tuple[bool, str | None, str]:
    """The model an artifact or ONNX folder was made from, as its manifest names it: (known, model path for
    SynthJob.model (None: the shipped voice), what to tell the user)."""
    from toolkit.synthesizer import DEFAULT_MODEL, source_path

    name = _manifest(Path(path)).get("source")
    src = source_path(name)
    if src is None:
        why = f"its source model {name} is no longer there" if name else "it does not record its source model"
        return False, None, why
    if src.resolve() == DEFAULT_MODEL.resolve():
        return True, None, "shipped voice"
    return True, str(src), str(src)


def model_voices(path: str | None) -> list[str]:
    """The named voices of a model, read from its manifest or its weights' header (nothing is loaded)."""
    from toolkit.synthesizer import DEFAULT_MODEL

    root = Path(path) if path else DEFAULT_MODEL
    m = _manifest(root) if root.is_dir() else {}
    names = list(m.get("voices") or [])  # an ONNX export's
    if not names and (root / "model.safetensors").is_file():  # a ttsq folder's: the voices its weights hold
        try:
            from safetensors import safe_open

            with safe_open(str(root / "model.safetensors"), "pt") as f:
                names = [k[len("voice.") :] for k in f.keys() if k.startswith("voice.")]
        except Exception:  # noqa: BLE001 -- a broken file is reported when it is loaded, not here
            names = []
    if not names:  # the voices it was trained with, less those withdrawn (training.voice.withdraw)
        voice = m.get("voice") or {}
        names = [n for n in voice.get("speakers", []) if n not in voice.get("withdrawn", [])]
    default = m.get("default_voice")
    return [str(n) for n in sorted(names, key=lambda n: n != default)]  # the default first, as synthesis takes it


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

    def synthesize(self, text, *, should_stop=None, progress=None, **kwargs):
        if should_stop is not None and should_stop():
            raise InterruptedError("synthesis cancelled")
        return self.edge.synthesize(text, **kwargs)

    def stream(self, text, **kwargs):
        return self.edge.stream(text, **kwargs)


def _load_onnx(path: str, device: str):
    return _EdgeAdapter(path, device)


STEPS_PER_CHAR = 3.5  # GPT steps per character of English speech (about 13 characters a second at 46.9 steps/s)


@contextlib.contextmanager
def _warnings_as_events(emit, label: str):
    """This run's warnings, each as a ("warning", "label: message") event while the run goes on."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        emit("warning", f"{label}: " + re.sub(r"^text \d+: ", "", str(w.message)))


def synthesize_precisions(job: SynthJob, emit, should_stop) -> list[dict]:
    """Each precision of job.model, then each of job.artifacts as it is: load, warm up, synthesize (with progress
    per chunk of GPT steps, and cancel), time to first audio (stream), then MCD against FP32, DNSMOS and the ASR
    from evaluation. Emits ("result", dict) as each one is ready, and ("floor", dict) once FP32 at another seed
    is scored (job.noise_floor)."""
    import torch

    from toolkit.precision import state_bytes
    from toolkit.synthesizer import Synthesizer, load_model

    kind, _ = model_kind(job.model)
    if job.precisions and kind in ("missing", "invalid"):
        from toolkit.checkpoint import detect_layout

        detect_layout(Path(job.model or ""))  # raises the library's own message
    for label, folder in job.artifacts.items():
        if model_kind(folder)[0] in ("missing", "invalid"):
            from toolkit.checkpoint import detect_layout

            detect_layout(Path(folder))
    ordered = [FP32] + [p for p in job.precisions if p != FP32] if FP32 in job.precisions else list(job.precisions)
    runs = [(p, None) for p in ordered] + list(job.artifacts.items())  # (row label, None | folder run as is)
    if not runs:
        raise ValueError("tick at least one precision in the Precisions list")
    if not job.text.strip():
        raise ValueError("type a sentence to synthesize")
    floor_after = FP32 in ordered or job.reference is not None
    phases = 5  # load, warm-up, synthesize, first audio, metrics
    total = len(runs) * phases + (phases if job.noise_floor and floor_after else 0)
    expected = max(STEPS_PER_CHAR * len(job.text), 32.0)

    def step(i: int, phase: int, label: str, frac: float = 0.0):
        emit("progress", ((i * phases + phase + min(frac, 1.0)) / total, label))

    def ticking(i: int, name: str, chunk: int):
        """should_stop, polled once per chunk of GPT steps: also the progress within a sentence batch."""
        state = {"steps": 0, "done": 0, "n": 1}

        def sentence(d, n):
            state.update(done=d, n=n, steps=0)

        def poll():
            state["steps"] += chunk
            d, n, st = state["done"], state["n"], state["steps"]
            within = min(st / expected, 0.95)
            step(
                i,
                2,
                f"{name}: sentence {min(d + 1, n)}/{n}, {st} steps ({st / 46.875:.1f} s of audio)",
                (d + within) / max(n, 1),
            )
            return should_stop()

        return poll, sentence

    same = dict(speaker=job.speaker, seed=job.seed, control_tokens=job.control_tokens)  # every call, every run
    refine = dict(refine=True, refine_prompt=job.refine_prompt) if job.refine else {}  # not in the warm-up
    asr = (job.intelligibility or Intelligibility()) if job.asr else None
    base = None
    reference = job.reference
    results = []
    floor_later = job.noise_floor and FP32 not in ordered and job.reference is not None  # FP32 from an earlier run
    for i, (precision, folder) in enumerate(runs):
        if should_stop():
            raise InterruptedError
        name = row_name(job.group, precision)
        step(i, 0, f"{name}: loading")
        if folder is not None and model_kind(folder)[0] == "onnx":
            synth, size = _load_onnx(folder, job.device), _folder_bytes(Path(folder))
        elif folder is not None:
            synth, size = Synthesizer(folder, job.device), _folder_bytes(Path(folder))
        else:
            if base is None:
                base = load_model(job.model, "cpu")
            last = i == len(ordered) - 1 and not floor_later  # a recipe changes the model in place
            model = base if last else copy.deepcopy(base)
            synth = Synthesizer(model, job.device, None if precision == FP32 else precision)
            size = state_bytes(synth.model)
        dev = synth.device
        step(i, 1, f"{name}: warm-up")
        with warnings.catch_warnings():  # 8 steps nobody listens to always hit their limit: not the user's audio
            warnings.simplefilter("ignore")
            synth.synthesize(
                job.text,
                **same,
                params=replace(job.params, max_new_tokens=min(8, job.params.max_new_tokens), min_new_tokens=0),
                should_stop=should_stop,
            )
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        step(i, 2, f"{name}: synthesizing")
        chunk = getattr(getattr(synth, "engine", None), "chunk", 16)
        poll, sentence = ticking(i, name, chunk)
        t0 = time.perf_counter()
        with _warnings_as_events(emit, name):
            utt = synth.synthesize(job.text, **same, **refine, params=job.params, should_stop=poll, progress=sentence)[
                0
            ]
        latency = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
        ttfa = None
        if job.time_to_first_audio and not should_stop():
            step(i, 3, f"{name}: time to first audio")
            t0 = time.perf_counter()
            with _warnings_as_events(lambda *_: None, name):  # the same audio as above: its warnings are said
                pieces = synth.stream(job.text, **same, **refine, params=job.params)
                for _ in pieces:
                    if dev.type == "cuda":
                        torch.cuda.synchronize(dev)
                    ttfa = time.perf_counter() - t0
                    break
                pieces.close()
        if should_stop():
            raise InterruptedError
        step(i, 4, f"{name}: scoring")
        res = {
            "name": name,
            "precision": precision,
            "group": job.group,
            "recipe": synth.precision,
            "utt": utt,
            "wav": utt.wav,
            "sample_rate": utt.sample_rate,
            "duration_s": utt.duration,
            "steps": utt.steps,
            "hit_limit": utt.hit_limit,
            "timings": dict(utt.timings),
            "latency_s": latency,
            "rtf": latency / max(utt.duration, 1e-9),
            "time_to_first_audio_s": ttfa,
            "size_bytes": size,
            "peak_gpu_bytes": peak,
            "device": str(dev),
            "model": folder if folder is not None else job.model,
            "as_is": folder is not None,
            "refined": utt.text if job.refine else None,
            "mcd_db": None,
            "mcd_note": "",
            "dnsmos_ovrl": None,
            "dnsmos_note": "",
            "asr_rate": None,
            "asr": None,
            "asr_note": "",
            "asr_settings": None,
        }
        _score(res, reference, job.dnsmos)
        if reference is None and job.incomparable:
            res["mcd_note"] = job.incomparable
        res["comparable"] = not job.incomparable
        _score_asr(res, spoken_text(job), asr)
        if precision == FP32:
            reference = utt
        results.append(res)
        emit("result", res)
        if precision == FP32 and job.noise_floor:
            _noise_floor(job, synth, utt, asr, emit, should_stop, lambda label: step(len(runs), 0, label))
        del synth
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if floor_later:
        step(len(runs), 0, "fp32: loading for the noise floor")
        synth = Synthesizer(base if base is not None else load_model(job.model, "cpu"), job.device)
        _noise_floor(job, synth, job.reference, asr, emit, should_stop, lambda label: step(len(runs), 1, label))
    emit("progress", (1.0, "done"))
    return results


def _noise_floor(job: SynthJob, synth, reference, asr, emit, should_stop, say) -> None:
    """FP32 at seed + 1 against FP32 at seed (gui.report.measure_noise_floor), scored like a result: how far apart
    two equally good renditions of this sentence are, so that a precision's gap to FP32 can be read against it."""
    from . import report

    fp32 = row_name(job.group, f"fp32 at seed {job.seed + 1}")
    say(f"{fp32}: noise floor")
    with _warnings_as_events(emit, fp32):
        floor = report.measure_noise_floor(job, reference, should_stop=should_stop, synth=synth)
    res = {
        "name": "noise floor",
        "wav": floor["utt"].wav,
        "sample_rate": floor["utt"].sample_rate,
        "dnsmos_ovrl": None,
        "dnsmos_note": "",
        "asr_rate": None,
        "asr": None,
        "asr_note": "",
    }
    _score(res, None, job.dnsmos)
    _score_asr(res, spoken_text(job), asr)
    floor.update(
        seed=job.seed + 1,
        mcd_db=floor["per"].get(report.RID),
        dnsmos_ovrl=res["dnsmos_ovrl"],
        asr_rate=res["asr_rate"],
        asr=res["asr"],
        group=job.group,
    )
    emit("floor", floor)


def _score(res: dict, reference, with_dnsmos: bool) -> None:
    """MCD (DTW, SPTK settings) against the FP32 utterance of the same sentence, and DNSMOS: evaluation.metrics."""
    from evaluation import metrics

    from .report import is_reference

    sr = res["sample_rate"]
    if res["name"] == "noise floor":
        pass
    elif is_reference(res):
        res["mcd_db"], res["mcd_note"] = 0.0, "the reference"
    elif reference is None:
        res["mcd_note"] = "no FP32 result for this sentence: tick fp32 in the Precisions list to compare"
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

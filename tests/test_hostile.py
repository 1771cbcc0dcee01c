"""Hostile inputs and faults (issue 40, item 9): outputs that are links or devices, manifests that point outside
their folder, non-finite logits, huge or binary texts, errors that name the problem, killed runs' leftovers,
long texts streamed to the file."""

import contextlib
import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from toolkit import SamplingParams, load_model
from toolkit.checkpoint import CheckpointError, save_ttsq
from toolkit.fileio import OutputExistsError, atomic_dir, atomic_file, clean_stale

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "chattts_tiny"


def ttsq(*args, stdin: bytes | None = None, cwd=None, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *map(str, args)],
        input=stdin,
        capture_output=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def onnx_dir(tiny_dir, tmp_path_factory):
    from toolkit.export import export_onnx

    return export_onnx(tiny_dir, "fp32", tmp_path_factory.mktemp("onnx") / "fp32")


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# --- outputs: one atomic writer, regular files only -------------------------------------------------------
@pytest.mark.parametrize("engine", ["torch", "onnx"])
def test_synth_never_writes_through_a_link(engine, tiny_dir, onnx_dir, tmp_path):
    """The edge runtime wrote in place with sf.write: `-o link.wav --force` overwrote the link's target, and a
    dangling link created its target. Both engines now refuse links before synthesizing, even with --force."""
    model = tiny_dir if engine == "torch" else onnx_dir
    target = tmp_path / "precious.txt"
    target.write_text("mine")
    link = tmp_path / "link.wav"
    link.symlink_to(target)
    r = ttsq("synth", "hello.", "-o", link, "--model", model, "--max-steps", "4", "--force", "--device", "cpu")
    assert r.returncode == 2 and b"symbolic link" in r.stderr and b"Traceback" not in r.stderr, r.stderr[-800:]
    assert target.read_text() == "mine" and link.is_symlink()
    dangling = tmp_path / "dangling.wav"
    dangling.symlink_to(tmp_path / "created-through-link.wav")
    r = ttsq("synth", "hello.", "-o", dangling, "--model", model, "--max-steps", "4", "--device", "cpu")
    assert r.returncode == 2 and b"dangling" in r.stderr
    assert not (tmp_path / "created-through-link.wav").exists()
    # and the runtime's own writer is the atomic one: a plain file is written, mode from the umask
    from toolkit.runtime import write_wav

    with umask(0o022):
        out = write_wav(tmp_path / "edge.wav", np.zeros(240, np.float32), 24000)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    with pytest.raises(OutputExistsError, match="symbolic link"):
        write_wav(link, np.zeros(240, np.float32), 24000, force=True)
    assert target.read_text() == "mine"


def test_device_nodes_and_pipes_are_never_replaced(tmp_path):
    """`-o /dev/null --force` as root replaced the system's /dev/null with a regular file."""
    from toolkit.audio import write_wav

    fifo = tmp_path / "pipe.wav"
    os.mkfifo(fifo)
    to_null = tmp_path / "null.wav"
    to_null.symlink_to("/dev/null")
    for path in ("/dev/null", fifo, to_null):
        with pytest.raises(OutputExistsError, match="not a regular file|symbolic link"):
            write_wav(path, np.zeros(10, np.float32), 24000, force=True)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode) and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    r = ttsq("synth", "hello.", "-o", "/dev/null", "--force", "--max-steps", "2")
    assert r.returncode == 2 and b"not a regular file" in r.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_modes_follow_the_umask_and_force_keeps_the_old_mode(tiny_dir, tmp_path):
    """Every WAV was created 0600 and every artifact folder 0700 whatever the umask; --force over a 0644 file left
    a 0600 file."""
    from toolkit.audio import write_wav

    wav = np.zeros(100, np.float32)
    with umask(0o022):
        assert stat.S_IMODE(write_wav(tmp_path / "a.wav", wav, 24000).stat().st_mode) == 0o644
        out = save_ttsq(load_model(tiny_dir), tmp_path / "model")
        assert stat.S_IMODE(out.stat().st_mode) == 0o755
    with umask(0o027):
        assert stat.S_IMODE(write_wav(tmp_path / "b.wav", wav, 24000).stat().st_mode) == 0o640
        shared = tmp_path / "shared.wav"
        shared.write_bytes(b"old")
        shared.chmod(0o664)
        write_wav(shared, wav, 24000, force=True)
        assert stat.S_IMODE(shared.stat().st_mode) == 0o664 and shared.read_bytes()[:4] == b"RIFF"


def test_a_254_character_name_is_written_and_a_too_long_one_fails_first(tiny_dir, tmp_path):
    """The temp name (".NAME.XXXXXXXX") made a 254-character file name fail after the whole synthesis."""
    name = "n" * 250 + ".wav"
    r = ttsq("synth", "hello.", "-o", tmp_path / name, "--model", tiny_dir, "--max-steps", "4", "--device", "cpu")
    assert r.returncode == 0, r.stderr[-800:]
    assert (tmp_path / name).stat().st_size > 44
    with atomic_dir(tmp_path / ("d" * 254)) as tmp:  # folders too: the commit lock's name once added 6
        (tmp / "manifest.json").write_text("{}")
    assert (tmp_path / ("d" * 254) / "manifest.json").is_file()
    r = ttsq("synth", "hello.", "-o", tmp_path / ("n" * 300 + ".wav"), "--model", tiny_dir, "--device", "cpu")
    assert r.returncode == 2 and b"choose a shorter name" in r.stderr


def test_a_failed_write_leaves_nothing_and_keeps_the_old_file(tmp_path):
    old = tmp_path / "out.wav"
    old.write_bytes(b"previous")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_file(old, force=True) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("boom")
    assert old.read_bytes() == b"previous" and sorted(p.name for p in tmp_path.iterdir()) == ["out.wav"]


# --- killed runs' leftovers -------------------------------------------------------------------------------
def test_stale_temporaries_are_cleaned_but_a_live_writers_are_kept(tiny_dir, tmp_path, monkeypatch):
    dead, live = dead_pid(), os.getppid()  # pytest's parent (a shell or make) outlives this test
    leftovers = [tmp_path / f".ttsq-{dead}-abcdefgh.tmp", tmp_path / ".model.tmp-k2j3h4g5"]
    for p in leftovers:
        p.mkdir()
        (p / "model.safetensors").write_bytes(b"x" * 1000)
    stamp = time.time() - 7200  # legacy names carry no pid: only an hour's quiet makes them stale
    for p in (leftovers[1], leftovers[1] / "model.safetensors"):
        os.utime(p, (stamp, stamp))
    kept = [tmp_path / f".ttsq-{live}-zyxwvuts.tmp", tmp_path / ".other.tmp-k2j3h4g5", tmp_path / ".model.tmp-fresh123"]
    for p in kept:
        p.mkdir()
    os.utime(kept[1], (stamp, stamp))  # another output's: not this run's to judge
    (tmp_path / f".ttsq-{dead}-qwertyui.tmp").write_bytes(b"half a wav")  # a killed synth's WAV
    save_ttsq(load_model(tiny_dir), tmp_path / "model")
    assert not any(p.exists() for p in leftovers) and not (tmp_path / f".ttsq-{dead}-qwertyui.tmp").exists()
    assert all(p.exists() for p in kept)
    # the export's scratch folder in the system temp folder
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "systmp"))
    (tmp_path / "systmp").mkdir()
    scratch = tmp_path / "systmp" / f"ttsq-export-{dead}-abcd1234"
    scratch.mkdir()
    (scratch / "gpt.onnx").write_bytes(b"x" * 1000)
    live_scratch = tmp_path / "systmp" / f"ttsq-export-{live}-abcd1234"
    live_scratch.mkdir()
    from toolkit.fileio import work_dir

    with work_dir("export") as work:
        assert Path(work).name.startswith(f"ttsq-export-{os.getpid()}-")
    assert not scratch.exists() and live_scratch.exists()


def test_a_killed_synth_leaves_a_temp_file_the_next_run_removes(tiny_dir, tmp_path):
    text = " ".join(f"Sentence {i} is long enough to take a while." for i in range(40))
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "toolkit.cli",
            "synth",
            text,
            "-o",
            str(tmp_path / "a.wav"),
            "--model",
            str(tiny_dir),
            "--device",
            "cpu",
            "--max-steps",
            "200",
            "--batch-size",
            "1",
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while not any(q.name.startswith(".ttsq-") for q in tmp_path.iterdir()) and time.time() < deadline:
        time.sleep(0.2)
    p.kill()
    p.wait()
    assert [q.name for q in tmp_path.iterdir() if q.name.startswith(".ttsq-")], "the synth never opened its output"
    assert not (tmp_path / "a.wav").exists()
    r = ttsq("synth", "hi.", "-o", tmp_path / "b.wav", "--model", tiny_dir, "--device", "cpu", "--max-steps", "4")
    assert r.returncode == 0
    assert sorted(q.name for q in tmp_path.iterdir()) == ["b.wav"]
    assert clean_stale(tmp_path) == []


# --- manifests: confined, typed -----------------------------------------------------------------------
def _edit_manifest(folder: Path, name: str, edit) -> None:
    m = json.loads((folder / name).read_text())
    edit(m)
    (folder / name).write_text(json.dumps(m))


@pytest.mark.parametrize("bad", ["../../../etc/passwd", "/etc/passwd", "/proc/self/pagemap", "sub/../../x", "link-out"])
def test_manifest_names_stay_inside_the_model_folder(bad, tiny_dir, tmp_path):
    folder = shutil.copytree(tiny_dir, tmp_path / "m")
    (folder / "link-out").symlink_to("/proc/self/pagemap")
    _edit_manifest(folder, "manifest.json", lambda m: m["files"].update({bad: {"bytes": 1, "sha256": "0" * 64}}))
    with pytest.raises(CheckpointError, match="inside the model folder|outside the model folder"):
        load_model(folder)
    r = ttsq("info", folder)  # /proc/self/pagemap hung `ttsq info` (forever: the timeout catches it)
    assert r.returncode == 2 and b"model folder" in r.stderr and b"Traceback" not in r.stderr


def test_model_files_that_are_links_out_or_devices_are_refused(tiny_dir, tmp_path):
    folder = shutil.copytree(tiny_dir, tmp_path / "m")
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to("/dev/zero")
    _edit_manifest(folder, "manifest.json", lambda m: m["files"].pop("tokenizer.json"))
    with pytest.raises(CheckpointError, match="tokenizer.json.*outside the model folder"):
        load_model(folder)


@pytest.mark.parametrize("bad", ["../outside.onnx", "/dev/zero", "/proc/self/pagemap"])
def test_export_manifest_names_stay_inside(bad, onnx_dir, tmp_path):
    from toolkit.runtime import EdgeSynthesizer

    folder = shutil.copytree(onnx_dir, tmp_path / "e")
    _edit_manifest(folder, "onnx_manifest.json", lambda m: m["graphs"]["gpt"].update({"file": bad}))
    with pytest.raises(ValueError, match="model folder"):
        EdgeSynthesizer(folder)
    folder2 = shutil.copytree(onnx_dir, tmp_path / "e2")
    _edit_manifest(folder2, "onnx_manifest.json", lambda m: m["files"].update({bad: {"bytes": 0}}))
    with pytest.raises(ValueError, match="model folder"):
        EdgeSynthesizer(folder2)


@pytest.mark.parametrize(
    "field,value", [("hidden", "256"), ("layers", -1), ("heads", 2.5), ("rms_eps", "x"), ("num_vq", True)]
)
def test_manifest_types_are_checked(field, value, tiny_dir, onnx_dir, tmp_path):
    """ "hidden": "256" gave a TypeError traceback."""
    folder = shutil.copytree(tiny_dir, tmp_path / "m")
    _edit_manifest(folder, "manifest.json", lambda m: m["config"]["gpt"].update({field: value}))
    with pytest.raises(CheckpointError, match=f"GPTConfig.{field} must be"):
        load_model(folder)
    r = ttsq("synth", "hi.", "-o", tmp_path / "x.wav", "--model", folder, "--device", "cpu")
    assert r.returncode == 2 and f"GPTConfig.{field}".encode() in r.stderr and b"Traceback" not in r.stderr
    from toolkit.runtime import EdgeSynthesizer

    exported = shutil.copytree(onnx_dir, tmp_path / "e")
    _edit_manifest(exported, "onnx_manifest.json", lambda m: m["config"]["gpt"].update({field: value}))
    with pytest.raises(ValueError, match=f"GPTConfig.{field} must be"):
        EdgeSynthesizer(exported)


def test_other_manifest_fields_are_checked(tiny_dir, onnx_dir, tmp_path):
    for edit, match in [
        (lambda m: m.update(precision=["fp32"]), "'precision' must be a string"),
        (lambda m: m.update(files=[]), "'files' must be an object"),
        (lambda m: m["files"]["model.safetensors"].update(bytes="12"), "integer bytes"),
    ]:
        folder = tmp_path / f"m{len(list(tmp_path.iterdir()))}"
        shutil.copytree(tiny_dir, folder)
        _edit_manifest(folder, "manifest.json", edit)
        with pytest.raises(CheckpointError, match=match):
            load_model(folder)
    from toolkit.runtime import EdgeSynthesizer

    exported = shutil.copytree(onnx_dir, tmp_path / "e")
    _edit_manifest(exported, "onnx_manifest.json", lambda m: m.update(sample_rate="24000"))
    with pytest.raises(ValueError, match="'sample_rate' must be an integer"):
        EdgeSynthesizer(exported)


# --- non-finite logits ---------------------------------------------------------------------------------
def test_nan_head_fails_at_once_instead_of_speaking_noise_to_the_limit(tiny_dir, tmp_path):
    """With head_code NaN, argmax never gave EOS: synthesis exited 0 with max_new_tokens of garbage."""
    from toolkit import Synthesizer
    from toolkit.synthesizer import NumericalError

    model = load_model(tiny_dir)
    with torch.no_grad():
        model.gpt.head_code.weight[3, 5] = float("nan")
    calls = []
    synth = Synthesizer(model, "cpu")
    real = synth.engine._launch

    def counted(*a, **k):
        for chunk in real(*a, **k):
            calls.append(chunk.start)
            yield chunk

    synth.engine._launch = counted
    with pytest.raises(NumericalError, match="code logits are NaN/inf.*checkpoint itself may be broken"):
        synth.synthesize("hello there.", params=SamplingParams(max_new_tokens=400))
    assert len(calls) <= 2, f"generated {len(calls)} chunks before failing"  # not 400 steps' worth
    nan_dir = save_ttsq(model, tmp_path / "nan-head")
    r = ttsq("synth", "hello.", "-o", tmp_path / "x.wav", "--model", nan_dir, "--device", "cpu", "--max-steps", "400")
    assert r.returncode == 2 and b"code logits are NaN" in r.stderr and not (tmp_path / "x.wav").exists()


def test_nan_head_fails_a_served_request_at_its_first_step(tiny_dir):
    """The server's scheduler steps its own rows: a NaN head fails the request, not 2048 steps later."""
    from toolkit import Synthesizer
    from toolkit.engine import NumericalError
    from toolkit.scheduler import Scheduler

    model = load_model(tiny_dir)
    with torch.no_grad():
        model.gpt.head_code.weight[0, :] = float("nan")
    sched = Scheduler(Synthesizer(model, "cpu"), slots=2, params=SamplingParams(max_new_tokens=400))
    try:
        job = sched.submit("hello there.", seed=1)
        events = list(job.events())
    finally:
        sched.close()
    assert events[-1][0] == "error" and isinstance(events[-1][1], NumericalError), events[-1]
    assert "code logits are NaN" in str(events[-1][1]) and job.steps == 0


def test_nan_head_in_an_export_fails_at_once(tiny_dir, tmp_path):
    from toolkit.export import export_onnx
    from toolkit.runtime import EdgeSynthesizer

    model = load_model(tiny_dir)
    with torch.no_grad():
        model.gpt.head_code.weight[:, 0] = float("nan")
    exported = export_onnx(save_ttsq(model, tmp_path / "nan-head"), "fp32", tmp_path / "e")
    with pytest.raises(FloatingPointError, match="code logits are NaN/inf at step 0"):
        EdgeSynthesizer(exported).synthesize("hello.", params=SamplingParams(max_new_tokens=400))
    r = ttsq("synth", "hello.", "-o", tmp_path / "x.wav", "--model", exported, "--max-steps", "400")
    assert r.returncode == 2 and b"code logits are NaN" in r.stderr and b"Traceback" not in r.stderr


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_temperature_is_refused_at_every_entry_point(value, tiny_dir, onnx_dir, tmp_path):
    from toolkit.runtime import SamplingParams as EdgeParams

    for params in (SamplingParams, EdgeParams):
        with pytest.raises(ValueError, match="temperature must be a finite number"):
            params(temperature=float(value))
        with pytest.raises(ValueError, match="temperature must be a finite number"):
            params(temperature=(0.3, float(value), 0.3, 0.3))
    for model in (tiny_dir, onnx_dir):
        r = ttsq(
            "synth", "hi.", "-o", tmp_path / "x.wav", "--model", model, f"--temperature={value}", "--device", "cpu"
        )
        assert r.returncode == 2 and b"temperature must be a finite number" in r.stderr


# --- texts: length first, binary refused, foreign scripts warned -------------------------------------------
def test_huge_texts_fail_fast_with_small_memory(tiny_dir, tmp_path):
    """A 1 MB calibration line reached 5 GB of RAM before its error, a 100 MB one took all 24 GB."""
    line = json.dumps({"id": "x", "text": "word " * 20_000_000, "language": "en", "length": "long", "speaker": "a"})
    big = tmp_path / "big.jsonl"
    big.write_text(line + "\n")  # 100 MB
    # the peak from /proc/self/status's VmHWM: getrusage's ru_maxrss also counts the parent's (pytest's) RSS at fork,
    # which Linux carries across exec, so it read 2.5 GB under a long test session
    script = (
        "import sys\nfrom toolkit.cli import main\n"
        "rc = main(sys.argv[1:])\n"
        "hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM:')).split()[1]\n"
        "print('peak', int(hwm) // 1024, flush=True)\n"
        "sys.exit(rc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.time()
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            "quantize",
            "--model",
            str(tiny_dir),
            "--precision",
            "int8",
            "--calib",
            str(big),
            "--out",
            str(tmp_path / "q"),
        ],
        capture_output=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 2 and b"longer than 64 KiB" in r.stderr, r.stderr[-800:]
    peak = int(r.stdout.split()[-1])
    assert peak < 1500, f"{peak} MiB to refuse a long line"  # torch itself takes ~400
    from toolkit.textsets import load_text_set

    mid = tmp_path / "mid.jsonl"
    mid.write_text(
        json.dumps({"id": "x", "text": "word " * 2000, "language": "en", "length": "long", "speaker": "a"}) + "\n"
    )
    with pytest.raises(ValueError, match="at most 4096"):
        load_text_set(mid)
    # synth: standard input is read only up to the limit, and the text is refused before the model loads
    r = ttsq("synth", "-", "-o", tmp_path / "x.wav", "--model", tiny_dir, stdin=b"word " * 2_000_000)
    assert r.returncode == 2 and b"at most 500,000 are read" in r.stderr
    # calibration through the library: the prompt's length is checked before the front end and tokenizer run
    from toolkit.precision.calibration import collect

    with pytest.raises(ValueError, match="prompt is 1,000,000 characters"):
        collect(load_model(tiny_dir), ["a" * 1_000_000], ["seed:1"])
    assert time.time() - t0 < 240


def test_binary_standard_input_is_refused(tiny_dir, tmp_path):
    """4 KB of random bytes became 285 s of audio."""
    noise = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    r = ttsq("synth", "-", "-o", tmp_path / "x.wav", "--model", tiny_dir, stdin=noise)
    assert r.returncode == 2 and b"not text" in r.stderr and not (tmp_path / "x.wav").exists()
    from toolkit.text import TextError, normalize

    with pytest.raises(TextError, match="not text"):
        normalize(noise.decode("utf-8", errors="surrogateescape"))
    for fine in ("Hello there, how are you?", "你好，世界。", "emoji 😀 and ☃ symbols here", "tab\tand\nnewline"):
        normalize(fine)


def test_scripts_outside_the_models_languages_are_warned():
    pytest.importorskip("ctypes")
    from toolkit.frontend import FrontendError, frontend_for

    try:
        fe = frontend_for("espeak")
    except FrontendError:
        pytest.skip("espeak-ng is not installed")
    for text, script in [
        ("こんにちは", "Hiragana"),
        ("안녕하세요", "Hangul"),
        ("مرحبا", "Arabic"),
        ("Привет", "Cyrillic"),
    ]:
        with pytest.warns(UserWarning, match=f"{script} letters, outside this model's languages"):
            fe(f"hello {text}")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fe("Hello there, 你好 world, café naïve.")


# --- errors that name the problem ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "key,file",
    [
        ("layers.0.self_attn.q_proj.weight", "gpt/model.safetensors"),
        ("layers.1.mlp.down_proj.weight", "gpt/model.safetensors"),
        ("emb_code.2.weight", "Embed.safetensors"),
    ],
)
def test_wrong_shaped_official_tensor_is_named(key, file, tmp_path):
    from safetensors.torch import load_file, save_file

    from toolkit.checkpoint import load_official

    root = tmp_path / "chattts"
    shutil.copytree(FIXTURE / "asset", root / "asset")
    f = root / "asset" / file
    state = load_file(str(f))
    was = tuple(state[key].shape)
    state[key] = torch.zeros(was[0] + 3, *was[1:])
    save_file(state, str(f))
    with pytest.raises(CheckpointError) as e:
        load_official(root)
    msg = str(e.value)
    assert f"{key} has shape {(was[0] + 3, *was[1:])}, expected {was}" in msg, msg
    other = "layers.1." if key.startswith("layers.0.") else "layers.0."
    assert other not in msg and "Sizes of tensors" not in msg


def test_empty_calibration_and_evaluation_sets_are_named(tiny_dir, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    calib = ROOT / "calibration_sets" / "calib.jsonl"
    r = ttsq("quantize", "--model", tiny_dir, "--precision", "int8", "--calib", empty, "--out", tmp_path / "q")
    assert r.returncode == 2 and b"holds no records; calibration needs" in r.stderr
    r = ttsq(
        "quantize",
        "--model",
        tiny_dir,
        "--precision",
        "int8",
        "--calib",
        calib,
        "--limit",
        "0",
        "--out",
        tmp_path / "q",
    )
    assert r.returncode == 2 and b"--limit 0 leaves no text for calibration" in r.stderr
    r = ttsq("export", "--model", tiny_dir, "--precision", "int8", "--calib", empty, "--out", tmp_path / "e")
    assert r.returncode == 2 and b"holds no records" in r.stderr and b"Traceback" not in r.stderr
    from evaluation.runner import EvalConfig, run_evaluation

    with pytest.raises(ValueError, match="holds no records; evaluation needs"):
        run_evaluation(EvalConfig(model=str(tiny_dir), precisions=["fp32"], text_set=str(empty), out=str(tmp_path)))
    with pytest.raises(ValueError, match="holds no records; scoring needs"):
        from evaluation.score import score_folder

        score_folder(tmp_path, empty, dnsmos=False)


@pytest.fixture
def small_disk(tmp_path):
    """A real 3 MiB filesystem (tmpfs; needs mount rights, as root in a container)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_names_the_path_and_keeps_the_old_artifact(tiny_dir, small_disk):
    """A full disk during quantize gave "[enforce fail at inline_container.cc:672]"."""
    from toolkit.quantize_job import quantize_to_artifact

    free = shutil.disk_usage(small_disk).free
    (small_disk / "filler").write_bytes(b"\0" * max(0, free - 200_000))
    with pytest.raises(OSError) as e:
        quantize_to_artifact(tiny_dir, "int8", small_disk / "q")
    assert e.value.errno == errno.ENOSPC and "No space left on device (ENOSPC)" in str(e.value)
    assert str(small_disk) in str(e.value) and "inline_container" not in str(e.value)
    with pytest.raises(OSError, match=r"ENOSPC\) to write .*small"):
        save_ttsq(load_model(tiny_dir), small_disk / "m")
    with pytest.raises(OSError, match="ENOSPC"):
        from toolkit.audio import write_wav

        write_wav(small_disk / "x.wav", np.zeros(1_000_000, np.float32), 24000)
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]


# --- long texts stream to the file ---------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["torch", "onnx"])
def test_long_text_streams_to_the_file_with_progress_by_text(engine, tiny_synth, onnx_dir, tmp_path):
    import soundfile as sf

    from toolkit.audio import wav_writer
    from toolkit.plan import synthesize_to
    from toolkit.runtime import EdgeSynthesizer

    synth = tiny_synth if engine == "torch" else EdgeSynthesizer(onnx_dir, threads=2)
    text = " ".join(f"Sentence number {i} says {'a' * (i % 7)} something." for i in range(20))
    params = SamplingParams(max_new_tokens=8)
    pieces, progress = [], []
    with wav_writer(tmp_path / "long.wav", synth.sample_rate) as write:

        def spy(wav):
            pieces.append(len(wav))
            assert not (tmp_path / "long.wav").exists()  # nothing at the name until the end
            write(wav)

        r = synthesize_to(
            synth, text, spy, seed=3, batch_size=4, params=params, progress=lambda d, t: progress.append((d, t))
        )
    wav, sr = sf.read(tmp_path / "long.wav", dtype="float32")
    assert sr == synth.sample_rate and len(wav) == r.samples == sum(pieces) and len(pieces) == 20
    assert len(progress) == 5 and progress[-1][0] == progress[-1][1]  # one update per group of 4 sentences
    done = [d for d, _ in progress]
    assert done == sorted(done) and all(abs(d / progress[-1][1] - (k + 1) / 5) < 0.15 for k, d in enumerate(done))
    # a text of at most batch_size sentences is the same audio as synthesize() gives
    short = "First sentence here. And the second one."
    whole = synth.synthesize(short, seed=5, params=params)[0].wav
    got = []
    synthesize_to(synth, short, got.append, seed=5, params=params)
    np.testing.assert_allclose(np.concatenate(got), whole, atol=1e-6)

"""Failures while writing leave nothing half-written and keep what was there; hostile inputs get clear errors."""

import errno
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from toolkit import SamplingParams, load_model
from toolkit.checkpoint import save_ttsq
from toolkit.fileio import OutputExistsError, atomic_dir
from toolkit.text import normalize, split_sentences


def leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(".")]


def test_full_disk_keeps_the_previous_artifact(tiny_dir, tmp_path, monkeypatch):
    model = load_model(tiny_dir)
    out = save_ttsq(model, tmp_path / "m")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def disk_full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("safetensors.torch.save_file", disk_full)
    with pytest.raises(OSError, match="No space left"):
        save_ttsq(model, out, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert leftovers(tmp_path) == []


def test_two_writers_one_wins_the_other_is_told(tmp_path):
    out = tmp_path / "artifact"
    gate = threading.Barrier(2)
    errors = []

    def writer(tag):
        try:
            with atomic_dir(out) as tmp:
                (tmp / "who").write_text(tag)
                gate.wait()
        except OutputExistsError as e:
            errors.append(str(e))
        except Exception as e:  # anything else is a bug; keep it for the assertion message
            errors.append(f"unexpected {e!r}")

    threads = [threading.Thread(target=writer, args=(t,)) for t in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 1 and "another writer" in errors[0], errors
    assert (out / "who").read_text() in "ab"
    assert leftovers(tmp_path) == []


def test_unwritable_destination_is_named(tiny_dir, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(PermissionError, match="cannot write"):
        save_ttsq(load_model(tiny_dir), blocker / "sub" / "m")


def test_huge_text_is_split_never_truncated():
    text = ("Sentence number %d is here, with a clause; and more words. " * 1700) % tuple(range(1700))
    assert len(text) > 100_000
    pieces = split_sentences(normalize(text))
    assert all(len(p) <= 120 for p in pieces) and len(pieces) > 800
    assert "".join(pieces).replace(" ", "") == normalize(text).replace(" ", "")


def test_unsupported_characters_still_speak(tiny_synth):
    u = tiny_synth.synthesize("emoji 😀 and ☃ symbols \u200b here.", params=SamplingParams(max_new_tokens=6))[0]
    assert np.isfinite(u.wav).all() and u.steps > 0


def test_out_of_range_token_ids_are_reported(tiny_dir):
    from toolkit import Synthesizer

    s = Synthesizer(tiny_dir, "cpu")
    s.model.gpt.cfg.num_text_tokens = 5  # as if the tokenizer belonged to another model
    with pytest.raises(ValueError, match="wrong tokenizer"):
        s.synthesize("hello")


def test_out_of_memory_is_named_and_the_next_request_is_served(tiny_dir, monkeypatch):
    """A real allocator failure (a KV cache far beyond this machine's memory) -> OutOfMemory with the fix,
    then the same synthesizer serves the next request exactly as a fresh one would."""
    from toolkit import OutOfMemory, Synthesizer
    from toolkit.models.gpt import GPT

    s = Synthesizer(tiny_dir, "cpu")
    params = SamplingParams(max_new_tokens=20)
    expected = Synthesizer(tiny_dir, "cpu").synthesize("hello there.", seed=3, params=params)[0].wav
    real = GPT.setup_caches
    monkeypatch.setattr(
        GPT, "setup_caches", lambda self, batch, length, *a, **k: real(self, batch * 10**9, length, *a, **k)
    )
    with pytest.raises(OutOfMemory, match="smaller batch_size"):
        s.synthesize(["a big batch."] * 4, params=params)
    with pytest.raises(OutOfMemory, match="serves the next request"):
        next(iter(s.stream("streamed too.", params=params)))
    monkeypatch.setattr(GPT, "setup_caches", real)
    np.testing.assert_array_equal(s.synthesize("hello there.", seed=3, params=params)[0].wav, expected)


def test_cli_reports_out_of_memory_without_traceback(tiny_dir, tmp_path, monkeypatch, capsys):
    from toolkit import cli
    from toolkit.models.gpt import GPT

    def no_memory(*a, **k):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 TB")

    monkeypatch.setattr(GPT, "setup_caches", no_memory)
    assert (
        cli.main(["synth", "hello.", "-o", str(tmp_path / "x.wav"), "--model", str(tiny_dir), "--device", "cpu"]) != 0
    )
    err = capsys.readouterr().err
    assert "ran out of memory" in err and "Traceback" not in err
    assert not (tmp_path / "x.wav").exists()


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_bit_flip_is_reported_and_nan_never_reaches_a_wav(tiny_dir, tmp_path):
    from toolkit import Synthesizer, cli
    from toolkit.synthesizer import NumericalError

    bad = _copy(tiny_dir, tmp_path / "flipped")
    data = bytearray((bad / "model.safetensors").read_bytes())
    data[-9] ^= 0x7F  # inside the last tensor's bytes: the header still parses
    (bad / "model.safetensors").write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="differs from the sha256"):
        load_model(bad)
    model = load_model(tiny_dir)
    with torch.no_grad():
        model.vocos.blocks[0].pwconv1.weight[0, 0] = float("nan")  # what a flipped exponent bit can make
    with pytest.raises(NumericalError, match="vocos produced NaN.*checkpoint itself may be broken"):
        Synthesizer(model, "cpu").synthesize("hello.", params=SamplingParams(max_new_tokens=6))
    nan_dir = save_ttsq(model, tmp_path / "nan-model")
    wav = tmp_path / "out.wav"
    assert cli.main(["synth", "hello.", "-o", str(wav), "--model", str(nan_dir), "--device", "cpu"]) != 0
    assert not wav.exists()


def test_checkpoint_of_another_architecture_is_named(tiny_dir, tmp_path):
    import json

    from safetensors.torch import save_file

    from toolkit.checkpoint import CheckpointError, write_manifest

    bert = {
        "bert.embeddings.word_embeddings.weight": torch.zeros(10, 4),
        "bert.encoder.layer.0.attention.self.query.weight": torch.zeros(4, 4),
    }
    hf = tmp_path / "hf-bert"  # a Hugging Face folder of another model
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "bert"}')
    save_file(bert, str(hf / "model.safetensors"))
    with pytest.raises(CheckpointError, match="neither a ttsq model folder.*nor an official ChatTTS"):
        load_model(hf)
    other = _copy(tiny_dir, tmp_path / "bert-in-ttsq")  # another model's weights behind a consistent manifest
    save_file(bert, str(other / "model.safetensors"))
    fields = {
        k: v
        for k, v in json.loads((other / "manifest.json").read_text()).items()
        if k not in ("format", "format_version", "files")
    }
    write_manifest(other, fields)
    with pytest.raises(CheckpointError) as e:
        load_model(other)
    assert "missing" in str(e.value) and "unexpected" in str(e.value) and "bert.embeddings" in str(e.value)


def test_missing_tokenizer_is_named(tiny_dir, tmp_path):
    from toolkit.checkpoint import CheckpointError

    bad = _copy(tiny_dir, tmp_path / "no-tokenizer")
    (bad / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="tokenizer.json.*missing"):
        load_model(bad)


def test_very_large_batch_works(tiny_synth):
    texts = [f"sentence {i}." for i in range(256)]
    utts = tiny_synth.synthesize(texts, batch_size=256, params=SamplingParams(max_new_tokens=3))
    assert len(utts) == 256 and all(np.isfinite(u.wav).all() and u.wav.size for u in utts)


def test_force_replaces_only_a_ttsq_folder(tmp_path):
    """--force on quantize/export/save once deleted any folder it was pointed at, a user's documents included."""
    from toolkit.fileio import OutputExistsError, atomic_dir

    docs = tmp_path / "mydocs"
    docs.mkdir()
    (docs / "thesis.txt").write_text("years of work")
    with pytest.raises(OutputExistsError, match="not a ttsq"):
        with atomic_dir(docs, force=True) as tmp:
            (tmp / "manifest.json").write_text("{}")
    assert (docs / "thesis.txt").read_text() == "years of work" and len(list(tmp_path.iterdir())) == 1
    a_file = tmp_path / "notes.txt"
    a_file.write_text("keep")
    with pytest.raises(OutputExistsError):
        with atomic_dir(a_file, force=True):
            pass
    assert a_file.read_text() == "keep"
    artifact = tmp_path / "q"
    for content in ("old", "new"):
        with atomic_dir(artifact, force=True) as tmp:
            (tmp / "manifest.json").write_text(content)
    assert (artifact / "manifest.json").read_text() == "new"


@pytest.mark.parametrize("field", ["temperature", "top_p", "repetition_penalty"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_sampling_parameters_are_refused(field, value):
    with pytest.raises(ValueError, match=f"{field} must be a finite number"):
        SamplingParams(**{field: value})

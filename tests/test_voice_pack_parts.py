"""benchmarks/voice_pack_parts.py: a pack split into parts and joined again is the original, array for array."""

import importlib.util
import json
from pathlib import Path

import numpy as np

from training.voice.corpus import load_pack, save_pack

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("voice_pack_parts", ROOT / "benchmarks" / "voice_pack_parts.py")
parts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(parts)


def _pack(tmp: Path, n: int = 7) -> Path:
    rng = np.random.default_rng(0)
    steps = rng.integers(3, 9, n)
    toks = rng.integers(4, 12, n)
    off = lambda lens: np.cumsum([0, *lens]).astype(np.int64)  # noqa: E731
    wav_utt = np.array([1, 4, 5], np.int32)
    wav_lens = rng.integers(10, 30, len(wav_utt))
    folder = tmp / "pack"
    folder.mkdir()
    save_pack(
        folder,
        mel=np.zeros((0, 100), np.uint8),
        mel_off=off(2 * steps),
        ids=rng.integers(0, 100, int(toks.sum())).astype(np.int16),
        ids_off=off(toks),
        spk=rng.integers(0, 6, n).astype(np.int16),
        lang=rng.integers(0, 2, n).astype(np.int8),
        wav=rng.integers(-3000, 3000, int(wav_lens.sum())).astype(np.int16),
        wav_off=off(wav_lens),
        wav_utt=wav_utt,
        codes=rng.integers(0, 626, (int(steps.sum()), 4)).astype(np.int16),
        codes_off=off(steps),
    )
    (folder / "pack.json").write_text(json.dumps({"utterances": n, "speakers": ["a", "b"]}))
    (folder / "tokenizer.json").write_text("{}")
    return folder


def test_split_then_join_gives_back_the_pack(tmp_path):
    src = _pack(tmp_path)
    parts.main(["split", str(src), "--at", "3", str(tmp_path / "a"), str(tmp_path / "b")])
    a, b = load_pack(tmp_path / "a"), load_pack(tmp_path / "b")
    assert (len(a["spk"]), len(b["spk"])) == (3, 4)
    assert list(b["wav_utt"]) == [1, 2]  # utterances 4 and 5 of the original, renumbered in part b
    parts.main(["join", str(tmp_path / "j"), str(tmp_path / "a"), str(tmp_path / "b")])
    orig, joined = load_pack(src), load_pack(tmp_path / "j")
    assert joined.keys() == orig.keys()
    for k in orig:
        if k != "info":
            assert orig[k].dtype == joined[k].dtype, k
            np.testing.assert_array_equal(orig[k], joined[k], err_msg=k)
    assert joined["info"]["utterances"] == 7


def test_split_point_outside_the_pack_is_refused(tmp_path, capsys):
    import pytest

    src = _pack(tmp_path)
    with pytest.raises(SystemExit):
        parts.main(["split", str(src), "--at", "7", str(tmp_path / "a"), str(tmp_path / "b")])
    assert "between 1 and 6" in capsys.readouterr().err

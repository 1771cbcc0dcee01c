"""Split a voice corpus pack into parts by utterance, and join parts back into one pack.

A device call carries at most 64 MiB with the working tree, so a large codes pack travels in parts (one per call,
while the machine stays warm) and is joined there before training:
    python benchmarks/voice_pack_parts.py split runs/corpus_ov/pack --at 20000 runs/pack_a runs/pack_b
    python benchmarks/voice_pack_parts.py join runs/pack runs/pack_a runs/pack_b
The joined pack equals the original array for array (tests/test_voice_pack_parts.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the lab (training/) is not installed
from training.voice.corpus import load_pack, save_pack, train_seconds  # noqa: E402

# per-utterance arrays, and the offset arrays that index the concatenated ones: (values, offsets)
PER_UTT = ("spk", "lang")
RAGGED = (("ids", "ids_off"), ("codes", "codes_off"))


def _ragged_slice(values: np.ndarray, off: np.ndarray, lo: int, hi: int):
    return values[off[lo] : off[hi]], off[lo : hi + 1] - off[lo]


def subset(pack: dict, lo: int, hi: int) -> dict:
    """Utterances [lo, hi) of a loaded pack, as a pack of their own."""
    out = {k: pack[k][lo:hi] for k in PER_UTT}
    for v, o in RAGGED:
        if v in pack:
            out[v], out[o] = _ragged_slice(pack[v], pack[o], lo, hi)
    out["mel_off"] = pack["mel_off"][lo : hi + 1] - pack["mel_off"][lo]
    has_mel_rows = len(pack["mel"]) == pack["mel_off"][-1]
    out["mel"] = pack["mel"][pack["mel_off"][lo] : pack["mel_off"][hi]] if has_mel_rows else pack["mel"][:0]
    keep = [j for j, u in enumerate(pack["wav_utt"]) if lo <= u < hi]
    parts = [pack["wav"][pack["wav_off"][j] : pack["wav_off"][j + 1]] for j in keep]
    out["wav"] = np.concatenate(parts) if parts else pack["wav"][:0]
    out["wav_off"] = np.cumsum([0] + [len(p) for p in parts]).astype(pack["wav_off"].dtype)
    out["wav_utt"] = (pack["wav_utt"][keep] - lo).astype(pack["wav_utt"].dtype)
    out["info"] = _info(pack["info"], out)
    return out


def join(packs: list[dict]) -> dict:
    """The packs' utterances one after another (the inverse of subset over consecutive ranges)."""
    out = {k: np.concatenate([p[k] for p in packs]) for k in PER_UTT + ("mel", "wav")}

    def offsets(name):
        parts, base = [packs[0][name][:1]], packs[0][name][0]
        for p in packs:
            parts.append(p[name][1:] - p[name][0] + base)
            base = parts[-1][-1] if len(parts[-1]) else base
        return np.concatenate(parts)

    for v, o in RAGGED:
        if all(v in p for p in packs):
            out[v], out[o] = np.concatenate([p[v] for p in packs]), offsets(o)
    out["mel_off"], out["wav_off"] = offsets("mel_off"), offsets("wav_off")
    starts = np.cumsum([0] + [len(p["spk"]) for p in packs[:-1]])
    out["wav_utt"] = np.concatenate([p["wav_utt"] + s for p, s in zip(packs, starts)]).astype(packs[0]["wav_utt"].dtype)
    out["info"] = _info(packs[0]["info"], out)
    return out


def _info(info: dict, pack: dict) -> dict:
    """pack.json's figures for these utterances (the voice's manifest reports them as its training corpus)."""
    return dict(info, utterances=int(len(pack["spk"])), train_seconds=train_seconds(pack["mel_off"]))


def write(pack: dict, folder: Path, tokenizer: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {k: v for k, v in pack.items() if k != "info"}
    save_pack(folder, **arrays)
    (folder / "pack.json").write_text(json.dumps(pack["info"], indent=2))
    shutil.copyfile(tokenizer, folder / "tokenizer.json")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split", help="PACK --at N OUT_A OUT_B: utterances [0, N) and [N, end)")
    s.add_argument("pack", type=Path)
    s.add_argument("--at", type=int, required=True)
    s.add_argument("out_a", type=Path)
    s.add_argument("out_b", type=Path)
    j = sub.add_parser("join", help="OUT PART...: the parts' utterances in order")
    j.add_argument("out", type=Path)
    j.add_argument("parts", type=Path, nargs="+")
    a = ap.parse_args(argv)
    if a.cmd == "split":
        pack = load_pack(a.pack)
        n = len(pack["spk"])
        if not 0 < a.at < n:
            ap.error(f"--at {a.at}: give a split point between 1 and {n - 1} (the pack has {n} utterances)")
        write(subset(pack, 0, a.at), a.out_a, a.pack / "tokenizer.json")
        write(subset(pack, a.at, n), a.out_b, a.pack / "tokenizer.json")
    else:
        write(join([load_pack(p) for p in a.parts]), a.out, a.parts[0] / "tokenizer.json")


if __name__ == "__main__":
    main()

"""A voice folder without some of its voices, e.g. those that missed the intelligibility goal (the model card).

    python -m training.voice.withdraw toolkit/assets/voice f4,f5 --out VOICE_DIR

Every weight is kept bit for bit (same storage dtype); the named voices' vectors leave the model and the manifest's
`voice.withdrawn` names them. The speaker table the voice was trained with (`voice.speakers`) is unchanged, so a run
resumed from the folder (train --from-voice) draws the withdrawn rows afresh. The DVAE encoder is copied beside.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch
from torch import Tensor

from .config import ENCODER_FILE


def offered_voices(voices: dict[str, Tensor], withdraw: str, flag: str = "--withdraw-voices") -> dict[str, Tensor]:
    """`voices` less the comma-separated names in `withdraw`; each must be a voice, and one must stay."""
    names = [n.strip() for n in withdraw.split(",") if n.strip()]
    unknown = [n for n in names if n not in voices]
    if unknown:
        raise SystemExit(f"{flag}: {', '.join(unknown)} not among the voices {sorted(voices)}")
    kept = {k: v for k, v in voices.items() if k not in names}
    if not kept:
        raise SystemExit(f"{flag}: withdrawing {', '.join(names)} would leave the model no voice")
    return kept


def in_offered_voices(items: list[dict], voices, *alongside: list) -> tuple[list, ...]:
    """The corpus rows (each with a "speaker") that a model's voices can say, and the same entries of each list
    alongside them: rows of withdrawn voices are left out of an evaluation, and stderr says how many."""
    keep = [i for i, it in enumerate(items) if it["speaker"] in voices]
    if len(keep) < len(items):
        gone = sorted({it["speaker"] for it in items} - set(voices))
        print(
            f"left out {len(items) - len(keep)} of {len(items)} sentences: voices {', '.join(gone)} are not the "
            "model's (withdrawn)",
            file=sys.stderr,
        )
    return tuple([xs[i] for i in keep] for xs in (items, *alongside))


def withdraw_voices(model_dir: Path, withdraw: str, out: Path, *, force: bool = False) -> Path:
    from toolkit.checkpoint import load_ttsq, read_manifest, save_ttsq

    model_dir, out = Path(model_dir), Path(out)
    manifest = read_manifest(model_dir)
    model = load_ttsq(model_dir, manifest)
    before = list(model.voices)
    model.voices = offered_voices(model.voices, withdraw)
    if manifest.get("default_voice") not in model.voices:
        raise SystemExit(
            f"{manifest.get('default_voice')!r} is the default voice of {model_dir}: withdraw another, or re-export "
            "with another --default-voice first"
        )
    voice = dict(manifest.get("voice", {}))
    voice["withdrawn"] = sorted({*voice.get("withdrawn", []), *(n for n in before if n not in model.voices)})
    model.frontend, model.text_head = manifest.get("frontend"), manifest.get("text_head", True)
    dtype = getattr(torch, manifest.get("weights_dtype", "float32"))
    save_ttsq(model, out, force=force, extra={"voice": voice}, weights_dtype=dtype)
    if (model_dir / ENCODER_FILE).is_file():
        shutil.copyfile(model_dir / ENCODER_FILE, out / ENCODER_FILE)
    print(f"wrote {out}: voices {', '.join(model.voices)} (withdrawn: {', '.join(voice['withdrawn'])})")
    return out


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(prog="python -m training.voice.withdraw", description=__doc__.split("\n")[0])
    ap.add_argument("voice", type=Path, help="a ttsq voice folder")
    ap.add_argument("names", help="comma-separated voices to withdraw, e.g. f4,f5")
    ap.add_argument("--out", type=Path, required=True, help="the folder written (an existing one needs --force)")
    ap.add_argument("--force", action="store_true", help="replace --out if it exists (never --out == voice)")
    args = ap.parse_args(argv)
    if args.out.resolve() == args.voice.resolve():
        ap.error("--out must differ from the voice folder read; move the result into place yourself")
    from toolkit.checkpoint import CheckpointError
    from toolkit.fileio import OutputExistsError

    try:
        return withdraw_voices(args.voice, args.names, args.out, force=args.force)
    except (OutputExistsError, CheckpointError) as e:  # a message that names the fix, not a traceback
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()

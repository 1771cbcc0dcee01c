"""Does a voice say the words of text it never trained on? Each sentence of a text set is synthesized as
`ttsq synth TEXT -o ID.wav` does with its defaults (one text per call, seed 0, the model's default voice unless
--speaker), then scored by `ttsq score`'s metrics; espeak-ng's own audio of the same sentences is scored beside it,
in its default voice and, when --speaker names one of the shipped voice's speakers, in that speaker's espeak-ng
variant too (the audio that speaker learned from).

    python benchmarks/voice_intelligibility.py --set calibration_sets/heldout_natural_en.jsonl --limit 40 \
        --out benchmarks/results/current/voice_intelligibility_en [--model DIR] [--speaker NAME]

Writes OUT.json (per sentence: what the ASR heard from the voice and from espeak) and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from provenance import commit  # noqa: E402  (benchmarks/, the script's own folder)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--model", default=None, help="default: the shipped voice")
    p.add_argument("--speaker", default=None, help="default: the model's default voice")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--no-espeak", action="store_true", help="skip espeak-ng's own level")
    a = p.parse_args(argv)

    import soundfile as sf

    from evaluation.report import INTELLIGIBILITY, _fmt
    from evaluation.score import score_folder
    from toolkit import Synthesizer
    from toolkit.textsets import load_text_set

    records = load_text_set(a.set)[: a.limit]
    subset = Path(tempfile.mkdtemp(prefix="ttsq-intel-"))
    set_file = subset / "set.jsonl"
    set_file.write_text(
        "".join(
            json.dumps({"id": r.id, "text": r.text, "language": r.language, "length": r.length, "speaker": r.speaker})
            + "\n"
            for r in records
        )
    )
    synth = Synthesizer(a.model)
    t0 = time.perf_counter()
    audio_s = synth_s = 0.0
    eos = []
    for i, r in enumerate(records):
        u = synth.synthesize(r.text, speaker=a.speaker, seed=0)[0]  # ttsq synth's defaults
        sf.write(subset / f"{r.id}.wav", u.wav, u.sample_rate)
        audio_s += u.duration
        synth_s += u.timings["total"]
        eos.append(not u.hit_limit)
        print(f"\rsynthesized {i + 1}/{len(records)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    voice = score_folder(subset, set_file, dnsmos=False)
    rows = {"voice": voice}
    if not a.no_espeak:
        from asr_validation import SR, espeak

        from training.voice.corpus import SPEAKERS

        variants = {"espeak-ng": ""}
        if SPEAKERS.get(a.speaker):
            variants[f"espeak-ng {SPEAKERS[a.speaker]}"] = SPEAKERS[a.speaker]
        for name, variant in variants.items():
            ref = subset / f"espeak{variant}"
            ref.mkdir()
            for r in records:
                sf.write(ref / f"{r.id}.wav", espeak(r.text, variant), SR)
            rows[name] = score_folder(ref, set_file, dnsmos=False)
    res = {
        "command": " ".join(["python", "benchmarks/voice_intelligibility.py", *(argv or sys.argv[1:])]),
        "commit": commit(),
        "hardware": f"{platform.machine()} CPU",
        "model": a.model or "shipped voice",
        "speaker": a.speaker or "default",
        "records": len(records),
        "wall_s": time.perf_counter() - t0,
        "rtf": synth_s / max(audio_s, 1e-9),
        "eos_rate": sum(eos) / len(eos),
        "scores": rows,
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=2, ensure_ascii=False) + "\n")
    langs = [k for k in INTELLIGIBILITY if any(k in s["intelligibility"] for s in rows.values())]
    lines = [
        f"# Intelligibility of {res['model']} ({res['speaker']} voice) on {Path(a.set).name}",
        "",
        f"`{res['command']}` at commit {commit}, {res['hardware']}, {res['wall_s']:.0f} s; {len(records)} "
        f"sentences, seed 0, ASR {voice['asr']['model']}. Pooled error rate [95% bootstrap CI over sentences]. "
        f"Voice: EOS reached {res['eos_rate']:.0%}, synthesis RTF {res['rtf']:.3f}.",
        "",
        "| audio | " + " | ".join(INTELLIGIBILITY[k] for k in langs) + " |",
        "|---|" + "---|" * len(langs),
    ]
    for name, s in rows.items():
        lines.append(f"| {name} | " + " | ".join(_fmt(s["intelligibility"].get(k), ".3f") for k in langs) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

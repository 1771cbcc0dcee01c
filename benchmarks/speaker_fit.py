"""Speakers from sample audio on the shipped voice: does a vector fitted to one espeak-ng voice's recording make the
voice sound like that espeak voice? For each espeak voice (the six the voice was trained on, and two it never heard):
fit a speaker to its audio of one sentence (`toolkit.sample_speaker`, as `ttsq speaker from-audio` does), synthesize
other sentences with it, and measure the speaker distance (training.voice.measure.mean_spectrum: the mean voiced
log-mel spectrum) to every espeak voice's own audio of those sentences. The model's named voices are scored the
same way first (`named_voices`): each should be nearest the espeak voice it learned from, and far from the others.

    OMP_NUM_THREADS=1 python benchmarks/speaker_fit.py --out benchmarks/results/current/speaker_fit_cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the lab (training/) is not installed
from provenance import commit  # noqa: E402  (benchmarks/, the script's own folder)

SAMPLE = "She walked to the market this morning."
OTHERS = ["We should meet again after lunch.", "The train was late, so they took a taxi home."]
UNSEEN = {"f3": "+f3", "m2": "+m2"}  # espeak-ng variants the voice's corpus never used


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/current/speaker_fit_cpu.json"))
    ap.add_argument("--steps", type=int, default=30)
    a = ap.parse_args()

    from toolkit.checkpoint import load_dvae_encoder
    from toolkit.sample_speaker import FitSettings, speaker_from_audio
    from toolkit.synthesizer import DEFAULT_MODEL, Synthesizer
    from training.voice import corpus
    from training.voice.measure import mean_spectrum

    trained = list(corpus.SPEAKERS)
    corpus.SPEAKERS.update(UNSEEN)  # espeak_wav looks the variant up there
    voices = trained + list(UNSEEN)
    syn = Synthesizer(None, "cpu")
    enc = load_dvae_encoder(DEFAULT_MODEL, syn.model.cfg)
    refs = {(v, t): mean_spectrum(corpus.espeak_wav(t, "en", v)) for v in voices for t in OTHERS}
    named = {k: torch.nn.functional.normalize(v.float(), dim=0) for k, v in syn.model.voices.items()}

    def distances(speaker) -> tuple[dict[str, float], list[str]]:
        """Mean distance of the speaker's audio of OTHERS to each espeak voice's, and the voices nearest first."""
        dist = {u: [] for u in voices}
        for i, t in enumerate(OTHERS):
            e = mean_spectrum(syn.synthesize(t, speaker=speaker, seed=i)[0].wav)
            for u in voices:
                dist[u].append(float(np.linalg.norm(e - refs[(u, t)])))
        mean = {u: float(np.mean(d)) for u, d in dist.items()}
        return mean, sorted(mean, key=mean.get)

    named_rows = []  # the model's own voices: are they distinct, each nearest the espeak voice it learned from?
    for name in syn.model.voices:
        mean, ranked = distances(name)
        named_rows.append({"voice": name, "distance": {u: round(d, 2) for u, d in mean.items()}, "nearest": ranked[0]})
        print(json.dumps(named_rows[-1]), flush=True)
    rows = []
    for v in voices:
        t0 = time.perf_counter()
        vec = speaker_from_audio(syn.model, enc, corpus.espeak_wav(SAMPLE, "en", v), SAMPLE, FitSettings(steps=a.steps))
        fit_s = time.perf_counter() - t0
        mean, ranked = distances(torch.from_numpy(vec))
        cos = {k: round(float(n @ torch.from_numpy(vec)), 3) for k, n in named.items()}
        rows.append(
            {
                "espeak_voice": v,
                "trained_on": v in trained,
                "fit_seconds": round(fit_s, 1),
                "distance": {u: round(d, 2) for u, d in mean.items()},
                "nearest": ranked[0],
                "rank_of_own_voice": ranked.index(v) + 1,
                "cosine_to_named_voices": cos,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    report = {
        "command": "OMP_NUM_THREADS=1 python benchmarks/speaker_fit.py",
        "commit": commit(),
        "hardware": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch thread(s), "
        "shared CPU",
        "sample": SAMPLE,
        "synthesized": OTHERS,
        "fit_steps": a.steps,
        "distance": "L2 between mean voiced log-mel spectra (training.voice.measure.mean_spectrum), mean over "
        "the synthesized sentences (seeds 0, 1)",
        "named_voices": named_rows,
        "rows": rows,
    }
    a.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

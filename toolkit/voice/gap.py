"""Where a voice loses quality, stage by stage, on utterances of a codes+PCM corpus pack whose real audio is known:

    python -m toolkit.voice.gap --corpus runs/corpus_dec [--model toolkit/assets/voice] [--n 40] [--json FILE]

  real            the espeak audio itself
  copy            the vocoder on the audio's own log-mel (the vocoder's ceiling)
  teacher_forced  the GPT fed the utterance's true codes -> Decoder -> vocoder (the Decoder's ceiling)
  free_running    the voice synthesising the same text and speaker (codes sampled; ChatTTS's sampling defaults)

DNSMOS overall for all four and DTW-MCD against the real audio for the last two, each with a bootstrap CI, and
DNSMOS's overall, speech and background parts by voice (language and speaker). A drop from copy to teacher_forced
is the Decoder's; from teacher_forced to free_running, the sampled codes'.
The pack (corpus --codes-from VOICE --vocoder-seconds N) holds training utterances of the voice, so these figures
rank the stages; the held-out figures are toolkit.voice.measure's.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def stage_audio(syn, audio: np.ndarray, dec_mel, item: dict, to_mel, max_new_tokens: int) -> dict:
    """{stage: waveform} for one utterance (see the module docstring)."""
    import torch

    from ..params import SamplingParams

    from .measure import copy_synthesis

    model = syn.model
    copy = copy_synthesis(model, to_mel, audio)
    with torch.inference_mode():
        forced = model.mel_to_wav(dec_mel[None])[0].float().numpy()
    free = syn.synthesize([item["text"]], speaker=item["speaker"], seed=0,
                          params=SamplingParams(max_new_tokens=max_new_tokens))[0].wav
    return {"real": audio, "copy": copy, "teacher_forced": forced, "free_running": free}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="a corpus folder whose pack holds codes and PCM")
    ap.add_argument("--model", type=Path, default=None, help="default: the shipped voice")
    ap.add_argument("--n", type=int, default=40, help="utterances with PCM, drawn with --seed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=450)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)

    import torch

    from evaluation.metrics import bootstrap_ci

    from ..models.vocos import LogMel
    from ..synthesizer import Synthesizer
    from .corpus import load_pack
    from .measure import MCD_SETTINGS, dnsmos_scores, dnsmos_tables, dtw_mcd, report, scored
    from .train import Data, decoder_mels

    data = Data(load_pack(a.corpus / "pack"), torch.device("cpu"))
    if data.codes is None or len(data.wav_utt) == 0:
        raise SystemExit(f"{a.corpus}/pack needs codes and PCM: build it with python -m toolkit.voice.corpus "
                         "--codes-from VOICE --vocoder-seconds N")
    syn = Synthesizer(a.model, device="cpu")
    model = syn.model
    spk_id = model.tokenizer.token_id("[spk_emb]")
    table = torch.stack([model.voices[name] for name in data.info["speakers"]])
    pick = np.sort(np.random.default_rng(a.seed).choice(len(data.wav_utt), min(a.n, len(data.wav_utt)), replace=False))
    audio = [data.wav[data.wav_off[j]: data.wav_off[j + 1]].numpy() for j in pick]
    data.wav_utt = data.wav_utt[pick]
    with torch.inference_mode():
        mels = decoder_mels(model.gpt, model.decoder, table, data, torch.device("cpu"), spk_id)
    train_items = [it for it in map(json.loads, open(a.corpus / "meta.jsonl", encoding="utf-8"))
                   if it["split"] == "train"]  # the pack's utterances, in order
    to_mel = LogMel(model.cfg.vocos)
    scores: dict[str, list[dict]] = {"real": [], "copy": [], "teacher_forced": [], "free_running": []}
    mcds: dict[str, list[float]] = {"teacher_forced": [], "free_running": []}
    for u, wav in zip(data.wav_utt, audio):
        stages = stage_audio(syn, wav, mels[int(u)], train_items[int(u)], to_mel, a.max_new_tokens)
        for k, w in stages.items():
            scores[k].append(dnsmos_scores(w))
        for k in mcds:
            mcds[k].append(dtw_mcd(wav, stages[k]))
    ovrl = {k: scored([s["ovrl"] for s in v]) for k, v in scores.items()}
    res = {"utterances": len(audio), "corpus": str(a.corpus), "model": str(a.model or "shipped voice"),
           "dnsmos_ovrl": {k: bootstrap_ci(v) for k, v in ovrl.items()},
           "mcd_db": {k: bootstrap_ci(scored(v)) for k, v in mcds.items()},
           "unscored": {k: len(scores[k]) - len(v) for k, v in ovrl.items()},
           "mcd_settings": MCD_SETTINGS,
           **dnsmos_tables([train_items[int(u)] for u in data.wav_utt], **scores)}
    return report(res, a)


if __name__ == "__main__":
    main()

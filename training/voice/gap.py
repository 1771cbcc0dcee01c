"""Where a voice loses the words and the quality, stage by stage, on utterances of a codes+PCM corpus pack whose
real audio is known:

    python -m training.voice.gap --corpus runs/corpus_dec [--model toolkit/assets/voice] [--n 40] [--lang en|zh]
        [--synth-defaults] [--no-asr] [--asr-model DIR] [--wer-only] [--device cuda] [--save-audio DIR]
        [--audio DIR] [--json FILE]

  real            the espeak audio itself
  copy            the vocoder on the audio's own log-mel (the vocoder's ceiling)
  codec           the utterance's DVAE codes -> the DVAE decoder's mel -> vocoder (the codec's ceiling: the codes
                  the GPT is trained to predict, decoded without the GPT)
  teacher_forced  the GPT fed the utterance's true codes -> Decoder -> vocoder (the Decoder's ceiling)
  free_running    the voice synthesising the same text and speaker (codes sampled; ChatTTS's sampling defaults
                  unless --temperature, --top-p, --top-k or --repetition-penalty)
  synth_defaults  (with --synth-defaults) the text as `ttsq synth` speaks it with no options: the model's default
                  voice, seed 0, SamplingParams() as they are (up to 2048 steps)

Intelligibility first: an offline ASR (evaluation.asr, Whisper base unless --asr-model) transcribes every stage's
audio, one Transcriber per run, and each stage gets its pooled error rate against the input text (English WER,
Mandarin CER, mixed MER) with a bootstrap CI, and each step down the chain its paired difference (`wer_steps`).
A rise from real to copy or codec is the codec's; from codec to teacher_forced, the Decoder's (reading the GPT's
hidden states instead of the codes); from teacher_forced to free_running, the GPT's own codes' (alignment and
sampling). --no-asr skips it.
Then DNSMOS overall for every stage and DTW-MCD against the real audio for the codec and GPT stages, each with a
bootstrap CI, and DNSMOS's overall, speech and background parts by voice (language and speaker).
--save-audio DIR writes each stage's audio (DIR/STAGE.npz, int16 by utterance id) and --audio DIR takes the stages
found there instead of making them (same corpus, --n, --seed and --lang): the sampled stages can be made on a GPU
machine (--device cuda --no-asr --wer-only) and scored where the ASR is. --wer-only skips DNSMOS and MCD.
The pack is built by `corpus --codes-from VOICE --vocoder-seconds N`: with the voice's own corpus it holds sentences
the voice trained on; with other text (corpus --mix natural=1) sentences it never saw.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

STAGES = ("real", "copy", "codec", "teacher_forced", "free_running")
MCD_STAGES = ("codec", "teacher_forced", "free_running")
#: the steps down the chain whose paired WER difference says where the words are lost
STEPS = (
    ("copy", "real"),
    ("codec", "real"),
    ("teacher_forced", "codec"),
    ("free_running", "teacher_forced"),
    ("synth_defaults", "free_running"),
)


def stage_audio(
    syn,
    audio: np.ndarray,
    codes,
    dec_mel,
    item: dict,
    to_mel,
    max_new_tokens: int,
    stages=STAGES,
    given: dict | None = None,
    sampling: dict | None = None,
) -> tuple[dict, dict]:
    """({stage: waveform}, {sampled stage: hit the step limit}) for one utterance (see the module docstring).
    codes: its (steps, Q) DVAE codes; dec_mel: the teacher-forced Decoder's mel (None when that stage is given);
    given: {stage: (waveform, hit the step limit)} made elsewhere (--audio), not made again; sampling: free_running's
    SamplingParams other than ChatTTS's defaults (--temperature, ...)."""
    import torch

    from toolkit.params import SamplingParams

    from .measure import copy_synthesis

    model = syn.model
    device = next(model.vocos.parameters()).device
    given = given or {}
    out, hit = {"real": audio}, {}
    for stage, (w, h) in given.items():
        out[stage] = w
        if h is not None:
            hit[stage] = h
    todo = [k for k in stages if k not in out]
    with torch.inference_mode():
        if "copy" in todo:
            out["copy"] = copy_synthesis(model, to_mel, audio)
        if "codec" in todo:
            out["codec"] = model.mel_to_wav(model.codes_to_mel(codes[None].to(device)))[0].float().cpu().numpy()
        if "teacher_forced" in todo:
            out["teacher_forced"] = model.mel_to_wav(dec_mel[None].to(device))[0].float().cpu().numpy()
    if "free_running" in todo:
        u = syn.synthesize(
            [item["text"]],
            speaker=item["speaker"],
            seed=0,
            params=SamplingParams(max_new_tokens=max_new_tokens, **(sampling or {})),
        )[0]
        out["free_running"], hit["free_running"] = u.wav, u.hit_limit
    if "synth_defaults" in todo:  # as `ttsq synth "TEXT" -o F.wav` speaks it
        u = syn.synthesize(item["text"], speaker=None, seed=0, params=SamplingParams())[0]
        out["synth_defaults"], hit["synth_defaults"] = u.wav, u.hit_limit
    return {k: out[k] for k in stages}, hit


def save_audio(folder: Path, items: list[dict], waves: dict, limits: dict) -> None:
    """Each stage's audio as folder/STAGE.npz: int16 by utterance id, and whether each hit the step limit."""
    folder.mkdir(parents=True, exist_ok=True)
    for stage, ws in waves.items():
        arrays = {
            it["id"]: np.clip(np.round(np.asarray(w) * 32767), -32768, 32767).astype(np.int16)
            for it, w in zip(items, ws)
        }
        if stage in limits:
            arrays["__hit_limit__"] = np.array(limits[stage], dtype=bool)
        arrays["__ids__"] = np.array([it["id"] for it in items])
        np.savez_compressed(folder / f"{stage}.npz", **arrays)


def load_audio(folder: Path, items: list[dict], stages) -> dict[str, list[tuple]]:
    """{stage: [(waveform, hit the step limit or None)] in items' order} for each stage saved in folder."""
    out = {}
    for stage in stages:
        f = folder / f"{stage}.npz"
        if stage == "real" or not f.is_file():
            continue
        z = np.load(f)
        ids = [str(x) for x in z["__ids__"]]
        if ids != [it["id"] for it in items]:
            raise SystemExit(
                f"{f} holds other utterances than this run draws: save and load with the same corpus, "
                "--n, --seed and --lang"
            )
        hit = z["__hit_limit__"].tolist() if "__hit_limit__" in z else [None] * len(ids)
        out[stage] = [(z[i].astype(np.float32) / 32767, h) for i, h in zip(ids, hit)]
    return out


def wer_table(res: dict) -> str:
    """The stages' error rates as a Markdown table (one column per language metric present)."""
    intel = res.get("intelligibility")
    if not intel:
        return ""
    metrics = [m for m in ("wer", "cer", "mer") if any(m in v for v in intel.values())]
    fmt = lambda c: f"{c['mean']:.3f} [{c['lo']:.3f}, {c['hi']:.3f}] (n={c['n']})" if c else "-"  # noqa: E731
    lines = [
        "| stage | " + " | ".join(f"{m.upper()} [95% CI]" for m in metrics) + " |",
        "|---|" + "---|" * len(metrics),
    ]
    lines += [f"| {stage} | " + " | ".join(fmt(v.get(m)) for m in metrics) + " |" for stage, v in intel.items()]
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="a corpus folder whose pack holds codes and PCM")
    ap.add_argument("--model", type=Path, default=None, help="default: the shipped voice")
    ap.add_argument("--n", type=int, default=40, help="utterances with PCM, drawn with --seed")
    ap.add_argument("--lang", choices=("en", "zh"), default=None, help="draw only utterances of this language")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=450)
    ap.add_argument(
        "--synth-defaults",
        action="store_true",
        help="add the stage synth_defaults: `ttsq synth` with no options (default voice, seed 0, "
        "sampling defaults, up to 2048 steps)",
    )
    ap.add_argument("--no-asr", action="store_true", help="skip the intelligibility (WER/CER) figures: faster")
    ap.add_argument("--asr-model", default=None, help="a CTranslate2 Whisper folder (default: Whisper base)")
    ap.add_argument("--temperature", type=float, default=None, help="free_running's temperature (default: ChatTTS's)")
    ap.add_argument("--top-p", type=float, default=None, help="free_running's top-p (default: ChatTTS's)")
    ap.add_argument("--top-k", type=int, default=None, help="free_running's top-k (default: ChatTTS's)")
    ap.add_argument("--repetition-penalty", type=float, default=None, help="free_running's (default: ChatTTS's)")
    ap.add_argument("--wer-only", action="store_true", help="no DNSMOS or MCD: only the intelligibility figures")
    ap.add_argument("--device", default="cpu", help="where the voice runs (cpu, cuda)")
    ap.add_argument("--save-audio", type=Path, default=None, help="write each stage's audio to DIR/STAGE.npz")
    ap.add_argument(
        "--audio",
        type=Path,
        default=None,
        help="take the stages saved in DIR (by --save-audio, same corpus, --n, --seed, --lang)",
    )
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)

    import torch

    from evaluation.metrics import bootstrap_ci
    from toolkit.models.vocos import LogMel
    from toolkit.synthesizer import Synthesizer

    from .corpus import load_pack
    from .measure import (
        MCD_SETTINGS,
        dnsmos_scores,
        dnsmos_tables,
        dtw_mcd,
        load_transcriber,
        report,
        scored,
        transcribe_all,
    )
    from .train import Data, decoder_mels
    from .withdraw import in_offered_voices

    data = Data(load_pack(a.corpus / "pack"), torch.device("cpu"))
    if data.codes is None or len(data.wav_utt) == 0:
        raise SystemExit(
            f"{a.corpus}/pack needs codes and PCM: build it with python -m training.voice.corpus "
            "--codes-from VOICE --vocoder-seconds N"
        )
    train_items = [
        it for it in map(json.loads, open(a.corpus / "meta.jsonl", encoding="utf-8")) if it["split"] == "train"
    ]  # the pack's utterances, in order
    transcriber = None if a.no_asr else load_transcriber(a.asr_model)  # before the minutes of synthesis
    syn = Synthesizer(a.model, device=a.device)
    model = syn.model
    spk_id = model.tokenizer.token_id("[spk_emb]")
    some = next(iter(model.voices.values()))
    # the pack's speaker table; a withdrawn voice's row is never read: its utterances are left out of the pool
    table = torch.stack([model.voices.get(name, torch.zeros_like(some)) for name in data.info["speakers"]])
    rows = [j for j, u in enumerate(data.wav_utt) if a.lang is None or train_items[int(u)]["lang"] == a.lang]
    _, pool = in_offered_voices([train_items[int(data.wav_utt[j])] for j in rows], model.voices, rows)
    if not pool:
        raise SystemExit(f"{a.corpus}/pack has no utterance with PCM in language {a.lang}")
    pick = np.sort(np.random.default_rng(a.seed).choice(pool, min(a.n, len(pool)), replace=False))
    audio = [data.wav[data.wav_off[j] : data.wav_off[j + 1]].numpy() for j in pick]
    data.wav_utt = data.wav_utt[pick]
    stages = STAGES + (("synth_defaults",) if a.synth_defaults else ())
    items = [train_items[int(u)] for u in data.wav_utt]
    given = load_audio(a.audio, items, stages) if a.audio else {}
    sampling = {
        k: v
        for k, v in (
            ("temperature", a.temperature),
            ("top_p", a.top_p),
            ("top_k", a.top_k),
            ("repetition_penalty", a.repetition_penalty),
        )
        if v is not None
    }
    mels = {}
    if "teacher_forced" not in given:
        with torch.inference_mode():
            mels = decoder_mels(model.gpt, model.decoder, table.to(syn.device), data, syn.device, spk_id)
    to_mel = LogMel(model.cfg.vocos).to(syn.device)
    scores: dict[str, list[dict]] = {k: [] for k in stages}
    mcds: dict[str, list[float]] = {k: [] for k in MCD_STAGES}
    waves: dict[str, list[np.ndarray]] = {k: [] for k in stages}
    limits: dict[str, list[bool]] = {}
    for n, (u, it, wav) in enumerate(zip(data.wav_utt, items, audio)):
        out, hit = stage_audio(
            syn,
            wav,
            data.codes[int(u)],
            mels.get(int(u)),
            it,
            to_mel,
            a.max_new_tokens,
            stages,
            {k: v[n] for k, v in given.items()},
            sampling,
        )
        for k, w in out.items():
            waves[k].append(w)
            if not a.wer_only:
                scores[k].append(dnsmos_scores(w))
        for k, h in hit.items():
            limits.setdefault(k, []).append(h)
        if not a.wer_only:
            for k in mcds:
                mcds[k].append(dtw_mcd(wav, out[k]))
    if a.save_audio:
        save_audio(a.save_audio, items, waves, limits)
    res: dict[str, object] = {
        "utterances": len(audio),
        "corpus": str(a.corpus),
        "model": str(a.model or "shipped voice"),
        "languages": {lang: sum(it["lang"] == lang for it in items) for lang in ("en", "zh")},
    }
    if transcriber is not None:
        from evaluation.asr import rate_diff_ci

        heard = {k: transcribe_all(transcriber, items, waves[k]) for k in stages}
        from evaluation.asr import by_language

        res["intelligibility"] = {k: by_language([c for _, c in heard[k]]) for k in stages}
        res["wer_steps"] = {}
        for later, earlier in STEPS:
            if later in heard and earlier in heard:
                res["wer_steps"][f"{later} - {earlier}"] = {
                    name: rate_diff_ci(
                        [c for _, c in heard[later] if c.language == lang],
                        [c for _, c in heard[earlier] if c.language == lang],
                    )
                    for lang, name in (("en", "wer"), ("zh", "cer"), ("mixed", "mer"))
                    if any(c.language == lang for _, c in heard[later])
                }
        res["asr"] = transcriber.settings()
    res["hit_max_steps"] = {k: int(sum(v)) for k, v in limits.items() if None not in v}
    if not a.wer_only:
        res.update(
            {
                "dnsmos_ovrl": {k: bootstrap_ci(scored([s["ovrl"] for s in v])) for k, v in scores.items()},
                "mcd_db": {k: bootstrap_ci(scored(v)) for k, v in mcds.items()},
                "unscored": {k: len(v) - len(scored([s["ovrl"] for s in v])) for k, v in scores.items()},
                "mcd_settings": MCD_SETTINGS,
            }
        )
    res["settings"] = {
        "seed": a.seed,
        "max_new_tokens": a.max_new_tokens,
        "lang": a.lang or "all",
        "device": str(syn.device),
        "audio_from": str(a.audio) if a.audio else None,
        "free_running": "the utterance's own speaker, seed 0, up to --max-new-tokens steps, "
        + (f"ChatTTS's sampling defaults except {sampling}" if sampling else "ChatTTS's sampling defaults"),
        **(
            {
                "synth_defaults": "the model's default voice, seed 0, SamplingParams() (up to 2048 "
                "steps), as `ttsq synth` with no options"
            }
            if a.synth_defaults
            else {}
        ),
    }
    if not a.wer_only:
        res.update(dnsmos_tables(items, **scores))
    if transcriber is not None:
        res["per_utterance"] = [
            {
                "id": it["id"],
                "text": it["text"],
                "lang": it["lang"],
                "speaker": it["speaker"],
                "source": it.get("source"),
                **{k: {"heard": heard[k][i][0], "rate": heard[k][i][1].rate} for k in stages},
            }
            for i, it in enumerate(items)
        ]
    report(res, a.json)
    if transcriber is not None:
        print(wer_table(res))
    return res


if __name__ == "__main__":
    main()

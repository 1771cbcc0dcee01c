"""Measure the shipped voice on the corpus's held-out sentences (never trained on) against their espeak audio.

    python -m training.voice.measure --corpus corpus [--model toolkit/assets/voice] [--n 100]
        [--json docs/voice/measure.json] [--pictures docs/voice]
    python -m training.voice.measure --paired BASE.json NEW.json    # NEW - BASE, sentence by sentence

Figures, intelligibility first: the pooled error rate (English WER, Mandarin CER, mixed MER; evaluation.asr, Whisper
base unless --asr-model, one Transcriber per run) of what an offline ASR hears in the synthesized audio, in the espeak
reference and in the vocoded reference, each with a bootstrap CI (--no-asr skips it; --paired then compares the
rates too). Then mean DTW-MCD vs the espeak reference (ESPnet settings, evaluation.metrics.mcd) with a bootstrap CI;
the duration ratio synthesized/reference and the share within +-25%; DNSMOS overall (synthesized and reference);
DNSMOS and MCD of each reference resynthesised by the model's vocoder from its log-mel (the vocoder's ceiling);
the share of sentences that reached EOS; between- vs within-speaker spectral distance (mean log-mel
spectrum per utterance, Euclidean, pairs of the same language only). Pictures: reference vs synthesized
log-mel spectrograms of three held-out sentences.
"""

from __future__ import annotations

import argparse
import json
import textwrap
import time
from itertools import combinations
from pathlib import Path

import numpy as np

MCD_SETTINGS = "ESPnet: pysptk mcep order 34, alpha 0.46, 24 kHz, 1024 fft, 5 ms hop, DTW, c0 excluded"


def heldout(corpus: Path, n: int, voices=None) -> tuple[list[dict], list[np.ndarray]]:
    """A corpus's first n held-out sentences (its meta.jsonl rows) and their espeak references (24 kHz float32);
    with `voices`, the first n of those whose speaker is one of them (withdraw.in_offered_voices)."""
    import soundfile as sf

    from .withdraw import in_offered_voices

    items = [json.loads(line) for line in open(corpus / "meta.jsonl", encoding="utf-8")]
    items = [it for it in items if it["split"] == "heldout"]
    if voices is not None:
        (items,) = in_offered_voices(items, voices)
    items = items[:n]
    return items, [sf.read(corpus / "heldout" / f"{it['id']}.wav", dtype="float32")[0] for it in items]


def load_transcriber(asr_model=None):
    """The ASR of a run (one per run: loading it takes seconds), or None with a message when its extra is missing
    and no --asr-model was asked for."""
    import sys

    from evaluation import asr

    try:
        return asr.Transcriber(asr_model)
    except asr.ASRUnavailable as e:
        if asr_model:
            raise
        print(f"intelligibility not scored: {e}", file=sys.stderr)
        return None


def transcribe_all(transcriber, items: list[dict], wavs: list[np.ndarray], sr: int = 24000) -> list[tuple]:
    """[(what the ASR heard, its ErrorCount against the item's text)] for each 24 kHz clip; the language to decode is
    the text's own (textnorm.language_of)."""
    from evaluation import asr, textnorm

    out = []
    for it, w in zip(items, wavs, strict=True):
        heard = transcriber.transcribe(w, sr, textnorm.language_of(it["text"])) if len(w) else ""
        out.append((heard, asr.errors(it["text"], heard)))
    return out


def asr_row(heard: str, count) -> dict:
    """One clip's transcript and edit counts, as a per-sentence row keeps them (and --paired reads them back)."""
    return {
        "heard": heard,
        "ref_tokens": count.ref_tokens,
        "sub": count.sub,
        "dele": count.dele,
        "ins": count.ins,
        "language": count.language,
        "rate": count.rate,
    }


def share_within_25pct(ratios) -> float:
    """The share of duration ratios (synthesized / reference) within +-25%: the voice's duration goal."""
    r = np.asarray(ratios, dtype=np.float64)
    return float(np.mean((r > 0.75) & (r < 1.25)))


def copy_synthesis(model, to_mel, wav: np.ndarray) -> np.ndarray:
    """The model's vocoder on the audio's own log-mel: its ceiling on this audio."""
    import torch

    device = next(model.vocos.parameters()).device
    with torch.inference_mode():
        return model.mel_to_wav(to_mel(torch.from_numpy(wav).to(device)[None]))[0].float().cpu().numpy()


def mean_spectrum(wav: np.ndarray) -> np.ndarray:
    import torch

    from toolkit.models.config import VocosConfig
    from toolkit.models.vocos import LogMel

    mel = LogMel(VocosConfig())(torch.from_numpy(wav.astype(np.float32))[None])[0].numpy()  # (100, F)
    energy = mel.mean(0)
    voiced = energy > energy.max() - 6.0  # frames within ~26 dB of the loudest
    return mel[:, voiced].mean(1)


def speaker_distances(items: list[dict], wavs: list[np.ndarray]) -> dict:
    emb = [mean_spectrum(w) for w in wavs]
    within, between = [], []
    for i, j in combinations(range(len(items)), 2):
        if items[i]["lang"] != items[j]["lang"]:
            continue
        d = float(np.linalg.norm(emb[i] - emb[j]))
        (within if items[i]["speaker"] == items[j]["speaker"] else between).append(d)
    if not within or not between:  # too few sentences: no pair of the same voice, or of two voices
        return {"within": None, "between": None, "ratio": None}
    return {
        "within": float(np.mean(within)),
        "between": float(np.mean(between)),
        "ratio": float(np.mean(between) / np.mean(within)),
    }


def picture_text(item: dict) -> str:
    """A held-out sentence as a picture's title can show it: Mandarin as its espeak phonemes (matplotlib's default
    font has no CJK glyphs, and a fresh machine has no CJK font), cut to 240 characters."""
    text = item["text"] if all(ord(c) < 0x2E80 for c in item["text"]) else item.get("phonemes", item["text"])
    return textwrap.shorten(text, 240, placeholder=" ...")


def picture(ref: np.ndarray, syn: np.ndarray, title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    from toolkit.models.config import VocosConfig
    from toolkit.models.vocos import LogMel

    lm = LogMel(VocosConfig())
    fig, axes = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True)
    for ax, w, name in zip(axes, (ref, syn), ("espeak-ng reference", "ttsq voice (synthesized)")):
        m = lm(torch.from_numpy(w.astype(np.float32))[None])[0].numpy()
        ax.imshow(
            m,
            origin="lower",
            aspect="auto",
            vmin=-11.5,
            vmax=2.5,
            cmap="magma",
            extent=(0, m.shape[1] * 256 / 24000, 0, 100),
        )
        ax.set_ylabel("mel bin")
        ax.set_title(f"{name}: {len(w) / 24000:.2f} s", fontsize=9)
    axes[1].set_xlabel("seconds")
    fig.suptitle(textwrap.fill(title, 120), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


DNSMOS_PARTS = ("ovrl", "sig", "bak")  # overall, and the speech signal and the background that it weighs


def dnsmos_scores(wav: np.ndarray, sr: int = 24000) -> dict[str, float]:
    """DNSMOS's parts of a clip; NaN for each where it is shorter than DNSMOS takes (a synthesis that stopped at
    once), so that one such clip does not stop a whole measurement."""
    from evaluation.metrics import MIN_DNSMOS_SECONDS, dnsmos

    if len(wav) < MIN_DNSMOS_SECONDS * sr:
        return dict.fromkeys(DNSMOS_PARTS, float("nan"))
    return dnsmos(wav, sr)


def dtw_mcd(ref: np.ndarray, wav: np.ndarray) -> float:
    """DTW-MCD (dB) of a 24 kHz clip against its reference; NaN where the clip is too short or silent to align."""
    from evaluation.metrics import mcd

    try:
        return mcd(ref, wav, 24000, align="dtw").value_db
    except ValueError:
        return float("nan")


def scored(xs: list[float]) -> list[float]:
    """The scored entries of a series (NaN marks a clip too short to score)."""
    return [x for x in xs if np.isfinite(x)]


def dnsmos_tables(items: list[dict], **scores: list[dict]) -> dict:
    """Each DNSMOS part by voice (`dnsmos_ovrl_by_voice`, `_sig_`, `_bak_`) from per-sentence score dicts: the
    background part shows noise that a vocoder or Decoder adds, which the overall score alone hides."""
    return {
        f"dnsmos_{part}_by_voice": by_voice(items, **{name: [s[part] for s in xs] for name, xs in scores.items()})
        for part in DNSMOS_PARTS
    }


def by_voice(items: list[dict], **series: list[float]) -> dict:
    """Mean of each per-sentence series by language and speaker ("en f4"): where a model loses, voice by voice.
    Series may be shorter than items (DNSMOS scores only the first --dnsmos sentences); NaN entries are left out."""
    rows: dict[str, list[int]] = {}
    for i, it in enumerate(items):
        rows.setdefault(f"{it['lang']} {it['speaker']}", []).append(i)

    def mean(xs: list[float], idx: list[int]) -> float | None:
        kept = [xs[i] for i in idx if i < len(xs) and np.isfinite(xs[i])]
        return float(np.mean(kept)) if kept else None

    return {
        voice: {"n": len(idx), **{k: mean(xs, idx) for k, xs in series.items()}} for voice, idx in sorted(rows.items())
    }


def paired(base: dict, new: dict) -> dict:
    """NEW - BASE per sentence (two --json results on the same sentences), with paired bootstrap CIs: tighter than
    comparing the two means' own intervals, since each sentence's difficulty cancels."""
    from evaluation.metrics import bootstrap_diff_ci

    rows = {r["id"]: r for r in base.get("per_sentence", [])}
    pairs = [(rows[r["id"]], r) for r in new.get("per_sentence", []) if r["id"] in rows]
    if not pairs:
        raise SystemExit("no sentence is in both results: measure both with --json on the same corpus")
    other = [b["id"] for b, n in pairs if b.get("text") != n.get("text")]  # ids repeat across corpora of other seeds
    if other:
        raise SystemExit(
            f"{len(other)} ids name different texts in the two results (first: {other[0]}): measure "
            "both on corpora of the same seed"
        )
    out = {"sentences": len(pairs)}
    for key in ("dnsmos_ovrl", "mcd_db", "duration_ratio"):
        both = [
            (b[key], n[key])
            for b, n in pairs
            if b[key] is not None and n[key] is not None and np.isfinite(b[key]) and np.isfinite(n[key])
        ]
        if both:
            b, n = np.array(both).T
            out[key] = bootstrap_diff_ci(n, b)
    asr_pairs = [(b["asr"], n["asr"]) for b, n in pairs if b.get("asr") and n.get("asr")]
    if asr_pairs:  # pooled error rate NEW - BASE by language, paired sentence by sentence
        from evaluation.asr import METRIC_NAME, ErrorCount, rate_diff_ci

        def count(r):
            return ErrorCount(r["ref_tokens"], r["sub"], r["dele"], r["ins"], r["language"])

        out["asr_rate"] = {
            name: rate_diff_ci(
                [count(n) for b, n in asr_pairs if n["language"] == lang],
                [count(b) for b, n in asr_pairs if n["language"] == lang],
            )
            for lang, name in METRIC_NAME.items()
            if any(n["language"] == lang for _, n in asr_pairs)
        }
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=None)
    ap.add_argument("--model", type=Path, default=None, help="default: the shipped voice")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--max-new-tokens", type=int, default=700, help="15 s; a sentence without EOS by then counts as a miss"
    )
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--pictures", type=Path, default=None)
    ap.add_argument("--dnsmos", type=int, default=100, help="how many sentences DNSMOS scores (slow on CPU)")
    ap.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: ChatTTS's)")
    ap.add_argument("--top-p", type=float, default=None, help="top-p (default: ChatTTS's)")
    ap.add_argument("--repetition-penalty", type=float, default=None, help="(default: ChatTTS's)")
    ap.add_argument(
        "--speaker",
        default=None,
        help="one voice speaks every sentence ('default': the model's default voice, as `ttsq synth` "
        "without --speaker); its MCD is then against another speaker's reference where they differ",
    )
    ap.add_argument(
        "--vocoder-only",
        action="store_true",
        help="only the copy-synthesis figures (the vocoder on the references' log-mels): no GPT",
    )
    ap.add_argument("--no-asr", action="store_true", help="skip the intelligibility (WER/CER) figures: faster")
    ap.add_argument("--asr-model", default=None, help="a CTranslate2 Whisper folder (default: Whisper base)")
    ap.add_argument(
        "--paired",
        type=Path,
        nargs=2,
        metavar=("BASE", "NEW"),
        default=None,
        help="compare two --json results sentence by sentence (NEW - BASE) and stop; no --corpus needed",
    )
    a = ap.parse_args(argv)
    if a.paired:
        base, new = (json.loads(f.read_text()) for f in a.paired)
        return report(paired(base, new), a.json)
    if a.corpus is None:
        ap.error("--corpus is required (except with --paired)")

    from evaluation.metrics import bootstrap_ci, mcd
    from toolkit.models.vocos import LogMel
    from toolkit.prompt import resolve_speaker
    from toolkit.sampling import SamplingParams
    from toolkit.synthesizer import Synthesizer

    transcriber = None if a.no_asr else load_transcriber(a.asr_model)
    syn = Synthesizer(a.model, device=a.device)
    forced = syn.model.default_voice if a.speaker == "default" else a.speaker
    if forced is not None:
        try:  # before the minutes spent on the references
            resolve_speaker(syn.model, forced)
        except ValueError as e:
            ap.error(f"--speaker: {e}")
    # each sentence in its own voice (no --speaker): only the voices the model still offers
    items, refs = heldout(a.corpus, a.n, None if forced is not None else syn.model.voices)
    k = min(a.dnsmos, len(items))
    # the vocoder's own ceiling: each reference resynthesised from its log-mel (copy synthesis); its MCD covers the
    # same sentences as mcd_db, its DNSMOS the same as the other DNSMOS figures
    model = syn.model
    to_mel = LogMel(model.cfg.vocos).to(syn.device)
    vocoded = [copy_synthesis(model, to_mel, r) for r in refs]
    sc_ref = [dnsmos_scores(r) for r in refs[:k]]
    sc_voc = [dnsmos_scores(v) for v in vocoded[:k]]
    dn_ref, dn_voc = ([s["ovrl"] for s in sc] for sc in (sc_ref, sc_voc))
    res: dict[str, object] = {"sentences": len(items)}
    heard: dict[str, list[tuple]] = {}
    if transcriber is not None:  # intelligibility first: the references' and the vocoder's here, the synthesis' below
        from evaluation.asr import by_language

        heard = {
            "reference": transcribe_all(transcriber, items, refs),
            "vocoded_reference": transcribe_all(transcriber, items, vocoded),
        }
        res["intelligibility"] = {k: by_language([c for _, c in v]) for k, v in heard.items()}
        res["asr"] = transcriber.settings()
    res.update(
        {
            "mcd_settings": MCD_SETTINGS,
            "dnsmos_ovrl_reference": bootstrap_ci(dn_ref),
            "dnsmos_ovrl_vocoded_reference": bootstrap_ci(dn_voc),
            "mcd_db_vocoded_reference": bootstrap_ci(
                [mcd(r, v, 24000, align="dtw").value_db for r, v in zip(refs, vocoded)]
            ),
        }
    )
    if a.vocoder_only:
        res.update(dnsmos_tables(items, reference=sc_ref, vocoded_reference=sc_voc))
        return report(res, a.json)
    chosen = {
        k: v
        for k, v in (("temperature", a.temperature), ("top_p", a.top_p), ("repetition_penalty", a.repetition_penalty))
        if v is not None
    }
    params = SamplingParams(max_new_tokens=a.max_new_tokens, **chosen)
    t0 = time.time()
    out: dict[str, object] = {}
    voice = {it["id"]: forced or it["speaker"] for it in items}
    for spk in sorted(set(voice.values())):
        group = [it for it in items if voice[it["id"]] == spk]
        for it, u in zip(
            group, syn.synthesize([it["text"] for it in group], speaker=spk, seed=a.seed, params=params, batch_size=16)
        ):
            out[it["id"]] = u
    synth_s = time.time() - t0
    wavs = [out[it["id"]].wav for it in items]
    mcds, ratios, eos = [], [], []
    for it, r, w in zip(items, refs, wavs):
        ratios.append(len(w) / len(r))
        eos.append(not out[it["id"]].hit_limit)
        mcds.append(dtw_mcd(r, w))
    mcd_ok = scored(mcds)
    if transcriber is not None:
        from evaluation.asr import by_language

        heard["synth"] = transcribe_all(transcriber, items, wavs)
        res["intelligibility"] = {"synth": by_language([c for _, c in heard["synth"]]), **res["intelligibility"]}
    sc_syn = [dnsmos_scores(w) for w in wavs[:k]]
    dn_syn = [s["ovrl"] for s in sc_syn]
    res.update(
        {
            "synthesis_seconds_cpu": round(synth_s, 1),
            "mcd_db": bootstrap_ci(mcd_ok) if mcd_ok else None,
            "mcd_failed": len(mcds) - len(mcd_ok),
            "duration_ratio_median": float(np.median(ratios)),
            "duration_within_25pct": share_within_25pct(ratios),
            "eos_reached": float(np.mean(eos)),
            "dnsmos_ovrl_synth": bootstrap_ci(scored(dn_syn)),
            "speaker_distance_synth": None if forced else speaker_distances(items, wavs),
            "speaker_distance_reference": speaker_distances(items, refs),
            "per_language": {},
            **dnsmos_tables(items, reference=sc_ref, vocoded_reference=sc_voc, synth=sc_syn),
            "settings": {
                "seed": a.seed,
                "max_new_tokens": a.max_new_tokens,
                "sampling": {"ChatTTS defaults, except": chosen} if chosen else "ChatTTS defaults",
                "speaker": forced or "the held-out sentence's speaker, by voice name",
            },
        }
    )
    # per sentence, so that two models measured on the same sentences compare pairwise (--paired); None where a
    # figure failed (JSON has no NaN)
    finite = lambda x: float(x) if x is not None and np.isfinite(x) else None  # noqa: E731
    res["per_sentence"] = [
        {
            "id": it["id"],
            "text": it["text"],
            "lang": it["lang"],
            "speaker": voice[it["id"]],
            "mcd_db": finite(mcds[i]),
            "dnsmos_ovrl": finite(dn_syn[i]) if i < k else None,
            "duration_ratio": ratios[i],
            "eos": eos[i],
            **({"asr": asr_row(*heard["synth"][i])} if "synth" in heard else {}),
        }
        for i, it in enumerate(items)
    ]
    for lang in ("en", "zh"):
        sel = [i for i, it in enumerate(items) if it["lang"] == lang]
        m = [mcds[i] for i in sel if np.isfinite(mcds[i])]
        res["per_language"][lang] = {
            "n": len(sel),
            "mcd_db": float(np.mean(m)) if m else None,
            "duration_within_25pct": share_within_25pct([ratios[i] for i in sel]) if sel else None,
            "eos_reached": float(np.mean([eos[i] for i in sel])) if sel else None,
        }
    report(res, a.json)
    if a.pictures:
        a.pictures.mkdir(parents=True, exist_ok=True)
        picks = [
            next(i for i, it in enumerate(items) if it["lang"] == "en" and len(it["text"]) < 50),
            next(i for i, it in enumerate(items) if it["lang"] == "zh"),
            next(i for i, it in enumerate(items) if it["lang"] == "en" and len(it["text"]) > 60),
        ]
        for n, i in enumerate(picks, 1):
            it = items[i]
            picture(
                refs[i], wavs[i], f"{it['id']} ({it['speaker']}): {picture_text(it)}", a.pictures / f"heldout_{n}.png"
            )
    return res


def report(res: dict, json_out: Path | None) -> dict:
    """Print the figures, and write them to json_out if given."""
    print(json.dumps(res, indent=2, ensure_ascii=False))
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(res, indent=2, ensure_ascii=False) + "\n")
    return res


if __name__ == "__main__":
    main()

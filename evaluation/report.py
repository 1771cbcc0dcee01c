"""Report writers: report.json (schema in evaluation/README.md), report.md, report.html with plots, WAVs.
The GUI saves its comparisons through the same functions."""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path


def _fmt(stat: dict | None, spec: str = ".2f") -> str:
    if not stat:
        return "–"
    return f"{stat['mean']:{spec}} [{stat['lo']:{spec}}, {stat['hi']:{spec}}]"


INTELLIGIBILITY = {"wer": "WER en", "cer": "CER zh", "mer": "MER mixed"}


def intelligibility_columns(report: dict) -> list[str]:
    """The error rates present in a report (wer, cer, mer), in that order."""
    present = {k for r in report["precisions"].values() for k in (r["end_to_end"].get("intelligibility") or {})}
    return [k for k in INTELLIGIBILITY if k in present]


def asr_line(report: dict) -> str:
    a = report.get("asr")
    if not a:
        return "Intelligibility not scored (no ASR: install the asr extra)."
    d = a["decoding"]
    return (
        f"ASR: {a['model']} (faster-whisper {a['versions']['faster-whisper']}, {d['compute_type']}, beam "
        f"{d['beam_size']}, temperature 0, language given; Mandarin prompted and with repetition penalty "
        f"{d['zh_repetition_penalty']}), every seed; text normalised (numbers spelled, case, punctuation, "
        "traditional to simplified). WER over words (en), CER over characters (zh), MER over Han characters "
        "plus Latin words (mixed)."
    )


def models_line(report: dict) -> str:
    """The folder each row ran: the report's model, or per row where a GUI comparison ran several folders."""
    by: dict[str, list[str]] = {}
    for name, r in report["precisions"].items():
        by.setdefault(r.get("model", report["model"]), []).append(name)
    if len(by) <= 1:
        return f"Model: {next(iter(by), report['model'])}."
    return "Models: " + "; ".join(f"{', '.join(names)}: {m}" for m, names in by.items()) + "."


def markdown_table(report: dict) -> str:
    floor = report["noise_floor"]
    cols = intelligibility_columns(report)
    lines = [
        "| precision | "
        + "".join(f"{INTELLIGIBILITY[c]} | " for c in cols)
        + ("ASR gap vs FP32 | " if cols else "")
        + "size MiB | RTF | steps/s | latency s | dec+voc MCD dB | PESQ-wb | GPT top-1 | GPT KL | "
        "e2e DTW-MCD dB | duration ratio | DNSMOS | within noise floor |",
        "|---|" + "---|" * (len(cols) + bool(cols)) + "---:|---:|---:|---:|---|---|---|---|---|---|---|:---:|",
    ]
    for name, r in report["precisions"].items():
        p, dv, g, e = r["performance"], r["decoder_vocoder"], r["gpt_teacher_forced"], r["end_to_end"]
        heard = e.get("intelligibility") or {}
        gap = ("–" if name == "fp32" else _fmt(r.get("asr_gap_vs_fp32"), "+.3f")) if cols else None
        lines.append(
            f"| {name} | "
            + "".join(f"{_fmt(heard.get(c), '.3f')} | " for c in cols)
            + (f"{gap} | " if cols else "")
            + f"{p['size_bytes'] / 2**20:.1f} | {p['rtf']:.3f} | {p['steps_per_s']:.0f} | "
            f"{p['latency_s']:.2f} | {_fmt(dv['mcd_db'])} | {_fmt(dv['pesq_wb'])} |"
            f" {_fmt(g['top1_agreement'], '.3f')} | "
            f"{_fmt(g['kl_nats'], '.1e')} | {_fmt(e['dtw_mcd_db'])} | {_fmt(e['duration_ratio'])} | "
            f"{_fmt(e['dnsmos_ovrl'])} | {'✓' if r['within_noise_floor'] else '✗'} |"
        )
    lines += [
        "",
        f"Noise floor (FP32 seed {report['seeds'][1]} vs seed {report['seeds'][0]}): DTW-MCD "
        f"{_fmt(floor['dtw_mcd_db'])} dB, duration ratio {_fmt(floor['duration_ratio'])}.",
        "Values are means with 95% bootstrap CIs over sentences (error rates pooled over sentences and seeds); "
        "timings are medians, warm-up excluded, batch 1. Within the noise floor: the end-to-end MCD gap against "
        "FP32's seed-to-seed MCD, and the error-rate gap against FP32, are not above zero at 95%.",
        asr_line(report),
        models_line(report),
        f"Device: {report['device']} ({report['hardware']}). Text set: {report['text_set']['file']} "
        f"({report['text_set']['records']} records). {report['mcd_settings']}.",
    ]
    return "\n".join(lines)


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _plots(report: dict, utts: dict) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    names = list(report["precisions"])
    fig, ax = plt.subplots(figsize=(6, 4))
    for n in names:
        r = report["precisions"][n]
        q = r["decoder_vocoder"]["mcd_db"]
        x, y = r["performance"]["rtf"], (q or {"mean": 0})["mean"]
        ax.scatter(x, y, s=60)
        ax.annotate(n, (x, y), textcoords="offset points", xytext=(5, 5))
    ax.set_xlabel("real-time factor (lower is faster)")
    ax.set_ylabel("decoder+vocoder MCD vs FP32, dB (lower is better)")
    ax.set_title("Latency vs quality")
    ax.grid(alpha=0.3)
    out.append(("Latency versus quality (Pareto)", _png(fig)))

    fig, ax = plt.subplots(figsize=(7, 4))
    data = [
        [v["dtw_mcd_db"] for v in report["precisions"][n]["per_sentence"].values() if v["dtw_mcd_db"] is not None]
        for n in names
    ]
    ax.boxplot(data, tick_labels=names)
    floor = report["noise_floor"]["dtw_mcd_db"]
    if floor:
        ax.axhspan(floor["lo"], floor["hi"], color="grey", alpha=0.3, label="FP32 seed-to-seed (95% CI)")
        ax.legend()
    ax.set_ylabel("end-to-end DTW-MCD vs FP32, dB")
    ax.set_title("Per-sentence distribution")
    out.append(("Per-sentence end-to-end MCD", _png(fig)))

    seed = report["seeds"][0]
    first = next(iter(utts[names[0]][seed]))
    fig, axes = plt.subplots(len(names), 1, figsize=(8, 1.8 * len(names)), squeeze=False)
    for ax, n in zip(axes[:, 0], names):
        wav = utts[n][seed][first].wav
        ax.specgram(wav + 1e-9, NFFT=1024, Fs=24000, noverlap=768, cmap="magma")
        ax.set_ylabel(n)
        ax.set_ylim(0, 8000)
    axes[-1, 0].set_xlabel(f"seconds ({first}, seed {seed})")
    out.append(("Spectrograms of the same sentence and seed", _png(fig)))
    return out


def heard_table(report: dict) -> str:
    """HTML: what the ASR heard, utterance by utterance, for every precision (first seed), errors per utterance."""
    names = list(report["precisions"])
    first = report["precisions"][names[0]]["per_sentence"]
    if not any(row.get("asr") for row in first.values()):
        return ""
    head = "<tr><th>id</th><th>text</th>" + "".join(f"<th>{html.escape(n)}</th>" for n in names) + "</tr>"
    body = []
    for rid in first:
        cells = []
        for n in names:
            a = (report["precisions"][n]["per_sentence"][rid].get("asr") or [None])[0]
            if a is None:
                cells.append("<td>–</td>")
                continue
            rate = (a["sub"] + a["dele"] + a["ins"]) / max(a["ref_tokens"], 1)
            cells.append(
                f"<td>{html.escape(a['heard'])}<br><small>{rate:.2f} ({a['sub']} sub, {a['dele']} del, "
                f"{a['ins']} ins / {a['ref_tokens']})</small></td>"
            )
        text = report.get("texts", {}).get(rid, "")
        body.append(f"<tr><td>{html.escape(rid)}</td><td>{html.escape(text)}</td>{''.join(cells)}</tr>")
    return f"<h2>What the ASR heard (seed {report['seeds'][0]})</h2><table>{head}{''.join(body)}</table>"


def write_report(report: dict, utts: dict, out: str | Path) -> Path:
    """utts: {precision: {seed: {record id: Utterance}}}. Writes into `out` (created if missing)."""
    from toolkit.audio import write_wav

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, by_seed in utts.items():
        for seed, by_id in by_seed.items():
            folder = out / "wavs" / name
            folder.mkdir(parents=True, exist_ok=True)
            for rid, u in by_id.items():
                write_wav(folder / f"{rid}_seed{seed}.wav", u.wav, u.sample_rate, force=True)
    (out / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False, default=float) + "\n")
    table = markdown_table(report)
    (out / "report.md").write_text(f"# ttsq evaluation\n\n{table}\n")
    figures = "".join(
        f"<h2>{html.escape(t)}</h2><img src='data:image/png;base64,{b}'/>" for t, b in _plots(report, utts)
    )
    rows = "".join(
        f"<tr>{''.join(f'<td>{html.escape(c.strip())}</td>' for c in line.strip('|').split('|'))}</tr>"
        for line in table.splitlines()[:1] + table.splitlines()[2:]
        if line.startswith("|")
    )
    notes = "".join(f"<p>{html.escape(line)}</p>" for line in table.splitlines() if line and not line.startswith("|"))
    notes += heard_table(report)
    (out / "report.html").write_text(
        "<!doctype html><meta charset='utf-8'><title>ttsq evaluation</title>"
        "<style>body{font-family:sans-serif;margin:2em}td{border:1px solid #ccc;padding:4px 8px}"
        "table{border-collapse:collapse}img{max-width:100%}</style>"
        f"<h1>ttsq evaluation</h1><table>{rows}</table>{notes}{figures}"
    )
    return out

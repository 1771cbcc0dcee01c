"""Alignment check for a trained voice: does the GPT's guided layer read along the text on sentences it never
trained on, as it does on its training sentences? For each sentence: free-running generation (seed 0, ChatTTS
default sampling), then the guided heads' attention from every code step over the prompt's text positions, and
the off-diagonal mass the guided-attention loss penalises (0 = on the diagonal; what train.py logs as `ga`), and
how many steps the model went on after its attention reached the end of the text (a late EOS).
A picture per sentence, training sentences on the top row, held-out ones below.

    python -m training.voice.alignment --corpus DIR --out docs/voice/alignment.png [--n 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from .train import GUIDED_HEADS, GUIDED_LAYER, off_diagonal_mass, text_attention


@torch.inference_mode()
def sentence_alignment(syn, text: str, speaker: str, max_new_tokens: int = 450) -> tuple[np.ndarray, float, bool]:
    """-> (attention of each code step over the text positions (N, T), off-diagonal mass, EOS reached)."""
    from toolkit.engine import Engine
    from toolkit.prompt import encode_prompts
    from toolkit.sampling import SamplingParams

    gpt = syn.model.gpt
    emb, valid = encode_prompts(syn.model, [text], syn.speaker_vector(speaker))
    gen = Engine(gpt).generate(emb, valid, SamplingParams(max_new_tokens=max_new_tokens), seed=0)
    n = int(gen.lengths[0])
    x = torch.cat([emb, gpt.embed_codes(gen.codes[:, :n]).to(emb.dtype)], 1)  # prompt, then the codes it drew
    layer = gpt.layers[min(GUIDED_LAYER, gpt.cfg.layers - 1)].attention
    seen = {}
    hook = layer.register_forward_pre_hook(lambda module, args: seen.setdefault("x", args))
    gpt.forward_full(x, torch.ones(x.shape[:2], dtype=torch.bool, device=x.device))
    hook.remove()
    T, N = torch.tensor([emb.shape[1]]), torch.tensor([n])
    att = text_attention(layer, *seen["x"][:3], T, GUIDED_HEADS)  # (1, h, L, L)
    mass = float(off_diagonal_mass(att, T, N))
    rows = att[0].mean(0)[emb.shape[1] - 1 : emb.shape[1] - 1 + n, : emb.shape[1]]  # code steps x text positions
    return rows.cpu().numpy(), mass, bool(gen.finished[0])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="a corpus folder (corpus.py): its meta.jsonl")
    ap.add_argument("--model", type=Path, default=None, help="default: the shipped voice")
    ap.add_argument("--n", type=int, default=3, help="sentences per split")
    ap.add_argument("--out", type=Path, required=True, help="PNG to write")
    ap.add_argument("--json", type=Path, default=None, help="the per-sentence figures")
    a = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from toolkit.synthesizer import Synthesizer

    from .withdraw import in_offered_voices

    items = [json.loads(line) for line in open(a.corpus / "meta.jsonl", encoding="utf-8")]
    syn = Synthesizer(a.model, device="cpu")
    (items,) = in_offered_voices(items, syn.model.voices)
    picked = {split: [it for it in items if it["split"] == split][: a.n] for split in ("train", "heldout")}
    fig, axes = plt.subplots(2, a.n, figsize=(4 * a.n, 7), squeeze=False)
    rows = []
    for r, (split, group) in enumerate(picked.items()):
        for c, it in enumerate(group):
            att, mass, eos = sentence_alignment(syn, it["text"], it["speaker"])
            at_end = np.flatnonzero(att.argmax(1) >= att.shape[1] - 2)  # steps reading the last text positions
            rows.append(
                {
                    "split": split,
                    "id": it["id"],
                    "lang": it["lang"],
                    "text": it["text"],
                    "code_steps": att.shape[0],
                    "text_positions": att.shape[1],
                    "off_diagonal_mass": round(mass, 4),
                    "eos": eos,
                    "steps_after_text_end": int(att.shape[0] - at_end[0]) if len(at_end) else None,
                }
            )
            ax = axes[r, c]
            ax.imshow(att.T, origin="lower", aspect="auto", interpolation="nearest")
            ax.set_title(f"{split} {it['id']} ({it['lang']}): off-diagonal {mass:.2f}", fontsize=9)
            ax.set_xlabel("code step")
            ax.set_ylabel("text position")
            print(json.dumps(rows[-1], ensure_ascii=False), flush=True)
    fig.tight_layout()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.out, dpi=80)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

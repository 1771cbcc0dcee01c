#!/usr/bin/env bash
# The shipped voice's check as a user runs it: `ttsq synth TEXT -o F` (no --model, no --speaker: the default voice)
# on a corpus's held-out sentences, then DNSMOS overall and the duration against each sentence's espeak reference.
#   bash benchmarks/voice_synth_check.sh CORPUS N OUT_DIR
# e.g. CORPUS from `python -m training.voice.corpus --out runs/corpus_fresh3 --train 0 --heldout 20 --seed 3
# --unseen-by runs/corpus_40k`. Prints one JSON line per sentence, then the means; writes the WAVs and rows.json into
# OUT_DIR, which must be new or empty. Run from the repository root in its environment (source .venv/bin/activate).
set -euo pipefail
corpus=${1:?corpus folder} n=${2:?how many held-out sentences} out=${3:?output folder}
if [ -n "$(ls -A "$out" 2>/dev/null)" ]; then echo "$out is not empty: give a new folder" >&2; exit 2; fi
mkdir -p "$out"
python - "$corpus" "$n" "$out" <<'PY'
import json, subprocess, sys
from pathlib import Path

import numpy as np
import soundfile as sf

from training.voice.measure import dnsmos_scores, heldout, share_within_25pct

corpus, n, out = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
rows = []
for it, ref in zip(*heldout(corpus, n)):  # references at 24 kHz
    wav_path = out / f"{it['id']}.wav"
    subprocess.run(["ttsq", "synth", it["text"], "-o", str(wav_path)], check=True, capture_output=True)
    wav, sr = sf.read(wav_path, dtype="float32")
    rows.append({"id": it["id"], "lang": it["lang"], "text": it["text"], "dnsmos": dnsmos_scores(wav, sr)["ovrl"],
                 "reference_dnsmos": dnsmos_scores(ref)["ovrl"],
                 "duration_ratio": (len(wav) / sr) / (len(ref) / 24000)})
    print(json.dumps(rows[-1], ensure_ascii=False), flush=True)
(out / "rows.json").write_text(json.dumps(rows, ensure_ascii=False, indent=1) + "\n")
score = {lang: float(np.mean([r["dnsmos"] for r in rows if r["lang"] == lang])) for lang in ("en", "zh")}
print(json.dumps({"sentences": len(rows), "dnsmos": float(np.mean([r["dnsmos"] for r in rows])), **score,
                  "reference_dnsmos": float(np.mean([r["reference_dnsmos"] for r in rows])),
                  "duration_within_25pct": share_within_25pct([r["duration_ratio"] for r in rows])}))
PY

#!/usr/bin/env bash
# One GPU call (`run` with carry [PACK, RESUME]): the gpt stage of training.voice.train on a carried codes pack,
# resumed from a carried run folder. The GPT (with its Decoder and speaker table) comes back as fp16 run-checkpoint
# shards in $OUT/ckpt (a file comes back from the device only under 16 MiB), with the training log.
#   bash benchmarks/voice_gpt_h200.sh PACK RESUME [training.voice.train options...]
# e.g. PACK runs/corpus_40k/pack, RESUME runs/ckpt_in (python -m training.voice.train --from-voice ... --out DIR, less
# its vocos files, which the gpt stage does not read), options --gpt-grow 4 --gpt-minutes 8 ...
set -euo pipefail
cd "$(dirname "$0")/.."
pack=${1:?a codes pack folder}
resume=${2:?a run folder with gpt and dvae checkpoints}
shift 2
t0=$(date +%s)
source benchmarks/device_env.sh
out=${OUT:-runs/gpt_out}
mkdir -p "$out/ckpt"
python3 -m training.voice.train --data "$pack" --resume "$resume" --stages gpt --out runs/gpt_run --device cuda "$@" \
  > "$out/train_log.jsonl"
tail -3 "$out/train_log.jsonl"
python3 -c "import sys, torch; from pathlib import Path; from training.voice.train import load_state, save_state
state, meta = load_state(Path(sys.argv[1]), 'gpt'); save_state(Path(sys.argv[2]), 'gpt', state, meta, torch.float16)" \
  runs/gpt_run "$out/ckpt"
ls -la "$out/ckpt"
echo "total: $(( $(date +%s) - t0 )) s"

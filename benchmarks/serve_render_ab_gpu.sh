#!/usr/bin/env bash
# The scheduler's options A/B on one GPU, one process, one call (about 4 to 7 minutes on a cold compile cache; each
# mode writes the results file as it ends, so a call cut short keeps the modes done):
# serve_profile.py at 1 and 64 requests at once and 64 staggered requests of 3 sentences, for MODES (default:
# `ttsq serve --compile`'s scheduler, the same with its renders' stream first, and the compiled step with attention
# traced, the one before). Results: $OUT/serve_render_ab.json.
#   the device:  TTSQ_COMMIT=<this checkout's commit> bash benchmarks/serve_render_ab_gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=${OUT:-out/serve_render_ab}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.csv" || true
modes=${MODES:-compiled+bounded+render-graphs,compiled+bounded+render-graphs+render-first,compiled}
python3 benchmarks/serve_profile.py --device cuda --precision bf16 --batches 1,64 --staggered 3:4 --modes "$modes" \
  --out "$out/serve_render_ab.json" 2>&1 | grep -v Warning | cut -c1-400

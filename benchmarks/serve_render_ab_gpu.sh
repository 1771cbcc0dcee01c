#!/usr/bin/env bash
# The scheduler's render options A/B on one GPU, one machine, one call (about 5 minutes on a cold compile cache):
# serve_profile.py with the compiled step, 1 and 64 requests at once and 64 staggered requests of 3 sentences,
# for the default renders, --render-graphs, --render-first and both. Results: $OUT/serve_render_ab_*.json.
#   the device:  TTSQ_COMMIT=<this checkout's commit> bash benchmarks/serve_render_ab_gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
out=${OUT:-out/serve_render_ab}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.csv" || true
for variant in default render-graphs render-first render-graphs,render-first; do
  flags=""
  [ "$variant" = default ] || flags=$(echo "--$variant" | sed 's/,/ --/')
  name=serve_render_ab_${variant//,/_}
  # shellcheck disable=SC2086  # flags is a list of options
  python3 benchmarks/serve_profile.py --device cuda --precision bf16 --batches 1,64 --modes compiled $flags \
    --out "$out/$name.json" 2>&1 | grep '"batch"' | cut -c1-300 || true
  # shellcheck disable=SC2086
  python3 benchmarks/serve_profile.py --device cuda --precision bf16 --batches 64 --modes compiled $flags \
    --sentences 3 --stagger-ms 4 --out "$out/${name}_staggered.json" 2>&1 | grep '"batch"' | cut -c1-300 || true
done

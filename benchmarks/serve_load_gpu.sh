#!/usr/bin/env bash
# `ttsq serve` under load on one GPU, end to end, offline: random weights at ChatTTS's dimensions (EOS barred, 235
# steps = 5 s of audio per sentence), 64 concurrent streaming clients with random text lengths, against a baseline
# in the same run (the same server, requests one at a time). Results: $OUT/serve_load_gpu.json and .md.
# SERVE_LOAD_ARGS=--compile serves with the scheduler's whole step compiled, as `ttsq serve --compile` (add
# --warm-up-positions 1024 to compile only the cache lengths 64 streams of one-sentence prompts reach);
# SERVE_LOAD_ARGS="--mode compiled+bounded+render-graphs" serves with Scheduler options (serve_profile.py's modes);
# SERVE_LOAD_NAME names the result files (default serve_load_gpu).
#   here:        bash benchmarks/serve_wheels.sh          (fills .whl/serve/, about 9 MiB)
#   the device:  carry .whl/serve, run `TTSQ_COMMIT=<this checkout's commit> bash benchmarks/serve_load_gpu.sh`
#                (the device's copy of .git can be stale: its HEAD once named an older commit than the one that ran)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/serve/*.whl 2>&1 \
  | grep -v "^WARNING: Target directory" || true
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
out=${OUT:-out/serve_load}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.csv" || true
python3 benchmarks/serve_load.py --dims chattts --device cuda --precision bf16 --slots 64 --max-queue 256 \
  --clients 64 --requests 384 --baseline-requests 6 --words 10 40 --max-chars 60 --steps-per-sentence 235 \
  --time-limit 240 ${SERVE_LOAD_ARGS:-} --out "$out/${SERVE_LOAD_NAME:-serve_load_gpu}.json" 2>&1 | tail -40

#!/usr/bin/env bash
# Fetch (here, where pip reaches the registries) what `ttsq serve` and benchmarks/serve_load.py need on the GPU
# machine and its image lacks, as cp312 x86-64 wheels in .whl/serve/ (git-ignored; about 10 MiB): the serve extra
# with its dependencies, torchao (the precision recipes) and soundfile. benchmarks/serve_load_gpu.sh installs them.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl/serve && mkdir -p .whl/serve
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64 manylinux_2_34_x86_64; do platforms+=(--platform "$p"); done
get() { python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
          "${platforms[@]}" -d .whl/serve "$@"; }
get "fastapi>=0.110" "uvicorn>=0.29" "prometheus-client>=0.20" "httpx>=0.27"
get --no-deps torchao==0.18.0 soundfile==0.14.0 cffi==2.1.1 pycparser
du -sh .whl/serve && ls .whl/serve

#!/usr/bin/env bash
# Fetch (here, where pip reaches the registries) what the GPU machine lacks, as cp312 x86-64 wheels and sdists in
# .whl/ (git-ignored), so that a device call can carry them:
#   torchao (the int4/int8/fp8 recipes), the chattts package and its missing dependencies (`ttsq bench`), and the
#   scoring stack of `ttsq evaluate` (pysptk and pesq come as sdists, built there with its compiler).
# On the device, start the command with `source benchmarks/device_env.sh`, which installs them into /tmp/site.
# .whl/eval/ is the subset `ttsq evaluate` needs (torchao, the scoring stack, speechmos's DNSMOS models only): carry
# it instead of .whl/ when the shipped voice and .espeak/ travel too (the carry limit is 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
grep -qx '/.whl/' .gitignore || echo "/.whl/ is not ignored: add it to .gitignore" >&2
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64 manylinux_2_34_x86_64; do platforms+=(--platform "$p"); done
get() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
          "${platforms[@]}" -d .whl "$@"; }
# versions as measured on the H200 machine (torch 2.11, CUDA 13, Python 3.12)
get torchao==0.18.0
get vocos==0.1.0 vector-quantize-pytorch==1.32.0 einx frozendict loguru torch-einops-utils pybase16384
python3 -m pip wheel -q --no-deps -w .whl chattts==0.2.5 encodec==0.1.1   # sdist-only: pure Python
# the versions the CPU test suite runs with
get speechmos==0.0.1.1 pystoi==0.4.1 librosa==0.11.0 soxr==1.1.0 audioread==3.1.0 pooch==1.9.0 platformdirs==4.14.9 \
    decorator==5.3.1 soundfile==0.14.0 cffi==2.1.1 pycparser
get setuptools==80.10.2  # the version the sdists below were built with here (offline, no build isolation)
get pytest-runner==6.0.1  # pesq's setup_requires: without it on PYTHONPATH its offline build fails (H200, 2026-12-03)
# metadata is prepared with the project venv's build tools (make setup), so no build isolation is needed
.venv/bin/python -m pip download -q --no-deps --no-binary=:all: --no-build-isolation -d .whl pysptk==1.0.1 pesq==0.0.4
rm -rf .whl/eval && mkdir -p .whl/eval/site
for f in torchao soundfile soxr librosa cffi pycparser pooch platformdirs decorator audioread pystoi setuptools \
         pytest_runner; do cp .whl/"$f"-*.whl .whl/eval/; done
cp .whl/pysptk-*.tar.gz .whl/pesq-*.tar.gz .whl/eval/
# speechmos unpacked, with only the DNSMOS models it loads (the wheel's other models are 7 MB of the carry)
(cd .whl/eval/site && python3 -m zipfile -e ../../speechmos-0.0.1.1-py3-none-any.whl . &&
   rm -rf speechmos-*.dist-info speechmos/aecmos_models speechmos/plcmos_models speechmos/pdnsmos_models \
          speechmos/dnsmos_models/bak_ovr.onnx speechmos/dnsmos_models/sig.onnx)
du -sh .whl .whl/eval

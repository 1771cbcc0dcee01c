# On the GPU machine (no package index, no apt): install what a device call carried, then set the environment.
#   source benchmarks/device_env.sh
# Installs into /tmp/site whichever of these the call carried: .whl/ (benchmarks/gpu_wheels.sh: everything) or
# .whl/eval/ (its subset for `ttsq evaluate`, small enough to travel with the shipped voice and .espeak/ under the
# 64 MiB carry limit), and .espeak/ (benchmarks/espeak_carry.sh). Wheels first: the sdists (pysptk, pesq) build
# against the carried setuptools and pytest-runner on PYTHONPATH.
_ttsq_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONPATH=/tmp/site:$_ttsq_root/.whl/eval/site:$_ttsq_root${PYTHONPATH:+:$PYTHONPATH}
for _dir in "$_ttsq_root/.whl" "$_ttsq_root/.whl/eval"; do
  if compgen -G "$_dir/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$_dir"/*.whl 2>&1 \
      | grep -v "^WARNING: Target directory" || true
  fi
done
for _sdist in "$_ttsq_root"/.whl/*.tar.gz "$_ttsq_root"/.whl/eval/*.tar.gz; do  # one at a time: a failure names itself
  [ -e "$_sdist" ] && { python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site "$_sdist" \
    >/tmp/sdist.log 2>&1 || echo "device_env.sh: building $(basename "$_sdist") failed, see /tmp/sdist.log" >&2; }
done
if [ -d "$_ttsq_root/.espeak" ]; then
  eval "$(cd "$_ttsq_root" && bash benchmarks/espeak_carry.sh install /tmp/espeak)"
fi
unset _ttsq_root _dir _sdist
export PYTHONUNBUFFERED=1  # a call cut at its time limit still returns the log lines printed so far

#!/usr/bin/env bash
# espeak-ng for a machine that has no apt (the GPU machine): the shipped voice's front end (libespeak-ng, in
# process) and the corpus builder (the espeak-ng program) need it there.
#   bash benchmarks/espeak_carry.sh fetch           here: download the Debian packages into .espeak/ (git-ignored)
#   eval "$(bash benchmarks/espeak_carry.sh install /tmp/espeak [--all])"
#                                                  there: unpack them under DIR, put espeak-ng on PATH, its data on
#                                                  ESPEAK_DATA_PATH, and on LD_LIBRARY_PATH only the libraries the
#                                                  machine lacks (--all: every one, to check the carried copy here)
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES="espeak-ng espeak-ng-data libespeak-ng1 libpcaudio0 libsonic0 libpulse0 libasound2 libsndfile1 libflac12
  libvorbis0a libvorbisenc2 libopus0 libogg0 libmpg123-0 libmp3lame0 libasyncns0 libx11-xcb1 libx11-6 libxcb1
  libxau6 libxdmcp6 libdbus-1-3 libbsd0 libmd0"
case "${1:-}" in
  fetch)
    mkdir -p .espeak
    (cd .espeak && apt-get download $PACKAGES >/dev/null)
    grep -qx '/.espeak/' .gitignore || echo "warning: /.espeak/ is not in .gitignore" >&2
    du -sh .espeak >&2 ;;
  install)
    dir=${2:?install needs a folder}
    stage="$dir/stage"
    mkdir -p "$stage" "$dir/lib"
    for f in .espeak/*.deb; do dpkg -x "$f" "$stage"; done
    known=$( (PATH=$PATH:/sbin:/usr/sbin ldconfig -p 2>/dev/null) || true)  # libraries the machine has
    while IFS= read -r so; do
      name=$(basename "$so")
      if [ "${3:-}" = --all ] || ! grep -qF $'\t'"$name " <<<"$known"; then cp -L "$so" "$dir/lib/$name"; fi
    done < <(find "$stage" \( -name 'lib*.so.*' -o -name 'lib*.so' \) \( -type f -o -type l \))  # lib*.so: libpulsecommon-16.1.so
    echo "export PATH=\"$stage/usr/bin:\$PATH\" LD_LIBRARY_PATH=\"$dir/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\"" \
      "ESPEAK_DATA_PATH=\"$stage/usr/lib/x86_64-linux-gnu/espeak-ng-data\"" ;;
  *) echo "usage: $0 fetch | install DIR [--all]" >&2; exit 2 ;;
esac

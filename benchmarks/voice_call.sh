# The start of a voice training call on the device, sourced by voice_decoder_h200.sh and voice_vocos_h200.sh after
# they set: corpus (a folder), corpus_options (an array of training.voice.corpus options), fresh (the run folder that
# the shipped voice is written to when RESUME is unset), out_default and margin (seconds kept for after training).
# Reads UTTERANCES DEADLINE_SECONDS from the caller's arguments and shifts them off; then it installs what the call
# carried, builds the corpus unless an earlier call on the same warm machine built it with the same options for the
# same shipped voice, and sets: t0, out ($OUT), resume (RESUME, or $fresh), minutes (what DEADLINE leaves to train),
# and the function whole_run.
utterances=${1:?number of training utterances}
deadline=${2:?seconds the whole script may take}
shift 2
t0=$(date +%s)
source benchmarks/device_env.sh
out=${OUT:-$out_default}
mkdir -p "$out"
_built="--train $utterances ${corpus_options[*]}, model $(sha256sum toolkit/assets/voice/model.safetensors | cut -c1-16)"
if [ "$(cat "$corpus/built_with" 2>/dev/null)" = "$_built" ]; then
  echo "corpus: $corpus, built by an earlier call with the same options"
else
  rm -f "$corpus/built_with"
  python3 -m training.voice.corpus --out "$corpus" --train "$utterances" --heldout 100 --seed 0 --workers 14 \
    "${corpus_options[@]}" 2>&1 | tail -3
  echo "$_built" > "$corpus/built_with"
fi
resume=${RESUME:-$fresh}
[ -n "${RESUME:-}" ] || python3 -m training.voice.train --from-voice toolkit/assets/voice --from-voice-fp32 --out "$resume"
minutes=$(python3 -c "print(round(($deadline - ($(date +%s) - $t0) - $margin) / 60, 2))")
echo "corpus and checkpoints: $(( $(date +%s) - t0 )) s; training for $minutes minutes"
unset _built

# whole_run RUN STAGE...: copy into RUN the resumed run's checkpoints of the STAGEs it lacks (stages not trained in
# this call), so that RUN is a whole run folder for a later RESUME=RUN or --export
whole_run() {
  local run=$1 stage f
  shift
  for stage in "$@"; do
    for f in "$resume/$stage".*; do
      [ ! -e "$f" ] || [ -e "$run/${f##*/}" ] || cp "$f" "$run/"
    done
  done
}

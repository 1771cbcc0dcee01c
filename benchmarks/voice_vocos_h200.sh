#!/usr/bin/env bash
# One GPU call (`run` with carry [".espeak", ".whl/eval"]): build a PCM corpus there, then train the shipped voice's
# vocoder on (`train --stages vocos`, from its weights), e.g. with --vocos-gan against Vocos's discriminators. Back come
# the vocoder's run checkpoint ($OUT/vocos.0.pt and vocos.json, fp32, about 8 MB) and the training log; beside the
# shipped voice's other run checkpoints (`train --from-voice`) it exports as a voice (`train --stages "" --export`).
#   bash benchmarks/voice_vocos_h200.sh UTTERANCES DEADLINE_SECONDS [training.voice.train options...]
# The training gets what is left of DEADLINE_SECONDS after the corpus, less a margin for saving. A warm machine keeps
# runs/ between calls: RESUME=runs/voc goes on from the previous call's run (its vocoder, and with --vocos-gan its
# discriminators, 41 M parameters, which stay there; a --vocos-grow belongs to the first call only). DEVICE=cpu runs
# it here, slowly (a check of the script). With --vocos-on-decoder the corpus also holds the shipped voice's codes
# (`corpus --codes-from`), so that the vocoder reads its Decoder's teacher-forced mels, paired with the real audio.
set -euo pipefail
cd "$(dirname "$0")/.."
corpus=runs/corpus_pcm fresh=runs/voc_in out_default=runs/vocos_out margin=30
corpus_options=(--vocoder-seconds 100000)
if [[ " $* " == *" --vocos-on-decoder "* ]]; then
  corpus=runs/corpus_pcm_codes
  corpus_options+=(--codes-from toolkit/assets/voice)
fi
source benchmarks/voice_call.sh
rm -rf runs/voc.next
python3 -m training.voice.train --data "$corpus/pack" --resume "$resume" --stages vocos --out runs/voc.next \
  --vocos-minutes "$minutes" --device "${DEVICE:-cuda}" "$@" > "$out/train_log.jsonl"
tail -3 "$out/train_log.jsonl"
whole_run runs/voc.next gpt dvae  # so that RESUME=runs/voc finds the GPT and DVAE too
rm -rf runs/voc && mv runs/voc.next runs/voc  # RESUME=runs/voc reads the previous run while this one writes
cp runs/voc/vocos.0.pt runs/voc/vocos.json "$out/"
echo "total: $(( $(date +%s) - t0 )) s"

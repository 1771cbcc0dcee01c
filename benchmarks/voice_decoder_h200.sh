#!/usr/bin/env bash
# One GPU call (`run` with carry [".espeak", ".whl/eval"]): build the codes+mels corpus there, then train a Decoder,
# alone, on the shipped voice's frozen GPT states (`train --freeze-gpt`, the GPT bit for bit the shipped one's). Only
# the Decoder's weights come back ($OUT/decoder.safetensors, fp16), with the training log; `training.voice.train --export
# --decoder-from` puts them into a voice folder beside the shipped GPT, DVAE and vocoder.
#   bash benchmarks/voice_decoder_h200.sh UTTERANCES DEADLINE_SECONDS [training.voice.train options...]
# The training gets what is left of DEADLINE_SECONDS after the corpus, less a margin for the export of the weights.
# RESUME=DIR (a run folder with gpt and dvae checkpoints, carried) freezes that run's GPT instead of the shipped one's.
# A warm machine keeps runs/ between calls: the corpus is built once per UTTERANCES, and RESUME=runs/dec goes on from
# the previous call's run (its Decoder, and with --decoder-gan its discriminators).
# DEVICE=cpu runs it here, slowly (a check of the script).
set -euo pipefail
cd "$(dirname "$0")/.."
corpus=runs/corpus_mel fresh=runs/ckpt_in32 out_default=runs/decoder_out margin=45
corpus_options=(--codes-from toolkit/assets/voice --keep-mels --vocoder-seconds 0)
source benchmarks/voice_call.sh
python3 -m training.voice.train --data "$corpus/pack" --resume "$resume" --stages gpt --out runs/dec \
  --freeze-gpt --gpt-minutes "$minutes" --device "${DEVICE:-cuda}" --save-every 0 "$@" > "$out/train_log.jsonl"
tail -3 "$out/train_log.jsonl"
# fp16: a file comes back from the device only under 16 MiB (a 7.3 M-parameter Decoder is 29 MB in fp32)
python3 -c "import sys; from training.voice.train import save_part_fp16; save_part_fp16(*sys.argv[1:])" \
  runs/dec gpt decoder. "$out/decoder.safetensors"
[ ! -e runs/dec/decoder_disc.json ] || cp runs/dec/decoder_disc.* "$out/"
whole_run runs/dec dvae vocos  # the frozen DVAE, and the vocoder where RESUME has one
echo "total: $(( $(date +%s) - t0 )) s"

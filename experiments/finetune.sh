#!/usr/bin/env bash
# One fine-tuning run of the issue-12 comparison, recorded in docs/results/runs.jsonl (dev metrics, wall clock).
#   experiments/finetune.sh TASK INIT LR SEED [extra overrides]
#     TASK: sst2 | ud-pos | conll2003 | multi30k (configs/experiments/TASK.yaml)
#     INIT: pretrained (runs/encoder-30min/final) | scratch (same shape and tokenizer, --model.from_scratch)
# multi30k (finetune/seq2seq.py) takes the encoder from CHECKPOINT and the decoder from DECODER (default: the config's,
# runs/decoder-30min-de/final); scratch takes both shapes and tokenizers from them.
# CHECKPOINT=... overrides the checkpoint folder (e.g. runs/encoder-30min-shape for scratch runs started before
# final/ exists: same config.json and tokenizer, checked by experiments/shape_folder.py --check).
set -u
task=$1; init=$2; lr=$3; seed=$4; shift 4
ckpt=${CHECKPOINT:-runs/encoder-30min/final}
flag=""; [ "$init" = scratch ] && flag="--model.from_scratch"
out=runs/ft/$task-$init-lr$lr-s$seed${SUFFIX:-}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
script=classify; [ "$task" != sst2 ] && script=tag
checkpoints=(--model.checkpoint "$ckpt"); decoder=""
if [ "$task" = multi30k ]; then
  script=seq2seq; checkpoints=(--model.encoder_checkpoint "$ckpt")
  [ -n "${DECODER:-}" ] && checkpoints+=(--model.decoder_checkpoint "$DECODER") && decoder=" dec=$DECODER"
fi
exec "$(dirname "$0")/go.sh" "$task" "$out" "$task $init lr=$lr seed=$seed ckpt=$ckpt$decoder $*" -- \
  accelerate launch finetune/$script.py --config configs/experiments/$task.yaml "${checkpoints[@]}" $flag \
  --training.lr "$lr" --training.seed "$seed" --training.output_dir "$out" --training.overwrite_output_dir \
  --logging.logging_steps 100 "$@"

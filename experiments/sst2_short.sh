#!/usr/bin/env bash
# Short SST-2 protocol of the recipe search (dev only): the first 20,000 training sentences, 64 tokens, 1 epoch,
# batch 32, one evaluation on dev at the end; pretrained and from scratch with the same budget.
#   experiments/sst2_short.sh PRETRAIN_RUN LR SEED [pretrained|scratch] [extra args]
set -u
run=$1; lr=$2; seed=$3; init=$4; shift 4
name=$(basename "$run")
flag=""; [ "$init" = scratch ] && flag="--model.from_scratch"
out=runs/ft/sst2-short-$name-$init-lr$lr-s$seed
exec "$(dirname "$0")/go.sh" "sst2-short" "$out" "$name $init lr=$lr seed=$seed $*" -- \
  accelerate launch finetune/classify.py --config configs/experiments/sst2.yaml --model.checkpoint "$run/final" $flag \
  --data.max_train_samples 20000 --training.num_train_epochs 1 --training.lr "$lr" --training.seed "$seed" \
  --eval.each_epoch true --training.output_dir "$out" --training.overwrite_output_dir --logging.logging_steps 100 "$@"

#!/usr/bin/env bash
# Issue 12: Multi30k en->de from the 30-minute encoder + decoder against both from scratch, once the decoder is done.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
while [ ! -f runs/decoder-30min/final/config.json ]; do sleep 30; done
for init in pretrained scratch; do
  flag=""; [ $init = scratch ] && flag="--model.from_scratch"
  experiments/go.sh multi30k runs/ft/multi30k-$init-s1 "multi30k $init lr=1e-3 seed=1 ckpt=runs/encoder-30min/final" -- \
    accelerate launch finetune/seq2seq.py --config configs/experiments/multi30k.yaml $flag --training.seed 1 \
    --training.output_dir runs/ft/multi30k-$init-s1 --training.overwrite_output_dir --logging.logging_steps 100
done

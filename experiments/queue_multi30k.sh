#!/usr/bin/env bash
# Issue 12: Multi30k en->de from the 30-minute encoder + decoder against both from scratch, once the decoder is done,
# both side by side. STEPS (default: the config's one epoch, 906 steps) caps the fine-tuning budget, the same for both:
# one epoch took ~6 s/step on a shared core here, so the measured runs used STEPS=300. ENCODER (default
# runs/encoder-30min/final) is the pretrained encoder: the measured runs used the first recipe's (MLM+NSP) folder.
# These are the first Multi30k runs, with the English TinyStories decoder (runs/decoder-30min); the German decoder's
# runs (the config's default now) are made by experiments/queue_multi30k_de.sh.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
while [ ! -f runs/decoder-30min/final/config.json ]; do sleep 30; done
steps=${STEPS:--1}
encoder=${ENCODER:-runs/encoder-30min/final}
for init in pretrained scratch; do
  flag=""; [ $init = scratch ] && flag="--model.from_scratch"
  experiments/go.sh multi30k runs/ft/multi30k-$init-s1 "multi30k $init lr=1e-3 seed=1 ckpt=$encoder steps=$steps" -- \
    accelerate launch finetune/seq2seq.py --config configs/experiments/multi30k.yaml $flag --model.encoder_checkpoint "$encoder" \
    --model.decoder_checkpoint runs/decoder-30min/final --data.test_file ../shared/data/multi30k/test_2016_flickr.en --training.lr 1e-3 --training.seed 1 \
    --training.max_steps "$steps" --training.output_dir runs/ft/multi30k-$init-s1 --training.overwrite_output_dir \
    --logging.logging_steps 50 > runs/logs/multi30k-$init.log 2>&1 &
done
wait

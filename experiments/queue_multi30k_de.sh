#!/usr/bin/env bash
# Issue 12: Multi30k en->de, the recipe's encoder (CHECKPOINT, default runs/encoder-30min/final) + the German decoder
# (DECODER, default runs/decoder-30min-de/final: configs/experiments/decoder-30min-de.yaml) against both from scratch
# (same shapes and tokenizers), one epoch each, two jobs at a time (one thread each), every run recorded in
# docs/results/runs.jsonl (python experiments/summarize.py makes the table).
#   bash experiments/queue_multi30k_de.sh sweep   # seed 1, learning rates 5e-4 / 1e-3 / 2e-3 / 4e-3 per start, dev only
#   bash experiments/queue_multi30k_de.sh final   # seeds 1-3 at the rates picked on dev, test_2016_flickr read once
# The rates of `final` (LR_PRETRAINED, LR_SCRATCH; default 2e-3 for both) are the ones the sweep picked on dev
# (docs/results/recipe.md). CHECKPOINT=runs/encoder-30min-sop13k/final made the README table (the recipe run).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
export CHECKPOINT=${CHECKPOINT:-runs/encoder-30min/final} DECODER=${DECODER:-runs/decoder-30min-de/final}
mkdir -p runs/logs
TEST="--data.test_file ../shared/data/multi30k/test_2016_flickr.en"
lane() {  # init, then "lr seed test?" lines on stdin
  local init=$1
  while read -r lr seed test; do
    experiments/finetune.sh multi30k "$init" "$lr" "$seed" ${test:+$TEST} < /dev/null
  done
}
case ${1:-} in
  sweep)
    printf '%s 1\n' 5e-4 1e-3 2e-3 4e-3 | lane pretrained > runs/logs/multi30k-de-pretrained.log 2>&1 &
    printf '%s 1\n' 5e-4 1e-3 2e-3 4e-3 | lane scratch > runs/logs/multi30k-de-scratch.log 2>&1 &
    ;;
  final)
    for seed in 1 2 3; do echo "${LR_PRETRAINED:-2e-3} $seed test"; done | SUFFIX=-test lane pretrained \
      > runs/logs/multi30k-de-pretrained-final.log 2>&1 &
    for seed in 1 2 3; do echo "${LR_SCRATCH:-2e-3} $seed test"; done | SUFFIX=-test lane scratch \
      > runs/logs/multi30k-de-scratch-final.log 2>&1 &
    ;;
  *) echo "usage: bash experiments/queue_multi30k_de.sh sweep|final" >&2; exit 2 ;;
esac
wait
python experiments/summarize.py

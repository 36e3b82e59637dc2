#!/usr/bin/env bash
# Issue 12, the recipe of configs/experiments/encoder-30min.yaml (MLM+SOP over 13,000 steps) end to end: the timed
# 30-minute encoder, then the final fine-tuning table: each task over seeds 1-3 from the pretrained encoder and from
# scratch (same shape and tokenizer, --model.from_scratch), each initialisation at the learning rate picked for it on
# dev (docs/results/recipe.md), the test files read once by these runs. Two jobs at a time, one thread each; every
# run is recorded in docs/results/runs.jsonl and `python experiments/summarize.py` makes the table.
#   bash experiments/queue_recipe.sh        (logs in runs/logs/)
# CHECKPOINT=runs/NAME/final SKIP_PRETRAIN=1 fine-tunes an existing run instead (the README table's runs used
# runs/encoder-30min-sop13k, made by encoder_30min.sh with --training.max_steps 13000 --model.objective mlm+sop,
# which is now the config's recipe).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
mkdir -p runs/logs
export CHECKPOINT=${CHECKPOINT:-runs/encoder-30min/final}
if [ -z "${SKIP_PRETRAIN:-}" ]; then
  experiments/go.sh encoder-30min "$(dirname "$CHECKPOINT")" "MLM+SOP recipe, 1 thread" -- \
    bash experiments/encoder_30min.sh --training.output_dir "$(dirname "$CHECKPOINT")" || exit 1
fi
SST2_TEST="--data.test_file ../shared/data/sst2/test-labeled.tsv"
UD_TEST="--data.test_file ../shared/data/ud-english-ewt/en_ewt-ud-test.conllu"
CONLL_TEST="--data.test_file ../shared/data/conll2003/test.txt"
# task init lr test-option: the learning rates each initialisation was picked for on dev
lane() {
  while read -r task init lr test; do
    for seed in 1 2 3; do experiments/finetune.sh "$task" "$init" "$lr" "$seed" ${!test} < /dev/null; done
  done
}
lane > runs/logs/recipe-pretrained.log 2>&1 <<'EOF' &
conll2003 pretrained 2e-3 CONLL_TEST
ud-pos pretrained 4e-3 UD_TEST
sst2 pretrained 2e-3 SST2_TEST
EOF
lane > runs/logs/recipe-scratch.log 2>&1 <<'EOF' &
conll2003 scratch 4e-3 CONLL_TEST
ud-pos scratch 4e-3 UD_TEST
sst2 scratch 2.5e-4 SST2_TEST
EOF
wait
python experiments/summarize.py

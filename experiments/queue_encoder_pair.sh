#!/usr/bin/env bash
# Issue 12, side by side: the 30-minute encoder with Kiln's model (lane A) and with transformers' BertForPreTraining
# (lane B, experiments/pretrain_transformers.py), started together with one thread each so both see the same machine,
# then the fine-tuning comparisons, two at a time (one per lane). Every run is recorded in docs/results/runs.jsonl.
#   bash experiments/queue_encoder_pair.sh        (logs in runs/logs/)
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
mkdir -p runs/logs
SST2_TEST="--data.test_file ../shared/data/sst2/test-labeled.tsv"
UD_TEST="--data.test_file ../shared/data/ud-english-ewt/en_ewt-ud-test.conllu"
CONLL_TEST="--data.test_file ../shared/data/conll2003/test.txt"
UD_EPOCHS="--training.num_train_epochs 3"  # these runs predate the 5 epochs of configs/experiments/ud-pos.yaml

python experiments/make_corpus.py
lane_a() {
  SKIP_CORPUS=1 experiments/go.sh encoder-30min runs/encoder-30min "Kiln, 1 thread, beside the transformers run" -- \
    bash experiments/encoder_30min.sh --model.objective mlm+nsp --training.max_steps 8000
  for seed in 1 2 3; do experiments/finetune.sh sst2 pretrained 1e-3 $seed $SST2_TEST; done
  experiments/finetune.sh ud-pos pretrained 5e-4 1 $UD_TEST $UD_EPOCHS
  experiments/finetune.sh conll2003 pretrained 5e-4 1 $CONLL_TEST
}
lane_b() {
  ENTRY=experiments/pretrain_transformers.py SKIP_CORPUS=1 experiments/go.sh encoder-30min-transformers \
    runs/encoder-30min-transformers "transformers BertForPreTraining, 1 thread, beside the Kiln run" -- \
    bash experiments/encoder_30min.sh --model.objective mlm+nsp --training.max_steps 8000 --training.output_dir runs/encoder-30min-transformers
  while [ ! -f runs/encoder-30min/final/config.json ]; do sleep 30; done
  for seed in 1 2 3; do experiments/finetune.sh sst2 scratch 5e-4 $seed $SST2_TEST; done
  CHECKPOINT=runs/encoder-30min-transformers/final SUFFIX=-transformers experiments/finetune.sh sst2 pretrained 1e-3 1
  experiments/finetune.sh ud-pos scratch 5e-4 1 $UD_TEST $UD_EPOCHS
  experiments/finetune.sh conll2003 scratch 5e-4 1 $CONLL_TEST
}
lane_a > runs/logs/lane_a.log 2>&1 &
lane_b > runs/logs/lane_b.log 2>&1 &
wait

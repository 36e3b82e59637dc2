#!/usr/bin/env bash
# Issue 12, objective ablation: MLM only and MLM+SOP with the MLM+NSP run's config and 30-minute budget
# (configs/experiments/encoder-30min.yaml, one thread each, side by side). Run experiments/ablation_equal_steps.sh
# beside it: it stops both at the MLM+NSP run's step count, writes their final/, resumes the paused jobs and
# fine-tunes the two checkpoints.
# The budget is wall clock, so while the two pretraining runs train, the step-budgeted fine-tuning jobs of the other
# queues are paused (SIGSTOP/SIGCONT): the ablation runs get about the share of the CPU the MLM+NSP run had.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
while [ ! -f runs/decoder-30min/final/config.json ]; do sleep 20; done
sleep 90  # let the queues that waited for the decoder start their next job, so it is paused too
pkill -STOP -f "finetune/(classify|tag|seq2seq).py --config configs/experiments/"
for objective in mlm mlm+sop; do
  name=${objective/mlm+/}  # mlm, sop
  SKIP_CORPUS=1 experiments/go.sh encoder-30min-$name runs/encoder-30min-$name "ablation $objective, 1 thread" -- \
    bash experiments/encoder_30min.sh --model.objective "$objective" --training.max_steps 8000 --training.output_dir runs/encoder-30min-$name \
    > runs/logs/ablation-$name.log 2>&1 &
done
wait

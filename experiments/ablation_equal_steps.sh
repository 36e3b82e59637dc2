#!/usr/bin/env bash
# Issue 12, objective ablation at the MLM+NSP run's step budget. The 30-minute budget is wall clock, and the MLM+NSP
# run (runs/encoder-30min) spent its first half on a machine far more contended than the ablation runs saw, so the
# ablation compares at equal optimizer steps instead: each ablation run (started by experiments/queue_ablation.sh)
# is sent SIGTERM once it reaches the MLM+NSP run's final step (Kiln then saves a checkpoint at that step), and
# resuming it with --training.max_steps <that step> writes final/ without training further (same schedule up to
# there: the MLM+NSP run was also cut by its time cap inside an 8,000-step schedule). Then the paused fine-tuning
# jobs continue and each ablation checkpoint is fine-tuned on UD POS (TASKS="ud-pos:5e-4 sst2:1e-3" adds SST-2), with
# the epochs these runs had (UD 3, SST-2 1; configs/experiments/ud-pos.yaml now says 5).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
target=$(ls runs/encoder-30min/checkpoints | sed 's/step-0*//' | sort -n | tail -1)  # 4080
step_of() { tail -c 3000 "$1" | tr '\r' '\n' | grep -ao "[0-9]*/8000" | tail -1 | cut -d/ -f1; }
stop_at() {  # NAME
  local log=runs/logs/ablation-$1.log
  until [ "$(step_of $log)" -ge $((target - 1)) ] 2>/dev/null; do sleep 1; done
  pkill -TERM -f "^[^ ]*python pretrain/run.py .*--training.output_dir runs/encoder-30min-$1\$"
  while pgrep -f "pretrain/run.py .*runs/encoder-30min-$1\$" > /dev/null; do sleep 2; done
  echo "$1: stopped; checkpoints: $(ls runs/encoder-30min-$1/checkpoints)"
  accelerate launch pretrain/run.py --config configs/experiments/encoder-30min.yaml --model.objective "$2" \
    --training.output_dir runs/encoder-30min-$1 --training.resume_from_checkpoint latest \
    --training.max_steps "$(ls runs/encoder-30min-$1/checkpoints | sed 's/step-0*//' | sort -n | tail -1)" \
    --training.allow_config_change > runs/logs/ablation-$1-final.log 2>&1
  python experiments/record.py runs/encoder-30min-$1 --tag encoder-30min-$1 --note "ablation $2, stopped at the MLM+NSP run's step" \
    --command "bash experiments/queue_ablation.sh; bash experiments/ablation_equal_steps.sh"
}
stop_at mlm mlm &
stop_at sop mlm+sop &
wait
pkill -CONT -f "finetune/(classify|tag|seq2seq).py --config configs/experiments/"
for task_lr in ${TASKS:-ud-pos:5e-4}; do
  for name in mlm sop; do
    CHECKPOINT=runs/encoder-30min-$name/final SUFFIX=-$name experiments/finetune.sh ${task_lr%:*} pretrained ${task_lr#*:} 1 \
      --training.num_train_epochs $([ "${task_lr%:*}" = ud-pos ] && echo 3 || echo 1) \
      >> runs/logs/ablation-finetune-$name.log 2>&1 &
  done
  wait
done

#!/usr/bin/env bash
# Issue 12, what follows the encoder pair (experiments/queue_encoder_pair.sh), on the same machine:
#   lane C: the 30-minute decoder once both 30-minute encoders are done, then its samples;
#   lanes D/E: the objective ablation (MLM only, MLM+SOP; same config and 30-minute budget as the MLM+NSP run, one
#   thread each, side by side) once lane A/B's fine-tuning is done, then SST-2 and UD POS from each.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
mkdir -p runs/logs
wait_for() { while [ ! -f "$1" ]; do sleep 30; done; }
lane_c() {
  wait_for runs/encoder-30min/final/config.json
  wait_for runs/encoder-30min-transformers/final/config.json
  experiments/go.sh decoder-30min runs/decoder-30min "1 thread, beside encoder fine-tuning" -- \
    accelerate launch pretrain/run.py --config configs/experiments/decoder-30min.yaml
  python experiments/decoder_samples.py runs/decoder-30min/final docs/results/decoder-samples.md
}
ablation() {  # OBJECTIVE NAME WAIT_FILE
  wait_for "$3"
  SKIP_CORPUS=1 experiments/go.sh encoder-30min-$2 runs/encoder-30min-$2 "ablation $1, 1 thread" -- \
    bash experiments/encoder_30min.sh --model.objective "$1" --training.output_dir runs/encoder-30min-$2
  CHECKPOINT=runs/encoder-30min-$2/final SUFFIX=-$2 experiments/finetune.sh sst2 pretrained 1e-3 1
  CHECKPOINT=runs/encoder-30min-$2/final SUFFIX=-$2 experiments/finetune.sh ud-pos pretrained 5e-4 1
}
lane_c > runs/logs/lane_c.log 2>&1 &
ablation mlm mlm runs/ft/conll2003-pretrained-lr5e-4-s1/final/config.json > runs/logs/lane_d.log 2>&1 &
ablation mlm+sop sop runs/ft/conll2003-scratch-lr5e-4-s1/final/config.json > runs/logs/lane_e.log 2>&1 &
wait

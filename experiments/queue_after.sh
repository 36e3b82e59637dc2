#!/usr/bin/env bash
# Issue 12, what follows the encoder pair (experiments/queue_encoder_pair.sh), on the same machine:
#   lane C: the 30-minute decoder once both 30-minute encoders are done, then its samples
# (the objective ablation: experiments/queue_ablation.sh; Multi30k: experiments/queue_multi30k.sh).
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
lane_c > runs/logs/lane_c.log 2>&1 &
wait

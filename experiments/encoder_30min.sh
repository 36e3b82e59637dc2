#!/usr/bin/env bash
# The 30-minute encoder of issue 12, end to end: corpus from ../shared/data, WordPiece tokenizer, data, training,
# final eval and export, timed as one wall clock (written to runs/encoder-30min/wall_clock.json).
#   bash experiments/encoder_30min.sh [extra overrides for pretrain/run.py]
# ENTRY=experiments/pretrain_transformers.py runs the same with transformers' BertForPreTraining as the model;
# SKIP_CORPUS=1 reuses runs/corpus (a second run started beside the first must not rewrite its files).
set -eu
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
start=$(date +%s.%N)
[ -n "${SKIP_CORPUS:-}" ] || python experiments/make_corpus.py
accelerate launch "${ENTRY:-pretrain/run.py}" --config configs/experiments/encoder-30min.yaml "$@"
end=$(date +%s.%N)
out=$(python -c "import sys,yaml; print(yaml.safe_load(open('configs/experiments/encoder-30min.yaml'))['training']['output_dir'])")
prev=""
for arg in "$@"; do if [ "$prev" = --training.output_dir ]; then out=$arg; fi; prev=$arg; done
python - "$start" "$end" "$out" <<'PY'
import json, sys, time
start, end, out = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
load = open("/proc/loadavg").read().split()[:3]
record = {"wall_clock_s": round(end - start, 1), "start_utc": time.strftime("%H:%M:%S", time.gmtime(start)),
          "end_utc": time.strftime("%H:%M:%S", time.gmtime(end)), "loadavg_at_end": load}
open(f"{out}/wall_clock.json", "w").write(json.dumps(record, indent=2))
print("wall clock:", record)
PY

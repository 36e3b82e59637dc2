#!/usr/bin/env bash
# Run one command, time it, and record the run it wrote (experiments/record.py).
#   experiments/go.sh TAG RUN_DIR NOTE -- command ...
# The full command line and its wall clock land in docs/results/runs.jsonl.
set -u
tag=$1; run=$2; note=$3; shift 4
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
start=$(date +%s.%N)
"$@"
rc=$?
end=$(date +%s.%N)
wall=$(python -c "print(round($end - $start, 1))")
if [ $rc -eq 0 ]; then
  python experiments/record.py "$run" --tag "$tag" --wall "$wall" --note "$note" --command "$*"
else
  echo "FAILED rc=$rc: $*" >&2
fi
exit $rc

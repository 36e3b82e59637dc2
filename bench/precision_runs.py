"""fp32 against bf16 autocast end to end: 300 pretraining steps of the two 30-minute configs of docs/performance.md's
precision table, each in each precision, one thread, one run at a time, through `kiln-launch` as a user runs them.

    python bench/precision_runs.py --json bench/results/precision-end-to-end-$(hostname).json

A run's speed is the median of its logged `train/tokens_per_s` (every 50 steps, so start-up and the final evaluation
are left out); its quality is the eval loss its final evaluation reached at step 300. Before the runs it times square
matmuls in fp32 and bf16 on one thread (the peaks the step-level table of `bench/precision.py` is read against). The
step alone is `bench/precision.py`'s; this is what a whole run gains, data, logging and optimizer included. Timings
need a quiet machine: the record keeps the CPU, its bf16 units and the load average at both ends.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # python bench/precision_runs.py: import the repository's packages
    sys.path.insert(0, str(REPO))

from bench.machine import cpu_name, load_average  # noqa: E402

CONFIGS = ("encoder-30min-modern", "decoder-30min-llama")
"""configs/experiments/NAME.yaml: the table's two rows (bench/report.py's PRECISION_RUNS)."""

STEPS = 300
COMMAND = (
    "OMP_NUM_THREADS=1 kiln-launch --num_processes 1 pretrain/run.py --config configs/experiments/CONFIG.yaml "
    f"--training.max_steps {STEPS} --training.eval_steps 100000 --training.save_steps 100000 "
    "--training.mixed_precision {no,bf16} --logging.logging_steps 50"
)


def matmul_gflops(sizes: tuple[int, ...] = (128, 512, 2048)) -> dict:
    """Square `torch.mm` on one thread in fp32 and bf16 (bench/throughput.py's `MatmulPeak`, the best of warm
    repeats): the machine's matmul peaks."""
    import torch

    from bench.throughput import MatmulPeak

    torch.set_num_threads(1)
    rates: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for size in sizes:
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            peak = MatmulPeak(torch.device("cpu"), size=size, repeats=5, dtype=dtype)
            peak.sample()  # warm-up
            rates[name].append(round(peak.sample() / 1e9, 1))
    return {
        "sizes": list(sizes),
        **rates,
        "measured": "square torch.mm, best of warm repeats, before the runs",
    }


def run_precision(config: str, precision: str, scratch: Path) -> dict:
    """One 300-step run; its logged tokens/s (median) and the evaluation it ended with."""
    out = scratch / f"{config}-{precision}"
    command = [
        "kiln-launch", "--num_processes", "1", "pretrain/run.py",
        "--config", f"configs/experiments/{config}.yaml",
        "--training.output_dir", str(out), "--training.max_steps", str(STEPS),
        "--training.eval_steps", "100000", "--training.save_steps", "100000",
        "--training.mixed_precision", precision, "--logging.logging_steps", "50",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        command, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    speeds = [row for row in rows if "train/tokens_per_s" in row]
    evaluations = [row for row in rows if "eval/loss" in row]
    if not speeds or not evaluations:
        raise SystemExit(f"{out}/metrics.jsonl holds no tokens/s or no evaluation: did the run finish?")
    return {
        "tokens_per_s_median": statistics.median(row["train/tokens_per_s"] for row in speeds),
        "logged_steps": [row["step"] for row in speeds],
        "eval_at_300": {key: value for key, value in evaluations[-1].items() if key.startswith("eval/")},
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the record here")
    parser.add_argument("--config", action="append", choices=CONFIGS, help="repeatable; default: both")
    args = parser.parse_args(argv)
    import torch

    from kiln.precision import cpu_bf16_units

    record = {
        "what": f"end-to-end pretraining, fp32 against bf16 autocast: {STEPS} steps of each 30-minute config, "
        "one thread, one run at a time",
        "command": COMMAND,
        "cpu": cpu_name(),
        "bf16_units": list(cpu_bf16_units()),
        "torch": torch.__version__.split("+")[0],
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loadavg_at_start": load_average(),
        "matmul_gflops_one_thread": matmul_gflops(),
        "runs": {},
    }
    with tempfile.TemporaryDirectory(prefix="kiln-precision-") as scratch:
        for config in args.config or CONFIGS:
            for precision, label in (("no", "fp32"), ("bf16", "bf16")):
                run = run_precision(config, precision, Path(scratch))
                if label == "bf16":
                    fp32 = record["runs"][f"{config}/fp32"]["tokens_per_s_median"]
                    run["speedup_over_fp32"] = run["tokens_per_s_median"] / fp32
                record["runs"][f"{config}/{label}"] = run
                print(f"{config} {label}: {run['tokens_per_s_median']:,.0f} tokens/s, "
                      f"eval loss {run['eval_at_300'].get('eval/loss', float('nan')):.3f}", flush=True)  # fmt: skip
    record["loadavg_at_end"] = load_average()
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return record


if __name__ == "__main__":
    main()

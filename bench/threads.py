"""The default run on one CPU thread against Kiln's default of a thread per core: bench/results/threads.json.

    python bench/threads.py                          # two default runs, one after the other (~4 minutes on 2 idle cores)
    python bench/report.py --update docs/launching.md

Both runs are `accelerate launch pretrain/run.py` as the README gives it, each into a new temporary folder: once
with `OMP_NUM_THREADS=1` in its environment (a thread count you chose, which Kiln keeps) and once without (accelerate
pins the process to one thread by default, and Kiln then takes a thread per physical core). The record holds, per
run: the thread count the run printed, the real (non-padding) tokens/s of every logged window and their median,
the training loop's own clock (the last checkpoint's `train_time_s`), the wall clock end to end and the last
evaluation; and the machine, torch, the load average before and after, the date and the commit. Measure on an
otherwise idle machine: the thread-per-core run needs every core. `--quick` runs a few steps (a check of the
script, not a measurement: `bench/report.py` refuses its record).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # python bench/X.py, or loaded by path: import the repository's bench package
    sys.path.insert(0, str(REPO))

from bench.machine import cpu_name  # noqa: E402

LAUNCH = (sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch")  # = `accelerate launch`
COMMAND = "accelerate launch pretrain/run.py"
QUICK = (
    "--training.max_steps",
    "6",
    "--training.eval_steps",
    "6",
    "--training.save_steps",
    "6",
    "--training.max_eval_batches",
    "1",
    "--logging.logging_steps",
    "2",
)
RUNS = {"one thread": {"OMP_NUM_THREADS": "1"}, "a thread per core": {}}  # what each run's environment sets


def one_run(label: str, env_set: dict[str, str], work: Path, quick: bool) -> dict:
    out = work / label.replace(" ", "-")
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    env.update(
        {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            "PYTHONUNBUFFERED": "1",
            **env_set,
        }
    )
    command = [*LAUNCH, "pretrain/run.py", "--training.output_dir", str(out), *(QUICK if quick else ())]
    print(f"{label}: {' '.join(f'{k}={v}' for k, v in env_set.items())} {COMMAND}".strip(), flush=True)
    start = time.perf_counter()
    done = subprocess.run(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        tail = "\n".join(done.stdout.splitlines()[-30:])
        raise SystemExit(f"error: the {label} run failed ({done.returncode}):\n{tail}")
    from kiln.checkpoint_files import find_checkpoints

    threads = re.search(r"device = cpu, (\d+) threads? per process", done.stdout)
    if not threads:
        raise SystemExit(
            f"error: the {label} run printed no thread count ('device = cpu, N threads per process')"
        )
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    windows = [row["train/tokens_per_s"] for row in rows if "train/tokens_per_s" in row]
    evaluations = [row for row in rows if "eval/mlm_loss" in row]
    loop = json.loads((find_checkpoints(out)[-1] / "loop_state.json").read_text())["counters"]
    return {
        "label": label,
        "environment": env_set,
        "threads": int(threads.group(1)),
        "tokens_per_s_windows": [round(x, 1) for x in windows],
        "tokens_per_s_median": round(statistics.median(windows), 1),
        "training_loop_s": round(loop["train_time_s"], 1),
        "wall_s": round(wall, 1),
        "steps": loop["global_step"],
        "last_eval": evaluations[-1],
    }


def run_both_thread_counts(quick: bool) -> dict:
    import torch

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    record = {
        "quick": quick,
        "command": COMMAND,
        "output_dir": "a new temporary folder per run (--training.output_dir)",
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit.stdout.strip(),
        "machine": {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "system": platform.system(),
            "python": platform.python_version(),
        },
        "torch": torch.__version__,
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
    }
    with tempfile.TemporaryDirectory(prefix="kiln-threads-") as tmp:
        record["runs"] = [one_run(label, env_set, Path(tmp), quick) for label, env_set in RUNS.items()]
    record["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="the record (default: bench/results/threads.json)")
    parser.add_argument(
        "--quick", action="store_true", help="a few steps: checks the script, measures nothing (needs --json)"
    )
    args = parser.parse_args(argv)
    if args.quick and args.json is None:
        parser.error(
            "--quick measures nothing: give --json for its record (the default record is the measurement)"
        )
    record = run_both_thread_counts(args.quick)
    out = args.json or REPO / "bench/results/threads.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    for run in record["runs"]:
        print(
            f"{run['label']} ({run['threads']}): {run['tokens_per_s_median']:,.0f} tokens/s, loop "
            f"{run['training_loop_s']:.0f} s, end to end {run['wall_s']:.0f} s"
        )
    print(
        f"{out}: load average {record['load_average_before'][0]:.1f} -> {record['load_average_after'][0]:.1f}"
    )


if __name__ == "__main__":
    main()

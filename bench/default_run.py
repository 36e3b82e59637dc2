"""Run the default run as the README gives it and keep what it printed: bench/results/default-run.json.

    python bench/default_run.py                       # runs it, writes the record (its time: the record says)
    python bench/default_run.py --threads 1 --png docs/encoder-tiny-loss.png   # as the committed record was made
    python bench/report.py --update README.md docs/getting-started.md docs/launching.md docs/finetuning.md

The record holds the command, the metrics.jsonl rows of the steps the README's table shows, the wall clock end to
end and the CPU-seconds it used (launcher and training process), the load average before and after, the machine,
torch's version, the commit and the date. `bench/report.py` makes the README's and getting-started.md's
default-run table, and the one timing sentence of every page that times the run (README, getting-started,
launching, fine-tuning), from it, and tests/test_docs_numbers.py fails when they differ.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # python bench/X.py, or loaded by path: import the repository's bench package
    sys.path.insert(0, str(REPO))

from bench.machine import children_cpu_seconds, run_stamp  # noqa: E402

STEPS = (10, 200, 400, 600)  # the rows of the README's table
COMMAND = ["accelerate", "launch", "--num_processes", "1", "--cpu", "pretrain/run.py"]


def rows_at(metrics: Path, steps: tuple[int, ...]) -> list[dict]:
    """The metrics.jsonl rows (training and evaluation) logged at `steps`, in file order."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return [row for row in rows if row.get("step") in steps]


def run_default(png: Path | None, threads: int | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="kiln-default-run-") as tmp:
        out = (
            Path(tmp) / "encoder-tiny"
        )  # the plot's title is the folder's name, as in the default runs/encoder-tiny
        command = [*COMMAND, "--training.output_dir", str(out)]
        if threads:  # accelerate's flag, before the script: the same run, summed on fewer or more threads
            command[2:2] = ["--num_cpu_threads_per_process", str(threads)]
        load_before = os.getloadavg()
        cpu_before = children_cpu_seconds()
        start = time.perf_counter()
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - start
        cpu = children_cpu_seconds() - cpu_before
        load_after = os.getloadavg()
        if done.returncode != 0:
            sys.exit(f"error: the default run failed ({done.returncode}):\n{done.stderr[-3000:]}")
        if png is not None:
            shutil.copyfile(out / "final" / "loss_curve.png", png)
        import torch

        return {
            "command": " ".join(command[: command.index("--training.output_dir")]),
            "output_dir": "a new temporary folder named encoder-tiny (--training.output_dir)",
            **run_stamp(),
            "torch": torch.__version__,
            "wall_s": round(wall, 1),
            "cpu_s": round(cpu, 1),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in load_after],
            "steps": list(STEPS),
            "rows": rows_at(out / "metrics.jsonl", STEPS),
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--json", type=Path, default=REPO / "bench/results/default-run.json", help="the record"
    )
    parser.add_argument("--png", type=Path, help="also copy the run's final/loss_curve.png here")
    parser.add_argument(
        "--threads",
        type=int,
        help="--num_cpu_threads_per_process (default: accelerate's choice); "
        "the printed numbers agree to ~10 digits across thread counts, the time does not",
    )
    args = parser.parse_args(argv)
    result = run_default(args.png, args.threads)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{args.json}: {result['wall_s']:.0f} s, load {result['load_average_before'][0]:.1f}")


if __name__ == "__main__":
    main()

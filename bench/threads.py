"""The default run on one CPU thread against a thread per core, on a quiet and on a busy machine, in wall clock and
CPU-seconds: bench/results/threads-quiet.json and bench/results/threads-busy.json.

    python bench/threads.py                          # quiet: two default runs, one after the other (~4 minutes on 2 idle cores)
    python bench/threads.py --busy                   # busy: the same two beside a busy loop per core (~10 minutes on 2 cores)
    python bench/report.py --update docs/launching.md

Both runs are `accelerate launch pretrain/run.py` as the README gives it, each into a new temporary folder, with the
thread count set in its environment: `OMP_NUM_THREADS=1` (accelerate's default, which Kiln keeps) and
`OMP_NUM_THREADS=<physical cores>`. Both are counts the user chose, so the runs measure the same thing whatever
the default is. The record holds, per run: the thread count the run printed, the real
(non-padding) tokens/s of every logged window and their median, the training loop's own clock (the last
checkpoint's `train_time_s`), the wall clock end to end, the CPU-seconds it used (user + system time of the launcher
and the training process, `getrusage(RUSAGE_CHILDREN)` before and after) and the last evaluation; and the machine
(CPU model, cores), torch, the load average before and after, the date and the commit.

The quiet record is measured on an otherwise idle machine: start it when the 1-minute load average is near 0.
`--busy` measures the same two runs while a steady load occupies every core: one process per logical core,
each a Python busy loop at the default priority, started a few seconds before the first run and stopped after the
last; the record describes it (`background`). Two settings on a machine shared with other jobs differ most in CPU
time: threads that wait for a core still spin and burn it.

`choose_default` reads the two records and names the thread count the default should be: the one whose runs used
the fewest CPU-seconds, quiet and busy summed. `--quick` runs a few steps (a check of the script, not a measurement:
`bench/report.py` refuses its record).
"""

from __future__ import annotations

import argparse
import json
import os
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

from bench.machine import children_cpu_seconds, load_average, run_stamp  # noqa: E402

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
RECORDS = {"quiet": "threads-quiet", "busy": "threads-busy"}  # bench/results/NAME.json per condition
BUSY_LOOP = "while True: pass"
SETTLE_S = 5.0  # the busy loops run this long before the first measured run starts


def physical_cores() -> int:
    """The physical cores this process may use: the thread count of the "a thread per core" runs."""
    import psutil  # an accelerate dependency

    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):
        cores = min(cores, len(os.sched_getaffinity(0)))
    return cores


def settings() -> dict[str, dict[str, str]]:
    """What each run's environment sets, by label."""
    return {
        "one thread": {"OMP_NUM_THREADS": "1"},
        "a thread per core": {"OMP_NUM_THREADS": str(physical_cores())},
    }


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
    cpu_before = children_cpu_seconds()
    start = time.perf_counter()
    done = subprocess.run(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    wall = time.perf_counter() - start
    cpu = children_cpu_seconds() - cpu_before
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
        "cpu_s": round(cpu, 1),
        "steps": loop["global_step"],
        "last_eval": evaluations[-1],
    }


class BusyLoad:
    """One busy-looping Python process per logical core, for the life of the `with` block."""

    def __init__(self, processes: int | None = None, settle_s: float = SETTLE_S):
        self.processes, self.settle_s, self.started = processes or os.cpu_count() or 1, settle_s, []

    def describe(self) -> dict:
        return {
            "processes": self.processes,
            "each": f"`python -c '{BUSY_LOOP}'` at the default priority (nice 0)",
            "started": f"{self.settle_s:g} s before the first run",
            "stopped": "after the last run",
        }

    def __enter__(self) -> BusyLoad:
        for _ in range(self.processes):
            self.started.append(subprocess.Popen([sys.executable, "-c", BUSY_LOOP], stdin=subprocess.DEVNULL))
        time.sleep(self.settle_s)
        return self

    def __exit__(self, *exc) -> None:
        for process in self.started:
            process.kill()
        for process in self.started:
            process.wait()


def run_both_thread_counts(quick: bool, busy: bool = False) -> dict:
    import torch

    record = {
        "quick": quick,
        "condition": "busy" if busy else "quiet",
        "command": COMMAND,
        "output_dir": "a new temporary folder per run (--training.output_dir)",
        **run_stamp(physical_cores=physical_cores()),
        "torch": torch.__version__,
        "cpu_s": "user + system CPU-seconds of the launcher and the training process",
        "load_average_before": load_average(),
    }
    load = BusyLoad() if busy else None
    if load is not None:
        record["background"] = load.describe()
    with tempfile.TemporaryDirectory(prefix="kiln-threads-") as tmp:
        if load is None:
            record["runs"] = [one_run(label, env, Path(tmp), quick) for label, env in settings().items()]
        else:
            with load:
                record["runs"] = [one_run(label, env, Path(tmp), quick) for label, env in settings().items()]
                record["load_average_after"] = load_average()  # before the loops stop
    record.setdefault("load_average_after", load_average())
    return record


def choose_default(quiet: dict, busy: dict) -> dict:
    """The thread count the default should be, from a quiet and a busy record: the setting whose two runs used the
    fewest CPU-seconds summed (a default must not waste a shared machine, and on an idle one CPU-seconds are what
    every other job waits for); a tie (within 1%) goes to the one with the lower summed wall clock. Returns the
    chosen setting's label and thread count, and every setting's sums."""
    for name, record in (("quiet", quiet), ("busy", busy)):
        if record.get("quick"):
            raise ValueError(f"the {name} record is a --quick record (a check, not a measurement)")
        if record.get("condition", name) != name:
            raise ValueError(f"the {name} record was measured {record['condition']}")
    sums = {}
    for run in quiet["runs"]:
        (other,) = [r for r in busy["runs"] if r["label"] == run["label"]]
        if other["threads"] != run["threads"]:
            raise ValueError(f"{run['label']}: {run['threads']} threads quiet, {other['threads']} busy")
        sums[run["label"]] = {
            "threads": run["threads"],
            "cpu_s": round(run["cpu_s"] + other["cpu_s"], 1),
            "wall_s": round(run["wall_s"] + other["wall_s"], 1),
        }
    fewest = min(s["cpu_s"] for s in sums.values())
    close = [label for label, s in sums.items() if s["cpu_s"] <= fewest * 1.01]
    label = min(close, key=lambda name: (sums[name]["wall_s"], sums[name]["threads"]))
    return {"label": label, "threads": sums[label]["threads"], "sums": sums}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--busy",
        action="store_true",
        help="run beside a busy loop per core (record: bench/results/threads-busy.json)",
    )
    parser.add_argument(
        "--json", type=Path, help="the record (default: bench/results/threads-quiet.json, or -busy)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a few steps: checks the script, measures nothing (needs --json)"
    )
    args = parser.parse_args(argv)
    if args.quick and args.json is None:
        parser.error(
            "--quick measures nothing: give --json for its record (the default record is the measurement)"
        )
    condition = "busy" if args.busy else "quiet"
    if not args.quick and not args.busy and load_average()[0] > 0.5:
        print(
            f"warning: the 1-minute load average is {load_average()[0]:.1f}: the quiet record wants an idle machine",
            flush=True,
        )
    record = run_both_thread_counts(args.quick, busy=args.busy)
    out = args.json or REPO / f"bench/results/{RECORDS[condition]}.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    for run in record["runs"]:
        print(
            f"{condition}, {run['label']} ({run['threads']}): {run['tokens_per_s_median']:,.0f} tokens/s, loop "
            f"{run['training_loop_s']:.0f} s, end to end {run['wall_s']:.0f} s, {run['cpu_s']:.0f} CPU-seconds"
        )
    print(
        f"{out}: load average {record['load_average_before'][0]:.1f} -> {record['load_average_after'][0]:.1f}"
    )
    other = REPO / f"bench/results/{RECORDS['quiet' if args.busy else 'busy']}.json"
    if not args.quick and args.json is None and other.is_file():
        records = {
            condition: record,
            "busy" if condition == "quiet" else "quiet": json.loads(other.read_text()),
        }
        chosen = choose_default(records["quiet"], records["busy"])
        print(f"fewest CPU-seconds, quiet and busy summed: {chosen['label']} ({chosen['threads']} threads)")


if __name__ == "__main__":
    main()

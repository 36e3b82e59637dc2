"""Time the quick tier of the test suite as getting-started.md gives it: bench/results/quick-tier.json.

    python bench/quick_tier.py          # on a quiet machine: runs `python -m pytest -n 2 -q -m "not slow"`
    python bench/report.py --update docs/getting-started.md

The record holds the command, its wall clock, the counts pytest printed (passed, skipped), the load average before
and after, the machine, torch's version, the commit and the date. A run with a failing test is not a measurement
of the tier, so nothing is written then. `bench/report.py` makes getting-started.md's sentence from the record.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # python bench/X.py, or loaded by path: import the repository's bench package
    sys.path.insert(0, str(REPO))

from bench.machine import run_stamp  # noqa: E402

TIER = ["python", "-m", "pytest", "-n", "2", "-q", "-m", "not slow"]


def tier_counts(summary: str) -> dict[str, int]:
    """pytest's last line (`1749 passed, 325 skipped, 107 warnings, 6704 subtests passed in 204.48s`) as counts:
    passed, skipped, failed, errors (subtests and warnings left out)."""
    counts = {"passed": 0, "skipped": 0, "failed": 0, "errors": 0}
    for number, subtests, word in re.findall(r"(\d+) (subtests )?(passed|skipped|failed|errors?)\b", summary):
        if not subtests:  # a subtest count is not a count of tests
            counts["errors" if word.startswith("error") else word] += int(number)
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--json", type=Path, default=REPO / "bench/results/quick-tier.json", help="the record"
    )
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *TIER[1:], "-p", "no:cacheprovider"], cwd=REPO, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    load_after = os.getloadavg()
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    counts = tier_counts(summary)
    if done.returncode != 0 or counts["failed"] or counts["errors"] or not counts["passed"]:
        sys.exit(f"error: the quick tier did not pass ({summary or done.stderr[-2000:]}); nothing recorded")
    import torch

    record = {
        "command": " ".join(TIER[:-1]) + ' "not slow"',
        **run_stamp(),
        "torch": torch.__version__,
        "wall_s": round(wall, 1),
        **counts,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
    }
    args.json.write_text(json.dumps(record, indent=2) + "\n")
    print(f"{args.json}: {wall:.0f} s, {counts['passed']} passed, load {load_before[0]:.1f}")


if __name__ == "__main__":
    main()

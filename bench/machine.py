"""What a benchmark record says about the machine it ran on: the CPU's name and the load average, read without
importing torch, so that the light driver scripts (default_run, threads, shipped_commands) and the heavy
benchmarks record them alike."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what `platform` knows of the processor."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> list[float]:
    """The 1-, 5- and 15-minute load averages, rounded to two places."""
    return [round(x, 2) for x in os.getloadavg()]


def children_cpu_seconds() -> float:
    """User + system CPU-seconds of every waited-for child process and its descendants (a launcher waits for its
    training process, so that time is counted): unlike the wall clock, it does not grow with the other jobs sharing
    the cores. The difference of two readings is what the commands run between them used."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_stamp(**machine_facts) -> dict:
    """What every driver script's record opens with: the date (UTC), the commit, and the machine (CPU, cores,
    system, Python, and `machine_facts` of the script's own, such as the thread setting)."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit.stdout.strip(),
        "machine": {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            **machine_facts,
            "system": platform.system(),
            "python": platform.python_version(),
        },
    }

"""What a benchmark record says about the machine it ran on: the CPU's name and the load average, read without
importing torch, so that the light driver scripts (default_run, threads, shipped_commands) and the heavy
benchmarks record them alike."""

from __future__ import annotations

import os
import platform


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

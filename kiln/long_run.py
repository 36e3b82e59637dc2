"""A run that will take long says so in its first lines: once its first steps are timed, a run with more than
`LONG_RUN_S` still to go prints how long it will take on this machine and the flag that makes a first try short.

The estimate is this machine's own step time, measured after the first steps (which pay for warm-up), times the
steps left, capped by --training.max_train_time_s: a recipe's page cannot know the CPU it runs on."""

from __future__ import annotations

import time
from collections.abc import Callable

LONG_RUN_S = 15 * 60
"""Runs expected to take longer than this say so."""
WARMUP_STEPS = 3
"""Steps not timed: the first ones allocate, start the data workers and warm the caches."""
TIMED_STEPS, TIMED_S = 20, 10.0
"""The estimate is made after this many timed steps or seconds, whichever comes first."""
FIRST_TRY_S = 5 * 60
"""The length of the first try the notice proposes."""


def duration(seconds: float) -> str:
    """`7m`, `1h05m`: minutes are the unit a run's length is read in."""
    minutes = max(1, round(seconds / 60))
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"


class LongRunNotice:
    """Fed every optimizer step (`after_step`); returns its one line once, when the run is long, else nothing."""

    def __init__(
        self,
        total_steps: int,
        time_budget_s: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.total_steps, self.time_budget_s, self.clock = total_steps, time_budget_s, clock
        self.steps_seen = 0
        self.start: tuple[int, float] | None = None  # (step, time) when timing began
        self.done = False

    def after_step(self, step: int, train_time_s: float) -> str | None:
        if self.done:
            return None
        self.steps_seen += 1
        now = self.clock()
        if self.steps_seen == WARMUP_STEPS:
            self.start = (step, now)
            return None
        if self.start is None:
            return None
        timed_steps, timed_s = step - self.start[0], now - self.start[1]
        if timed_steps < TIMED_STEPS and timed_s < TIMED_S:
            return None
        self.done = True
        per_step = timed_s / timed_steps
        steps_left = self.total_steps - step
        left = steps_left * per_step
        if self.time_budget_s:
            left = min(left, max(0.0, self.time_budget_s - train_time_s))
        if left <= LONG_RUN_S:
            return None
        first_try = max(1, int(FIRST_TRY_S / per_step))
        return (
            f"this run needs about {duration(left)} more on this machine ({steps_left:,} steps at {per_step:.2f} s "
            f"each); for a first try of about {duration(FIRST_TRY_S)}, run it with --training.max_steps "
            f"{first_try:,} (or --training.max_train_time_s {FIRST_TRY_S})"
        )


__all__ = ["LONG_RUN_S", "LongRunNotice", "duration"]

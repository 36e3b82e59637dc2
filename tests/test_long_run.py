"""A long run says so in its first lines (kiln.long_run): the time it needs on this machine, measured after its
warm-up steps, and the flag for a short first try; a short run says nothing."""

from kiln.long_run import LONG_RUN_S, TIMED_STEPS, WARMUP_STEPS, LongRunNotice, duration
from tests.kiln_testing import run


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def feed(notice, clock, step_times, start_step=0):
    """Steps taking `step_times` seconds each; the lines the notice returned."""
    lines, train_time = [], 0.0
    for offset, seconds in enumerate(step_times, start=1):
        clock.now += seconds
        train_time += seconds
        line = notice.after_step(start_step + offset, train_time)
        if line:
            lines.append((start_step + offset, line))
    return lines


def test_a_long_run_says_how_long_and_how_to_try_it_short():
    clock = Clock()
    notice = LongRunNotice(total_steps=5000, clock=clock)
    # slow warm-up steps are not counted: 30 s each, then 1.5 s steps
    lines = feed(notice, clock, [30.0] * WARMUP_STEPS + [1.5] * 200)
    assert len(lines) == 1
    step, line = lines[0]
    assert step <= WARMUP_STEPS + TIMED_STEPS  # said in the first lines
    left = (5000 - step) * 1.5
    assert f"about {duration(left)} more" in line and "1.50 s each" in line
    assert "--training.max_steps 200 " in line  # 5 minutes at 1.5 s a step


def test_a_short_run_or_one_capped_by_its_time_budget_says_nothing():
    clock = Clock()
    assert feed(LongRunNotice(total_steps=300, clock=clock), clock, [1.0] * 300) == []
    clock = Clock()
    capped = LongRunNotice(total_steps=100_000, time_budget_s=LONG_RUN_S / 2, clock=clock)
    assert feed(capped, clock, [1.0] * 100) == []
    clock = Clock()
    uncapped = LongRunNotice(total_steps=100_000, clock=clock)
    assert len(feed(uncapped, clock, [1.0] * 100)) == 1


def test_a_resumed_run_counts_the_steps_left_from_where_it_resumes():
    clock = Clock()
    notice = LongRunNotice(total_steps=2000, clock=clock)
    lines = feed(notice, clock, [1.0] * 50, start_step=1000)
    assert len(lines) == 1 and f"{2000 - lines[0][0]:,} steps at 1.00 s each" in lines[0][1]


def test_durations_read_in_minutes():
    assert [duration(s) for s in (20, 90, 59 * 60, 3600, 3 * 3600 + 125)] == [
        "1m",
        "2m",
        "59m",
        "1h00m",
        "3h02m",
    ]


def test_the_training_loop_prints_the_notice_once(tmp_path, monkeypatch, caplog):
    """Through the entry point, with the threshold lowered so the debug run counts as long."""
    import kiln.long_run

    monkeypatch.setattr(kiln.long_run, "LONG_RUN_S", 0.0)
    monkeypatch.setattr(kiln.long_run, "TIMED_STEPS", 2)
    caplog.set_level("INFO", logger="kiln")
    run(tmp_path / "run", "--training.max_steps", "8")
    notices = [r.getMessage() for r in caplog.records if r.getMessage().startswith("this run needs about")]
    assert len(notices) == 1 and "--training.max_steps" in notices[0]

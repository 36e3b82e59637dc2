"""SIGTERM and SIGINT outside the training loop (data, tokenizer, model set-up; between runs): the command stops at
once with one line and status 0 (`SignalStop`), and repeats of a signal already stopping the run are absorbed.

`STOPPING` and `PENDING_SIGNAL` are shared with the Trainer (`kiln.trainer`), which handles the signals while
its loop runs: read and set them through the module (`signals.STOPPING`), not by importing the names."""

from __future__ import annotations

PENDING_SIGNAL: int | None = None
"""A SIGTERM received before the Trainer took over signals (read by the Trainer, which then stops at once)."""


STOPPING = False
"""Whether a stop signal was received (by the Trainer or before it): repeats of it are absorbed, not raised again
(under accelerate's single-process launcher Linux sends one SIGTERM per launcher thread, see kiln.launcher)."""


class SignalStop(BaseException):
    """SIGTERM arrived outside the training loop (data, tokenizer, model set-up; between runs)."""

    def __init__(self, signum: int):
        import signal

        self.name = signal.Signals(signum).name
        super().__init__(self.name)


def stop_on_sigterm() -> None:
    """Outside the Trainer's own handler (which finishes the step, saves a checkpoint and, after the loop, lets
    the final export finish), SIGTERM stops the command at once with one line and status 0, instead of the
    default abrupt death (status 143)."""
    import signal

    def stop(signum, _frame):
        global PENDING_SIGNAL, STOPPING
        if STOPPING:  # a repeat of the signal that is already stopping this run
            return
        from . import launcher

        failed = launcher.failed_first()
        if (
            failed
        ):  # the launcher stops this process because another one failed, which says why: end quietly here,
            # not through an exception that a finalizer running at this moment would swallow and print
            launcher.end_after_peer(failed)
        STOPPING = True
        PENDING_SIGNAL = signum  # if the exception is swallowed (raised inside a callback), the Trainer stops
        raise SignalStop(signum)

    def interrupt(signum, frame):
        if STOPPING:  # a repeat (the terminal's Ctrl-C and a forwarding launcher's copy of it)
            return
        signal.default_int_handler(signum, frame)

    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, stop)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, interrupt)
    except ValueError:  # not the main thread: keep the default
        pass


def absorb_stop_signals() -> None:
    """Once a stop or an error is being reported, further SIGINT/SIGTERM (a Ctrl-C reaching this process from the
    terminal and again from a forwarding launcher; torchrun stopping the other processes) must not interrupt the
    report with a traceback."""
    import signal

    global STOPPING
    STOPPING = True
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread
        pass


__all__ = ["PENDING_SIGNAL", "STOPPING", "SignalStop", "absorb_stop_signals", "stop_on_sigterm"]

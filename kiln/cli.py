"""One Kiln command's run (`run_cli`): the launcher's process set-up, SIGTERM/SIGINT outside the training loop,
and every error a user can cause printed as one line naming the fix, without a traceback.

Standard library only at import time: `--help` answers without torch."""

from __future__ import annotations

import sys
from collections.abc import Callable

from . import signals
from .disk import as_disk_fault, disk_error_message
from .errors import ConfigError, RunError
from .signals import SignalStop, absorb_stop_signals, stop_on_sigterm


def run_cli(
    main: Callable,
    argv: list[str] | None,
    user_errors: tuple[type[Exception], ...] | Callable[[], tuple[type[Exception], ...]] = (),
):
    """Run an entry point's main(argv); user errors (ConfigError and `user_errors`) print one line
    `error: ...` naming the fix and exit with status 2, without a traceback; a RunError (the run could not
    finish as asked, what was saved is kept) prints one line and exits with status 1. `user_errors` may be a
    function returning the classes, so that their (heavy) modules are imported only once an error occurs and
    `--help` stays fast."""
    from . import launcher

    signals.STOPPING = False  # a new command: no stop signal received yet
    launcher.stop_with_launcher()
    if not {"-h", "--help", "--print_config"} & set(argv or sys.argv):  # answers that run nothing
        launcher.watch_for_failures()
    stop_on_sigterm()
    try:
        return main(argv)
    except SignalStop as stop:  # SIGTERM outside the training loop (the Trainer holds it while it runs)
        _close_progress_bars()
        failed = launcher.failed_first()
        if failed:  # the launcher stops this process because another one failed: that one says why
            launcher.end_after_peer(failed)
        print(
            f"stopped by {stop.name} outside the training loop; checkpoints and models completed before it are kept",
            file=sys.stderr,
        )
        raise SystemExit(0) from None
    except (
        KeyboardInterrupt
    ):  # Ctrl-C outside the training loop (which saves a checkpoint and exits 0 instead)
        absorb_stop_signals()
        _close_progress_bars()
        print(
            "error: interrupted (Ctrl-C); checkpoints completed before it are kept (continue with "
            "--training.resume_from_checkpoint latest)",
            file=sys.stderr,
        )
        raise SystemExit(130) from None
    except Exception as err:
        absorb_stop_signals()  # this process is ending already: a SIGTERM (a launcher stopping the others once
        # one failed) must not interrupt the report with a SignalStop traceback
        known = (ConfigError, *(user_errors() if callable(user_errors) else user_errors))
        if isinstance(err, known):
            message, status = _one_line(err), 2
        elif isinstance(err, RunError):
            message, status = _one_line(err), 1
        elif as_disk_fault(err) is not None:
            message, status = disk_error_message(as_disk_fault(err)), 2
        elif launcher.several_processes() and (lost := _lost_peer(err)) is not None:
            message, status = lost, 1
        else:
            message, status = None, 1
        if (
            not launcher.claim_failure()
        ):  # several processes, and another failed first (alike, or so that this
            _close_progress_bars()  # one's collective failed): that one says why, this one ends quietly
            launcher.end_after_peer(launcher.failed_first() or "another process", status)
        if message is None:
            raise  # not a mistake of the user's: the traceback, from the process that failed first
        _close_progress_bars()
        name = launcher.process_name()
        print(f"error: {message}" + (f" ({name})" if name else ""), file=sys.stderr)
        if name:  # one of several processes: torch's teardown of the process group waits for the peers that
            launcher.end_now(
                status
            )  # are stopping because of this failure (measured: 7-10 s); nothing is left to save
        raise SystemExit(status) from None


def add_print_config(parser) -> None:
    """`--print_config` for a command whose options are an argparse parser (answered by `answer_print_config`)."""
    parser.add_argument(
        "--print_config", action="store_true", help="print the resolved options as YAML and exit"
    )


def answer_print_config(args, **extra) -> None:
    """With `--print_config`: print the parsed options (and `extra` ones) as YAML and exit 0."""
    if not getattr(args, "print_config", False):
        return
    import yaml

    options = {key: value for key, value in vars(args).items() if key != "print_config"}
    print(yaml.safe_dump({**options, **extra}, sort_keys=False), end="")
    raise SystemExit(0)


def _close_progress_bars() -> None:
    """An error raised mid-loop leaves tqdm bars open; closed later, they would print after the error line."""
    if "tqdm" in sys.modules:
        from tqdm import tqdm

        for bar in list(getattr(tqdm, "_instances", ())):
            bar.close()


PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")
"""What a collective backend (gloo) says when the process at the other end of a connection is gone."""


def _lost_peer(err: BaseException) -> str | None:
    """The one line for a collective that failed because another process of the run is gone (killed outright,
    its machine or network down), in place of the backend's traceback; None for any other error."""
    import re

    text = str(err)
    if not isinstance(err, RuntimeError) or not any(phrase in text for phrase in PEER_LOST):
        return None
    address = re.search(r"\[([^\]]+)\]:\d+", text)
    where = f"at {address.group(1)}: " if address else ""
    return (
        f"lost contact with another process of the run ({where}it was killed, or its machine or network failed); "
        "checkpoints completed before it are kept (continue with --training.resume_from_checkpoint latest)"
    )


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


__all__ = ["add_print_config", "answer_print_config", "run_cli"]

"""A Kiln training process under a launcher, and `kiln-launch`, a launcher that ends as its training processes do.

Nothing here runs unless asked: no code at interpreter start, no patched library functions (docs/launching.md).

In the training process (called by `kiln.cli.run_cli`, whatever launched it: `accelerate launch`,
`python -m accelerate.commands.launch`, torchrun, plain `python`, from any checkout):

- `stop_with_launcher`: accelerate's single-process launcher does not forward signals; asking Linux for a
  SIGTERM when the launcher dies lets the training process save a checkpoint and exit 0 when the launcher is
  killed. (torchrun's agent, the multi-process launcher, forwards SIGTERM/SIGINT itself.)

Threads are accelerate's: one per process unless the user asks for more (`--num_cpu_threads_per_process`,
`OMP_NUM_THREADS`). One thread is the default that costs a machine the fewest CPU-seconds, quiet or shared
(`bench/threads.py`; docs/launching.md).

`kiln-launch ARGS` (or `python -m kiln.launcher ARGS`) is `accelerate launch ARGS`, run by accelerate's own code
in this process, whose ending is the training processes': SIGTERM/SIGINT go to the training processes (which
save a checkpoint and exit 0) and not to the launcher, and a failed process's own status ends the command,
without accelerate's `CalledProcessError` or torchrun's `ChildFailedError` traceback.

Standard library only at import time: `--help` answers without torch.
"""

from __future__ import annotations

import os
import re
import sys

# ------------------------------------------------------------------------------------------------------------
# In the training process


def under_accelerate_launcher() -> bool:
    """Whether this process was started by an accelerate launcher (it sets ACCELERATE_* for its children)."""
    return any(key.startswith("ACCELERATE_") for key in os.environ)


def under_torchrun() -> bool:
    """Whether this process is a worker of torchrun's agent (accelerate's multi-process launchers)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ


def stop_with_launcher() -> None:
    """Under accelerate's single-process launcher, ask Linux for a SIGTERM when the launcher dies.

    That launcher does not forward signals: a SIGTERM sent to it (by a scheduler, `kill`, `timeout`, a
    container runtime) ends it at once with status 143 and would leave this process running on, orphaned. With
    this, the training process gets a SIGTERM too, so it saves a checkpoint and exits 0. The signal comes once
    per thread of the launcher (Linux sends it each time the thread that is the parent exits), so the handlers
    in `kiln.signals` absorb repeats. Only under a launcher: a plain `python` run under `nohup` must outlive its
    shell. torchrun's agent (multi-process launches) forwards signals to its workers itself."""
    if not sys.platform.startswith("linux") or not under_accelerate_launcher() or under_torchrun():
        return
    try:
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):  # no libc prctl: keep the default behaviour
        return
    if os.getppid() == 1:  # the launcher died before the request took effect: nobody will send the signal
        os.kill(os.getpid(), signal.SIGTERM)


# ------------------------------------------------------------------------------------------------------------
# Several processes, one or more nodes: a failure is said once, by the process that failed, and the others stop
#
# The processes of a torchrun launch share a key-value store, torchrun's own rendezvous store (at MASTER_ADDR:
# MASTER_PORT, hosted by node 0's agent). The first process to fail claims the failure there before it says
# anything; the others, whose collectives then fail ("Connection closed by peer") or who wait for a process that
# will never come, find the claim and end quietly with status 1 instead of their own traceback. A process on
# another node than the one that failed says where the error is, in one line that is not an error of its own.

FAILURE_KEY = "kiln/failure"
_board = None  # the store client, once connected (None: a single process, or no store reachable)
_board_tried = False
_claimed = False  # this process failed first and says so
_ending = None  # a lock: the main thread and the watcher must not both end the process


def several_processes() -> bool:
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def process_name() -> str:
    """`node 1, rank 2 of 4` (several nodes), `rank 1 of 2` (one node), '' for a single process."""
    if not several_processes():
        return ""
    rank, world = os.environ.get("RANK", "?"), os.environ["WORLD_SIZE"]
    if int(os.environ.get("GROUP_WORLD_SIZE", "1") or 1) > 1:
        return f"node {os.environ.get('GROUP_RANK', '?')}, rank {rank} of {world}"
    return f"rank {rank} of {world}"


def _failure_board():
    """A client of torchrun's rendezvous store, or None (one process, not under torchrun, unreachable)."""
    global _board, _board_tried, _ending
    if _board_tried or not several_processes() or not under_torchrun():
        return _board
    _board_tried = True
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return None
    import threading
    from datetime import timedelta

    import torch.distributed as dist

    try:
        _board = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=10))
    except Exception:  # noqa: BLE001  (any failure to reach it: each process then speaks for itself)
        return None
    _ending = threading.Lock()
    return _board


def _key() -> str:
    return f"{FAILURE_KEY}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def claim_failure() -> bool:
    """Whether this process is the first of its run to fail, and so the one to say it (True when it is alone
    or the store cannot be reached: better said twice than never)."""
    global _claimed
    board = _failure_board()
    if board is None:
        return True
    name = process_name()
    _claimed = True  # before the claim is visible: this process's own watcher must not end it
    try:  # atomic: the key is set only where it is absent, and the value read back names the first
        _claimed = board.compare_set(_key(), "", name).decode() == name
    except Exception:  # noqa: BLE001
        return True
    return _claimed


def failed_first() -> str | None:
    """The process that failed first (`node 1, rank 2 of 4`) if another process of this run has failed."""
    board = _failure_board()
    if board is None or _claimed:
        return None
    try:
        return board.get(_key()).decode() if board.check([_key()]) else None
    except Exception:  # noqa: BLE001
        return None


def wait_for_failure(timeout_s: float) -> str | None:
    """The process that failed (`failed_first`), once another process of this run has said it failed, waiting
    up to `timeout_s`; None at once when no process can be told (one process, no launcher's store)."""
    import time

    if _failure_board() is None:
        return None
    end = time.monotonic() + timeout_s
    while True:
        who = failed_first()
        if who is not None or time.monotonic() >= end:
            return who
        time.sleep(0.1)


PEER_STOP_STATUS = 1
"""The status of a process that ends because another one failed first (`end_after_peer`)."""


def end_after_peer(who: str, status: int = PEER_STOP_STATUS) -> None:
    """End this process quietly, with `status`, because `who` failed first; on another node than `who`'s, its
    first process says where the error is (each node's console shows only its own processes)."""
    if _ending is not None and not _ending.acquire(blocking=True, timeout=30):
        return
    node = os.environ.get("GROUP_RANK", "0")
    if (
        os.environ.get("LOCAL_RANK", "0") == "0"
        and not who.startswith(f"node {node},")
        and who.startswith("node")
    ):
        print(f"stopped: {who} failed; its error is in that node's output", file=sys.stderr, flush=True)
    end_now(status)


def end_now(status: int) -> None:
    """Exit at once (output flushed), skipping the interpreter's teardown."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def watch_for_failures(interval_s: float = 0.5) -> None:
    """Start a thread that ends this process (status 1) as soon as another process of the run fails: a process
    waiting in a collective or in the start-up rendezvous for a process that is gone would otherwise wait for
    the backend's timeout (minutes) or end in its traceback."""
    if _failure_board() is None:
        return
    import atexit
    import threading
    from datetime import timedelta

    import torch.distributed as dist

    try:  # a connection of its own: the main thread's client may be in use when this one asks
        board = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=10),
        )
    except Exception:  # noqa: BLE001
        return

    stop = threading.Event()

    def watch():
        key = _key()
        while not stop.wait(interval_s):
            try:
                if not board.check([key]):
                    continue
                who = board.get(key).decode()
            except Exception:  # noqa: BLE001  (the store is gone: the run ended)
                return
            if not _claimed:
                end_after_peer(who)
            return

    watcher = threading.Thread(target=watch, name="kiln-failure-watch", daemon=True)
    watcher.start()

    def stop_watching():
        # a daemon thread still inside a store call while the interpreter tears down (and with it torch's C++
        # objects) can abort the process at exit; end it first
        stop.set()
        watcher.join(timeout=5)

    atexit.register(stop_watching)


# ------------------------------------------------------------------------------------------------------------
# kiln-launch: accelerate launch, ending as the training processes end


HELP_HEADER = """kiln-launch: `accelerate launch` for Kiln's scripts. It takes exactly the arguments of `accelerate launch`
and runs accelerate's own launch code; what it changes is how a run starts and ends:

  - SIGTERM / SIGINT (Ctrl-C, a scheduler's stop) go to the training processes, which save a checkpoint and exit
    0; the launcher itself is not interrupted.
  - The command exits with the failed training process's own status, after that process's one-line error,
    without accelerate's CalledProcessError or torchrun's ChildFailedError traceback; a process killed by a
    signal (out of memory?) gets one line naming it.
  - The values accelerate chooses itself when neither a flag nor an accelerate config file gives them (its
    five-line "run `accelerate config`" warning) are one start line naming them as flags.

Guide: docs/launching.md; the options of Kiln's scripts: docs/configuration.md."""


def main(argv: list[str] | None = None) -> None:
    """`kiln-launch ARGS`: `accelerate launch ARGS` (same arguments, accelerate's own launch code) that forwards
    SIGTERM/SIGINT to the training processes and exits with their status, without a launcher traceback."""
    import logging
    import signal
    import subprocess

    from accelerate.commands.launch import launch_command, launch_command_parser

    parser = launch_command_parser()
    parser.prog = "kiln-launch"
    accelerate_help = parser.format_help
    parser.format_help = lambda: (
        f"{HELP_HEADER}\n\nThe arguments, as accelerate launch has them:\n\n{accelerate_help()}"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    problem = _launch_problem(args)
    if problem:  # said before accelerate reads anything: its own refusals are tracebacks of 15 lines
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)
    # torchrun's agent (several processes) would take SIGTERM/SIGINT itself: forward them to its workers, wait up
    # to TORCH_ELASTIC_SHUTDOWN_TIMEOUT (30 s) and raise a SignalException. Left to the handler below (torchrun's
    # own --signals_to_handle, which accelerate passes on), the workers get the signal, save a checkpoint and
    # exit 0, and the agent ends as after any successful run.
    args.signals_to_handle = "SIGHUP,SIGQUIT"

    def forward(signum, _frame):
        for pid in _children(os.getpid()):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:  # already gone
                pass

    for sig in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(sig) is not signal.SIG_IGN:  # e.g. SIGINT of a background job: keep ignoring it
            signal.signal(sig, forward)
    if (args.num_machines or 1) > 1:
        watch_rendezvous(
            args.machine_rank or 0, args.num_machines, args.main_process_ip, args.main_process_port
        )
    # the agent's log lines repeat (as "exitcode: 2 ... of binary") what the processes said themselves
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    logging.getLogger("accelerate.commands.launch").addFilter(_defaults_in_one_line)
    try:
        launch_command(args)
    except subprocess.CalledProcessError as err:  # the single-process launcher: the process said why itself
        raise SystemExit(_exit_status(err.returncode, rank=0)) from None
    except Exception as err:
        failures = getattr(err, "failures", None)  # torchrun's ChildFailedError
        if not failures and isinstance(err, (ValueError, TypeError, KeyError, OSError)):
            # accelerate's own refusal of its arguments (e.g. `--multi_gpu --num_processes 1`): its words, one line
            from .errors import first_line

            print(f"error: kiln-launch: {first_line(err)}", file=sys.stderr)
            raise SystemExit(2) from None
        if not failures:
            raise
        rank, first = _failure_that_spoke(failures)
        raise SystemExit(_exit_status(int(first.exitcode), rank)) from None


def _launch_problem(args) -> str | None:
    """What is wrong with the launcher's own arguments, as one line naming the fix, before accelerate reads them:
    an accelerate config file that is missing, a folder, or not one accelerate can read (not YAML or JSON, or not
    its fields), and a training script that is not there. None when nothing is."""
    path = args.config_file
    if path is not None:
        fix = f"write one with `accelerate config --config_file {path}`, or leave --config_file out"
        if not os.path.exists(path):
            return f"--config_file {path} does not exist; {fix}"
        if not os.path.isfile(path):
            return f"--config_file {path} is not a file; {fix}"
        from accelerate.commands.config.config_args import load_config_from_file

        from .errors import first_line

        try:
            load_config_from_file(path)
        except Exception as err:  # YAML or JSON that does not parse, a list, unknown or missing fields, ...
            return f"--config_file {path} is not an accelerate config file ({first_line(err)}); {fix}"
    script = args.training_script
    if not (args.module or args.no_python) and not os.path.isfile(script):
        return (
            f"no training script {script}; name one, e.g. `kiln-launch pretrain/run.py --config "
            "configs/pretrain/debug.yaml`"
        )
    return None


_DEFAULT_VALUE = re.compile(r"`(--\w+)` was set to (?:a value of )?`'?([^`']*)'?`")


def _defaults_in_one_line(record) -> bool:
    """A logging filter on accelerate's launcher: its warning that values were not passed and defaults were used
    (5 lines ending in "run `accelerate config`", on every start without an accelerate config file, and on a CPU
    machine with one) becomes Kiln's one start line naming those values as flags; any other record passes."""
    message = record.getMessage()
    if not message.startswith("The following values were not passed to `accelerate launch`"):
        return True
    values = {flag: value for flag, value in _DEFAULT_VALUE.findall(message)}
    if values.get("--num_processes") == "0":  # no GPU counted: one process on this machine
        values["--num_processes"] = "1"
    flags = [f"{flag} {value}" for flag, value in values.items()]
    if "enabling multi-GPU" in message:
        flags.append("--multi_gpu")
    choose = "(choose with these flags or `accelerate config`)"
    print(f"kiln-launch: using accelerate's defaults {' '.join(flags)} {choose}", file=sys.stderr, flush=True)
    return False


def _failure_that_spoke(failures: dict) -> tuple:
    """(rank, failure) of the process whose status ends the command: the earliest failure with a status other
    than a stopped peer's, else the earliest. A peer stopped by the failure watcher can exit (status 1) before
    the process that failed first has said its one line and exited with its own status (2 for a user error), so
    torchrun's earliest failure is not always the one that spoke."""
    own = {rank: failure for rank, failure in failures.items() if int(failure.exitcode) != PEER_STOP_STATUS}
    pool = own or failures
    rank = min(pool, key=lambda r: pool[r].timestamp)
    return rank, pool[rank]


RENDEZVOUS_NOTICE_S = 10.0
"""How long `kiln-launch` waits for the other nodes quietly before it says so."""


def watch_rendezvous(node: int, nodes: int, host: str | None, port: int | None) -> None:
    """While no training process has started (the nodes' rendezvous): say once, after RENDEZVOUS_NOTICE_S, which
    nodes this one waits for, and end at once on SIGTERM/SIGINT.

    torchrun's agent waits for the other nodes inside one C++ call (node 0 hosts the rendezvous store and waits
    for every node to connect, up to torch's rendezvous timeout, 900 s by default); Python's signal handlers do
    not run until it returns. Python's C-level handler still writes each signal's number to the wakeup file
    descriptor, which a thread of this process reads. Once the training processes have started, signals go to
    them as usual (the handler installed by `main`)."""
    import select
    import signal
    import threading
    import time

    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    others = [str(rank) for rank in range(nodes) if rank != node]
    who = ("node " if len(others) == 1 else "nodes ") + ", ".join(others)
    where = f"{host or 'the main process address'}:{port or 29500}"
    start = time.monotonic()

    def watch():
        said = False
        while True:
            ready, _, _ = select.select([read_end], [], [], 0.5)
            if _children(os.getpid()):
                return  # the rendezvous is over: the training processes take the signals
            waited = time.monotonic() - start
            if ready:
                received = os.read(read_end, 64)
                for signum in received:
                    if signum in (signal.SIGTERM, signal.SIGINT):
                        name = signal.Signals(signum).name
                        print(
                            f"stopped by {name} while node {node} of {nodes} waited {waited:.0f} s for {who} to "
                            f"join at {where}; no training process had started",
                            file=sys.stderr,
                            flush=True,
                        )
                        end_now(0 if signum == signal.SIGTERM else 130)
            if not said and waited >= RENDEZVOUS_NOTICE_S:
                said = True
                print(
                    f"kiln-launch: node {node} of {nodes} has waited {waited:.0f} s for {who} to join at {where} "
                    "(torch gives up after its rendezvous timeout, 900 s by default); start the other nodes with "
                    "the same command and their --machine_rank, or stop this one with Ctrl-C",
                    file=sys.stderr,
                    flush=True,
                )

    threading.Thread(target=watch, name="kiln-rendezvous-watch", daemon=True).start()


def _exit_status(code: int, rank: int) -> int:
    """A shell's status for a training process's exit code; one line when a signal killed it (it said nothing)."""
    if code >= 0:
        return code
    import signal

    name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else f"signal {-code}"
    print(
        f"error: training process rank {rank} was killed by {name} (out of memory?); checkpoints completed before "
        "it are kept (continue with --training.resume_from_checkpoint latest)",
        file=sys.stderr,
    )
    return 128 - code


def _children(pid: int) -> list[int]:
    """The processes `pid` started (Linux: /proc, by each of its threads; elsewhere psutil, an accelerate
    dependency)."""
    try:
        children = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                children += [int(child) for child in fh.read().split()]
        return children
    except OSError:
        import psutil

        return [child.pid for child in psutil.Process(pid).children()]


if __name__ == "__main__":
    main()

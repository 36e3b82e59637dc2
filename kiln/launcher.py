"""`accelerate launch` of a Kiln command behaves like the command it runs: signals reach the training process,
and its exit status (and last line) are the command's.

accelerate's single-process launcher (what `accelerate launch pretrain/run.py` uses for one process: the default
accelerate config, the README's commands) runs the script in a child process, and

- does not forward signals: a SIGTERM sent to it (by a scheduler, `timeout`, `kill`, a container runtime) ends
  the launcher at once with status 143 while the training process runs on, orphaned, or is killed outright
  without its checkpoint when the launcher was a container's first process;
- answers any non-zero status of the script with its own `CalledProcessError` traceback and status 1 (with
  `-q`: no traceback, still 1), so Kiln's one-line `error: ...` (status 2) is neither the last line nor the
  status.

`kiln-launch.pth`, installed into site-packages with Kiln, calls `install()` at interpreter start-up. It does
nothing unless the process is `accelerate launch ...` (or `accelerate-launch ...`); there it wraps accelerate's
single-process launcher for Kiln's own scripts (`pretrain/*.py`, `finetune/*.py`, or `-m pretrain...` /
`-m finetune...`) only: SIGTERM and SIGINT are forwarded to the training process, which saves a checkpoint and
stops, and the launcher waits for it and exits with its status: 0 after such a stop, 2 after a user error, 1
after a run error, without a traceback of its own. The torchrun-based launchers (several processes, FSDP,
DeepSpeed on one node) forward signals themselves; for Kiln's scripts they are wrapped only to end the same way
(`kiln_torchrun_launcher`). A single-process run on a machine without an accelerator gets a thread per physical
core instead of accelerate's default of one (`cpu_threads`). Other scripts are left as accelerate made them.

Standard library only: this runs at the start-up of every `accelerate launch`.
"""

from __future__ import annotations

import os
import sys

LAUNCH_MODULE = "accelerate.commands.launch"
ENTRY_FOLDERS = ("pretrain", "finetune")


def install() -> None:
    """Wrap accelerate's single-process launcher once it is imported, if this process is `accelerate launch`."""
    argv = sys.argv
    program = os.path.basename(argv[0]) if argv else ""
    if not (program == "accelerate-launch" or (program == "accelerate" and argv[1:2] == ["launch"])):
        return
    module = sys.modules.get(LAUNCH_MODULE)
    if module is not None:
        patch(module)
    elif not any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


class _PatchOnImport:
    """A meta path finder that lets `accelerate.commands.launch` load as usual, then patches it."""

    def find_spec(self, name, path=None, target=None):
        if name != LAUNCH_MODULE:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader_exec = spec.loader.exec_module

        def exec_module(module):
            loader_exec(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def patch(module) -> None:
    """Wrap accelerate's single-process launcher (`kiln_simple_launcher`) and its torchrun-based launchers
    (multi-process, FSDP, single-node DeepSpeed: `kiln_torchrun_launcher`) for Kiln's scripts."""
    prepare = getattr(module, "prepare_simple_launcher_cmd_env", None)
    if prepare is not None:
        _wrap(module, "simple_launcher", lambda original, args: kiln_simple_launcher(prepare, args))
    for name in ("multi_gpu_launcher", "deepspeed_launcher"):
        _wrap(module, name, kiln_torchrun_launcher)


def _wrap(module, name: str, kiln_launcher) -> None:
    """`module.name(args)` becomes `kiln_launcher(original, args)` for Kiln's scripts, the original otherwise."""
    original = getattr(module, name, None)
    if original is None or getattr(original, "kiln_wrapped", False):
        return

    def launcher(args):
        if not is_kiln_entry(args):
            return original(args)
        return kiln_launcher(original, args)

    launcher.kiln_wrapped = True
    launcher.__doc__ = original.__doc__
    setattr(module, name, launcher)


def is_kiln_entry(args) -> bool:
    """Whether accelerate was asked to run one of Kiln's own scripts or modules."""
    script = str(getattr(args, "training_script", "") or "")
    if getattr(args, "no_python", False):
        return False
    if getattr(args, "module", False):
        return script.split(".")[0] in ENTRY_FOLDERS
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the folder holding kiln/, pretrain/
    path = os.path.realpath(script)
    return path.endswith(".py") and os.path.dirname(os.path.dirname(path)) == os.path.realpath(root) and (
        os.path.basename(os.path.dirname(path)) in ENTRY_FOLDERS
    )


def kiln_simple_launcher(prepare, args) -> None:
    """accelerate's single-process launcher, forwarding SIGTERM/SIGINT and exiting with the script's status."""
    import signal
    import subprocess

    cmd, env = prepare(args)
    threads = cpu_threads(args)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    process = subprocess.Popen(cmd, env=env)

    def forward(signum, _frame):
        try:
            process.send_signal(signum)
        except ProcessLookupError:  # already gone
            pass

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(sig) is signal.SIG_IGN:  # e.g. SIGINT of a background job: keep ignoring it
            continue
        previous[sig] = signal.signal(sig, forward)
    try:
        status = process.wait()  # a forwarded signal interrupts the wait, which then resumes (PEP 475)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if status < 0:  # ended by a signal it did not handle: report it as a shell does
        status = 128 - status
    if status:
        raise SystemExit(status)


THREAD_FLAGS = ("--num_cpu_threads_per_process", "--num-cpu-threads-per-process")


def cpu_threads(args, environ=None, argv=None) -> int | None:
    """The OMP_NUM_THREADS of a single-process Kiln run on a machine without an accelerator, or None to keep
    accelerate's value.

    accelerate's launcher sets OMP_NUM_THREADS to `--num_cpu_threads_per_process`. When neither that flag nor
    OMP_NUM_THREADS is given, the value is 1 unless `--cpu` is given (accelerate#753: few CPU threads suit GPU
    training). So on a CPU-only machine, `accelerate launch pretrain/run.py` trained on one core. On the 2-core
    CI-class machine that made the default run 1.58x slower than with both cores, with the same losses. Here a
    CPU-only run gets what accelerate gives `--cpu` runs: one thread per physical core this process may use. A
    thread count the user chose (either setting) and runs that will use a GPU keep accelerate's."""
    environ = os.environ if environ is None else environ
    argv = sys.argv if argv is None else argv
    if "OMP_NUM_THREADS" in environ or any(arg.split("=")[0] in THREAD_FLAGS for arg in argv):
        return None
    if getattr(args, "num_cpu_threads_per_process", 1) != 1 or _accelerator_available():
        return None
    import psutil  # an accelerate dependency

    cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):
        cores = min(cores, len(os.sched_getaffinity(0)))
    return cores if cores > 1 else None


def _accelerator_available() -> bool:
    """Whether torch sees a GPU or another accelerator that accelerate would train on."""
    import torch

    if torch.cuda.is_available() or torch.backends.mps.is_available():
        return True
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return True
    import accelerate.utils

    checks = ("is_npu_available", "is_mlu_available", "is_sdaa_available", "is_musa_available", "is_hpu_available")
    return any(getattr(accelerate.utils, name, lambda: False)() for name in checks)


# How long torchrun's agent waits for the training processes after forwarding a SIGTERM before it kills them
# (torch's default: 30 s): they finish their step and write a checkpoint, which can take longer on big models.
SHUTDOWN_TIMEOUT_S = "300"


def kiln_torchrun_launcher(original, args) -> None:
    """accelerate's torchrun-based launcher, ending like the training processes do.

    torchrun's agent already forwards SIGTERM/SIGINT to the training processes; what it adds is its own ending:
    a `SignalException` or `ChildFailedError` traceback and status 1, after a clean stop with a checkpoint as
    after a Kiln error line. Here: status 0 once every process stopped cleanly after a signal; a process's own
    status (2 after its one-line error) when one failed; one line when one was killed by a signal."""
    import logging
    import signal

    os.environ.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", SHUTDOWN_TIMEOUT_S)
    # the agent's log lines repeat (as "exitcode: 2 ... of binary") what the processes said themselves; its
    # loggers set their own levels when created, so each is quieted once they all exist
    import torch.distributed.run  # noqa: F401  (creates the agent's loggers)

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    exits = _record_worker_exits()
    try:
        original(args)
    except Exception as err:
        kind = type(err).__name__
        if kind == "SignalException":
            signum = int(getattr(err, "sigval", signal.SIGTERM))
            if exits and all(code in (0, -signum) for code in exits.values()):
                if any(code == -signum for code in exits.values()):  # still starting: no handler of Kiln's yet
                    print(f"stopped by {signal.Signals(signum).name} while the training processes were starting; "
                          "nothing was trained", file=sys.stderr)
                raise SystemExit(0) from None
            print(
                f"error: stopped by {signal.Signals(signum).name}, but a training process did not stop within "
                f"TORCH_ELASTIC_SHUTDOWN_TIMEOUT={os.environ['TORCH_ELASTIC_SHUTDOWN_TIMEOUT']} s and was killed; "
                "checkpoints completed before it are kept",
                file=sys.stderr,
            )
            raise SystemExit(128 + signum) from None
        if kind == "ChildFailedError" and hasattr(err, "get_first_failure"):
            rank, failure = err.get_first_failure()
            code = int(failure.exitcode)
            if code > 0:
                raise SystemExit(code) from None  # the process printed its own error (one line for user errors)
            name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else f"signal {-code}"
            print(
                f"error: training process rank {rank} was killed by {name} (out of memory?); checkpoints completed "
                "before it are kept (continue with --training.resume_from_checkpoint latest)",
                file=sys.stderr,
            )
            raise SystemExit(128 - code) from None
        raise


def _record_worker_exits() -> dict:
    """local rank -> exit status of the training processes, as torchrun's agent leaves them when it shuts them
    down after a signal (filled in then; empty if this torch's agent is laid out differently)."""
    exits: dict = {}
    try:
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    except ImportError:
        return exits
    shutdown = LocalElasticAgent._shutdown
    if getattr(shutdown, "kiln_wrapped", False):
        return exits

    def _shutdown(self, *args, **kwargs):
        shutdown(self, *args, **kwargs)
        handlers = getattr(getattr(self, "_pcontext", None), "subprocess_handlers", None) or {}
        for local_rank, handler in handlers.items():
            proc = getattr(handler, "proc", None)
            if proc is not None:
                exits[local_rank] = proc.poll()

    _shutdown.kiln_wrapped = True
    LocalElasticAgent._shutdown = _shutdown
    return exits

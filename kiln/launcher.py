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
after a run error, without a traceback of its own. Other scripts and the multi-process launchers (torchrun's
agent forwards signals itself) are left as accelerate made them.

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
    """Replace `module.simple_launcher` (accelerate's single-process launcher) by `kiln_simple_launcher`."""
    original = getattr(module, "simple_launcher", None)
    prepare = getattr(module, "prepare_simple_launcher_cmd_env", None)
    if original is None or prepare is None or getattr(original, "kiln_wrapped", False):
        return

    def simple_launcher(args):
        if not is_kiln_entry(args):
            return original(args)
        return kiln_simple_launcher(prepare, args)

    simple_launcher.kiln_wrapped = True
    simple_launcher.__doc__ = original.__doc__
    module.simple_launcher = simple_launcher


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

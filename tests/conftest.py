"""Shared fixtures: an offline Hugging Face Hub, a temporary HF home, a fake token, fresh-process loading, and
the tiny pretrained checkpoints the fine-tuning tests start from.

This module's top runs before any test module imports huggingface_hub, transformers or datasets. It has to:
huggingface_hub reads HF_ENDPOINT, HF_HOME and the HF_HUB_* switches once, at import. Every Hugging Face call
of the test session therefore goes to a loopback port (served by the `hub_server` fixture; refused otherwise),
and every cache lives in a temporary folder, never in ~/.cache.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

if "huggingface_hub" in sys.modules:
    raise RuntimeError(
        "huggingface_hub was imported before tests/conftest.py could point it at the test Hub; "
        "remove the pytest plugin or -p option that imports it"
    )

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest -n N runs N workers on the machine's cores; torch's own thread pool in each would oversubscribe
    # them (CI: 2 workers on 2 cores). Set before torch is imported, so launched subprocesses inherit it.
    os.environ.setdefault("OMP_NUM_THREADS", "1")

TEST_TOKEN = "hf_kilnTESTtoken0123456789"
"""The token tests run with (HF_TOKEN); the test Hub accepts only this one."""
TEST_USER = "kiln-test"
REPO_ROOT = Path(__file__).resolve().parents[1]


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


_SCRATCH = Path(tempfile.mkdtemp(prefix="kiln-tests-hf-"))
atexit.register(shutil.rmtree, _SCRATCH, ignore_errors=True)
HUB_PORT = _free_loopback_port()
HUB_URL = f"http://127.0.0.1:{HUB_PORT}"
os.environ.update(
    HF_ENDPOINT=HUB_URL,
    HF_HOME=str(_SCRATCH / "home"),
    HF_TOKEN=TEST_TOKEN,
    HF_HUB_DISABLE_TELEMETRY="1",
    HF_HUB_DISABLE_UPDATE_CHECK="1",
    HF_HUB_DISABLE_PROGRESS_BARS="1",
)
# Settings that would route around the temporary home or the test Hub. Offline mode is not needed: the
# endpoint is a loopback port, so nothing reaches the real Hub anyway. Xet stays on (the default) unless a
# test turns it off.
for _name in (
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_TOKEN_PATH",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HUB_DISABLE_XET",
    "HUGGINGFACE_CO_STAGING",
):
    os.environ.pop(_name, None)


@pytest.fixture(scope="session")
def hub_server():
    """The session's offline Hub (tests/hub_server.py) on HF_ENDPOINT. Prefer `hub`: it resets per test."""
    # constants is a lazy submodule of huggingface_hub: import it rather than rely on another test having done so
    from hub_server import HubServer
    from huggingface_hub import constants

    if constants.ENDPOINT != HUB_URL:
        pytest.fail(f"huggingface_hub talks to {constants.ENDPOINT}, not the test Hub {HUB_URL}")
    server = HubServer(port=HUB_PORT, token=TEST_TOKEN).start()
    yield server
    server.stop()


@pytest.fixture
def hub(hub_server):
    """The offline Hub, emptied before and after the test: no repos, faults, held or logged requests."""
    hub_server.reset(token=TEST_TOKEN)
    yield hub_server
    hub_server.reset(token=TEST_TOKEN)


def load_in_fresh_process(code: str, env: dict[str, str] | None = None, timeout: float = 300) -> str:
    """Run `code` in a new Python interpreter against the test Hub, with an empty Hugging Face cache.

    Proves that something loads from the Hub alone (e.g. `AutoModel.from_pretrained(repo,
    trust_remote_code=True)`), with nothing imported or cached by the test process. `env` adds or overrides
    environment variables (the child inherits HF_ENDPOINT and HF_TOKEN). Returns the child's stdout; fails the
    test with the child's stderr when it exits non-zero.
    """
    home = tempfile.mkdtemp(prefix="home-", dir=_SCRATCH)
    child_env = {**os.environ, "HF_HOME": home, **(env or {})}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=child_env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        pytest.fail(f"fresh process exited with {result.returncode}:\n{result.stderr[-6000:]}", pytrace=False)
    return result.stdout


@pytest.fixture
def fresh_process():
    """`load_in_fresh_process` as a fixture: `fresh_process(code, env=None) -> stdout`."""
    return load_in_fresh_process


@pytest.fixture(scope="session")
def kiln_checkpoints(tmp_path_factory):
    """A tiny pretrained encoder and decoder (debug config, 16 steps): (encoder final/, decoder final/), built once
    and shared by xdist workers."""
    from filelock import FileLock
    from kiln_testing import DEBUG, DECODER, one_torch_thread, run_main

    from pretrain.run import main as pretrain

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "kiln-finetune-checkpoints"
    with FileLock(str(root) + ".lock"), one_torch_thread():
        if not (root / "done").is_file():
            common = [
                "--config",
                DEBUG,
                "--training.max_steps",
                "16",
                "--training.lr",
                "3e-3",
                "--training.save_steps",
                "0",
                "--training.eval_steps",
                "0",
                "--training.overwrite_output_dir",
            ]
            run_main(pretrain, *common, "--training.output_dir", root / "enc")
            run_main(pretrain, *common, *DECODER, "--training.output_dir", root / "dec")
            (root / "done").touch()
    return root / "enc" / "final", root / "dec" / "final"


WHOLE_SUITE: dict[str, int] = {}
"""{"collected": N} when this session collected the whole suite (testpaths, nothing ignored): N is the count of
`pytest --collect-only`, taken before any -m, -k or --deselect leaves tests out. Under `pytest -n 2` every worker
collects the whole suite, so a test may read the count here instead of collecting it again in a fresh process."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    tests = (REPO_ROOT / "tests").resolve()
    paths = [(config.invocation_params.dir / arg.split("::")[0]).resolve() for arg in config.args]
    # --last-failed collects only the files that failed: not the whole suite
    left_out = ("ignore", "ignore_glob", "lf")
    if paths == [tests] and not any(config.getoption(name, None) for name in left_out):
        WHOLE_SUITE["collected"] = len(items)


@pytest.fixture(autouse=True)
def _stop_signals_restored():
    """Each test leaves SIGINT and SIGTERM as it found them. A command run in-process that reports an error
    ignores further stop signals (kiln.signals.absorb_stop_signals), and an ignored signal is inherited: every
    command a later test starts from the same worker would then ignore Ctrl-C."""
    import signal

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        if handler is not None and signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)


def _repoint_closed_log_streams() -> None:
    """Every logging StreamHandler whose stream is closed writes to this test's stderr instead. Libraries add
    their handler once, on the sys.stderr of that moment (huggingface_hub's and transformers' library loggers, a
    command's logging.basicConfig): when that was a test's capture stream, closed at the test's end, every later log
    line in the worker (a Hub upload thread's included) became a 'Logging error' traceback on the stderr of
    whichever test was running, failing test_link_walk's no-traceback check after tests/test_run_folder.py."""
    import logging
    import sys

    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            stream = getattr(handler, "stream", None)
            if type(handler) is logging.StreamHandler and getattr(stream, "closed", False):
                with handler.lock:  # not setStream: it flushes the old stream, which raises once closed
                    handler.stream = sys.stderr


@pytest.fixture(autouse=True)
def _log_streams_open():
    """Each test starts and ends with every log handler writing to an open stream (_repoint_closed_log_streams)."""
    _repoint_closed_log_streams()
    yield
    _repoint_closed_log_streams()

"""Kiln's scripts under `accelerate launch` (docs/launching.md), with nothing installed into the interpreter's
start-up: every behaviour is the training process's own (kiln.launcher, kiln.cli.run_cli) or `kiln-launch`'s,
so it holds for `accelerate launch`, `python -m accelerate.commands.launch` and a checkout other than the
installed one alike.

- SIGTERM to `accelerate launch` (one process): the launcher ends at once with 143 (accelerate's), the training
  process saves a checkpoint, says so in one line and exits 0 (asked for a signal when its launcher dies).
- Several processes: torchrun's agent forwards the signal; the processes save a checkpoint; the agent ends with
  its SignalException (status 1).
- `kiln-launch` (`python -m kiln.launcher`, same arguments as `accelerate launch`): SIGTERM ends in the checkpoint
  and status 0; an error ends in the process's one line and status, no launcher traceback.
- CPU threads: a single process that accelerate pinned to one thread by default gets one per physical core."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from kiln_testing import REPO, free_port, losses

from kiln.checkpoint_files import find_checkpoints

QUICK = ["--training.eval_steps", 0]
ONE_PROCESS = (
    "--num_processes",
    "1",
    "--num_machines",
    "1",
    "--mixed_precision",
    "no",
    "--dynamo_backend",
    "no",
)
TWO_PROCESSES = (
    "--multi_gpu",
    "--num_processes",
    "2",
    "--main_process_port",
    "0",
    *ONE_PROCESS[2:],
)  # 0: a free port
ACCELERATE_LAUNCH = (
    sys.executable,
    "-m",
    "accelerate.commands.accelerate_cli",
    "launch",
)  # `accelerate launch`
PYTHON_M_ACCELERATE = (sys.executable, "-m", "accelerate.commands.launch")
KILN_LAUNCH = (sys.executable, "-m", "kiln.launcher")
CPU_PROCESSES = {"ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
LONG_RUN = ["--training.max_steps", 100000, "--training.save_steps", 0, *QUICK]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and parent-death signals")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A copy of this repository's code, configs and sample data: a checkout other than the installed one."""
    root = tmp_path_factory.mktemp("checkout")
    for folder in ("kiln", "pretrain", "configs"):
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "data/pretrain", root / "data/pretrain")
    return root


def _launch(launcher, args, *, repo=REPO, env_extra=None, env_drop=()):
    env = {key: value for key, value in os.environ.items() if key not in env_drop}
    env = {**env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(repo), **(env_extra or {})}
    command = [
        *launcher,
        str(repo / "pretrain/run.py"),
        "--config",
        str(repo / "configs/pretrain/debug.yaml"),
    ]
    return subprocess.Popen(
        [*command, *map(str, args)],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_for_steps(out, steps=3, timeout=240):
    metrics = out / "metrics.jsonl"
    deadline = time.time() + timeout
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < steps):
        time.sleep(0.2)
    assert metrics.exists(), "the run did not start training"


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        return []


def _gone(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _checkpointed_at_last_step(out, output):
    (checkpoint,) = find_checkpoints(out)
    saved = json.loads((checkpoint / "trainer_state.json").read_text())["global_step"]
    assert saved >= 3 and max(losses(out)) == saved, output  # nothing trained after the checkpoint
    return saved


# ----------------------------------------------------------------------------------------------------------
# SIGTERM to the launcher


@pytest.mark.slow
@linux_only
def test_sigterm_to_accelerate_launch_from_another_checkout_saves_a_checkpoint(tmp_path, checkout):
    """Only the launcher gets the signal (as from `kill PID`, `timeout` or a container runtime): it ends at once
    (accelerate's 143) and the training process, signalled by Linux when its launcher dies, saves a checkpoint,
    says so and exits 0. Linux signals it again for each of the launcher's threads, and a repeat while it stops
    (here one more, sent by hand, as the stop is reported) must not end it in a traceback."""
    out = tmp_path / "launched"
    proc = _launch(
        (*ACCELERATE_LAUNCH, *ONE_PROCESS), ["--training.output_dir", out, *LONG_RUN], repo=checkout
    )
    _wait_for_steps(out)
    (child,) = _children(proc.pid)
    proc.send_signal(signal.SIGTERM)
    lines = []
    try:
        for line in proc.stdout:  # the training process keeps the pipe after its launcher is gone
            lines.append(line)
            if line.startswith("stopped by signal at step"):
                try:
                    os.kill(child, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.time() + 120
        while time.time() < deadline and not _gone(child):
            time.sleep(0.2)
        assert _gone(child), "the training process was left running after its launcher died"
    finally:
        if not _gone(child):
            os.kill(child, signal.SIGKILL)
        proc.kill()
    output = "".join(lines)
    assert (
        proc.wait() == -signal.SIGTERM
    )  # accelerate's launcher does not wait: documented in docs/launching.md
    saved = _checkpointed_at_last_step(out, output)
    assert (
        output.strip().splitlines()[-1]
        == f"stopped by signal at step {saved}; checkpoint saved in {out}/checkpoints"
    )
    assert "Traceback" not in output and "SignalStop" not in output, output


@pytest.mark.slow
@linux_only
def test_sigterm_to_kiln_launch_from_another_checkout_saves_a_checkpoint_and_exits_0(tmp_path, checkout):
    out = tmp_path / "launched"
    proc = _launch((*KILN_LAUNCH, *ONE_PROCESS), ["--training.output_dir", out, *LONG_RUN], repo=checkout)
    _wait_for_steps(out)
    (child,) = _children(proc.pid)
    proc.send_signal(signal.SIGTERM)  # only the launcher
    try:
        output, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, output
    assert _gone(child)  # the launcher waited for it
    saved = _checkpointed_at_last_step(out, output)
    assert (
        output.strip().splitlines()[-1]
        == f"stopped by signal at step {saved}; checkpoint saved in {out}/checkpoints"
    )
    assert "Traceback" not in output


@pytest.mark.slow
@linux_only
@pytest.mark.parametrize("launcher", ["python -m accelerate.commands.launch", "kiln-launch"])
def test_sigterm_to_a_multi_process_launch_saves_a_checkpoint(tmp_path, launcher):
    """torchrun's agent forwards the signal to both processes, which save one checkpoint; it then ends with its
    own SignalException traceback and status 1. kiln-launch forwards it instead and ends with status 0."""
    out = tmp_path / "launched"
    command = (
        (*PYTHON_M_ACCELERATE, *TWO_PROCESSES)
        if launcher.startswith("python")
        else (*KILN_LAUNCH, *TWO_PROCESSES)
    )
    proc = _launch(command, ["--training.output_dir", out, *LONG_RUN], env_extra=CPU_PROCESSES)
    _wait_for_steps(out)
    proc.send_signal(signal.SIGTERM)  # only the launcher
    try:
        output, _ = proc.communicate(timeout=180)
    finally:
        proc.kill()
    saved = _checkpointed_at_last_step(out, output)
    assert f"stopped by signal at step {saved}; checkpoint saved in {out}/checkpoints" in output, output
    if launcher == "kiln-launch":
        assert proc.returncode == 0, output
        assert output.strip().splitlines()[-1].startswith("stopped by signal at step"), output
        assert "Traceback" not in output and "SignalException" not in output
    else:
        assert proc.returncode == 1 and "SignalException" in output, output


# ----------------------------------------------------------------------------------------------------------
# A user error


def test_an_unknown_key_under_kiln_launch_from_another_checkout_is_one_line_with_status_2(tmp_path, checkout):
    proc = _launch(
        (*KILN_LAUNCH, *ONE_PROCESS),
        ["--training.output_dir", tmp_path / "q", "--training.bogus", 1],
        repo=checkout,
    )
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2, output
    assert output.strip().splitlines()[-1].startswith("error: unknown config key 'training.bogus'"), output
    assert "Traceback" not in output and "CalledProcessError" not in output


def test_an_error_under_accelerate_launch_is_said_by_the_training_process_then_accelerate_adds_its_own(
    tmp_path,
):
    """What remains under plain `accelerate launch` (docs/launching.md): the process's line, then accelerate's
    CalledProcessError traceback and status 1; with accelerate's own `-q` the line is the last, still status 1."""
    line = "error: --training.lr must be a finite number > 0, got -1.0"
    # the two launches side by side: each is 2 interpreters importing torch (the launcher; the training process,
    # whose config check needs the model classes) and nothing else, so most of their time is start-up
    proc = _launch(
        (*ACCELERATE_LAUNCH, *ONE_PROCESS), ["--training.output_dir", tmp_path / "q", "--training.lr", -1]
    )
    quiet = _launch(
        (*ACCELERATE_LAUNCH, "-q", *ONE_PROCESS),
        ["--training.output_dir", tmp_path / "q", "--training.lr", -1],
    )
    try:
        output, _ = proc.communicate(timeout=300)
        quiet_output, _ = quiet.communicate(timeout=300)
    finally:
        proc.kill()
        quiet.kill()
    assert proc.returncode == 1 and output.count(line) == 1 and "CalledProcessError" in output, output
    assert output.strip().splitlines()[-1].startswith("subprocess.CalledProcessError: Command "), output
    output = quiet_output
    assert quiet.returncode == 1 and output.strip().splitlines()[-1] == line, output
    assert "Traceback" not in output and "CalledProcessError" not in output


def test_multi_process_kiln_launch_ends_on_the_one_line_error_said_once(tmp_path):
    proc = _launch(
        (*KILN_LAUNCH, *TWO_PROCESSES),
        ["--training.output_dir", tmp_path / "q", "--training.lr", -1],
        env_extra=CPU_PROCESSES,
    )
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2, output
    line = "error: --training.lr must be a finite number > 0, got -1.0"
    assert re.fullmatch(re.escape(line) + r" \(rank [01] of 2\)", output.strip().splitlines()[-1]), output
    assert output.count(line) == 1, output  # every process finds it; the first one says it
    assert "Traceback" not in output and "ChildFailedError" not in output and "exitcode" not in output


def test_kiln_launch_ends_with_the_status_of_the_process_that_spoke_not_of_a_peer_stopped_before_it():
    """A peer stopped by the failure watcher (status 1) can exit before the process that failed first has said
    its line and exited with its own status (2: a user error); torchrun's earliest failure is then the peer's."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from kiln.launcher import _failure_that_spoke

    def failure(rank, status, timestamp):
        found = ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=status, error_file="")
        found.timestamp = timestamp
        return found

    peer_first = {0: failure(0, 1, 10), 1: failure(1, 2, 11)}
    assert _failure_that_spoke(peer_first)[0] == 1 and _failure_that_spoke(peer_first)[1].exitcode == 2
    killed = {
        0: failure(0, 1, 12),
        1: failure(1, -9, 11),
    }  # killed by a signal: it said nothing, its peers end 1
    assert _failure_that_spoke(killed)[1].exitcode == -9
    run_errors = {0: failure(0, 1, 12), 1: failure(1, 1, 11)}  # all 1: the earliest, as torchrun reports it
    assert _failure_that_spoke(run_errors)[0] == 1


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["python -m accelerate.commands.launch", "kiln-launch"])
def test_an_error_on_one_node_is_said_once_by_that_process_and_every_node_stops(tmp_path, launcher):
    """Two nodes of one process each on loopback (gloo); node 1 cannot read the data (as on a node-local disk
    that lacks it). Node 1's process says so in one line naming it; node 0's process, whose first collective
    with it fails, stops without a traceback and says where the error is. Under accelerate's launcher torchrun
    then adds its ChildFailedError report on each node (docs/launching.md); under kiln-launch nothing follows."""
    port = free_port()
    head = PYTHON_M_ACCELERATE if launcher.startswith("python") else KILN_LAUNCH
    missing = tmp_path / "not-on-node-1" / "*.txt"
    nodes = []
    for node in (0, 1):
        node_args = (
            "--multi_gpu",
            "--num_machines",
            "2",
            "--machine_rank",
            str(node),
            "--num_processes",
            "2",
            "--main_process_ip",
            "127.0.0.1",
            "--main_process_port",
            str(port),
            "--rdzv_backend",
            "static",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
        )
        run_args = ["--training.output_dir", tmp_path / "run", "--training.max_steps", 20, *QUICK]
        if node == 1:
            run_args += ["--data.data_files", missing]
        nodes.append(_launch((*head, *node_args), run_args, env_extra=CPU_PROCESSES))
    outputs = []
    try:
        for proc in nodes:
            outputs.append(proc.communicate(timeout=300)[0])
    finally:
        for proc in nodes:
            proc.kill()
    node0, node1 = outputs
    said = [line for line in node1.splitlines() if line.startswith("error: ")]
    assert len(said) == 1 and said[0].endswith(
        "matches no files (relative paths start at the repo root); fix the path (node 1, rank 1 of 2)"
    ), node1
    assert "error: " not in node0 and "Connection closed by peer" not in node0 + node1, node0
    assert "stopped: node 1, rank 1 of 2 failed; its error is in that node's output" in node0, node0
    assert not (tmp_path / "run" / "checkpoints").exists() or not find_checkpoints(tmp_path / "run")
    if launcher == "kiln-launch":
        assert [proc.returncode for proc in nodes] == [1, 2], outputs
        assert node1.strip().splitlines()[-1] == said[0] and "Traceback" not in node0 + node1, outputs
        assert node0.strip().splitlines()[-1].startswith("stopped: node 1"), node0
    else:  # what torchrun adds, on both nodes
        assert (
            [proc.returncode for proc in nodes] == [1, 1]
            and "ChildFailedError" in node0
            and "ChildFailedError" in node1
        )
        assert "[rank0]: Traceback" not in node0 and "[rank1]: Traceback" not in node1, outputs


def test_kiln_launch_leaves_other_scripts_as_accelerate_ends_them(tmp_path):
    other = tmp_path / "other.py"
    other.write_text("import sys; print('failing'); sys.exit(3)\n")
    result = subprocess.run(
        [*KILN_LAUNCH, *ONE_PROCESS, str(other)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 3 and "failing" in result.stdout and "Traceback" not in result.stderr


def test_kiln_launch_without_an_accelerate_config_starts_with_one_line_naming_accelerate_s_defaults(tmp_path):
    """No flag and no accelerate config file: accelerate's five-line "run `accelerate config`" warning is one
    start line naming the values it chose as flags."""
    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    home = tmp_path / "empty-home"  # no accelerate/default_config.yaml under it
    home.mkdir()
    result = subprocess.run(
        [*KILN_LAUNCH, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "HF_HOME": str(home)},
    )
    assert result.returncode == 0 and "hello" in result.stdout, result.stderr
    assert "accelerate config`." not in result.stderr and "not passed" not in result.stderr, result.stderr
    said = [
        line
        for line in result.stderr.splitlines()
        if line.startswith("kiln-launch: using accelerate's defaults")
    ]
    assert len(said) == 1 and "--num_machines 1 --mixed_precision no --dynamo_backend no" in said[0], (
        result.stderr
    )


@pytest.mark.slow
def test_kiln_launch_argument_errors_are_one_line_with_status_2(tmp_path):
    """A --config_file that is missing, a folder, not YAML, or not accelerate's fields, a training script that is
    not there, and accelerate's own refusals of its flags: one line naming the fix, status 2, no traceback (before,
    accelerate's 15-line traceback and status 1). All started together: each is the launcher alone."""
    (tmp_path / "broken.yaml").write_text("mixed_precision: [no\n")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "fields.yaml").write_text("hello: 1\n")
    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    fix = "`, or leave --config_file out"
    cases = {
        (
            "--config_file",
            tmp_path / "missing.yaml",
            script,
        ): f"error: --config_file {tmp_path / 'missing.yaml'} "
        f"does not exist; write one with `accelerate config --config_file {tmp_path / 'missing.yaml'}{fix}",
        ("--config_file", tmp_path, script): f"error: --config_file {tmp_path} is not a file; write one with "
        f"`accelerate config --config_file {tmp_path}{fix}",
        (
            "--config_file",
            tmp_path / "broken.yaml",
            script,
        ): f"error: --config_file {tmp_path / 'broken.yaml'} is not an accelerate config file (",
        (
            "--config_file",
            tmp_path / "list.yaml",
            script,
        ): f"error: --config_file {tmp_path / 'list.yaml'} is not an accelerate config file (",
        (
            "--config_file",
            tmp_path / "fields.yaml",
            script,
        ): f"error: --config_file {tmp_path / 'fields.yaml'} is "
        "not an accelerate config file (A `distributed_type` must be specified in the config file.)",
        (tmp_path / "nothing.py",): f"error: no training script {tmp_path / 'nothing.py'}; name one, e.g. "
        "`kiln-launch pretrain/run.py",
        (
            "--multi_gpu",
            "--num_processes",
            "1",
            script,
        ): "error: kiln-launch: You need to use at least 2 processes to use `--multi_gpu`.",
    }
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HOME": str(tmp_path / "home")}
    procs = {
        args: subprocess.Popen(
            [*KILN_LAUNCH, *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for args in cases
    }
    for args, proc in procs.items():
        output = proc.communicate(timeout=300)[0]
        assert proc.returncode == 2 and "Traceback" not in output, (args, output)
        assert len(output.strip().splitlines()) == 1 and output.startswith(cases[args]), (args, output)
        assert "hello" not in output


def test_a_config_file_accelerate_wrote_passes_the_launcher_check(tmp_path):
    """The control for the refusals above: accelerate's own config file and an existing script raise nothing."""
    from accelerate.commands.launch import launch_command_parser
    from accelerate.utils import write_basic_config

    from kiln.launcher import _launch_problem

    write_basic_config(mixed_precision="no", save_location=str(tmp_path / "config.yaml"))
    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    args = launch_command_parser().parse_args(["--config_file", str(tmp_path / "config.yaml"), str(script)])
    assert _launch_problem(args) is None


# ----------------------------------------------------------------------------------------------------------
# CPU threads


def test_the_thread_default_is_the_one_that_cost_the_fewest_cpu_seconds_quiet_and_busy():
    """The default thread count (accelerate's one per process, which Kiln keeps) is the count whose runs of the
    default job used the fewest CPU-seconds on a quiet and on a busy machine, by the two shipped records."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kiln_bench_threads_default", REPO / "bench" / "threads.py")
    threads = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(threads)
    records = {
        condition: json.loads((REPO / "bench" / "results" / f"{name}.json").read_text())
        for condition, name in threads.RECORDS.items()
    }
    assert threads.choose_default(records["quiet"], records["busy"])["threads"] == 1


@pytest.mark.slow
def test_accelerate_launch_trains_on_one_thread_unless_told_otherwise(tmp_path):
    """accelerate's launcher gives a single process one thread unless `--cpu`, its flag or OMP_NUM_THREADS says
    otherwise, and Kiln keeps the count: the default's one thread, and two when the user asks by either means."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: two threads cannot be asked for meaningfully")

    def launched_run(name, launcher, env_extra):
        out = tmp_path / f"threads-{name}"
        return _launch(
            launcher,
            ["--training.output_dir", out, "--training.max_steps", 1, *QUICK],
            env_extra=env_extra,
            env_drop=("OMP_NUM_THREADS",),
        )

    def summary_device(proc):
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, output
        return next(line.strip() for line in output.splitlines() if line.strip().startswith("device = "))

    flagged = (*ACCELERATE_LAUNCH, "--num_cpu_threads_per_process", "2", *ONE_PROCESS)
    runs = [
        launched_run("default", (*ACCELERATE_LAUNCH, *ONE_PROCESS), {}),  # side by side: mostly start-up
        launched_run("environment", (*PYTHON_M_ACCELERATE, *ONE_PROCESS), {"OMP_NUM_THREADS": "2"}),
        launched_run("flag", flagged, {}),
    ]
    try:
        assert summary_device(runs[0]) == "device = cpu, 1 thread per process"
        assert summary_device(runs[1]) == "device = cpu, 2 threads per process"
        assert summary_device(runs[2]) == "device = cpu, 2 threads per process"
    finally:
        for proc in runs:
            proc.kill()

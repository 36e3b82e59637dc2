"""Peers that never answer: a Hub that accepts connections and stays silent, a node that never starts, a node
killed outright. Each run ends promptly, with one line saying what happened and what to do, through the real
command (`kiln-launch`) in fresh processes on loopback. The waits are the commands' own limits, lowered where the
test may lower them: the Hub's request timeout and no-progress limit are options, and the never-starting node's
notice comes after 1 s instead of kiln-launch's 10 (its RENDEZVOUS_NOTICE_S set in that fresh process)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from kiln_testing import DEBUG, REPO, with_terminal_signals

from kiln.config import HubConfig

KILN_LAUNCH = (
    sys.executable,
    "-m",
    "kiln.launcher",
    "--num_processes",
    "1",
    "--num_machines",
    "1",
    "--mixed_precision",
    "no",
    "--dynamo_backend",
    "no",
)
QUICK = ["--training.max_steps", 2, "--training.save_steps", 0, "--training.eval_steps", 0]


class SilentServer:
    """A TCP server on loopback that accepts every connection and never reads or answers (a dead Hub behind a
    live load balancer)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)  # kept open and silent

    def close(self):
        self.sock.close()
        for conn in self.accepted:
            conn.close()


@pytest.mark.slow
def test_the_final_push_gives_up_on_a_silent_hub_after_its_no_progress_limit(tmp_path):
    """A Hub that accepts connections and never answers: the run saves final/ locally, waits for the final push no
    longer than its no-progress limit (hub.final_push_stall_s, well inside the 1800 s overall limit) and ends with
    status 1 and one line naming the local folder and the `hf upload` that pushes it later."""
    server = SilentServer()
    out = tmp_path / "silent"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "HF_ENDPOINT": f"http://127.0.0.1:{server.port}",
    }
    started = time.monotonic()
    try:
        # hub.final_push_timeout_s keeps its default (1800 s in all); a request may take 4 s (the start's check of
        # the push rights gives up on the silent Hub after that, instead of after its 10 s at the default 60 s): the
        # no-progress limit (2 s, under a request's 4 s) is what ends the final push's wait
        done = subprocess.run(
            [
                *KILN_LAUNCH,
                str(REPO / "pretrain/run.py"),
                "--config",
                DEBUG,
                "--training.output_dir",
                str(out),
                *map(str, QUICK),
                "--hub.push_to_hub",
                "--hub.model_id",
                "kiln-test/silent",
                "--hub.timeout_s",
                "4",
                "--hub.final_push_stall_s",
                "2",
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        server.close()
    took = time.monotonic() - started
    output = done.stdout + done.stderr
    assert server.accepted, "the run never reached the silent Hub"
    assert done.returncode == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    final = out / "final"
    assert output.strip().splitlines()[-1] == (
        f"error: the final model is saved locally in {final}, but the push to kiln-test/silent did not complete "
        f"(no progress for 2 s); push it later with `hf upload kiln-test/silent {final}`"
    )
    assert "waiting (at most 1800 s, or 2 s without progress) for the pushes to kiln-test/silent" in output
    assert (final / "model.safetensors").is_file()
    assert took < 300, f"the run took {took:.0f} s to end"


def test_the_final_push_gives_up_after_a_few_minutes_without_progress_by_default():
    assert 60 <= HubConfig().final_push_stall_s <= 300
    assert HubConfig().final_push_stall_s < HubConfig().final_push_timeout_s


def test_an_upload_that_progresses_outlasts_the_no_progress_limit(hub, tmp_path):
    """The wait gives up only when nothing moves: a push held by the Hub for 3 s while its traffic moves (as a
    large upload's bytes do) lands with a 1 s limit; held with nothing moving, the wait gives up."""
    from conftest import TEST_USER

    from kiln.hub import HubProgress, HubPusher

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(b"w" * 1000)
    pusher = HubPusher(f"{TEST_USER}/progress", timeout_s=30)
    for moving in (True, False):
        (folder / "weights.bin").write_bytes(str(moving).encode() * 100)  # a change: a commit to make
        gate = hub.hold("commit")
        pusher.push(folder, commit_message=f"moving={moving}")
        assert gate.entered.wait(30)
        opened = threading.Timer(3.0, gate.release)
        opened.start()
        stop_noting = threading.Event()

        def note_progress(stop_noting=stop_noting):
            while not stop_noting.wait(0.2):
                HubProgress.note()

        if moving:
            threading.Thread(target=note_progress, daemon=True).start()
        started = time.monotonic()
        landed = pusher.wait(timeout=60, stall_s=1.0)
        waited = time.monotonic() - started
        stop_noting.set()
        if moving:
            assert landed and not pusher.gave_up_idle and waited > 2.0
        else:
            assert not landed and pusher.gave_up_idle
            assert pusher.wait(timeout=60)  # released: it lands (the Hub's answer is progress)
        opened.join()
    before = HubProgress.last
    (folder / "weights.bin").write_bytes(b"last")
    pusher.push(folder, commit_message="answered")
    assert pusher.wait(timeout=60) and HubProgress.last > before  # the Hub's answers count as progress


# ----------------------------------------------------------------------------------------------------------
# nodes: one that never starts, one killed outright

CPU = {"ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


# `python -m kiln.launcher` with its rendezvous notice after 1 s: kiln-launch's main in a fresh process, the constant
# set first (what is under test is the notice and the stop, not the 10 s)
QUICK_NOTICE = (
    sys.executable,
    "-c",
    "import kiln.launcher as launcher; launcher.RENDEZVOUS_NOTICE_S = 1.0; launcher.main()",
)


def _node(rank: int, port: int, out, *args, nodes: int = 2, launcher=KILN_LAUNCH[:3]) -> subprocess.Popen:
    """`kiln-launch --num_machines NODES --machine_rank RANK` of one process, on loopback (`launcher`: how
    kiln-launch is started)."""
    command = [
        *launcher,
        "--multi_gpu",
        "--num_machines",
        str(nodes),
        "--num_processes",
        str(nodes),
        "--machine_rank",
        str(rank),
        "--main_process_ip",
        "127.0.0.1",
        "--main_process_port",
        str(port),
        "--rdzv_backend",
        "static",
        *KILN_LAUNCH[7:],
        str(REPO / "pretrain/run.py"),
        "--config",
        DEBUG,
        "--training.output_dir",
        str(out),
        *map(str, args),
    ]
    return subprocess.Popen(
        command,
        cwd=REPO,
        env={**os.environ, **CPU},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=with_terminal_signals,
    )


@pytest.mark.slow
@pytest.mark.parametrize("sig,status", [(signal.SIGTERM, 0), (signal.SIGINT, 130)], ids=["SIGTERM", "SIGINT"])
def test_node_0_waiting_for_a_node_that_never_starts_says_so_and_ends_on_a_stop_signal(tmp_path, sig, status):
    """Node 0 of 2 whose node 1 never starts says, once, whom it waits for and where (after RENDEZVOUS_NOTICE_S,
    lowered to 1 s in its process), and a stop signal then ends it at once: one line, status 0 (SIGTERM) or 130
    (SIGINT), no traceback."""
    from kiln_testing import free_port

    port = free_port()
    node0 = _node(0, port, tmp_path / "run", *QUICK, launcher=QUICK_NOTICE)
    try:
        lines = []
        for line in node0.stdout:
            lines.append(line)
            if line.startswith("kiln-launch: node 0 of 2 has waited"):
                break
        assert lines and lines[-1].startswith("kiln-launch: node 0 of 2 has waited"), "".join(lines)[-3000:]
        assert (
            lines[-1]
            .rstrip()
            .endswith(
                f"s for node 1 to join at 127.0.0.1:{port} (torch gives up after its rendezvous timeout, 900 s by "
                "default); start the other nodes with the same command and their --machine_rank, or stop this one "
                "with Ctrl-C"
            )
        )
        node0.send_signal(sig)
        rest, _ = node0.communicate(timeout=30)
    finally:
        node0.kill()
    assert node0.returncode == status, rest
    last = rest.strip().splitlines()[-1]
    assert last.startswith(f"stopped by {sig.name} while node 0 of 2 waited "), rest
    assert last.endswith(f"s for node 1 to join at 127.0.0.1:{port}; no training process had started")
    assert "Traceback" not in rest


@pytest.mark.slow
def test_a_node_killed_outright_leaves_one_line_on_the_surviving_node(tmp_path):
    from kiln_testing import free_port

    from kiln.launcher import _children

    port, out = free_port(), tmp_path / "run"
    args = [
        "--training.max_steps",
        100000,
        "--training.save_steps",
        0,
        "--training.eval_steps",
        0,
        "--data.max_train_documents",
        40,
        "--training.per_device_train_batch_size",
        4,
    ]
    nodes = [_node(rank, port, out, *args) for rank in (0, 1)]
    try:
        metrics = out / "metrics.jsonl"
        deadline = time.time() + 300
        while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 2):
            time.sleep(0.5)
        assert metrics.exists(), "the two nodes never trained"
        (trainer,) = _children(nodes[1].pid)
        os.kill(
            trainer, signal.SIGKILL
        )  # node 1's training process, as the OOM killer or a lost machine would
        started = time.monotonic()
        output, _ = nodes[0].communicate(timeout=120)
        took = time.monotonic() - started
        nodes[1].communicate(timeout=60)
    finally:
        for node in nodes:
            node.kill()
    assert nodes[0].returncode == 1, output[-3000:]
    assert "Traceback" not in output and "frame #" not in output and "Connection reset" not in output, output[
        -4000:
    ]
    last = output.strip().splitlines()[-1]
    assert last == (
        "error: lost contact with another process of the run (at 127.0.0.1: it was killed, or its machine or network "
        "failed); "
        "checkpoints completed before it are kept (continue with --training.resume_from_checkpoint latest) "
        "(node 0, rank 0 of 2)"
    ), output[-3000:]
    assert took < 60, took


# ----------------------------------------------------------------------------------------------------------
# a launch of several processes that accelerate runs one by one: not "another run" holding the folder


@pytest.mark.slow
def test_two_processes_launched_without_cpu_on_a_machine_without_gpus_are_told_why(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip(
            "needs a machine where torch sees no GPU (there, --multi_gpu without --cpu runs on the GPUs)"
        )
    out = tmp_path / "run"
    env = {key: value for key, value in os.environ.items() if key != "ACCELERATE_USE_CPU"}
    done = subprocess.run(
        [
            *KILN_LAUNCH[:3],
            "--multi_gpu",
            "--num_processes",
            "2",
            "--main_process_port",
            "0",
            *KILN_LAUNCH[5:],
            str(REPO / "pretrain/run.py"),
            "--config",
            DEBUG,
            "--training.output_dir",
            str(out),
            *map(str, QUICK),
        ],
        cwd=REPO,
        env={**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "in use by another run" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "error: this process was launched as one of 2 processes, but accelerate runs it as a run of 1 on cpu: torch "
        "sees no GPU and ACCELERATE_USE_CPU is not set; on a machine without GPUs launch with --cpu (or set "
        "ACCELERATE_USE_CPU=1), on a GPU machine check that torch.cuda.is_available() is True (rank "
    ), last
    assert not out.exists()  # refused before the output folder was touched

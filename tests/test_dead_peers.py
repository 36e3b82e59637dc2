"""Peers that never answer: a Hub that accepts connections and stays silent, a node that never starts, a node
killed outright. Each run ends promptly, with one line saying what happened and what to do, through the real
command (`kiln-launch`) in fresh processes on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

from kiln_testing import DEBUG, REPO

from kiln.config import HubConfig

KILN_LAUNCH = (sys.executable, "-m", "kiln.launcher", "--num_processes", "1", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no")  # fmt: skip
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


def test_the_final_push_gives_up_on_a_silent_hub_after_its_no_progress_limit(tmp_path):
    server = SilentServer()
    out = tmp_path / "silent"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           "HF_ENDPOINT": f"http://127.0.0.1:{server.port}"}  # fmt: skip
    started = time.monotonic()
    try:
        # hub.timeout_s and hub.final_push_timeout_s keep their defaults (60 s a request, 1800 s in all)
        done = subprocess.run(
            [*KILN_LAUNCH, str(REPO / "pretrain/run.py"), "--config", DEBUG, "--training.output_dir", str(out),
             *map(str, QUICK), "--hub.push_to_hub", "--hub.model_id", "kiln-test/silent",
             "--hub.final_push_stall_s", "20"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
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
        f"(no progress for 20 s); push it later with `hf upload kiln-test/silent {final}`"
    )
    assert "waiting (at most 1800 s, or 20 s without progress) for the pushes to kiln-test/silent" in output
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

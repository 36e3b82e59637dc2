"""Faults and bad input (issue 16): nothing lost, nothing hangs, every mistake a one-line error naming the fix.

Killed runs resume and finish, a stalled Hub costs a bounded wait, damaged checkpoints are skipped, changed
configs are refused on resume, and bad settings fail before the output folder is touched."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from kiln_testing import DEBUG, REPO, losses, run
from test_finetune_scripts import kiln_checkpoints  # noqa: F401  (the shared tiny checkpoints fixture)

from pretrain.config import ConfigError
from pretrain.trainer import Trainer, find_checkpoints

QUICK = ["--training.eval_steps", 0]


def _signal_self_at(monkeypatch, step: int):
    """Send this process a real SIGTERM once the loop logs `step` (the Trainer's own handler receives it)."""
    original = Trainer._log
    sent = []

    def log_then_signal(self, metrics):
        original(self, metrics)
        if self.state.global_step >= step and not sent:
            sent.append(step)
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(Trainer, "_log", log_then_signal)
    return sent


def _cli(args, *, launcher=(), env_extra=None):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), **(env_extra or {})}
    return subprocess.Popen(
        [*launcher, str(REPO / "pretrain/run.py"), "--config", DEBUG, *map(str, args)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


ACCELERATE = (sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
              "--mixed_precision", "no", "--dynamo_backend", "no")  # fmt: skip


# ----------------------------------------------------------------------------------------------------------
# item 3: save_total_limit


def test_save_total_limit_zero_keeps_every_checkpoint_and_negative_is_refused(tmp_path):
    out = tmp_path / "keep-all"
    run(out, "--training.max_steps", 4, "--training.save_steps", 2, "--training.save_total_limit", 0, *QUICK)
    assert [p.name for p in find_checkpoints(out)] == ["step-00000002", "step-00000004"]
    with pytest.raises(ConfigError, match="save_total_limit"):
        run(tmp_path / "neg", "--training.save_total_limit", -1)
    assert not (tmp_path / "neg").exists()


# ----------------------------------------------------------------------------------------------------------
# item 1: SIGTERM, then resume, finishes


def test_resume_after_sigterm_trains_to_the_end_and_writes_final(tmp_path, monkeypatch):
    out = tmp_path / "sig"
    common = ["--training.max_steps", 6, "--training.save_steps", 0, *QUICK]
    sent = _signal_self_at(monkeypatch, 3)
    stopped = run(out, *common)
    assert sent and stopped.stop_reason == "signal" and not (out / "final").exists()
    assert [p.name for p in find_checkpoints(out)] == [f"step-{stopped.global_step:08d}"]
    monkeypatch.undo()

    resumed = run(out, *common, "--training.resume_from_checkpoint", "latest")
    assert resumed.global_step == 6 and resumed.stop_reason == "max_steps"
    assert (out / "final" / "model.safetensors").is_file()
    # resuming once more (nothing left to train) still ends with a final model, not "stopped by signal"
    again = run(out, *common, "--training.resume_from_checkpoint", "latest")
    assert again.stop_reason != "signal"


def test_classify_resume_after_sigterm_writes_final(tmp_path, monkeypatch, kiln_checkpoints):  # noqa: F811
    from test_finetune_scripts import classify, write_sentiment

    encoder, _ = kiln_checkpoints
    files = write_sentiment(tmp_path, sizes=(64, 16, 8))
    out = tmp_path / "cls"
    args = ["--model.checkpoint", encoder, "--training.output_dir", out, "--logging.logging_steps", 1,
            "--data.train_file", files["train"], "--data.validation_file", files["validation"],
            "--data.test_file", files["test"], "--training.num_train_epochs", 2,
            "--training.per_device_train_batch_size", 16]  # fmt: skip
    _signal_self_at(monkeypatch, 2)
    stopped = classify(*args)
    assert stopped.final_dir is None and stopped.state.stop_reason == "signal"
    monkeypatch.undo()
    result = classify(*args, "--training.resume_from_checkpoint", "latest")
    assert result.state.global_step == 8 and result.final_dir is not None
    assert (out / "final" / "model.safetensors").is_file() and (out / "predictions_test.jsonl").is_file()


# ----------------------------------------------------------------------------------------------------------
# item 2: a Hub that accepts connections and never answers


def test_stalled_hub_costs_a_bounded_wait_then_one_line_error_and_exit_1(tmp_path, hub):
    hub.stall()
    out = tmp_path / "stalled"
    proc = _cli(["--training.output_dir", out, "--training.max_steps", 2, "--training.save_steps", 0, *QUICK,
                 "--hub.push_to_hub", "--hub.model_id", "kiln-test/stalled", "--hub.timeout_s", 1,
                 "--hub.final_push_timeout_s", 3], launcher=(sys.executable,))  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 1, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("error: the final model is saved locally in") and "did not complete" in last, output
    assert "Traceback" not in output
    assert (out / "final" / "model.safetensors").is_file()
    assert hub.requests(), "the run should have reached the stalling Hub"


# ----------------------------------------------------------------------------------------------------------
# item 7: SIGTERM to the `accelerate launch` process


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        return []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux only")
def test_sigterm_to_accelerate_launch_stops_the_training_process_with_a_checkpoint(tmp_path):
    out = tmp_path / "launched"
    proc = _cli(["--training.output_dir", out, "--training.max_steps", 100000, "--training.save_steps", 0, *QUICK],
                launcher=ACCELERATE)  # fmt: skip
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 180
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
        time.sleep(0.2)
    children = _children(proc.pid)
    assert children, "accelerate launch should run the training in a child process"
    proc.send_signal(signal.SIGTERM)  # only the launcher, as `kill PID` or a container runtime does
    child = children[0]
    try:
        deadline = time.time() + 120
        while time.time() < deadline and _state(child) not in ("Z", "gone"):
            time.sleep(0.2)
        assert _state(child) in ("Z", "gone"), "the training process was left running after its launcher died"
    finally:
        if _state(child) not in ("Z", "gone"):
            os.kill(child, signal.SIGKILL)
        output, _ = proc.communicate(timeout=60)
    checkpoints = find_checkpoints(out)
    assert len(checkpoints) == 1, output
    saved = json.loads((checkpoints[0] / "trainer_state.json").read_text())["global_step"]
    assert saved >= 3 and max(losses(out)) == saved


def _state(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"

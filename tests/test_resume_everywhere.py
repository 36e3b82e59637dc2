"""Resume at every step of runs that cross epoch boundaries with accumulation and truncated
evaluations, logging every 2 steps: the resumed run logs bit-identical (windowed) losses and evaluations and ends
with bit-identical weights."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from kiln_testing import DEBUG, DECODER, REPO, run
from safetensors.torch import load_file

from kiln.checkpoint_files import find_checkpoints

ENCODER_SMALL = [
    "--data.max_train_documents",
    2,
    "--training.per_device_train_batch_size",
    32,
]  # 415 examples
DECODER_SMALL = [*DECODER, "--data.max_train_documents", 12, "--training.per_device_train_batch_size", 8]
RUNS = {
    # (extra args, accumulation, optimizer steps): each crosses at least one epoch end
    "encoder-acc5": (ENCODER_SMALL, 5, 6),
    "decoder-acc3": (DECODER_SMALL, 3, 6),
    "encoder-acc1": (ENCODER_SMALL, 1, 14),
    "decoder-acc1": (DECODER_SMALL, 1, 10),
    # the hybrid objective: each row's kind and masks drawn from its example's generator
    "hybrid-acc2": ([*DECODER_SMALL, "--model.objective", "clm+mntp", "--data.causal_share", 0.5], 2, 6),
}


def _rows(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}
    evals = {
        r["step"]: {k: v for k, v in r.items() if k.startswith("eval/")}
        for r in rows
        if any(k.startswith("eval/") for k in r)
    }
    epochs = [r["train/epoch"] for r in rows if "train/epoch" in r]
    return train, evals, epochs


def _common(extra, accumulation, steps):
    # logged every 2 steps: a resume inside a logging window must log the window's mean as the uninterrupted run
    return [
        *extra,
        "--training.gradient_accumulation_steps",
        accumulation,
        "--training.max_steps",
        steps,
        "--training.eval_steps",
        2,
        "--training.max_eval_batches",
        1,
        "--training.save_total_limit",
        100,
        "--logging.logging_steps",
        2,
    ]


@pytest.mark.parametrize("name", list(RUNS))
def test_resume_at_every_step_is_bit_identical(tmp_path, name):
    extra, accumulation, steps = RUNS[name]
    common = _common(extra, accumulation, steps)
    full = tmp_path / "full"
    run(full, *common, "--training.save_steps", 1)
    reference, reference_evals, epochs = _rows(full)
    assert sorted(reference) == list(range(2, steps + 1, 2))
    assert max(epochs) > 1, "the run must cross an epoch boundary"
    reference_weights = load_file(full / "final" / "model.safetensors")
    resume_points = {"encoder-acc1": (6, 13), "decoder-acc1": (4, 8)}.get(name, range(1, steps))
    for step in resume_points:
        out = tmp_path / f"from-{step}"
        checkpoint = full / "checkpoints" / f"step-{step:08d}"
        run(
            out,
            *common,
            "--training.save_steps",
            0,
            "--training.resume_from_checkpoint",
            checkpoint,
            "--tokenizer.name_or_path",
            full / "tokenizer",
        )
        again, again_evals, _ = _rows(out)
        assert again == {s: v for s, v in reference.items() if s > step}, step
        assert again_evals == {s: v for s, v in reference_evals.items() if s > step}, step
        weights = load_file(out / "final" / "model.safetensors")
        assert all((weights[k] == v).all() for k, v in reference_weights.items()), step


def _launch(args, **kwargs):
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            "--num_processes",
            "2",
            "--main_process_port",
            "0",
            str(REPO / "pretrain/run.py"),
            "--config",
            DEBUG,
            *map(str, args),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kwargs,
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", ["encoder-acc5", "decoder-acc3"])
def test_two_processes_resume_across_an_epoch_end_bit_identically(tmp_path, name):
    extra, accumulation, steps = RUNS[name]
    extra = [*extra[:-1], extra[-1] // 2]  # 2 processes x half the batch = the same sequences a micro-step
    common = _common(extra, accumulation, steps)
    full = tmp_path / "full"
    proc = _launch([*common, "--training.output_dir", full, "--training.save_steps", 1])
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-3000:]
    reference, reference_evals, epochs = _rows(full)
    assert max(epochs) > 1
    step = 3  # just after epoch 1's partial window (encoder: 5 + 5 + 2 micro-batches; decoder: 3 + 3 + 2)
    out = tmp_path / f"from-{step}"
    proc = _launch(
        [
            *common,
            "--training.output_dir",
            out,
            "--training.save_steps",
            0,
            "--training.resume_from_checkpoint",
            full / "checkpoints" / f"step-{step:08d}",
            "--tokenizer.name_or_path",
            full / "tokenizer",
        ]
    )
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-3000:]
    again, again_evals, _ = _rows(out)
    assert again == {s: v for s, v in reference.items() if s > step}
    assert again_evals == {s: v for s, v in reference_evals.items() if s > step}
    weights, reference_weights = (
        load_file(out / "final/model.safetensors"),
        load_file(full / "final/model.safetensors"),
    )
    assert all((weights[k] == v).all() for k, v in reference_weights.items())


@pytest.mark.slow
def test_kill_9_then_resume_latest_continues_identically(tmp_path):
    """SIGKILL at a random moment after the first checkpoints (possibly inside a checkpoint write): `latest` picks
    the newest complete checkpoint and the run ends as the uninterrupted one did."""
    extra, accumulation, _ = RUNS["encoder-acc5"]
    steps = 14
    common = [str(a) for a in _common(extra, accumulation, steps)]
    full = tmp_path / "full"
    run(full, *common, "--training.save_steps", 1)
    reference, _, _ = _rows(full)

    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "pretrain/run.py"),
            "--config",
            DEBUG,
            "--training.output_dir",
            str(out),
            *common,
            "--training.save_steps",
            "1",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # killed on a progress marker, not after a wall-clock wait (on a fast machine the run could finish first):
    # at a varying step, and for odd pids inside that step's checkpoint write (its `.tmp` folder exists)
    target, inside_a_write = 3 + os.getpid() % 5, os.getpid() % 2 == 1
    checkpoints = out / "checkpoints"

    def reached() -> bool:
        done = [int(p.name.split("-")[1]) for p in find_checkpoints(out)]
        if inside_a_write:
            writing = [int(p.name.split("-")[1].split(".")[0]) for p in checkpoints.glob("step-*.tmp")]
            return any(step >= target for step in writing) or any(step >= target + 2 for step in done)
        return any(step >= target for step in done)

    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None and not reached():
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert find_checkpoints(out), "no checkpoint was written before the kill"
    newest = int(find_checkpoints(out)[-1].name.split("-")[1])
    assert newest < steps, "the run finished before it was killed; the test did not test anything"
    run(out, *common, "--training.save_steps", 1, "--training.resume_from_checkpoint", "latest")
    again, _, _ = _rows(out)
    for step in [s for s in reference if s > newest]:
        assert again[step] == reference[step], step
    weights, reference_weights = (
        load_file(out / "final/model.safetensors"),
        load_file(full / "final/model.safetensors"),
    )
    assert all((weights[k] == v).all() for k, v in reference_weights.items())

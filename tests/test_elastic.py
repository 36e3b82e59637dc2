"""Elastic resume: a checkpoint written by N processes continues on M processes at the same global batch (the
accumulation count adjusted), on the same steps, data order, masks and dropout, logging the losses of the
uninterrupted run; and an evaluation truncated by max_eval_batches reads the same sequences on any number."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TEST_USER
from kiln_testing import (
    DEBUG,
    REPO,
    cli_in_process,
    free_port,
    launch_two_processes,
    losses,
    one_torch_thread,
    run,
)

from kiln.config import TrainingConfig
from kiln.elastic import BatchLayout, convert_position
from kiln.errors import ConfigError
from kiln.resume import new_layout, read_saved_layout

BOOK = str(REPO / "data/pretrain/the_time_machine.txt")
# Global batch 18 = 3 per device x 2 processes x 3 accumulation steps = 1 x 6 = 3 x 2, on 97 training pairs
# (2 chapters, in memory) or 173 (3 chapters, prepared): primes, so no batch size divides them. 5 (9) steps an epoch,
# 7 (11) examples left out; the old rule (micro-batches of each process, then a partial window) gave 6 (10) steps
# an epoch on 1 and 2 processes and 5 (9) on 3. Dropout at its default (0.1): the resumed run must draw the masks
# the uninterrupted one drew.
EXAMPLES = {"map-style": (2, 97), "prepared": (3, 173)}
COMMON = [
    "--data.data_files",
    BOOK,
    "--training.max_steps",
    -1,
    "--training.num_train_epochs",
    3,
    "--training.per_device_train_batch_size",
    3,
    "--training.eval_steps",
    0,
    "--training.max_eval_batches",
    1,
    "--training.save_total_limit",
    10,
    "--training.save_steps",
    3,
]
ACCUMULATION = {1: 6, 2: 3, 3: 2}
RESUME_AT = 3  # inside the first epoch: the resumed run crosses the ends of the first and second epochs


def launch(output_dir, processes: int, *overrides, caplog=None) -> str:
    """`accelerate launch --multi_gpu --num_processes P pretrain/run.py ...` on CPU (gloo), P > 1; or, for 1,
    the same run in this process (`run`: pretrain/run.py's main, one torch thread as the launches have), what it
    logged read from `caplog`. Returns what it printed."""
    if processes == 1:
        with one_torch_thread(), caplog.at_level(logging.INFO, logger="kiln"):
            caplog.clear()
            run(output_dir, *overrides)
            return caplog.text
    if processes == 2:
        result = launch_two_processes(output_dir, *overrides)
        return result.stdout + result.stderr
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    devices = ["--multi_gpu", "--num_processes", str(processes)]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            *devices,
            "--main_process_port",
            "0",
            str(REPO / "pretrain/run.py"),
            "--config",
            DEBUG,
            "--training.output_dir",
            str(output_dir),
            *map(str, overrides),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def _same_losses(resumed: dict, reference: dict, start: int = RESUME_AT + 1):
    steps = list(range(start, max(reference) + 1))
    assert sorted(resumed) == steps, resumed
    worst = max(abs(resumed[step] - reference[step]) for step in steps)
    # the same math in another reduction order (gradient all-reduce, per-process sums): float32 rounding only
    assert worst < 1e-5, {step: (resumed[step], reference[step]) for step in steps}


def prepared_corpus(folder: Path) -> list[str]:
    """`python -m pretrain.data prepare` on one book (16 chapters); the run arguments that train from it."""
    from pretrain.data.__main__ import prepare_main

    data = ["--data.data_files", BOOK]
    assert prepare_main(["--config", DEBUG, *data, "--output", str(folder)]) == 0
    return [*data, "--data.prepared", str(folder)]


# Each transition once, on one of the two data kinds (an in-memory map-style dataset, a prepared folder: the
# examples reach the run through different readers): map-style 2 -> 1 and 2 -> 3, prepared 1 -> 2. Each kind's
# uninterrupted runs are the ones its transitions start from, and map-style's 1-process run besides, so that its
# uninterrupted runs on 1 and 2 processes are compared whole; prepared's 1 and 2 processes meet in its 1 -> 2.
TRANSITIONS = {"map-style": ((2, 1), (2, 3)), "prepared": ((1, 2),)}
UNINTERRUPTED = {"map-style": (2, 1), "prepared": (1,)}


@pytest.mark.slow
@pytest.mark.parametrize("data", ["map-style", "prepared"])
def test_a_resume_on_another_number_of_processes_continues_the_same_run(tmp_path, data, caplog):
    """A resume inside the first epoch of a 3-epoch run on another number of processes (2 -> 1 and 2 -> 3 on the
    map-style data, 1 -> 2 on the prepared; each transition once, on one kind, rather than all on both): every later
    step logs the uninterrupted run's loss within 1e-5, across two epoch ends, with dropout on, and each run, resumed
    or not, counts the kind's examples and steps an epoch. And the uninterrupted runs on 1 and 2 processes are the
    same run. (The 2- and 3-process runs are launched; the 1-process ones run in this process.)"""
    documents, examples = EXAMPLES[data]
    steps = examples // 18
    common = [
        *COMMON,
        "--data.max_train_documents",
        documents,
        *(prepared_corpus(tmp_path / "prepared") if data == "prepared" else []),
    ]

    def counted(printed: str) -> None:
        assert f"examples = {examples}\n" in printed and f"({steps} optimizer steps each)" in printed, (
            printed[-3000:]
        )

    full = {}
    for processes in UNINTERRUPTED[data]:
        full[processes] = tmp_path / f"full-{processes}"
        printed = launch(
            full[processes],
            processes,
            *common,
            "--training.gradient_accumulation_steps",
            ACCUMULATION[processes],
            caplog=caplog,
        )
        counted(printed)
        assert read_saved_layout(full[processes] / "checkpoints" / f"step-{RESUME_AT:08d}") == BatchLayout(
            processes, 3, ACCUMULATION[processes]
        )
        assert max(losses(full[processes])) == 3 * steps  # epochs 2 and 3 hold as many pairs as the first
    if len(full) == 2:
        _same_losses(losses(full[1]), losses(full[2]), start=1)
    for before, after in TRANSITIONS[data]:
        out = tmp_path / f"{before}-to-{after}"
        checkpoint = full[before] / "checkpoints" / f"step-{RESUME_AT:08d}"
        # the same command on another number of processes: the accumulation that keeps the global batch is set
        printed = launch(
            out,
            after,
            *common,
            "--training.gradient_accumulation_steps",
            ACCUMULATION[before],
            "--training.save_steps",
            0,
            "--training.resume_from_checkpoint",
            checkpoint,
            caplog=caplog,
        )
        counted(printed)
        expected = f"gradient accumulation {ACCUMULATION[before]} -> {ACCUMULATION[after]} keeps the global batch of 18"
        assert expected in printed, printed[-3000:]
        assert f"gradient_accumulation_steps: {ACCUMULATION[after]}" in (out / "config.yaml").read_text()
        _same_losses(losses(out), losses(full[before]))


def test_a_global_batch_the_new_layout_cannot_form_is_refused_in_one_line(tmp_path, capsys):
    """A checkpoint of global batch 18 resumed with a per-device batch of 4: no accumulation count keeps it."""
    checkpoint = _checkpoint(tmp_path / "step-00000003", processes=2, batch=3, accumulation=3)
    status, lines = cli_in_process(
        capsys,
        "--training.output_dir",
        tmp_path / "out",
        "--training.per_device_train_batch_size",
        4,
        "--training.resume_from_checkpoint",
        checkpoint,
    )
    assert status == 2 and len(lines) == 1, lines
    assert "global batch of 18 sequences" in lines[0] and "cannot keep" in lines[0], lines


def _checkpoint(folder: Path, processes: int, batch: int, accumulation: int) -> Path:
    folder.mkdir(parents=True)
    layout = {
        "num_processes": processes,
        "per_device_train_batch_size": batch,
        "gradient_accumulation_steps": accumulation,
    }
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 3, "epoch": 0, **layout}))
    return folder


def test_a_global_batch_no_layout_keeps_is_one_line(tmp_path):
    checkpoint = _checkpoint(tmp_path / "step-00000003", processes=2, batch=4, accumulation=3)  # 24 sequences
    saved = read_saved_layout(checkpoint)
    assert saved == BatchLayout(2, 4, 3)
    training = TrainingConfig(per_device_train_batch_size=4, gradient_accumulation_steps=3)
    with pytest.raises(ConfigError) as err:
        new_layout(saved, training, 5, checkpoint)
    message = str(err.value)
    assert "\n" not in message and "global batch of 24 sequences" in message and "1, 2, 3, 6" in message
    layout, message = new_layout(saved, training, 3, checkpoint)
    assert layout == BatchLayout(3, 4, 2) and "gradient accumulation 3 -> 2" in message
    # the plan holds the new layout; the user's config keeps its own
    assert training.gradient_accumulation_steps == 3
    # the per-device batch a total_train_batch_size would derive is the saved one
    training = TrainingConfig(
        total_train_batch_size=24, per_device_train_batch_size=6, gradient_accumulation_steps=3
    )
    assert new_layout(saved, training, 1, checkpoint)[0] == BatchLayout(1, 4, 6)
    # on as many processes: the layout the config names, the per-device batch its total gives (24 / (2 x 3))
    assert new_layout(saved, training, 2, checkpoint) == (BatchLayout(2, 4, 3), None)


def test_data_position_converts_to_the_same_examples():
    two, one = BatchLayout(2, 4, 1), BatchLayout(1, 4, 2)
    assert convert_position(6, two, one) == 12 and convert_position(12, one, two) == 6
    assert convert_position(5, one, two) == 3  # after an epoch's partial last window: still the epoch's end
    assert convert_position(7, None, one) == 7


def _eval_rows(output_dir) -> list[dict]:
    rows = [json.loads(line) for line in (Path(output_dir) / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if "eval/loss" in row]


@pytest.mark.slow
def test_a_hub_resume_reaches_every_node_and_a_truncated_evaluation_reads_the_same_examples_anywhere(
    hub, tmp_path
):
    """A checkpoint of 2 processes, pushed to the (loopback) Hub mid-run and resumed with `hub:`: on 1 process the
    accumulation keeps its global batch, and on two nodes with node-local disks every node downloads it (node 1
    does not see node 0's disk); both continue the uninterrupted run, dropout on.

    And max_eval_batches counts batches of the whole evaluation, not of each process: the last checkpoint of the
    same 2-process run, evaluated again on 1 process (resumed at its last step, so its weights are those of the
    checkpoint), gives the same numbers."""
    from test_multi_node import _can_unshare, two_nodes

    from kiln.hub import CHECKPOINT_FOLDER, HubPusher

    args = [
        "--data.max_train_documents",
        2,
        "--training.max_steps",
        4,
        "--training.eval_steps",
        0,
        "--training.per_device_train_batch_size",
        4,
        "--training.per_device_eval_batch_size",
        4,
        "--training.max_eval_batches",
        2,
    ]
    full = tmp_path / "full"
    launch_two_processes(full, *args, "--training.save_steps", 2)

    # the truncated evaluation of the last checkpoint (step 4) again on 1 process
    evaluated = tmp_path / "evaluated-on-one"
    run(evaluated, *args, "--training.resume_from_checkpoint", full / "checkpoints" / "step-00000004")
    (evaluated_on_two,), (evaluated_on_one,) = _eval_rows(full), _eval_rows(evaluated)
    assert evaluated_on_two["step"] == evaluated_on_one["step"] == 4
    for key in ("eval/loss", "eval/mlm_loss", "eval/mlm_accuracy", "eval/nsp_accuracy"):
        assert abs(evaluated_on_two[key] - evaluated_on_one[key]) < 1e-6, (
            key,
            evaluated_on_two,
            evaluated_on_one,
        )

    pusher = HubPusher(f"{TEST_USER}/elastic")
    pusher.push(full / "checkpoints/step-00000002", path_in_repo=CHECKPOINT_FOLDER, commit_message="state")
    assert pusher.wait()
    resume = ["--training.save_steps", 0, "--training.resume_from_checkpoint", f"hub:{TEST_USER}/elastic"]

    one = tmp_path / "one"
    state = run(one, *args, *resume)
    assert state.global_step == 4 and "gradient_accumulation_steps: 2" in (one / "config.yaml").read_text()
    assert sorted(losses(one)) == [3, 4]
    assert all(abs(losses(one)[step] - losses(full)[step]) < 1e-5 for step in (3, 4)), (
        losses(one),
        losses(full),
    )

    reason = _can_unshare()
    if reason:
        pytest.skip(reason)
    nodes = tmp_path / "nodes"
    two_nodes(nodes, free_port(), True, *args, *resume)  # both nodes end with status 0
    assert (tmp_path / "nodes-node1-disk" / "hub-checkpoint").is_dir()  # node 1 downloaded it to its own disk
    assert all(abs(losses(nodes)[step] - losses(full)[step]) < 1e-5 for step in (3, 4)), (
        losses(nodes),
        losses(full),
    )

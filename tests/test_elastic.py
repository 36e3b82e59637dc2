"""Elastic resume: a checkpoint written by N processes continues on M processes at the same global batch (the
accumulation count adjusted), on the same data order and masks, logging the losses of the uninterrupted run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kiln_testing import DEBUG, REPO, launch_two_processes, losses, run

from kiln.config import TrainingConfig
from kiln.elastic import BatchLayout, adapt_to_world_size, convert_position, saved_layout
from kiln.errors import ConfigError

# dropout off: which process draws a sequence's dropout mask changes with the number of processes
COMMON = ["--data.max_train_documents", 2, "--training.max_steps", 6, "--training.eval_steps", 0,
          "--training.per_device_train_batch_size", 4, "--model.hidden_dropout_prob", 0,
          "--model.attention_probs_dropout_prob", 0, "--training.save_total_limit", 10]  # fmt: skip
RESUME_AT = 3


def _close(resumed: dict, reference: dict):
    steps = list(range(RESUME_AT + 1, 7))
    assert sorted(resumed) == steps, resumed
    for step in steps:  # the same math in another reduction order (gradient all-reduce, per-process sums)
        assert abs(resumed[step] - reference[step]) < 1e-4, (step, resumed[step], reference[step])


def prepared_corpus(folder: Path) -> list[str]:
    """`python -m pretrain.data prepare` on one book (16 chapters); the run arguments that train from it."""
    from pretrain.data.__main__ import prepare_main

    data = ["--data.data_files", str(REPO / "data/pretrain/the_time_machine.txt")]
    assert prepare_main(["--config", DEBUG, *data, "--output", str(folder)]) == 0
    return [*data, "--data.prepared", str(folder)]


@pytest.mark.parametrize("data", ["map-style", "prepared"])
def test_two_processes_resume_on_one(tmp_path, data):
    common = [*COMMON, *(prepared_corpus(tmp_path / "prepared") if data == "prepared" else [])]
    full = tmp_path / "two"
    launch_two_processes(full, *common, "--training.save_steps", 1)
    checkpoint = full / "checkpoints" / f"step-{RESUME_AT:08d}"
    assert saved_layout(checkpoint) == BatchLayout(2, 4, 1)
    out = tmp_path / "one"
    # same command, one process: accumulation 1 -> 2 keeps the global batch of 8
    state = run(out, *common, "--training.save_steps", 0, "--training.resume_from_checkpoint", checkpoint)
    assert state.global_step == 6
    config = (out / "config.yaml").read_text()
    assert "gradient_accumulation_steps: 2" in config
    _close(losses(out), losses(full))


def test_one_process_resumes_on_two(tmp_path):
    full = tmp_path / "one"
    run(full, *COMMON, "--training.gradient_accumulation_steps", 2, "--training.save_steps", 1)
    assert saved_layout(full / "checkpoints" / f"step-{RESUME_AT:08d}") == BatchLayout(1, 4, 2)
    out = tmp_path / "two"
    result = launch_two_processes(
        out, *COMMON, "--training.gradient_accumulation_steps", 2, "--training.save_steps", 0,
        "--training.resume_from_checkpoint", full / "checkpoints" / f"step-{RESUME_AT:08d}",
    )  # fmt: skip
    assert "gradient accumulation 2 -> 1 keeps the global batch of 8" in result.stdout + result.stderr
    _close(losses(out), losses(full))


def _checkpoint(folder: Path, processes: int, batch: int, accumulation: int) -> Path:
    folder.mkdir(parents=True)
    layout = {"num_processes": processes, "per_device_train_batch_size": batch,
              "gradient_accumulation_steps": accumulation}  # fmt: skip
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 3, **layout}))
    return folder


def test_a_global_batch_no_layout_keeps_is_one_line(tmp_path):
    checkpoint = _checkpoint(tmp_path / "step-00000003", processes=2, batch=4, accumulation=3)  # 24 sequences
    training = TrainingConfig(per_device_train_batch_size=4, gradient_accumulation_steps=3)
    with pytest.raises(ConfigError) as err:
        adapt_to_world_size(training, 5, checkpoint)
    message = str(err.value)
    assert "\n" not in message and "global batch of 24 sequences" in message and "1, 2, 3, 6" in message
    assert adapt_to_world_size(training, 3, checkpoint) is not None and training.gradient_accumulation_steps == 2
    # the per-device batch a total_train_batch_size would derive is the saved one
    training = TrainingConfig(total_train_batch_size=24, per_device_train_batch_size=6, gradient_accumulation_steps=3)
    adapt_to_world_size(training, 1, checkpoint)
    assert (training.per_device_train_batch_size, training.gradient_accumulation_steps) == (4, 6)


def test_data_position_converts_to_the_same_examples():
    two, one = BatchLayout(2, 4, 1), BatchLayout(1, 4, 2)
    assert convert_position(6, two, one) == 12 and convert_position(12, one, two) == 6
    assert convert_position(5, one, two) == 3  # after an epoch's partial last window: still the epoch's end
    assert convert_position(7, None, one) == 7


def _eval_rows(output_dir) -> list[dict]:
    rows = [json.loads(line) for line in (Path(output_dir) / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if "eval/loss" in row]


def test_a_truncated_evaluation_reads_the_same_examples_on_any_number_of_processes(tmp_path):
    """max_eval_batches counts batches of the whole evaluation, not of each process: the checkpoint of a
    2-process run, evaluated again on 1 process (resumed at its last step, so its weights are those of the
    checkpoint), gives the same numbers."""
    args = ["--data.max_train_documents", 2, "--training.eval_steps", 0, "--training.max_steps", 2, "--training.save_steps", 2,
            "--training.per_device_train_batch_size", 4, "--training.per_device_eval_batch_size", 4,
            "--training.max_eval_batches", 2]  # fmt: skip
    two = tmp_path / "two"
    launch_two_processes(two, *args)
    one = tmp_path / "one"
    run(one, *args, "--training.resume_from_checkpoint", two / "checkpoints" / "step-00000002")
    (evaluated_on_two,), (evaluated_on_one,) = _eval_rows(two), _eval_rows(one)
    assert evaluated_on_two["step"] == evaluated_on_one["step"] == 2
    for key in ("eval/loss", "eval/mlm_loss", "eval/mlm_accuracy", "eval/nsp_accuracy"):
        assert abs(evaluated_on_two[key] - evaluated_on_one[key]) < 1e-6, (key, evaluated_on_two, evaluated_on_one)

"""Task-adaptive pretraining as a pipeline step (`finetune/adapt.py`), through `accelerate launch` in fresh processes
(the task script that fine-tunes the adapted encoder runs through its command line in this process: its own launches
are proved elsewhere).

A pretrained encoder is adapted on a classification task's training text on 2 processes; the task's validation and
test files are never opened (they do not exist) and its labels never read (they are nonsense); the run resumes
exactly from its checkpoint; final/'s card names the start checkpoint and the task text; the task script
fine-tunes the adapted encoder, and its card names it. The tagging and seq2seq readers give their text too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"}


def _launch(*argv, processes: int = 1) -> subprocess.CompletedProcess:
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(processes)]
    launch += ["--multi_gpu"] if processes > 1 else ["--cpu"]
    done = subprocess.run(
        [*launch, *map(str, argv)], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _rows(folder: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


@pytest.fixture
def task_config(tmp_path):
    """A classification task whose training file is a few movie-review-like sentences with nonsense labels, and
    whose validation and test files do not exist."""
    sentences = [
        "a gripping , funny and humane film",
        "the plot is thin and the acting wooden",
        "an unforgettable performance by the lead",
        "dull , overlong and predictable",
        "a small triumph of tone and timing",
        "the jokes fall flat every time",
    ]
    rows = ["sentence,label"] + [
        f'"{s} {i}",label-{i % 5}' for i in range(48) for s in sentences[i % 6 : i % 6 + 1]
    ]
    (tmp_path / "reviews.csv").write_text("\n".join(rows) + "\n")
    config = tmp_path / "task.yaml"
    config.write_text(
        f"data:\n  train_file: {tmp_path / 'reviews.csv'}\n  validation_file: {tmp_path / 'missing-dev.csv'}\n"
        f"  test_file: {tmp_path / 'missing-test.csv'}\n  text_columns: [sentence]\n"
    )
    return config


@pytest.mark.slow
def test_adapt_on_the_task_text_resumes_exactly_and_feeds_the_task_script(
    kiln_checkpoints, task_config, tmp_path, capsys
):
    """adapt.py on 2 processes trains on the task's training text only (its labels unused, its other splits never
    opened), writes a card naming its start and its text, resumes from its step-3 checkpoint logging the same
    losses, and classify.py fine-tunes the adapted encoder, its card naming it."""
    from test_trust import run_in_process

    encoder, _ = kiln_checkpoints
    out = tmp_path / "adapted"
    common = [
        "finetune/adapt.py",
        "--task",
        "classify",
        "--task_config",
        task_config,
        "--model.init_from",
        encoder,
        "--training.output_dir",
        out,
        "--training.max_steps",
        6,
        "--training.save_steps",
        3,
        "--training.per_device_train_batch_size",
        4,
        "--training.eval_steps",
        0,
        "--logging.logging_steps",
        2,
        "--data.max_seq_length",
        32,
    ]
    _launch(*common, processes=2)
    first = _rows(out)
    assert sorted(first) == [2, 4, 6] and all(v == v for v in first.values())
    card = (out / "final" / "README.md").read_text()
    assert "| initialised from | enc/final |" in card, card
    assert (
        "| task-adaptive pretraining | classify training split of reviews.csv (48 examples, labels unused) |"
        in card
    )
    assert str(tmp_path) not in card
    saved = (out / "config.yaml").read_text()
    assert "objective: mlm\n" in saved and "document_separator: line" in saved

    # resumed from its step-3 checkpoint on 2 processes, it trains steps 4-6 again and logs the same losses (step
    # 4's line is the mean over steps 3 and 4: the logging window's sums are in the checkpoint)
    _launch(*common, "--training.resume_from_checkpoint", out / "checkpoints" / "step-00000003", processes=2)
    again = _rows(out)
    for step in (4, 6):
        assert again[step] == pytest.approx(first[step], abs=1e-6), (step, first, again)

    # the task script fine-tunes the adapted encoder, and its card names it
    tuned = tmp_path / "tuned"
    code, output = run_in_process(
        capsys,
        "finetune/classify.py",
        "--model.checkpoint",
        out / "final",
        "--training.output_dir",
        tuned,
        "--training.max_steps",
        2,
        "--data.max_train_samples",
        16,
        "--data.max_eval_samples",
        8,
        "--data.max_predict_samples",
        4,
        "--training.per_device_train_batch_size",
        8,
    )
    assert code == 0, output[-3000:]
    assert "| initialisation | pretrained (" in (tuned / "final" / "README.md").read_text()


def test_the_data_options_of_pretraining_are_refused_and_every_reader_gives_text(kiln_checkpoints, tmp_path):
    from finetune.adapt import example_text, main, task_training_text
    from kiln.errors import ConfigError

    encoder, _ = kiln_checkpoints
    with pytest.raises(ConfigError, match="--data.data_files is not for finetune/adapt.py"):
        main(["--task", "classify", "--model.init_from", str(encoder), "--data.data_files", "x.txt"])
    with pytest.raises(ConfigError, match="--task is required"):
        main(["--model.init_from", str(encoder)])
    # the shipped samples of the tagging and seq2seq scripts: words joined, the source side
    tags, names = task_training_text("tag", [], str(encoder))
    assert len(tags) > 100 and sum(" " in t for t in tags[:20]) >= 15 and names
    pairs, _ = task_training_text("seq2seq", [], str(encoder))
    assert len(pairs) > 10 and all(p.strip() for p in pairs)
    assert example_text({"text": "a b", "text_pair": "c", "label": 1}) == "a b c"
    assert example_text({"tokens": ["EU", "rejects"], "tags": ["B-ORG", "O"]}) == "EU rejects"

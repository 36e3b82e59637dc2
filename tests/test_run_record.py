"""Overwrite deletes by record: a run folder's `.kiln-run.json` records each file Kiln wrote there (name, size,
sha256), and `--training.overwrite_output_dir` removes only files on that record that still match it. A run folder
copied to another disk keeps its record (it resumes, and overwrites only what Kiln wrote); a user's file added to
it, a changed file or a planted marker is never removed; a run's own input inside the folder is refused before
anything is touched; a resume of a finished run replaces its final evaluation's row. Each case runs the real
command: the runs and one refusal of each kind in a fresh process, the others through the same command line in this
process (tests/test_run_folder.py's `refused_in_process`)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from kiln_testing import DEBUG, REPO
from test_run_folder import (
    OVERWRITE,
    QUICK,
    _command,
    _refused,
    _snapshot,
    finetune_cli,
    pretrain,
    pretrain_refused_in_process,
    refused_in_process,
)

from kiln import run_folder

TENSORBOARD = ["--logging.report_to", "tensorboard"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished tiny run (checkpoint, final/, tokenizer/, TensorBoard logs), made once; tests use copies."""
    out = tmp_path_factory.mktemp("record") / "run"
    # a relative folder, as users name it (the checkpoints went unrecorded when the folder was named relative)
    done = pretrain("--training.output_dir", os.path.relpath(out, REPO), *QUICK, *TENSORBOARD)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _copy(run: Path, where: Path) -> Path:
    """The run folder copied as `cp -a` copies it onto another disk: new inodes, the same bytes and times."""
    shutil.copytree(run, where, symlinks=True)
    return where


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_the_record_lists_every_file_the_run_wrote(finished_run):
    files = run_folder.read_record(finished_run)
    written = sorted(
        p.relative_to(finished_run).as_posix()
        for p in finished_run.rglob("*")
        if p.is_file() and p.name not in (run_folder.MARKER, run_folder.LOCK_FILE)
    )
    assert any(name.startswith("logs/") for name in written) and "final/model.safetensors" in written
    assert sorted(files) == written
    removed, kept = run_folder.overwrite_plan(finished_run)
    assert removed == written and kept == []


@pytest.mark.slow
def test_a_copied_run_keeps_a_users_files_resumes_and_then_overwrites_only_kilns(
    finished_run, tmp_path, capsys
):
    copy = _copy(finished_run, tmp_path / "other-disk" / "run")
    assert os.stat(copy).st_ino != os.stat(finished_run).st_ino
    (copy / "final" / "my_notes.txt").write_text("my notes\n")
    (copy / "logs" / "my.log").write_text("my log\n")
    (copy / "notes.txt").write_text("beside the run\n")
    before = _snapshot(copy)
    line = _refused(pretrain("--training.output_dir", copy, *QUICK, *TENSORBOARD, OVERWRITE))
    assert line == (
        f"error: output_dir {copy} holds files Kiln did not write there or that changed since (final/my_notes.txt, "
        "logs/my.log); move them out of the folder, or pick another --training.output_dir: "
        "--training.overwrite_output_dir removes only the files on the run's record, unchanged, and the new run "
        "would write where these are"
    )
    assert _snapshot(copy) == before

    # a resume would export final/ again: refused while a user's file is in it; then the copy resumes (at its
    # last step: only the final evaluation again, whose row replaces the old one)
    resume = ["--training.resume_from_checkpoint", "latest"]
    line = pretrain_refused_in_process(capsys, "--training.output_dir", copy, *QUICK, *TENSORBOARD, *resume)
    assert line == (
        f"error: output_dir {copy} holds files Kiln did not write in folders a resumed run replaces "
        "(final/my_notes.txt); move them out of the folder, or resume into another --training.output_dir"
    )
    assert _snapshot(copy) == before
    (copy / "final" / "my_notes.txt").unlink()
    rows = _rows(copy)
    assert [r["step"] for r in rows if any(k.startswith("eval/") for k in r)] == [2]
    done = pretrain("--training.output_dir", copy, *QUICK, *TENSORBOARD, *resume)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _rows(copy) == rows
    assert (copy / "logs" / "my.log").read_text() == "my log\n"

    # a file Kiln wrote, changed since, is not Kiln's to remove either
    (copy / "config.yaml").write_text((copy / "config.yaml").read_text() + "# my change\n")
    (copy / "logs" / "my.log").unlink()
    line = pretrain_refused_in_process(capsys, "--training.output_dir", copy, *QUICK, *TENSORBOARD, OVERWRITE)
    assert "holds files Kiln did not write there or that changed since (config.yaml)" in line

    # with those moved out, overwrite removes every file of the old run and nothing else
    (copy / "config.yaml").unlink()
    done = pretrain("--training.output_dir", copy, *QUICK, "--training.max_steps", 1, OVERWRITE)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (copy / "notes.txt").read_text() == "beside the run\n"
    assert not (copy / "logs").exists()  # this run writes no logs: the old run's went, with their folders
    assert max(r["step"] for r in _rows(copy)) == 1
    assert not any(name.startswith("checkpoints/step-00000002") for name in run_folder.read_record(copy))


def test_every_checkpoint_file_is_on_the_record_and_a_users_file_among_them_does_not_stop_a_resume(
    finished_run, tmp_path
):
    copy = _copy(finished_run, tmp_path / "run")
    recorded = run_folder.read_record(copy)
    checkpoint = copy / "checkpoints" / "step-00000002"
    assert sorted(f"checkpoints/step-00000002/{p.name}" for p in checkpoint.iterdir()) == sorted(
        name for name in recorded if name.startswith("checkpoints/")
    )
    (checkpoint / "my_eval.txt").write_text("mine\n")  # kept when the checkpoint is rotated out (below)
    assert run_folder.refusal(copy, resume=True, overwrite=False) is None


def _checkpoint_like(out: Path, step: int) -> Path:
    folder = out / "checkpoints" / f"step-{step:08d}"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"w" * (step + 3))
    (folder / "sub" / "state.json").write_text("{}")
    return folder


def test_a_rotated_or_replaced_checkpoint_loses_only_the_files_kiln_wrote(tmp_path):
    """`remove_recorded`, what rotation and a checkpoint saved again use: files on the record and unchanged go
    (and off the record), a user's file and a changed one stay with their folder; a link is never followed."""
    out = tmp_path / "run"
    out.mkdir()
    run_folder.start_record(out)
    whole, mixed = _checkpoint_like(out, 1), _checkpoint_like(out, 2)
    run_folder.record_files(out, "checkpoints/step-00000001", "checkpoints/step-00000002")
    outside = tmp_path / "outside.txt"
    outside.write_text("not in the run\n")
    (mixed / "notes.txt").write_text("mine\n")
    (mixed / "model.safetensors").write_bytes(b"changed")
    (mixed / "linked").symlink_to(outside)
    assert run_folder.remove_recorded(out, "checkpoints/step-00000001") == []
    assert not whole.exists() and (out / "checkpoints").is_dir()
    kept = run_folder.remove_recorded(out, "checkpoints/step-00000002")
    assert kept == [
        "checkpoints/step-00000002/linked",
        "checkpoints/step-00000002/model.safetensors",
        "checkpoints/step-00000002/notes.txt",
    ]
    assert not (mixed / "sub").exists() and (mixed / "notes.txt").is_file() and outside.is_file()
    record = run_folder.read_record(out)
    assert not any(
        name.startswith(("checkpoints/step-00000001", "checkpoints/step-00000002/sub")) for name in record
    )
    assert (
        "checkpoints/step-00000002/model.safetensors" in record
    )  # still Kiln's name, but changed: not removed
    assert run_folder.set_aside_checkpoint(out, "checkpoints/step-00000002") == (
        "checkpoints/step-00000002.kept",
        kept,
    )
    assert not mixed.exists() and (out / "checkpoints/step-00000002.kept/notes.txt").read_text() == "mine\n"
    assert not any(name.startswith("checkpoints/step-00000002") for name in run_folder.read_record(out))
    _checkpoint_like(out, 2)
    (mixed / "mine.txt").write_text("mine too\n")  # on no record: set aside beside the first
    assert (
        run_folder.set_aside_checkpoint(out, "checkpoints/step-00000002")[0]
        == "checkpoints/step-00000002.kept-2"
    )


def test_a_checkpoint_of_a_run_without_a_record_is_rotated_by_its_own_checksums(tmp_path):
    from kiln.checkpoint_files import write_checksums

    out = tmp_path / "older-run"
    folder = _checkpoint_like(out, 1)
    write_checksums(folder)
    (folder / "sub" / "mine.txt").write_text("mine\n")
    assert run_folder.remove_recorded(out, "checkpoints/step-00000001") == [
        "checkpoints/step-00000001/sub/mine.txt"
    ]
    assert sorted(p.name for p in folder.rglob("*")) == ["mine.txt", "sub"]
    planted = _checkpoint_like(out, 2)  # a manifest naming a file by another hash proves nothing about it
    write_checksums(planted)
    (planted / "model.safetensors").write_bytes(b"my own weights")
    assert run_folder.remove_recorded(out, "checkpoints/step-00000002") == [
        "checkpoints/step-00000002/model.safetensors"
    ]


def test_a_planted_marker_never_makes_a_users_files_removable(tmp_path, capsys):
    """The audit's case: a marker naming the folder's inode (as every fresh tmpfs numbers its first folder), and
    a record with a header and no files: neither proves anything, the user's files stay."""
    for kind in ("inode-marker", "empty-record"):
        mine = tmp_path / kind
        (mine / "final").mkdir(parents=True)
        (mine / "final" / "thesis.tex").write_text("\\chapter{One}\n")
        (mine / "logs").mkdir()
        (mine / "logs" / "my.log").write_text("mine\n")
        (mine / "best").mkdir()
        (mine / "best" / "model.safetensors").write_bytes(b"my weights")
        if kind == "inode-marker":
            planted = {
                "format": 1,
                "written_by": "kiln",
                "folder": str(mine.resolve()),
                "inode": os.stat(mine).st_ino,
            }
            (mine / ".kiln-run.json").write_text(json.dumps(planted))
        else:
            (mine / ".kiln-run.json").write_text(json.dumps({"format": 2, "written_by": "kiln"}) + "\n")
        before = _snapshot(mine)
        args = ["--training.output_dir", mine, *QUICK, OVERWRITE]
        if (
            kind == "inode-marker"
        ):  # a fresh process, as users run it; the other case through the same line here
            line = _refused(pretrain(*args))
        else:
            line = pretrain_refused_in_process(capsys, *args)
        if kind == "inode-marker":
            assert line.startswith(
                f"error: output_dir {mine} holds a run of an earlier Kiln version, which kept no "
                "record of the files it wrote (best/, final/, logs/); pick another"
            )
        else:
            assert "(best/model.safetensors, final/thesis.tex, logs/my.log); move them out" in line
        assert _snapshot(mine) == before


def test_a_record_naming_a_link_or_a_path_outside_removes_nothing_outside(tmp_path):
    """A hostile record: entries for '../x', an absolute path and a file reached through a linked folder, with
    their true sizes and hashes; overwrite looks only at the folder's own files under a run's names."""
    import hashlib

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x").write_text("precious\n")
    digest = hashlib.sha256(b"precious\n").hexdigest()
    out = tmp_path / "run"
    out.mkdir()
    (out / "final").symlink_to(outside, target_is_directory=True)
    lines = [{"format": 2, "written_by": "kiln"}] + [
        {"file": name, "size": 9, "sha256": digest}
        for name in ("../outside/x", str(outside / "x"), "final/x")
    ]
    (out / ".kiln-run.json").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert run_folder.overwrite_plan(out) == ([], ["final"])  # the link is not on the record as a link
    assert run_folder.refusal(out, resume=False, overwrite=True).startswith(
        f"output_dir {out} holds files Kiln did not write there or that changed since (final);"
    )
    assert (outside / "x").read_text() == "precious\n"


def test_an_input_of_the_run_inside_the_folder_to_overwrite_is_refused_first(
    finished_run, tmp_path, task_config, capsys
):
    """`adapt.py --model.init_from runs/x/final --training.output_dir runs/x --training.overwrite_output_dir`
    deleted final/ before reading it; pretraining and fine-tuning alike now refuse before anything is touched
    (adapt.py, the reported case, in a fresh process; the others through the same command lines here)."""
    from pretrain.run import cli

    out = _copy(finished_run, tmp_path / "run")
    corpus = out / "corpus.txt"
    corpus.write_text(next((REPO / "data/pretrain").glob("*.txt")).read_text())
    before = _snapshot(out)
    fix = "which --training.overwrite_output_dir would remove before reading it; pick another --training.output_dir"
    cases = {
        "finetune/adapt.py": [
            "--task",
            "classify",
            "--task_config",
            task_config,
            "--model.init_from",
            out / "final",
        ],
        "finetune/classify.py": ["--model.checkpoint", out / "final"],
        "pretrain/run.py": ["--config", DEBUG, "--data.data_files", str(out / "*.txt"), *QUICK],
    }
    in_process = {"finetune/classify.py": finetune_cli("classify"), "pretrain/run.py": cli}
    for script, args in cases.items():
        args = [*args, "--training.output_dir", out, OVERWRITE]
        if script in in_process:
            line = refused_in_process(capsys, in_process[script], *args)
        else:
            line = _refused(_command(script, *args))
        assert line.startswith(f"error: output_dir {out} holds this run's own input (--"), (script, line)
        assert fix in line, line
        assert _snapshot(out) == before, script
    line = pretrain_refused_in_process(
        capsys, "--model.init_from", out / "final", "--training.output_dir", out, *QUICK, OVERWRITE
    )
    assert f"own input (--model.init_from {out / 'final'}" in line
    assert _snapshot(out) == before


@pytest.fixture
def task_config(tmp_path):
    (tmp_path / "reviews.csv").write_text(
        "sentence,label\n" + "".join(f'"a fine film {i}",pos\n' for i in range(16))
    )
    config = tmp_path / "task.yaml"
    config.write_text(f"data:\n  train_file: {tmp_path / 'reviews.csv'}\n  text_columns: [sentence]\n")
    return config


def test_classify_resumed_inside_a_logging_window_logs_the_same_loss(kiln_checkpoints, tmp_path):
    """Logging every 2 steps, resumed from step 3: step 4's line is the mean over steps 3 and 4, as uninterrupted.
    Both runs in this process (fine-tuning runs in fresh processes in tests/test_trust.py and test_checkpoint_trust.py)."""
    from kiln_testing import one_torch_thread, run_main
    from test_finetune_scripts import write_sentiment

    from finetune.classify import main as classify

    encoder, _ = kiln_checkpoints
    files = write_sentiment(tmp_path, sizes=(64, 8, 8))
    common = [
        "--model.checkpoint",
        encoder,
        "--data.train_file",
        files["train"],
        "--data.validation_file",
        files["validation"],
        "--data.test_file",
        files["test"],
        "--training.max_steps",
        4,
        "--training.save_steps",
        3,
        "--training.per_device_train_batch_size",
        8,
        "--logging.logging_steps",
        2,
        "--training.save_total_limit",
        5,
    ]
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    with one_torch_thread():
        run_main(classify, *common, "--training.output_dir", full)
        run_main(
            classify,
            *common,
            "--training.output_dir",
            resumed,
            "--training.resume_from_checkpoint",
            full / "checkpoints" / "step-00000003",
        )
    losses = [
        {r["step"]: r["train/loss"] for r in _rows(out) if "train/loss" in r} for out in (full, resumed)
    ]
    assert sorted(losses[0]) == [2, 4] and losses[1] == {4: losses[0][4]}
    # every file fine-tuning wrote (best/, final/, results, predictions) is on the record, and nothing else is
    for out in (full, resumed):
        removed, kept = run_folder.overwrite_plan(out)
        assert kept == [] and "predictions_test.jsonl" in removed and "eval_results.json" in removed, (
            removed,
            kept,
        )


def test_a_tampered_logging_window_in_a_checkpoint_is_one_line(finished_run, tmp_path, capsys):
    """The logging window's fields are checked on load like the loop state's others: a bad one is refused."""
    from kiln.checkpoint_files import write_checksums

    out = _copy(finished_run, tmp_path / "run")
    checkpoint = out / "checkpoints" / "step-00000002"
    loop = json.loads((checkpoint / "loop_state.json").read_text())
    assert loop["log_window"]["steps"] == 0 and loop["log_window"]["sums"] == {}  # logged every step here
    loop["log_window"] = {
        "steps": 10**18,
        "tokens": 0,
        "seconds": 0.0,
        "sums": {"loss": [1.0]},
        "dtypes": {"loss": "float32"},
    }
    (checkpoint / "loop_state.json").write_text(json.dumps(loop))
    write_checksums(checkpoint)
    line = pretrain_refused_in_process(
        capsys, "--training.output_dir", out, *QUICK, "--training.resume_from_checkpoint", checkpoint
    )
    assert line.startswith(
        f"error: checkpoint {checkpoint} is damaged: loop_state.json: log_window holds "
        f"{10**18} steps, more than the checkpoint's 2"
    )

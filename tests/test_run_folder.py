"""Kiln removes only what it wrote: a run starts only in a new or empty folder or one Kiln made (its marker,
`.kiln-run.json`, names that very folder); any other folder is refused in one line naming what is there, with
or without --training.overwrite_output_dir, and left exactly as it was. Each case runs the real command
(`pretrain/run.py`, `finetune/classify.py`) in a fresh process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kiln_testing import DEBUG, REPO

OVERWRITE = "--training.overwrite_output_dir"
QUICK = ["--training.max_steps", 2, "--training.save_steps", 2, "--training.eval_steps", 0]


def _command(script: str, *args, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, str(REPO / script), *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def pretrain(*args) -> subprocess.CompletedProcess:
    return _command("pretrain/run.py", "--config", DEBUG, *args)


def _snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry under `folder` (links not followed) with its bytes, its link target, or "dir"."""
    seen = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        if path.is_symlink():
            seen[key] = "-> " + os.readlink(path)
        elif path.is_dir():
            seen[key] = "dir"
        else:
            seen[key] = path.read_bytes()
    return seen


def _user_folder(folder: Path) -> Path:
    """A user's folder whose names are those of a run's files (and one that is not)."""
    (folder / "logs").mkdir(parents=True)
    (folder / "logs" / "2024-01-01.log").write_text("my log\n")
    (folder / "tokenizer").mkdir()
    (folder / "tokenizer" / "vocab.txt").write_text("[PAD]\nmine\n")
    (folder / "config.yaml").write_text("mine: true\n")
    (folder / "metrics.jsonl").write_text('{"mine": 1}\n')
    (folder / "notes.txt").write_text("notes\n")
    return folder


def _refused(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stderr.strip().splitlines()[-1]


def _foreign(out: Path, listing: str, *, checkpoints: bool = False, why: str = "files Kiln did not write") -> str:
    fixes = "pick another --training.output_dir, or empty this one yourself"
    if checkpoints:
        fixes = f"continue that run with --training.resume_from_checkpoint latest, {fixes}"
    return (f"error: output_dir {out} holds {why} ({listing}); {fixes}: Kiln writes a run only into a new or "
            "empty folder or one it made, and removes only files it wrote there")  # fmt: skip


@pytest.mark.parametrize("flags", [[], [OVERWRITE]], ids=["plain", "overwrite"])
def test_a_users_folder_is_refused_naming_what_is_there_and_left_as_it_was(tmp_path, flags):
    out = _user_folder(tmp_path / "mine")
    before = _snapshot(out)
    line = _refused(pretrain("--training.output_dir", out, *QUICK, *flags))
    assert line == _foreign(out, "config.yaml, logs/, metrics.jsonl, notes.txt, tokenizer/")
    assert _snapshot(out) == before  # not even a lock file was left in it


@pytest.mark.parametrize("flags", [[], [OVERWRITE]], ids=["plain", "overwrite"])
def test_a_users_folder_holding_final_and_best_is_not_taken_for_a_run(tmp_path, flags):
    out = tmp_path / "models"
    for name in ("final", "best"):
        (out / name).mkdir(parents=True)
        (out / name / "model.safetensors").write_bytes(b"my weights")
    before = _snapshot(out)
    line = _refused(pretrain("--training.output_dir", out, *QUICK, *flags))
    assert line == _foreign(out, "best/, final/")
    assert _snapshot(out) == before


def test_a_prepared_corpus_folder_as_output_dir_is_refused_and_keeps_its_tokenizer(tmp_path):
    from kiln.config import build_config
    from pretrain.config import RunConfig
    from pretrain.data.prepare import prepare

    corpus = tmp_path / "corpus.txt"
    lines = [line for line in (REPO / "data/pretrain").glob("*.txt").__next__().read_text().splitlines() if line]
    corpus.write_text("\n\n".join(lines[:300]) + "\n")
    prepared = tmp_path / "prepared"
    config = build_config(RunConfig, ["--config", DEBUG, "--data.data_files", str(corpus)])
    prepare(config, str(prepared), shard_size_mb=0.1, say=lambda *_: None)
    assert (prepared / "tokenizer").is_dir()
    before = _snapshot(prepared)
    line = _refused(pretrain("--data.prepared", prepared, "--training.output_dir", prepared, *QUICK, OVERWRITE))
    assert line.startswith(f"error: output_dir {prepared} holds files Kiln did not write (")
    assert "tokenizer/" in line and "manifest.json" in line
    assert _snapshot(prepared) == before


def test_overwriting_a_run_removes_only_kilns_files_and_never_follows_a_link(tmp_path):
    out = tmp_path / "run"
    done = pretrain("--training.output_dir", out, *QUICK)
    assert done.returncode == 0, done.stderr[-3000:]
    marker = json.loads((out / ".kiln-run.json").read_text())
    assert marker["folder"] == str(out.resolve()) and marker["inode"] == os.stat(out).st_ino
    # a user's note beside the run, and a link where Kiln keeps a run file, to a folder outside
    (out / "notes.txt").write_text("keep me\n")
    precious = _user_folder(tmp_path / "precious")
    outside = _snapshot(precious)
    (out / "best").symlink_to(precious, target_is_directory=True)

    line = _refused(pretrain("--training.output_dir", out, *QUICK))
    assert line == (f"error: output_dir {out} already holds a run; continue it with --training.resume_from_checkpoint "
                    "latest, start over with --training.overwrite_output_dir, or pick another --training.output_dir")  # fmt: skip

    done = pretrain("--training.output_dir", out, *QUICK, "--training.max_steps", 1, OVERWRITE)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "notes.txt").read_text() == "keep me\n"
    assert not (out / "best").exists() and _snapshot(precious) == outside  # the link went, not what it named
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 1  # the old run's metrics did not mix in

    # a Kiln run that stopped before its first checkpoint is not cleared without the flag either
    shutil.rmtree(out / "final")
    shutil.rmtree(out / "checkpoints")
    line = _refused(pretrain("--training.output_dir", out, *QUICK))
    assert line == (f"error: output_dir {out} holds a Kiln run that stopped before its first checkpoint "
                    "(metrics.jsonl, tokenizer/); start over with --training.overwrite_output_dir, or pick another "
                    "--training.output_dir")  # fmt: skip


def test_a_copied_run_folder_resumes_but_is_never_cleared(tmp_path):
    original = tmp_path / "run"
    done = pretrain("--training.output_dir", original, *QUICK)
    assert done.returncode == 0, done.stderr[-3000:]
    copy = tmp_path / "copy"
    shutil.copytree(original, copy, symlinks=True)
    before = _snapshot(copy)
    line = _refused(pretrain("--training.output_dir", copy, *QUICK, OVERWRITE))
    why = f"a copy of a Kiln run folder (its marker was written for {original.resolve()})"
    assert line == _foreign(copy, "checkpoints/, config.yaml, final/, metrics.jsonl, tokenizer/",
                            checkpoints=True, why=why)  # fmt: skip
    assert _snapshot(copy) == before
    # a marker planted in a user's folder (one that names the folder, but not its inode) proves nothing either
    mine = _user_folder(tmp_path / "mine")
    forged = {"format": 1, "written_by": "kiln", "folder": str(mine.resolve()), "inode": os.stat(mine).st_ino + 1}
    (mine / ".kiln-run.json").write_text(json.dumps(forged))
    before = _snapshot(mine)
    line = _refused(pretrain("--training.output_dir", mine, *QUICK, OVERWRITE))
    assert "holds a copy of a Kiln run folder" in line and "removes only files it wrote there" in line
    assert _snapshot(mine) == before
    # resuming the copy writes beside its checkpoints (nothing left to train: it only ends again)
    done = pretrain("--training.output_dir", copy, *QUICK, "--training.resume_from_checkpoint", "latest")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (copy / "checkpoints" / "step-00000002").is_dir()


@pytest.mark.parametrize("flags", [[], [OVERWRITE]], ids=["plain", "overwrite"])
def test_a_fine_tuning_script_refuses_a_users_folder_before_building(tmp_path, kiln_checkpoints, flags):
    from test_finetune_scripts import write_sentiment

    encoder, _ = kiln_checkpoints
    files = write_sentiment(tmp_path, sizes=(32, 8, 8))
    out = _user_folder(tmp_path / "mine")
    before = _snapshot(out)
    done = _command("finetune/classify.py", "--model.checkpoint", encoder, "--training.output_dir", out,
                    "--data.train_file", files["train"], "--data.validation_file", files["validation"], *flags)  # fmt: skip
    assert _refused(done) == _foreign(out, "config.yaml, logs/, metrics.jsonl, notes.txt, tokenizer/")
    assert _snapshot(out) == before

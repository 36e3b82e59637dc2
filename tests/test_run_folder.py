"""Kiln removes only what it wrote: a run starts only in a new or empty folder or one holding Kiln's record of the
files it wrote there (`.kiln-run.json`); any other folder is refused in one line naming what is there, with or
without --training.overwrite_output_dir, and left exactly as it was. Each refusal runs the real command
(`pretrain/run.py`, `finetune/classify.py`): in a fresh process once per script and kind of folder, its other cases
through the same command line in this process (`refused_in_process`: the same one line and exit status, without
the ~6 s interpreter start). Overwriting by record, copies and planted markers: tests/test_run_record.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kiln_testing import DEBUG, REPO

from kiln import run_folder

OVERWRITE = "--training.overwrite_output_dir"
QUICK = ["--training.max_steps", 2, "--training.save_steps", 2, "--training.eval_steps", 0]


def _command(script: str, *args, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, str(REPO / script), *map(str, args)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


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


def refused_in_process(capsys, cli, *args) -> str:
    """`cli(argv)` (a script's command line: `pretrain.run.cli`, or `classify_cli`) run in this process, as
    `_refused` checks a fresh one: exit status 2, no traceback; its last line on stderr."""
    from kiln_testing import reset_accelerate

    capsys.readouterr()
    reset_accelerate()
    try:
        with pytest.raises(SystemExit) as exit_info:
            cli([str(arg) for arg in args])
    finally:
        reset_accelerate()
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    return err.strip().splitlines()[-1]


def pretrain_refused_in_process(capsys, *args) -> str:
    from pretrain.run import cli

    return refused_in_process(capsys, cli, "--config", DEBUG, *args)


def finetune_cli(script: str):
    """`finetune/SCRIPT.py`'s command line (its `main` under `run_finetune_cli`), for `refused_in_process`."""
    import importlib

    from finetune.common import run_finetune_cli

    main = importlib.import_module(f"finetune.{script}").main
    return lambda argv: run_finetune_cli(main, argv)


def _refused(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stderr.strip().splitlines()[-1]


def _foreign(
    out: Path, listing: str, *, checkpoints: bool = False, why: str = "files Kiln did not write"
) -> str:
    fixes = "pick another --training.output_dir, or empty this one yourself"
    if checkpoints:
        fixes = f"continue that run with --training.resume_from_checkpoint latest, {fixes}"
    return (
        f"error: output_dir {out} holds {why} ({listing}); {fixes}: Kiln writes a run only into a new or "
        "empty folder or one it made, and removes only files it wrote there"
    )


@pytest.mark.slow
@pytest.mark.parametrize("flags", [[], [OVERWRITE]], ids=["plain", "overwrite"])
def test_a_users_folder_is_refused_naming_what_is_there_and_left_as_it_was(tmp_path, flags, capsys):
    out = _user_folder(tmp_path / "mine")
    before = _snapshot(out)
    if (
        flags
    ):  # the dangerous flag in a fresh process, as users run it; without it, the same command line here
        line = _refused(pretrain("--training.output_dir", out, *QUICK, *flags))
    else:
        line = pretrain_refused_in_process(capsys, "--training.output_dir", out, *QUICK)
    assert line == _foreign(out, "config.yaml, logs/, metrics.jsonl, notes.txt, tokenizer/")
    assert _snapshot(out) == before  # not even a lock file was left in it


@pytest.mark.parametrize("flags", [[], [OVERWRITE]], ids=["plain", "overwrite"])
def test_a_users_folder_holding_final_and_best_is_not_taken_for_a_run(tmp_path, flags, capsys):
    out = tmp_path / "models"
    for name in ("final", "best"):
        (out / name).mkdir(parents=True)
        (out / name / "model.safetensors").write_bytes(b"my weights")
    before = _snapshot(out)
    line = pretrain_refused_in_process(capsys, "--training.output_dir", out, *QUICK, *flags)
    assert line == _foreign(out, "best/, final/")
    assert _snapshot(out) == before


def test_a_prepared_corpus_folder_as_output_dir_is_refused_and_keeps_its_tokenizer(tmp_path, capsys):
    from kiln.config import build_config
    from pretrain.config import RunConfig
    from pretrain.data.prepare import prepare

    corpus = tmp_path / "corpus.txt"
    lines = [
        line for line in (REPO / "data/pretrain").glob("*.txt").__next__().read_text().splitlines() if line
    ]
    corpus.write_text("\n\n".join(lines[:300]) + "\n")
    prepared = tmp_path / "prepared"
    config = build_config(RunConfig, ["--config", DEBUG, "--data.data_files", str(corpus)])
    prepare(config, str(prepared), shard_size_mb=0.1, say=lambda *_: None)
    assert (prepared / "tokenizer").is_dir()
    before = _snapshot(prepared)
    line = pretrain_refused_in_process(
        capsys, "--data.prepared", prepared, "--training.output_dir", prepared, *QUICK, OVERWRITE
    )
    assert line.startswith(f"error: output_dir {prepared} is a prepared corpus (")
    assert "tokenizer/" in line and "manifest.json" in line and "empty" not in line
    assert line.endswith(
        "); pick another --training.output_dir for the run: Kiln never writes a run into a "
        "prepared corpus, and removes only files it wrote"
    )
    assert _snapshot(prepared) == before


@pytest.mark.slow
def test_overwriting_a_run_removes_only_its_recorded_files_and_never_follows_a_link(tmp_path, capsys):
    """The trainings run in this process (a fresh process's overwrite: tests/test_run_record.py); the refusal users
    meet most, of a folder already holding a run, in a fresh process; the others through the same command line
    here."""
    from kiln_testing import one_torch_thread, run

    out = tmp_path / "run"
    with one_torch_thread():
        run(out, *QUICK)
    assert "final/model.safetensors" in run_folder.read_record(out)
    # a user's note beside the run, and a link where Kiln keeps a run file, to a folder outside
    (out / "notes.txt").write_text("keep me\n")
    precious = _user_folder(tmp_path / "precious")
    outside = _snapshot(precious)
    (out / "best").symlink_to(precious, target_is_directory=True)

    line = _refused(pretrain("--training.output_dir", out, *QUICK))
    assert line == (
        f"error: output_dir {out} already holds a run; continue it with --training.resume_from_checkpoint "
        "latest, start over with --training.overwrite_output_dir, or pick another --training.output_dir"
    )
    # the link is not Kiln's: overwrite removes nothing and says so; a model's final/ is no output folder either
    line = pretrain_refused_in_process(capsys, "--training.output_dir", out, *QUICK, OVERWRITE)
    assert line.startswith(
        f"error: output_dir {out} holds files Kiln did not write there or that changed since (best);"
    )
    line = pretrain_refused_in_process(capsys, "--training.output_dir", out / "final", *QUICK, OVERWRITE)
    assert line.startswith(f"error: output_dir {out / 'final'} is a saved model (README.md, config.json, ")
    assert (
        "; pick another --training.output_dir for the run: Kiln never writes a run into a saved model" in line
    )
    assert _snapshot(precious) == outside and (out / "final" / "model.safetensors").is_file()

    (out / "best").unlink()
    with one_torch_thread():
        run(out, *QUICK, "--training.max_steps", 1, OVERWRITE)
    assert (out / "notes.txt").read_text() == "keep me\n"
    assert _snapshot(precious) == outside
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 1  # the old run's metrics did not mix in

    # a Kiln run that stopped before its first checkpoint is not cleared without the flag either
    shutil.rmtree(out / "final")
    shutil.rmtree(out / "checkpoints")
    line = pretrain_refused_in_process(capsys, "--training.output_dir", out, *QUICK)
    assert line == (
        f"error: output_dir {out} holds a Kiln run that stopped before its first checkpoint "
        "(metrics.jsonl, tokenizer/); start over with --training.overwrite_output_dir, or pick another "
        "--training.output_dir"
    )


@pytest.mark.slow
@pytest.mark.parametrize("flags", [[], [OVERWRITE]], ids=["plain", "overwrite"])
def test_a_fine_tuning_script_refuses_a_users_folder_before_building(
    tmp_path, kiln_checkpoints, flags, capsys
):
    from test_finetune_scripts import write_sentiment

    encoder, _ = kiln_checkpoints
    files = write_sentiment(tmp_path, sizes=(32, 8, 8))
    out = _user_folder(tmp_path / "mine")
    before = _snapshot(out)
    args = [
        "--model.checkpoint",
        encoder,
        "--training.output_dir",
        out,
        "--data.train_file",
        files["train"],
        "--data.validation_file",
        files["validation"],
        *flags,
    ]
    if (
        flags
    ):  # the dangerous flag in a fresh process, as users run it; without it, the same command line here
        line = _refused(_command("finetune/classify.py", *args))
    else:
        line = refused_in_process(capsys, finetune_cli("classify"), *args)
    assert line == _foreign(out, "config.yaml, logs/, metrics.jsonl, notes.txt, tokenizer/")
    assert _snapshot(out) == before

"""Kiln never writes through a link, wherever in a run folder it stands: the test walks a finished tiny run
(checkpoint, final/, tokenizer/ and, pushed with `--hub.strategy every_save`, hub-export/), and for every file and
every folder in it in turn plants a symbolic link there leading outside the folder, then resumes and overwrites the
run in this process. Whatever the run does (refuses in one line, or writes its folders anew: fresh staging
folders renamed into place, `kiln.safe_write.staged_folder`), the files the links lead to stay byte for byte as
they were and nothing is created outside: a link to a file that exists, and a dangling one (the case that made a
tokenizer retrained on resume, its tokenizer.json missing, create a file outside the run).

The classes, not the cases: the walk takes the paths from the finished run, so a folder Kiln starts writing later
is walked too. Runs are the debug config at two steps, in this process (about a second each)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from kiln_testing import DEBUG, one_torch_thread, reset_accelerate, run
from test_run_folder import OVERWRITE, _snapshot

STEPS = ["--training.max_steps", 4, "--training.save_steps", 2, "--training.eval_steps", 0]
PUSH = ["--hub.push_to_hub", "--hub.model_id", "kiln-test/links", "--hub.strategy", "every_save"]
# resumed from the first of its two checkpoints: the second, hub-export/ and final/ are written again; an overwrite
# trains 2 steps, as many as reach every writer (a checkpoint pushed to hub-export/, final/, the tokenizer) and
# clear the finished run's second checkpoint by its record
MODES = {
    "resume": [*STEPS, "--training.resume_from_checkpoint", "{out}/checkpoints/step-00000002"],
    "overwrite": [*STEPS[:1], 2, *STEPS[2:], OVERWRITE],
}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, hub_server) -> Path:
    """A finished tiny run pushing at every save (so hub-export/ is there), made once; tests use copies."""
    from conftest import TEST_TOKEN

    hub_server.reset(token=TEST_TOKEN)
    out = tmp_path_factory.mktemp("walk") / "run"
    with one_torch_thread():
        run(out, *STEPS, *PUSH)
    assert (out / "hub-export" / "config.json").is_file() and (out / "tokenizer" / "tokenizer.json").is_file()
    return out


def _walk(out: Path) -> list[str]:
    """Every file and folder of the run, by name inside it (the folder itself not included)."""
    return sorted(path.relative_to(out).as_posix() for path in out.rglob("*"))


def _outside(where: Path) -> Path:
    """A user's folder outside the run: files a link may lead to, and a folder holding a model's names."""
    (where / "model").mkdir(parents=True)
    (where / "notes.txt").write_text("my notes\n")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "README.md", "checksums.json"):
        (where / "model" / name).write_text(f"my {name}\n")
    return where


def _plant(out: Path, name: str, outside: Path, dangling: bool) -> Path:
    """A link at `name` in `out` in place of what is there: to the user's folder (for a folder) or file, or,
    `dangling`, to a name outside that does not exist (nothing may ever be created there)."""
    link = out / name
    folder = link.is_dir() and not link.is_symlink()
    if folder:
        shutil.rmtree(link)
    else:
        link.unlink()
    if dangling:
        target = outside / f"never-{name.replace('/', '-')}"
    else:
        target = outside / "model" if folder else outside / "notes.txt"
    link.symlink_to(target, target_is_directory=folder)
    return target


def _try(capsys, out: Path, flags: list[str]) -> tuple[int, list[str]]:
    """The run's command line in this process: a refusal is one line, exit 2; no traceback either way."""
    from pretrain.run import cli

    capsys.readouterr()
    reset_accelerate()
    status = 0
    try:
        with one_torch_thread():
            argv = [*PUSH, *(str(flag).format(out=out) for flag in flags)]
            cli(["--config", DEBUG, "--training.output_dir", str(out), *map(str, argv)])
    except SystemExit as exit_info:
        status = exit_info.code
    finally:
        reset_accelerate()
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    lines = err.strip().splitlines()
    if status != 0:
        assert status == 2 and len(lines) >= 1 and lines[-1].startswith("error: "), lines[-5:]
    return status, lines


def _put_on_record(out: Path, name: str, target: Path) -> None:
    """The link on the run folder's record, as if Kiln had written it (a copied or crafted folder): the start's
    checks by the record then let the run in, and its writers meet the link."""
    with open(out / ".kiln-run.json", "a") as record:
        record.write(json.dumps({"forget": name}) + "\n")
        record.write(json.dumps({"link": name, "target": str(target)}) + "\n")


# (mode, recorded, kind): the link planted at each name of the walk leads to a file (or the user's folder), or is
# dangling, or the two take turns name by name ("alternate": dangling at the odd names, "alternate-swapped": at
# the even ones). An overwrite clears a link on the record as a link, whatever it leads to, so its recorded case
# takes both kinds in turn rather than two whole walks. A resume takes each kind at each name once, on the record
# at half the names and off it at the other half (its two cases swapped), rather than four whole walks: every
# (name, kind) and every (name, on the record or not) pair of a resume is walked.
CASES = [
    ("resume", False, "alternate"),
    ("resume", True, "alternate-swapped"),
    ("overwrite", False, "to-a-file"),
    ("overwrite", False, "dangling"),
    ("overwrite", True, "alternate"),
]


def _dangling(kind: str, number: int) -> bool:
    """Whether the link planted at the walk's `number`-th name is dangling, in a case of this `kind`."""
    return {
        "to-a-file": False,
        "dangling": True,
        "alternate": number % 2 == 1,
        "alternate-swapped": number % 2 == 0,
    }[kind]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "recorded", "kind"),
    CASES,
    ids=[f"{m}-{'recorded' if r else 'unrecorded'}-{k}" for m, r, k in CASES],
)
def test_a_link_anywhere_in_a_run_folder_is_never_written_through(
    finished_run, tmp_path, capsys, hub, mode, recorded, kind
):
    """For every name of a finished run, a link planted there (to a file or folder outside, or dangling; on the
    run's record or not) is never written through by a resume or an overwrite: the files outside stay byte for
    byte, nothing is created outside, and the run's own folders come back as folders; the walk reaches the
    writers (hub-export/, final/, a tokenizer retrained over a dangling tokenizer.json), not only the start's
    refusal."""
    names = _walk(finished_run)
    assert len(names) > 30 and "hub-export/tokenizer.json" in names and "tokenizer" in names
    outside = _outside(tmp_path / "outside")
    before = _snapshot(outside)
    written = []  # the names whose run did not stop at a refusal: the writers met the link
    dangled = set()  # the names planted with a dangling link
    for number, name in enumerate(names):
        dangling = _dangling(kind, number)
        if dangling:
            dangled.add(name)
        out = tmp_path / "run"
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(finished_run, out, symlinks=True)
        target = _plant(out, name, outside, dangling)
        if recorded and name != ".kiln-run.json":
            _put_on_record(out, name, target)
        status, lines = _try(capsys, out, MODES[mode])
        assert _snapshot(outside) == before, (name, lines[-3:])  # byte for byte; nothing created outside
        assert not target.exists() if dangling else target.exists(), name
        if status == 0:
            written.append(name)
            # the run's own folders came back as folders of the run, never as the link
            for folder in ("final", "tokenizer", "hub-export"):
                assert (out / folder).is_dir() and not (out / folder).is_symlink(), (name, folder)
    # the walk exercised the writers, not only the start's refusal: the audit's cases among them
    if recorded:
        assert {"hub-export/config.json", "hub-export/tokenizer.json", "final/config.json"} <= set(written), (
            written
        )
    if mode == "resume" and "tokenizer/tokenizer.json" in dangled:
        # the tokenizer retrained, its tokenizer.json a dangling link
        assert "tokenizer/tokenizer.json" in written, written

"""A symbolic link where Kiln writes in a run folder (a copied or shared folder, a user's own link) is never
written through. At a fixed staging name (`checkpoints/step-N.tmp`, `metrics.jsonl.tmp`, `.kiln-run.json.tmp`, a
tokenizer file's `.NAME.tmp`), at the lock or, on resume, at a run's own names, the run is refused in one line
naming the link, on overwrite and on resume alike, and the files the link leads to stay byte for byte as they
were. At `final.tmp` or `best.tmp`, an earlier Kiln's staging names, a link is left alone: final/ and best/ are
staged under fresh names now. A link already there is refused at the start (`kiln.run_folder.refusal`); one put
there once the run has started is refused by the writer that meets it (`kiln.safe_write`). The refusals run
through the training command line in this process; two nodes: tests/test_multi_node.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from kiln_testing import one_torch_thread, run
from test_run_folder import OVERWRITE, QUICK, _snapshot, pretrain_refused_in_process

from kiln import run_folder
from kiln.errors import ConfigError
from kiln.safe_write import link_refusal

RESUME = ["--training.resume_from_checkpoint", "latest"]
STEP = "checkpoints/step-00000002"
FOLDERS = (f"{STEP}.tmp",)
"""Staging folders under fixed names: a link to a user's model folder (README.md, config.json, model.safetensors)."""
OLD_STAGING = ("final.tmp", "best.tmp")
"""An earlier Kiln's staging names of final/ and best/: no longer written."""
FILES = (
    ".kiln-run.json.tmp",
    "metrics.jsonl.tmp",
    ".kiln.lock",
    ".kiln-run.json",
    "tokenizer/.tokenizer.json.tmp",
)
"""Staging files, the lock and the record: a link to a user's file."""


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished tiny run (a checkpoint at step 2, final/, tokenizer/), made once here; tests use copies."""
    out = tmp_path_factory.mktemp("links") / "run"
    with one_torch_thread():
        run(out, *QUICK)
    return out


def _outside(where: Path) -> Path:
    """A user's folder outside the run, holding what an export or a checkpoint would write there."""
    where.mkdir(parents=True)
    (where / "README.md").write_text("# my model\n")
    (where / "config.json").write_text('{"mine": true}\n')
    (where / "model.safetensors").write_bytes(b"my weights")
    (where / "notes.txt").write_text("my notes\n")
    return where


def _plant(out: Path, name: str, outside: Path) -> Path:
    """A link at `name` in `out`, to the user's folder (a staging folder's name) or to a file in it."""
    link = out / name
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.is_file():
        link.unlink()
    elif link.is_dir():
        shutil.rmtree(link)
    folder = name in FOLDERS or name in OLD_STAGING or name == "final"
    link.symlink_to(outside if folder else outside / "notes.txt", target_is_directory=folder)
    return link


@pytest.mark.parametrize("flags", [[OVERWRITE], RESUME], ids=["overwrite", "resume"])
def test_a_link_where_kiln_writes_is_refused_at_the_start_naming_it(finished_run, tmp_path, capsys, flags):
    out = shutil.copytree(finished_run, tmp_path / "run", symlinks=True)
    outside = _outside(tmp_path / "outside")
    before = _snapshot(outside)
    # on resume a run's own names too: the resumed run writes there, where an overwrite clears by the record
    names = [*FOLDERS, *FILES, *(["final", "metrics.jsonl"] if flags == RESUME else [])]
    for name in names:
        saved = out.with_name("saved")
        shutil.copytree(out, saved, symlinks=True)
        link = _plant(out, name, outside)
        folder = _snapshot(out)
        line = pretrain_refused_in_process(capsys, "--training.output_dir", out, *QUICK, *flags)
        assert line == f"error: {link_refusal(link)}", (name, line)
        assert str(out / name) in line and line.count(" is a symbolic link (to ") == 1
        assert _snapshot(outside) == before, name  # nothing written through the link
        assert _snapshot(out) == folder, name  # nor anything else in the run folder
        shutil.rmtree(out)
        saved.rename(out)


WRITERS = {
    # name: (flags, what the writer that meets the link writes)
    # the export is written into a fresh folder of its own (kiln.safe_write.staged_folder), renamed to final/
    "final": (RESUME, "the export, after training"),
    f"{STEP}.tmp": ([OVERWRITE], "the checkpoint of step 2"),
    ".kiln-run.json.tmp": ([OVERWRITE], "the new record"),
    ".kiln.lock": ([OVERWRITE], "the lock"),
    "metrics.jsonl.tmp": (RESUME, "metrics.jsonl without the rows after the checkpoint"),
}


@pytest.mark.parametrize("name", list(WRITERS))
def test_a_link_put_there_once_the_run_started_is_refused_by_its_writer(
    finished_run, tmp_path, capsys, monkeypatch, name
):
    """The start's look is skipped (as for a link made while the run goes on): the writer itself refuses."""
    flags, _ = WRITERS[name]
    out = shutil.copytree(finished_run, tmp_path / "run", symlinks=True)
    outside = _outside(tmp_path / "outside")
    before = _snapshot(outside)
    link = _plant(out, name, outside)
    if name == "metrics.jsonl.tmp":  # a row logged after the checkpoint: the resume rewrites metrics.jsonl
        with open(out / "metrics.jsonl", "a") as fh:
            fh.write(json.dumps({"step": 3, "train/loss": 1.0}) + "\n")
    monkeypatch.setattr(run_folder, "links_where_kiln_writes", lambda out, run_names=False: [])
    with one_torch_thread():
        line = pretrain_refused_in_process(capsys, "--training.output_dir", out, *QUICK, *flags)
    assert line == f"error: {link_refusal(link)}", line
    assert _snapshot(outside) == before
    folder = name in FOLDERS or name == "final"
    target = outside if folder else outside / "notes.txt"
    assert link.is_symlink() and os.readlink(link) == str(target)
    if name in FOLDERS:  # the checkpoint or export did not become the link
        final = out / name.removesuffix(".tmp")
        assert not final.is_symlink()


def test_a_link_inside_a_leftover_staging_folder_is_removed_with_it_never_followed(finished_run, tmp_path):
    """`checkpoints/step-N.tmp/checksums.json.tmp` in the staging folder a killed run left: that folder is
    Kiln's, cleared before the checkpoint is written again, and the link goes with it; and `write_checksums`
    itself never writes through a link at that name."""
    from kiln.checkpoint_files import write_checksums

    out = shutil.copytree(finished_run, tmp_path / "run", symlinks=True)
    outside = _outside(tmp_path / "outside")
    before = _snapshot(outside)
    staging = out / f"{STEP}.tmp"
    staging.mkdir()
    (staging / "checksums.json.tmp").symlink_to(outside / "config.json")
    with pytest.raises(ConfigError) as refused:
        write_checksums(staging)
    assert str(refused.value) == link_refusal(staging / "checksums.json.tmp")
    with one_torch_thread():
        run(out, *QUICK, OVERWRITE)
    assert not staging.exists() and (out / STEP / "checksums.json").is_file()
    assert _snapshot(outside) == before


def test_a_link_at_an_earlier_kilns_staging_name_is_left_alone(finished_run, tmp_path):
    """The reported case, `final.tmp` (and `best.tmp`) leading to a user's model in a copied run folder: final/ is
    written into a fresh staging folder now, so the overwrite runs, exports final/ and never touches the link."""
    out = shutil.copytree(finished_run, tmp_path / "run", symlinks=True)
    outside = _outside(tmp_path / "outside")
    before = _snapshot(outside)
    links = [_plant(out, name, outside) for name in OLD_STAGING]
    with one_torch_thread():
        run(out, *QUICK, OVERWRITE)
    assert _snapshot(outside) == before
    assert all(link.is_symlink() and os.readlink(link) == str(outside) for link in links)
    assert (out / "final" / "model.safetensors").is_file() and not (out / "final").is_symlink()

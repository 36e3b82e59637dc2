"""Whose files an output folder holds, and what a run may do with them.

Kiln writes a run only into a folder that is new or empty, or that it made itself: when it starts a run in a
folder it writes a marker, `.kiln-run.json`, before any run file. The marker records the folder it was written
for (its path, and its inode, which a copy does not keep). A folder counts as Kiln's own only when its marker
is a plain file that reads back and names this very folder (same inode): a copied or moved-across-disks run
folder, or one with a marker planted by someone else, is not proof that Kiln wrote what is in it.

What a run may do:

- new or empty: a run starts (and writes the marker), whatever the flags.
- Kiln's own, holding a run (a checkpoint or `final/`): refused unless resuming (resumes) or overwriting (Kiln's
  run files are removed, anything else in the folder is kept).
- Kiln's own, left by a run that stopped before its first checkpoint: refused unless resuming or overwriting,
  except when it holds nothing but `config.yaml` (reused).
- anything else (files Kiln did not write, a copy): refused, naming what is there, also when overwriting; a
  resume is let in when the folder holds checkpoints (it writes beside them and removes nothing).

Kiln's run files are a fixed set of names (`RUN_FILES`); overwriting removes those names and nothing else, and a
symbolic link among them is removed as a link, never followed. Nothing is ever removed without the overwrite
flag.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

MARKER = ".kiln-run.json"
"""In a run folder Kiln made: which folder it was made for."""
LOCK_FILE = ".kiln.lock"
"""In output_dir: locked (flock) by the run writing there, with its PID and host inside."""
NODE_MARKER_PREFIX = ".kiln-node-"
"""Written and removed at start by every node's local main process to detect a shared folder (kiln.nodes)."""

RUN_FILES = (
    "checkpoints", "final", "final.tmp", "best", "best.tmp", "logs", "metrics.jsonl", "config.yaml", "tokenizer",
    "hub-export", "hub-checkpoint", "wandb", "eval_results.json", "test_results.json", "predictions_test.jsonl",
    "predictions_test.tsv",
)  # fmt: skip
"""What a run writes into its output_dir: the only names `--training.overwrite_output_dir` removes, and only
from a folder that is Kiln's own."""

_BOOKKEEPING = (MARKER, MARKER + ".tmp", LOCK_FILE)
_SHOWN = 6  # entries named in a refusal


def _entries(out: Path) -> list[str]:
    """The folder's entries that are not Kiln's bookkeeping (marker, lock, node-detection markers), sorted."""
    return sorted(
        name for name in os.listdir(out) if name not in _BOOKKEEPING and not name.startswith(NODE_MARKER_PREFIX)
    )


def _describe(out: Path, names: list[str]) -> str:
    shown = [name + "/" if (out / name).is_dir() and not (out / name).is_symlink() else name for name in names]
    more = len(shown) - _SHOWN
    return ", ".join(shown[:_SHOWN]) + (f" and {more} more" if more > 0 else "")


def read_marker(out: Path) -> dict | None:
    """The folder's marker when it is a small plain file holding Kiln's JSON, else None."""
    path = out / MARKER
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not os.path.isfile(path) or os.path.islink(path) or info.st_size > 4096:
        return None
    try:
        marker = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("format") != 1 or not isinstance(marker.get("inode"), int):
        return None
    return marker


def is_own(out: Path) -> bool:
    """Whether `out` is a run folder Kiln made here: its marker names this folder's inode."""
    marker = read_marker(out)
    try:
        return marker is not None and marker["inode"] == os.stat(out).st_ino
    except OSError:
        return False


def _has_checkpoints(out: Path) -> bool:
    from .checkpoint_files import find_checkpoints

    return bool(find_checkpoints(out))


def _holds_run(out: Path) -> bool:
    return _has_checkpoints(out) or (out / "final").is_dir()


def refusal(out: Path, *, resume: bool, overwrite: bool) -> str | None:
    """Why a run may not start in `out` (one line naming what is there and what to do), or None; reads only."""
    if not out.is_dir():
        return None  # new (a path that is a file fails where the folder is made, with its own line)
    names = _entries(out)
    if not names:
        return None
    flag = "--training.output_dir"
    if not is_own(out):
        if resume and _has_checkpoints(out):
            return None  # resuming writes beside the checkpoints and removes nothing
        marker = read_marker(out)
        why = "files Kiln did not write"
        if marker is not None:
            made_for = marker.get("folder", "another folder")
            why = f"a copy of a Kiln run folder (its marker was written for {made_for})"
        fixes = f"pick another {flag}, or empty this one yourself"
        if _has_checkpoints(out):
            fixes = f"continue that run with --training.resume_from_checkpoint latest, {fixes}"
        return (
            f"output_dir {out} holds {why} ({_describe(out, names)}); {fixes}: Kiln writes a run only into a new "
            "or empty folder or one it made, and removes only files it wrote there"
        )
    if resume or overwrite:
        return None
    if _holds_run(out):
        return (
            f"output_dir {out} already holds a run; continue it with --training.resume_from_checkpoint "
            f"latest, start over with --training.overwrite_output_dir, or pick another {flag}"
        )
    stale = [name for name in names if name in RUN_FILES and name != "config.yaml"]
    if not stale:
        return None  # a run that stopped before writing anything but its config: reused, the config rewritten
    return (
        f"output_dir {out} holds a Kiln run that stopped before its first checkpoint ({_describe(out, stale)}); "
        f"start over with --training.overwrite_output_dir, or pick another {flag}"
    )


def claim(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Make `out` this run's folder once `refusal` allowed it, the folder locked: on overwrite remove Kiln's run
    files from its own folder (nothing else), and write the marker into a folder Kiln starts a run in."""
    out.mkdir(parents=True, exist_ok=True)
    own = is_own(out)
    if own and overwrite and not resume:
        for name in RUN_FILES:
            path = out / name
            if path.is_symlink() or path.is_file():
                path.unlink()
            elif path.is_dir():
                shutil.rmtree(path)
    if (own and overwrite and not resume) or not (own or _entries(out)):
        write_marker(out)  # a new run in this folder (a resume into a folder that is not Kiln's adds none)


def write_marker(out: Path) -> None:
    record = {
        "format": 1,
        "written_by": "kiln",
        "folder": str(out.resolve()),
        "inode": os.stat(out).st_ino,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    staging = out / (MARKER + ".tmp")
    staging.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    os.replace(staging, out / MARKER)


__all__ = ["LOCK_FILE", "MARKER", "RUN_FILES", "claim", "is_own", "read_marker", "refusal", "write_marker"]

"""Checkpoint files: where checkpoints lie (`checkpoints/step-N/`), the checksums written last into each, and what
a trainer_state.json may hold. Which checkpoint a resume takes, and the checks that it continues the same run,
are kiln.resume's."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from . import file_hash

CHECKPOINT_PREFIX = "step-"
TRAINER_STATE_FILE = "trainer_state.json"


def find_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [
        p
        for p in root.iterdir()
        if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX) and p.name[5:].isdigit()
    ]
    return sorted(found, key=lambda p: int(p.name[len(CHECKPOINT_PREFIX) :]))


CHECKSUMS_FILE = "checksums.json"
"""Written last into every checkpoint: the size and sha256 of each file, verified before a resume loads it
(kiln.resume)."""


def write_checksums(folder: Path) -> dict[str, dict[str, int | str]]:
    """checksums.json into the checkpoint `folder`, last: each file's size and sha256 (verified on resume, `kiln.resume`).
    Returns them (the run folder's record takes them as they are, `kiln.run_folder.record_files`)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != CHECKSUMS_FILE)
    manifest = {
        p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": file_hash.hash_file(p)}
        for p in files
    }
    from .safe_write import open_new_file, replace_into

    tmp = folder / f"{CHECKSUMS_FILE}.tmp"
    with open_new_file(tmp) as fh:  # never through a link (kiln.safe_write)
        fh.write(json.dumps({"files": manifest}, indent=1))
        fh.flush()
        os.fsync(fh.fileno())
    replace_into(tmp, folder / CHECKSUMS_FILE)
    return manifest


def trainer_state_problem(state: Any) -> str | None:
    """Why a checkpoint's trainer_state.json cannot be its own, or None: its step and epoch are counts, the
    batch layout it names (where it names one) positive whole numbers, every other field plain JSON."""
    from .elastic import LAYOUT_KEYS

    def count(value):
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    if not isinstance(state, dict):
        return f"{TRAINER_STATE_FILE} does not hold a trainer state"
    for key in ("global_step", "epoch"):
        if not count(state.get(key)):
            return f"{TRAINER_STATE_FILE}: {key} is {json.dumps(state.get(key))[:40]}, not a count"
    for key in LAYOUT_KEYS:
        if key in state and not (count(state[key]) and state[key] > 0):
            return (
                f"{TRAINER_STATE_FILE}: {key} is {json.dumps(state[key])[:40]}, not a positive whole number"
            )
    return None


__all__ = [
    "CHECKPOINT_PREFIX",
    "CHECKSUMS_FILE",
    "TRAINER_STATE_FILE",
    "find_checkpoints",
    "trainer_state_problem",
    "write_checksums",
]

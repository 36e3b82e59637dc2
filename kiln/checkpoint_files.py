"""Checkpoint files: where checkpoints lie (`checkpoints/step-N/`), the checksums written last into each and
verified before a resume, which checkpoint a `--training.resume_from_checkpoint` value names, and the checks that
a resume continues the same run (config changes, the kind of run that wrote it)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from .checkpoint_config import saved_run_config
from .config import flatten
from .errors import ConfigError
from .public import public_config

logger = logging.getLogger("kiln")

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
"""Written last into every checkpoint: the size and sha256 of each file, verified before a resume loads it."""


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_checksums(folder: Path) -> dict[str, dict[str, int | str]]:
    """checksums.json into the checkpoint `folder`, last: each file's size and sha256 (`checkpoint_problem`).
    Returns them (the run folder's record takes them as they are, `kiln.run_folder.record_files`)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != CHECKSUMS_FILE)
    manifest = {
        p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)} for p in files
    }
    from .safe_write import open_new_file, replace_into

    tmp = folder / f"{CHECKSUMS_FILE}.tmp"
    with open_new_file(tmp) as fh:  # never through a link (kiln.safe_write)
        fh.write(json.dumps({"files": manifest}, indent=1))
        fh.flush()
        os.fsync(fh.fileno())
    replace_into(tmp, folder / CHECKSUMS_FILE)
    return manifest


def checkpoint_problem(folder: Path) -> str | None:
    """Why the checkpoint `folder` cannot be resumed from (missing, truncated or changed files), or None.
    Checkpoints written before manifests existed are only checked for a readable trainer_state.json."""
    folder = Path(folder)
    try:
        state = json.loads((folder / TRAINER_STATE_FILE).read_text())
    except (OSError, ValueError) as err:
        return f"{TRAINER_STATE_FILE} is unreadable ({type(err).__name__})"
    problem = trainer_state_problem(state)
    if problem:
        return problem
    manifest_path = folder / CHECKSUMS_FILE
    if not manifest_path.is_file():
        return _unverified_problem(folder)
    try:
        manifest = json.loads(manifest_path.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{CHECKSUMS_FILE} is unreadable"
    for name, expected in manifest.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != expected["size"]:
            return f"{name} has {size} bytes instead of {expected['size']} (truncated?)"
        if _sha256(path) != expected["sha256"]:
            return f"{name} does not match its checksum (changed on disk)"
    return None


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


def _unverified_problem(folder: Path) -> str | None:
    """For a checkpoint without a manifest (written before manifests existed, or whose manifest was lost): the
    structural checks that need no checksum. A safetensors file must hold as many bytes as its header says, and
    a torch pickle (a zip archive) must end with its central directory: a truncated file fails either."""
    import zipfile

    from .model_files import safetensors_header

    for path in sorted(folder.glob("*.safetensors")):
        try:
            safetensors_header(path)  # its header read, and the file as long as the header says
        except OSError as err:
            return str(err)
    for path in sorted([*folder.glob("*.bin"), *folder.glob("*.pt"), *folder.glob("*.pth")]):
        if not zipfile.is_zipfile(path):
            return f"{path.name} is truncated or not a torch file"
    return None


def resolve_checkpoint(
    spec: str,
    output_dir: str,
    download: Callable[[str, str], str] | None = None,
    quiet: bool = False,
    skip: dict[str, str] | None = None,
) -> Path:
    """`latest`, a folder, or `hub:user/name` (downloaded through `download(spec, local_dir)`).

    The checkpoint's files are verified against its manifest; `latest` skips damaged checkpoints (newest
    first), and those `skip` names (folder name: why, found damaged by a later check), and says which one it
    falls back to; a damaged explicit checkpoint is a one-line error."""
    if spec == "latest":
        checkpoints = find_checkpoints(output_dir)
        if not checkpoints:
            raise ConfigError(
                f"--training.resume_from_checkpoint latest: no checkpoint in {output_dir}/checkpoints; "
                "start without it, or point it at a checkpoint folder"
            )
        damaged = []
        for candidate in reversed(checkpoints):
            problem = (skip or {}).get(candidate.name) or checkpoint_problem(candidate)
            if problem is None:
                if damaged and not quiet:
                    logger.warning(
                        "skipping damaged checkpoint(s) %s; resuming from %s, the newest valid one",
                        "; ".join(damaged),
                        candidate.name,
                    )
                return candidate
            damaged.append(f"{candidate.name}: {problem}")
        raise ConfigError(
            f"no valid checkpoint in {output_dir}/checkpoints ({'; '.join(damaged)}); "
            "start over with --training.overwrite_output_dir"
        )
    if spec.startswith("hub:"):
        if download is None:
            raise ConfigError("resuming from the Hub needs the hub module")
        path = Path(download(spec, os.path.join(output_dir, "hub-checkpoint")))
    else:
        path = Path(spec)
        if not (path / TRAINER_STATE_FILE).is_file():
            raise ConfigError(
                f"--training.resume_from_checkpoint {spec}: not a Kiln checkpoint (no {TRAINER_STATE_FILE}); "
                f"use 'latest' or a folder like {output_dir}/checkpoints/step-00000200"
            )
    problem = checkpoint_problem(path)
    if problem is not None:
        raise ConfigError(
            f"checkpoint {spec} is damaged: {problem}; resume from an older checkpoint "
            "(--training.resume_from_checkpoint latest picks the newest valid one)"
        )
    return path


# settings that may change between a run and its resume without changing what is trained
_RESUME_FREE_KEYS = (
    "training.output_dir",
    "training.resume_from_checkpoint",
    "training.overwrite_output_dir",
    "training.trust_checkpoint_pickles",
    "training.save_on_each_node",
    "training.allow_config_change",
    "training.eval_steps",
    "training.save_steps",
    "training.save_total_limit",
    "training.max_eval_batches",
    "training.per_device_eval_batch_size",
    "training.max_train_time_s",
    "training.metric_for_best_model",
    "training.greater_is_better",
    "training.early_stopping_patience",
    "training.divergence_factor",
    "data.num_workers",
    "data.num_proc",
    "data.cache_dir",
    "data.max_eval_documents",
    "tokenizer.name_or_path",
    "predict",
    "logging.",
    "hub.",
    "eval.",
)


_LAYOUT_CONFIG_KEYS = {"training.per_device_train_batch_size", "training.gradient_accumulation_steps"}
"""How the global batch is split: free to change with the number of processes (kiln.elastic)."""


def check_config_change(checkpoint: Path, config: Any, accelerator: Accelerator | None = None) -> None:
    """Refuse a resume whose settings differ from the checkpoint's run where that makes resuming inexact
    (batch size, sequence length, seed, data, model shape, steps, ...), or whose data files changed since (their
    sizes and sha256, `kiln.fingerprint`), unless --training.allow_config_change. With an `accelerator`, every
    process must call it: the main process hashes the data and tells the others. A config with a
    `compared_on_resume(flat)` method has both sides, flattened, read through it first."""
    import dataclasses

    from .fingerprint import data_changes, data_fingerprint, saved_fingerprint

    problems = []
    saved = saved_run_config(checkpoint)
    if saved is not None:
        # a checkpoint keeps its config without local paths (kiln.public), so both sides are compared that way:
        # a corpus or run folder moved to another place or machine (a resume from the Hub) is the same run
        old, new = flatten(public_config(saved)), flatten(public_config(dataclasses.asdict(config)))
        # the app's reading of a config's options, if any (pretrain: an option left unset by its preset's)
        compared = getattr(config, "compared_on_resume", None)
        if compared is not None:
            old, new = compared(old), compared(new)
        changed = [
            key
            for key in sorted(set(old) | set(new))
            if not key.startswith(_RESUME_FREE_KEYS)
            and key not in _RESUME_FREE_KEYS
            and key in old
            and key in new
            and old[key] != new[key]
            and not (
                isinstance(old[key], (int, float))
                and isinstance(new[key], (int, float))
                and old[key] == new[key]
            )
        ]
        if changed and set(changed) <= _LAYOUT_CONFIG_KEYS:
            from .elastic import layout_change_is_elastic

            if layout_change_is_elastic(checkpoint, config):
                changed = []  # another number of processes at the same global batch: still an exact continuation
        if changed:
            problems.append(
                "changed settings: " + ", ".join(f"{key} {old[key]!r} -> {new[key]!r}" for key in changed)
            )
    data_diff = []
    if accelerator is None or accelerator.is_main_process:
        # hashed once, by the process that writes the fingerprint into checkpoints, not by every rank (a corpus of
        # a few GB read by 8 ranks at once would multiply the resume's start-up); the verdict is then shared, so
        # every rank refuses or goes on alike
        saved_prints = saved_fingerprint(checkpoint)
        if saved_prints is not None:
            data_diff = data_changes(saved_prints, data_fingerprint(getattr(config, "data", None)))
    if accelerator is not None and accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        data_diff = broadcast_object_list([data_diff])[0]
    if data_diff:
        problems.append("changed data: " + ", ".join(data_diff))
    if not problems:
        return
    diff = "; ".join(problems)
    if config.training.allow_config_change:
        logger.warning("resuming with %s: the run is no longer an exact continuation", diff)
        return
    raise ConfigError(
        f"resuming {checkpoint} with {diff}; keep the saved values and data, or pass "
        "--training.allow_config_change to resume anyway (the result then differs from an uninterrupted run)"
    )


def check_checkpoint_metadata(path: Path, metadata: dict[str, Any]) -> None:
    """Refuse a checkpoint written by a run of another kind before anything is loaded into the wrong shapes."""
    saved = json.loads((Path(path) / TRAINER_STATE_FILE).read_text())
    for key, value in metadata.items():
        if key in saved and saved[key] != value:
            raise ConfigError(
                f"checkpoint {path} was written with {key}={saved[key]!r} but this run has {key}={value!r}; "
                "resume it with its own config, or start a new run in another output_dir"
            )


__all__ = [
    "CHECKPOINT_PREFIX",
    "CHECKSUMS_FILE",
    "TRAINER_STATE_FILE",
    "check_checkpoint_metadata",
    "check_config_change",
    "checkpoint_problem",
    "find_checkpoints",
    "resolve_checkpoint",
    "trainer_state_problem",
    "write_checksums",
]

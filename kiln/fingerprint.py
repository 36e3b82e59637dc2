"""What a run trained on, as a fingerprint saved with every checkpoint and compared on resume.

Local files are named by their file name (`kiln.public.public_file_names`: never by where they lie on the user's
disk, checkpoints may be pushed to the Hub) with their size and sha256, read in 1 MiB blocks so memory stays
flat however large the corpus. A Hub dataset is named by its name, configuration and revision; a prepared
corpus folder (`data.prepared`) by its manifest files. A resume whose data differs is refused like a changed
setting (`check_data_change`), with one line naming what changed.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from .file_hash import sha256_file
from .public import public_file_names, write_public_json

FINGERPRINT_FILE = "data_fingerprint.json"
"""Written into every checkpoint next to its kiln_config.yaml."""

_HUB_KEYS = (
    "dataset_name",
    "dataset_config",
    "dataset_config_name",
    "dataset_revision",
    "revision",
    "dataset_split",
)


def _local_files(data: Any) -> list[str]:
    """Every local file the data section trains or evaluates on (fields ending in `_file` or `_files`, globs
    expanded; not `test_file`: the test split is only predicted at the end, it does not change what is trained)."""
    from .config import resolve_path

    found: list[str] = []
    for name, value in sorted(vars(data).items()):
        if not name.endswith(("_file", "_files")) or name.startswith("test") or not value:
            continue
        for spec in [value] if isinstance(value, (str, os.PathLike)) else list(value):
            path = resolve_path(os.fspath(spec))
            matches = sorted(glob.glob(path)) if any(c in path for c in "*?[") else [path]
            found += [m for m in matches if os.path.isfile(m)]
    return sorted(set(found))


def data_fingerprint(data: Any) -> dict[str, str]:
    """{what: size + sha256 (files) or value (Hub dataset)} for the `data` section of a run's config."""
    if data is None:
        return {}
    prints: dict[str, str] = {}
    prepared = getattr(data, "prepared", None)
    if prepared and os.path.isdir(prepared):
        return _prepared_fingerprint(Path(prepared))
    if getattr(data, "dataset_name", None):
        for key in _HUB_KEYS:
            if getattr(data, key, None) is not None:
                prints[f"hub {key}"] = str(getattr(data, key))
        return prints
    files = _local_files(data)
    for path, name in zip(files, public_file_names(files)):
        prints[name] = f"{os.path.getsize(path)} bytes, sha256 {sha256_file(path)}"
    return prints


def _prepared_fingerprint(folder: Path) -> dict[str, str]:
    """A prepared corpus (`python -m pretrain.data prepare`): the sources its manifest records (name, size,
    sha256), and the tokenized shards (their records, sha256 each, hashed together)."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):  # not (yet) a complete prepared folder: its json files as they are
        return {
            f"prepared {p.name}": f"{p.stat().st_size} bytes, sha256 {sha256_file(p)}"
            for p in folder.glob("*.json")
        }
    prints = {}
    for split, sources in sorted((manifest.get("sources") or {}).items()):
        for source, name in zip(sources, public_file_names([source["name"] for source in sources])):
            prints[f"{split}: {name}"] = f"{source['bytes']} bytes, sha256 {source['sha256']}"
    shards = json.dumps(manifest.get("shards"), sort_keys=True).encode()
    prints["prepared shards"] = f"{len(shards)} bytes, sha256 {hashlib.sha256(shards).hexdigest()}"
    return prints


def write_fingerprint(prints: dict[str, str], folder: Path) -> None:
    write_public_json(Path(folder) / FINGERPRINT_FILE, prints, indent=1, sort_keys=True)


def _by_file_name(prints: dict[str, str]) -> dict[str, str]:
    """A fingerprint with its files named as `data_fingerprint` names them now: checkpoints written when files were
    named by their path relative to a common folder compare by file name."""
    groups: dict[str, list[str]] = {}
    for key in sorted(prints):
        if not key.startswith(("hub ", "prepared ")):
            split, sep, name = key.partition(": ") if ": " in key else ("", "", key)
            groups.setdefault(split + sep, []).append(key)
    renamed = {key: value for key, value in prints.items() if key.startswith(("hub ", "prepared "))}
    for prefix, keys in groups.items():
        for key, name in zip(keys, public_file_names([key[len(prefix) :] for key in keys])):
            renamed[prefix + name] = prints[key]
    return renamed


def saved_fingerprint(checkpoint: Path) -> dict[str, str] | None:
    """The fingerprint saved with a checkpoint; None for checkpoints written before fingerprints existed."""
    try:
        return json.loads((Path(checkpoint) / FINGERPRINT_FILE).read_text())
    except (OSError, ValueError):
        return None


def data_changes(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """What differs between two fingerprints, one short phrase each: `b.txt 1200 -> 1350 bytes`, ..."""
    old, new = _by_file_name(old), _by_file_name(new)
    changes = []
    for name in sorted(set(old) | set(new)):
        before, after = old.get(name), new.get(name)
        if before == after:
            continue
        if before is None:
            changes.append(f"{name} added")
        elif after is None:
            changes.append(f"{name} removed")
        elif name.startswith("hub "):
            changes.append(f"{name[4:]} {before!r} -> {after!r}")
        else:
            old_size, new_size = before.split(" bytes")[0], after.split(" bytes")[0]
            changes.append(
                f"{name} {old_size} -> {new_size} bytes"
                if old_size != new_size
                else f"{name} content changed"
            )
    return changes


__all__ = [
    "FINGERPRINT_FILE",
    "data_changes",
    "data_fingerprint",
    "saved_fingerprint",
    "sha256_file",
    "write_fingerprint",
]

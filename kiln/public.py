"""What Kiln writes for others to read (model cards, the config saved with a model or checkpoint, everything pushed
to the Hub) names data by what it is, never by where it lay on the user's disk.

A local path (`/home/alice/corpus/*.txt`, `runs/x`) becomes its last part (`*.txt`, `x`); Hub ids, URLs and plain
settings are left as they are. The card lists local data files by name, size and content hash. The run folder's
own config.yaml keeps the full config: it stays on the machine that wrote it.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
from pathlib import Path
from typing import Any

MAX_FILES_LISTED = 10
"""Data files the model card lists one by one; more are summed up in one line."""


def is_local_path(value: Any) -> bool:
    """Whether a config value names a place on this machine's disk (absolute, home-relative, ./ or ../, or a
    relative path with a folder part that exists here)."""
    if not isinstance(value, str) or not value or "\n" in value or "://" in value or value.startswith("hub:"):
        return False
    if os.path.isabs(value) or value.startswith(("~", "./", "../")):
        return True
    if "/" not in value and os.sep not in value:  # a bare name says nothing about the disk
        return False
    from .config import REPO_ROOT

    # a file or pattern in a folder that exists here, or the same from the repo root (the shipped samples)
    return any(os.path.exists(c) or os.path.isdir(os.path.dirname(c)) for c in (value, str(REPO_ROOT / value)))


def public_name(value: Any) -> Any:
    """A local path's last part (a file name, a glob pattern, a folder name); anything else unchanged."""
    if not is_local_path(value):
        return value
    return os.path.basename(value.rstrip("/" + os.sep)) or value


def public_config(value: Any) -> Any:
    """`value` (a config dataclass, dict, list or value) with every local path reduced to its last part."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {key: public_config(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [public_config(item) for item in value]
    return public_name(value)


def save_public_config(config: Any, path: str | os.PathLike) -> None:
    """The run's config as YAML for a folder that may be published: local paths reduced, tokens redacted."""
    import yaml

    from .redaction import redact

    text = yaml.safe_dump(public_config(config), sort_keys=False)
    Path(path).write_text(redact(text), encoding="utf-8")


def describe_data_files(patterns: list[str]) -> list[str]:
    """Local data files (paths or glob patterns) as `name (size, sha256 prefix)` lines for a model card; a pattern
    that matches nothing here is named by its last part."""
    from .config import resolve_path
    from .fingerprint import sha256_file

    # sha256_file is cached per process: the checkpoints' data fingerprints have hashed these files already

    described, files = [], []
    for pattern in patterns:
        matched = sorted(p for p in glob.glob(os.path.expanduser(resolve_path(pattern))) if os.path.isfile(p))
        if not matched:
            described.append(f"`{public_name(pattern)}`")
        files += matched
    for path in files[:MAX_FILES_LISTED]:
        described.append(f"`{os.path.basename(path)}` ({os.path.getsize(path):,} bytes, sha256 {sha256_file(path)[:16]})")
    if len(files) > MAX_FILES_LISTED:
        rest = files[MAX_FILES_LISTED:]
        digest = hashlib.sha256("".join(sha256_file(p) for p in rest).encode()).hexdigest()
        size = sum(os.path.getsize(p) for p in rest)
        described.append(f"{len(rest)} more files ({size:,} bytes, sha256 of their hashes {digest[:16]})")
    return described


__all__ = ["describe_data_files", "is_local_path", "public_config", "public_name", "save_public_config"]

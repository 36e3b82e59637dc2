"""The one place that decides what Kiln's published files may say about the user's disk: model cards, the config
saved with a model or checkpoint (kiln_config.yaml), data fingerprints, trainer states, training histories, a
prepared corpus's manifest, and so everything pushed to the Hub.

Data is named by what it is (file name, size, sha256), never by where it lies: a local path (`/home/alice/corpus/
*.txt`, `runs/x`) becomes its last part (`*.txt`, `x`), and so does a path inside a longer value
(`pretrained (/home/alice/runs/x/final)` -> `pretrained (final)`); Hub ids, URLs and plain settings are left as they
are. Files Kiln writes for others go through `public_text` (paths reduced, tokens redacted); a model card's
user-given strings (file names, settings, folder names) go through `card_text`, which shows them as text, never as
markdown or HTML. The run folder's own config.yaml keeps the full config: it stays on the machine that wrote it.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import re
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
    return any(
        os.path.exists(c) or os.path.isdir(os.path.dirname(c)) for c in (value, str(REPO_ROOT / value))
    )


# A path inside a longer text: absolute, home-relative, ./ or ../, not part of a word, a URL or another path. It
# ends at a space, a quote, a bracket or a separator; a full stop or colon ending a sentence is not part of it.
_EMBEDDED_PATH = re.compile(r"""(?<![\w.:/~\\-])(?:~|\.\.?)?/[^\s"'`()<>\[\]{}|,;]*[^\s"'`()<>\[\]{}|,;.:]""")


def _last_part(path: str) -> str:
    return os.path.basename(path.rstrip("/" + os.sep)) or path


def public_name(value: Any) -> Any:
    """A local path's last part (a file name, a glob pattern, a folder name); in any other text, every path it
    holds reduced to its last part; anything else unchanged."""
    if not isinstance(value, str):
        return value
    if is_local_path(value):
        return _last_part(value)
    return _EMBEDDED_PATH.sub(_reduce_embedded, value) if "/" in value else value


def _reduce_embedded(match: re.Match) -> str:
    """An embedded path's last part; a lone `/name` (`</s>`, `km /h`) is markup or prose, not a place: kept."""
    path = match.group(0)
    return _last_part(path) if path.startswith(("~", ".")) or path.count("/") > 1 else path


def public_text(text: str) -> str:
    """The text of a file Kiln publishes (or may: a checkpoint, a prepared corpus's manifest): every local path
    reduced to its last part, every Hugging Face token redacted."""
    from .redaction import redact

    return redact(public_name(text))


def write_public_text(path: str | os.PathLike, text: str) -> None:
    """Write a file that may be published, through `public_text`."""
    Path(path).write_text(public_text(text), encoding="utf-8")


def write_public_json(path: str | os.PathLike, value: Any, **dumps_options: Any) -> None:
    """Write `value` as JSON into a file that may be published: every string in it through `public_text`."""
    write_public_text(path, json.dumps(public_config(value), **dumps_options))


def public_file_names(paths: list[str]) -> list[str]:
    """What published files call local data files: each by its file name (never its folder, which tells where it
    lies), in the given order; a name that several files share is numbered (`a.txt`, `a.txt (2)`) so that each
    is named once."""
    names = [_last_part(os.fspath(path)) for path in paths]
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        unique.append(name if seen[name] == 1 else f"{name} ({seen[name]})")
    return unique


# Markdown and HTML in a card: `<`, `>` and `&` become entities; the rest that could start markup (code spans,
# emphasis, links and images, table cells, headings) is escaped with a backslash. An underscore inside a word
# starts nothing; parentheses make a link only after a bracket, which is escaped.
_CARD_ENTITIES = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}
_CARD_SPECIAL = re.compile(r"[<>&\\`*\[\]|~#]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")


def card_text(value: Any) -> str:
    """`value` as text in a model card's markdown (a heading, a list item, a table cell): local paths reduced
    (`public_name`), on one line, every character that markdown or HTML would read as markup escaped, so a name
    like ``a`<img src=x onerror=...>`.txt`` shows as itself and never as a tag."""
    text = str(public_name(value)).replace("\r", " ").replace("\n", " ")
    return _CARD_SPECIAL.sub(lambda m: _CARD_ENTITIES.get(m.group(0), "\\" + m.group(0)), text)


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

    write_public_text(path, yaml.safe_dump(public_config(config), sort_keys=False))


def describe_data_files(patterns: list[str]) -> list[str]:
    """Local data (files, glob patterns, prepared corpus folders) as `name (size, sha256 prefix)` lines for a model
    card, in markdown (`card_text`). A prepared folder (`python -m pretrain.data prepare`) is described by the
    sources its manifest records; a pattern that matches nothing here is named by its last part."""
    from .config import resolve_path
    from .file_hash import sha256_file

    # sha256_file is cached per process: the checkpoints' data fingerprints have hashed these files already

    described, files, recorded = [], [], []
    for pattern in patterns:
        place = os.path.expanduser(resolve_path(pattern))
        if os.path.isdir(place) and os.path.isfile(os.path.join(place, "manifest.json")):
            sources = _prepared_sources(Path(place))
            if sources is not None:
                recorded += sources
                continue
        matched = sorted(p for p in glob.glob(place) if os.path.isfile(p))
        if not matched:
            described.append(card_text(public_name(pattern)))
        files += [p for p in matched if p not in files]
    entries = recorded + [
        (name, os.path.getsize(path), sha256_file(path))
        for path, name in zip(files, public_file_names(files))
    ]
    for name, size, digest in entries[:MAX_FILES_LISTED]:
        described.append(f"{card_text(name)} ({size:,} bytes, sha256 {card_text(digest[:16])})")
    if len(entries) > MAX_FILES_LISTED:
        rest = entries[MAX_FILES_LISTED:]
        digest = hashlib.sha256("".join(entry[2] for entry in rest).encode()).hexdigest()
        size = sum(entry[1] for entry in rest)
        described.append(f"{len(rest)} more files ({size:,} bytes, sha256 of their hashes {digest[:16]})")
    return described


def _prepared_sources(folder: Path) -> list[tuple[str, int, str]] | None:
    """(name, bytes, sha256) of every source a prepared corpus's manifest records, validation ones marked as such;
    None when the manifest does not read as one."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        entries = []
        for split, sources in (manifest.get("sources") or {}).items():
            names = public_file_names([str(source["name"]) for source in sources])
            label = "" if split == "train" else f"{split}: "
            entries += [(label + name, int(s["bytes"]), str(s["sha256"])) for name, s in zip(names, sources)]
        return entries
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


__all__ = [
    "card_text",
    "describe_data_files",
    "is_local_path",
    "public_config",
    "public_file_names",
    "public_name",
    "public_text",
    "save_public_config",
    "write_public_json",
    "write_public_text",
]

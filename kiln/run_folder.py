"""Whose files an output folder holds, and what a run may do with them.

Kiln keeps a record of every file it writes into a run folder: `.kiln-run.json`, started before any run file,
holds one line per written file (its name inside the folder, its size and sha256, or a link's target), added by
the process that wrote the file right after writing it (the one process that writes the folder: rank 0 on a
shared folder, each node's local main process on node-local disks). Nothing about the folder itself (its path,
its inode) is taken as evidence: a run folder moved or copied elsewhere keeps its record and stays a run folder.

What a run may do:

- new or empty: a run starts (and starts the record), whatever the flags.
- holding a record and a run (a checkpoint or `final/`): refused unless resuming (resumes, the record goes on)
  or overwriting. Overwriting removes the files on the record that still match it (size and sha256; a link, its
  target) and nothing else: a file under one of a run's names (`RUN_FILES`: `final/`, `logs/`, ...) that is not
  on the record, or no longer matches it, makes the overwrite a one-line refusal naming it, before anything is
  removed (the new run would write over it); anything outside those names is kept. A link is never followed.
- holding a record, left by a run that stopped before its first checkpoint: refused unless resuming or
  overwriting, except when it holds nothing but `config.yaml` (reused).
- no record (a user's folder, a prepared corpus, a model's `final/`, a run of a Kiln that kept none): refused,
  naming what is there, also when overwriting; a resume is let in when the folder holds checkpoints (it writes
  beside them; the folder gets no record, so Kiln never clears it).
- a resume into a folder with a record is refused while a file that is not on the record lies in a folder the
  resumed run replaces (`final/`, `best/`, ...). A checkpoint rotated out or saved again loses only its files on
  the record, unchanged; a folder left holding others is renamed `step-N.kept` and kept.

An overwrite is also refused, before anything is removed, when one of the run's own inputs (its start model,
tokenizer, prepared corpus, data files) lies inside the folder (`inputs_inside`).

A symbolic link where a run writes (its record, lock and the fixed staging names `metrics.jsonl.tmp` and
`checkpoints/step-N.tmp`, whatever the flags; a run's own names too, unless an overwrite clears them by the
record) is refused in one line naming it (`links_where_kiln_writes`), and every writer creates its files without
following links (`kiln.safe_write`): nothing outside the folder is written through one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from .safe_write import link_refusal, open_file, replace_into, staged_folder, write_new_file

MARKER = ".kiln-run.json"
"""In a run folder Kiln made: the record of every file Kiln wrote there (JSON lines)."""
LOCK_FILE = ".kiln.lock"
"""In output_dir: locked (flock) by the run writing there, with its PID and host inside."""
NODE_MARKER_PREFIX = ".kiln-node-"
"""Written and removed at start by every node's local main process to detect a shared folder (kiln.nodes)."""

RUN_FILES = (
    "checkpoints",
    "final",
    "best",
    "logs",
    "metrics.jsonl",
    "config.yaml",
    "tokenizer",
    "hub-export",
    "hub-checkpoint",
    "wandb",
    "eval_results.json",
    "test_results.json",
    "predictions_test.jsonl",
    "predictions_test.tsv",
)
"""What a run writes into its output_dir: the only names under which `--training.overwrite_output_dir` removes
files (those on the folder's record, unchanged)."""

RECORD_FORMAT = 2
"""The record's format: 1 was a marker naming the folder's inode, which proved nothing."""
_MAX_RECORD_BYTES = 256 << 20  # a record larger than this is not one Kiln wrote
_BOOKKEEPING = (MARKER, MARKER + ".tmp", LOCK_FILE)
_SHOWN = 6  # entries named in a refusal
_lock = threading.Lock()
_appended: dict[str, tuple[int, Any, tuple[int, int]]] = {}
"""Files Kiln appends to (metrics.jsonl, tracker logs): their recorded size and running sha256, so a record after
an append reads only the new bytes."""
_journal_lines: dict[str, int] = {}


def _entries(out: Path) -> list[str]:
    """The folder's entries that are not Kiln's bookkeeping (record, lock, node-detection markers), sorted."""
    return sorted(
        name
        for name in os.listdir(out)
        if name not in _BOOKKEEPING and not name.startswith(NODE_MARKER_PREFIX)
    )


def _describe(out: Path, names: list[str]) -> str:
    shown = [
        name + "/" if (out / name).is_dir() and not (out / name).is_symlink() else name for name in names
    ]
    more = len(shown) - _SHOWN
    return ", ".join(shown[:_SHOWN]) + (f" and {more} more" if more > 0 else "")


# ----------------------------------------------------------------------------------------------------------
# the record


def _header() -> dict[str, Any]:
    return {
        "format": RECORD_FORMAT,
        "written_by": "kiln",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def read_record(out: Path) -> dict[str, dict[str, Any]] | None:
    """The files on the folder's record (name -> {"size", "sha256"} or {"link"}), or None when the folder has no
    record Kiln could have written (missing, a link, too large, another format). A line that does not parse (a
    write cut short by a kill) proves nothing and is skipped."""
    path = Path(out) / MARKER
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not os.path.isfile(path) or os.path.islink(path) or info.st_size > _MAX_RECORD_BYTES:
        return None
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    try:
        header = json.loads(lines[0]) if lines else None
    except ValueError:
        return None
    if (
        not isinstance(header, dict)
        or header.get("format") != RECORD_FORMAT
        or header.get("written_by") != "kiln"
    ):
        return None
    files: dict[str, dict[str, Any]] = {}
    for line in lines[1:]:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        name = entry.get("forget")
        if isinstance(name, str):
            for key in [k for k in files if k == name or k.startswith(name + "/")]:
                del files[key]
            continue
        name = entry.get("file")
        if (
            isinstance(name, str)
            and isinstance(entry.get("size"), int)
            and isinstance(entry.get("sha256"), str)
        ):
            files[name] = {"size": entry["size"], "sha256": entry["sha256"]}
            continue
        name = entry.get("link")
        if isinstance(name, str) and isinstance(entry.get("target"), str):
            files[name] = {"link": entry["target"]}
    return files


def older_marker(out: Path) -> bool:
    """Whether the folder holds the marker of a Kiln that kept no record (format 1: the folder's inode only)."""
    path = Path(out) / MARKER
    try:
        if os.path.islink(path) or not path.is_file() or path.stat().st_size > 4096:
            return False
        marker = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("format") == 1 and marker.get("written_by") == "kiln"


def start_record(out: Path, files: dict[str, dict[str, Any]] | None = None) -> None:
    """A new record in `out` (holding `files`, when a record is compacted), replacing any earlier one."""
    lines = [json.dumps(_header())]
    for name, entry in sorted((files or {}).items()):
        lines.append(
            json.dumps(
                {"link": name, "target": entry["link"]} if "link" in entry else {"file": name, **entry}
            )
        )
    staging = Path(out) / (MARKER + ".tmp")
    write_new_file(staging, "\n".join(lines) + "\n")  # never through a link there (kiln.safe_write)
    replace_into(staging, Path(out) / MARKER)
    key = str(Path(out).resolve())
    _journal_lines[key] = len(lines)
    _last[key] = {}
    for name in [k for k in _appended if k.startswith(key + os.sep)]:
        del _appended[name]


def _size_and_sha256(path: Path, append: bool) -> tuple[int, str]:
    """The file's size and sha256; for a file Kiln appends to, only the bytes added since its last record are read."""
    key = str(path.resolve())
    info = os.lstat(path)
    seen = _appended.get(key) if append else None
    # the same file (not one replaced under its name), grown since: only the new bytes
    if seen is not None and seen[0] <= info.st_size and seen[2] == (info.st_dev, info.st_ino):
        digest, start = seen[1].copy(), seen[0]
    else:
        digest, start = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        fh.seek(start)
        read = start
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
            read += len(block)
    if append or key in _appended:  # a file rewritten whole (metrics.jsonl on resume) appends from here on
        _appended[key] = (read, digest.copy(), (info.st_dev, info.st_ino))
    return read, digest.hexdigest()


def _lines_for(out: Path, path: Path, append: bool) -> list[dict]:
    rel = path.relative_to(out).as_posix()
    if path.is_symlink():
        return [{"link": rel, "target": os.readlink(path)}]
    if path.is_file():
        size, digest = _size_and_sha256(path, append)
        return [{"file": rel, "size": size, "sha256": digest}]
    if path.is_dir():
        lines = []
        for child in sorted(path.iterdir()):
            lines.extend(_lines_for(out, child, append))
        return lines
    return []


def record_files(out: str | os.PathLike, *paths: str | os.PathLike, append: bool = False) -> None:
    """Add what Kiln just wrote at `paths` (files or folders, by name inside `out`) to the folder's record; called
    by the process that wrote them, right after (a checkpoint: `record_checkpoint`). `append`: files Kiln appends
    to (only the new bytes are hashed). A folder without a record (a run started before records existed) gets none: its files stay unproven."""
    out = Path(out)
    if not (out / MARKER).is_file():
        return
    lines = []
    for path in paths:
        path = out / path
        if path.exists() or path.is_symlink():
            lines.extend(_lines_for(out, path, append))
    _journal(out, lines)


def record_checkpoint(
    out: str | os.PathLike, name: str, staging: Path, checksums: dict[str, dict[str, Any]]
) -> None:
    """Put the checkpoint written in `staging` on the record under `name` (its folder in `out`) before it is
    renamed into place: its files with the size and sha256 its writer just computed (`checksums`), and the
    checksums file itself. A kill in between leaves names on the record that are not on disk (harmless), never a
    checkpoint the record lacks."""
    from .checkpoint_files import CHECKSUMS_FILE
    from .file_hash import sha256_file

    out = Path(out)
    if not (out / MARKER).is_file():
        return
    manifest = staging / CHECKSUMS_FILE
    entries = {f"{name}/{file}": entry for file, entry in checksums.items()}
    entries[f"{name}/{CHECKSUMS_FILE}"] = {"size": manifest.stat().st_size, "sha256": sha256_file(manifest)}
    _journal(out, [{"file": file, **entry} for file, entry in sorted(entries.items())])


def record_staged(out: str | os.PathLike, staging: Path, name: str) -> None:
    """Put the files written in `staging` (a folder inside `out`) on the record under `name`, the folder it is
    about to be renamed to: recorded before it is in place, so a kill in between leaves names on the record that
    are not on disk (harmless), never files in place that the record lacks."""
    out = Path(out)
    if not (out / MARKER).is_file():
        return
    prefix = staging.relative_to(out).as_posix()
    lines = []
    for line in _lines_for(out, staging, False):
        key = "link" if "link" in line else "file"
        lines.append({**line, key: name + line[key][len(prefix) :]})
    _journal(out, lines)


@contextlib.contextmanager
def staged_run_folder(out: str | os.PathLike, name: str):
    """`with staged_run_folder(out, "final") as staging:` a folder of the run folder `out` that Kiln (or a
    library, through `save_pretrained`) writes whole: written into a fresh staging folder beside it and renamed
    into place (`kiln.safe_write.staged_folder`). The folder it replaces loses only the files Kiln provably wrote
    (on the record, unchanged); anything else in it (a user's file or link) is kept, the folder renamed
    `NAME.kept` (`set_aside_checkpoint`). The new files go on the record under `name`."""
    out = Path(out)
    with staged_folder(
        out / name,
        within=out,
        clear=lambda _: set_aside_checkpoint(out, name),
        record=lambda staging: record_staged(out, staging, name),
    ) as staging:
        yield staging


def forget_files(out: str | os.PathLike, *paths: str | os.PathLike) -> None:
    """Take `paths` (and everything under them) off the record: Kiln removed them (a rotated checkpoint)."""
    out = Path(out)
    if (out / MARKER).is_file():
        _journal(out, [{"forget": (out / path).relative_to(out).as_posix()} for path in paths])


_last: dict[str, dict[str, str]] = {}
"""Per run folder, the line last recorded for each name by this process: an unchanged file is not recorded again."""


def _journal(out: Path, lines: list[dict]) -> None:
    with _lock:
        key = str(out.resolve())
        last = _last.setdefault(key, {})
        fresh = []
        for line in lines:
            name = next(iter(line.values()))
            text = json.dumps(line)
            if "forget" in line:
                for known in [k for k in last if k == name or k.startswith(name + "/")]:
                    del last[known]
            elif last.get(name) == text:
                continue
            else:
                last[name] = text
            fresh.append(text)
        if not fresh:
            return
        lines = fresh
        with open_file(out / MARKER, "a") as fh:
            fh.write("".join(line + "\n" for line in lines))
        count = _journal_lines.get(key, 0) + len(lines)
        _journal_lines[key] = count
        if count > 10_000:  # a long run's appends: rewritten as what the record now holds
            files = read_record(out)
            if files is not None and count > 4 * len(files):
                start_record(out, files)


# ----------------------------------------------------------------------------------------------------------
# what an overwrite removes


def _matches(path: Path, entry: dict[str, Any] | None) -> bool:
    from .file_hash import sha256_file

    if not isinstance(entry, dict):
        return False
    if path.is_symlink():
        return entry.get("link") == os.readlink(path)
    if "link" in entry or not path.is_file():
        return False
    try:
        return os.lstat(path).st_size == entry.get("size") and sha256_file(path) == entry.get("sha256")
    except OSError:
        return False


def _staging(rel: str) -> bool:
    """Staging names Kiln's writers clear themselves before writing (a half-written checkpoint or export)."""
    parts = rel.split("/")
    return parts[0] == "metrics.jsonl.tmp" or (
        parts[0] == "checkpoints" and len(parts) > 1 and parts[1].endswith(".tmp")
    )


def overwrite_plan(out: Path) -> tuple[list[str], list[str]]:
    """What `--training.overwrite_output_dir` does to the folder: (the files it removes: on the record and
    matching it, under a run's names; the files under those names it may not remove: not on the record, changed
    since, or links that are not Kiln's). Links are never followed; staging folders are left to their writers."""
    files = read_record(out) or {}
    remove, keep = [], []
    for name in RUN_FILES:
        top = out / name
        if not (top.exists() or top.is_symlink()):
            continue
        found = [top] if top.is_symlink() or not top.is_dir() else []
        if not found:
            for folder, dirs, names in os.walk(top):  # never into a linked folder: a link is one entry
                links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
                found.extend(Path(folder) / n for n in [*names, *links])
        for path in found:
            rel = path.relative_to(out).as_posix()
            if _staging(rel):
                continue
            (remove if _matches(path, files.get(rel)) else keep).append(rel)
    return sorted(remove), sorted(keep)


_REPLACED = ("final", "best", "hub-export", "hub-checkpoint")
"""Folders a resumed run replaces whole (its exports, a downloaded checkpoint). Not checkpoints/: a checkpoint
rotated out or saved again loses only its files on the record, unchanged (`set_aside_checkpoint`)."""


def set_aside_checkpoint(out: str | os.PathLike, folder: str) -> tuple[str, list[str]] | None:
    """Clear the checkpoint `folder` (a name in `out`) for rotation or a save of the same step: its files Kiln
    provably wrote are removed (`remove_recorded`); what remains (a user's file, a file changed since) is kept,
    its folder renamed `step-N.kept` (`.kept-2`, ...), which no resume takes for a checkpoint. Returns (the new
    folder name, the files kept) when something was kept."""
    out = Path(out)
    kept = remove_recorded(out, folder)
    if not kept:
        return None
    aside, number = out / f"{folder}.kept", 1
    while aside.exists() or aside.is_symlink():
        number += 1
        aside = out / f"{folder}.kept-{number}"
    os.replace(out / folder, aside)
    forget_files(out, folder)  # the kept files' old names; under the new one they are on no record
    more = f" and {len(kept) - 3} more" if len(kept) > 3 else ""
    logging.getLogger("kiln").warning(
        "%s held files Kiln did not write or that changed since (%s%s): kept, in %s; delete that folder once you no "
        "longer need them",
        folder,
        ", ".join(kept[:3]),
        more,
        aside,
    )
    return aside.relative_to(out).as_posix(), kept


def unrecorded_in_replaced(out: Path) -> list[str]:
    """The files (by name, not read) in the folders a resumed run replaces that are not on the record."""
    files = read_record(out) or {}
    found = []
    for name in _REPLACED:
        top = out / name
        if top.is_symlink() or not top.is_dir():
            continue
        for folder, dirs, names in os.walk(top):
            links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
            for entry in [*names, *links]:
                rel = (Path(folder) / entry).relative_to(out).as_posix()
                if rel not in files and not _staging(rel):
                    found.append(rel)
    return sorted(found)


def _listing(names: list[str]) -> str:
    more = len(names) - _SHOWN
    return ", ".join(names[:_SHOWN]) + (f" and {more} more" if more > 0 else "")


# ----------------------------------------------------------------------------------------------------------
# what a run may do


def _has_checkpoints(out: Path) -> bool:
    from .checkpoint_files import find_checkpoints

    return bool(find_checkpoints(out))


def _holds_run(out: Path) -> bool:
    return _has_checkpoints(out) or (out / "final").is_dir()


def _kind_of_folder(out: Path) -> str | None:
    """What a folder Kiln must never write a run into is, by its files: a prepared corpus, a saved model."""
    if (out / "manifest.json").is_file() or (out / "plan.json").is_file():
        return "a prepared corpus"
    weights = (
        "model.safetensors",
        "model.safetensors.index.json",
        "pytorch_model.bin",
        "pytorch_model.bin.index.json",
    )
    if (out / "config.json").is_file() and any((out / name).is_file() for name in weights):
        return "a saved model"
    return None


_WRITES_AT = (MARKER, MARKER + ".tmp", LOCK_FILE, "metrics.jsonl.tmp")
"""The names Kiln writes at whatever a run does: its record, lock and fixed staging names (never on the record).
final/, best/ and the other folders written whole are staged under fresh names (`kiln.safe_write.staged_folder`),
which nothing can stand at before: `final.tmp` and `best.tmp`, an earlier Kiln's, are no longer among them."""


def links_where_kiln_writes(out: Path, *, run_names: bool = False) -> list[str]:
    """The symbolic links (by name in `out`) standing where a run writes: its record, lock and staging names
    (`metrics.jsonl.tmp`, `checkpoints/step-N.tmp`, a tokenizer file's `.NAME.tmp`) and, with `run_names`, a run's own
    names too (`final`, `checkpoints/step-N`, `metrics.jsonl`, ...: those an overwrite clears by the record)."""
    names = [*_WRITES_AT, *(RUN_FILES if run_names else ())]
    found = [name for name in names if os.path.islink(out / name)]
    for folder in ("checkpoints", "tokenizer"):
        top = out / folder
        if top.is_symlink() or not top.is_dir():
            continue
        for name in sorted(os.listdir(top)):
            ours = name.endswith(".tmp") or (
                run_names and folder == "checkpoints" and name.startswith("step-")
            )
            if ours and os.path.islink(top / name):
                found.append(f"{folder}/{name}")
    return found


def refusal(out: Path, *, resume: bool, overwrite: bool) -> str | None:
    """Why a run may not start in `out` (one line naming what is there and what to do), or None; reads only.
    A link where the run would write (`links_where_kiln_writes`) is refused naming it: never written through."""
    if not out.is_dir():
        return None  # new (a path that is a file fails where the folder is made, with its own line)
    links = links_where_kiln_writes(out)
    if not links:
        message = _refusal(out, resume=resume, overwrite=overwrite)
        # an overwrite removes a link on the record (as a link) and refuses any other (`overwrite_plan`)
        if message is not None or (overwrite and not resume):
            return message
        links = links_where_kiln_writes(out, run_names=True)
    if not links:
        return None
    if len(links) == 1:
        return link_refusal(out / links[0])
    more = f" where Kiln writes (as are {_listing(links[1:])})"
    return (
        link_refusal(out / links[0])
        .replace(" where Kiln writes", more, 1)
        .replace("the link,", "the links,", 1)
    )


def _refusal(out: Path, *, resume: bool, overwrite: bool) -> str | None:
    names = _entries(out)
    if not names:
        return None
    flag = "--training.output_dir"
    if read_record(out) is None:
        if resume and _has_checkpoints(out):
            return None  # resuming writes beside the checkpoints and removes nothing
        kind = _kind_of_folder(out)
        if kind is not None:
            return (
                f"output_dir {out} is {kind} ({_describe(out, names)}); pick another {flag} for the run: Kiln "
                f"never writes a run into {kind}, and removes only files it wrote"
            )
        why = "files Kiln did not write"
        if older_marker(out):
            why = "a run of an earlier Kiln version, which kept no record of the files it wrote"
        fixes = f"pick another {flag}, or empty this one yourself"
        if _has_checkpoints(out):
            fixes = f"continue that run with --training.resume_from_checkpoint latest, {fixes}"
        return (
            f"output_dir {out} holds {why} ({_describe(out, names)}); {fixes}: Kiln writes a run only into a new "
            "or empty folder or one it made, and removes only files it wrote there"
        )
    if resume:
        foreign = unrecorded_in_replaced(out)
        if not foreign:
            return None
        return (
            f"output_dir {out} holds files Kiln did not write in folders a resumed run replaces ({_listing(foreign)}); "
            f"move them out of the folder, or resume into another {flag}"
        )
    if overwrite:
        _, keep = overwrite_plan(out)
        if not keep:
            return None
        return (
            f"output_dir {out} holds files Kiln did not write there or that changed since ({_listing(keep)}); "
            f"move them out of the folder, or pick another {flag}: --training.overwrite_output_dir removes only "
            "the files on the run's record, unchanged, and the new run would write where these are"
        )
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
    """Make `out` this run's folder once `refusal` allowed it, the folder locked: on overwrite remove the files on
    its record that still match it (nothing else) and start a new record; start a record in a new or empty
    folder. A resume into a folder without a record (an earlier Kiln's run) starts none: its files stay unproven,
    and Kiln never clears it."""
    out.mkdir(parents=True, exist_ok=True)
    files = read_record(out)
    if files is not None and overwrite and not resume:
        remove, keep = overwrite_plan(out)
        if keep:  # `refusal` said so under the lock: never reached
            raise RuntimeError(f"{out}: refusing to overwrite, {keep[0]} is not on the run's record")
        for rel in remove:
            os.unlink(out / rel)
        _remove_empty_folders(out, remove)
        start_record(out)
    elif files is None and not _entries(out):
        start_record(out)  # a new run
    elif files is not None:  # a resume: the record goes on
        key = str(out.resolve())
        _journal_lines.setdefault(key, 0)
        _last[key] = {}


def _remove_empty_folders(out: Path, removed: list[str]) -> None:
    """The folders that held removed files, once empty (deepest first); a folder holding anything stays."""
    folders = {out / Path(rel).parent for rel in removed}
    for folder in list(folders):
        while folder != out and out in folder.parents:
            folders.add(folder)
            folder = folder.parent
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        if folder != out and not folder.is_symlink() and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def _checkpoint_manifest(folder: Path, rel: str) -> dict[str, dict[str, Any]]:
    """A checkpoint's own checksums.json as record entries (by name in the run folder), and the manifest itself:
    the evidence for a checkpoint of a run that kept no record (an earlier Kiln)."""
    from .checkpoint_files import CHECKSUMS_FILE
    from .file_hash import sha256_file

    manifest_path = folder / CHECKSUMS_FILE
    try:
        if manifest_path.is_symlink() or not manifest_path.is_file():
            return {}
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))["files"]
        entries = {
            f"{rel}/{CHECKSUMS_FILE}": {
                "size": manifest_path.stat().st_size,
                "sha256": sha256_file(manifest_path),
            }
        }
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return {}
    if not isinstance(manifest, dict):
        return {}
    for name, entry in manifest.items():
        parts = name.split("/") if isinstance(name, str) else [".."]
        if isinstance(entry, dict) and all(
            part not in ("", ".", "..") for part in parts
        ):  # inside the folder only
            entries[f"{rel}/{name}"] = {"size": entry.get("size"), "sha256": entry.get("sha256")}
    return entries


def remove_recorded(out: str | os.PathLike, folder: str) -> list[str]:
    """Remove the files under `folder` (a name inside `out`: a rotated or replaced checkpoint) that Kiln provably
    wrote: on the run's record and unchanged since (size and sha256; a link, its target) or, in a folder whose run
    kept no record (an earlier Kiln), listed unchanged in the checkpoint's own checksums.json. They go off the
    record and the folders left empty are removed. Returns the files kept (by name in `out`): a user's file put
    there, or one changed since, stays where it is, and with it its folder. Links are never followed."""
    out = Path(out)
    top = out / folder
    if top.is_symlink() or not top.is_dir():
        return []
    rel_top = top.relative_to(out).as_posix()
    files = read_record(out)
    if files is None:
        files = _checkpoint_manifest(top, rel_top)
    removed, kept = [], []
    for where, dirs, names in os.walk(top):
        links = [d for d in dirs if os.path.islink(os.path.join(where, d))]
        for name in [*names, *links]:
            path = Path(where) / name
            rel = path.relative_to(out).as_posix()
            if _matches(path, files.get(rel)):
                os.unlink(path)
                removed.append(rel)
            else:
                kept.append(rel)
    if (out / MARKER).is_file():
        forget = [rel_top] if not kept else removed
        if forget:
            forget_files(out, *forget)
    _remove_empty_folders(out, removed)
    if top.is_dir() and not any(top.iterdir()):  # nothing was in it but empty folders
        top.rmdir()
    return sorted(kept)


# ----------------------------------------------------------------------------------------------------------
# a run's inputs inside the folder it overwrites

_NOT_INPUTS = ("training.output_dir", "data.cache_dir", "logging.", "hub.")
"""Settings that name where a run writes (its folder, caches, trackers, the Hub), not what it reads."""


def _leaves(value: Any, key: str = ""):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        for name, item in value.items():
            yield from _leaves(item, f"{key}.{name}" if key else str(name))
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _leaves(item, key)
    elif isinstance(value, str) and value:
        yield key, value


def inputs_inside(config: Any, out: Path) -> list[tuple[str, str]]:
    """The run's inputs (every setting naming an existing local file or folder, a glob of data files included,
    except where the run writes) that lie inside the folder `out`: (setting, value) pairs."""
    try:
        root = out.resolve()
    except OSError:
        return []
    found = []
    for key, value in _leaves(config):
        if key.startswith(_NOT_INPUTS) or value.startswith("hub:") or "\n" in value or len(value) > 4096:
            continue
        try:
            paths = [Path(p) for p in glob.glob(value)] if glob.has_magic(value) else [Path(value)]
            hits = [p for p in paths if p.exists() and (p.resolve() == root or root in p.resolve().parents)]
        except (OSError, ValueError):
            continue
        if hits:
            found.append((key, value))
    return found


def inputs_refusal(config: Any, out: Path) -> str | None:
    """One line when `--training.overwrite_output_dir` would clear a folder holding one of the run's inputs."""
    found = inputs_inside(config, out)
    if not found:
        return None
    named = ", ".join(f"--{key} {value}" for key, value in found[:3]) + (
        f" and {len(found) - 3} more" if len(found) > 3 else ""
    )
    return (
        f"output_dir {out} holds this run's own input ({named}), which --training.overwrite_output_dir would "
        "remove before reading it; pick another --training.output_dir, or move the input out of the folder first"
    )


__all__ = [
    "RECORD_FORMAT",
    "LOCK_FILE",
    "MARKER",
    "RUN_FILES",
    "claim",
    "forget_files",
    "inputs_inside",
    "inputs_refusal",
    "links_where_kiln_writes",
    "older_marker",
    "overwrite_plan",
    "read_record",
    "record_checkpoint",
    "record_files",
    "record_staged",
    "refusal",
    "remove_recorded",
    "set_aside_checkpoint",
    "staged_run_folder",
    "start_record",
]

"""Writing into a run folder without following links: every file and folder Kiln writes there (its record,
its lock, `metrics.jsonl`, staging names such as `checkpoints/step-N.tmp` or a fresh `.final.XXXXXXXX.staging`,
the exports and checkpoints renamed into place) is made here or checked here first.

A run folder copied or shared may hold a symbolic link where Kiln writes; written through, the link would make
Kiln replace the files it leads to, outside `--training.output_dir`. So a file is created with `O_NOFOLLOW`
(and `O_EXCL` where it is new), a folder is made only where no link stands, a rename lands only where no link
stands, and a link found where Kiln writes is a one-line `ConfigError` naming it (`link_refusal`); the link
and what it leads to stay as they were.

A folder that a library fills (transformers' and tokenizers' `save_pretrained`: an export, a tokenizer, a
converted model) is never written in place: it is written into a fresh folder made beside it under a name no one
chose (`staged_folder`), then renamed into place, so a link inside the old folder is never met."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from .errors import ConfigError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def link_refusal(path: str | os.PathLike) -> str:
    """The one line for a link found at `path`, where Kiln would write."""
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    return (
        f"{path} is a symbolic link{target} where Kiln writes; remove the link, or pick another "
        "--training.output_dir: Kiln never writes through a link, which would replace what it leads to"
    )


def refuse_link(*paths: str | os.PathLike) -> None:
    """A one-line ConfigError when one of `paths` is a symbolic link (a missing path is fine)."""
    for path in paths:
        if os.path.islink(path):
            raise ConfigError(link_refusal(path))


def _open(path: Path, flags: int, mode: str, encoding: str | None) -> IO:
    try:
        fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC, 0o666)
    except OSError:
        refuse_link(path)  # ELOOP, or EEXIST for a link made since the check: said as a link
        raise
    return os.fdopen(fd, mode, encoding=None if "b" in mode else (encoding or "utf-8"))


def open_new_file(path: str | os.PathLike, mode: str = "w", encoding: str | None = None) -> IO:
    """A new file at `path` (a staging name: a leftover there is removed first), created with O_EXCL and
    O_NOFOLLOW: nothing that stands there, or is put there meanwhile, is written through; a link: refused."""
    path = Path(path)
    refuse_link(path)
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    return _open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode, encoding)


_FLAGS = {
    "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
    "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    "a+": os.O_RDWR | os.O_CREAT | os.O_APPEND,
}


def open_file(path: str | os.PathLike, mode: str = "a", encoding: str | None = None) -> IO:
    """`open(path, mode)` for a file Kiln keeps under its name (`w`: rewritten, `a`: appended to, `a+`: read
    and appended, the lock), never through a link at `path`: refused."""
    refuse_link(path)
    return _open(Path(path), _FLAGS[mode.replace("b", "")], mode, encoding)


def write_new_file(path: str | os.PathLike, content: str | bytes) -> None:
    """`content` into a new file at `path` (`open_new_file`)."""
    with open_new_file(path, "wb" if isinstance(content, bytes) else "w") as fh:
        fh.write(content)


def write_file(path: str | os.PathLike, content: str | bytes) -> None:
    """`content` as the whole file at `path`, never written through a link there (`open_file`)."""
    with open_file(path, "wb" if isinstance(content, bytes) else "w") as fh:
        fh.write(content)


def make_folder(path: str | os.PathLike, within: str | os.PathLike | None = None) -> Path:
    """`mkdir -p path` where no folder on the way from `within` (a folder above `path`: the run folder) to
    `path` is a link: each is checked, then made when missing; a link is refused. Without `within`: `path`."""
    path = Path(path)
    root = Path(within) if within is not None else path.parent
    root.mkdir(parents=True, exist_ok=True)
    where = root
    for part in path.relative_to(root).parts:
        where = where / part
        refuse_link(where)
        if not where.is_dir():
            where.mkdir()
    return path


def new_staging_folder(
    staging: str | os.PathLike, final: str | os.PathLike, within: str | os.PathLike | None = None
) -> Path:
    """An empty `staging` folder (a leftover removed) for what is then renamed to `final` (`replace_into`):
    a link at either, or on the way from `within` (default: their folder), is refused before anything is
    written."""
    staging, final = Path(staging), Path(final)
    refuse_link(staging, final)
    make_folder(staging.parent, within if within is not None else staging.parent)
    if staging.is_dir():
        shutil.rmtree(staging)
    elif staging.exists():
        staging.unlink()
    staging.mkdir()
    return staging


def replace_into(staging: str | os.PathLike, final: str | os.PathLike) -> None:
    """`os.replace(staging, final)`, refused where a link stands at either name: the rename would replace a
    link rather than write through it, but `final` becomes what `staging` is, so neither may be one."""
    refuse_link(staging, final)
    os.replace(staging, final)


STAGING_SUFFIX = ".staging"
"""The end of the name of a staging folder made by `fresh_staging_folder`: `.NAME.XXXXXXXX.staging`."""


def fresh_staging_folder(target: str | os.PathLike, within: str | os.PathLike | None = None) -> Path:
    """A new, empty folder beside `target` under a name no one can have chosen (`.NAME.XXXXXXXX.staging`, made by
    `mkdtemp`, which fails rather than take a name something already stands at): what a library then writes into
    it (transformers' and tokenizers' `save_pretrained`) meets nothing it could write through. A link at `target`,
    or on the way to it from `within` (default: its folder), is refused first. Leftovers of earlier staging
    folders for `target` (a killed writer's, found by that name) are removed, links among them only unlinked."""
    target = Path(target)
    refuse_link(target)
    make_folder(target.parent, within if within is not None else target.parent)
    prefix = f".{target.name}."
    for old in target.parent.glob(f"{glob.escape(prefix)}*{STAGING_SUFFIX}"):
        if old.is_symlink() or not old.is_dir():
            continue  # not a folder Kiln made: left alone (never followed)
        shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=prefix, suffix=STAGING_SUFFIX, dir=target.parent))


def remove_folder(folder: Path) -> None:
    """The default way `staged_folder` clears the folder it replaces: removed whole (a link inside is removed as a
    link, never followed)."""
    shutil.rmtree(folder)


@contextlib.contextmanager
def staged_folder(
    target: str | os.PathLike,
    *,
    within: str | os.PathLike | None = None,
    clear: Callable[[Path], None] = remove_folder,
    record: Callable[[Path], None] | None = None,
) -> Iterator[Path]:
    """`with staged_folder(target) as staging:` write the whole folder into `staging` (`fresh_staging_folder`);
    once the block ends, the folder now at `target` is cleared (`clear(target)`: removed by default; a run folder
    removes only what its record says Kiln wrote, `kiln.run_folder.staged_run_folder`), `record(staging)` is
    called (the files written put on a record before they are in place) and `staging` is renamed to `target`.
    Nothing is ever written into the folder at `target` itself, so a link planted inside it (or a dangling one)
    is never written through; a link at `target` is refused in one line. An error in the block removes `staging`
    and leaves `target` as it was."""
    target = Path(target)
    staging = fresh_staging_folder(target, within)
    try:
        yield staging
        refuse_link(target)
        if target.is_dir():
            clear(target)
        elif target.exists():
            raise FileExistsError(
                f"{target} is a file where Kiln writes a folder; move it away, or pick another output folder"
            )
        if target.exists() or target.is_symlink():  # what `clear` kept stays apart, never merged into
            raise FileExistsError(f"{target} is still there once cleared; move it away and run again")
        if record is not None:
            record(staging)
        replace_into(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


__all__ = [
    "STAGING_SUFFIX",
    "fresh_staging_folder",
    "remove_folder",
    "staged_folder",
    "link_refusal",
    "make_folder",
    "new_staging_folder",
    "open_file",
    "open_new_file",
    "refuse_link",
    "replace_into",
    "write_file",
    "write_new_file",
]

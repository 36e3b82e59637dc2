"""Writing into a run folder without following links: every file and folder Kiln writes there (its record,
its lock, `metrics.jsonl`, staging names such as `final.tmp` or `checkpoints/step-N.tmp`, the exports and
checkpoints renamed into place) is made here or checked here first.

A run folder copied or shared may hold a symbolic link where Kiln writes; written through, the link would make
Kiln replace the files it leads to, outside `--training.output_dir`. So a file is created with `O_NOFOLLOW`
(and `O_EXCL` where it is new), a folder is made only where no link stands, a rename lands only where no link
stands, and a link found where Kiln writes is a one-line `ConfigError` naming it (`link_refusal`); the link
and what it leads to stay as they were."""

from __future__ import annotations

import os
import shutil
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


__all__ = [
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

"""Disk faults a user fixes outside Kiln (a full, read-only or over-quota disk, a forbidden folder, a file where a
folder belongs, a cache that is not writable) named in one line with the fix, whatever library made the write."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path


def cache_error_message(err: OSError, cache_dir: str | None = None) -> str | None:
    """A one-line message when the disk refuses a write into a Hugging Face cache (read-only, forbidden, full):
    the fix is to move the cache, not the output folder. `cache_dir`: a cache folder the run chose itself
    (data.cache_dir). None when `err` is no such write."""
    import errno

    if (
        err.errno not in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT)
        or not err.filename
    ):
        return None
    path = Path(os.path.abspath(err.filename))
    if cache_dir and path.is_relative_to(os.path.abspath(cache_dir)):
        return f"the datasets cache data.cache_dir {cache_dir} is not writable ({err.strerror}); pick a writable data.cache_dir"
    # (cache folder, its name, the variable that moves it alone): the libraries' own settings, read only when
    # they are in use
    caches = []
    if "datasets" in sys.modules:
        caches.append(
            (sys.modules["datasets"].config.HF_DATASETS_CACHE, "datasets cache", "HF_DATASETS_CACHE")
        )
    if "huggingface_hub" in sys.modules:
        constants = sys.modules["huggingface_hub"].constants
        caches += [
            (constants.HF_HUB_CACHE, "Hub cache", "HF_HUB_CACHE"),
            (constants.HF_HOME, "HF_HOME", None),
        ]
    for folder, name, variable in caches:
        if path.is_relative_to(os.path.abspath(folder)):
            alone = f"{variable} (this cache only) or " if variable else ""
            return (
                f"the {name} {folder} is not writable ({err.strerror}); point {alone}HF_HOME (every Hugging Face "
                "cache) at a writable folder, e.g. `export HF_HOME=/scratch/$USER/huggingface`"
            )
    return None


def disk_error_message(err: OSError) -> str | None:
    """A one-line message for the disk faults a user fixes outside Kiln (full disk, read-only or forbidden
    folder, a file where a folder belongs); None for other OS errors."""
    import errno

    cache_message = cache_error_message(err)
    if cache_message is not None:
        return cache_message
    where = err.filename or "the output folder"
    fixes = {
        errno.ENOSPC: f"no space left on the device holding {where}; free some space or pick another "
        "--training.output_dir (a run resumes with --training.resume_from_checkpoint latest)",
        errno.EDQUOT: f"disk quota exceeded writing {where}; free some space or pick another --training.output_dir",
        errno.EROFS: f"{where} is on a read-only file system; pick a writable --training.output_dir",
        errno.EACCES: f"permission denied writing {where}; pick a writable --training.output_dir",
        errno.EPERM: f"permission denied writing {where}; pick a writable --training.output_dir",
        errno.ENOTDIR: f"{where}: a file stands where a folder is needed; remove it or pick another "
        "--training.output_dir",
        errno.EEXIST: f"{where} exists and is not a folder; remove it or pick another --training.output_dir",
        errno.EFBIG: f"file size limit exceeded writing {where} (`ulimit -f`, or the file system's own limit); "
        "raise the limit or pick another --training.output_dir",
    }
    return fixes.get(err.errno)


_OS_ERROR_IN_TEXT = re.compile(r"\(os error (\d+)\)")


def as_disk_fault(err: BaseException, folder: str | os.PathLike | None = None) -> OSError | None:
    """The disk fault behind `err` as an OSError with its errno (None when `err` is no disk fault we can name).

    Libraries report a failed write in their own words: safetensors and tokenizers as `... No space left on
    device (os error 28)` (a Rust I/O error), torch.save as `RuntimeError: [enforce fail at inline_container.cc]
    unexpected pos ...` without any errno. So: an OSError is taken as it is; an `(os error N)` in the message
    gives the errno; otherwise, when `folder` is given (the folder being written), the fault is reproduced with
    a plain write there (1 MiB, synced), which fails with the real errno on a full, read-only or over-quota
    disk and succeeds otherwise."""
    if isinstance(err, OSError):
        return err if disk_error_message(err) is not None else None
    found = _OS_ERROR_IN_TEXT.search(str(err))
    if found:
        fault = OSError(
            int(found.group(1)), os.strerror(int(found.group(1))), str(folder) if folder else None
        )
        return fault if disk_error_message(fault) is not None else None
    if folder is None:
        return None
    probe = Path(folder) / ".kiln-disk-probe"
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)  # never through a link
        with os.fdopen(os.open(probe, flags, 0o666), "wb") as fh:
            fh.write(b"\0" * (1 << 20))
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as fault:
        fault.filename = str(folder)
        return fault if disk_error_message(fault) is not None else None
    finally:
        try:
            probe.unlink(missing_ok=True)
        except OSError:
            pass
    return None


class disk_writes:
    """`with disk_writes(folder):` around writes into `folder` (a checkpoint, the final model): a write that
    fails because of the disk (full, read-only, over quota, file size limit) is re-raised as the OSError with
    its errno and the folder's name, whatever the library that wrote said, so the command line prints one line
    naming the fix (`disk_error_message`). Other errors pass through unchanged."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = folder

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        if err is None or not isinstance(err, Exception):
            return False
        fault = as_disk_fault(err, self.folder)
        if fault is None:
            return False
        # name the folder being written, not whatever path the failing call held (e.g. a copy's source file)
        inside = fault.filename is not None and Path(os.path.abspath(fault.filename)).is_relative_to(
            os.path.abspath(self.folder)
        )
        if not inside:
            fault.filename, fault.filename2 = str(self.folder), None
        if fault is err:
            return False
        raise fault from err


__all__ = ["as_disk_fault", "cache_error_message", "disk_error_message", "disk_writes"]

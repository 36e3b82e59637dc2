"""A file's sha256. `sha256_file` is computed once per process: the data fingerprints of every checkpoint
(kiln/fingerprint.py) and the model card's list of data files (kiln/public.py) name the same files by their
hashes. `hash_file` reads the file each time it is called: a checkpoint's files are checked against their
checksums as they are on disk now (kiln.resume hashes each once per process)."""

from __future__ import annotations

import hashlib
import os

_hash_cache: dict[tuple[str, int, int], str] = {}


def hash_file(path: str | os.PathLike) -> str:
    """sha256 of a file, read in 1 MiB blocks so memory stays flat."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    """`hash_file`, cached per (path, size, mtime) for the life of the process."""
    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
    if key not in _hash_cache:
        _hash_cache[key] = hash_file(path)
    return _hash_cache[key]


__all__ = ["hash_file", "sha256_file"]

"""Shared bits of the data path: its exception type and process helpers."""

from __future__ import annotations

import contextlib


class DataError(ValueError):
    """A problem with the corpus, tokenizer or data settings; the one-line message names the fix."""


@contextlib.contextmanager
def main_process_first(accelerator):
    """Rank 0 first, then each other node's local main process, then the rest (a no-op without an accelerator).

    What rank 0 writes to the `datasets` cache the others read; a node with its own cache (node-local disks, its
    own HF_HOME) builds the same data once, from the same tokenizer and settings, on its local main process
    while its other processes wait, so no two processes of a node write the same cache files at once."""
    if accelerator is None:
        yield
        return
    with accelerator.main_process_first(), accelerator.local_main_process_first():
        yield


def share_files(folder, accelerator) -> None:
    """Give every node the files rank 0 has in `folder` (small ones: a tokenizer): they are broadcast, and each
    node's local main process writes those its disk does not hold (node-local disks) before anyone reads them.
    On a shared folder this only costs the broadcast."""
    if accelerator is None or accelerator.num_processes == 1:
        return
    from pathlib import Path

    from accelerate.utils import broadcast_object_list

    from kiln.safe_write import replace_into, write_new_file

    folder = Path(folder)
    payload = None
    if accelerator.is_main_process:
        payload = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
    payload = broadcast_object_list([payload])[0]
    if accelerator.is_local_main_process and not accelerator.is_main_process:
        folder.mkdir(parents=True, exist_ok=True)
        for name, content in payload.items():
            target = folder / name
            if not target.is_file() or target.read_bytes() != content:
                partial = target.with_name(f".{name}.tmp")
                write_new_file(partial, content)  # never through a link (kiln.safe_write)
                replace_into(partial, target)  # never a half-written file where another process reads
    accelerator.wait_for_everyone()


def process_rank_and_count(accelerator) -> tuple[int, int]:
    if accelerator is None:
        return 0, 1
    return accelerator.process_index, accelerator.num_processes


def num_proc_for(requested: int | None, rows: int) -> int | None:
    """Processes for datasets.map: None (in-process) unless several are asked for and there is work to share."""
    return min(requested, rows) if requested and requested > 1 and rows > 1 else None

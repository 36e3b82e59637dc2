"""Shared bits of the data path: its exception type and process helpers."""

from __future__ import annotations

import contextlib


class DataError(ValueError):
    """A problem with the corpus, tokenizer or data settings; the one-line message names the fix."""


def main_process_first(accelerator):
    """`accelerator.main_process_first()`, or a no-op context without an accelerator."""
    return accelerator.main_process_first() if accelerator is not None else contextlib.nullcontext()


def process_rank_and_count(accelerator) -> tuple[int, int]:
    if accelerator is None:
        return 0, 1
    return accelerator.process_index, accelerator.num_processes


def num_proc_for(requested: int | None, rows: int) -> int | None:
    """Processes for datasets.map: None (in-process) unless several are asked for and there is work to share."""
    return min(requested, rows) if requested and requested > 1 and rows > 1 else None

"""Causal-LM packing: documents joined by EOS and cut into `block_size` blocks, nothing dropped.

Each document's tokens are followed by EOS, so EOS separates documents (and ends the last one). The stream is
cut into blocks of exactly `block_size` tokens; the tokens left over at the end of a `datasets.map` batch are
carried into the next batch rather than dropped, and the final remainder becomes one shorter last block (the
collator pads it and gives its padding the label -100). In streaming mode the end of the stream is not visible
to a map batch, so only there the final partial block is dropped.
"""

from __future__ import annotations

from itertools import chain


class BlockPacker:
    """Stateful `datasets.map(batched=True, with_indices=True)` function over a tokenized `input_ids` column.

    `num_rows` (map-style datasets) lets it flush the final partial block on the last batch. Must run in a
    single process (num_proc=None), in order.
    """

    def __init__(self, block_size: int, eos_id: int, num_rows: int | None = None):
        if block_size < 2:
            raise ValueError(f"block_size must be at least 2, got {block_size}")
        self.block_size = block_size
        self.eos_id = eos_id
        self.num_rows = num_rows
        self._carry: list[int] = []
        self._next_index = 0

    def __call__(self, batch, indices):
        if not indices or indices[0] != self._next_index:  # a fresh pass over the data
            self._carry = []
        self._next_index = indices[-1] + 1 if indices else self._next_index
        stream = list(chain(self._carry, *([*ids, self.eos_id] for ids in batch["input_ids"])))
        full = len(stream) - len(stream) % self.block_size
        blocks = [stream[i : i + self.block_size] for i in range(0, full, self.block_size)]
        self._carry = stream[full:]
        if self.num_rows is not None and self._next_index >= self.num_rows and self._carry:
            blocks.append(self._carry)
            self._carry = []
        return {"input_ids": blocks}


def pack_documents(documents: list[list[int]], block_size: int, eos_id: int) -> list[list[int]]:
    """Pack token-id documents into blocks in memory (same rule as BlockPacker)."""
    packer = BlockPacker(block_size, eos_id, num_rows=len(documents))
    return packer({"input_ids": documents}, list(range(len(documents))))["input_ids"]


__all__ = ["BlockPacker", "pack_documents"]

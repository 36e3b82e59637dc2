"""Which examples a run reads, in which order, with which random numbers: an epoch's random order (torch's
RandomSampler draws, read out in chunks), cut after its last whole global batch; rows tagged with their example
index for collators whose randomness is per example; and the seed of a micro-batch's own random numbers (dropout)
from its place in the global batch, so that any layout of processes and accumulation draws the same."""

from __future__ import annotations

import itertools

import torch
from torch.utils.data import RandomSampler


class ExampleIndexed(torch.utils.data.Dataset):
    """Rows of `dataset` with their position added as `example_index`, for collators whose randomness is per
    example (the MLM collator: masks from (seed, epoch, example index), the same on any number of processes)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        return {**self.dataset[index], "example_index": index}

    def __getitems__(self, indices: list[int]) -> list[dict]:
        getitems = getattr(self.dataset, "__getitems__", None)
        rows = getitems(indices) if getitems is not None else [self.dataset[i] for i in indices]
        return [{**row, "example_index": index} for row, index in zip(rows, indices)]


def micro_batch_seed(seed: int, step: int, slot: int) -> int:
    """The seed of the micro-batch in `slot` of optimizer step `step` (see Trainer._micro_batch_rng)."""
    import numpy as np

    state = np.random.SeedSequence([seed % 2**63, step, slot, 0x6B696C6E]).generate_state(2, dtype=np.uint32)
    return int(state[0]) << 31 | int(state[1]) >> 1


class EpochPrefix(torch.utils.data.Sampler):
    """The first `length` indices `sampler` gives (an epoch cut after its last whole global batch). Keeps the
    sampler's generator visible, so accelerate still synchronises it across processes."""

    def __init__(self, sampler, length: int):
        self.sampler, self.length = sampler, length
        self.generator = getattr(sampler, "generator", None)

    def __iter__(self):
        return itertools.islice(iter(self.sampler), self.length)

    def __len__(self) -> int:
        return self.length


class RandomOrder(RandomSampler):
    """RandomSampler's order (the same torch.randperm draws) without its Python list of every index: the
    permutation is read out in chunks, so an epoch of millions of examples costs 8 bytes per example."""

    def __iter__(self):
        n = len(self.data_source)
        if self.replacement or self.generator is None or self._num_samples is not None or n == 0:
            yield from super().__iter__()
            return
        for chunk in torch.randperm(n, generator=self.generator).split(1 << 16):
            yield from chunk.tolist()
        torch.randperm(
            n, generator=self.generator
        )  # RandomSampler draws a second, empty tail: the same state


def with_example_index(dataset, collator):
    return ExampleIndexed(dataset) if getattr(collator, "wants_example_index", False) else dataset


__all__ = ["EpochPrefix", "ExampleIndexed", "RandomOrder", "micro_batch_seed", "with_example_index"]

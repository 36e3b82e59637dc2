"""Elastic resume: a checkpoint written by N processes continues on M processes at the same global batch.

What a step trains on does not depend on how many processes run it: an epoch is `examples // global batch`
steps over whole global batches (`kiln.run_setup.optimizer_steps_per_epoch`), the epoch's order comes from a
generator seeded by (seed, epoch) alone, accelerate hands the processes consecutive per-device batches of that
order (process p takes batches p, p + N, ...: micro-batch a of process p is slot a x N + p of the step), the MLM
masks come from (seed, epoch, example index), dropout from (seed, step, slot) (`kiln.batch_order.micro_batch_seed`),
and the loss is the per-item mean over the whole window of all processes. A step of N processes x accumulation A
over per-device batches b trains on the next b x N x A examples of the order, and so does a step of M processes x
A' = b x N x A / (b x M) (see `kiln.trainer.Trainer`). So resuming on M processes only needs the accumulation
count that keeps the global batch (`kiln.resume.new_layout` decides it, once), and the data position converted from
per-process batches to examples. The model and optimizer are saved whole (DDP) and load on any number of processes.

torchtitan's resharding checkpoints (torch.distributed.checkpoint) are the anchor: the state is saved
independently of the layout it was trained on, and the layout of the resuming run decides how it is loaded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .config import TrainingConfig

LAYOUT_KEYS = ("num_processes", "per_device_train_batch_size", "gradient_accumulation_steps")
"""Written into every checkpoint's trainer_state.json: how its global batch was split."""


@dataclass(frozen=True)
class BatchLayout:
    """How a global batch is split: per-device batch x processes x accumulation steps."""

    num_processes: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int

    @property
    def global_batch(self) -> int:
        return self.num_processes * self.per_device_train_batch_size * self.gradient_accumulation_steps

    @property
    def micro_step(self) -> int:
        """Examples one micro-batch of every process consumes together."""
        return self.num_processes * self.per_device_train_batch_size

    def describe(self) -> str:
        return (
            f"{self.global_batch} sequences ({self.per_device_train_batch_size} per device x "
            f"{self.num_processes} process(es) x {self.gradient_accumulation_steps} accumulation step(s))"
        )

    def as_dict(self) -> dict[str, int]:
        return {key: getattr(self, key) for key in LAYOUT_KEYS}


def launched_processes() -> int:
    """The number of processes this run was launched with, read before accelerate's state is built (as accelerate
    reads it: torchrun's WORLD_SIZE, or an MPI launcher's)."""
    from accelerate.utils import get_int_from_env

    return get_int_from_env(["WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"], 1)


def layout_of(training: TrainingConfig, num_processes: int) -> BatchLayout:
    return BatchLayout(
        num_processes, training.per_device_train_batch_size, training.gradient_accumulation_steps
    )


def convert_position(batches_in_epoch: int, saved: BatchLayout | None, current: BatchLayout) -> int:
    """Per-process micro-batches consumed in the epoch, from the saved layout's count to the current one's:
    the same number of examples of the epoch's order (rounded up: a checkpoint after an epoch's partial last
    window is at the epoch's end in any layout)."""
    if saved is None or saved.micro_step == current.micro_step:
        return batches_in_epoch
    return math.ceil(batches_in_epoch * saved.micro_step / current.micro_step)


__all__ = [
    "BatchLayout",
    "convert_position",
    "launched_processes",
    "layout_of",
]

"""Elastic resume: a checkpoint written by N processes continues on M processes at the same global batch.

What a step trains on does not depend on how many processes run it: an epoch is `examples // global batch`
steps over whole global batches (`kiln.run_setup.optimizer_steps_per_epoch`), the epoch's order comes from a
generator seeded by (seed, epoch) alone, accelerate hands the processes consecutive per-device batches of that
order (process p takes batches p, p + N, ...: micro-batch a of process p is slot a x N + p of the step), the MLM
masks come from (seed, epoch, example index), dropout from (seed, step, slot) (`kiln.batch_order.micro_batch_seed`),
and the loss is the per-item mean over the whole window of all processes. A step of N processes x accumulation A
over per-device batches b trains on the next b x N x A examples of the order, and so does a step of M processes x
A' = b x N x A / (b x M) (see `kiln.trainer.Trainer`). So resuming on M processes only needs the accumulation
count that keeps the global batch, and the data position converted from per-process batches to examples.
The model and optimizer are saved whole (DDP) and load on any number of processes.

torchtitan's resharding checkpoints (torch.distributed.checkpoint) are the anchor: the state is saved
independently of the layout it was trained on, and the layout of the resuming run decides how it is loaded.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import TrainingConfig
from .errors import ConfigError

logger = logging.getLogger("kiln")

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


def saved_layout(checkpoint: str | Path) -> BatchLayout | None:
    """The layout a checkpoint was written with: from its trainer_state.json, or, for checkpoints written
    before it was recorded there, from its per-process RNG files and its saved config. None: unknown."""
    checkpoint = Path(checkpoint)
    try:
        state = json.loads((checkpoint / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return None
    if all(isinstance(state.get(key), int) for key in LAYOUT_KEYS):
        return BatchLayout(*(state[key] for key in LAYOUT_KEYS))
    from .checkpoint_config import saved_run_config

    processes = len(list(checkpoint.glob("rng_state_*.safetensors"))) or len(
        list(checkpoint.glob("random_states_*.pkl"))
    )
    training = (saved_run_config(checkpoint) or {}).get("training") or {}
    batch, accumulation = (
        training.get("per_device_train_batch_size"),
        training.get("gradient_accumulation_steps"),
    )
    if not processes or not isinstance(batch, int) or not isinstance(accumulation, int):
        return None
    return BatchLayout(processes, batch, accumulation)


def adapt_to_world_size(
    training: TrainingConfig, num_processes: int, checkpoint: str | Path | None
) -> str | None:
    """Resuming `checkpoint` on `num_processes`: set the accumulation count that keeps its global batch (the
    per-device batch stays, so each device's memory does not change), or refuse in one line when none does.
    Returns what was changed (to log), or None when the checkpoint was written on as many processes."""
    if checkpoint is None:
        return None
    saved = saved_layout(checkpoint)
    if saved is None or saved.num_processes == num_processes:
        return None
    if training.total_train_batch_size is not None:
        # the per-device batch would be derived from the total; keep the saved one, the total stays the same
        per_device = saved.per_device_train_batch_size
    else:
        per_device = training.per_device_train_batch_size
    micro_step = per_device * num_processes
    if saved.global_batch % micro_step:
        fitting = [n for n in range(1, saved.global_batch + 1) if saved.global_batch % (n * per_device) == 0]
        raise ConfigError(
            f"checkpoint {checkpoint} was trained at a global batch of {saved.describe()}, which {num_processes} "
            f"process(es) x {per_device} per device cannot keep; resume on "
            f"{', '.join(map(str, fitting[:8]))} process(es), or set --training.per_device_train_batch_size so "
            f"that it x {num_processes} divides {saved.global_batch}"
        )
    accumulation = saved.global_batch // micro_step
    message = (
        f"resuming a checkpoint of {saved.num_processes} process(es) on {num_processes}: gradient accumulation "
        f"{saved.gradient_accumulation_steps} -> {accumulation} keeps the global batch of {saved.global_batch} "
        "sequences"
    )
    training.gradient_accumulation_steps = accumulation
    training.per_device_train_batch_size = per_device
    return message


def layout_change_is_elastic(checkpoint: str | Path, config: Any, num_processes: int | None = None) -> bool:
    """True when the checkpoint's per-device batch and accumulation differ from `config`'s only because the
    number of processes changed and the global batch is kept (`adapt_to_world_size` did that)."""
    saved = saved_layout(checkpoint)
    if saved is None:
        return False
    layout = layout_of(config.training, num_processes or launched_processes())
    return layout.global_batch == saved.global_batch


def convert_position(batches_in_epoch: int, saved: BatchLayout | None, current: BatchLayout) -> int:
    """Per-process micro-batches consumed in the epoch, from the saved layout's count to the current one's:
    the same number of examples of the epoch's order (rounded up: a checkpoint after an epoch's partial last
    window is at the epoch's end in any layout)."""
    if saved is None or saved.micro_step == current.micro_step:
        return batches_in_epoch
    return math.ceil(batches_in_epoch * saved.micro_step / current.micro_step)


__all__ = [
    "BatchLayout",
    "adapt_to_world_size",
    "convert_position",
    "launched_processes",
    "layout_change_is_elastic",
    "layout_of",
    "saved_layout",
]

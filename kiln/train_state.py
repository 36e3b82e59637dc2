"""The counters of a run (step, epoch, position in the epoch, best metric, history, ...), saved with every checkpoint.

Kept by the Trainer (`kiln.trainer`) and handed to the callbacks (`kiln.callbacks`): a module of its own, so that
the callbacks need no import of the Trainer, which imports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainState:
    """Counters saved with every checkpoint (as JSON, `kiln.checkpoint_state`)."""

    global_step: int = 0
    epoch: int = 0
    batches_in_epoch: int = 0
    tokens_seen: int = 0
    train_time_s: float = 0.0
    best_metric: float | None = None
    best_step: int | None = None
    evals_without_improvement: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    stop_reason: str | None = None
    lowest_loss: float | None = None
    """The lowest training loss of an optimizer step so far (divergence is measured against it)."""
    lowest_loss_step: int | None = None

    def state_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


__all__ = ["TrainState"]

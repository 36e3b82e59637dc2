"""The loss guard: whether the loss of each optimizer step can be trusted, and the one way a run stops when not.

A run can go wrong in three ways that no exception reports: a NaN/inf loss or gradient norm (the step is skipped,
and after training.max_nonfinite_steps of them in a row the run stops), a step DeepSpeed applied with a NaN/inf
gradient norm before Kiln could see it (the run stops at once), and a loss that climbs far above its lowest value
(training.divergence_factor, DIVERGENCE_STEPS steps in a row) while a decaying schedule hides it. Each ends the run
with the same RunError (`diverged`): what went wrong, which checkpoint is the last good one, that nothing was
exported, and what to change. While the loss is not to be trusted the guard also says why no checkpoint may be
saved (`checkpoint_refusal`), so the last checkpoint stays a good one.

The guard owns the state of those watches (the steps in a row); the lowest loss lives in the TrainState, so a
resumed run measures divergence against the same value.

    Trainer._optimizer_step ──▶ LossGuard.is_nonfinite / skip_nonfinite / applied_nonfinite_step
    Trainer loop, after each step ──▶ LossGuard.check_divergence
    Trainer.save_checkpoint ──▶ LossGuard.checkpoint_refusal
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch
from accelerate import Accelerator

from .checkpoint_files import find_checkpoints
from .config import TrainingConfig
from .errors import RunError
from .train_state import TrainState

logger = logging.getLogger("kiln")

DIVERGENCE_STEPS = 3
"""Optimizer steps in a row with the loss far above its lowest (training.divergence_factor) that stop a run."""


class LossGuard:
    """Watches each optimizer step's loss and gradient norm; raises the run's one divergence error."""

    def __init__(self, accelerator: Accelerator, training: TrainingConfig, output_dir: Path):
        self.accelerator = accelerator
        self.training = training
        self.output_dir = output_dir
        self.step_loss: float | None = None
        """The last step's global mean loss (set by `is_nonfinite`)."""
        self.nonfinite_steps: list[int] = []
        """The steps in a row, up to now, whose loss or gradient norm was NaN/inf (skipped)."""
        self.high_loss_steps: list[int] = []
        """The steps in a row, up to now, whose loss was far above its lowest."""

    def is_nonfinite(self, parts: dict[str, torch.Tensor], grad_norm=None) -> bool:
        """Whether this step's loss or gradient norm (None: not known yet) is NaN/inf on any process; sets
        `step_loss`, the step's global mean loss."""
        acc = self.accelerator
        values = [v.detach().float().reshape(()) for v in parts.values()]
        # fp16: an overflowing gradient is the loss scaler's business
        if grad_norm is not None and acc.mixed_precision != "fp16":
            values.append(torch.as_tensor(grad_norm, device=acc.device).detach().float().reshape(()))
        bad = torch.stack(values).isfinite().all().logical_not().float() if values else torch.zeros(())
        # this process's share of the step's global mean loss (the sum over processes is the mean)
        share = parts["loss"] if "loss" in parts else sum(parts.values(), torch.zeros((), device=acc.device))
        flags = torch.stack([bad.to(acc.device), share.detach().float().reshape(()).to(acc.device)])
        if acc.num_processes > 1:  # every process must take (or skip) the same steps, and see the same loss
            flags = acc.reduce(flags, reduction="sum")
        self.step_loss = float(flags[1])
        return bool(flags[0])

    def skip_nonfinite(self, parts: dict[str, torch.Tensor], grad_norm, step: int) -> bool:
        """True when the loss or gradient norm of optimizer step `step` is NaN/inf: the step is then not applied
        (the weights stay finite). After training.max_nonfinite_steps such steps in a row the run stops; the last
        checkpoint stays the last good one and no final model is exported."""
        if not self.is_nonfinite(parts, grad_norm):
            self.nonfinite_steps = []
            return False
        self.nonfinite_steps = [*self.nonfinite_steps, step]
        limit = self.training.max_nonfinite_steps
        logger.warning(
            "step %d: the loss or gradient norm is not finite (%s); step skipped (%d in a row, limit %d)",
            step,
            ", ".join(f"{n} {float(v):.4g}" for n, v in parts.items()),
            len(self.nonfinite_steps),
            limit,
        )
        if len(self.nonfinite_steps) > limit:
            self.diverged(
                f"the loss or gradient norm was NaN/inf at steps {self.nonfinite_steps[0]}-{step}",
                "lower --training.lr, raise --training.warmup_steps or keep --training.max_grad_norm on",
            )
        return True

    def applied_nonfinite_step(self, step: int) -> None:
        """DeepSpeed took step `step` with a NaN/inf gradient norm (the loss was finite, so Kiln could not catch
        it before the engine stepped, and DeepSpeed's own overflow check did not skip it): the weights may now hold
        NaN/inf, so the run stops at once, exporting nothing."""
        self.diverged(
            f"DeepSpeed applied step {step} with a NaN/inf gradient norm",
            "turn on DeepSpeed's overflow check (bf16.check_grad_overflow), lower --training.lr or keep "
            "--training.max_grad_norm on",
        )

    def check_divergence(self, state: TrainState) -> None:
        """Stop the run once the loss of DIVERGENCE_STEPS optimizer steps in a row is far above its lowest value so
        far (training.divergence_factor): a run whose schedule decays the learning rate to 0 before the loss
        overflows must not be exported as if it had trained."""
        factor, loss = self.training.divergence_factor, self.step_loss
        if not factor or loss is None or self.nonfinite_steps or not math.isfinite(loss):
            return
        if state.lowest_loss is None or loss < state.lowest_loss:
            state.lowest_loss, state.lowest_loss_step = loss, state.global_step
        if loss <= max(factor * state.lowest_loss, state.lowest_loss + factor):
            self.high_loss_steps = []
            return
        self.high_loss_steps = [*self.high_loss_steps, state.global_step]
        if len(self.high_loss_steps) < DIVERGENCE_STEPS:
            return
        self.diverged(
            f"the loss rose from {state.lowest_loss:.4g} (step {state.lowest_loss_step}) to {loss:.4g} at steps "
            f"{self.high_loss_steps[0]}-{state.global_step} (more than --training.divergence_factor {factor:g} "
            "times its lowest)",
            "lower --training.lr or raise --training.warmup_steps",
        )

    def checkpoint_refusal(self) -> str | None:
        """Why no checkpoint may be saved now (the weights are not to be trusted: the last good one is kept);
        None: it may."""
        if self.nonfinite_steps:
            return "no checkpoint while the loss is not finite"
        if self.high_loss_steps:
            return "no checkpoint while the loss is far above its lowest"
        return None

    def diverged(self, what: str, advice: str) -> None:
        """The one error a diverged run ends with: `what` went wrong, the last good checkpoint, nothing exported,
        and the `advice`."""
        checkpoints = find_checkpoints(self.output_dir)
        kept = f"the last good checkpoint is {checkpoints[-1]}" if checkpoints else "no checkpoint was saved"
        raise RunError(
            f"training diverged: {what}; {kept}; no final model was exported; {advice}, then resume or start over"
        )


__all__ = ["DIVERGENCE_STEPS", "LossGuard"]

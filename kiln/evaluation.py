"""Evaluation during a run: the eval loader, a call that leaves training's random numbers as they were, and the
best model with early stopping.

An evaluation must be comparable across steps and invisible to training: it reads the same examples in the same
order every time (one loader, prepared once, a prefix of the eval set for training.max_eval_batches), with the
same masks (the eval collator's epoch reset), and it restores the RNG states afterwards, so a run evaluated at
step N trains on exactly as a run that was not (and a resumed run as the run it continues). Tracking the best
value of training.metric_for_best_model, and the evaluations since it improved, lives in the TrainState so a
resume keeps counting; this part only updates it.

    Trainer.evaluate ──▶ Evaluation.run(model)           -> {"eval/<name>": value}
    Trainer._track_best ──▶ Evaluation.update_best(metrics, state)  (then the callbacks' on_best)
                        ──▶ Evaluation.out_of_patience(state)   (early stopping)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, SequentialSampler, Subset

from .batch_order import with_example_index
from .config import TrainingConfig
from .errors import ConfigError
from .train_state import TrainState

Evaluator = Callable[[torch.nn.Module, DataLoader, Accelerator], dict[str, float]]
"""What an app measures: (prepared model, eval loader, accelerator) -> {metric name: value}."""


class Evaluation:
    """Runs the app's `evaluator` on `dataset` and keeps the best model's counters in the TrainState."""

    def __init__(
        self,
        accelerator: Accelerator,
        training: TrainingConfig,
        evaluator: Evaluator | None,
        dataset: Any,
        collator: Callable,
        train_collator: Callable,
    ):
        self.accelerator = accelerator
        self.training = training
        self.evaluator = evaluator
        self.dataset = dataset
        self.collator = collator
        # a collator shared with training keeps its epoch: resetting it would change training's masks
        self._reset = getattr(collator, "set_epoch", None) if collator is not train_collator else None
        self._loader: DataLoader | None = None

    def run(self, model: torch.nn.Module) -> dict[str, float]:
        """The evaluator's metrics as `eval/<name>` (none without an evaluator or an eval set), the model left in
        the mode it was in and the RNG states as they were."""
        if self.evaluator is None or self.dataset is None:
            return {}
        if self._reset is not None:
            self._reset(0)  # the same masks at every evaluation, so numbers are comparable across steps
        loader = self._eval_loader()
        was_training = model.training
        model.eval()
        # evaluation must not disturb the training RNG stream (dropout, masking) or resumed runs would diverge
        cpu_rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        try:
            with torch.no_grad():
                metrics = self.evaluator(model, loader, self.accelerator)
        finally:
            torch.set_rng_state(cpu_rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)
            model.train(was_training)
        return {f"eval/{k}": float(v) for k, v in metrics.items()}

    def _eval_loader(self) -> DataLoader:
        """Prepared once: every evaluation reads the same shards in the same order."""
        if self._loader is None:
            dataset = with_example_index(self.dataset, self.collator)
            if self.training.max_eval_batches:
                # a prefix of the eval set rather than breaking out of the loader: a loader left half-read stays
                # on accelerate's stack of active loaders and `gather_for_metrics` would not see its end. Its
                # size does not depend on the number of processes (they share it), so an evaluation reads the
                # same examples on any number of processes, and its numbers compare across an elastic resume
                limit = self.training.max_eval_batches * self.training.per_device_eval_batch_size
                dataset = Subset(dataset, range(min(len(dataset), limit)))
            self._loader = self.accelerator.prepare(
                DataLoader(
                    dataset,
                    batch_size=self.training.per_device_eval_batch_size,
                    sampler=SequentialSampler(dataset),
                    collate_fn=self.collator,
                )
            )
        return self._loader

    def update_best(self, metrics: dict[str, float], state: TrainState) -> bool:
        """Record the evaluation `metrics` against the best of training.metric_for_best_model in `state`: a new best,
        or one more evaluation without improvement. True when it is a new best; False when no metric is tracked."""
        name = self.training.metric_for_best_model
        if not name:
            return False
        key = name if name.startswith("eval/") else f"eval/{name}"
        if key not in metrics:
            raise ConfigError(
                f"metric_for_best_model '{name}' is not among the eval metrics: {sorted(metrics)}"
            )
        value = metrics[key]
        best = state.best_metric
        better = best is None or (value > best if self.training.greater_is_better else value < best)
        if better:
            state.best_metric, state.best_step = value, state.global_step
            state.evals_without_improvement = 0
        else:
            state.evals_without_improvement += 1
        return better

    def out_of_patience(self, state: TrainState) -> bool:
        """Whether training should stop early: training.early_stopping_patience evaluations without improvement."""
        patience = self.training.early_stopping_patience
        return (
            bool(self.training.metric_for_best_model)
            and bool(patience)
            and (state.evals_without_improvement >= patience)
        )


__all__ = ["Evaluation", "Evaluator"]

"""The one training loop of Kiln, shared by pretraining and fine-tuning: a loop plus parts, as torchtitan's train.py.

accelerate does the heavy lifting (devices, DDP/FSDP/DeepSpeed, mixed precision, accumulation, state saving);
the Trainer builds the optimizer, the schedule and each epoch's loader, takes the optimizer steps (exact loss
normalisation over an accumulation window, each micro-batch's own random numbers), logs, handles the stop signals
and the wall-clock budget, and calls its parts (docs/design.md, "The training loop"):

    checkpoints  kiln.checkpoint_manager.CheckpointManager: save, load from the resume plan, rotate
    loss_guard   kiln.loss_guard.LossGuard: NaN/inf steps skipped, divergence, the one error a diverged run ends with
    evaluation   kiln.evaluation.Evaluation: the eval loader, an RNG-preserving call, the best model, early stopping
    callbacks    kiln.callbacks: what a run does around the loop (trackers, best model, final export, Hub)
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, DistributedType
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm
from transformers import get_scheduler

from . import run_folder
from .batch_order import EpochPrefix, RandomOrder, micro_batch_seed, with_example_index
from .callbacks import RunEnd, TrainerCallback
from .checkpoint_manager import CheckpointManager
from .config import LoggingConfig, TrainingConfig
from .elastic import layout_of
from .errors import ConfigError
from .evaluation import Evaluation, Evaluator
from .long_run import LongRunNotice
from .loss_guard import LossGuard
from .nodes import writes_run_files
from .option_range import check_ranges
from .resume import ResumePlan
from .run_setup import optimizer_steps_per_epoch, release_output_lock
from .safe_write import open_file
from .throughput import LogWindow, count_real_tokens, format_metrics, guess_peak_flops
from .train_state import TrainState

logger = logging.getLogger("kiln")

LossItems = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor | int]]
"""Given a batch, how many items each loss part averages over: {"mlm_loss": masked tokens, "nsp_loss": rows}.
The keys name fields of the model output (`loss`, or parts such as `mlm_loss`); see `Trainer`."""


def count_loss_items(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor | int]:
    """Default: the loss is a mean over labelled tokens when labels are token-level integer ids (token
    classification, seq2seq targets; -100 = ignored), else a mean over the batch's rows (sequence labels)."""
    labels = batch.get("labels")
    if torch.is_tensor(labels) and labels.dim() >= 2 and not labels.is_floating_point():
        return {"loss": (labels != -100).sum()}
    return {"loss": _batch_rows(batch)}


def _batch_rows(batch: dict[str, torch.Tensor]) -> int:
    return int(next(v for v in batch.values() if torch.is_tensor(v)).shape[0])


def build_optimizer(
    model: torch.nn.Module, training: TrainingConfig, device: torch.device | None = None
) -> torch.optim.Optimizer:
    """AdamW without weight decay on biases and normalisation weights (every 1-D parameter).

    `device` is where the parameters will live once accelerate has prepared the model (the optimizer is built
    before `prepare` moves them): fused AdamW on CUDA and on CPU (one kernel over all parameters: 3.6x cheaper
    than foreach on CPU at 5M parameters, the same update to float rounding), foreach elsewhere."""
    decay, no_decay = [], []
    for _name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim < 2 else decay).append(param)
    groups = [
        {"params": decay, "weight_decay": training.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    target = torch.device(device) if device is not None else next(iter(decay + no_decay)).device
    fused = target.type in ("cuda", "cpu") and bool(decay)
    return torch.optim.AdamW(
        groups,
        lr=training.lr,
        betas=(training.adam_beta1, training.adam_beta2),
        eps=training.adam_epsilon,
        fused=fused or None,
        foreach=None if fused else True,
    )


# ----------------------------------------------------------------------------------------------------------
# the loop


class Trainer:
    """Train `model` on batches of `train_dataset(epoch)` collated by `collator`; evaluate with `evaluator`.

    The model must return an output with `.loss` when called on a batch. `metadata` is stored in every
    checkpoint and compared on resume (e.g. the model kind), so a checkpoint of another run is refused early.

    Loss normalisation: `loss_items(batch)` says how many items (labelled tokens, rows) each loss part of the
    model output averages over. Each optimizer step then minimises the per-item mean over everything its
    window holds, summed over accumulation steps and processes (what transformers' Trainer does with
    `num_items_in_batch`): accumulation 4 x batch 2, accumulation 1 x batch 8 and 2 processes x batch 4 take
    the same step, also when micro-batches hold different numbers of masked tokens, and a partial window at an
    epoch's end is one step over what it holds.

    `loss_weights`: the weight of each loss part in the objective (default 1), e.g. ELECTRA's lambda on the
    discriminator's loss. A part weighted 0 is only logged, as a per-item mean (e.g. an accuracy). Parts are
    logged unweighted; `train/loss` is the weighted sum the step minimises.
    """

    def __init__(
        self,
        accelerator: Accelerator,
        model: torch.nn.Module,
        *,
        training: TrainingConfig,
        logging_cfg: LoggingConfig,
        train_dataset: Callable[[int], Any],
        collator: Callable,
        eval_dataset: Any = None,
        eval_collator: Callable | None = None,
        evaluator: Evaluator | None = None,
        flops_per_token: float | None = None,
        metadata: dict[str, Any] | None = None,
        callbacks: Sequence[TrainerCallback] = (),
        num_workers: int = 0,
        loss_items: LossItems | None = None,
        loss_weights: dict[str, float] | None = None,
        run_config: Any = None,
        resume: ResumePlan | None = None,
    ):
        self.accelerator = accelerator
        self.training = training
        self.logging_cfg = logging_cfg
        self.train_dataset = train_dataset
        self.collator = collator
        self.flops_per_token = flops_per_token
        self.metadata = metadata or {}
        self.callbacks = list(callbacks)
        """Called at the points of the run's lifecycle, in this order (see kiln.callbacks)."""
        self.end: RunEnd | None = None
        """What the end-of-run callbacks found (the final folder, ...), once train() has run."""
        self.num_workers = num_workers
        # the collator that builds the labels knows what each loss part averages over (MLM: masked tokens)
        self.loss_items = loss_items or getattr(collator, "loss_items", None) or count_loss_items
        self.loss_weights = dict(loss_weights or {})
        self.run_config = run_config
        """The run's whole config (saved with each checkpoint, compared on resume); None: neither."""
        self.plan = resume
        """The checkpoint to continue from and everything decided about it (kiln.resume); None: a new run."""
        if training.resume_from_checkpoint and resume is None:
            raise ValueError(
                "a Trainer resumes from the plan kiln.resume.plan_resume makes (kiln.job.run_job)"
            )
        self.output_dir = Path(training.output_dir)
        self.state = TrainState()
        self._stop_signal: int | None = None
        self.stop_signals = 0
        """How many stop signals (SIGTERM, SIGINT) the run received; end-of-run callbacks watch it."""
        self._train_loader = None
        self._epoch_batches: int | None = None
        self._lengths_cache: tuple[Any, list[int]] | None = None
        self._window: LogWindow | None = None
        """The logging window: the optimizer steps since the last logged line (saved with every checkpoint)."""
        self.steps_per_epoch: int | None = None

        check_ranges(training, prefix="training.")  # a Trainer built in code, not through run_job's checks
        self._prepare(model)
        # the parts the loop calls, each owning its state (docs/design.md, "The training loop")
        self.checkpoints = CheckpointManager(
            accelerator,
            training,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            state=self.state,
            metadata=self.metadata,
            run_config=run_config,
        )
        self.loss_guard = LossGuard(accelerator, training, self.output_dir)
        self.evaluation = Evaluation(
            accelerator, training, evaluator, eval_dataset, eval_collator or collator, collator
        )

    def _prepare(self, model: torch.nn.Module) -> None:
        """Gradient checkpointing, AdamW, accelerate's prepare, the step count and the schedule."""
        training, accelerator = self.training, self.accelerator
        if training.gradient_checkpointing:
            enable = (
                getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            )
            enable()
        optimizer = build_optimizer(model, training, accelerator.device)
        self.model, self.optimizer = accelerator.prepare(model, optimizer)
        self.total_steps = self._total_steps()
        warmup = training.warmup_steps or math.ceil(training.warmup_ratio * self.total_steps)
        specific = {}
        if (
            training.lr_scheduler_type == "warmup_stable_decay"
        ):  # the one schedule with its own required lengths
            decay = math.ceil(training.decay_ratio * self.total_steps)
            specific = {"num_decay_steps": decay, "decay_type": training.decay_type}
        self.scheduler = get_scheduler(
            training.lr_scheduler_type,
            self.optimizer,
            num_warmup_steps=warmup,
            num_training_steps=self.total_steps,
            scheduler_specific_kwargs=specific,
        )

    # --- sizes --------------------------------------------------------------------------------------------

    def _train_dataloader(self, epoch: int) -> DataLoader:
        dataset = self.train_dataset(epoch)
        # a fresh generator per epoch: the order depends on (seed, epoch) only, so a resumed run sees the same order
        # and no draw from the global RNG (which drives dropout) is spent on it
        generator = torch.Generator().manual_seed(self.training.seed * 1000 + epoch)
        is_iterable = isinstance(dataset, torch.utils.data.IterableDataset)
        if not is_iterable:
            dataset = with_example_index(dataset, self.collator)
        sampler = None
        if not is_iterable:
            # whole global batches only: the epoch's order cut after its last whole global batch, so an epoch is
            # the same steps over the same examples on any number of processes x accumulation (see kiln.elastic)
            whole = optimizer_steps_per_epoch(len(dataset), self._global_batch()) * self._global_batch()
            sampler = EpochPrefix(self._train_sampler(dataset, generator), whole)
        loader = DataLoader(
            dataset,
            batch_size=self.training.per_device_train_batch_size,
            sampler=sampler,
            collate_fn=self.collator,
            drop_last=True,
            generator=generator,
            num_workers=self.num_workers,
        )
        # the data position is ours (seeded order + skip), so accelerate need not track the previous epoch's loader
        stale = self._train_loader
        if stale is not None and stale in getattr(self.accelerator, "_dataloaders", []):
            self.accelerator._dataloaders.remove(stale)
        self._train_loader = self.accelerator.prepare(loader)
        return self._train_loader

    def _train_sampler(self, dataset, generator: torch.Generator):
        if not self.training.group_by_length:
            return RandomOrder(dataset, generator=generator)
        from transformers.trainer_pt_utils import LengthGroupedSampler

        return LengthGroupedSampler(
            self.training.per_device_train_batch_size, lengths=self._lengths(dataset), generator=generator
        )

    def _lengths(self, dataset) -> list[int]:
        """Tokens per example (cached per dataset: fine-tuning trains on the same one every epoch). A dataset that
        knows its lengths (a prepared corpus's: from its plan over the mapped shards) is not read."""
        inner = getattr(dataset, "dataset", dataset)  # the example-indexed wrapper
        if self._lengths_cache is None or self._lengths_cache[0] is not inner:
            if callable(getattr(inner, "lengths", None)):
                self._lengths_cache = (inner, inner.lengths().tolist())
            else:
                if hasattr(inner, "column_names") and "input_ids" in inner.column_names:
                    ids = inner.with_format(None)["input_ids"]  # one column read, no per-row Python access
                else:
                    ids = [row["input_ids"] for row in inner]
                self._lengths_cache = (inner, [len(row) for row in ids])
        return self._lengths_cache[1]

    def _global_batch(self) -> int:
        return layout_of(self.training, self.accelerator.num_processes).global_batch

    def _total_steps(self) -> int:
        dataset = self.train_dataset(0)
        streaming = isinstance(dataset, torch.utils.data.IterableDataset)
        steps = None if streaming else optimizer_steps_per_epoch(len(dataset), self._global_batch())
        if steps == 0:
            raise ConfigError(
                f"the training set ({len(dataset)} examples) is smaller than one global batch of "
                f"{layout_of(self.training, self.accelerator.num_processes).describe()}; lower the batch size or "
                "the accumulation, or add data"
            )
        self.steps_per_epoch = steps
        if self.training.max_steps > 0:
            return self.training.max_steps
        if streaming:
            raise ConfigError("a streaming dataset has no length: set --training.max_steps")
        epochs = self.training.num_train_epochs
        whole = int(epochs)
        # a fractional epoch (e.g. 1.5) trains the whole epochs, then that fraction of the next one's steps
        return whole * self.steps_per_epoch + math.ceil((epochs - whole) * self.steps_per_epoch)

    # --- checkpoints and evaluation: the parts that own them -------------------------------------------

    def save_checkpoint(self) -> Path | None:
        """A checkpoint of this step (`kiln.checkpoint_manager`), then the callbacks' on_save; None while the loss
        guard does not trust the weights (the last checkpoint stays the last good one)."""
        refusal = self.loss_guard.checkpoint_refusal()
        if refusal is not None:
            logger.warning("step %d: %s", self.state.global_step, refusal)
            return None
        folder = self.checkpoints.save(self._window)
        for callback in self.callbacks:
            callback.on_save(self, folder, self.state)
        return folder

    def resume(self, plan: ResumePlan) -> Path:
        """Continue from the checkpoint `plan` names, or, for a `latest` whose state turns out damaged, from the
        next older one (`CheckpointManager.load`); returns the folder resumed."""
        self.plan, window = self.checkpoints.load(plan, self.total_steps, self.steps_per_epoch)
        if window is not None:
            self._window = window
        return self.plan.folder

    def evaluate(self) -> dict[str, float]:
        """The evaluator's metrics on the eval set as `eval/<name>` (`kiln.evaluation`); {} without either."""
        return self.evaluation.run(self.model)

    def _track_best(self, metrics: dict[str, float]) -> bool:
        """Update the best metric (the callbacks' on_best when it improved) and patience; True when training
        should stop early."""
        if self.evaluation.update_best(metrics, self.state):
            for callback in self.callbacks:
                callback.on_best(self, self.state)
        return self.evaluation.out_of_patience(self.state)

    # --- logging ------------------------------------------------------------------------------------------

    def _log(self, metrics: dict[str, float]) -> None:
        entry = {"step": self.state.global_step, **metrics}
        self.state.history.append(entry)
        if self.accelerator.is_main_process and self.accelerator.trackers:
            self.accelerator.log(metrics, step=self.state.global_step)
        if self.accelerator.is_main_process:
            with open_file(self.output_dir / "metrics.jsonl", "a") as fh:
                fh.write(json.dumps(entry) + "\n")
            # the trackers' files (TensorBoard flushes at each log) and the rows, on the run folder's record
            run_folder.record_files(self.output_dir, "metrics.jsonl", "logs", append=True)

    # --- stopping -----------------------------------------------------------------------------------------

    def _install_signal_handlers(self):
        from . import signals

        previous = {}

        def handler(signum, _frame):
            self._stop_signal = signum
            signals.STOPPING = True  # repeats of this signal after the loop are absorbed (kiln.signals)
            self.stop_signals += 1

        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                previous[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread (e.g. inside a notebook executor): no handler
                pass
        if signals.PENDING_SIGNAL is not None:  # a SIGTERM during set-up whose SignalStop was swallowed
            self._stop_signal, signals.PENDING_SIGNAL = signals.PENDING_SIGNAL, None
            self.stop_signals += 1
        return previous

    def _agreed_stop(self, elapsed: float) -> str | None:
        """All processes must stop at the same step, so the local reasons are combined with a max-reduce."""
        reason = 0
        if self._stop_signal is not None:
            reason = 2
        elif self.training.max_train_time_s and elapsed >= self.training.max_train_time_s:
            reason = 1
        if self.accelerator.num_processes > 1:
            flag = torch.tensor([reason], device=self.accelerator.device)
            reason = int(self.accelerator.gather(flag).max())
        return {0: None, 1: "time_budget", 2: "signal"}[reason]

    # --- train --------------------------------------------------------------------------------------------

    def train(self) -> TrainState:
        """The whole run: callbacks' on_train_begin, resume, the epochs, the final evaluation, on_train_end.

        Whatever ends the run (the last step, a signal, an exception, a divergence, a disk fault), every
        callback's on_train_end runs, in order; then the error that ended it is raised."""
        previous_handlers: dict = {}
        progress = None
        try:
            for callback in self.callbacks:
                callback.on_train_begin(self)
            if writes_run_files(self.accelerator, self.training):
                self.output_dir.mkdir(parents=True, exist_ok=True)
            self.checkpoints.remove_partial()
            if self.plan is not None:
                self.resume(self.plan)
            if self.accelerator.is_main_process and self.run_config is not None:
                self.checkpoints.data_fingerprint()  # the data as this run read it, saved with every checkpoint
            self._print_summary()
            previous_handlers = self._install_signal_handlers()
            with logging_redirect_tqdm(loggers=[logging.getLogger()]):  # log lines above the bar, not on it
                progress = tqdm(
                    total=self.total_steps,
                    initial=self.state.global_step,
                    disable=not self.accelerator.is_local_main_process,
                    desc="train",
                    dynamic_ncols=True,
                )
                self._run_epochs(progress)
                progress.close()
            if self.state.stop_reason != "signal":
                self._final_evaluation()
        except BaseException as failure:
            if progress is not None:
                progress.close()
            self._end_run(failure)
            raise
        else:
            # a signal from here on is held until the final evaluation, export and push are done (bounded): the
            # run then ends as completed rather than leaving no final/ and no checkpoint of its last steps
            state = self._end_run()
            if self._stop_signal is not None and state.stop_reason != "signal" and not self.end.handed_off:
                self.accelerator.print("a stop signal came after the last step; the run was completed first")
            return state
        finally:
            for sig, handler in previous_handlers.items():
                signal.signal(sig, handler)
            release_output_lock(self.output_dir)

    def _run_epochs(self, progress) -> None:
        """The loop: an optimizer step per accumulation window, epoch after epoch, until the step count, the epochs,
        early stopping, the clock or a signal ends the run."""
        training, state, log_every = self.training, self.state, self.logging_cfg.logging_steps
        self.model.train()
        if self._window is None:  # else: the resumed checkpoint's
            self._window = LogWindow()
        # a long run says so once its first steps are timed on this machine, with the flag for a short first try
        long_run = LongRunNotice(self.total_steps, training.max_train_time_s or None)
        run_start = time.perf_counter() - state.train_time_s
        while state.global_step < self.total_steps:
            loader = self._epoch_loader()
            for micro_batches in _windows(loader, training.gradient_accumulation_steps):
                parts, grad_norm, tokens = self._optimizer_step(micro_batches)
                state.batches_in_epoch += len(micro_batches)
                state.global_step += 1
                state.tokens_seen += tokens
                self._window.add(parts, tokens)
                progress.update(1)
                notice = long_run.after_step(state.global_step, state.train_time_s)
                if notice and self.accelerator.is_main_process:
                    logger.info(notice)
                if state.global_step % log_every == 0 or state.global_step >= self.total_steps:
                    self._log_training(grad_norm, progress)
                self.loss_guard.check_divergence(state)
                state.train_time_s = time.perf_counter() - run_start
                if self._after_step(progress):
                    # stopped inside the epoch: take its loader off accelerate's stack of active loaders
                    getattr(loader, "end", lambda: None)()
                    return
            state.epoch, state.batches_in_epoch = state.epoch + 1, 0
            if training.max_steps < 0 and state.epoch >= math.ceil(training.num_train_epochs):
                state.stop_reason = state.stop_reason or "epochs"
                return

    def _log_training(self, grad_norm, progress) -> None:
        """The logging window's training metrics (one line, one metrics.jsonl row); a new window starts."""
        metrics = self._train_metrics(self._window, grad_norm, self._epoch_batches)
        self._log(metrics)
        progress.set_postfix(loss=f"{metrics['train/loss']:.4f}", lr=f"{metrics['train/lr']:.2e}")
        self._window = LogWindow()

    def _after_step(self, progress) -> bool:
        """Evaluate, stop and checkpoint as the step count, the clock and signals say; True when done."""
        training, state = self.training, self.state
        done = state.global_step >= self.total_steps
        stop = self._agreed_stop(state.train_time_s)
        if training.eval_steps and state.global_step % training.eval_steps == 0 and not done:
            eval_metrics = self.evaluate()
            if eval_metrics:
                self._log(eval_metrics)
                progress.write(format_metrics(state.global_step, eval_metrics))
                if self._track_best(eval_metrics):
                    state.stop_reason = "early_stopping"
                    done = True
        if done or stop or (training.save_steps and state.global_step % training.save_steps == 0):
            if stop:
                state.stop_reason = stop
                done = True
            elif done and not state.stop_reason:
                state.stop_reason = "max_steps" if training.max_steps > 0 else "epochs"
            if training.save_steps or stop:
                self.save_checkpoint()
        return done

    def _final_evaluation(self) -> None:
        final_metrics = self.evaluate()
        if final_metrics:
            self._log(final_metrics)
            if self.accelerator.is_main_process:
                print(format_metrics(self.state.global_step, final_metrics))
            self._track_best(final_metrics)

    def _end_run(self, failure: BaseException | None = None) -> TrainState:
        """The callbacks' on_train_end, in order, each one even when an earlier one failed; then the error one of
        them left (trackers are closed by now). `failure`: what ended the run early (the caller re-raises it)."""
        self.end = RunEnd(card_state=self.state, failure=failure)
        for callback in self.callbacks:
            try:
                callback.on_train_end(self, self.end)
            except BaseException as err:
                if self.end.failure is not None:  # the first failure is the one reported
                    logger.error(
                        "%s.on_train_end failed after the run had failed: %s", type(callback).__name__, err
                    )
                    continue
                self.end.failure = err
        if failure is None and self.end.failure is not None:
            raise self.end.failure
        if failure is None and self.end.error is not None:
            raise self.end.error
        return self.state

    def _epoch_loader(self):
        """This epoch's prepared loader, positioned after the batches a resumed run already consumed."""
        state = self.state
        loader = self._train_dataloader(state.epoch)
        self._epoch_batches = _length(loader)
        set_epoch = getattr(self.collator, "set_epoch", None)
        if set_epoch is not None:
            # map-style skipping never fetches the skipped batches; iterable skipping collates then drops them,
            # which advances the collator's batch counter by itself
            streaming = isinstance(loader.dataset, torch.utils.data.IterableDataset)
            set_epoch(state.epoch, start_batch=0 if streaming else state.batches_in_epoch)
        if state.batches_in_epoch:
            loader = self.accelerator.skip_first_batches(loader, state.batches_in_epoch)
        return loader

    def _optimizer_step(self, micro_batches: list[dict]) -> tuple[dict[str, torch.Tensor], Any, int]:
        """One optimizer step over an accumulation window (possibly partial, at an epoch's end).

        The window is read in full first, so the number of items (e.g. masked tokens) every loss part averages
        over is known for the whole window across all processes before the first backward: each micro-batch
        contributes sum(its per-item losses) / (items in the window), and the gradients add up to the gradient
        of the window's per-item mean. Returns the window's loss parts (global means), the gradient norm and
        the number of real (non-padding) tokens it trained on, summed over processes.
        """
        acc, model = self.accelerator, self.model
        local = [{name: float(count) for name, count in self.loss_items(b).items()} for b in micro_batches]
        names = sorted({name for counts in local for name in counts})
        real_tokens = sum(count_real_tokens(b) for b in micro_batches)
        window_counts = [sum(counts.get(name, 0.0) for counts in local) for name in names]
        # one small all-reduce per step: the items of the whole window on every process, and its real tokens
        totals = acc.reduce(
            torch.tensor([*window_counts, float(real_tokens)], device=acc.device), reduction="sum"
        )
        global_counts = dict(zip(names, totals[:-1].tolist()))
        # accelerate divides by its accumulation steps and DDP/FSDP/DeepSpeed average over processes: undo both,
        # so the gradient is that of the global per-item mean
        scale = acc.gradient_accumulation_steps * acc.num_processes
        parts = {n: torch.zeros((), device=acc.device) for n in names}
        # DeepSpeed takes its optimizer step inside the window's last `backward` (accelerate calls engine.step()
        # there) and accumulates inside its engine, so a non-finite loss must be caught before its own backward:
        # after it, nothing is left to skip
        deepspeed = acc.distributed_type == DistributedType.DEEPSPEED
        step = self.state.global_step + 1
        for i, (batch, counts) in enumerate(zip(micro_batches, local)):
            last = i == len(micro_batches) - 1
            acc.sync_gradients = last
            with contextlib.nullcontext() if last else acc.no_sync(model), self._micro_batch_rng(step, i):
                outputs = model(**batch)
                objective = None
                for name in names:
                    items = counts.get(name, 0.0)
                    value = outputs.get(name) if hasattr(outputs, "get") else getattr(outputs, name, None)
                    if not items or value is None:
                        continue  # e.g. no masked token in this micro-batch: its mean would be NaN
                    term = value * (items / global_counts[name])
                    parts[name] = parts[name] + term.detach()
                    weight = self.loss_weights.get(name, 1.0)
                    if not weight:
                        continue  # logged only
                    term = term * weight if weight != 1.0 else term
                    objective = term if objective is None else objective + term
                if objective is None:  # nothing to learn from here; keep every process's backward in step
                    objective = sum(p.sum() for p in model.parameters() if p.requires_grad) * 0.0
                if deepspeed and self.loss_guard.is_nonfinite(parts):
                    # neither this backward nor the rest of the window's: the engine does not step, and no NaN/inf
                    # gradient enters its buffers (the finite micro-batches before this one stay there and count
                    # towards the next step; with no accumulation there are none)
                    acc.sync_gradients = True
                    self.loss_guard.skip_nonfinite(parts, None, step)
                    self._add_total(parts)
                    return parts, float("nan"), int(totals[-1])
                acc.backward(objective * scale)
        max_norm = self.training.max_grad_norm if self.training.max_grad_norm > 0 else float("inf")
        grad_norm = acc.clip_grad_norm_(model.parameters(), max_norm)
        if self.loss_guard.skip_nonfinite(parts, grad_norm, step):
            if deepspeed and not acc.optimizer_step_was_skipped:
                self.loss_guard.applied_nonfinite_step(step)
            self.optimizer.zero_grad(set_to_none=True)
            self._add_total(parts)
            return parts, grad_norm, int(totals[-1])
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if not acc.optimizer_step_was_skipped:  # fp16 overflow: no step taken, so the schedule does not move
            self.scheduler.step()
        self._add_total(parts)
        return parts, grad_norm, int(totals[-1])

    @contextlib.contextmanager
    def _micro_batch_rng(self, step: int, index: int):
        """The random numbers of one micro-batch's forward and backward (dropout, ELECTRA's sampling): from (seed,
        optimizer step, the micro-batch's slot in the global batch), not from the process that runs it. Micro-batch
        `index` of process p is slot index x processes + p, the same examples in any layout with this per-device
        batch (accelerate hands process p batches p, p + N, ...), so N processes x accumulation A and M x A' draw
        the same dropout for the same examples. The global RNG is forked around it and left as it was."""
        acc = self.accelerator
        slot = index * acc.num_processes + acc.process_index
        device = acc.device
        devices = [] if device.type in ("cpu", "mps") else [device.index if device.index is not None else 0]
        with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
            torch.manual_seed(micro_batch_seed(self.training.seed, step, slot))
            yield

    def _add_total(self, parts: dict[str, torch.Tensor]) -> None:
        """`loss`: the weighted sum of the parts, the total the model optimises (e.g. MLM + NSP)."""
        if "loss" not in parts and parts:
            parts["loss"] = sum(value * self.loss_weights.get(name, 1.0) for name, value in parts.items())

    def _train_metrics(self, window: LogWindow, grad_norm, epoch_batches: int | None) -> dict[str, float]:
        acc, state = self.accelerator, self.state
        names = sorted(window.sums)
        # each process holds its share of every step's global mean: the sum over processes is the mean
        means = acc.reduce(torch.stack([window.sums[n] for n in names]), reduction="sum") / window.steps
        elapsed = max(time.perf_counter() - window.start, 1e-9)
        metrics = {f"train/{name}": value for name, value in zip(names, means.tolist())}
        metrics.update(
            {
                "train/lr": self.scheduler.get_last_lr()[0],
                "train/grad_norm": float(grad_norm),
                "train/tokens_per_s": window.tokens / elapsed,
                "train/epoch": state.epoch + state.batches_in_epoch / epoch_batches
                if epoch_batches
                else state.epoch,
            }
        )
        mfu = self._mfu(metrics["train/tokens_per_s"])
        if mfu is not None:
            metrics["train/mfu"] = mfu
        return metrics

    def _print_summary(self) -> None:
        """What transformers' Trainer prints before training: enough to review how a run was set up."""
        acc, training = self.accelerator, self.training
        if not acc.is_main_process:
            return
        dataset = self.train_dataset(self.state.epoch)
        examples = (
            "streaming" if isinstance(dataset, torch.utils.data.IterableDataset) else f"{len(dataset):,}"
        )
        global_batch = (
            training.per_device_train_batch_size * acc.num_processes * training.gradient_accumulation_steps
        )
        seq_len = getattr(dataset, "max_seq_length", None) or getattr(self, "max_seq_length", None)
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        epochs = training.num_train_epochs if training.max_steps < 0 else "until max_steps"
        lines = [
            f"examples = {examples}",
            f"epochs = {epochs}"
            + (f" ({self.steps_per_epoch} optimizer steps each)" if self.steps_per_epoch else ""),
            f"per-device batch = {training.per_device_train_batch_size}",
            f"processes = {acc.num_processes} ({_distribution(acc)}, mixed precision {acc.mixed_precision})",
            f"device = {_device(acc)}",
            f"gradient accumulation = {training.gradient_accumulation_steps}",
            f"global batch = {global_batch} sequences"
            + (f" (<= {global_batch * seq_len:,} tokens)" if seq_len else ""),
            f"optimizer steps = {self.total_steps}"
            + (f" (resuming at {self.state.global_step})" if self.state.global_step else ""),
            f"trainable parameters = {trainable:,}",
        ]
        logger.info("training:\n  " + "\n  ".join(lines))

    def _mfu(self, tokens_per_s: float) -> float | None:
        peak = self.logging_cfg.peak_flops or guess_peak_flops(
            self.accelerator.device, self.accelerator.mixed_precision
        )
        if not peak or not self.flops_per_token:
            return None
        return tokens_per_s * self.flops_per_token / (peak * self.accelerator.num_processes)


def _windows(loader, size: int):
    """The loader's micro-batches, `size` at a time: one optimizer step's accumulation window each (the last of an
    epoch may hold fewer)."""
    batches = iter(loader)
    while micro_batches := list(itertools.islice(batches, size)):
        yield micro_batches


def _length(loader) -> int | None:
    try:
        return len(loader)
    except TypeError:  # iterable (streaming) datasets have no length
        return None


def _device(accelerator: Accelerator) -> str:
    """The device each process trains on; on CPU with its torch thread count (what a CPU run's speed follows)."""
    device = accelerator.device
    if device.type != "cpu":
        return str(device)
    threads = torch.get_num_threads()
    return f"cpu, {threads} thread{'' if threads == 1 else 's'} per process"


def _distribution(accelerator: Accelerator) -> str:
    kind = accelerator.distributed_type.value
    return "no data parallelism" if kind == "NO" else kind


__all__ = [
    "Evaluator",
    "TrainState",
    "Trainer",
    "build_optimizer",
    "count_loss_items",
]

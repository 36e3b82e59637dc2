"""The engine's one entrance: an app hands `run_job` a `TrainingJob` (its config and how to build the run's parts)
and the engine runs all of it.

    run_job(job)
      the run's copy of the config (`run_copy`: what the engine derives goes there) -> the engine's sections
      checked (training, logging, hub) -> a local resume planned (kiln.resume.plan_resume: the checkpoint, its
      files verified, its kind, its batch layout and the one this run takes) -> accelerator, batch size, logging,
      seed (kiln.run_setup.start_run) -> output folder checked (kiln.run_folder) -> W&B and the Hub asked
      whether they take the run (kiln.run_setup.check_services) -> the resume checked on every process (config
      and data changes, kiln.resume.check_plan) -> output folder prepared when the app writes into it while
      building -> job.build(accelerator, the run's copy of the config): the app's model, data, metrics and callbacks -> the evaluation
      interval of one epoch -> output folder prepared and locked (config.yaml written) -> a `hub:` checkpoint
      downloaded, then planned and checked as a local one -> Trainer: trackers, resume from the plan, summary,
      loop, evaluation, final export, Hub, every callback ended whatever ends the run

An app never calls the steps itself, so the rules for output folders and resume live here, once. A run that only
predicts (fine-tuning's --predict) has no folder to keep and nothing to resume: it calls `start_predicting`.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accelerate import Accelerator

    from .callbacks import TrainerCallback
    from .export import ModelCardFacts
    from .resume import ResumePlan
    from .trainer import Trainer


@dataclass
class RunParts:
    """What an app builds for a run (`TrainingJob.build`): the model and its data, how to evaluate it, what the final
    folder and its card say, and the app's own callbacks."""

    model: Any
    tokenizer: Any
    """Saved next to the final weights: anything with save_pretrained(folder)."""
    card: ModelCardFacts
    """The model card's facts from the app's sections (hub.model_id, hub.license and hub.dataset_name
    are filled in by the engine)."""
    train_dataset: Callable[[int], Any]
    """epoch -> the training examples of that epoch."""
    collator: Callable
    eval_dataset: Any = None
    eval_collator: Callable | None = None
    evaluator: Callable | None = None
    """(model, loader, accelerator) -> metrics; see kiln.evaluation.Evaluator."""
    flops_per_token: float | None = None
    metadata: dict = field(default_factory=dict)
    """Known once built (task, number of labels, ...): with TrainingJob.metadata, stored in every checkpoint and
    compared on resume."""
    callbacks: Sequence[TrainerCallback] = ()
    """The app's callbacks; their on_train_end runs before the engine's final export, Hub push and trackers' end."""
    num_workers: int = 0
    loss_weights: dict[str, float] | None = None


@dataclass
class TrainingJob:
    """What an app hands the engine."""

    config: Any
    """The app's whole config: the engine's sections (training, logging, hub) and the app's own (model, data, ...);
    saved as output_dir/config.yaml and with every checkpoint, compared with the checkpoint's on resume."""
    build: Callable[[Accelerator, Any], RunParts]
    """(accelerator, config) -> the run's parts, built once the accelerator is started and seeded (new weights are
    drawn from the seed). `config` is the run's copy of `config`: what the app derives while building (a task's
    default best-model metric) goes there, where the engine reads it, and the user's object stays as given."""
    metadata: dict = field(default_factory=dict)
    """What is known of the run before it is built (pretraining: model kind and objective): a resume checkpoint
    written with other values is refused before any tokenizer or data work; stored in every checkpoint."""
    output_before_build: bool = False
    """Prepare the output folder before `build` (pretraining trains its tokenizer into output_dir/tokenizer);
    False: only once the model and data are built, so a bad input leaves no half-made run behind."""
    eval_each_epoch: bool | None = None
    """Fine-tuning (True or False): a training set smaller than one batch is refused before the output folder is
    touched, and True evaluates (and keeps the best model) after every epoch: training.eval_steps becomes one
    epoch's optimizer steps. None: neither (pretraining counts steps)."""
    model_width: int | None = None
    """The model's hidden size, when the app knows it before the build: a run naming no precision on a CPU with bf16
    units then trains in bf16 from the width where bf16 measured faster (kiln.precision). None: fp32 as ever."""


def start_predicting(config: Any) -> Accelerator:
    """The start of a run that only predicts (fine-tuning's --predict: no output folder to keep, nothing to
    resume): the engine's sections checked, then the accelerator, the per-device batch, the log format and the
    seed (kiln.run_setup.start_run), as run_job starts."""
    from .config import validate_run_sections
    from .run_setup import start_run

    validate_run_sections(config)
    return start_run(config.training, config.logging)


def run_job(job: TrainingJob) -> Trainer:
    """Run `job` from start to end (module docstring); returns the finished Trainer (its state, its end, its
    callbacks). Whatever ends the run, every callback's on_train_end has run; the error that ended it is raised."""
    from .callbacks import FinalExport, HubSync, Trackers
    from .config import validate_run_sections
    from .elastic import launched_processes
    from .resume import (
        HUB_FOLDER,
        check_metadata,
        check_plan,
        is_hub,
        launched_as_main,
        plan_resume,
    )
    from .run_setup import (
        check_output_folder,
        check_services,
        prepare_output,
        start_run,
        use_downloaded_layout,
    )
    from .trainer import Trainer

    # what the engine derives is written into the run's copy, never into the user's config
    config = run_copy(job.config)
    training = config.training
    validate_run_sections(config)
    spec = training.resume_from_checkpoint
    plan = None
    if spec and not is_hub(spec):
        # every decision about the resume, before the Accelerator: it takes the plan's batch layout
        plan = plan_resume(config, launched_processes(), job.metadata, main_process=launched_as_main())
        take_layout(training, plan)
    accelerator = start_run(
        training,
        config.logging,
        model_width=job.model_width,
        resumed_config=plan.saved_config if plan else None,
        elastic=plan.elastic if plan else None,
    )
    check_output_folder(
        training, accelerator, config
    )  # a folder the run may not write into: refused before anything
    check_services(config, accelerator)  # W&B and the Hub take this run: said before anything is built
    if plan is not None:  # a changed run is refused before the output folder is touched
        plan = check_plan(plan, accelerator, config)
    # pretraining writes its tokenizer into the folder while building; the others prepare it after the build
    out = prepare_output(config, accelerator) if job.output_before_build else None
    parts = job.build(accelerator, config)
    if job.eval_each_epoch is not None:
        evaluate_each_epoch(training, parts.train_dataset(0), accelerator.num_processes, job.eval_each_epoch)
    if out is None:
        out = prepare_output(config, accelerator)
    card = dataclasses.replace(parts.card, model_id=config.hub.model_id, license=config.hub.license)
    if config.hub.dataset_name:  # the user's own name for the corpus replaces the data files' names
        card = dataclasses.replace(card, datasets=[config.hub.dataset_name])
    hub_sync = HubSync(config.hub, parts.tokenizer)
    metadata = {**job.metadata, **parts.metadata}
    if is_hub(spec):
        # downloaded into the prepared run folder, then planned as a local checkpoint is
        folder = hub_sync.fetch(accelerator, training, spec, str(Path(training.output_dir) / HUB_FOLDER))
        plan = plan_resume(
            config,
            accelerator.num_processes,
            metadata,
            main_process=accelerator.is_main_process,
            folder=folder,
        )
        take_layout(training, plan)
        use_downloaded_layout(accelerator, training, plan.elastic)
        plan = check_plan(plan, accelerator, config)
    elif plan is not None:
        check_metadata(plan, parts.metadata)  # what the app knows once built (a task, its number of labels)
    trainer = Trainer(
        accelerator,
        parts.model,
        training=training,
        logging_cfg=config.logging,
        train_dataset=parts.train_dataset,
        collator=parts.collator,
        eval_dataset=parts.eval_dataset,
        eval_collator=parts.eval_collator,
        evaluator=parts.evaluator,
        flops_per_token=parts.flops_per_token,
        loss_weights=parts.loss_weights,
        metadata=metadata,
        resume=plan,
        # on_train_end runs in this order: the app's (best model, final scores), export, push and wait, trackers
        callbacks=[
            *parts.callbacks,
            FinalExport(Path(out) / "final", parts.tokenizer, card),
            hub_sync,
            Trackers(config.logging),
        ],
        num_workers=parts.num_workers,
        run_config=config,
    )
    trainer.train()
    _let_gloo_finish_its_work(accelerator)
    return trainer


def run_copy(config: Any) -> Any:
    """The run's own copy of the user's `config`. What the engine derives (a resume's batch layout, the precision,
    the per-device batch of a total, the evaluation interval of an epoch) is written into the copy, which
    config.yaml and every checkpoint record, never into the user's object."""
    run = copy.copy(config)
    run.training = copy.copy(config.training)
    return run


def take_layout(training: Any, plan: ResumePlan) -> None:
    """The run's `training` section (its copy) takes the per-device batch and accumulation the plan decided."""
    training.per_device_train_batch_size = plan.layout.per_device_train_batch_size
    training.gradient_accumulation_steps = plan.layout.gradient_accumulation_steps


def _let_gloo_finish_its_work(accelerator: Accelerator, seconds: float = 0.5) -> bool:
    """In a multi-process gloo run, wait a moment without the GIL before the caller drops the trainer (returns
    whether it waited).

    Dropping the trainer frees DDP's reducer, the last holder of the gloo process group; its destructor joins
    gloo's worker threads while holding the GIL. A worker may still be freeing a finished collective whose tensors
    were made in Python (an all_gather that a later barrier kept a reference to), which needs the GIL: both wait
    forever. py-spy caught exactly this, one rank of a 2-process CPU run hung after writing final/ under load
    (`~ProcessGroupGloo` joining, the worker in `~AsyncAllgatherWork` waiting for the GIL). The process group is
    already shut down here (the trackers' end_training), so no new work can start; a sleep gives the workers
    the GIL to finish what they hold. It is a mitigation, not a guarantee: Python cannot see when they are done."""
    import time

    if accelerator.num_processes < 2 or getattr(accelerator.state, "backend", None) != "gloo":
        return False
    time.sleep(seconds)  # releases the GIL
    return True


def evaluate_each_epoch(training, train_dataset, num_processes: int, each_epoch: bool) -> None:
    """Refuse a training set smaller than one batch; with `each_epoch`, evaluate after every epoch."""
    from .errors import ConfigError
    from .run_setup import optimizer_steps_per_epoch

    global_batch = training.per_device_train_batch_size * num_processes * training.gradient_accumulation_steps
    steps_per_epoch = optimizer_steps_per_epoch(len(train_dataset), global_batch)
    if steps_per_epoch == 0:
        raise ConfigError(
            f"the training split ({len(train_dataset)} examples) is smaller than one global batch of {global_batch} "
            f"({training.per_device_train_batch_size} per device x {num_processes} process(es) x "
            f"{training.gradient_accumulation_steps} accumulation step(s)); lower the batch size or add data"
        )
    if each_epoch:
        training.eval_steps = steps_per_epoch


__all__ = ["RunParts", "TrainingJob", "evaluate_each_epoch", "run_copy", "run_job", "start_predicting"]

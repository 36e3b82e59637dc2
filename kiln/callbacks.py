"""What a run does around the loop, as callbacks the Trainer calls (like transformers' `TrainerCallback`).

The Trainer owns the run's lifecycle; an app (pretrain/run.py, the fine-tuning runner) only picks the callbacks
and hands each the one config section it needs:

    Trainer.train()
      on_train_begin   Trackers: start wandb/tensorboard          HubSync: open the pusher
      ... loop ...
      on_save          HubSync: push the model (and the resumable state) by hub.strategy
      on_best          BestModel: save the best weights in output_dir/best
      on_train_end     (in list order, sharing one RunEnd; also when an error, a divergence or a signal ended
                        the run: then RunEnd.completed is False and nothing is exported)
                       BestModel: load the best weights back      FinalExport: output_dir/final + model card
                       HubSync: push final/, wait for the pushes  Trackers: close the trackers
      RunEnd.failure (what ended the run) or RunEnd.error raised, once every callback has run

`HubSync.fetch` downloads a `hub:user/name` checkpoint for kiln.job.run_job, which plans its resume (kiln.resume).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .config import HubConfig, LoggingConfig, flatten
from .train_state import TrainState

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator

    from .config import TrainingConfig
    from .export import ModelCardFacts

logger = logging.getLogger("kiln")

SIGNAL_GRACE_S = 5.0
"""After a stop signal, how long queued Hub pushes may still take before they are handed to the user."""


class RunningTrainer(Protocol):
    """What a callback sees of the Trainer that calls it (`kiln.trainer.Trainer`), described here so that this
    module needs no import of the Trainer, which imports this one."""

    accelerator: Accelerator
    model: torch.nn.Module
    """The prepared model (wrapped by accelerate)."""
    training: TrainingConfig
    run_config: Any
    """The app's whole config (its dataclass: sections training, logging, hub, model, data, ...)."""
    output_dir: Path
    state: TrainState
    stop_signals: int
    """How many stop signals (SIGTERM, SIGINT) the run received."""


@dataclass
class RunEnd:
    """What the end-of-run callbacks hand each other, in the order they are listed, and the Trainer keeps."""

    card_state: TrainState
    """The state the model card describes (BestModel appends the best evaluation when it loads the best weights)."""
    summary: dict[str, Any] = field(default_factory=dict)
    """Facts for the model card found at the end (the best model, test metrics), after the app's own."""
    final_dir: Path | None = None
    """The exported model folder (None when the run stopped on a signal)."""
    error: Exception | None = None
    """Raised by the Trainer once every callback has run, so trackers are closed first."""
    failure: BaseException | None = None
    """What ended the run before it completed (an exception in the loop, a divergence, a disk fault, or an
    error in an earlier on_train_end); re-raised by the Trainer once every callback has run."""
    handed_off: list[str] = field(default_factory=list)
    """Commands printed for the user to finish what a stop signal interrupted (`hf upload ...`)."""

    @property
    def completed(self) -> bool:
        """Whether the run trained to its end (no failure, no stop signal): only then is there a model to export."""
        return self.failure is None and self.card_state.stop_reason != "signal"


class TrainerCallback:
    """Hooks of a run's lifecycle; a callback overrides those it needs. `trainer.model` is the prepared model."""

    def on_train_begin(self, trainer: RunningTrainer) -> None:
        """Once the model is prepared, before a resume and the first step."""

    def on_save(self, trainer: RunningTrainer, checkpoint: Path, state: TrainState) -> None:
        """After a complete checkpoint was written to `checkpoint` (on every process)."""

    def on_best(self, trainer: RunningTrainer, state: TrainState) -> None:
        """After an evaluation that improved training.metric_for_best_model (on every process)."""

    def on_train_end(self, trainer: RunningTrainer, end: RunEnd) -> None:
        """After the loop and its final evaluation; also when a signal, an error or a divergence ended the run
        (`end.completed` is then False): close what on_train_begin opened, export nothing."""


class Trackers(TrainerCallback):
    """Starts the trackers of `logging.report_to` with the run's redacted config, and ends them."""

    def __init__(self, logging_cfg: LoggingConfig):
        self.logging = logging_cfg

    def on_train_begin(self, trainer: RunningTrainer) -> None:
        if self.logging.report_to == "none":
            return
        out = str(trainer.training.output_dir)
        init_kwargs = {"wandb": {"name": self.logging.run_name or Path(out).name, "dir": out}}
        trainer.accelerator.init_trackers(
            self.logging.project, config=tracker_config(trainer.run_config), init_kwargs=init_kwargs
        )

    def on_train_end(self, trainer: RunningTrainer, end: RunEnd) -> None:
        trainer.accelerator.end_training()
        if self.logging.report_to != "none" and trainer.accelerator.is_main_process:
            from .run_folder import record_files

            record_files(trainer.output_dir, "logs", append=True)  # the trackers' files as they were closed
            record_files(trainer.output_dir, "wandb")


def tracker_config(run_config: Any) -> dict[str, Any]:
    """The run's config as flat `section.key` hyperparameters, tokens redacted, non-scalars as strings."""
    from .redaction import redact

    if run_config is None:
        return {}
    flat = flatten(dataclasses.asdict(run_config))
    flat = {k: v if isinstance(v, (int, float, str, bool)) or v is None else str(v) for k, v in flat.items()}
    return {k: redact(v) if isinstance(v, str) else v for k, v in flat.items()}


class BestModel(TrainerCallback):
    """Keeps the best model by training.metric_for_best_model in `save_dir`; with `load_at_end`, the trained model
    ends with those weights and the model card describes the best evaluation."""

    def __init__(self, save_dir: str | Path, tokenizer, *, load_at_end: bool = True):
        self.save_dir = Path(save_dir)
        self.tokenizer = tokenizer
        self.load_at_end = load_at_end

    def on_best(self, trainer: RunningTrainer, state: TrainState) -> None:
        from .export import save_model_folder

        # the prepared (possibly FSDP/DeepSpeed-wrapped) model: accelerator.get_state_dict gathers it; staged, so
        # a fault while a new best is written leaves the previous best whole
        save_model_folder(trainer.accelerator, trainer.model, self.tokenizer, self.save_dir)
        trainer.accelerator.print(
            f"best {trainer.training.metric_for_best_model} so far ({state.best_metric:.4g}, step {state.global_step}) "
            f"saved in {self.save_dir}"
        )

    def on_train_end(self, trainer: RunningTrainer, end: RunEnd) -> None:
        state = trainer.state
        if not end.completed or not self.load_at_end:
            return
        end.card_state = self._load_best(trainer, end.card_state)
        if state.best_step is not None:
            metric = trainer.training.metric_for_best_model
            end.summary["best model"] = f"step {state.best_step} ({metric} {state.best_metric:.4g})"

    def _load_best(self, trainer: RunningTrainer, state: TrainState) -> TrainState:
        """Put the weights saved by on_best back into the trained model; return the state to describe in the
        model card (the best evaluation last, so that the card's results are the exported model's)."""
        if state.best_step is None or not (self.save_dir / "config.json").is_file():
            return state
        last_eval_step = max((entry["step"] for entry in state.history if _is_eval(entry)), default=None)
        if state.best_step == last_eval_step == state.global_step:
            return state  # the final model is the best one
        from accelerate import DistributedType

        from .export import quiet_transformers

        acc = trainer.accelerator
        model = acc.unwrap_model(trainer.model)
        sharded = acc.distributed_type == DistributedType.FSDP
        best_state = {}
        if acc.is_main_process or not sharded:
            with quiet_transformers():
                best = _model_class(model).from_pretrained(self.save_dir)
            best_state = best.state_dict()
            del best
        if sharded:
            # FSDP holds each process's shard of every weight: the full weights read by rank 0 are scattered into
            # the shards by torch's state-dict API (the one accelerator.get_state_dict gathers them with)
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
            set_model_state_dict(trainer.model, best_state, options=options)
        else:
            model.load_state_dict(best_state)
        acc.print(f"loaded the best model (step {state.best_step}) from {self.save_dir}")
        best_entry = next(
            (
                entry
                for entry in reversed(state.history)
                if entry["step"] == state.best_step and _is_eval(entry)
            ),
            None,
        )
        if best_entry is None:
            return state
        return dataclasses.replace(state, history=[*state.history, dict(best_entry)])


def _model_class(model) -> type:
    """The model's own class: FSDP2 swaps it for a subclass made in torch's FSDP module."""
    from torch.distributed.fsdp import FSDPModule

    return next(cls for cls in type(model).__mro__ if not issubclass(cls, FSDPModule))


def _is_eval(entry: dict) -> bool:
    return any(key.startswith("eval/") for key in entry)


class FinalExport(TrainerCallback):
    """Writes the final model folder (weights, tokenizer, config, history, loss plot, model card) to `save_dir`."""

    def __init__(self, save_dir: str | Path, tokenizer, card: ModelCardFacts):
        self.save_dir = Path(save_dir)
        self.tokenizer = tokenizer
        self.card = card

    def on_train_end(self, trainer: RunningTrainer, end: RunEnd) -> None:
        from . import export  # looked up now: a script may wrap export.export_model (experiments/)

        acc, state = trainer.accelerator, trainer.state
        if end.failure is not None:
            return  # the error says what happened and what was kept
        if state.stop_reason == "signal":
            acc.print(
                f"stopped by signal at step {state.global_step}; checkpoint saved in {trainer.output_dir}/checkpoints"
            )
            return
        card = dataclasses.replace(self.card, summary={**self.card.summary, **end.summary})
        end.final_dir = export.export_model(
            acc, trainer.model, self.tokenizer, trainer.run_config, end.card_state, self.save_dir, card=card
        )
        if acc.is_main_process:  # rank 0 writes it (node-local disks: on its node only)
            print(f"final model saved in {end.final_dir}")


class HubSync(TrainerCallback):
    """The run's Hub traffic: pushes on save (by hub.strategy), the final push and its wait, resume from `hub:`."""

    def __init__(self, hub: HubConfig, tokenizer):
        self.hub = hub
        self.tokenizer = tokenizer
        self.pusher = None

    def on_train_begin(self, trainer: RunningTrainer) -> None:
        if not self.hub.push_to_hub:
            return
        from .hub import HubPusher, set_request_timeout

        set_request_timeout(self.hub.timeout_s)  # a stalled Hub fails a request instead of hanging the run
        hub = self.hub
        self.pusher = HubPusher(
            hub.model_id,
            private=hub.private,
            revision=hub.revision,
            enabled=trainer.accelerator.is_main_process,
        )
        self.pusher.exit_wait_s = hub.final_push_timeout_s
        self.pusher.exit_stall_s = hub.final_push_stall_s

    def on_save(self, trainer: RunningTrainer, checkpoint: Path, state: TrainState) -> None:
        if self.pusher is None or self.hub.strategy == "end":
            return
        from .export import save_model_files, staged_export_folder

        # written whole into a fresh folder and renamed into place at every save (never rewritten in place: a
        # link inside the old hub-export/ is never written through), put on the run folder's record
        export = trainer.output_dir / "hub-export"
        with staged_export_folder(trainer.accelerator, export) as staging:
            save_model_files(trainer.accelerator, trainer.model, self.tokenizer, staging)
        if trainer.accelerator.is_main_process:
            self.pusher.push(export, commit_message=f"Training in progress, step {state.global_step}")
            if self.hub.strategy == "checkpoint":
                self.pusher.push(
                    checkpoint,
                    source=checkpoint,
                    path_in_repo="last-checkpoint",
                    commit_message=f"Checkpoint at step {state.global_step}",
                    delete_patterns=["*"],
                    immutable=True,  # written once, renamed into place, only ever deleted
                )

    def fetch(self, accelerator, training, spec: str, local_dir: str) -> str:
        """Download the `hub:` checkpoint `spec` into `local_dir` where every process can read it: the processes
        that write the run folder download it (rank 0 on a shared folder, each node's local main process on
        node-local disks), the others wait for them. Called once per run, by kiln.job.run_job."""
        from accelerate.utils import gather_object

        from .errors import ConfigError
        from .hub import download_checkpoint, set_request_timeout
        from .nodes import writes_run_files
        from .redaction import redact
        from .run_folder import staged_run_folder

        acc = accelerator
        set_request_timeout(self.hub.timeout_s)
        path, error = None, None
        if writes_run_files(acc, training):
            local = Path(local_dir)
            try:
                # downloaded into a fresh staging folder, renamed into place once complete: never into the
                # folder an earlier download left (a link in it is never written through; a file Kiln did not
                # write is kept in hub-checkpoint.kept, not deleted), and a failed download leaves it as it was
                with staged_run_folder(local.parent, local.name) as staging:
                    found = download_checkpoint(
                        spec, staging, revision=self.hub.revision, timeout=self.hub.timeout_s
                    )
                path = str(local / Path(found).relative_to(staging))
            except ConfigError as err:
                error = str(err)  # a link at local_dir (kiln.safe_write): its own line, on every process
            except Exception as err:  # unreachable Hub, missing repo, no access: one line, on every process
                reason = " ".join(str(err).split()) or type(err).__name__
                error = redact(f"cannot resume from {spec}: {reason[:300]}") + (
                    "; check the repo id, your token and the network, or resume from a local checkpoint"
                )
        acc.wait_for_everyone()
        if acc.num_processes > 1:  # any node's failure stops every process
            error = next((e for e in gather_object([error]) if e is not None), None)
        if error is not None:
            raise ConfigError(error)
        if path is None:  # other processes: what their node's downloader wrote
            found = next(Path(local_dir).rglob("trainer_state.json"), None)
            if found is None:
                raise ConfigError(
                    f"cannot resume from {spec}: process {acc.process_index} does not see the download in {local_dir}; "
                    "give every node the same --training.save_on_each_node setting as its disks (shared or not)"
                )
            path = str(found.parent)
        return path

    def on_train_end(self, trainer: RunningTrainer, end: RunEnd) -> None:
        acc = trainer.accelerator
        if self.pusher is None or not acc.is_main_process:
            return
        if end.final_dir is not None:
            self.pusher.push(end.final_dir, commit_message="Final model")
        # a stop signal (before or during the wait) hands the queued pushes to the user instead of waiting on
        # a stalled Hub: every pushed folder is complete on disk, so `hf upload` finishes the job by hand
        before = trainer.stop_signals
        grace = (
            min(SIGNAL_GRACE_S, self.hub.final_push_timeout_s) if before else self.hub.final_push_timeout_s
        )
        stall = self.hub.final_push_stall_s
        if self.pusher.unpushed():
            logger.info(
                "waiting (at most %g s, or %g s without progress) for the pushes to %s; a stop signal "
                "hands them to you",
                grace,
                min(stall, grace),
                self.hub.model_id,
            )
        ok = self.pusher.wait(timeout=grace, stop=lambda: trainer.stop_signals > before, stall_s=stall)
        self.pusher.close()  # waited for (and what did not land is reported below): the exit need not wait again
        if ok:
            return
        unpushed = self.pusher.unpushed()
        if trainer.stop_signals and unpushed:
            end.handed_off = [self._upload_command(source, path_in_repo) for source, path_in_repo in unpushed]
            for command in end.handed_off:
                print(
                    f"stopped by signal before the push to {self.hub.model_id} completed; finish it with `{command}`",
                    flush=True,
                )
            return
        self._log_incomplete()
        if end.final_dir is not None and end.completed:
            end.error = self._push_error(end.final_dir)

    def _upload_command(self, source: Path, path_in_repo: str | None) -> str:
        command = f"hf upload {self.hub.model_id} {source}"
        if path_in_repo:
            command += f" {path_in_repo}"
        if self.hub.revision:
            command += f" --revision {self.hub.revision}"
        return command

    def _reason(self, long: bool) -> str:
        """Why the final wait gave up: no progress for hub.final_push_stall_s, the last failure, or the time."""
        if self.pusher.gave_up_idle:
            reason = f"no progress for {self.hub.final_push_stall_s:g} s"
            return reason + (" (hub.final_push_stall_s)" if long else "")
        if self.pusher.last_error:
            return self.pusher.last_error
        if long:
            return f"no answer within hub.final_push_timeout_s={self.hub.final_push_timeout_s:g}"
        return f"no answer within {self.hub.final_push_timeout_s:g} s"

    def _log_incomplete(self) -> None:
        logger.error(
            "the push to %s did not complete (%s); the model is saved locally",
            self.hub.model_id,
            self._reason(True),
        )

    def _push_error(self, final_dir: Path) -> Exception:
        """A final push that was asked for and did not complete fails the run."""
        from .errors import RunError

        model_id = self.hub.model_id
        reason = self._reason(False)
        return RunError(
            f"the final model is saved locally in {final_dir}, but the push to {model_id} did not complete "
            f"({reason}); push it later with `{self._upload_command(final_dir, None)}`"
        )


__all__ = ["BestModel", "FinalExport", "HubSync", "RunEnd", "TrainerCallback", "Trackers", "tracker_config"]

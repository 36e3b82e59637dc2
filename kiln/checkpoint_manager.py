"""The checkpoint manager: a run's checkpoints on disk, saved, loaded from the resume plan, and rotated.

As torchtitan's CheckpointManager, one object owns the run's checkpoint folder (output_dir/checkpoints) and the
objects a checkpoint holds (model, optimizer, schedule, counters); the training loop only asks it to save or load.

    Trainer.train      ──▶ remove_partial (leftovers of a killed run), data_fingerprint, Trainer.resume
    Trainer.resume     ──▶ load(plan): the state checked on every process and applied (kiln.checkpoint_state); a
                           `latest` whose state turns out damaged falls back to the next older checkpoint
                           (kiln.resume.fallback); then the counters of this run's layout, config.yaml and the
                           metrics.jsonl rows the resumed run replays dropped
    Trainer.save_checkpoint ──▶ save(window): written into a staging folder, renamed into place, recorded on the
                           run folder's record, the oldest beyond training.save_total_limit set aside (rotate)

Which checkpoint a run resumes is decided before (kiln.resume's ResumePlan); what a checkpoint holds and how it is
checked is kiln.checkpoint_state's; whether the weights may be saved at all is the loss guard's
(kiln.loss_guard), asked by the Trainer.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from . import run_folder
from .checkpoint_config import CONFIG_FILE
from .checkpoint_files import CHECKPOINT_PREFIX, TRAINER_STATE_FILE, find_checkpoints, write_checksums
from .checkpoint_state import (
    DamagedCheckpoint,
    apply_training_state,
    check_on_every_process,
    expected_of,
    load_pickled_state,
    save_training_state,
)
from .config import TrainingConfig, save_config
from .disk import disk_writes
from .elastic import convert_position, layout_of
from .errors import ConfigError
from .export import follow_umask
from .fingerprint import data_fingerprint, write_fingerprint
from .nodes import writes_run_files
from .public import save_public_config, write_public_json
from .resume import ResumePlan, fallback
from .safe_write import new_staging_folder, replace_into, write_new_file
from .throughput import LogWindow
from .train_state import TrainState

logger = logging.getLogger("kiln")


class CheckpointManager:
    """Saves, loads and rotates the checkpoints of the run in `output_dir`: the prepared `model`, `optimizer` and
    `scheduler`, the `state` counters, `metadata` (compared on resume) and, when given, the run's whole config."""

    def __init__(
        self,
        accelerator: Accelerator,
        training: TrainingConfig,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        state: TrainState,
        metadata: dict[str, Any],
        run_config: Any = None,
    ):
        self.accelerator = accelerator
        self.training = training
        self.output_dir = Path(training.output_dir)
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.state = state
        self.metadata = metadata
        self.run_config = run_config
        self._data_prints: dict[str, str] | None = None

    # --- save ---------------------------------------------------------------------------------------------

    def save(self, window: LogWindow | None) -> Path:
        """The run's state as plain data (`kiln.checkpoint_state`, with the logging `window` so far) into a temp
        folder, renamed into place: a crash never leaves half a checkpoint. The run's config and a manifest (sizes
        + sha256 of every file) are written last, so a resume can tell a complete checkpoint from a damaged one.
        Every process calls it; returns the checkpoint's folder."""
        acc = self.accelerator
        final = self.output_dir / "checkpoints" / f"{CHECKPOINT_PREFIX}{self.state.global_step:08d}"
        # a fixed staging name, not a fresh mkdtemp one (kiln.safe_write.staged_folder): every process writes its
        # own files into this folder (FSDP and DeepSpeed shards), so a fresh name would have to be made by one
        # process and broadcast to all. It gains nothing here: new_staging_folder refuses a link at the name,
        # removes a leftover and makes the folder with mkdir, which fails rather than take a name something stands
        # at, so the files written into it meet nothing planted before, as in a folder with a fresh name
        tmp = final.parent / f"{final.name}.tmp"
        writer = writes_run_files(acc, self.training)  # rank 0, or each node's local main on node-local disks
        if writer:
            new_staging_folder(tmp, final, within=self.output_dir)  # never through a link (kiln.safe_write)
        acc.wait_for_everyone()
        try:
            with disk_writes(tmp):
                saved_window = window.state(acc) if window is not None else None
                save_training_state(
                    acc, self.model, self.optimizer, self.scheduler, self.state, tmp, writer, saved_window
                )
                acc.wait_for_everyone()
                if writer:
                    checksums = self._write_run_files(tmp)
        except BaseException:
            # a full disk, a kill: the half-written folder goes (it holds space a resume will need); the
            # completed checkpoints were not touched. Every process removes it: another one may still have been
            # writing its own files into it (a leftover is removed when the next run starts, `remove_partial`)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if writer:
            prefix = final.relative_to(self.output_dir).as_posix()
            run_folder.set_aside_checkpoint(
                self.output_dir, prefix
            )  # a step saved again (resumed from an older one)
            run_folder.record_checkpoint(self.output_dir, prefix, tmp, checksums)  # before it is in place
            replace_into(tmp, final)
            if acc.is_main_process:
                run_folder.record_files(self.output_dir, "logs", append=True)
            self._rotate(keep=final)
        acc.wait_for_everyone()
        return final

    def _write_run_files(self, tmp: Path) -> dict:
        """What describes the state in `tmp`: the counters and layout (trainer_state.json), the run's config and
        data fingerprint, then the checksums of every file (last). Returns the checksums."""
        follow_umask(tmp)  # safetensors writes model.safetensors owner-only
        meta = {
            "global_step": self.state.global_step,
            "epoch": self.state.epoch,
            **self.metadata,
            **layout_of(self.training, self.accelerator.num_processes).as_dict(),
        }
        write_public_json(tmp / TRAINER_STATE_FILE, meta, indent=2)
        if self.run_config is not None:
            save_public_config(self.run_config, tmp / CONFIG_FILE)  # pushed by hub.strategy checkpoint
            write_fingerprint(self.data_fingerprint(), tmp)
        return write_checksums(tmp)

    def data_fingerprint(self) -> dict[str, str]:
        """What this run trains on (computed once: the files are hashed at the first call, before the first step
        on the main process)."""
        if self._data_prints is None:
            self._data_prints = data_fingerprint(getattr(self.run_config, "data", None))
        return self._data_prints

    def _rotate(self, keep: Path) -> None:
        """Remove the oldest checkpoints beyond save_total_limit (None or 0: keep all); never `keep`. Only the
        files Kiln provably wrote go; a folder holding others is set aside (`run_folder.set_aside_checkpoint`)."""
        limit = self.training.save_total_limit
        if not limit or limit < 1:
            return
        for old in find_checkpoints(self.output_dir)[:-limit]:
            if old != keep:
                run_folder.set_aside_checkpoint(self.output_dir, old.relative_to(self.output_dir).as_posix())

    def remove_partial(self) -> None:
        """Half-written checkpoint folders (`*.tmp`) a killed or failed run left behind: never resumed from, they
        only hold disk space."""
        if writes_run_files(self.accelerator, self.training):
            for partial in (self.output_dir / "checkpoints").glob(f"{CHECKPOINT_PREFIX}*.tmp"):
                shutil.rmtree(partial, ignore_errors=True)

    # --- load ---------------------------------------------------------------------------------------------

    def load(
        self, plan: ResumePlan, total_steps: int, steps_per_epoch: int | None
    ) -> tuple[ResumePlan, LogWindow | None]:
        """Continue from the checkpoint `plan` names (its files verified, the run checked against it: kiln.resume),
        its state checked on every process first (`_load_state`) for a run of `total_steps` (`steps_per_epoch`: a
        stream's None): a damaged one is one line naming the folder, or, for `latest`, the next older one is
        planned and resumed. Returns the plan resumed and its logging window (None: a new one)."""
        acc = self.accelerator
        while True:
            problem, window = self._load_state(plan, total_steps, steps_per_epoch)
            if problem is None:
                break
            plan = fallback(plan, problem, self.run_config, self.metadata, acc)
        # why the saved run stopped (a signal, the time budget) is no reason for this one to stop
        self.state.stop_reason = None
        # written on another number of processes: the same examples of the epoch, counted in this run's batches
        self.state.batches_in_epoch = convert_position(
            self.state.batches_in_epoch, plan.saved_layout, layout_of(self.training, acc.num_processes)
        )
        if self.run_config is not None and acc.is_main_process:
            save_config(
                self.run_config, self.output_dir / "config.yaml"
            )  # only now that the resume succeeded
            run_folder.record_files(self.output_dir, "config.yaml")
        if acc.is_main_process:
            self._forget_metrics_after(self.state.global_step)
        logger.info("resumed from %s at step %d", plan.folder, self.state.global_step)
        return plan, window

    def _load_state(
        self, plan: ResumePlan, total_steps: int, steps_per_epoch: int | None
    ) -> tuple[str | None, LogWindow | None]:
        """The checkpoint's state into the run's objects once every process has checked it: (None, its logging
        window), or (why it is damaged, None) with nothing loaded. A `plan.pickled` checkpoint is in accelerate's
        format (trusted by the user) and keeps no logging window."""
        acc, path = self.accelerator, plan.folder
        if plan.pickled:
            try:
                load_pickled_state(acc, self.scheduler, self.state, path)
            except DamagedCheckpoint as err:
                raise ConfigError(
                    f"checkpoint {plan.shown} is damaged: {err}; resume from an older checkpoint"
                ) from None
            return None, None
        expected = expected_of(plan, self.training, total_steps, steps_per_epoch, self.run_config is not None)
        checked, verdict = check_on_every_process(
            acc, self.model, self.optimizer, self.scheduler, plan, expected
        )
        if verdict is None:
            window = apply_training_state(
                checked, acc, self.model, self.optimizer, self.scheduler, self.state
            )
            return None, LogWindow.restored(window, acc)
        kind, problem = verdict
        if kind == "unfit":
            raise ConfigError(
                f"checkpoint {path} does not fit this run ({problem}); resume it with the config it "
                "was written with"
            )
        return problem, None

    def _forget_metrics_after(self, step: int) -> None:
        """metrics.jsonl rows this run replays: those of steps after the resumed checkpoint, and those of its own
        step logged after it was saved (the final evaluation of a run resumed at its last step): dropped. The
        checkpoint's history holds the rows logged before it was saved."""
        path = self.output_dir / "metrics.jsonl"
        if not path.is_file():
            return
        lines = path.read_text().splitlines()
        room = sum(
            1 for row in self.state.history if row.get("step") == step
        )  # rows of `step` before the save
        kept = []
        for line in lines:
            row_step = json.loads(line).get("step", 0) if line.strip() else None
            if row_step == step:
                room -= 1
                if room < 0:
                    continue
            if row_step is None or row_step <= step:
                kept.append(line)
        if len(kept) != len(lines):
            tmp = path.with_suffix(".jsonl.tmp")
            write_new_file(tmp, "".join(line + "\n" for line in kept))
            replace_into(tmp, path)
            run_folder.record_files(self.output_dir, path.name)


__all__ = ["CheckpointManager"]

"""Final export (save_pretrained + tokenizer + config + loss plot + model card) and the loop's Hub hooks.

Shared by pretraining and fine-tuning: the trainer calls `HubSync.on_save` after each checkpoint, the scripts call
`export_model` at the end and `HubSync.push_final`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from .config import disk_writes, save_config

logger = logging.getLogger("kiln")

PIPELINE_TAGS = {"encoder": "fill-mask", "decoder": "text-generation"}


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value if isinstance(value, (int, float, str, bool)) or value is None else str(value)
    return flat


def latest_metrics(history: list[dict[str, float]]) -> dict[str, float]:
    """The last value of every metric in the history (final eval metrics win over earlier ones)."""
    latest: dict[str, float] = {}
    for entry in history:
        latest.update({k: v for k, v in entry.items() if k != "step"})
    return latest


@contextlib.contextmanager
def plain_class(model):
    """The model as an instance of its own class for the length of the block.

    FSDP2's `fully_shard` turns the model into an instance of `FSDP<Name>`, a class made on the fly in torch's
    FSDP module (unwrapping does not undo it). Saved as it is, transformers would copy torch's FSDP files into
    the folder as the model's code and point auto_map at them, so the folder would not load."""
    cls = type(model)
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without FSDP2
        FSDPModule = ()  # noqa: N806
    if not FSDPModule or not isinstance(model, FSDPModule):
        yield model
        return
    model.__class__ = next(c for c in cls.__mro__ if not issubclass(c, FSDPModule))
    try:
        yield model
    finally:
        model.__class__ = cls


# Training-only fast paths a run may switch on (pretrain.run.PRETRAINING_FAST_PATHS): saved folders get the
# defaults, so a pushed or exported checkpoint returns transformers' output shapes, as BERT does
SAVED_CONFIG_DEFAULTS = {"sparse_prediction": False, "chunked_mlm_loss": False}


def save_model_files(accelerator: Accelerator, model, tokenizer, save_dir: Path) -> None:
    """save_pretrained (safetensors, with auto_map and code files) + tokenizer; main process writes."""
    state_dict = accelerator.get_state_dict(model)  # gathers FSDP/DeepSpeed shards
    if accelerator.is_main_process:
        save_dir.mkdir(parents=True, exist_ok=True)
        with plain_class(accelerator.unwrap_model(model)) as unwrapped:
            config = unwrapped.config
            in_training = {name: getattr(config, name) for name in SAVED_CONFIG_DEFAULTS if hasattr(config, name)}
            try:
                for name in in_training:
                    setattr(config, name, SAVED_CONFIG_DEFAULTS[name])
                unwrapped.save_pretrained(save_dir, state_dict=state_dict, safe_serialization=True)
            finally:
                for name, value in in_training.items():
                    setattr(config, name, value)
        if tokenizer is not None:
            tokenizer.save_pretrained(save_dir)
    accelerator.wait_for_everyone()


def check_finite_weights(model, save_dir: Path) -> None:
    """Never export NaN/inf weights: a RunError names the first bad parameter instead."""
    import torch

    from .config import RunError

    for name, param in model.named_parameters():
        try:
            finite = bool(torch.isfinite(param.detach()).all())
        except (RuntimeError, TypeError):  # a sharded or meta parameter that cannot be checked here
            continue
        if not finite:
            raise RunError(
                f"the model's weights hold NaN/inf values ({name}); {save_dir} was not written; resume from the "
                "last good checkpoint with a lower --training.lr"
            )


def export_model(
    accelerator: Accelerator,
    model,
    tokenizer,
    config,
    state,
    save_dir: str | Path,
    *,
    datasets: list[str] | None = None,
    task: str | None = None,
    extra_summary: dict[str, Any] | None = None,
    base_model: str | list[str] | None = None,
) -> Path:
    """Write a complete, loadable model folder with a model card; returns its path.

    The folder is written next to its place (`final.tmp`) and renamed into it once complete, so a fault midway
    (a full disk, a kill) never leaves half a model where a whole one is expected; a disk fault is raised as the
    OSError that names it (`disk_writes`).

    base_model: the Hub id(s) a fine-tuned model started from (card metadata and text); None for local starts.
    """
    save_dir = Path(save_dir)
    check_finite_weights(accelerator.unwrap_model(model), save_dir)
    with staged_folder(accelerator, save_dir) as staging:
        save_model_files(accelerator, model, tokenizer, staging)
        if accelerator.is_main_process:
            _write_run_files(
                accelerator, model, config, state, staging, save_dir, datasets, task, extra_summary, base_model
            )
    return save_dir


@contextlib.contextmanager
def staged_folder(accelerator: Accelerator, save_dir: Path):
    """`with staged_folder(acc, folder) as staging:` write into `staging` (`folder.tmp`); once the block is done
    it replaces `folder`. A fault midway (a full disk, a kill) leaves the previous `folder` as it was and no
    half-written one; a disk fault is raised as the OSError that names it (`disk_writes`)."""
    staging = save_dir.with_name(save_dir.name + ".tmp")
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
    try:
        with disk_writes(staging):
            yield staging
    except BaseException:
        if accelerator.is_main_process:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    if accelerator.is_main_process:
        shutil.rmtree(save_dir, ignore_errors=True)
        os.replace(staging, save_dir)
    accelerator.wait_for_everyone()


def save_model_folder(accelerator: Accelerator, model, tokenizer, save_dir: str | Path) -> Path:
    """`save_model_files` into `save_dir` through `staged_folder`: the folder is either the old one or the new
    one, never half of either (what fine-tuning's best/ model needs: it is overwritten at each new best)."""
    save_dir = Path(save_dir)
    with staged_folder(accelerator, save_dir) as staging:
        save_model_files(accelerator, model, tokenizer, staging)
    return save_dir


def _write_run_files(
    accelerator, model, config, state, save_dir, final_dir, datasets, task, extra_summary, base_model
) -> None:
    """The run's config, history, loss plot and model card next to the weights in `save_dir`, which becomes
    `final_dir` once complete (main process only)."""
    from .hub import plot_loss_curve, redact, write_model_card

    save_config(config, save_dir / "kiln_config.yaml")
    (save_dir / "kiln_config.yaml").write_text(redact((save_dir / "kiln_config.yaml").read_text()))
    (save_dir / "training_history.json").write_text(json.dumps(state.history, indent=1))
    plot = None
    if any("train/loss" in entry for entry in state.history):
        plot = plot_loss_curve(state.history, str(save_dir / "loss_curve.png"), title=config.training.output_dir)
    kind = getattr(config.model, "kind", None)
    training = config.training
    summary = {
        "model class": type(accelerator.unwrap_model(model)).__name__,
        "parameters": f"{sum(p.numel() for p in accelerator.unwrap_model(model).parameters()) / 1e6:.2f}M",
        "optimizer steps": state.global_step,
        "tokens seen": state.tokens_seen,
        "training time (s)": round(state.train_time_s, 1),
        "processes": accelerator.num_processes,
        "device": str(accelerator.device),
        "per-device batch size": training.per_device_train_batch_size,
        "gradient accumulation": training.gradient_accumulation_steps,
        "learning rate": training.lr,
        "scheduler": training.lr_scheduler_type,
        "mixed precision": training.mixed_precision,
        "stop reason": state.stop_reason,
        **(extra_summary or {}),
    }
    if kind is not None:
        summary = {"objective": config.model.objective, **summary}
    metrics = {k.removeprefix("eval/"): v for k, v in latest_metrics(state.history).items() if k.startswith("eval/")}
    hub_cfg = getattr(config, "hub", None)
    write_model_card(
        str(save_dir),
        model_id=hub_cfg.model_id if hub_cfg is not None else None,
        model_kind=kind or "encoder",
        summary=summary,
        metrics=metrics,
        datasets=datasets or [],
        license=hub_cfg.license if hub_cfg is not None else "apache-2.0",
        tags=["kiln", "pretraining" if task is None else "fine-tuning"],
        loss_plot=plot,
        base_model=base_model,
        task=task or PIPELINE_TAGS.get(kind or "encoder", "fill-mask"),
        final_dir=final_dir,
    )


class HubSync:
    """What the loop does with the Hub: pushes on save (by strategy), the final push, resume from `hub:`."""

    def __init__(self, config, accelerator: Accelerator, tokenizer):
        self.config = config
        self.accelerator = accelerator
        self.tokenizer = tokenizer
        self.model = None  # set by start(); needed to export weights at save time
        self.pusher = None
        hub = config.hub
        if hub.push_to_hub or str(config.training.resume_from_checkpoint or "").startswith("hub:"):
            from .hub import set_request_timeout

            set_request_timeout(hub.timeout_s)  # a stalled Hub fails a request instead of hanging the run
        if hub.push_to_hub:
            from .hub import HubPusher

            self.pusher = HubPusher(
                hub.model_id, private=hub.private, revision=hub.revision, enabled=accelerator.is_main_process
            )
        self.final_dir: Path | None = None

    def start(self, model) -> None:
        """Call once the Trainer has prepared `model` (it is what gets pushed), before training: also starts the
        trackers of `logging.report_to` with the run's redacted config."""
        self.model = model
        logging_cfg = self.config.logging
        if logging_cfg.report_to != "none":
            self.accelerator.init_trackers(
                logging_cfg.project, config=self.tracker_config(), init_kwargs=self.tracker_init_kwargs()
            )

    # --- loop hooks -----------------------------------------------------------------------------------

    def on_save(self, checkpoint: Path, state) -> None:
        if self.pusher is None or self.config.hub.strategy == "end" or self.model is None:
            return
        export = Path(self.config.training.output_dir) / "hub-export"
        save_model_files(self.accelerator, self.model, self.tokenizer, export)
        if self.accelerator.is_main_process:
            self.pusher.push(export, commit_message=f"Training in progress, step {state.global_step}")
            if self.config.hub.strategy == "checkpoint":
                self.pusher.push(
                    checkpoint,
                    path_in_repo="last-checkpoint",
                    commit_message=f"Checkpoint at step {state.global_step}",
                    delete_patterns=["*"],
                )

    def download_checkpoint(self, spec: str, local_dir: str) -> str:
        from accelerate.utils import broadcast_object_list

        from .config import ConfigError
        from .hub import download_checkpoint, redact

        path, error = None, None
        if self.accelerator.is_main_process:
            shutil.rmtree(local_dir, ignore_errors=True)
            try:
                hub = self.config.hub
                path = download_checkpoint(spec, local_dir, revision=hub.revision, timeout=hub.timeout_s)
            except Exception as err:  # unreachable Hub, missing repo, no access: one line, on every process
                reason = " ".join(str(err).split()) or type(err).__name__
                error = redact(f"cannot resume from {spec}: {reason[:300]}")
        self.accelerator.wait_for_everyone()
        if self.accelerator.num_processes > 1:
            error = broadcast_object_list([error])[0]
        if error is not None:
            raise ConfigError(f"{error}; check the repo id, your token and the network, or resume from a local checkpoint")
        if path is None:  # other processes: same shared filesystem, same layout
            path = str(next(Path(local_dir).rglob("trainer_state.json")).parent)
        return path

    def push_final(self, final_dir: Path) -> None:
        self.final_dir = Path(final_dir)
        if self.pusher is not None and self.accelerator.is_main_process:
            self.pusher.push(final_dir, commit_message="Final model")

    def wait(self) -> bool:
        """Wait (at most hub.final_push_timeout_s) for the queued pushes; False when one did not complete."""
        if self.pusher is None or not self.accelerator.is_main_process:
            return True
        ok = self.pusher.wait(timeout=self.config.hub.final_push_timeout_s)
        if not ok:
            logger.error(
                "the push to %s did not complete (%s); the model is saved locally",
                self.config.hub.model_id,
                self.pusher.last_error or f"no answer within hub.final_push_timeout_s={self.config.hub.final_push_timeout_s:g}",
            )
        return ok

    def raise_if_required_push_failed(self, pushed: bool) -> None:
        """After `wait`: a final push that was asked for and did not complete fails the run (RunError)."""
        if pushed or self.pusher is None or self.final_dir is None or not self.accelerator.is_main_process:
            return
        from .config import RunError

        model_id = self.config.hub.model_id
        reason = self.pusher.last_error or f"no answer within {self.config.hub.final_push_timeout_s:g} s"
        raise RunError(
            f"the final model is saved locally in {self.final_dir}, but the push to {model_id} did not complete "
            f"({reason}); push it later with `hf upload {model_id} {self.final_dir}`"
        )

    # --- trackers and cards -------------------------------------------------------------------------

    def tracker_config(self) -> dict[str, Any]:
        from .hub import redact

        flat = _flatten(dataclasses.asdict(self.config))
        return {k: redact(v) if isinstance(v, str) else v for k, v in flat.items()}

    def tracker_init_kwargs(self) -> dict[str, Any]:
        out = self.config.training.output_dir
        name = self.config.logging.run_name or Path(out).name
        return {"wandb": {"name": name, "dir": out}}

    def dataset_names(self) -> list[str]:
        data = self.config.data
        if data.dataset_name:
            return [data.dataset_name]
        return list(data.data_files)  # local paths: named in the card's text, kept out of its Hub metadata


__all__ = ["HubSync", "export_model", "latest_metrics", "save_model_files", "save_model_folder", "staged_folder"]

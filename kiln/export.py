"""Saving models: the final export (save_pretrained + tokenizer + config + loss plot + model card) and the plain
model files a checkpoint push or the best model needs.

Shared by pretraining and fine-tuning through the callbacks of `kiln.callbacks` (FinalExport, BestModel, HubSync).
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .disk import disk_writes

if TYPE_CHECKING:
    from accelerate import Accelerator

logger = logging.getLogger("kiln")

PIPELINE_TAGS = {"encoder": "fill-mask", "decoder": "text-generation"}


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
    """save_pretrained (safetensors, with auto_map and code files) + tokenizer; main process writes.

    A model trained as several (ELECTRA: a discriminator and its generator) names them in `saved_parts()`,
    {folder relative to save_dir: (state-dict prefix, sub-model)}: each is saved as an ordinary model folder."""
    state_dict = accelerator.get_state_dict(model)  # gathers FSDP/DeepSpeed shards
    if accelerator.is_main_process:
        with plain_class(accelerator.unwrap_model(model)) as unwrapped:
            saved_parts = getattr(unwrapped, "saved_parts", None)
            parts = saved_parts() if saved_parts is not None else {"": ("", unwrapped)}
            for folder, (prefix, part) in parts.items():
                part_state = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
                _save_pretrained(part, part_state, save_dir / folder, tokenizer)
    accelerator.wait_for_everyone()


def _save_pretrained(model, state_dict: dict, save_dir: Path, tokenizer) -> None:
    """`model.save_pretrained` with the training-only fast paths off in the saved config, and the tokenizer."""
    from .safe_write import refuse_link

    # Kiln's callers hand a fresh staging folder (`staged_export_folder`) or a part's folder inside one
    refuse_link(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    config = model.config
    in_training = {name: getattr(config, name) for name in SAVED_CONFIG_DEFAULTS if hasattr(config, name)}
    # auto_map is rebuilt by save_pretrained from the model's own classes: entries that a loaded checkpoint
    # carried for Python files of its own (never run by Kiln, not saved) are not passed on
    configs = [c for c in (config, getattr(config, "encoder", None), getattr(config, "decoder", None)) if c]
    auto_maps = [getattr(c, "auto_map", None) for c in configs]
    try:
        for name in in_training:
            setattr(config, name, SAVED_CONFIG_DEFAULTS[name])
        for sub_config in configs:
            sub_config.auto_map = None
        model.save_pretrained(save_dir, state_dict=state_dict, safe_serialization=True)
        follow_umask(save_dir)
    finally:
        for name, value in in_training.items():
            setattr(config, name, value)
        for sub_config, auto_map in zip(configs, auto_maps):
            sub_config.auto_map = auto_map
    if tokenizer is not None:
        tokenizer.save_pretrained(save_dir)


def follow_umask(folder: Path) -> None:
    """safetensors writes its files owner-only (0600, through a temporary file renamed into place) whatever the
    umask; give the weights the mode every other file of the folder gets (0644 under umask 0022), so a teammate or
    a serving user on a shared machine can read an exported model."""
    mode = 0o666 & ~current_umask()
    for path in Path(folder).rglob("*.safetensors"):
        os.chmod(path, mode)


def current_umask() -> int:
    """The process's umask, read without changing it (Linux: /proc/self/status)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o077)  # elsewhere: read by setting it, for an instant, to a value that exposes nothing
    os.umask(mask)
    return mask


def check_finite_weights(model, save_dir: Path) -> None:
    """Never export NaN/inf weights: a RunError names the first bad parameter instead."""
    import torch

    from .errors import RunError

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


@dataclass
class ModelCardFacts:
    """What a model card says beyond the run's own numbers; the app fills it from its config sections."""

    model_kind: str | None = None
    """`encoder`, `decoder`, `encoder-decoder`; None: an encoder."""
    objective: str | None = None
    """Training objective, opening the card's table when given."""
    task: str | None = None
    """Pipeline tag of a fine-tuned model; None: pretraining (fill-mask or text-generation by model_kind)."""
    datasets: list[str] = field(default_factory=list)
    """Hub dataset ids (card metadata) or local paths (named in the card's text only)."""
    base_model: str | list[str] | None = None
    """The Hub id(s) a fine-tuned model started from; None for local starts."""
    model_id: str | None = None
    """The Hub repo the model is pushed to (hub.model_id), named in the card's usage code."""
    license: str | None = None
    """The model's license (hub.license); None: none was chosen, and the card says so."""
    summary: dict[str, Any] = field(default_factory=dict)
    """More facts for the card's training table, after the run's own."""
    usage: str | None = None
    """Python code for the card's Usage section (`{repo}` is filled in), when the default one does not fit."""


def export_model(
    accelerator: Accelerator,
    model,
    tokenizer,
    config,
    state,
    save_dir: str | Path,
    *,
    card: ModelCardFacts,
) -> Path:
    """Write a complete, loadable model folder with a model card; returns its path.

    The folder is written next to its place (a fresh `.final.XXXXXXXX.staging`, `staged_export_folder`) and
    renamed into it once complete, so a fault midway
    (a full disk, a kill) never leaves half a model where a whole one is expected; a disk fault is raised as the
    OSError that names it (`disk_writes`).

    `config`: the run's config (saved as kiln_config.yaml; its training section fills the card's table)."""
    save_dir = Path(save_dir)
    check_finite_weights(accelerator.unwrap_model(model), save_dir)
    with staged_export_folder(accelerator, save_dir) as staging:
        save_model_files(accelerator, model, tokenizer, staging)
        if accelerator.is_main_process:
            _write_run_files(config, state, staging)
            _write_card(accelerator, model, config, state, staging, save_dir, card)
    return save_dir


@contextlib.contextmanager
def staged_export_folder(accelerator: Accelerator, save_dir: Path):
    """`with staged_export_folder(acc, folder) as staging:` write into `staging`, a fresh folder beside `folder` that no
    one chose the name of; once the block is done it replaces `folder`, which loses only the files on the run
    folder's record (`kiln.run_folder.staged_run_folder`). Nothing is written into the old folder, so a link in it
    is never written through; a link at `folder` is refused in one line. A fault midway (a full disk, a kill)
    leaves the previous `folder` as it was; a disk fault is raised as the OSError that names it (`disk_writes`).
    The main process writes; the others get a name they never write to (they only gather the weights)."""
    from .run_folder import staged_run_folder

    save_dir = Path(save_dir)
    with contextlib.ExitStack() as stack:
        if accelerator.is_main_process:
            staging = stack.enter_context(staged_run_folder(save_dir.parent, save_dir.name))
        else:
            staging = save_dir.with_name(f".{save_dir.name}.staging")
        with disk_writes(save_dir):  # a fault names the folder the user knows, not the staging name
            yield staging
    accelerator.wait_for_everyone()


def save_model_folder(accelerator: Accelerator, model, tokenizer, save_dir: str | Path) -> Path:
    """`save_model_files` into `save_dir` through `staged_export_folder`: the folder is either the old one or the new
    one, never half of either (what fine-tuning's best/ model needs: it is overwritten at each new best)."""
    save_dir = Path(save_dir)
    with staged_export_folder(accelerator, save_dir) as staging:
        save_model_files(accelerator, model, tokenizer, staging)
    return save_dir


def _write_run_files(config, state, save_dir: Path) -> None:
    """The resolved config (tokens redacted) and the training history next to the weights."""
    from .public import save_public_config, write_public_json

    save_public_config(
        config, save_dir / "kiln_config.yaml"
    )  # pushed with the model: no local paths, no tokens
    write_public_json(save_dir / "training_history.json", state.history, indent=1)


def run_summary(accelerator: Accelerator, model, training, state, card: ModelCardFacts) -> dict[str, Any]:
    """The facts of the card's training table: the model, the run's counters and its main settings."""
    unwrapped = accelerator.unwrap_model(model)
    summary = {
        "model class": type(unwrapped).__name__,
        "parameters": f"{sum(p.numel() for p in unwrapped.parameters()) / 1e6:.2f}M",
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
        **card.summary,
    }
    if card.objective is not None:
        summary = {"objective": card.objective, **summary}
    return summary


def _write_card(
    accelerator: Accelerator, model, config, state, save_dir: Path, final_dir: Path, card: ModelCardFacts
) -> None:
    """The loss plot and the model card in `save_dir`, which becomes `final_dir` once complete."""
    from .hub import local_usage_name, plot_loss_curve, replace_card_usage, write_model_card
    from .public import public_name

    plot = None
    if any("train/loss" in entry for entry in state.history):
        title = public_name(
            config.training.output_dir
        )  # the image is published: the run's name, not its path
        plot = plot_loss_curve(state.history, str(save_dir / "loss_curve.png"), title=title)
    kind = card.model_kind or "encoder"
    metrics = {
        k.removeprefix("eval/"): v for k, v in latest_metrics(state.history).items() if k.startswith("eval/")
    }
    write_model_card(
        str(save_dir),
        model_id=card.model_id,
        model_kind=kind,
        summary=run_summary(accelerator, model, config.training, state, card),
        metrics=metrics,
        datasets=card.datasets or [],
        license=card.license,
        tags=["kiln", "pretraining" if card.task is None else "fine-tuning"],
        loss_plot=plot,
        base_model=card.base_model,
        task=card.task or PIPELINE_TAGS.get(kind, "fill-mask"),
        final_dir=final_dir,
    )
    if card.usage:
        replace_card_usage(
            save_dir / "README.md", card.usage.format(repo=card.model_id or local_usage_name(final_dir))
        )


@contextlib.contextmanager
def quiet_transformers():
    """Silence transformers' loading tables; Kiln logs its own one-line summary instead."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


__all__ = [
    "ModelCardFacts",
    "export_model",
    "latest_metrics",
    "quiet_transformers",
    "save_model_files",
    "save_model_folder",
    "staged_export_folder",
]

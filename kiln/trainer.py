"""The one training loop of Kiln, shared by pretraining and fine-tuning.

accelerate does the heavy lifting (devices, DDP/FSDP/DeepSpeed, mixed precision, accumulation, state saving);
this module adds what a long run needs around it: exact resume (data position + RNG + counters), atomic rotating
checkpoints, evaluation, best-model tracking with early stopping, tracker logging with throughput and MFU, a
wall-clock budget and clean SIGTERM/SIGINT handling.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, DistributedType
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler, Subset
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm
from transformers import get_scheduler

from .callbacks import RunEnd, TrainerCallback
from .checkpoint_config import CONFIG_FILE, saved_run_config
from .config import LoggingConfig, TrainingConfig, flatten, save_config
from .disk import disk_writes
from .elastic import convert_position, layout_of, saved_layout
from .errors import ConfigError
from .export import follow_umask
from .fingerprint import write_fingerprint
from .nodes import resolve_disk_layout, writes_run_files
from .public import public_config, save_public_config
from .train_state import TrainState

logger = logging.getLogger("kiln")

CHECKPOINT_PREFIX = "step-"
TRAINER_STATE_FILE = "trainer_state.json"

Evaluator = Callable[[torch.nn.Module, DataLoader, Accelerator], dict[str, float]]
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


def optimizer_steps_per_epoch(micro_batches: int, gradient_accumulation_steps: int) -> int:
    """An epoch of n micro-batches holds ceil(n / accumulation) optimizer steps: a partial last window is
    stepped too (as transformers' Trainer and accelerate do), its loss normalised by what it really holds."""
    return math.ceil(micro_batches / gradient_accumulation_steps)


# ----------------------------------------------------------------------------------------------------------
# setup helpers


def build_accelerator(training: TrainingConfig, logging_cfg: LoggingConfig) -> Accelerator:
    from accelerate import DataLoaderConfiguration
    from accelerate.utils import ProjectConfiguration

    log_with = {"none": None, "all": ["wandb", "tensorboard"]}.get(logging_cfg.report_to, [logging_cfg.report_to])
    if log_with and "wandb" in log_with and not os.environ.get("WANDB_API_KEY"):
        # no key: keep everything on disk instead of failing or prompting; `wandb sync` uploads later
        os.environ.setdefault("WANDB_MODE", "offline")
    return Accelerator(
        gradient_accumulation_steps=training.gradient_accumulation_steps,
        mixed_precision=training.mixed_precision,
        log_with=log_with,
        project_config=ProjectConfiguration(
            project_dir=training.output_dir, logging_dir=os.path.join(training.output_dir, "logs")
        ),
        # we shard map-style data ourselves through accelerate's batch sampler and stream pre-split iterables
        dataloader_config=DataLoaderConfiguration(dispatch_batches=False),
        dynamo_backend="inductor" if training.torch_compile else None,
        # the scheduler is stepped by us once per optimizer step, whatever the number of processes
        step_scheduler_with_optimizer=False,
    )


def configure_deepspeed(plugin: Any, training: TrainingConfig) -> None:
    """Give DeepSpeed Kiln's accumulation, clipping and per-device batch in place of its `auto` values.

    Left `auto`, accelerate fills DeepSpeed's clipping with 1.0 whatever `--training.max_grad_norm` says, and a
    model and optimizer prepared without a dataloader (as the trainer does) have no micro-batch size at all. An
    explicit value that disagrees with Kiln's is refused: DeepSpeed would silently win while Kiln counted steps,
    scheduled the learning rate and logged with its own.
    """
    ds = plugin.deepspeed_config
    wanted = {
        "gradient_accumulation_steps": ("gradient_accumulation_steps", training.gradient_accumulation_steps),
        "gradient_clipping": ("max_grad_norm", float(max(training.max_grad_norm, 0.0))),  # DeepSpeed: 0 = off
        "train_micro_batch_size_per_gpu": ("per_device_train_batch_size", training.per_device_train_batch_size),
    }
    mismatches = []
    for key, (kiln_name, value) in wanted.items():
        current = ds.get(key, "auto")
        if current == "auto":
            ds[key] = value
        elif float(current) != float(value):
            mismatches.append(f"DeepSpeed {key}={current} but --training.{kiln_name} {value}")
    if mismatches:
        raise ConfigError(
            "the DeepSpeed config disagrees with Kiln's: " + "; ".join(mismatches) + ". Remove these keys from the "
            "accelerate config (or set them to \"auto\" in a deepspeed_config_file): Kiln fills them from --training.*"
        )
    plugin.gradient_accumulation_steps = ds["gradient_accumulation_steps"]
    plugin.gradient_clipping = ds["gradient_clipping"]


def align_engine(accelerator: Accelerator, training: TrainingConfig) -> None:
    """After the Accelerator is built: record the precision it runs with (the accelerate config's when Kiln's is
    None), refuse an accumulation count that `accelerate launch` overrode, and align DeepSpeed with Kiln."""
    if training.mixed_precision is None:
        training.mixed_precision = str(accelerator.mixed_precision)
    if str(accelerator.mixed_precision) == "fp16" and accelerator.device.type == "cpu":
        # accelerate turns fp16 autocast off on a CPU: the run would be fp32 while its config and card say fp16
        raise ConfigError(
            "training.mixed_precision fp16 is not applied on a CPU (accelerate runs it in fp32); use bf16, which "
            "is, or no (from --training.mixed_precision or the accelerate config / launch --mixed_precision)"
        )
    if accelerator.gradient_accumulation_steps != training.gradient_accumulation_steps:
        # accelerate reads ACCELERATE_GRADIENT_ACCUMULATION_STEPS (set by `accelerate launch` from a DeepSpeed
        # section's gradient_accumulation_steps or --gradient_accumulation_steps) over the value Kiln passes
        raise ConfigError(
            f"accelerate was launched with gradient_accumulation_steps {accelerator.gradient_accumulation_steps} but "
            f"--training.gradient_accumulation_steps is {training.gradient_accumulation_steps}; remove it from the "
            "accelerate config / launch command and set it with --training.gradient_accumulation_steps"
        )
    plugin = accelerator.state.deepspeed_plugin
    if plugin is not None:
        configure_deepspeed(plugin, training)


def resolve_batch_size(training: TrainingConfig, num_processes: int) -> None:
    """Derive the per-device batch size from total_train_batch_size, refusing a split that is not even."""
    total = training.total_train_batch_size
    if total is None:
        return
    parts = num_processes * training.gradient_accumulation_steps
    if total <= 0 or total % parts:
        raise ConfigError(
            f"training.total_train_batch_size {total} does not divide evenly over {num_processes} process(es) x "
            f"{training.gradient_accumulation_steps} accumulation step(s); use a multiple of {parts}"
        )
    training.per_device_train_batch_size = total // parts


def start_run(training: TrainingConfig, logging_cfg: LoggingConfig) -> Accelerator:
    """What every Kiln entry point does first: the Accelerator, the per-device batch size derived from
    total_train_batch_size, the engine aligned with Kiln's settings, the log format (main process at INFO), and
    the seed."""
    from accelerate.utils import set_seed

    from .elastic import adapt_to_world_size, launched_processes

    resume = training.resume_from_checkpoint
    local = resume and not resume.startswith("hub:")
    checkpoint = resolve_checkpoint(resume, training.output_dir, quiet=True) if local else None
    # before the Accelerator is built: it takes the accumulation count a resume on another world size needs
    elastic = adapt_to_world_size(training, launched_processes(), checkpoint)
    accelerator = build_accelerator(training, logging_cfg)
    resolve_batch_size(training, accelerator.num_processes)
    align_engine(accelerator, training)
    if elastic and accelerator.state.deepspeed_plugin is not None:
        raise ConfigError(
            f"{elastic}, but DeepSpeed's ZeRO checkpoints hold one optimizer partition per process and load only "
            "on the number of processes that wrote them; resume on that many processes, or train with DDP or FSDP"
        )
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        level=logging.INFO if accelerator.is_main_process else logging.WARNING,
    )
    if elastic and accelerator.is_main_process:
        logger.warning(elastic)
    logging.getLogger("accelerate").setLevel(logging.WARNING)  # per-file checkpoint chatter
    quiet_tied_weight_warning()
    set_seed(training.seed)
    return accelerator


class _TiedWeightsFilter(logging.Filter):
    """Drops accelerate's "Removed shared tensor {...} while saving" when every name is a tied output projection
    (`mlm_head.decoder.weight`, `lm_head.weight`) or an ELECTRA generator's embeddings (the discriminator's):
    safetensors stores shared weights once and loading re-ties them, so the warning came with every checkpoint
    and meant nothing. Any other shared tensor still warns."""

    TIED = ("mlm_head.decoder.weight", "lm_head.weight")
    SHARED = ("generator.model.embeddings.",)  # ELECTRA: the generator's embeddings are the discriminator's

    def filter(self, record: logging.LogRecord) -> bool:
        match = re.search(r"Removed shared tensor \{(.*?)\} while saving", record.getMessage())
        if match is None:
            return True
        names = [name.strip(" '\"") for name in match.group(1).split(",")]
        return not all(name.endswith(self.TIED) or name.startswith(self.SHARED) for name in names)


def quiet_tied_weight_warning() -> None:
    target = logging.getLogger("accelerate.utils.other")
    if not any(isinstance(f, _TiedWeightsFilter) for f in target.filters):
        target.addFilter(_TiedWeightsFilter())


def check_scheduler(training: TrainingConfig) -> None:
    from transformers.trainer_utils import SchedulerType

    names = [t.value for t in SchedulerType]
    if training.lr_scheduler_type not in names:
        raise ConfigError(
            f"training.lr_scheduler_type {training.lr_scheduler_type!r} is unknown; use one of {', '.join(names)}"
        )


RUN_FILES = ("checkpoints", "final", "best", "logs", "metrics.jsonl", "config.yaml", "tokenizer", "hub-export")
"""What a run leaves in its output_dir (removed by overwrite_output_dir, or when nothing resumable is there)."""


def prepare_output(config: Any, accelerator: Accelerator) -> Path:
    """The run folder `config.training.output_dir` with the resolved config.yaml in it.

    Everything that can be checked is checked before the folder is touched. A folder that holds a run (a
    checkpoint or a final model) is refused unless resuming or asked to overwrite (then the old run's files are
    removed); a folder left by a run that failed before its first checkpoint is simply reused. When resuming,
    the checkpoint's config is compared with this one (see `check_config_change`) and config.yaml is only
    rewritten once the resume has succeeded (Trainer.resume)."""
    training = config.training
    check_scheduler(training)
    hub_cfg = getattr(config, "hub", None)
    if hub_cfg is not None and hub_cfg.push_to_hub:
        from .hub import check_push_settings

        check_push_settings(hub_cfg.model_id)
    out = Path(training.output_dir)
    resume = training.resume_from_checkpoint
    if resume and not resume.startswith("hub:"):
        check_config_change(resolve_checkpoint(resume, str(out), quiet=True), config, accelerator)
    resolve_disk_layout(accelerator, training)  # several nodes: one shared folder, or one per node
    writer = writes_run_files(accelerator, training)
    lock_output_dir(out, accelerator, writer)  # before anything in it is removed or written
    holds_run = bool(find_checkpoints(out)) or (out / "final").is_dir()
    if holds_run and not resume and not training.overwrite_output_dir:
        raise ConfigError(
            f"output_dir {out} already holds a run; continue it with --training.resume_from_checkpoint "
            "latest, start over with --training.overwrite_output_dir, or pick another --training.output_dir"
        )
    if writer and not resume and out.is_dir():
        # start over, or a folder with nothing resumable in it: stale files of the failed run must not mix in
        for name in RUN_FILES:
            path = out / name
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    accelerator.wait_for_everyone()
    if writer:
        out.mkdir(parents=True, exist_ok=True)
        if not resume or not (out / "config.yaml").is_file():
            save_config(config, out / "config.yaml")
    accelerator.wait_for_everyone()
    return out


LOCK_FILE = ".kiln.lock"
"""In output_dir: locked (flock) by the run writing there, with its PID and host inside."""
_output_locks: dict[str, Any] = {}


def lock_output_dir(out: Path, accelerator: Accelerator, writer: bool) -> None:
    """Refuse to start when another run is writing into `out`: the process that writes the run folder (`writer`:
    rank 0 on a shared folder, each node's local main on node-local disks) holds an exclusive flock on
    out/.kiln.lock for the whole run (released by `release_output_lock`, or by the kernel when the process ends,
    so a lock left by a killed run never blocks); every process stops alike when one of them finds it taken."""
    message = None
    if writer:
        message = _take_lock(out)
    if accelerator.num_processes > 1:  # any node's refusal stops every process
        from accelerate.utils import gather_object

        messages = gather_object([message])
        message = next((m for m in messages if m is not None), None)
    if message is not None:
        raise ConfigError(message)


def _take_lock(out: Path) -> str | None:
    key = str(out.resolve())
    if key in _output_locks:  # this process already holds it (a run it started before, in-process)
        return None
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        return None
    out.mkdir(parents=True, exist_ok=True)
    handle = open(out / LOCK_FILE, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        return (
            f"output_dir {out} is in use by another run (PID {holder}); wait for it to end, stop it, or pick "
            "another --training.output_dir"
        )
    except OSError:  # a file system without flock (some network mounts): run unguarded
        handle.close()
        return None
    import socket

    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()} on {socket.gethostname()}\n")
    handle.flush()
    _output_locks[key] = handle
    return None


def release_output_lock(out: str | os.PathLike) -> None:
    """Let another run into `out` (the end of Trainer.train; a process that ends releases it anyway)."""
    handle = _output_locks.pop(str(Path(out).resolve()), None)
    if handle is not None:
        handle.close()  # closing the last descriptor releases the flock


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


def find_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX) and p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(CHECKPOINT_PREFIX) :]))


DIVERGENCE_STEPS = 3
"""Optimizer steps in a row with the loss far above its lowest (training.divergence_factor) that stop a run."""

CHECKSUMS_FILE = "checksums.json"
"""Written last into every checkpoint: the size and sha256 of each file, verified before a resume loads it."""


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_checksums(folder: Path) -> None:
    """checksums.json into the checkpoint `folder`, last: each file's size and sha256 (`checkpoint_problem`)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != CHECKSUMS_FILE)
    manifest = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)} for p in files}
    tmp = folder / f"{CHECKSUMS_FILE}.tmp"
    tmp.write_text(json.dumps({"files": manifest}, indent=1))
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, folder / CHECKSUMS_FILE)


def checkpoint_problem(folder: Path) -> str | None:
    """Why the checkpoint `folder` cannot be resumed from (missing, truncated or changed files), or None.
    Checkpoints written before manifests existed are only checked for a readable trainer_state.json."""
    folder = Path(folder)
    try:
        json.loads((folder / TRAINER_STATE_FILE).read_text())
    except (OSError, ValueError) as err:
        return f"{TRAINER_STATE_FILE} is unreadable ({type(err).__name__})"
    manifest_path = folder / CHECKSUMS_FILE
    if not manifest_path.is_file():
        return _unverified_problem(folder)
    try:
        manifest = json.loads(manifest_path.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{CHECKSUMS_FILE} is unreadable"
    for name, expected in manifest.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != expected["size"]:
            return f"{name} has {size} bytes instead of {expected['size']} (truncated?)"
        if _sha256(path) != expected["sha256"]:
            return f"{name} does not match its checksum (changed on disk)"
    return None


def _unverified_problem(folder: Path) -> str | None:
    """For a checkpoint without a manifest (written before manifests existed, or whose manifest was lost): the
    structural checks that need no checksum. A safetensors file must hold as many bytes as its header says, and
    a torch pickle (a zip archive) must end with its central directory: a truncated file fails either."""
    import struct
    import zipfile

    for path in sorted(folder.glob("*.safetensors")):
        try:
            with open(path, "rb") as fh:
                (header_size,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(header_size))
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        except (OSError, ValueError, KeyError, TypeError, struct.error):
            return f"{path.name} is unreadable"
        size = path.stat().st_size
        if size < 8 + header_size + end:
            return f"{path.name} is truncated ({size} bytes, its header needs {8 + header_size + end})"
    for path in sorted([*folder.glob("*.bin"), *folder.glob("*.pt"), *folder.glob("*.pth")]):
        if not zipfile.is_zipfile(path):
            return f"{path.name} is truncated or not a torch file"
    return None


def resolve_checkpoint(
    spec: str, output_dir: str, download: Callable[[str, str], str] | None = None, quiet: bool = False
) -> Path:
    """`latest`, a folder, or `hub:user/name` (downloaded through `download(spec, local_dir)`).

    The checkpoint's files are verified against its manifest; `latest` skips damaged checkpoints (newest
    first) and says which one it falls back to; a damaged explicit checkpoint is a one-line error."""
    if spec == "latest":
        checkpoints = find_checkpoints(output_dir)
        if not checkpoints:
            raise ConfigError(
                f"--training.resume_from_checkpoint latest: no checkpoint in {output_dir}/checkpoints; "
                "start without it, or point it at a checkpoint folder"
            )
        damaged = []
        for candidate in reversed(checkpoints):
            problem = checkpoint_problem(candidate)
            if problem is None:
                if damaged and not quiet:
                    logger.warning(
                        "skipping damaged checkpoint(s) %s; resuming from %s, the newest valid one",
                        "; ".join(damaged), candidate.name,
                    )
                return candidate
            damaged.append(f"{candidate.name}: {problem}")
        raise ConfigError(
            f"no valid checkpoint in {output_dir}/checkpoints ({'; '.join(damaged)}); "
            "start over with --training.overwrite_output_dir"
        )
    if spec.startswith("hub:"):
        if download is None:
            raise ConfigError("resuming from the Hub needs the hub module")
        path = Path(download(spec, os.path.join(output_dir, "hub-checkpoint")))
    else:
        path = Path(spec)
        if not (path / TRAINER_STATE_FILE).is_file():
            raise ConfigError(
                f"--training.resume_from_checkpoint {spec}: not a Kiln checkpoint (no {TRAINER_STATE_FILE}); "
                f"use 'latest' or a folder like {output_dir}/checkpoints/step-00000200"
            )
    problem = checkpoint_problem(path)
    if problem is not None:
        raise ConfigError(
            f"checkpoint {spec} is damaged: {problem}; resume from an older checkpoint "
            "(--training.resume_from_checkpoint latest picks the newest valid one)"
        )
    return path


# settings that may change between a run and its resume without changing what is trained
_RESUME_FREE_KEYS = (
    "training.output_dir", "training.resume_from_checkpoint", "training.overwrite_output_dir",
    "training.save_on_each_node",
    "training.allow_config_change", "training.eval_steps", "training.save_steps", "training.save_total_limit",
    "training.max_eval_batches", "training.per_device_eval_batch_size", "training.max_train_time_s",
    "training.metric_for_best_model", "training.greater_is_better", "training.early_stopping_patience",
    "training.divergence_factor",
    "data.num_workers", "data.num_proc", "data.cache_dir", "data.max_eval_documents",
    "tokenizer.name_or_path", "predict", "logging.", "hub.", "eval.",
)  # fmt: skip


_LAYOUT_CONFIG_KEYS = {"training.per_device_train_batch_size", "training.gradient_accumulation_steps"}
"""How the global batch is split: free to change with the number of processes (kiln.elastic)."""


def check_config_change(checkpoint: Path, config: Any, accelerator: Accelerator | None = None) -> None:
    """Refuse a resume whose settings differ from the checkpoint's run where that makes resuming inexact
    (batch size, sequence length, seed, data, model shape, steps, ...), or whose data files changed since (their
    sizes and sha256, `kiln.fingerprint`), unless --training.allow_config_change. With an `accelerator`, every
    process must call it: the main process hashes the data and tells the others."""
    import dataclasses

    from .fingerprint import data_changes, data_fingerprint, saved_fingerprint

    problems = []
    saved = saved_run_config(checkpoint)
    if saved is not None:
        # a checkpoint keeps its config without local paths (kiln.public), so both sides are compared that way:
        # a corpus or run folder moved to another place or machine (a resume from the Hub) is the same run
        old, new = flatten(public_config(saved)), flatten(public_config(dataclasses.asdict(config)))
        changed = [
            key
            for key in sorted(set(old) | set(new))
            if not key.startswith(_RESUME_FREE_KEYS) and key not in _RESUME_FREE_KEYS and key in old and key in new
            and old[key] != new[key]
            and not (isinstance(old[key], (int, float)) and isinstance(new[key], (int, float)) and old[key] == new[key])
        ]
        if changed and set(changed) <= _LAYOUT_CONFIG_KEYS:
            from .elastic import layout_change_is_elastic

            if layout_change_is_elastic(checkpoint, config):
                changed = []  # another number of processes at the same global batch: still an exact continuation
        if changed:
            problems.append("changed settings: " + ", ".join(f"{key} {old[key]!r} -> {new[key]!r}" for key in changed))
    data_diff = []
    if accelerator is None or accelerator.is_main_process:
        # hashed once, by the process that writes the fingerprint into checkpoints, not by every rank (a corpus of
        # a few GB read by 8 ranks at once would multiply the resume's start-up); the verdict is then shared, so
        # every rank refuses or goes on alike
        saved_prints = saved_fingerprint(checkpoint)
        if saved_prints is not None:
            data_diff = data_changes(saved_prints, data_fingerprint(getattr(config, "data", None)))
    if accelerator is not None and accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        data_diff = broadcast_object_list([data_diff])[0]
    if data_diff:
        problems.append("changed data: " + ", ".join(data_diff))
    if not problems:
        return
    diff = "; ".join(problems)
    if config.training.allow_config_change:
        logger.warning("resuming with %s: the run is no longer an exact continuation", diff)
        return
    raise ConfigError(
        f"resuming {checkpoint} with {diff}; keep the saved values and data, or pass "
        "--training.allow_config_change to resume anyway (the result then differs from an uninterrupted run)"
    )


def check_checkpoint_metadata(path: Path, metadata: dict[str, Any]) -> None:
    """Refuse a checkpoint written by a run of another kind before anything is loaded into the wrong shapes."""
    saved = json.loads((Path(path) / TRAINER_STATE_FILE).read_text())
    for key, value in metadata.items():
        if key in saved and saved[key] != value:
            raise ConfigError(
                f"checkpoint {path} was written with {key}={saved[key]!r} but this run has {key}={value!r}; "
                "resume it with its own config, or start a new run in another output_dir"
            )


def check_step_counts(training: TrainingConfig) -> None:
    if training.max_steps == 0:
        raise ConfigError("--training.max_steps 0 trains nothing; give a positive number, or -1 to train by epochs")
    if training.max_steps < 0 and training.num_train_epochs <= 0:
        raise ConfigError("--training.num_train_epochs must be > 0 when max_steps is -1")


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
    ):
        self.accelerator = accelerator
        self.training = training
        self.logging_cfg = logging_cfg
        self.train_dataset = train_dataset
        self.collator = collator
        self.eval_dataset = eval_dataset
        self.eval_collator = eval_collator or collator
        self.evaluator = evaluator
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
        self.output_dir = Path(training.output_dir)
        self.state = TrainState()
        self._stop_signal: int | None = None
        self.stop_signals = 0
        """How many stop signals (SIGTERM, SIGINT) the run received; end-of-run callbacks watch it."""
        self._eval_loader = None
        self._train_loader = None
        self._epoch_batches: int | None = None
        self._lengths_cache: tuple[Any, list[int]] | None = None
        self.steps_per_epoch: int | None = None

        check_step_counts(training)
        self._prepare(model)

    def _prepare(self, model: torch.nn.Module) -> None:
        """Gradient checkpointing, AdamW, accelerate's prepare, the step count and the schedule (checkpointed)."""
        training, accelerator = self.training, self.accelerator
        if training.gradient_checkpointing:
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable()
        optimizer = build_optimizer(model, training, accelerator.device)
        self.model, self.optimizer = accelerator.prepare(model, optimizer)
        self.total_steps = self._total_steps()
        warmup = training.warmup_steps or math.ceil(training.warmup_ratio * self.total_steps)
        self.scheduler = get_scheduler(
            training.lr_scheduler_type, self.optimizer, num_warmup_steps=warmup, num_training_steps=self.total_steps
        )
        accelerator.register_for_checkpointing(self.scheduler, self.state)

    # --- sizes --------------------------------------------------------------------------------------------

    def _train_dataloader(self, epoch: int) -> DataLoader:
        dataset = self.train_dataset(epoch)
        # a fresh generator per epoch: the order depends on (seed, epoch) only, so a resumed run sees the same order
        # and no draw from the global RNG (which drives dropout) is spent on it
        generator = torch.Generator().manual_seed(self.training.seed * 1000 + epoch)
        is_iterable = isinstance(dataset, torch.utils.data.IterableDataset)
        if not is_iterable:
            dataset = _with_example_index(dataset, self.collator)
        sampler = None if is_iterable else self._train_sampler(dataset, generator)
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
            return RandomSampler(dataset, generator=generator)
        from transformers.trainer_pt_utils import LengthGroupedSampler

        return LengthGroupedSampler(
            self.training.per_device_train_batch_size, lengths=self._lengths(dataset), generator=generator
        )

    def _lengths(self, dataset) -> list[int]:
        """Tokens per example (cached per dataset: fine-tuning trains on the same one every epoch)."""
        inner = getattr(dataset, "dataset", dataset)  # the example-indexed wrapper
        if self._lengths_cache is None or self._lengths_cache[0] is not inner:
            if hasattr(inner, "column_names") and "input_ids" in inner.column_names:
                ids = inner.with_format(None)["input_ids"]  # one column read, no per-row Python access
            else:
                ids = [row["input_ids"] for row in inner]
            self._lengths_cache = (inner, [len(row) for row in ids])
        return self._lengths_cache[1]

    def _micro_batches_per_epoch(self) -> int | None:
        dataset = self.train_dataset(0)
        if isinstance(dataset, torch.utils.data.IterableDataset):
            return None
        global_batch = self.training.per_device_train_batch_size * self.accelerator.num_processes
        return len(dataset) // global_batch

    def _total_steps(self) -> int:
        micro = self._micro_batches_per_epoch()
        self.steps_per_epoch = (
            optimizer_steps_per_epoch(micro, self.training.gradient_accumulation_steps) if micro else None
        )
        if self.training.max_steps > 0:
            return self.training.max_steps
        if micro is None:
            raise ConfigError("a streaming dataset has no length: set --training.max_steps")
        if micro == 0:
            raise ConfigError(
                f"the training set is smaller than one batch ({self.training.per_device_train_batch_size} per device "
                f"x {self.accelerator.num_processes} process(es)); lower the batch size or add data"
            )
        epochs = self.training.num_train_epochs
        whole = int(epochs)
        # a fractional epoch (e.g. 1.5) trains the whole epochs, then that fraction of the next one's steps
        return whole * self.steps_per_epoch + math.ceil((epochs - whole) * self.steps_per_epoch)

    # --- checkpoints --------------------------------------------------------------------------------------

    def save_checkpoint(self) -> Path | None:
        """accelerate.save_state into a temp folder, renamed into place: a crash never leaves half a checkpoint.
        The run's config and a manifest (sizes + sha256 of every file) are written last, so a resume can tell a
        complete checkpoint from a damaged one."""
        acc = self.accelerator
        if getattr(self, "_nonfinite_run", None):  # the weights are not to be trusted: keep the last good one
            logger.warning("step %d: no checkpoint while the loss is not finite", self.state.global_step)
            return None
        if getattr(self, "_high_loss_steps", None):
            logger.warning("step %d: no checkpoint while the loss is far above its lowest", self.state.global_step)
            return None
        root = self.output_dir / "checkpoints"
        final = root / f"{CHECKPOINT_PREFIX}{self.state.global_step:08d}"
        tmp = root / f"{final.name}.tmp"
        writer = writes_run_files(acc, self.training)  # rank 0, or each node's local main on node-local disks
        if writer:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
        acc.wait_for_everyone()
        try:
            with disk_writes(tmp):
                acc.save_state(str(tmp))
                acc.wait_for_everyone()
                if writer:
                    follow_umask(tmp)  # safetensors writes model.safetensors owner-only
                    meta = {"global_step": self.state.global_step, "epoch": self.state.epoch, **self.metadata,
                            **layout_of(self.training, acc.num_processes).as_dict()}
                    (tmp / TRAINER_STATE_FILE).write_text(json.dumps(meta, indent=2))
                    if self.run_config is not None:
                        save_public_config(self.run_config, tmp / CONFIG_FILE)  # pushed by hub.strategy checkpoint
                        write_fingerprint(self._data_fingerprint(), tmp)
                    write_checksums(tmp)
        except BaseException:
            # a full disk, a kill: the half-written folder goes (it holds space a resume will need); the
            # completed checkpoints were not touched. Every process removes it: another one may still have been
            # writing its own files into it (a leftover is removed when the next run starts, `_remove_partial`)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if writer:
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            self._rotate_checkpoints(keep=final)
        acc.wait_for_everyone()
        for callback in self.callbacks:
            callback.on_save(self, final, self.state)
        return final

    def _data_fingerprint(self) -> dict[str, str]:
        """What this run trains on (computed once: the files are hashed at the first checkpoint)."""
        if getattr(self, "_data_prints", None) is None:
            from .fingerprint import data_fingerprint

            self._data_prints = data_fingerprint(getattr(self.run_config, "data", None))
        return self._data_prints

    def _remove_partial_checkpoints(self) -> None:
        """Half-written checkpoint folders (`*.tmp`) a killed or failed run left behind: never resumed from, they
        only hold disk space."""
        if writes_run_files(self.accelerator, self.training):
            for partial in (self.output_dir / "checkpoints").glob(f"{CHECKPOINT_PREFIX}*.tmp"):
                shutil.rmtree(partial, ignore_errors=True)

    def _forget_metrics_after(self, step: int) -> None:
        """metrics.jsonl rows of steps after the resumed checkpoint are replayed by this run: drop them."""
        path = self.output_dir / "metrics.jsonl"
        if not path.is_file():
            return
        lines = path.read_text().splitlines()
        kept = [line for line in lines if not line.strip() or json.loads(line).get("step", 0) <= step]
        if len(kept) != len(lines):
            tmp = path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(line + "\n" for line in kept))
            os.replace(tmp, path)

    def _rotate_checkpoints(self, keep: Path) -> None:
        """Remove the oldest checkpoints beyond save_total_limit (None or 0: keep all); never `keep`."""
        limit = self.training.save_total_limit
        if not limit or limit < 1:
            return
        for old in find_checkpoints(self.output_dir)[:-limit]:
            if old != keep:
                shutil.rmtree(old, ignore_errors=True)

    def resume(self, spec: str) -> Path:
        path = resolve_checkpoint(spec, str(self.output_dir), self._download_checkpoint)
        self._check_same_checkpoint(path)
        check_checkpoint_metadata(path, self.metadata)
        if self.run_config is not None:
            check_config_change(path, self.run_config, self.accelerator)
        try:
            self.accelerator.load_state(str(path))
        except (RuntimeError, ValueError, KeyError) as err:  # e.g. a checkpoint of another model shape
            first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
            raise ConfigError(
                f"checkpoint {path} does not fit this run ({first}); resume it with the config it was written with"
            ) from None
        # why the saved run stopped (a signal, the time budget) is no reason for this one to stop
        self.state.stop_reason = None
        # written on another number of processes: the same examples of the epoch, counted in this run's batches
        self.state.batches_in_epoch = convert_position(
            self.state.batches_in_epoch, saved_layout(path), layout_of(self.training, self.accelerator.num_processes)
        )
        if self.run_config is not None and self.accelerator.is_main_process:
            save_config(self.run_config, self.output_dir / "config.yaml")  # only now that the resume succeeded
        if self.accelerator.is_main_process:
            self._forget_metrics_after(self.state.global_step)
        logger.info("resumed from %s at step %d", path, self.state.global_step)
        return path

    def _check_same_checkpoint(self, path: Path) -> None:
        """Every process resumes the same step: on node-local disks each node resolves `latest` in its own folder,
        and a node whose newest checkpoint is missing or damaged would otherwise resume elsewhere."""
        acc = self.accelerator
        if acc.num_processes == 1:
            return
        from accelerate.utils import gather_object

        steps = gather_object([int(json.loads((path / TRAINER_STATE_FILE).read_text())["global_step"])])
        if len(set(steps)) > 1:
            raise ConfigError(
                f"the processes would resume different checkpoints (steps {steps} by rank): a node's newest "
                f"checkpoint is missing or damaged; resume all from one step, e.g. --training.resume_from_checkpoint "
                f"{path.parent}/{CHECKPOINT_PREFIX}{min(steps):08d}"
            )

    def _download_checkpoint(self, spec: str, local_dir: str) -> str:
        for callback in self.callbacks:
            path = callback.download_checkpoint(self, spec, local_dir)
            if path is not None:
                return path
        raise ConfigError("resuming from the Hub needs the hub module")

    # --- evaluation ---------------------------------------------------------------------------------------

    def evaluate(self) -> dict[str, float]:
        if self.evaluator is None or self.eval_dataset is None:
            return {}
        reset = getattr(self.eval_collator, "set_epoch", None)
        if reset is not None and self.eval_collator is not self.collator:
            reset(0)  # the same masks at every evaluation, so numbers are comparable across steps
        if self._eval_loader is None:  # prepared once: every evaluation reads the same shards in the same order
            dataset = _with_example_index(self.eval_dataset, self.eval_collator)
            if self.training.max_eval_batches:
                # a prefix of the eval set rather than breaking out of the loader: a loader left half-read stays
                # on accelerate's stack of active loaders and `gather_for_metrics` would not see its end
                per_step = self.training.per_device_eval_batch_size * self.accelerator.num_processes
                dataset = Subset(dataset, range(min(len(dataset), self.training.max_eval_batches * per_step)))
            self._eval_loader = self.accelerator.prepare(
                DataLoader(
                    dataset,
                    batch_size=self.training.per_device_eval_batch_size,
                    sampler=SequentialSampler(dataset),
                    collate_fn=self.eval_collator,
                )
            )
        loader = self._eval_loader
        was_training = self.model.training
        self.model.eval()
        # evaluation must not disturb the training RNG stream (dropout, masking) or resumed runs would diverge
        cpu_rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        try:
            with torch.no_grad():
                metrics = self.evaluator(self.model, loader, self.accelerator)
        finally:
            torch.set_rng_state(cpu_rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)
            self.model.train(was_training)
        return {f"eval/{k}": float(v) for k, v in metrics.items()}

    def _track_best(self, metrics: dict[str, float]) -> bool:
        """Update best metric and patience; True when training should stop early."""
        name = self.training.metric_for_best_model
        if not name:
            return False
        key = name if name.startswith("eval/") else f"eval/{name}"
        if key not in metrics:
            raise ConfigError(f"metric_for_best_model '{name}' is not among the eval metrics: {sorted(metrics)}")
        value = metrics[key]
        best = self.state.best_metric
        better = best is None or (value > best if self.training.greater_is_better else value < best)
        if better:
            self.state.best_metric, self.state.best_step = value, self.state.global_step
            self.state.evals_without_improvement = 0
            for callback in self.callbacks:
                callback.on_best(self, self.state)
        else:
            self.state.evals_without_improvement += 1
        patience = self.training.early_stopping_patience
        return bool(patience) and self.state.evals_without_improvement >= patience

    # --- logging ------------------------------------------------------------------------------------------

    def _log(self, metrics: dict[str, float]) -> None:
        entry = {"step": self.state.global_step, **metrics}
        self.state.history.append(entry)
        if self.accelerator.is_main_process and self.accelerator.trackers:
            self.accelerator.log(metrics, step=self.state.global_step)
        if self.accelerator.is_main_process:
            with open(self.output_dir / "metrics.jsonl", "a") as fh:
                fh.write(json.dumps(entry) + "\n")

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
            self._remove_partial_checkpoints()
            if self.training.resume_from_checkpoint:
                self.resume(self.training.resume_from_checkpoint)
            if self.accelerator.is_main_process and self.run_config is not None:
                self._data_fingerprint()  # the data as this run read it, saved with every checkpoint
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
        """Epoch after epoch until max_steps, the epochs, early stopping, the clock or a signal stop the run."""
        training, state = self.training, self.state
        self.model.train()
        self._window = _LogWindow()
        run_start = time.perf_counter() - state.train_time_s
        done = state.global_step >= self.total_steps
        while not done:
            if self._run_epoch(self._epoch_loader(), progress, run_start):
                break
            state.epoch += 1
            state.batches_in_epoch = 0
            if training.max_steps < 0 and state.epoch >= math.ceil(training.num_train_epochs):
                state.stop_reason = state.stop_reason or "epochs"
                done = True

    def _run_epoch(self, loader, progress, run_start: float) -> bool:
        """Optimizer steps over one epoch's loader; True when the run stops inside it."""
        batches = iter(loader)
        while True:
            micro_batches = list(itertools.islice(batches, self.training.gradient_accumulation_steps))
            if not micro_batches:
                return False  # end of the epoch
            self._train_step(micro_batches, progress)
            self.state.train_time_s = time.perf_counter() - run_start
            if self._after_step(progress):
                # stopped inside the epoch: take its loader off accelerate's stack of active loaders
                getattr(loader, "end", lambda: None)()
                return True

    def _train_step(self, micro_batches: list[dict], progress) -> None:
        """One optimizer step, its counters, and the training metrics every logging_steps."""
        state = self.state
        parts, grad_norm, tokens = self._optimizer_step(micro_batches)
        state.batches_in_epoch += len(micro_batches)
        state.global_step += 1
        state.tokens_seen += tokens
        self._window.add(parts, tokens)
        progress.update(1)
        if state.global_step % self.logging_cfg.logging_steps == 0 or state.global_step >= self.total_steps:
            metrics = self._train_metrics(self._window, grad_norm, self._epoch_batches)
            self._log(metrics)
            progress.set_postfix(loss=f"{metrics['train/loss']:.4f}", lr=f"{metrics['train/lr']:.2e}")
            self._window = _LogWindow()
        self._check_divergence()

    def _check_divergence(self) -> None:
        """Stop with a RunError once the loss of DIVERGENCE_STEPS optimizer steps in a row is far above its
        lowest value so far (training.divergence_factor): a run whose schedule decays the learning rate to 0
        before the loss overflows must not be exported as if it had trained."""
        factor, state = self.training.divergence_factor, self.state
        loss = getattr(self, "_step_loss", None)
        if not factor or loss is None or getattr(self, "_nonfinite_run", None) or not math.isfinite(loss):
            return
        if state.lowest_loss is None or loss < state.lowest_loss:
            state.lowest_loss, state.lowest_loss_step = loss, state.global_step
        if loss <= max(factor * state.lowest_loss, state.lowest_loss + factor):
            self._high_loss_steps = []
            return
        self._high_loss_steps = [*getattr(self, "_high_loss_steps", []), state.global_step]
        if len(self._high_loss_steps) < DIVERGENCE_STEPS:
            return
        from .errors import RunError

        checkpoints = find_checkpoints(self.output_dir)
        kept = f"the last good checkpoint is {checkpoints[-1]}" if checkpoints else "no checkpoint was saved"
        raise RunError(
            f"training diverged: the loss rose from {state.lowest_loss:.4g} (step {state.lowest_loss_step}) to "
            f"{loss:.4g} at steps {self._high_loss_steps[0]}-{state.global_step} (more than "
            f"--training.divergence_factor {factor:g} times its lowest); {kept}; no final model was exported; "
            "lower --training.lr or raise --training.warmup_steps, then resume or start over"
        )

    def _final_evaluation(self) -> None:
        final_metrics = self.evaluate()
        if final_metrics:
            self._log(final_metrics)
            if self.accelerator.is_main_process:
                print(_format_metrics(self.state.global_step, final_metrics))
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
                    logger.error("%s.on_train_end failed after the run had failed: %s", type(callback).__name__, err)
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
        real_tokens = sum(_real_tokens(b) for b in micro_batches)
        window_counts = [sum(counts.get(name, 0.0) for counts in local) for name in names]
        # one small all-reduce per step: the items of the whole window on every process, and its real tokens
        totals = acc.reduce(torch.tensor([*window_counts, float(real_tokens)], device=acc.device), reduction="sum")
        global_counts = dict(zip(names, totals[:-1].tolist()))
        # accelerate divides by its accumulation steps and DDP/FSDP/DeepSpeed average over processes: undo both,
        # so the gradient is that of the global per-item mean
        scale = acc.gradient_accumulation_steps * acc.num_processes
        parts = {n: torch.zeros((), device=acc.device) for n in names}
        # DeepSpeed takes its optimizer step inside the window's last `backward` (accelerate calls engine.step()
        # there) and accumulates inside its engine, so a non-finite loss must be caught before its own backward:
        # after it, nothing is left to skip
        deepspeed = acc.distributed_type == DistributedType.DEEPSPEED
        for i, (batch, counts) in enumerate(zip(micro_batches, local)):
            last = i == len(micro_batches) - 1
            acc.sync_gradients = last
            with contextlib.nullcontext() if last else acc.no_sync(model):
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
                if deepspeed and self._nonfinite(parts):
                    # neither this backward nor the rest of the window's: the engine does not step, and no NaN/inf
                    # gradient enters its buffers (the finite micro-batches before this one stay there and count
                    # towards the next step; with no accumulation there are none)
                    acc.sync_gradients = True
                    self._skip_nonfinite(parts, None)
                    self._add_total(parts)
                    return parts, float("nan"), int(totals[-1])
                acc.backward(objective * scale)
        max_norm = self.training.max_grad_norm if self.training.max_grad_norm > 0 else float("inf")
        grad_norm = acc.clip_grad_norm_(model.parameters(), max_norm)
        if self._skip_nonfinite(parts, grad_norm):
            if deepspeed and not acc.optimizer_step_was_skipped:
                self._applied_nonfinite_step()
            self.optimizer.zero_grad(set_to_none=True)
            self._add_total(parts)
            return parts, grad_norm, int(totals[-1])
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if not acc.optimizer_step_was_skipped:  # fp16 overflow: no step taken, so the schedule does not move
            self.scheduler.step()
        self._add_total(parts)
        return parts, grad_norm, int(totals[-1])

    def _add_total(self, parts: dict[str, torch.Tensor]) -> None:
        """`loss`: the weighted sum of the parts, the total the model optimises (e.g. MLM + NSP)."""
        if "loss" not in parts and parts:
            parts["loss"] = sum(value * self.loss_weights.get(name, 1.0) for name, value in parts.items())

    def _nonfinite(self, parts: dict[str, torch.Tensor], grad_norm=None) -> bool:
        """Whether this step's loss or gradient norm (None: not known yet) is NaN/inf on any process; sets
        `_step_loss`, the step's global mean loss."""
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
        self._step_loss = float(flags[1])
        return bool(flags[0])

    def _applied_nonfinite_step(self):
        """DeepSpeed took a step whose gradient norm was NaN/inf (the loss was finite, so Kiln could not catch it
        before the engine stepped, and DeepSpeed's own overflow check did not skip it): the weights may now hold
        NaN/inf, so the run stops at once, exporting nothing."""
        from .errors import RunError

        checkpoints = find_checkpoints(self.output_dir)
        kept = f"the last good checkpoint is {checkpoints[-1]}" if checkpoints else "no checkpoint was saved"
        raise RunError(
            f"training diverged: DeepSpeed applied step {self.state.global_step + 1} with a NaN/inf gradient norm; "
            f"{kept}; no final model was exported; turn on DeepSpeed's overflow check (bf16.check_grad_overflow), "
            "lower --training.lr or keep --training.max_grad_norm on, then resume or start over"
        )

    def _skip_nonfinite(self, parts: dict[str, torch.Tensor], grad_norm) -> bool:
        """True when this step's loss or gradient norm is NaN/inf: the step is then not applied (the weights stay
        finite). After training.max_nonfinite_steps such steps in a row the run stops with a RunError; the last
        checkpoint stays the last good one and no final model is exported."""
        if not self._nonfinite(parts, grad_norm):
            self._nonfinite_run = []
            return False
        step = self.state.global_step + 1
        self._nonfinite_run = [*getattr(self, "_nonfinite_run", []), step]
        limit = self.training.max_nonfinite_steps
        logger.warning(
            "step %d: the loss or gradient norm is not finite (%s); step skipped (%d in a row, limit %d)",
            step, ", ".join(f"{n} {float(v):.4g}" for n, v in parts.items()), len(self._nonfinite_run), limit,
        )
        if len(self._nonfinite_run) > limit:
            from .errors import RunError

            checkpoints = find_checkpoints(self.output_dir)
            kept = f"the last good checkpoint is {checkpoints[-1]}" if checkpoints else "no checkpoint was saved"
            raise RunError(
                f"training diverged: the loss or gradient norm was NaN/inf at steps "
                f"{self._nonfinite_run[0]}-{step}; {kept}; no final model was exported; lower --training.lr, "
                "raise --training.warmup_steps or keep --training.max_grad_norm on, then resume or start over"
            )
        return True

    def _train_metrics(self, window: _LogWindow, grad_norm, epoch_batches: int | None) -> dict[str, float]:
        acc, state = self.accelerator, self.state
        names = sorted(window.sums)
        # each process holds its share of every step's global mean: the sum over processes is the mean
        means = acc.reduce(torch.stack([window.sums[n] for n in names]), reduction="sum") / window.steps
        elapsed = max(time.perf_counter() - window.start, 1e-9)
        metrics = {f"train/{name}": value for name, value in zip(names, means.tolist())}
        metrics.update({
            "train/lr": self.scheduler.get_last_lr()[0],
            "train/grad_norm": float(grad_norm),
            "train/tokens_per_s": window.tokens / elapsed,
            "train/epoch": state.epoch + state.batches_in_epoch / epoch_batches if epoch_batches else state.epoch,
        })
        mfu = self._mfu(metrics["train/tokens_per_s"])
        if mfu is not None:
            metrics["train/mfu"] = mfu
        return metrics

    def _after_step(self, progress) -> bool:
        """Evaluate, stop and checkpoint as the step count, the clock and signals say; True when done."""
        training, state = self.training, self.state
        done = state.global_step >= self.total_steps
        stop = self._agreed_stop(state.train_time_s)
        if training.eval_steps and state.global_step % training.eval_steps == 0 and not done:
            eval_metrics = self.evaluate()
            if eval_metrics:
                self._log(eval_metrics)
                progress.write(_format_metrics(state.global_step, eval_metrics))
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

    def _print_summary(self) -> None:
        """What transformers' Trainer prints before training: enough to review how a run was set up."""
        acc, training = self.accelerator, self.training
        if not acc.is_main_process:
            return
        dataset = self.train_dataset(self.state.epoch)
        examples = "streaming" if isinstance(dataset, torch.utils.data.IterableDataset) else f"{len(dataset):,}"
        global_batch = training.per_device_train_batch_size * acc.num_processes * training.gradient_accumulation_steps
        seq_len = getattr(dataset, "max_seq_length", None) or getattr(self, "max_seq_length", None)
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        epochs = training.num_train_epochs if training.max_steps < 0 else "until max_steps"
        lines = [
            f"examples = {examples}",
            f"epochs = {epochs}" + (f" ({self.steps_per_epoch} optimizer steps each)" if self.steps_per_epoch else ""),
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
        peak = self.logging_cfg.peak_flops or guess_peak_flops(self.accelerator.device, self.accelerator.mixed_precision)
        if not peak or not self.flops_per_token:
            return None
        return tokens_per_s * self.flops_per_token / (peak * self.accelerator.num_processes)


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


class _ExampleIndexed(torch.utils.data.Dataset):
    """Rows of `dataset` with their position added as `example_index`, for collators whose randomness is per
    example (the MLM collator: masks from (seed, epoch, example index), the same on any number of processes)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> dict:
        return {**self.dataset[index], "example_index": index}

    def __getitems__(self, indices: list[int]) -> list[dict]:
        getitems = getattr(self.dataset, "__getitems__", None)
        rows = getitems(indices) if getitems is not None else [self.dataset[i] for i in indices]
        return [{**row, "example_index": index} for row, index in zip(rows, indices)]


def _with_example_index(dataset, collator):
    return _ExampleIndexed(dataset) if getattr(collator, "wants_example_index", False) else dataset


def _real_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Tokens that are not padding (tokens/s, tokens_seen and MFU count these)."""
    mask = batch.get("attention_mask")
    if torch.is_tensor(mask):
        return int(mask.sum())
    ids = batch.get("input_ids")
    return int(ids.numel()) if torch.is_tensor(ids) else 0


class _LogWindow:
    """Loss parts, steps and real tokens summed over the optimizer steps of one logging interval."""

    def __init__(self):
        self.sums: dict[str, torch.Tensor] = {}
        self.steps = 0
        self.tokens = 0
        self.start = time.perf_counter()

    def add(self, parts: dict[str, torch.Tensor], tokens: int) -> None:
        for name, value in parts.items():
            self.sums[name] = self.sums[name] + value if name in self.sums else value
        self.steps += 1
        self.tokens += tokens


def _format_metrics(step: int, metrics: dict[str, float]) -> str:
    return f"step {step}: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())


# Dense bf16/fp16 tensor-core peaks (no sparsity) of common accelerators, for the MFU estimate.
_PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "A10G": 125e12, "L4": 121e12, "V100": 125e12}


def guess_peak_flops(device: torch.device, mixed_precision: str) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, peak in _PEAK_FLOPS.items():
        if key in name:
            return peak if mixed_precision in ("bf16", "fp16") else peak / 2
    return None


__all__ = [
    "TrainState",
    "Trainer",
    "count_loss_items",
    "optimizer_steps_per_epoch",
    "build_accelerator",
    "build_optimizer",
    "check_checkpoint_metadata",
    "check_config_change",
    "checkpoint_problem",
    "configure_deepspeed",
    "find_checkpoints",
    "guess_peak_flops",
    "lock_output_dir",
    "prepare_output",
    "release_output_lock",
    "resolve_batch_size",
    "resolve_checkpoint",
    "start_run",
]

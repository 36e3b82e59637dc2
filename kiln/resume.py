"""Resuming a run: every decision about it, made once, as one `ResumePlan`.

    run_job
      plan_resume (before the Accelerator; for `hub:` right after the download): which checkpoint (`latest`
      skips damaged ones), its files verified against its checksums.json (each file read and hashed once), the
      kind of run that wrote it, its saved batch layout and the one this run takes (the accumulation that keeps
      the global batch on another number of processes, or a one-line refusal), its saved config, and its data
      compared with this run's (hashed by the main process only)
      check_plan (every process, once the Accelerator is up): the same checkpoint everywhere, the settings
      compared with the run's own (as the engine derived them), the main process's data verdict shared, a
      changed run refused (or warned of with --training.allow_config_change), pickles refused without
      --training.trust_checkpoint_pickles; returns the completed plan
      Trainer.resume(plan): the state checked and loaded (kiln.checkpoint_state); a `latest` whose state turns out
      damaged falls back to the next older checkpoint (`fallback`, a new plan)

The user's config is never changed: the layout this run takes lives in the plan, and in the run's own copy of the
config (`kiln.job.run_copy`), which config.yaml and every checkpoint record. torchtitan's CheckpointManager is the
anchor: one object decides which checkpoint a run loads; the training loop only loads it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import file_hash
from .checkpoint_config import saved_run_config
from .checkpoint_files import CHECKSUMS_FILE, TRAINER_STATE_FILE, find_checkpoints, trainer_state_problem
from .config import flatten
from .elastic import LAYOUT_KEYS, BatchLayout, layout_of
from .errors import ConfigError
from .public import public_config

logger = logging.getLogger("kiln")

HUB_PREFIX = "hub:"
HUB_FOLDER = "hub-checkpoint"
"""Where, in the run folder, a `hub:` checkpoint is downloaded."""


@dataclass(frozen=True)
class ResumePlan:
    """Everything decided about a resume before any state is loaded."""

    spec: str
    """--training.resume_from_checkpoint as given: `latest`, a folder or `hub:user/name`."""
    folder: Path
    """The checkpoint resumed."""
    files: Mapping[str, str]
    """Its files verified against its checksums.json: name -> sha256 (empty for a checkpoint without one)."""
    skipped: tuple[str, ...]
    """Newer checkpoints `latest` passed over, `step-N: why` each."""
    saved_state: Mapping[str, Any]
    """Its trainer_state.json."""
    saved_layout: BatchLayout | None
    """The batch layout it was written with (None: unknown, a checkpoint older than the record of it)."""
    layout: BatchLayout
    """The layout this run trains with."""
    elastic: str | None
    """Why the layout differs from the configured one (another number of processes), to log; None: it does not."""
    saved_config: Mapping[str, Any] | None
    """The config it was written with (None: none kept)."""
    pickled: bool
    """Loaded with accelerate's pickle loader (an older format, with --training.trust_checkpoint_pickles)."""
    data_changes: tuple[str, ...] | None
    """The data changed since (`kiln.fingerprint`); None: not hashed by this process, which `check_plan` gives
    the main process's verdict."""
    setting_changes: tuple[str, ...] = ()
    """Settings changed since, where that makes the resume inexact (`key old -> new` each): compared by
    `check_plan` with the run's own values (its precision, its per-device batch), known once it has started."""

    @property
    def shown(self) -> str:
        """How a refusal names the checkpoint: the folder `latest` resolved to, else what the user gave."""
        return str(self.folder) if self.spec == "latest" else self.spec

    @property
    def hub(self) -> bool:
        return is_hub(self.spec)


def is_hub(spec: str | None) -> bool:
    return bool(spec) and spec.startswith(HUB_PREFIX)


def plan_resume(
    config: Any,
    num_processes: int,
    metadata: Mapping[str, Any] | None = None,
    *,
    main_process: bool = True,
    folder: str | Path | None = None,
    skip: Mapping[str, str] | None = None,
    layout: BatchLayout | None = None,
) -> ResumePlan:
    """The plan for resuming `config.training.resume_from_checkpoint` on `num_processes`.

    `folder`: the downloaded `hub:` checkpoint. `skip`: checkpoints (folder name: why) found damaged by a later
    check, which `latest` passes over. `layout`: the layout of a run already started (a fallback keeps it).
    `main_process`: this process hashes the data (the others get its verdict in `check_plan`)."""
    training = config.training
    spec = training.resume_from_checkpoint
    skipped: list[str] = []
    if folder is not None:
        folder = Path(folder)
        files, problem = _verified_files(folder)
    elif spec == "latest":
        folder, files, problem = _latest(training.output_dir, skip or {}, skipped)
    else:
        folder = Path(spec)
        if not (folder / TRAINER_STATE_FILE).is_file():
            raise ConfigError(
                f"--training.resume_from_checkpoint {spec}: not a Kiln checkpoint (no {TRAINER_STATE_FILE}); "
                f"use 'latest' or a folder like {training.output_dir}/checkpoints/step-00000200"
            )
        files, problem = _verified_files(folder)
    if problem is not None:
        raise ConfigError(
            f"checkpoint {spec} is damaged: {problem}; resume from an older checkpoint "
            "(--training.resume_from_checkpoint latest picks the newest valid one)"
        )
    saved_state = json.loads((folder / TRAINER_STATE_FILE).read_text())
    _refuse_other_kind(folder, saved_state, metadata or {})
    saved_layout = read_saved_layout(folder, saved_state)
    elastic = None
    if layout is None:
        layout, elastic = new_layout(saved_layout, training, num_processes, folder)
    saved_config = saved_run_config(folder)
    from .checkpoint_format import LOOP_STATE_FILE, pickle_files

    return ResumePlan(
        spec=spec,
        folder=folder,
        files=files,
        skipped=tuple(skipped),
        saved_state=saved_state,
        saved_layout=saved_layout,
        layout=layout,
        elastic=elastic,
        saved_config=saved_config,
        pickled=bool(pickle_files(folder)) and not (folder / LOOP_STATE_FILE).is_file(),
        data_changes=data_changes_since(folder, config) if main_process else None,
    )


def check_plan(plan: ResumePlan, accelerator, config: Any) -> ResumePlan:
    """The plan completed once the run has started (a collective: every process calls it) and checked: every
    process resumes the same step, the settings of the run's `config` (its copy, with what the engine derived)
    compared with the saved ones, the main process's data verdict made everyone's; a changed run refused unless
    --training.allow_config_change, pickles without their opt-in refused. Returns the completed plan."""
    from .checkpoint_format import refuse_pickles

    if plan.skipped:
        logger.warning(
            "skipping damaged checkpoint(s) %s; resuming from %s, the newest valid one",
            "; ".join(plan.skipped),
            plan.folder.name,
        )
    _check_same_step(plan, accelerator)
    data = list(plan.data_changes or [])
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        data = broadcast_object_list([data])[0]
    plan = dataclasses.replace(
        plan,
        # compared as the run has them: its per-device batch, precision and layout as the engine derived them
        setting_changes=setting_changes(
            plan.saved_config,
            config,
            plan.saved_layout,
            layout_of(config.training, accelerator.num_processes),
        ),
        data_changes=tuple(data),
    )
    problems = []
    if plan.setting_changes:
        problems.append("changed settings: " + ", ".join(plan.setting_changes))
    if plan.data_changes:
        problems.append("changed data: " + ", ".join(plan.data_changes))
    if problems:
        diff = "; ".join(problems)
        if not config.training.allow_config_change:
            raise ConfigError(
                f"resuming {plan.folder} with {diff}; keep the saved values and data, or pass "
                "--training.allow_config_change to resume anyway (the result then differs from an uninterrupted run)"
            )
        logger.warning("resuming with %s: the run is no longer an exact continuation", diff)
    refuse_pickles(plan.folder, plan.shown, config.training.trust_checkpoint_pickles)
    return plan


def fallback(
    plan: ResumePlan, problem: str, config: Any, metadata: Mapping[str, Any], accelerator
) -> ResumePlan:
    """`latest`'s next older checkpoint, once the state of `plan`'s turned out damaged (`problem`) while loading;
    an explicit checkpoint is refused. The run's layout is kept: its Accelerator is built."""
    if plan.spec != "latest":
        raise ConfigError(
            f"checkpoint {plan.shown} is damaged: {problem}; resume from an older checkpoint "
            "(--training.resume_from_checkpoint latest picks the newest valid one)"
        )
    skip = {**dict(s.split(": ", 1) for s in plan.skipped), plan.folder.name: problem}
    older = plan_resume(
        config,
        accelerator.num_processes,
        metadata,
        main_process=accelerator.is_main_process,
        skip=skip,
        layout=plan.layout,
    )
    return check_plan(older, accelerator, config)


def check_metadata(plan: ResumePlan, metadata: Mapping[str, Any]) -> None:
    """What an app knows of its run once built (a task, its number of labels), against the checkpoint's."""
    _refuse_other_kind(plan.folder, plan.saved_state, metadata)


# ----------------------------------------------------------------------------------------------------------
# which checkpoint, and its files


def _latest(
    output_dir: str, skip: Mapping[str, str], skipped: list[str]
) -> tuple[Path, dict[str, str], str | None]:
    """The newest checkpoint whose files pass (`skipped` gets the damaged newer ones), or a one-line refusal."""
    checkpoints = find_checkpoints(output_dir)
    if not checkpoints:
        raise ConfigError(
            f"--training.resume_from_checkpoint latest: no checkpoint in {output_dir}/checkpoints; "
            "start without it, or point it at a checkpoint folder"
        )
    for candidate in reversed(checkpoints):
        files, problem = ({}, skip[candidate.name]) if candidate.name in skip else _verified_files(candidate)
        if problem is None:
            return candidate, files, None
        skipped.append(f"{candidate.name}: {problem}")
    raise ConfigError(
        f"no valid checkpoint in {output_dir}/checkpoints ({'; '.join(skipped)}); "
        "start over with --training.overwrite_output_dir"
    )


def _verified_files(folder: Path) -> tuple[dict[str, str], str | None]:
    """The checkpoint `folder`'s files checked against its checksums.json: (name -> sha256, None), or ({}, why it
    cannot be resumed from: missing, truncated or changed files). Each file is read once. A checkpoint written
    before checksums existed is only checked for a readable trainer_state.json and whole files."""
    try:
        state = json.loads((folder / TRAINER_STATE_FILE).read_text())
    except (OSError, ValueError) as err:
        return {}, f"{TRAINER_STATE_FILE} is unreadable ({type(err).__name__})"
    problem = trainer_state_problem(state)
    if problem:
        return {}, problem
    manifest_path = folder / CHECKSUMS_FILE
    if not manifest_path.is_file():
        return {}, _unverified_problem(folder)
    try:
        manifest = json.loads(manifest_path.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}, f"{CHECKSUMS_FILE} is unreadable"
    files = {}
    for name, expected in manifest.items():
        path = folder / name
        if not path.is_file():
            return {}, f"{name} is missing"
        size = path.stat().st_size
        if size != expected["size"]:
            return {}, f"{name} has {size} bytes instead of {expected['size']} (truncated?)"
        files[name] = file_hash.hash_file(path)
        if files[name] != expected["sha256"]:
            return {}, f"{name} does not match its checksum (changed on disk)"
    return files, None


def _unverified_problem(folder: Path) -> str | None:
    """For a checkpoint without a manifest (written before manifests existed, or whose manifest was lost): the
    structural checks that need no checksum. A safetensors file must hold as many bytes as its header says, and
    a torch pickle (a zip archive) must end with its central directory: a truncated file fails either."""
    import zipfile

    from .model_files import safetensors_header

    for path in sorted(folder.glob("*.safetensors")):
        try:
            safetensors_header(path)  # its header read, and the file as long as the header says
        except OSError as err:
            return str(err)
    for path in sorted([*folder.glob("*.bin"), *folder.glob("*.pt"), *folder.glob("*.pth")]):
        if not zipfile.is_zipfile(path):
            return f"{path.name} is truncated or not a torch file"
    return None


def _refuse_other_kind(folder: Path, saved_state: Mapping[str, Any], metadata: Mapping[str, Any]) -> None:
    """Refuse a checkpoint written by a run of another kind before anything is loaded into the wrong shapes."""
    for key, value in metadata.items():
        if key in saved_state and saved_state[key] != value:
            raise ConfigError(
                f"checkpoint {folder} was written with {key}={saved_state[key]!r} but this run has {key}={value!r}; "
                "resume it with its own config, or start a new run in another output_dir"
            )


def _check_same_step(plan: ResumePlan, accelerator) -> None:
    """Every process resumes the same step: on node-local disks each node resolves `latest` in its own folder,
    and a node whose newest checkpoint is missing or damaged would otherwise resume elsewhere."""
    if accelerator.num_processes == 1:
        return
    from accelerate.utils import gather_object

    from .checkpoint_files import CHECKPOINT_PREFIX

    steps = gather_object([int(plan.saved_state["global_step"])])
    if len(set(steps)) > 1:
        raise ConfigError(
            f"the processes would resume different checkpoints (steps {steps} by rank): a node's newest "
            f"checkpoint is missing or damaged; resume all from one step, e.g. --training.resume_from_checkpoint "
            f"{plan.folder.parent}/{CHECKPOINT_PREFIX}{min(steps):08d}"
        )


# ----------------------------------------------------------------------------------------------------------
# the batch layout (kiln.elastic)


def read_saved_layout(checkpoint: str | Path, state: Mapping[str, Any] | None = None) -> BatchLayout | None:
    """The layout a checkpoint was written with: from its trainer_state.json (`state`, read if not given), or,
    for checkpoints written before it was recorded there, from its per-process RNG files and its saved config.
    None: unknown."""
    checkpoint = Path(checkpoint)
    if state is None:
        try:
            state = json.loads((checkpoint / TRAINER_STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
    if all(isinstance(state.get(key), int) for key in LAYOUT_KEYS):
        return BatchLayout(*(state[key] for key in LAYOUT_KEYS))
    processes = len(list(checkpoint.glob("rng_state_*.safetensors"))) or len(
        list(checkpoint.glob("random_states_*.pkl"))
    )
    training = (saved_run_config(checkpoint) or {}).get("training") or {}
    batch, accumulation = (
        training.get("per_device_train_batch_size"),
        training.get("gradient_accumulation_steps"),
    )
    if not processes or not isinstance(batch, int) or not isinstance(accumulation, int):
        return None
    return BatchLayout(processes, batch, accumulation)


def new_layout(
    saved: BatchLayout | None, training: Any, num_processes: int, checkpoint: str | Path
) -> tuple[BatchLayout, str | None]:
    """The layout resuming a checkpoint of layout `saved` takes on `num_processes`, and what changed (to log):
    written on as many processes (or unknown), the configured one; on another number, the accumulation that keeps
    its global batch (the per-device batch stays, so each device's memory does not change), or a one-line
    refusal when none does."""
    if saved is None or saved.num_processes == num_processes:
        return _configured_layout(training, num_processes), None
    if training.total_train_batch_size is not None:
        # the per-device batch would be derived from the total; keep the saved one, the total stays the same
        per_device = saved.per_device_train_batch_size
    else:
        per_device = training.per_device_train_batch_size
    micro_step = per_device * num_processes
    if saved.global_batch % micro_step:
        fitting = [n for n in range(1, saved.global_batch + 1) if saved.global_batch % (n * per_device) == 0]
        raise ConfigError(
            f"checkpoint {checkpoint} was trained at a global batch of {saved.describe()}, which {num_processes} "
            f"process(es) x {per_device} per device cannot keep; resume on "
            f"{', '.join(map(str, fitting[:8]))} process(es), or set --training.per_device_train_batch_size so "
            f"that it x {num_processes} divides {saved.global_batch}"
        )
    accumulation = saved.global_batch // micro_step
    message = (
        f"resuming a checkpoint of {saved.num_processes} process(es) on {num_processes}: gradient accumulation "
        f"{saved.gradient_accumulation_steps} -> {accumulation} keeps the global batch of {saved.global_batch} "
        "sequences"
    )
    return BatchLayout(num_processes, per_device, accumulation), message


def _configured_layout(training: Any, num_processes: int) -> BatchLayout:
    """The layout the config names: its per-device batch, or the one its total_train_batch_size gives
    (`kiln.run_setup.resolve_batch_size` derives it alike once the run starts, or refuses an uneven total)."""
    layout = layout_of(training, num_processes)
    total, parts = training.total_train_batch_size, num_processes * layout.gradient_accumulation_steps
    if total is not None and total > 0 and total % parts == 0:
        return dataclasses.replace(layout, per_device_train_batch_size=total // parts)
    return layout


# ----------------------------------------------------------------------------------------------------------
# what changed since


# settings that may change between a run and its resume without changing what is trained
_RESUME_FREE_KEYS = (
    "training.output_dir",
    "training.resume_from_checkpoint",
    "training.overwrite_output_dir",
    "training.trust_checkpoint_pickles",
    "training.save_on_each_node",
    "training.allow_config_change",
    "training.eval_steps",
    "training.save_steps",
    "training.save_total_limit",
    "training.max_eval_batches",
    "training.per_device_eval_batch_size",
    "training.max_train_time_s",
    "training.metric_for_best_model",
    "training.greater_is_better",
    "training.early_stopping_patience",
    "training.divergence_factor",
    "data.num_workers",
    "data.num_proc",
    "data.cache_dir",
    "data.max_eval_documents",
    "tokenizer.name_or_path",
    "predict",
    "logging.",
    "hub.",
    "eval.",
)

_LAYOUT_CONFIG_KEYS = {"training.per_device_train_batch_size", "training.gradient_accumulation_steps"}
"""How the global batch is split: free to change with the number of processes (kiln.elastic)."""


def setting_changes(
    saved: Mapping[str, Any] | None, config: Any, saved_layout: BatchLayout | None, layout: BatchLayout
) -> tuple[str, ...]:
    """The settings of `config` that differ from the `saved` config where that makes resuming inexact (batch
    size, sequence length, seed, data, model shape, steps, ...): `key old -> new` each. A config with a
    `compared_on_resume(flat)` method has both sides, flattened, read through it first. The per-device batch and
    accumulation may differ when `layout` (this run's) keeps the saved global batch."""
    if saved is None:
        return ()
    # a checkpoint keeps its config without local paths (kiln.public), so both sides are compared that way:
    # a corpus or run folder moved to another place or machine (a resume from the Hub) is the same run
    old, new = flatten(public_config(saved)), flatten(public_config(dataclasses.asdict(config)))
    # the app's reading of a config's options, if any (pretrain: an option left unset by its preset's)
    compared = getattr(config, "compared_on_resume", None)
    if compared is not None:
        old, new = compared(old), compared(new)
    changed = [
        key
        for key in sorted(set(old) | set(new))
        if not key.startswith(_RESUME_FREE_KEYS)
        and key not in _RESUME_FREE_KEYS
        and key in old
        and key in new
        and old[key] != new[key]
        and not (
            isinstance(old[key], (int, float)) and isinstance(new[key], (int, float)) and old[key] == new[key]
        )
    ]
    if changed and set(changed) <= _LAYOUT_CONFIG_KEYS:
        if saved_layout is not None and layout.global_batch == saved_layout.global_batch:
            changed = []  # another number of processes at the same global batch: still an exact continuation
    return tuple(f"{key} {old[key]!r} -> {new[key]!r}" for key in changed)


def data_changes_since(checkpoint: Path, config: Any) -> tuple[str, ...]:
    """What differs between the data the checkpoint's run trained on and `config`'s (sizes and sha256 of its
    files, `kiln.fingerprint`): read by one process only, a corpus of a few GB read by 8 ranks at once would
    multiply the resume's start-up."""
    from .fingerprint import data_changes, data_fingerprint, saved_fingerprint

    saved = saved_fingerprint(checkpoint)
    if saved is None:
        return ()
    return tuple(data_changes(saved, data_fingerprint(getattr(config, "data", None))))


def launched_as_main() -> bool:
    """Whether this process is the launch's first (rank 0), read before accelerate's state is built (as
    accelerate reads it: torchrun's RANK, or an MPI launcher's)."""
    for name in ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK"):
        if os.environ.get(name, "").strip():
            return int(os.environ[name]) == 0
    return True


__all__ = [
    "HUB_FOLDER",
    "ResumePlan",
    "check_metadata",
    "check_plan",
    "data_changes_since",
    "fallback",
    "is_hub",
    "launched_as_main",
    "new_layout",
    "plan_resume",
    "read_saved_layout",
    "setting_changes",
]

"""Several nodes, one run folder or one per node: who writes the run's files where.

A run on several nodes either shares one output_dir (a network file system) or gives each node its own
(node-local disks, as cloud VMs without shared storage have). On a shared folder one process (global rank 0)
writes the run's files; on node-local disks every node's local main process writes its own copy of what the
node needs to go on: the run's config, the tokenizer and every checkpoint (model, optimizer, scheduler, the
trainer's counters, and the random states of the node's processes), so `--training.resume_from_checkpoint
latest` works on each node from its own disk. This is transformers' `save_on_each_node` and accelerate's
`ProjectConfiguration.save_on_each_node`. Metrics, logs and the final model are written by rank 0 only.

`training.save_on_each_node` None (the default) detects the layout: every node's local main process writes a
marker named by a token that rank 0 draws for this run, and each looks which markers it sees. All see all:
shared. Each sees only its own: node-local. Anything else (some nodes share the folder, some do not) is refused
in one line, as no writer could be chosen that neither misses a node nor writes one file twice at once.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from .config import TrainingConfig
from .errors import ConfigError

MARKER_PREFIX = ".kiln-node-"


def detect_save_on_each_node(accelerator, output_dir: str | os.PathLike) -> bool:
    """True when the nodes of this run do not share `output_dir` (node-local disks); see the module docstring."""
    from accelerate.utils import broadcast_object_list, gather_object

    if accelerator.num_processes == 1 or _single_node(accelerator):
        return False
    out = Path(output_dir)
    token = broadcast_object_list([uuid.uuid4().hex if accelerator.is_main_process else None])[0]
    mine = out / f"{MARKER_PREFIX}{token}-{accelerator.process_index}"
    if accelerator.is_local_main_process:
        out.mkdir(parents=True, exist_ok=True)
        mine.touch()
    accelerator.wait_for_everyone()
    seen = None
    if accelerator.is_local_main_process:
        seen = sorted(int(p.name.rsplit("-", 1)[1]) for p in out.glob(f"{MARKER_PREFIX}{token}-*"))
    views = [view for view in gather_object([seen]) if view is not None]
    accelerator.wait_for_everyone()
    if accelerator.is_local_main_process:
        mine.unlink(missing_ok=True)
    writers = sorted({rank for view in views for rank in view})
    if all(view == writers for view in views):
        return False
    if all(len(view) == 1 for view in views):
        return True
    raise ConfigError(
        f"output_dir {out} is shared by some nodes but not by others (the local main processes "
        f"see {views}); give every node the same shared folder or each node its own disk, or set "
        "--training.save_on_each_node true (each node writes its copy) or false (rank 0 writes)"
    )


def _single_node(accelerator) -> bool:
    local = os.environ.get("LOCAL_WORLD_SIZE")
    return local is not None and int(local) == accelerator.num_processes


def resolve_disk_layout(accelerator, training: TrainingConfig) -> None:
    """Settle training.save_on_each_node (detected when None) and hand it to accelerate's save_state."""
    if training.save_on_each_node is None:
        training.save_on_each_node = detect_save_on_each_node(accelerator, training.output_dir)
    accelerator.project_configuration.save_on_each_node = bool(training.save_on_each_node)


def writes_run_files(accelerator, training: TrainingConfig) -> bool:
    """Whether this process writes the run folder's files that every node needs (config, tokenizer,
    checkpoints): rank 0 on a shared folder, each node's local main process on node-local disks. A `training`
    left at None (the user's own config: the engine settles the run's copy) reads the layout settled into the
    accelerator (`resolve_disk_layout`)."""
    each_node = training.save_on_each_node
    if each_node is None:
        project = getattr(accelerator, "project_configuration", None)
        each_node = getattr(project, "save_on_each_node", False)
    if each_node:
        return accelerator.is_local_main_process
    return accelerator.is_main_process


__all__ = ["detect_save_on_each_node", "resolve_disk_layout", "writes_run_files"]

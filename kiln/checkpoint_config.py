"""The run config a checkpoint was written with: `CONFIG_FILE` in the checkpoint folder (older checkpoints: the run
folder's config.yaml). Read on resume by the Trainer (config changes) and by `kiln.elastic` (the saved batch layout);
a module of its own so that neither of those two imports the other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CONFIG_FILE = "kiln_config.yaml"
"""The run's resolved config, saved with every checkpoint and compared with the new one on resume."""


def saved_run_config(checkpoint: Path) -> dict[str, Any] | None:
    """The config a checkpoint was written with (its own copy, else its run folder's config.yaml)."""
    import yaml

    checkpoint = Path(checkpoint)
    for path in (checkpoint / CONFIG_FILE, checkpoint.parent.parent / "config.yaml"):
        if path.is_file():
            try:
                return yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            except (OSError, yaml.YAMLError):
                return None
    return None


__all__ = ["CONFIG_FILE", "saved_run_config"]

"""Which format a checkpoint's files are in: Kiln's plain data (safetensors and JSON), or files loaded by
unpickling, which Kiln refuses unless the user opts in. Read by the resume plan (`kiln.resume`) before anything is
built and by the checkpoint loader (`kiln.checkpoint_state`), so it imports neither."""

from __future__ import annotations

from pathlib import Path

from .errors import ConfigError

LOOP_STATE_FILE = "loop_state.json"
PICKLE_SUFFIXES = (".pkl", ".pickle", ".bin", ".pt", ".pth", ".ckpt", ".distcp", ".metadata")
"""Files in formats that are loaded by unpickling (torch.save, pickle, torch.distributed.checkpoint)."""
DATA_SUFFIXES = (".safetensors", ".json", ".yaml", ".md", ".txt")
"""Files Kiln reads as data (a safetensors file may begin with any byte: its header's length)."""
TRUST_FLAG = "--training.trust_checkpoint_pickles"


def pickle_files(folder: Path) -> list[str]:
    """The files of the checkpoint `folder` (at any depth) in a format that is loaded by unpickling: by name, or,
    for a name of no known format, by content (a pickle's protocol byte, or torch's zip archive)."""
    folder = Path(folder)
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        if path.suffix in PICKLE_SUFFIXES or path.name == ".metadata":
            found.append(path.relative_to(folder).as_posix())
        elif path.suffix not in DATA_SUFFIXES:
            with open(path, "rb") as fh:
                if fh.read(4).startswith((b"\x80", b"PK\x03\x04")):
                    found.append(path.relative_to(folder).as_posix())
    return found


def refuse_pickles(folder: Path, spec: str, trusted: bool) -> bool:
    """Whether the checkpoint is to be loaded with accelerate's pickle-based loader: never without `trusted`,
    where a pickle in the checkpoint is a one-line error naming the opt-in; with it, when the checkpoint is not
    in Kiln's plain-data format (no loop_state.json)."""
    found = pickle_files(folder)
    if not found:
        return False
    if not trusted:
        shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        raise ConfigError(
            f"checkpoint {spec} holds files loaded by unpickling ({shown}), which can run any code; Kiln resumes "
            f"from safetensors and JSON only. For a checkpoint you wrote yourself (an earlier Kiln version, "
            f"DeepSpeed), pass {TRUST_FLAG}"
        )
    return not (Path(folder) / LOOP_STATE_FILE).is_file()

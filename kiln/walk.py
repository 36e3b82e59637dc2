"""The run config's walk through the house: which project modules (rooms) it is handed to, in order, and how often
it comes back to a room it had left. A maintainer's measurement of how one-way the code is (docs/design.md).

    python -m kiln.walk finetune.classify --training.max_steps 2 ...   # any entry point's main(argv)
    python -m kiln.walk --sections pretrain.run ...                     # sections count too

What is counted (`trace_walk`): from the moment `kiln.config.build_config` returns the run config, every call to a
function defined in `kiln/`, `finetune/` or `pretrain/` that receives **the whole run config** as an argument (`self`
aside), or a dataclass that carries it (a job), is recorded with its module; the engine's copy of it
(`kiln.job.run_copy`, where what the engine derives is written) is the same run's config. Consecutive calls in one
module are one *stay*; a stay in a module that already had one is a *return to a room already left*. Calls that
receive only a section (`config.training`, `config.data`, ...) are not counted: a component built from its own
section is the design (torchtitan's habit); the walk asks how often the run's whole set of decisions is carried
back and forth. With `sections=True` (`--sections`) they count too: then every engine helper handed
`config.training` is a stay.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("kiln", "finetune", "pretrain")


@dataclass
class Walk:
    calls: list[tuple[str, str]] = field(default_factory=list)
    """(module path, function) of every call that received the run config, in order."""

    @property
    def stays(self) -> list[str]:
        """The modules of the calls, consecutive repeats merged."""
        stays: list[str] = []
        for room, _ in self.calls:
            if not stays or stays[-1] != room:
                stays.append(room)
        return stays

    @property
    def rooms(self) -> list[str]:
        return list(dict.fromkeys(self.stays))

    @property
    def returns(self) -> int:
        """Stays in a room the config had already been in and left."""
        return len(self.stays) - len(self.rooms)

    def describe(self) -> str:
        lines = [
            f"{len(self.stays)} stays in {len(self.rooms)} rooms, {self.returns} returns to a room already left"
        ]
        seen: set[str] = set()
        stay = -1
        for index, (room, function) in enumerate(self.calls):
            if index == 0 or self.calls[index - 1][0] != room:
                stay += 1
                mark = "  (return)" if room in seen else ""
                seen.add(room)
                lines.append(f"{stay + 1:3d}. {room}{mark}")
            lines.append(f"       {function}")
        return "\n".join(lines)


def _room(filename: str) -> str | None:
    try:
        relative = Path(filename).resolve().relative_to(REPO_ROOT)
    except ValueError:
        return None
    return relative.as_posix() if relative.parts and relative.parts[0] in ROOMS else None


def trace_walk(main: Callable[[], Any], sections: bool = False) -> tuple[Walk, Any]:
    """Run `main()` and record the walk of the run config it builds (see the module docstring; `sections`: its
    sections count too); returns (walk, what main returned). Only this thread is traced: the run config is handed
    around on the main thread."""
    walk = Walk()
    config: list[Any] = []  # the run config, once build_config has returned it
    tracked: set[int] = set()  # ids of the config (and, with `sections`, of its sections)
    rooms: dict[str, str | None] = {}

    def carries_config(value: Any) -> bool:
        if id(value) in tracked:
            return True
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return any(
                any(getattr(value, f.name, None) is known for known in config)
                for f in dataclasses.fields(value)
            )
        return False

    def track(run_config: Any) -> None:
        config.append(run_config)
        tracked.add(id(run_config))
        if sections:
            values = (getattr(run_config, f.name) for f in dataclasses.fields(run_config))
            tracked.update(id(v) for v in values if dataclasses.is_dataclass(v))

    def on_build_config_return(frame, event, arg):
        if event == "return" and arg is not None and not config:
            track(arg)
        return on_build_config_return

    def on_run_copy_return(frame, event, arg):
        # the engine's copy of the run config (kiln.job.run_copy) is the same run's config from there on
        if event == "return" and arg is not None:
            track(arg)
        return on_run_copy_return

    def on_call(frame, event, arg):
        code = frame.f_code
        filename = code.co_filename
        if filename not in rooms:
            rooms[filename] = _room(filename)
        room = rooms[filename]
        if room is None:
            return None
        if not config:
            return (
                on_build_config_return
                if room == "kiln/config.py" and code.co_name == "build_config"
                else None
            )
        count = code.co_argcount + code.co_kwonlyargcount
        count += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)  # *args, **kwargs
        arguments = frame.f_locals
        for name in code.co_varnames[:count]:
            if name == "self":
                continue
            value = arguments.get(name)
            values = (
                value
                if isinstance(value, (tuple, list))
                else value.values()
                if isinstance(value, dict)
                else (value,)
            )
            if any(carries_config(v) for v in values):
                walk.calls.append((room, code.co_qualname))
                if room == "kiln/job.py" and code.co_name == "run_copy":
                    return on_run_copy_return
                break
        return None

    previous = sys.gettrace()
    sys.settrace(on_call)
    threading.settrace(None)
    try:
        result = main()
    finally:
        sys.settrace(previous)
    return walk, result


def main(argv: list[str] | None = None) -> None:
    """`python -m kiln.walk [--sections] <module with main(argv)> [its arguments]`: run it and print the walk."""
    import importlib

    argv = list(sys.argv[1:] if argv is None else argv)
    sections = bool(argv) and argv[0] == "--sections"
    argv = argv[sections:]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return
    entry = importlib.import_module(argv[0])
    walk, _ = trace_walk(lambda: entry.main(argv[1:]), sections=sections)
    print(walk.describe())


if __name__ == "__main__":
    main()

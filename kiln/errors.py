"""The errors a Kiln command reports as one line (see `kiln.cli.run_cli`): a configuration the user can fix
(`ConfigError`, exit status 2) and a run that could not finish as asked (`RunError`, exit status 1)."""

from __future__ import annotations

import re


class ConfigError(ValueError):
    """A configuration problem the user can fix; the message names the fix."""


class RunError(RuntimeError):
    """A run that could not finish as asked (e.g. a required Hub push that did not complete, a diverged loss);
    what was saved is kept and the message says where. The command line prints it as one line, exit status 1."""


def first_line(err: BaseException, limit: int = 200) -> str:
    """What a one-line error quotes of a library's own message: its first line (its type's name when it has none),
    and of a line longer than `limit` characters its whole sentences that fit (the first sentence alone, cut at a
    word and marked with "...", when it does not fit), never a sentence cut in the middle."""
    line = (str(err).strip().splitlines() or [type(err).__name__])[0].strip()
    if len(line) <= limit:
        return line
    ends = [match.end() for match in re.finditer(r"[.!?](?=\s)", line) if match.end() <= limit]
    if ends:
        return line[: ends[-1]]
    return line[: line.rfind(" ", 0, limit - 3)].rstrip(" ,;:") + "..."


def as_flag(field: str) -> str:
    """A config field (`section.name`) as the command-line flag that sets it (`--section.name`), for messages:
    an error names the flag a user types, not half of it."""
    return field if field.startswith("--") else f"--{field}"


__all__ = ["ConfigError", "RunError", "as_flag", "first_line"]

"""The errors a Kiln command reports as one line (see `kiln.cli.run_cli`): a configuration the user can fix
(`ConfigError`, exit status 2) and a run that could not finish as asked (`RunError`, exit status 1)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration problem the user can fix; the message names the fix."""


class RunError(RuntimeError):
    """A run that could not finish as asked (e.g. a required Hub push that did not complete, a diverged loss);
    what was saved is kept and the message says where. The command line prints it as one line, exit status 1."""


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none), at most 200 characters: what
    a one-line error quotes of a library's own message."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:200]


__all__ = ["ConfigError", "RunError", "first_line"]

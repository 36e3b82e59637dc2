"""The range of every numeric option, declared once beside its field, and the one check of them all.

A config dataclass declares a numeric field with `bounded`:

    lr: float = bounded(1e-3, low=0, low_open=True)
    \"\"\"Peak learning rate.\"\"\"

The field's annotation is its kind (int or float); `bounded` adds the range (`low`, `high`, each closed unless
`low_open` / `high_open`), the values outside it that mean something of their own (`also`: max_steps' -1), and
finiteness (a float is finite unless `finite=False`; NaN never passes). `check_ranges` checks a whole config
against these declarations before a command writes anything (kiln.config.build_config and
validate_run_sections call it); `range_refusal` is its one-line message, also used when a value is not a number at
all; `option_range` describes a range for --help and docs/configuration.md. tests/test_option_ranges.py
generates its cases from the same declarations.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

INT64 = (-(2**63), 2**63 - 1)
"""An integer option is a 64-bit one whatever its declared range: torch, numpy and tokenizers take no larger."""

RANGE_KEY = "range"
"""The field metadata key under which `bounded` stores the declaration."""


@dataclass(frozen=True)
class Bounds:
    """A numeric option's declared range (see the module docstring)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    also: tuple[tuple[float, str], ...] = ()
    """(value, what it means) of values outside the range that the option takes all the same."""
    finite: bool = True

    def admits(self, value: Any, kind: type) -> bool:
        """Whether `value` (already converted to `kind`) is one this option takes."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if any(value == special for special, _ in self.also):
            return True
        if math.isnan(value) or (self.finite and math.isinf(value)):
            return False
        if kind is int and not (isinstance(value, int) and INT64[0] <= value <= INT64[1]):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def describe(self, kind: type) -> str:
        """The range in words: "an integer >= 1", "a number in [0, 1)", "a finite number > 0"."""
        what = "an integer" if kind is int else "a number"
        low, high = (_number(self.low, kind), _number(self.high, kind))
        if self.low is not None and self.high is not None:
            if kind is int and not self.low_open and not self.high_open:
                text = f"{what} from {low} to {high}"
            else:
                text = (
                    f"{what} in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
                )
        elif self.low is not None:
            text = f"{_finite(what, kind, self)} {'>' if self.low_open else '>='} {low}"
        elif self.high is not None:
            text = f"{_finite(what, kind, self)} {'<' if self.high_open else '<='} {high}"
        else:
            text = _finite(what, kind, self)
        return text + "".join(f", or {_number(v, kind)} ({meaning})" for v, meaning in self.also)


def _finite(what: str, kind: type, bounds: Bounds) -> str:
    # a range open on one side: say that inf is not in it (a "positive number" let --model.rope_theta inf pass)
    return f"a finite {what[2:]}" if kind is float and bounds.finite else what


def _number(value: float | None, kind: type) -> str:
    if value is None:
        return ""
    if kind is int or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def bounded(
    default: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    also: tuple[tuple[float, str], ...] = (),
    finite: bool = True,
) -> Any:
    """A numeric dataclass field with its range declared (module docstring); None passes as "not given"."""
    bounds = Bounds(low, high, low_open, high_open, tuple(also), finite)
    return field(default=default, metadata={RANGE_KEY: bounds})


class NumberArgument:
    """The `type=` of a numeric argparse option, its range declared beside it as `bounded` declares a field's:
    `parser.add_argument("--pairs", type=number_argument(int, low=1))`. It converts the text and refuses a value
    outside the range as argparse refuses any (exit status 2), naming the option, the value and the range."""

    def __init__(self, kind: type, bounds: Bounds):
        self.kind, self.bounds = kind, bounds
        self.__name__ = kind.__name__  # what argparse and the configuration reference call the type

    def __call__(self, text: str):
        import argparse

        try:
            value = self.kind(text)
        except ValueError:
            value = None
        if value is None or not self.bounds.admits(value, self.kind):
            raise argparse.ArgumentTypeError(f"must be {self.bounds.describe(self.kind)}, got {text}")
        return value


def number_argument(
    kind: type,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    finite: bool = True,
) -> NumberArgument:
    """A numeric argparse option's `type=` with its range (`NumberArgument`)."""
    return NumberArgument(kind, Bounds(low, high, low_open, high_open, (), finite))


def numeric_kind(tp: Any) -> type | None:
    """int or float for a field annotated int, float or either of them | None; None for anything else."""
    if typing.get_origin(tp) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        inner = [arg for arg in typing.get_args(tp) if arg is not type(None)]
        return numeric_kind(inner[0]) if len(inner) == 1 else None
    return tp if tp in (int, float) else None


def declared_bounds(cls: type, name: str) -> Bounds:
    """The declared range of field `name` of dataclass `cls`; an undeclared numeric field is still checked as
    finite and 64-bit (tests/test_option_ranges.py requires a declaration on every one)."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f.metadata.get(RANGE_KEY, Bounds())
    raise KeyError(name)


def numeric_fields(cls: type, prefix: str = ""):
    """(dotted key, kind, Bounds or None when undeclared) of every numeric field of config class `cls`, its
    sections included."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            yield from numeric_fields(tp, f"{prefix}{f.name}.")
        elif (kind := numeric_kind(tp)) is not None:
            yield f"{prefix}{f.name}", kind, f.metadata.get(RANGE_KEY)


def option_range(cls: type, key: str) -> str | None:
    """The range of dotted option `key` of config class `cls` in words (None: not a numeric option)."""
    for dotted, kind, bounds in numeric_fields(cls):
        if dotted == key:
            return (bounds or Bounds()).describe(kind)
    return None


def range_refusal(key: str, value: Any, kind: type, bounds: Bounds) -> str:
    """The one line that refuses `value` for option `key`: the option, the value and the range it must be in."""
    shown = value if isinstance(value, str) else repr(value) if isinstance(value, float) else str(value)
    limit = ""
    declared = (bounds.low, bounds.high)
    if kind is int and isinstance(value, int) and not INT64[0] <= value <= INT64[1] and None in declared:
        limit = f" (at most {INT64[1]} in size)"  # the range in words names no bound on that side
    return f"--{key} must be {bounds.describe(kind)}{limit}, got {shown}"


def check_ranges(config: Any, keys: typing.Collection[str] | None = None, prefix: str = "") -> None:
    """Every numeric option of `config` (a config dataclass instance) inside its declared range, else a one-line
    ConfigError naming the option, the value and the range. `keys`: only these dotted options (those a command
    reads); None: all. `prefix`: where `config` is in the whole config (`training.` for its training section).
    The one range check: run before anything is written."""
    for key, kind, bounds in numeric_fields(type(config), prefix):
        if keys is not None and key not in keys:
            continue
        value = config
        for part in key.removeprefix(prefix).split("."):
            value = getattr(value, part)
        if value is not None and not (bounds or Bounds()).admits(value, kind):
            raise ConfigError(range_refusal(key, value, kind, bounds or Bounds()))


__all__ = [
    "Bounds",
    "INT64",
    "NumberArgument",
    "bounded",
    "check_ranges",
    "declared_bounds",
    "numeric_fields",
    "number_argument",
    "numeric_kind",
    "option_range",
    "range_refusal",
]

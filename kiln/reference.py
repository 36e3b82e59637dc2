"""The configuration reference, docs/configuration.md, generated from the commands themselves: every option of
every Kiln command with its type, default and meaning, read from the config dataclasses (the docstring under each
field), the argparse parsers and the commands' own option tables.

    python -m kiln.reference            # rewrite docs/configuration.md
    python -m kiln.reference --check    # exit 1 when docs/configuration.md is not what the code gives

The commands are named below by module and attribute and imported when the page is made: the engine does not
import the apps (pretrain/, finetune/) anywhere else.
"""

from __future__ import annotations

import argparse
import html
import importlib
import re
import sys
from dataclasses import dataclass
from typing import Any

import yaml

from .config import REPO_ROOT, option_rows
from .option_range import NumberArgument

PAGE = REPO_ROOT / "docs" / "configuration.md"


@dataclass(frozen=True)
class Command:
    """One Kiln command as the reference shows it. Each attribute is `module:attribute`, imported on use."""

    title: str
    command: str
    description: str
    config: str | None = None
    """The config dataclass whose fields are the command's `--section.key` options."""
    keys: str | None = None
    """The dotted config options the command reads (default: all of the config's)."""
    extra: str | None = None
    """The command's own options beside the config's: (flag, type, default, meaning) tuples."""
    parser: str | None = None
    """A function returning the command's argparse parser (commands without a config dataclass)."""
    note: str = ""


COMMANDS = (
    Command(
        "Pretraining",
        "accelerate launch pretrain/run.py",
        "pretrain.run:DESCRIPTION",
        "pretrain.config:RunConfig",
    ),
    Command(
        "Preparing a corpus",
        "python -m pretrain.data prepare",
        "pretrain.data.__main__:PREPARE_DESCRIPTION",
        "pretrain.config:RunConfig",
        keys="pretrain.data.__main__:PREPARE_KEYS",
        extra="pretrain.data.__main__:PREPARE_OPTIONS",
    ),
    Command(
        "Inspecting the data",
        "python -m pretrain.data",
        "pretrain.data.__main__:DESCRIPTION",
        "pretrain.config:RunConfig",
        extra="pretrain.data.__main__:INSPECT_OPTIONS",
    ),
    Command(
        "Classification",
        "accelerate launch finetune/classify.py",
        "finetune.classify:DESCRIPTION",
        "finetune.classify:ClassifyConfig",
    ),
    Command(
        "Token tagging",
        "accelerate launch finetune/tag.py",
        "finetune.tag:DESCRIPTION",
        "finetune.tag:TagConfig",
    ),
    Command(
        "Sequence to sequence",
        "accelerate launch finetune/seq2seq.py",
        "finetune.seq2seq:DESCRIPTION",
        "finetune.seq2seq:Seq2SeqConfig",
    ),
    Command(
        "Task-adaptive pretraining",
        "accelerate launch finetune/adapt.py",
        "finetune.adapt:DESCRIPTION",
        "pretrain.config:RunConfig",
        extra="finetune.adapt:ADAPT_OPTIONS",
    ),
    Command(
        "The GLUE suite",
        "python finetune/glue.py",
        "finetune.glue:DESCRIPTION",
        parser="finetune.glue:glue_parser",
        note="Options after `--` go to every `finetune/classify.py` run (see Classification).",
    ),
    Command(
        "Converting checkpoints", "python -m pretrain.convert", "", parser="pretrain.convert:convert_parser"
    ),
    Command("ONNX export", "python -m pretrain.export_onnx", "", parser="pretrain.export_onnx:export_parser"),
    Command(
        "Zero-shot evaluation",
        "python -m pretrain.zero_shot blimp",
        "pretrain.zero_shot.__main__:BLIMP_DESCRIPTION",
        parser="pretrain.zero_shot.__main__:blimp_parser",
    ),
    Command(
        "kiln-launch",
        "kiln-launch",
        "kiln.launcher:HELP_HEADER",
        note="kiln-launch adds no options: it takes `accelerate launch`'s (`accelerate launch --help`), and the "
        "script after them takes its own, listed on this page.",
    ),
)
"""Every Kiln command, in the page's order."""


def load_spec(spec: str) -> Any:
    module, _, attribute = spec.partition(":")
    return getattr(importlib.import_module(module), attribute)


# ----------------------------------------------------------------------------------------------------------
# the options of a command


def config_options(command: Command) -> list[tuple[str, str, Any, str]]:
    """(`--section.key`, type, default, meaning) of each config option the command reads."""
    if command.config is None:
        return []
    keys = load_spec(command.keys) if command.keys else None
    return [
        (f"--{key}", kind, default, doc)
        for key, kind, default, doc in option_rows(load_spec(command.config), None, keys)
    ]


def own_options(command: Command) -> list[tuple[str, str, Any, str]]:
    """(flag, type, default, meaning) of the command's options that are not config fields."""
    rows = []
    if command.extra:
        rows += [(flag, kind, default, meaning) for flag, kind, default, meaning in load_spec(command.extra)]
    if command.config:
        rows += [
            (
                "--config FILE",
                "str",
                None,
                "YAML run config (see configs/); `_base_:` inherits from other files",
            ),
            ("--print_config", "bool", False, "print the resolved config as YAML and exit"),
        ]
    if command.parser:
        for action in load_spec(command.parser)()._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            flag = action.option_strings[-1] if action.option_strings else action.metavar or action.dest
            if action.metavar and action.option_strings:
                flag += f" {action.metavar}"
            kind = "bool" if action.nargs == 0 else getattr(action.type, "__name__", "str")
            if action.nargs in ("+", "*"):
                kind = f"list[{kind}]"
            default = "required" if (action.required or not action.option_strings) else action.default
            meaning = action.help or ""
            if isinstance(action.type, NumberArgument):  # its declared range, as a config option's
                meaning += f"; range: {action.type.bounds.describe(action.type.kind)}"
            rows.append((flag, kind, default, meaning))
    return rows


def flags(command: Command) -> list[str]:
    """Every option name of a command (`--section.key`, `--flag`, or a positional's metavar)."""
    return [row[0].split()[0] for row in config_options(command) + own_options(command)]


# ----------------------------------------------------------------------------------------------------------
# Markdown


def _text(text: str) -> str:
    """Plain text for a Markdown table cell or paragraph: code spans kept, `|`, `*`, `<` and `>` escaped."""
    parts = re.split(r"(`[^`]*`)", " ".join(str(text).split()))
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            inner = part[1:-1]
            out.append(
                part if "|" not in inner else f"<code>{html.escape(inner).replace('|', '&#124;')}</code>"
            )
        else:
            out.append(
                html.escape(part, quote=False).replace("|", "&#124;").replace("*", r"\*").replace("_", r"\_")
            )
    return "".join(out)


def _default(value: Any) -> str:
    if value == "required":
        return "required"
    if isinstance(value, str) and value.startswith("data."):  # "data.num_proc, else 1"
        return _text(value)
    shown = yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("...").strip()
    return f"<code>{html.escape(shown).replace('|', '&#124;')}</code>" if "|" in shown else f"`{shown}`"


def _type(name: str) -> str:
    return f"`{name}`" if "|" not in name else " or ".join(f"`{part.strip()}`" for part in name.split("|"))


def _table(rows) -> list[str]:
    lines = ["| option | type | default | meaning |", "|---|---|---|---|"]
    for flag, kind, default, meaning in rows:
        lines.append(f"| `{flag}` | {_type(kind)} | {_default(default)} | {_text(meaning)} |")
    return lines


def _description(text: str) -> list[str]:
    """A command's --help description as paragraphs; the option lists in it are the tables' business."""
    lines = []
    for paragraph in text.strip().split("\n\n"):
        if any(line.startswith("  --") for line in paragraph.splitlines()):
            continue
        paragraph = "\n".join(line for line in paragraph.splitlines() if set(line) != {"-"})
        if paragraph.lstrip().startswith("- "):  # a list: one item per "- " line, with its continuation lines
            items = re.split(r"\n\s*- ", "\n" + paragraph.strip())
            lines += [f"- {_text(item)}" for item in items if item.strip()] + [""]
        elif paragraph.strip():
            lines += [_text(paragraph), ""]
    return lines


def render() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Every option of every Kiln command, with its type, its default and what it does, generated from the",
        "code (`python -m kiln.reference`; the tests fail when this page and the code disagree). The run commands",
        "take their options from the dataclass defaults, then a YAML file (`--config FILE`, whose `_base_:` entries",
        "are merged underneath), then dotted command-line overrides (`--training.lr 3e-4`). `--help` on a command",
        "lists the same options with the values of the `--config` file given as defaults, and `--print_config`",
        "prints the resolved config as YAML without running anything. In YAML, a section is a mapping",
        "(`training: {lr: 3.0e-4}`); `null` (or `none` on the command line) is Python's None.",
        "",
    ]
    lines += [f"- [{c.title}](#{_anchor(c.title)}): `{c.command}`" for c in COMMANDS] + [""]
    for command in COMMANDS:
        lines += [f"## {command.title}", "", f"`{command.command}`", ""]
        if command.description:
            lines += _description(load_spec(command.description))
        elif command.parser:
            lines += _description(load_spec(command.parser)().description or "")
        if command.note:
            lines += [_text(command.note), ""]
        top = [
            row for row in config_options(command) if "." not in row[0]
        ]  # top-level flags (e.g. --predict)
        own = top + own_options(command)
        if own:
            lines += ["### Options of the command" if command.config else "### Options", "", *_table(own), ""]
        section = None
        rows: list = []
        for row in config_options(command):
            if "." not in row[0]:
                continue
            head = row[0][2:].split(".")[0]
            if head != section:
                if rows:
                    lines += [*_table(rows), ""]
                section, rows = head, []
                lines += [f"### {section}", ""]
            rows.append(row)
        if rows:
            lines += [*_table(rows), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kiln.reference", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is stale, writing nothing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not PAGE.is_file() or PAGE.read_text(encoding="utf-8") != text:
            print(
                f"error: {PAGE.relative_to(REPO_ROOT)} is stale; run python -m kiln.reference",
                file=sys.stderr,
            )
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

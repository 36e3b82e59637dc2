"""Every numeric option of every command range-checked from its one declaration (kiln.option_range, issue 52 item 3).

The cases are generated from the config classes: for every numeric option a command reads, the values negative,
zero, NaN, +-inf and a huge one go through the command's config parser and its one range check in this process
(`build_config`, as each command's main starts); a sampled handful goes through `kiln-launch` (accelerate launch
with Kiln's one-line errors) in a fresh process, which must say one line, exit 2 and create no output folder.

What the declarations must not decide for themselves is written here, apart from them: no option takes NaN or
inf, no integer option takes a value past 64 bits, and only the options in TAKES_NEGATIVE take a negative value.
"""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.config import build_config, validate_run_sections
from kiln.errors import ConfigError
from kiln.option_range import Bounds, numeric_fields
from kiln.reference import COMMANDS, load_spec

REPO = Path(__file__).resolve().parent.parent

TAKES_NEGATIVE = {
    "training.max_steps": -1,  # train by num_train_epochs
    "data.tag_column": None,  # CoNLL columns counted from the end (tag.py)
    "data.token_column": None,
    "generation.length_penalty": None,  # < 0 favours shorter outputs (seq2seq.py)
}
"""Options that take a negative value: the one they take (None: any in their range). Every other option refuses
every negative value."""

TRIED = ("-1", "-0.5", "0", "nan", ".nan", "inf", ".inf", "-inf", "1e30", "99999999999999999999999")
"""The values tried for each option, as a command line gives them (YAML reads `.nan` and `.inf` as floats, `nan`
and `inf` as text the option's kind converts)."""


def command_configs():
    """(command, config class, the options it reads) of every command with a config: pretrain/run.py, prepare and
    the data inspector, classify, tag, seq2seq, adapt (glue.py hands its options to classify: below)."""
    for command in COMMANDS:
        if command.config is not None:
            keys = load_spec(command.keys) if command.keys else None
            yield command.command, load_spec(command.config), keys


CONFIGS = list(command_configs())


def as_number(text: str) -> float:
    return float(text.removeprefix("."))


@pytest.mark.parametrize("command, cls, keys", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_every_numeric_option_declares_its_range(command, cls, keys):
    fields = list(numeric_fields(cls))
    assert len(fields) > 10, command  # the walk finds the sections' fields, not none
    undeclared = [key for key, _, bounds in fields if bounds is None]
    assert not undeclared, (
        f"{command}: numeric options without a declared range (kiln.option_range.bounded): {undeclared}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("command, cls, keys", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_every_numeric_option_refuses_what_it_cannot_take_in_one_line(command, cls, keys):
    tried = 0
    for key, kind, bounds in numeric_fields(cls):
        if keys is not None and key not in keys:
            continue
        for text in TRIED:
            value = as_number(text)
            refused = _refusal(cls, keys, key, text)
            tried += 1
            where = f"{command} --{key} {text}"
            # what no declaration may change
            if math.isnan(value) or math.isinf(value):
                assert refused, f"{where} passed: no option takes NaN or inf"
            if kind is int and abs(value) > 2**63:
                assert refused, f"{where} passed: an integer option is a 64-bit one"
            if value < 0 and (key not in TAKES_NEGATIVE or TAKES_NEGATIVE[key] not in (None, value)):
                assert refused, f"{where} passed: --{key} takes no negative value (TAKES_NEGATIVE)"
            if kind is int and not value.is_integer() and not math.isinf(value):
                assert refused, f"{where} passed: --{key} is an integer"
            # and what the declaration decides: refused exactly when outside it, in the one line that says so
            expected = (bounds or Bounds()).describe(kind)
            inside = not math.isnan(value) and (bounds or Bounds()).admits(
                int(value) if kind is int and value.is_integer() and not math.isinf(value) else value, kind
            )
            if inside:
                assert not refused, f"{where} refused although its range ({expected}) holds it: {refused}"
            else:
                assert refused, f"{where} passed although its range is {expected}"
                assert "\n" not in refused and refused.startswith(f"--{key} must be {expected}"), refused
                assert refused.endswith(f", got {_shown(text, kind)}"), refused
    assert tried > 50, command


def _refusal(cls, keys, key: str, text: str) -> str | None:
    """The command's parser and range check on `--key text`: the refusal's message, or None when it passes."""
    try:
        config = build_config(cls, [f"--{key}", text], keys=keys)
    except ConfigError as error:
        return str(error)
    section, _, name = key.rpartition(".")
    value = getattr(getattr(config, section) if section else config, name)
    assert value == as_number(text) or math.isnan(value), (key, text, value)  # taken as given
    return None


def _shown(text: str, kind: type) -> str:
    """How the refusal shows a value the command line gave as `text`."""
    value = as_number(text)
    if kind is int and text.lstrip("-").isdigit():
        return text  # an integer as written (past a float's precision too)
    if kind is int and value.is_integer():
        return str(int(value))  # an integer option reads 1e30 as the integer it is
    return repr(value)  # a float, or no integer at all


def test_the_audit_cases_are_refused_before_anything_is_built():
    """Issue 52's two rows: a negative dropout was a torch traceback at the build, after config.yaml and tokenizer/
    were written; an infinite rotary base passed as "a positive number"."""
    from pretrain.config import RunConfig

    for option, value, line in (
        (
            "model.hidden_dropout_prob",
            "-0.1",
            "--model.hidden_dropout_prob must be a number in [0, 1), got -0.1",
        ),
        ("model.rope_theta", "inf", "--model.rope_theta must be a finite number > 0, got inf"),
        (
            "model.num_hidden_layers",
            "1000000",
            "--model.num_hidden_layers must be an integer from 1 to 4096, got 1000000",
        ),
    ):
        with pytest.raises(ConfigError) as error:
            build_config(RunConfig, [f"--{option}", value])
        assert str(error.value) == line


def test_a_config_made_in_code_is_range_checked_by_the_engine_too():
    """A config an app builds without the command line (a test, a notebook) meets the same check at the engine's
    start (validate_run_sections, which run_job calls before the output folder is touched)."""
    from finetune.seq2seq import Seq2SeqConfig
    from pretrain.config import RunConfig

    config = RunConfig()
    validate_run_sections(config)  # the defaults pass
    config.model.attention_probs_dropout_prob = float("nan")
    with pytest.raises(
        ConfigError, match=r"^--model.attention_probs_dropout_prob must be a number in \[0, 1\), got nan$"
    ):
        validate_run_sections(config)
    config = Seq2SeqConfig()
    config.generation.num_beams = 0
    with pytest.raises(
        ConfigError, match="^--generation.num_beams must be an integer from 1 to 1024, got 0$"
    ):
        validate_run_sections(config)


def test_a_trainer_built_in_code_checks_its_training_section_before_preparing_anything():
    """kiln.trainer.Trainer used as a library, without run_job: the same check, before the optimizer is made."""
    from kiln.config import LoggingConfig, TrainingConfig
    from kiln.trainer import Trainer

    for field, value, line in (
        (
            "max_steps",
            0,
            "--training.max_steps must be an integer >= 1, or -1 (train by num_train_epochs), got 0",
        ),
        ("adam_beta2", 1.0, "--training.adam_beta2 must be a number in [0, 1), got 1.0"),
    ):
        training = TrainingConfig(**{field: value})
        with pytest.raises(ConfigError) as error:
            Trainer(
                None, None, training=training, logging_cfg=LoggingConfig(), train_dataset=None, collator=None
            )  # nothing else is looked at first: no accelerator or model is needed to be refused
        assert str(error.value) == line


def test_glue_checks_the_options_it_hands_every_classify_run_before_reading_the_checkpoint(tmp_path):
    from finetune.glue import main

    missing = tmp_path / "no-such-checkpoint"  # read only after the options' check: never reached
    with pytest.raises(ConfigError, match=r"^--training.warmup_ratio must be a number in \[0, 1\], got 2.0$"):
        main(
            [
                "--checkpoint",
                str(missing),
                "--output-dir",
                str(tmp_path / "glue"),
                "--",
                "--training.warmup_ratio",
                "2",
            ]
        )
    assert not (tmp_path / "glue").exists()


@pytest.mark.slow
def test_a_sample_of_refusals_is_one_line_exit_2_and_no_output_folder_under_kiln_launch(tmp_path):
    """In fresh processes, as a user starts a run: the audit's two rows and a seeded sample of the generated
    refusals of pretrain/run.py's options (kiln-launch: `accelerate launch` whose status is the run's own; plain
    `accelerate launch` turns every failure into status 1, docs/launching.md)."""
    from pretrain.config import RunConfig

    refused = []
    for key, _, _ in numeric_fields(RunConfig):
        refused += [
            (key, text) for text in ("-1", "0", "nan", "inf", "1e30") if _refusal(RunConfig, None, key, text)
        ]
    cases = [("model.hidden_dropout_prob", "-0.1"), ("model.rope_theta", "inf")]
    cases += random.Random(52).sample(refused, 2)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
        "ACCELERATE_USE_CPU": "1",
        "OMP_NUM_THREADS": "1",
    }
    launcher = [sys.executable, "-m", "kiln.launcher", "--num_processes", "1", "--num_machines", "1"]
    launcher += ["--mixed_precision", "no", "--dynamo_backend", "no", str(REPO / "pretrain/run.py")]
    procs = []
    for i, (key, text) in enumerate(cases):
        out = tmp_path / f"run-{i}"
        args = [*launcher, "--training.output_dir", str(out), f"--{key}", text]
        procs.append(
            (
                key,
                text,
                out,
                subprocess.Popen(
                    args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
                ),
            )
        )
    try:
        for key, text, out, proc in procs:
            output, _ = proc.communicate(timeout=300)
            lines = output.strip().splitlines()
            assert proc.returncode == 2 and len(lines) == 1, (key, text, output)
            assert lines[0].startswith(f"error: --{key} must be ") and lines[0].endswith(
                " got " + _refusal(RunConfig, None, key, text).rsplit(" got ", 1)[1]
            ), lines
            assert not out.exists(), f"--{key} {text}: {out} was created"
    finally:
        for *_, proc in procs:
            proc.kill()


PARSERS = [(command.command, command.parser) for command in COMMANDS if command.parser]


@pytest.mark.parametrize("command, spec", PARSERS, ids=[c[0] for c in PARSERS])
def test_the_numeric_options_of_commands_without_a_config_are_declared_and_checked_too(command, spec, capsys):
    """convert, ONNX export, zero-shot, GLUE, kiln-launch: an argparse option's range is declared in its `type=`
    (kiln.option_range.number_argument); a value outside it is argparse's refusal, exit 2, naming it."""
    from kiln.option_range import NumberArgument

    parser = load_spec(spec)()
    required = []
    for action in parser._actions:  # a value for each required option, so only the option tried is refused
        if action.required or (not action.option_strings and action.nargs not in ("?", "*")):
            required += ([action.option_strings[0]] if action.option_strings else []) + ["x"]
    for action in parser._actions:
        if action.type in (int, float):
            pytest.fail(f"{command} {action.option_strings}: a numeric option without a declared range")
        if not isinstance(action.type, NumberArgument):
            continue
        for text in TRIED:
            value = as_number(text)
            kind, bounds = action.type.kind, action.type.bounds
            if kind is int:  # an integer option takes integers as written, nothing else
                takes = text.lstrip("-").isdigit() and bounds.admits(int(text), kind)
            else:
                takes = not math.isnan(value) and bounds.admits(value, kind)
            if math.isnan(value) or math.isinf(value) or value < 0 or (kind is int and value > 2**63):
                assert not takes, f"{command} {action.option_strings[0]} takes {text}"
            if takes:
                assert (
                    getattr(parser.parse_args([*required, f"{action.option_strings[0]}={text}"]), action.dest)
                    == value
                )
                continue
            with pytest.raises(SystemExit) as status:
                parser.parse_args([*required, f"{action.option_strings[0]}={text}"])
            last = capsys.readouterr().err.strip().splitlines()[-1]
            assert status.value.code == 2 and last.endswith(
                f"error: argument {'/'.join(action.option_strings)}: must be {bounds.describe(kind)}, got {text}"
            ), last

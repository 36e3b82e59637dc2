"""Every command's options, as its users meet them: `--help` (with a `--config` file's values as the defaults, and
for `prepare` only what it reads), `--print_config` (the resolved config as YAML), and docs/configuration.md, the
reference generated from the code (`python -m kiln.reference`), which must hold every option `--help` shows and be
what the code gives today. Each `--help` says what its command does and names only pages that exist."""

import re
import subprocess
import sys

import pytest
import yaml
from kiln_testing import REPO

from kiln.reference import COMMANDS, PAGE, flags, render

# (command as a user types it, the argv after `python`); the accelerate launch ones run as plain python: --help
# and --print_config answer before anything is launched
CONFIG_COMMANDS = {
    "pretrain": ["pretrain/run.py"],
    "prepare": ["-m", "pretrain.data", "prepare"],
    "inspect": ["-m", "pretrain.data"],
    "classify": ["finetune/classify.py"],
    "tag": ["finetune/tag.py"],
    "seq2seq": ["finetune/seq2seq.py"],
    "adapt": ["finetune/adapt.py"],
}
OTHER_COMMANDS = {
    "glue": ["finetune/glue.py"],
    "convert": ["-m", "pretrain.convert"],
    "export_onnx": ["-m", "pretrain.export_onnx"],
    "zero_shot": ["-m", "pretrain.zero_shot", "blimp"],
}
TITLES = {
    "pretrain": "Pretraining",
    "prepare": "Preparing a corpus",
    "inspect": "Inspecting the data",
    "classify": "Classification",
    "tag": "Token tagging",
    "seq2seq": "Sequence to sequence",
    "adapt": "Task-adaptive pretraining",
    "glue": "The GLUE suite",
    "convert": "Converting checkpoints",
    "export_onnx": "ONNX export",
    "zero_shot": "Zero-shot evaluation",
}


def python(*argv, check=True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, *map(str, argv)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


def section(title: str) -> str:
    """The part of docs/configuration.md under `## title`."""
    text = PAGE.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


@pytest.fixture(scope="module")
def helps() -> dict[str, str]:
    return {
        name: python(*argv, "--help").stdout for name, argv in {**CONFIG_COMMANDS, **OTHER_COMMANDS}.items()
    }


# ----------------------------------------------------------------------------------------------------------
# the reference page


@pytest.mark.slow
def test_the_configuration_reference_is_what_the_code_gives():
    assert PAGE.read_text(encoding="utf-8") == render(), (
        "docs/configuration.md is stale: python -m kiln.reference"
    )
    assert python("-m", "kiln.reference", "--check").returncode == 0


@pytest.mark.slow
def test_every_option_of_every_help_is_in_the_reference(helps):
    for name, text in helps.items():
        shown = set(re.findall(r"^\s+(--[\w.-]+)", text, flags=re.M)) - {"--help"}
        shown |= set(re.findall(r"^  ([A-Z][A-Z_]+) ", text, flags=re.M))  # argparse's positional arguments
        assert len(shown) >= 3, (name, text[:500])
        page = section(TITLES[name])
        missing = sorted(option for option in shown if f"`{option}" not in page)
        assert not missing, f"{name}: options of --help missing from docs/configuration.md: {missing}"


def test_every_command_is_in_the_reference_with_documented_options():
    assert [c.title for c in COMMANDS][:-1] == list(TITLES.values()) and COMMANDS[-1].command == "kiln-launch"
    for command in COMMANDS:
        page = section(command.title)
        for flag in flags(command):
            assert f"`{flag}" in page, (command.title, flag)
        for line in page.splitlines():
            if line.startswith("| `"):
                assert line.rstrip(" |").split("|")[-1].strip(), (
                    f"{command.title}: an option without a meaning: {line}"
                )
    assert "kiln-launch adds no options" in section("kiln-launch")


def test_the_reference_is_in_the_site_navigation():
    text = (REPO / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:") :]
    assert re.search(r"^\s+- [\w ]+: configuration\.md$", nav, flags=re.M)


# ----------------------------------------------------------------------------------------------------------
# --help


def test_help_shows_the_values_of_the_config_file_as_defaults():
    text = python(
        "pretrain/run.py", "--config", "configs/pretrain/decoder-tiny.yaml", "--training.lr", "7e-4", "--help"
    ).stdout
    assert "--model.kind (str, default: 'decoder')" in text
    assert "--training.lr (float, default: 0.0007)" in text
    assert "those of --config configs/pretrain/decoder-tiny.yaml" in text
    plain = python("pretrain/run.py", "--help").stdout
    assert "--model.kind (str, default: 'encoder')" in plain and "those of --config" not in plain


@pytest.mark.slow
def test_prepare_help_lists_only_what_prepare_reads(helps):
    from pretrain.data.__main__ import PREPARE_KEYS

    options = set(re.findall(r"^\s+--([\w]+\.[\w.]+) \(", helps["prepare"], flags=re.M))
    assert options == set(PREPARE_KEYS)
    assert {"training.seed", "data.data_files", "tokenizer.vocab_size"} <= options
    assert not any(key.startswith(("hub.", "logging.")) for key in options) and "training.lr" not in options
    for flag in ("--output DIR", "--num_proc N", "--shard i/n", "--shard_size_mb M"):
        assert flag in helps["prepare"]
    # an option prepare would ignore is refused in one line, naming what it reads
    done = python("-m", "pretrain.data", "prepare", "--output", "x", "--training.lr", "1e-3", check=False)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "does not read --training.lr" in done.stderr and "--training.seed" in done.stderr


def test_only_commands_that_save_the_config_say_so(helps):
    for name in ("pretrain", "classify", "tag", "seq2seq", "adapt"):
        assert "saves the resolved config as output_dir/config.yaml" in helps[name], name
    for name in ("prepare", "inspect"):
        assert "saves the resolved config" not in helps[name], name
        assert "config.yaml in the output dir" not in helps[name], name


@pytest.mark.parametrize("name", sorted({**CONFIG_COMMANDS, **OTHER_COMMANDS}))
def test_every_help_says_what_the_command_does_and_names_pages_that_exist(helps, name):
    text = helps[name]
    usage, _, rest = text.partition("\n\n")
    assert usage.startswith("usage: ")
    assert len(rest.split("\n\n")[0].split()) >= 15, f"{name}: no description of what it does"
    pages = re.findall(r"\b(docs/[\w/.-]+\.md)", text)
    assert pages, f"{name}: --help points at no guide"
    for page in pages:
        assert (REPO / page).is_file(), f"{name} --help names {page}, which does not exist"
    assert not re.search(r"README [A-Z]", text), f"{name}: --help points at a README section"


def test_kiln_launch_help_says_first_what_kiln_launch_changes():
    done = subprocess.run(
        [sys.executable, "-m", "kiln.launcher", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    head, _, accelerate_part = done.stdout.partition("usage: kiln-launch")
    assert head.startswith("kiln-launch: `accelerate launch` for Kiln's scripts")
    assert (
        "SIGTERM" in head
        and "exit status" in head.replace("exits with", "exit status")
        and "docs/launching.md" in head
    )
    assert (REPO / "docs/launching.md").is_file()
    assert "--num_processes" in accelerate_part  # accelerate's own options follow, unchanged


# ----------------------------------------------------------------------------------------------------------
# --print_config


@pytest.mark.parametrize("name", sorted(CONFIG_COMMANDS))
def test_print_config_prints_the_resolved_config_and_reads_back_the_same(name, tmp_path):
    config = {
        "pretrain": "configs/pretrain/decoder-tiny.yaml",
        "prepare": "configs/pretrain/decoder-tiny.yaml",
        "inspect": "configs/pretrain/encoder-small.yaml",
        "classify": "configs/finetune/classify-sst2.yaml",
        "tag": "configs/finetune/tag-conll2003.yaml",
        "seq2seq": "configs/finetune/seq2seq-multi30k.yaml",
        "adapt": "configs/pretrain/encoder-tiny.yaml",
    }[name]
    override = ["--training.seed", "7"]
    printed = python(*CONFIG_COMMANDS[name], "--config", config, *override, "--print_config").stdout
    values = yaml.safe_load(printed)
    assert values["training"]["seed"] == 7
    file_values = yaml.safe_load((REPO / config).read_text())
    # finetune/adapt.py sets its own data, objective and tokenizer over the file's (they are not options there)
    own = (
        {
            ("data", "data_files"),
            ("data", "document_separator"),
            ("model", "objective"),
            ("tokenizer", "name_or_path"),
        }
        if name == "adapt"
        else set()
    )
    for section_name, entries in file_values.items():
        for key, value in entries.items() if isinstance(entries, dict) and name != "prepare" else ():
            if (section_name, key) not in own:
                assert values[section_name][key] == value, (section_name, key)
    if name == "adapt":
        assert values["model"]["objective"] == "mlm" and values["data"]["document_separator"] == "line"
    if name == "prepare":  # only what prepare reads
        assert set(values) == {"model", "tokenizer", "data", "training"} and set(values["training"]) == {
            "seed"
        }
    else:
        assert {"training", "logging", "hub"} <= set(values) and "lr" in values["training"]
    saved = tmp_path / "printed.yaml"
    saved.write_text(printed)
    assert python(*CONFIG_COMMANDS[name], "--config", saved, "--print_config").stdout == printed


@pytest.mark.parametrize("name", sorted(OTHER_COMMANDS))
def test_print_config_of_the_other_commands(name):
    argv = {
        "glue": ["--tasks", "sst2", "rte", "--print_config", "--", "--training.lr", "1e-4"],
        "convert": ["a", "b", "--print_config"],
        "export_onnx": ["a", "b", "--opset", "18", "--print_config"],
        "zero_shot": ["--model", "m", "--pairs", "5", "--print_config"],
    }[name]
    values = yaml.safe_load(python(*OTHER_COMMANDS[name], *argv).stdout)
    expected = {
        "glue": {
            "checkpoint": "runs/encoder-tiny/final",
            "tasks": ["sst2", "rte"],
            "glue_dir": None,
            "output_dir": "runs/glue",
            "update_checkpoint_card": False,
            "classify_options": ["--training.lr", "1e-4"],
        },
        "convert": {"src_dir": "a", "dst_dir": "b", "trust_pickles": False},
        "export_onnx": {"folder": "a", "out": "b", "opset": 18},
        "zero_shot": {
            "model": "m",
            "data": None,
            "pairs": 5,
            "paradigms": None,
            "json": None,
            "kind": None,
            "revision": None,
            "from_scratch": False,
            "seed": 0,
            "pll": "original",
            "decoder_scoring": "causal",
            "batch_tokens": None,
        },
    }[name]
    assert values == expected

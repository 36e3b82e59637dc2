import dataclasses

import pytest
import yaml

from kiln.cli import run_cli
from kiln.config import build_config, field_docs, format_help, load_yaml, save_config, validate_run_sections
from kiln.errors import ConfigError
from pretrain.config import RunConfig


def test_dotted_overrides_are_typed():
    config = build_config(
        RunConfig,
        ["--training.lr", "3e-4", "--training.max_steps=12", "--model.kind", "decoder", "--data.streaming"],
    )
    assert config.training.lr == pytest.approx(3e-4)
    assert config.training.max_steps == 12 and isinstance(config.training.max_steps, int)
    assert config.model.kind == "decoder"
    assert config.data.streaming is True


def test_a_yaml_boolean_word_given_to_a_text_field_is_that_word(tmp_path):
    # YAML 1.1 reads an unquoted `no` as False; mixed_precision's values include "no"
    assert build_config(RunConfig, ["--training.mixed_precision", "no"]).training.mixed_precision == "no"
    config_file = tmp_path / "run.yaml"
    config_file.write_text("training:\n  mixed_precision: no\n")
    config = build_config(RunConfig, ["--config", str(config_file)])
    assert config.training.mixed_precision == "no"
    validate_run_sections(config)  # a valid value, not "unknown 'False'"


def test_list_and_none_overrides():
    config = build_config(
        RunConfig, ["--data.data_files", "a.txt,b.txt", "--training.max_train_time_s", "none"]
    )
    assert config.data.data_files == ["a.txt", "b.txt"]
    assert config.training.max_train_time_s is None


def test_unknown_key_lists_the_valid_ones():
    with pytest.raises(ConfigError) as err:
        build_config(RunConfig, ["--training.learning_rate", "1e-3"])
    message = str(err.value)
    assert "training.learning_rate" in message and "training.lr" in message


def test_unknown_section_is_an_error():
    with pytest.raises(ConfigError, match="unknown config key 'trainer'"):
        build_config(RunConfig, ["--trainer.lr", "1"])


def test_bad_value_type_names_the_key():
    with pytest.raises(ConfigError, match="training.max_steps"):
        build_config(RunConfig, ["--training.max_steps", "many"])


def test_yaml_base_inheritance_and_cli_precedence(tmp_path):
    (tmp_path / "base.yaml").write_text("model:\n  hidden_size: 48\n  num_hidden_layers: 3\n")
    (tmp_path / "run.yaml").write_text(
        "_base_: base.yaml\nmodel:\n  num_hidden_layers: 5\ntraining:\n  lr: 0.5\n"
    )
    config = build_config(RunConfig, ["--config", str(tmp_path / "run.yaml"), "--training.lr", "0.25"])
    assert config.model.hidden_size == 48
    assert config.model.num_hidden_layers == 5
    assert config.training.lr == 0.25


def test_missing_and_invalid_yaml(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_yaml(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_yaml(bad)


def test_help_lists_every_field_with_default_and_doc(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_config(RunConfig, ["--help"], prog="run.py", description="Pretrain things.")
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for section in dataclasses.fields(RunConfig):
        section_cls = type(getattr(RunConfig(), section.name))
        docs = field_docs(section_cls)
        for f in dataclasses.fields(section_cls):
            assert f"--{section.name}.{f.name} " in text
            assert docs.get(f.name), f"{section.name}.{f.name} has no docstring"
    assert "(float, default: 0.001)" in text  # training.lr


def test_saved_config_round_trips(tmp_path):
    config = build_config(RunConfig, ["--training.lr", "0.01", "--data.data_files", "x.txt"])
    save_config(config, tmp_path / "config.yaml")
    again = build_config(RunConfig, ["--config", str(tmp_path / "config.yaml")])
    assert again == config
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["training"]["lr"] == 0.01


@pytest.mark.parametrize(
    "name",
    [
        "encoder-tiny",
        "encoder-mini",
        "encoder-small",
        "encoder-base",
        "encoder-modern-tiny",
        "encoder-modern-base",
        "decoder-tiny",
        "decoder-small",
        "debug",
    ],
)
def test_shipped_run_configs_load(name):
    config = build_config(RunConfig, ["--config", f"configs/pretrain/{name}.yaml"])
    assert config.model.hidden_size % config.model.num_attention_heads == 0
    assert config.data.max_seq_length <= config.model.max_position_embeddings


def test_default_run_equals_encoder_tiny_config():
    default = build_config(RunConfig, [])
    tiny = build_config(RunConfig, ["--config", "configs/pretrain/encoder-tiny.yaml"])
    assert default == tiny
    assert format_help(RunConfig, "p", "d").count("--") > 60


@pytest.mark.parametrize(
    "override, message",
    [
        (
            ["--training.per_device_eval_batch_size", "0"],
            "^--training.per_device_eval_batch_size must be an integer >= 1, got 0$",
        ),
        (
            ["--training.gradient_accumulation_steps", "-1"],
            "^--training.gradient_accumulation_steps must be an integer >= 1, got -1$",
        ),
        (["--hub.push_to_hub"], "needs --hub.model_id"),
        (["--hub.strategy", "always"], "hub.strategy must be end, every_save or checkpoint, got 'always'"),
        (["--logging.report_to", "mlflow"], "logging.report_to must be .* got 'mlflow'"),
    ],
)
def test_shared_sections_are_checked_for_every_entry_point(override, message):
    validate_run_sections(build_config(RunConfig, []))  # the defaults pass
    with pytest.raises(ConfigError, match=message):
        validate_run_sections(build_config(RunConfig, override))


def test_run_cli_prints_user_errors_on_one_line_and_lets_bugs_through(capsys):
    class TaskError(ValueError):
        pass

    def main(argv):
        raise {
            "config": ConfigError("bad key; use --x"),
            "task": TaskError("bad data"),
            "bug": KeyError("k"),
        }[argv[0]]

    for kind, line in (("config", "error: bad key; use --x"), ("task", "error: bad data")):
        with pytest.raises(SystemExit) as exit_info:
            run_cli(main, [kind], (TaskError,))
        assert exit_info.value.code == 2 and capsys.readouterr().err.strip() == line
    with pytest.raises(KeyError):
        run_cli(main, ["bug"], (TaskError,))

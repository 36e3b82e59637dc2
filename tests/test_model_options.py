"""The model options that depend on the preset (`--model.hidden_act`, `--model.hidden_dropout_prob`,
`--model.attention_probs_dropout_prob`, `--model.layer_norm_eps`): left unset, each takes its preset's value
(`pretrain.config.preset_options`, the one place they are resolved); given, it always wins, even when it
equals a default. A run that gives none builds the model it built before they defaulted to None, and a run
folder saved then resumes with the same command. Configs and small models only: nothing is trained."""

import dataclasses
import glob
import types

import pytest
import torch
import yaml
from kiln_testing import DEBUG, REPO

from kiln.config import build_config
from pretrain.config import PRESET_OPTIONS, RunConfig
from pretrain.modeling import (
    KilnDecoderConfig,
    KilnDecoderForCausalLM,
    KilnEncoderConfig,
    KilnEncoderForPreTraining,
)
from pretrain.run import attention_dropout, model_config_kwargs

OPTIONS = ("hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "layer_norm_eps")
# the decoder config's names of the options
DECODER_NAMES = {
    "hidden_act": "activation_function",
    "hidden_dropout_prob": "resid_pdrop",
    "attention_probs_dropout_prob": "attn_pdrop",
    "layer_norm_eps": "layer_norm_epsilon",
}
# the run's defaults before the options defaulted to None, which a `llama` decoder read as "not given"
LEGACY_DEFAULTS = {
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "layer_norm_eps": 1e-12,
}
PRESETS = [
    ("decoder", None),
    ("decoder", "gpt2"),
    ("decoder", "llama"),
    ("encoder", None),
    ("encoder", "bert"),
    ("encoder", "modernbert"),
]
DEFAULT = {"encoder": "bert", "decoder": "gpt2"}
# per option: BERT's value, Llama's, and one that is neither
VALUES = {
    "hidden_act": ("gelu", "silu", "relu"),
    "hidden_dropout_prob": (0.1, 0.0, 0.25),
    "attention_probs_dropout_prob": (0.1, 0.0, 0.25),
    "layer_norm_eps": (1e-12, 1e-5, 1e-6),
}
TOKENIZER = types.SimpleNamespace(pad_token_id=0, bos_token_id=1, eos_token_id=2)


def run_config(*argv) -> RunConfig:
    return build_config(RunConfig, [str(arg) for arg in argv], prog="run")


def preset_args(kind, preset) -> list[str]:
    return ["--model.kind", kind, *(["--model.preset", preset] if preset else [])]


def model_config(config: RunConfig):
    """The model config the run builds (build_model's, without the weights)."""
    config_class = KilnEncoderConfig if config.model.kind == "encoder" else KilnDecoderConfig
    return config_class(**model_config_kwargs(config, 256, TOKENIZER))


def built_options(model_config) -> dict:
    """The four options as the model config holds them, in the run's names."""
    if isinstance(model_config, KilnDecoderConfig):
        assert model_config.embd_pdrop == model_config.resid_pdrop
        return {option: getattr(model_config, name) for option, name in DECODER_NAMES.items()}
    return {option: getattr(model_config, option) for option in OPTIONS}


def legacy_options(model) -> dict:
    """The four options as the run built them before they defaulted to None: the run's defaults (BERT's), and
    for a decoder of another preset than gpt2 the preset's in place of any value equal to those defaults."""
    values = {name: getattr(model, name) for name in OPTIONS}
    values = {name: LEGACY_DEFAULTS[name] if value is None else value for name, value in values.items()}
    if model.kind == "decoder" and model.preset not in (None, "gpt2"):
        preset = built_options(KilnDecoderConfig(preset=model.preset))
        values = {
            name: preset[name] if value == LEGACY_DEFAULTS[name] else value for name, value in values.items()
        }
    return values


SHIPPED = sorted(glob.glob(str(REPO / "configs/pretrain/*.yaml")))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: path.rsplit("/", 1)[-1])
def test_a_shipped_config_builds_the_model_it_built_before(path):
    config = run_config("--config", path)
    assert built_options(model_config(config)) == legacy_options(config.model)
    legacy = legacy_options(config.model)
    assert attention_dropout(config.model, None) == legacy["attention_probs_dropout_prob"]


@pytest.mark.parametrize("kind, preset", PRESETS)
def test_options_not_given_take_the_presets_values(kind, preset):
    config = run_config("--config", DEBUG, *preset_args(kind, preset))
    assert all(getattr(config.model, option) is None for option in OPTIONS)  # "not given", in config.yaml too
    expected = PRESET_OPTIONS[(kind, preset or DEFAULT[kind])]
    assert built_options(model_config(config)) == expected == legacy_options(config.model)
    assert attention_dropout(config.model, None) == expected["attention_probs_dropout_prob"]


def test_the_llama_row_is_the_llama_presets():
    """The run's `llama` values are those KilnDecoderConfig's `llama` preset fills in."""
    assert PRESET_OPTIONS[("decoder", "llama")] == built_options(KilnDecoderConfig(preset="llama"))


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("kind, preset", PRESETS)
def test_an_option_given_always_wins(kind, preset, option):
    """Every value wins, BERT's and Llama's defaults included (a value equal to the run's default was read as
    not given by a `llama` decoder: `--model.hidden_act gelu` built SiLU)."""
    for value in VALUES[option]:
        config = run_config("--config", DEBUG, *preset_args(kind, preset), f"--model.{option}", value)
        built = built_options(model_config(config))
        assert built[option] == value, (option, value, built)
        others = PRESET_OPTIONS[(kind, preset or DEFAULT[kind])]
        assert {k: v for k, v in built.items() if k != option} == {
            k: v for k, v in others.items() if k != option
        }
        if option == "attention_probs_dropout_prob":
            assert attention_dropout(config.model, None) == value


@pytest.mark.parametrize(
    "kind, preset",
    [("decoder", "gpt2"), ("decoder", "llama"), ("encoder", "bert"), ("encoder", "modernbert")],
)
def test_the_model_is_built_with_the_options_given(kind, preset):
    """The issue's command, `--model.preset llama --model.hidden_dropout_prob 0.1 --model.hidden_act gelu`, and
    its mirror for the others: each preset given the other family's values builds modules with them."""
    bert = kind == "encoder" or preset == "gpt2"
    given = {name: values[1] if bert else values[0] for name, values in VALUES.items()}
    options = [arg for name, value in given.items() for arg in (f"--model.{name}", value)]
    config = run_config("--config", DEBUG, *preset_args(kind, preset), *options)
    model_class = KilnEncoderForPreTraining if kind == "encoder" else KilnDecoderForCausalLM
    model = model_class(model_config(config))
    dropouts = {module.p for module in model.modules() if isinstance(module, torch.nn.Dropout)}
    assert dropouts <= {given["hidden_dropout_prob"]} and dropouts
    norms = [module for module in model.modules() if type(module).__name__ in ("LayerNorm", "KilnRMSNorm")]
    assert norms and {module.eps for module in norms} == {given["layer_norm_eps"]}
    assert built_options(model.config) == given


# --------------------------------------------------------------------------------------------------- resume
def saved_checkpoint(tmp_path, config: RunConfig, **saved_model) -> str:
    """A checkpoint folder holding only the config it was saved with (kiln_config.yaml): `config`'s, with the
    model options in `saved_model` as that run's config held them."""
    saved = dataclasses.asdict(config)
    saved["model"].update(saved_model)
    checkpoint = tmp_path / "checkpoints" / "step-00000002"
    checkpoint.mkdir(parents=True)
    (checkpoint / "kiln_config.yaml").write_text(yaml.safe_dump(saved))
    return checkpoint


def setting_changes(checkpoint, config: RunConfig) -> tuple[str, ...]:
    """What a resume of `checkpoint` with `config` on one process finds changed (kiln.resume's comparison)."""
    from kiln.checkpoint_config import saved_run_config
    from kiln.elastic import layout_of
    from kiln.resume import setting_changes as compare

    return compare(saved_run_config(checkpoint), config, None, layout_of(config.training, 1))


@pytest.mark.parametrize("kind, preset", PRESETS)
def test_a_folder_saved_with_the_old_defaults_resumes_with_the_same_command(tmp_path, kind, preset):
    """A config.yaml written before the options defaulted to None holds the run's defaults of then (gelu, 0.1,
    0.1, 1e-12) where none was given; the same command now gives None, and the model is the same."""
    args = ["--config", DEBUG, *preset_args(kind, preset)]
    config = run_config(*args)
    checkpoint = saved_checkpoint(tmp_path, config, **LEGACY_DEFAULTS)
    assert setting_changes(checkpoint, config) == ()  # no refusal
    if kind == "decoder" and preset == "llama":  # there the saved 0.1 built 0: an explicit 0.1 is a change
        changed = run_config(*args, "--model.hidden_dropout_prob", 0.1)
        assert setting_changes(checkpoint, changed) == ("model.hidden_dropout_prob 0.0 -> 0.1",)


@pytest.mark.parametrize("kind, preset", PRESETS)
def test_a_resume_compares_the_values_the_model_is_built_with(tmp_path, kind, preset):
    """Saved unset and now given (or the other way round) with the preset's value: the same model, no refusal;
    another value: a refusal naming the option."""
    config = run_config("--config", DEBUG, *preset_args(kind, preset))
    expected = PRESET_OPTIONS[(kind, preset or DEFAULT[kind])]
    assert setting_changes(saved_checkpoint(tmp_path / "unset", config), config) == ()
    assert setting_changes(saved_checkpoint(tmp_path / "given", config, **expected), config) == ()
    args = ["--config", DEBUG, *preset_args(kind, preset)]
    given = run_config(*args, "--model.hidden_act", expected["hidden_act"])
    assert setting_changes(saved_checkpoint(tmp_path / "unset-given", config), given) == ()
    other = run_config(*args, "--model.layer_norm_eps", 1e-6)
    changes = setting_changes(saved_checkpoint(tmp_path / "other", config), other)
    assert len(changes) == 1 and changes[0].startswith("model.layer_norm_eps "), changes

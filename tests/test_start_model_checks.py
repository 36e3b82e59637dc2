"""Trust and faults, round five (issue 48, items 2, 3 and 5): a start model's config.json is checked against
its weights' safetensors header before anything is built, the conversion cache is verified by content before
use, and every model option is checked before the output folder is touched. Each refusal is one line, no
traceback, exit status 2, and no output folder (so no tokenizer trained into it)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
import transformers
from kiln_testing import DEBUG, cli_in_process, one_torch_thread
from test_faults_round_two import assert_one_line_error, script_cli
from test_transformers_start import bpe_tokenizer, transformers_folder, wordpiece_tokenizer

WRONG = "; point it at a folder written by save_pretrained"
TINY = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    with one_torch_thread():
        yield


def kiln_folder(folder: Path, kind: str = "encoder", **config) -> Path:
    """A tiny Kiln encoder (pretraining heads) or decoder (causal LM) saved with its tokenizer."""
    from pretrain import modeling

    torch.manual_seed(0)
    if kind == "encoder":
        shape = modeling.KilnEncoderConfig(vocab_size=wordpiece_tokenizer(folder), **TINY, **config)
        model = modeling.KilnEncoderForPreTraining(shape)
    else:
        shape = modeling.KilnDecoderConfig(vocab_size=bpe_tokenizer(folder), **TINY, **config)
        model = modeling.KilnDecoderForCausalLM(shape)
    model.save_pretrained(folder)
    return folder


def edit_config(folder: Path, **changes) -> Path:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def nothing_built(monkeypatch):
    """Counts the models built from here on (every Kiln and transformers model is a PreTrainedModel)."""
    built = []
    original = transformers.PreTrainedModel.__init__

    def counted(self, *args, **kwargs):
        # a model built on the meta device holds no memory: the model gate builds one to know each tensor's shape
        if torch.get_default_device().type != "meta":
            built.append(type(self).__name__)
        original(self, *args, **kwargs)

    monkeypatch.setattr(transformers.PreTrainedModel, "__init__", counted)
    yield built
    assert built == [], f"models were built before the refusal: {built}"


def refusal(capsys, out: Path, *args) -> str:
    """The run's one-line error for ARGS (exit status 2, no traceback); its output folder was never created."""
    code, lines = cli_in_process(capsys, "--training.output_dir", out, *args)
    errors = [line for line in lines if line.startswith("error: ")]
    assert code == 2 and len(errors) == 1, lines
    assert not out.exists(), "the output folder was created before the refusal"
    return errors[0]


# ----------------------------------------------------------------------------------------------------------
# item 2: a start model's config against its weights' header, before any module is built


def deeper_than_its_weights(option: str, folder: Path) -> str:
    return (
        f"error: {option} {folder}: its config.json's num_hidden_layers is 1000000 but its weights hold 2 "
        f"blocks{WRONG}"
    )


def test_a_bert_config_a_million_blocks_deep_is_one_line_in_a_fresh_process(tmp_path):
    """The audit's case as a user meets it: a transformers BERT folder whose config.json asks for 1,000,000
    blocks (inside the range a size may have) over weights of two; before, transformers built the whole
    depth."""
    bert = tmp_path / "bert"
    transformers_folder(bert, "BertForMaskedLM")
    edit_config(bert, num_hidden_layers=1_000_000)
    out = tmp_path / "run"
    status, output = script_cli(
        "pretrain/run.py", "--config", DEBUG, "--model.init_from", bert, "--training.output_dir", out
    )
    assert assert_one_line_error(status, output) == deeper_than_its_weights("--model.init_from", bert), output
    assert not out.exists()


def test_kiln_and_transformers_start_models_that_disagree_with_their_weights_are_refused_unbuilt(
    tmp_path, capsys, nothing_built
):
    encoder, decoder = kiln_folder(tmp_path / "encoder"), kiln_folder(tmp_path / "decoder", "decoder")
    llama = tmp_path / "llama"
    transformers_folder(llama, "LlamaForCausalLM")
    nothing_built.clear()  # from here on nothing may be built
    out, start, as_decoder = tmp_path / "run", "--model.init_from", ("--model.kind", "decoder")

    def refused(folder: Path, *args) -> str:
        line = refusal(capsys, out, *args, start, folder)
        prefix = f"error: {start} {folder}: "
        assert line.startswith(prefix) and line.endswith(WRONG), line
        return line[len(prefix) : -len(WRONG)]

    deeper = edit_config(_copy(encoder, tmp_path / "deeper"), num_hidden_layers=1_000_000)
    assert refusal(capsys, out, start, deeper) == deeper_than_its_weights(start, deeper)
    wider = edit_config(_copy(encoder, tmp_path / "wider"), hidden_size=64)
    vocab = json.loads((encoder / "config.json").read_text())["vocab_size"]
    assert refused(wider) == (
        f"its weights' word embeddings are ({vocab}, 32) but its config.json gives "
        f"({vocab}, 64) (vocab_size, embedding_size or hidden_size)"
    )
    heads = edit_config(_copy(encoder, tmp_path / "heads"), num_attention_heads=5)
    assert refused(heads) == (
        "its config.json: hidden_size=32 is not divisible by num_attention_heads=5; use a head count that divides "
        "it (e.g. 2 or 4)"
    )
    feed_forward = edit_config(_copy(decoder, tmp_path / "feed-forward"), intermediate_size=99)
    assert refused(feed_forward, *as_decoder) == (
        "its weights' first block's feed-forward projection are (37, 32) but its config.json gives (99, 32) "
        "(intermediate_size, hidden_size)"
    )
    key_value = edit_config(_copy(decoder, tmp_path / "key-value"), num_key_value_heads=3)
    assert refused(key_value, *as_decoder) == (
        "its config.json: num_key_value_heads=3 does not divide num_attention_heads=4; use one of [1, 2, 4]"
    )
    theta = edit_config(_copy(decoder, tmp_path / "theta"), rope_theta=0.0)
    assert refused(theta, *as_decoder) == (f"its config.json: rope_theta=0.0 {BASE[:-1]}")
    # an infinite base (JSON's Infinity) rotates every position alike: no position information, not "positive"
    endless = edit_config(_copy(decoder, tmp_path / "endless"), rope_theta=float("inf"))
    assert refused(endless, *as_decoder) == (f"its config.json: rope_theta=inf {BASE[:-1]}")
    # a transformers Llama: its key-value heads against its key projection, its rope_parameters' base
    kv_llama = edit_config(_copy(llama, tmp_path / "kv-llama"), num_key_value_heads=4)
    assert refused(kv_llama, *as_decoder) == (
        "its weights' first block's key projection are (16, 32) but its config.json gives (32, 32) "
        "(num_key_value_heads, head_dim, hidden_size)"
    )
    rope = json.loads((llama / "config.json").read_text())["rope_parameters"]
    no_base = edit_config(_copy(llama, tmp_path / "no-base"), rope_parameters={**rope, "rope_theta": 0.0})
    assert refused(no_base, *as_decoder) == (
        "its config.json's rope_parameters' rope_theta is 0.0, not a finite positive number (the base of the rotary "
        "frequencies)"
    )


def test_a_kiln_model_on_the_hub_is_checked_from_its_header_alone(tmp_path, capsys, hub, nothing_built):
    """A Hub id: the weights' header read by range requests, the weights themselves not downloaded."""
    from huggingface_hub import HfApi

    from pretrain.model_gate import check_model_folder

    fits = kiln_folder(tmp_path / "fits")
    deeper = edit_config(_copy(fits, tmp_path / "deeper"), num_hidden_layers=1_000_000)
    nothing_built.clear()
    for name, folder in (("someone/kiln-fits", fits), ("someone/kiln-deeper", deeper)):
        hub.create_repo(name)
        HfApi().upload_folder(repo_id=name, folder_path=folder, commit_message="init")
    config = json.loads((fits / "config.json").read_text())
    assert "model.layers.1.attention.qkv.weight" in check_model_folder("someone/kiln-fits", "X", config)
    out = tmp_path / "run"
    line = refusal(capsys, out, "--model.init_from", "someone/kiln-deeper")
    assert line == deeper_than_its_weights("--model.init_from", "someone/kiln-deeper")
    from huggingface_hub import constants

    assert not list(Path(constants.HF_HUB_CACHE).glob("models--someone--kiln-deeper/**/model.safetensors"))


def test_fine_tuning_checks_a_kiln_checkpoint_against_its_weights_too(tmp_path, capsys, nothing_built):
    from test_trust import classify_args, run_in_process

    deeper = edit_config(kiln_folder(tmp_path / "deeper"), num_hidden_layers=1_000_000)
    nothing_built.clear()
    code, output = run_in_process(
        capsys, "finetune/classify.py", *classify_args(tmp_path, deeper, "classify")
    )
    assert assert_one_line_error(code, output) == deeper_than_its_weights("--model.checkpoint", deeper), (
        output
    )
    assert not (tmp_path / "classify").exists()
    # fine-tuning's attention kernel, checked as pretraining's
    kernel = [
        *classify_args(tmp_path, kiln_folder(tmp_path / "fits"), "kernel"),
        "--model.attn_implementation",
        "flash",
    ]
    nothing_built.clear()
    code, output = run_in_process(capsys, "finetune/classify.py", *kernel)
    assert assert_one_line_error(code, output) == (
        "error: model: Unknown attn_implementation='flash'; use one of ('sdpa', 'eager', 'flex_attention')."
    ), output
    assert not (tmp_path / "kernel").exists()


def _copy(folder: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(folder, to)
    return to


# ----------------------------------------------------------------------------------------------------------
# item 3: the conversion cache, verified by content before use


def test_a_converted_copy_changed_or_damaged_in_the_cache_is_converted_again(tmp_path, monkeypatch, caplog):
    from huggingface_hub import constants
    from safetensors.torch import load_file

    from kiln.file_hash import sha256_file
    from pretrain.convert import _converted, converted_start

    monkeypatch.setattr(constants, "HF_HOME", str(tmp_path / "hf"))  # this test's own cache
    bert = tmp_path / "bert"
    transformers_folder(bert, "BertForMaskedLM")
    with caplog.at_level(logging.INFO, logger="kiln"):
        folder = Path(converted_start(str(bert), "--model.init_from"))
    written = json.loads((folder / "kiln-converted.json").read_text())["files"]
    assert written["model.safetensors"] == sha256_file(folder / "model.safetensors")
    assert set(written) >= {"config.json", "model.safetensors", "tokenizer.json"}
    weights = folder / "model.safetensors"
    original = {name: tensor.clone() for name, tensor in load_file(weights).items()}
    edited = bytearray(weights.read_bytes())
    edited[-4:] = (
        b"\x00\x00\x80\x7f"  # the last number of the last tensor becomes inf: same size, same header
    )

    def again(damage: bytes | None, problem: str) -> None:
        if damage is None:
            (folder / "kiln-converted.json").unlink()
        else:
            weights.write_bytes(damage)
        caplog.clear()
        _converted.clear()  # the next run: a new process, which checks the copy before its first use
        with caplog.at_level(logging.INFO, logger="kiln"):
            assert converted_start(str(bert), "--model.init_from") == str(folder)
        lines = [record.getMessage() for record in caplog.records]
        said = f"--model.init_from {bert}: the Kiln copy converted from it earlier ({folder}) {problem}"
        assert lines[0].startswith(said) and lines[0].endswith("; converting it again"), lines
        assert caplog.records[0].levelno == logging.WARNING
        assert lines[1].endswith("same weights (kept for the next run)") and len(lines) == 2, lines
        rebuilt = load_file(weights)
        assert rebuilt.keys() == original.keys() and all(
            torch.equal(rebuilt[k], original[k]) for k in original
        )

    changed = "holds a model.safetensors that changed after it was written (not the sha256 recorded)"
    again(bytes(edited), changed)
    again(weights.read_bytes()[: weights.stat().st_size // 2], changed)  # truncated
    again(None, "has no record of the files written (kiln-converted.json: ")
    # a verified copy is used as it is, without a warning
    caplog.clear()
    _converted.clear()
    with caplog.at_level(logging.INFO, logger="kiln"):
        converted_start(str(bert), "--model.init_from")
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]


# ----------------------------------------------------------------------------------------------------------
# item 5: every model option checked before anything is written

BASE = "must be a finite positive number, the base of the rotary frequencies (e.g. 10000)."
THETA = "a finite number > 0"  # a rotary base's declared range (pretrain/config.py)
LLAMA = ("--model.kind", "decoder", "--model.preset", "llama")


@pytest.mark.parametrize(
    "args,message",
    [
        (
            [*LLAMA, "--model.num_key_value_heads", 3],
            "num_key_value_heads=3 does not divide num_attention_heads=2; use one of [1, 2].",
        ),
        (
            ["--model.attn_implementation", "flash_attention_2"],
            "Unknown attn_implementation='flash_attention_2'; use one of ('sdpa', 'eager', 'flex_attention').",
        ),
        (
            [*LLAMA, "--model.attn_implementation", "flex_attention"],
            "attn_implementation='flex_attention' cannot train on cpu: PyTorch's flex attention has no backward "
            "there (CUDA only); use 'sdpa' or 'eager'.",
        ),
        # each option's own range: its declaration (kiln.option_range), the option named as given
        (["--model.rope_theta", 0], f"error: --model.rope_theta must be {THETA}, got 0.0"),
        (
            [*LLAMA, "--model.rope_theta", -500000],
            f"error: --model.rope_theta must be {THETA}, got -500000.0",
        ),
        (
            ["--model.preset", "modernbert", "--model.local_rope_theta", 0],
            f"error: --model.local_rope_theta must be {THETA}, got 0.0",
        ),
        (
            ["--model.num_attention_heads", 0],
            "error: --model.num_attention_heads must be an integer from 1 to 65536, got 0",
        ),
        (
            ["--model.num_hidden_layers", 0],
            "error: --model.num_hidden_layers must be an integer from 1 to 4096, got 0",
        ),
    ],
)
def test_model_options_are_checked_before_anything_is_written(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.setenv("ACCELERATE_USE_CPU", "1")  # the run trains on the CPU, whatever this machine has
    line = message if message.startswith("error: ") else f"error: model: {message}"
    assert refusal(capsys, tmp_path / "run", *args) == line


def test_flex_attention_on_a_gpu_is_refused_with_attention_dropout_only(tmp_path, capsys, monkeypatch):
    import pretrain.run

    monkeypatch.setattr(pretrain.run, "training_device", lambda: "cuda")
    assert refusal(capsys, tmp_path / "run", "--model.attn_implementation", "flex_attention") == (
        "error: model: attn_implementation='flex_attention' has no attention dropout, and the attention dropout "
        "is 0.1; set it to 0 or use 'sdpa' or 'eager'."
    )
    from pretrain.config import ModelConfig
    from pretrain.run import check_attention

    # the llama preset trains without dropout: flex attention is a kernel it can train with on a GPU
    check_attention(ModelConfig(kind="decoder", preset="llama", attn_implementation="flex_attention"))

"""Proof of correctness: BERT / GPT-2 converted to Kiln (and back) compute the same logits and losses."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
import transformers
from kiln_testing import REPO

from pretrain.convert import from_transformers, main, to_transformers
from pretrain.modeling import (
    KilnDecoderConfig,
    KilnDecoderForCausalLM,
    KilnDecoderModel,
    KilnEncoderConfig,
    KilnEncoderForMaskedLM,
    KilnEncoderForPreTraining,
    KilnEncoderForSequenceClassification,
    KilnEncoderForTokenClassification,
    KilnEncoderModel,
)

# initializer_range well above the default 0.02: pre-activations of order 1, where erf GELU and tanh GELU
# differ by more than the tolerance, so a mismatched activation (or any other slip) shows in the logits
ENCODER_SHAPES = [
    dict(vocab_size=1001, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96),
    dict(
        vocab_size=517,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=80,
        type_vocab_size=3,
    ),
]
DECODER_SHAPES = [
    dict(vocab_size=1001, n_embd=48, n_layer=2, n_head=4),
    dict(vocab_size=517, n_embd=32, n_layer=3, n_head=2, n_inner=80, activation_function="gelu"),
]
for _shape in ENCODER_SHAPES + DECODER_SHAPES:
    _shape["initializer_range"] = 0.2
BERT_TO_KILN = {
    transformers.BertForPreTraining: KilnEncoderForPreTraining,
    transformers.BertForMaskedLM: KilnEncoderForMaskedLM,
    transformers.BertModel: KilnEncoderModel,
    transformers.BertForSequenceClassification: KilnEncoderForSequenceClassification,
    transformers.BertForTokenClassification: KilnEncoderForTokenClassification,
}
ATOL = 1e-4


def encoder_batch(vocab_size, seed=0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, vocab_size, (3, 14), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, 9:] = 0
    attention_mask[2, 12:] = 0
    input_ids[attention_mask == 0] = 0
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, 7:] = 1
    labels = torch.full_like(input_ids, -100)
    labels[:, 1::4] = torch.randint(0, vocab_size, labels[:, 1::4].shape, generator=generator)
    labels[attention_mask == 0] = -100
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids), labels


def task_labels(model_class, batch, labels, num_labels):
    if model_class in (transformers.BertForPreTraining, KilnEncoderForPreTraining):
        return dict(labels=labels, next_sentence_label=torch.tensor([0, 1, 1]))
    if model_class in (transformers.BertForMaskedLM, KilnEncoderForMaskedLM):
        return dict(labels=labels)
    if model_class in (transformers.BertForSequenceClassification, KilnEncoderForSequenceClassification):
        return dict(labels=torch.tensor([0, 2, 1]))
    if model_class in (transformers.BertForTokenClassification, KilnEncoderForTokenClassification):
        token_labels = (batch["input_ids"] % num_labels).masked_fill(batch["attention_mask"] == 0, -100)
        return dict(labels=token_labels)
    return {}


def main_output(output):
    """The tensor that proves the function: logits of a head, else the last hidden state."""
    for name in ("prediction_logits", "logits", "last_hidden_state"):
        if getattr(output, name, None) is not None:
            return output[name]


def assert_same_function(hf_model, kiln_model, batch, extra):
    real = batch["attention_mask"].bool()
    hf_out, kiln_out = hf_model(**batch), kiln_model(**batch)
    expected, actual = main_output(hf_out), main_output(kiln_out)
    if expected.dim() == 3:  # per token: padded positions carry no meaning
        expected, actual = expected[real], actual[real]
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=0)
    if getattr(hf_out, "pooler_output", None) is not None:
        torch.testing.assert_close(kiln_out.pooler_output, hf_out.pooler_output, atol=ATOL, rtol=0)
    if getattr(hf_out, "seq_relationship_logits", None) is not None:
        torch.testing.assert_close(
            kiln_out.seq_relationship_logits, hf_out.seq_relationship_logits, atol=ATOL, rtol=0
        )
    if extra:
        hf_loss, kiln_loss = hf_model(**batch, **extra).loss, kiln_model(**batch, **extra).loss
        torch.testing.assert_close(kiln_loss, hf_loss, atol=1e-5, rtol=1e-6)


def assert_same_state(a: dict, b: dict):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("shape", ENCODER_SHAPES, ids=["vocab1001", "vocab517"])
@pytest.mark.parametrize("hf_class", list(BERT_TO_KILN), ids=lambda c: c.__name__)
def test_bert_to_kiln_and_back(hf_class, shape):
    config = transformers.BertConfig(max_position_embeddings=32, num_labels=3, **shape)
    hf_model = hf_class(config).eval()
    kiln_model = from_transformers(hf_model)
    assert type(kiln_model) is BERT_TO_KILN[hf_class] and not kiln_model.training
    batch, labels = encoder_batch(shape["vocab_size"])
    assert_same_function(hf_model, kiln_model, batch, task_labels(hf_class, batch, labels, 3))
    kiln_model.config.sparse_prediction = True  # the fast path pretraining uses computes the same losses
    assert_same_function(hf_model, kiln_model, batch, task_labels(hf_class, batch, labels, 3))
    assert_same_state(to_transformers(kiln_model).state_dict(), hf_model.state_dict())


@pytest.mark.parametrize("kiln_class", list(BERT_TO_KILN.values()), ids=lambda c: c.__name__)
def test_kiln_encoder_to_bert_and_back(kiln_class):
    config = KilnEncoderConfig(max_position_embeddings=32, num_labels=3, **ENCODER_SHAPES[0])
    kiln_model = kiln_class(config).eval()
    hf_model = to_transformers(kiln_model)
    assert type(hf_model).__name__ == {v: k for k, v in BERT_TO_KILN.items()}[kiln_class].__name__
    batch, labels = encoder_batch(config.vocab_size, seed=1)
    assert_same_function(hf_model, kiln_model, batch, task_labels(kiln_class, batch, labels, 3))
    assert_same_state(from_transformers(hf_model).state_dict(), kiln_model.state_dict())


def test_dense_mlm_path_matches_bert_too():
    config = transformers.BertConfig(max_position_embeddings=32, **ENCODER_SHAPES[0])
    hf_model = transformers.BertForPreTraining(config).eval()
    kiln_model = from_transformers(hf_model)
    assert not kiln_model.config.sparse_prediction  # transformers' output shapes by default
    batch, labels = encoder_batch(config.vocab_size, seed=2)
    extra = dict(labels=labels, next_sentence_label=torch.tensor([1, 0, 1]))
    hf_out, kiln_out = hf_model(**batch, **extra), kiln_model(**batch, **extra)
    torch.testing.assert_close(kiln_out.loss, hf_out.loss, atol=1e-5, rtol=1e-6)
    assert kiln_out.prediction_logits.shape == hf_out.prediction_logits.shape


def test_bare_bert_without_pooler_and_sinusoidal_kiln_convert():
    config = transformers.BertConfig(max_position_embeddings=32, **ENCODER_SHAPES[1])
    hf_model = transformers.BertModel(config, add_pooling_layer=False).eval()
    kiln_model = from_transformers(hf_model)
    assert kiln_model.pooler is None
    batch, _ = encoder_batch(config.vocab_size)
    assert_same_function(hf_model, kiln_model, batch, {})

    sinusoidal = KilnEncoderForMaskedLM(
        KilnEncoderConfig(
            max_position_embeddings=32, position_embedding_type="sinusoidal", **ENCODER_SHAPES[0]
        )
    ).eval()
    bert = to_transformers(sinusoidal)  # the fixed table becomes BERT's (learned) position table
    batch, labels = encoder_batch(sinusoidal.config.vocab_size)
    assert_same_function(bert, sinusoidal, batch, dict(labels=labels))


def test_bert_in_train_mode_converts_to_train_mode():
    hf_model = transformers.BertForMaskedLM(transformers.BertConfig(**ENCODER_SHAPES[0])).train()
    assert from_transformers(hf_model).training


# ------------------------------------------------------------------------------------------------------ GPT-2
def gpt2_batch(vocab_size, seed=0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab_size, (3, 13), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 10:] = 0
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    return dict(input_ids=input_ids, attention_mask=attention_mask), labels


@pytest.mark.parametrize("shape", DECODER_SHAPES, ids=["gelu_new", "gelu_n_inner"])
@pytest.mark.parametrize(
    "hf_class", [transformers.GPT2LMHeadModel, transformers.GPT2Model], ids=lambda c: c.__name__
)
def test_gpt2_to_kiln_and_back(hf_class, shape):
    config = transformers.GPT2Config(n_positions=32, bos_token_id=0, eos_token_id=0, **shape)
    hf_model = hf_class(config).eval()
    kiln_model = from_transformers(hf_model)
    assert type(kiln_model) is (
        KilnDecoderForCausalLM if hf_class is transformers.GPT2LMHeadModel else KilnDecoderModel
    )
    assert kiln_model.config.activation_function == config.activation_function
    batch, labels = gpt2_batch(shape["vocab_size"])
    extra = dict(labels=labels) if hf_class is transformers.GPT2LMHeadModel else {}
    assert_same_function(hf_model, kiln_model, batch, extra)
    assert_same_state(to_transformers(kiln_model).state_dict(), hf_model.state_dict())


def test_gpt2_with_cross_attention_converts_both_ways():
    config = transformers.GPT2Config(
        n_positions=32, bos_token_id=0, eos_token_id=0, add_cross_attention=True, **DECODER_SHAPES[0]
    )
    hf_model = transformers.GPT2LMHeadModel(config).eval()
    kiln_model = from_transformers(hf_model)
    batch, labels = gpt2_batch(config.vocab_size)
    batch["encoder_hidden_states"] = torch.randn(3, 6, config.n_embd)
    batch["encoder_attention_mask"] = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 5 + [0]])
    assert_same_function(hf_model, kiln_model, batch, dict(labels=labels))
    assert_same_state(to_transformers(kiln_model).state_dict(), hf_model.state_dict())


def test_kiln_decoder_to_gpt2_and_back():
    config = KilnDecoderConfig(
        max_position_embeddings=32, bos_token_id=0, eos_token_id=0, **DECODER_SHAPES[1]
    )
    kiln_model = KilnDecoderForCausalLM(config).eval()
    hf_model = to_transformers(kiln_model)
    assert type(hf_model) is transformers.GPT2LMHeadModel and hf_model.config.n_inner == 80
    batch, labels = gpt2_batch(config.vocab_size, seed=3)
    assert_same_function(hf_model, kiln_model, batch, dict(labels=labels))
    assert_same_state(from_transformers(hf_model).state_dict(), kiln_model.state_dict())


def test_unsupported_models_are_refused():
    with pytest.raises(ValueError, match="Cannot convert BertLMHeadModel; supported: BertModel"):
        from_transformers(
            transformers.BertLMHeadModel(transformers.BertConfig(is_decoder=True, **ENCODER_SHAPES[1]))
        )
    config = transformers.GPT2Config(
        n_positions=32, scale_attn_by_inverse_layer_idx=True, **DECODER_SHAPES[1]
    )
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx"):
        from_transformers(transformers.GPT2Model(config))


# -------------------------------------------------------------------------------------------------------- CLI
def test_cli_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "SRC_DIR" in capsys.readouterr().out


def test_cli_converts_a_bert_checkpoint_to_kiln_and_back(tmp_path):
    bert = transformers.BertForPreTraining(
        transformers.BertConfig(max_position_embeddings=32, **ENCODER_SHAPES[1])
    )
    bert.eval().save_pretrained(tmp_path / "bert")
    (tmp_path / "bert" / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    main([str(tmp_path / "bert"), str(tmp_path / "kiln")])
    assert json.loads((tmp_path / "kiln" / "config.json").read_text())["model_type"] == "kiln_encoder"
    assert (tmp_path / "kiln" / "vocab.txt").read_text() == "[PAD]\n[UNK]\n"
    kiln = transformers.AutoModelForPreTraining.from_pretrained(tmp_path / "kiln").eval()
    assert type(kiln) is KilnEncoderForPreTraining
    batch, _ = encoder_batch(bert.config.vocab_size)
    assert_same_function(bert, kiln, batch, {})

    main([str(tmp_path / "kiln"), str(tmp_path / "back")])
    back = transformers.BertForPreTraining.from_pretrained(tmp_path / "back").eval()
    assert_same_state(back.state_dict(), bert.state_dict())


def test_conversion_draws_its_stages_on_a_terminal_and_nothing_in_a_log(tmp_path, monkeypatch, capsys):
    """On a terminal, one bar over check, load, convert and write, each stage named as it starts, gone when the
    folder is written; in a log (not a terminal) no bar at all, just the closing line."""
    import sys

    bert = transformers.BertForPreTraining(
        transformers.BertConfig(max_position_embeddings=32, **ENCODER_SHAPES[1])
    )
    bert.eval().save_pretrained(tmp_path / "bert")
    main([str(tmp_path / "bert"), str(tmp_path / "log")])
    logged = capsys.readouterr()
    assert "stage" not in logged.err and logged.out.startswith("wrote KilnEncoderForPreTraining")

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    main([str(tmp_path / "bert"), str(tmp_path / "terminal")])
    drawn = capsys.readouterr().err
    shown = []  # the stage each redraw names, in order, repeats dropped
    for name in re.findall(r", (\w+)\]", drawn):
        if not shown or shown[-1] != name:
            shown.append(name)
    assert shown == ["check", "load", "convert", "write"], drawn
    assert "4/4" in drawn and (tmp_path / "terminal" / "model.safetensors").is_file()

    # a refused source stops the bar where it was: the stages after it never show
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        main([str(tmp_path / "empty"), str(tmp_path / "never")])
    assert "write]" not in capsys.readouterr().err


def test_cli_refuses_an_unknown_model_type(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "config.json").write_text(json.dumps({"model_type": "t5"}))
    line = _refused(capsys, tmp_path / "src", tmp_path / "dst")
    assert (
        line.startswith("error: ")
        and "`t5` model; only bert, electra, modernbert, gpt2, llama, kiln_encoder" in line
    )


def test_cli_refuses_a_source_it_cannot_read_with_status_2(tmp_path, capsys):
    """A user's input refused (exit status 2, one line), as every Kiln command's: no config.json, one that is
    not JSON, a folder without weights, a model whose settings do not convert."""
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _refused(capsys, empty, tmp_path / "dst") == (
        f"error: {empty} has no config.json; pass a folder written by save_pretrained"
    )
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    assert _refused(capsys, broken, tmp_path / "dst").startswith(
        f"error: {broken}: cannot read a model from it (cannot read config.json: "
    )
    bert = transformers.BertConfig(max_position_embeddings=32, **ENCODER_SHAPES[1])
    bare = tmp_path / "bare"
    bert.save_pretrained(bare)
    assert _refused(capsys, bare, tmp_path / "dst") == (
        f"error: {bare} holds no weights (no model.safetensors); pass a folder written by save_pretrained"
    )
    relative = tmp_path / "relative"
    transformers.BertForPreTraining(
        transformers.BertConfig(
            max_position_embeddings=32, position_embedding_type="relative_key", **ENCODER_SHAPES[1]
        )
    ).save_pretrained(relative)
    line = _refused(capsys, relative, tmp_path / "dst")
    assert line.startswith("error: ") and "relative" in line, line
    assert not (tmp_path / "dst").exists()


def test_cli_names_a_missing_source_folder_in_one_line_without_the_hub(tmp_path, monkeypatch, capsys):
    import huggingface_hub

    def no_network(*args, **kwargs):
        raise AssertionError("the Hub was asked")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
    for spec in ("runs/decoder-tiny/final", str(tmp_path / "nothing"), "./nothing", "a/b/c"):
        assert re.match(
            f"^error: no model folder {re.escape(spec)}; train one first .* or give a Hub id",
            _refused(capsys, spec, tmp_path / "dst"),
        )
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert _refused(capsys, "nobody-kiln/never-cached", tmp_path / "dst").startswith(
        "error: SRC_DIR nobody-kiln/never-cached is not in the Hugging Face cache and HF_HUB_OFFLINE is set; unset "
        "HF_HUB_OFFLINE"
    )
    assert not (tmp_path / "dst").exists()


def test_a_missing_source_folder_is_status_2_before_torch_loads(tmp_path):
    """`python -m pretrain.convert` says a missing SRC_DIR before it imports torch: exit status 2, one line."""
    done = subprocess.run(
        [sys.executable, "-m", "pretrain.convert", str(tmp_path / "nothing"), str(tmp_path / "dst")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 2 and not done.stdout, (done.returncode, done.stdout, done.stderr)
    assert done.stderr.splitlines() == [
        f"error: no model folder {tmp_path / 'nothing'}; train one first (`kiln-launch pretrain/run.py` leaves "
        "runs/encoder-tiny/final) or give a Hub id (user/name)"
    ]


# ------------------------------------------------------------------------------- the rest of the head family
def head_inputs(model_class_name, vocab_size, num_labels=3, seed=5):
    """(inputs, labels, the output fields that prove the function) for each BERT / GPT-2 head."""
    batch, labels = encoder_batch(vocab_size, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    if "MultipleChoice" in model_class_name:  # 3 questions x 2 choices: (B, C, T)
        batch = {name: value[:2].unsqueeze(1).expand(-1, 2, -1).clone() for name, value in batch.items()}
        batch["input_ids"][:, 1, 3:6] = torch.randint(1, vocab_size, (2, 3), generator=generator)
        return batch, dict(labels=torch.tensor([1, 0])), ("logits",)
    if "QuestionAnswering" in model_class_name:
        # one start beyond the sequence: ignored, as BERT clamps it
        return (
            batch,
            dict(start_positions=torch.tensor([2, 5, 40]), end_positions=torch.tensor([4, 9, 13])),
            ("start_logits", "end_logits"),
        )
    if "NextSentence" in model_class_name:
        return batch, dict(labels=torch.tensor([1, 0, 1])), ("logits",)
    gpt2 = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    if "ForSequenceClassification" in model_class_name:  # GPT-2: read at the last non-padding token
        return gpt2, dict(labels=torch.tensor([0, 2, 1])), ("logits",)
    token_labels = (batch["input_ids"] % num_labels).masked_fill(batch["attention_mask"] == 0, -100)
    return gpt2, dict(labels=token_labels), ("logits",)


NEW_HEADS = [
    (transformers.BertForNextSentencePrediction, transformers.BertConfig, ENCODER_SHAPES[0]),
    (transformers.BertForMultipleChoice, transformers.BertConfig, ENCODER_SHAPES[1]),
    (transformers.BertForQuestionAnswering, transformers.BertConfig, ENCODER_SHAPES[0]),
    (transformers.GPT2ForSequenceClassification, transformers.GPT2Config, DECODER_SHAPES[0]),
    (transformers.GPT2ForTokenClassification, transformers.GPT2Config, DECODER_SHAPES[1]),
]


@pytest.mark.parametrize("hf_class, config_class, shape", NEW_HEADS, ids=lambda v: getattr(v, "__name__", ""))
@pytest.mark.parametrize("direction", ["from_transformers", "to_transformers"])
def test_every_bert_and_gpt2_head_converts_with_equal_logits_and_loss(
    hf_class, config_class, shape, direction
):
    extra = dict(pad_token_id=0) if config_class is transformers.GPT2Config else {}
    num_labels = 2 if hf_class is transformers.BertForQuestionAnswering else 3  # QA: start and end
    config = config_class(num_labels=num_labels, **extra, **shape)
    if config_class is transformers.BertConfig:
        config.max_position_embeddings = 32
    if direction == "from_transformers":
        hf_model = hf_class(config).eval()
        kiln_model = from_transformers(hf_model)
    else:
        kiln_class = from_transformers(hf_class(config)).__class__  # the Kiln twin, built from its own config
        kiln_config = from_transformers(hf_class(config)).config
        kiln_model = kiln_class(kiln_config).eval()
        hf_model = to_transformers(kiln_model)
    assert type(hf_model) is hf_class and type(kiln_model).__name__.startswith("Kiln")
    assert (
        type(kiln_model).__name__.removeprefix("KilnEncoder").removeprefix("KilnDecoder") in hf_class.__name__
    )
    vocab_size = shape["vocab_size"]
    batch, labels, fields = head_inputs(hf_class.__name__, vocab_size)
    hf_out, kiln_out = hf_model(**batch, **labels), kiln_model(**batch, **labels)
    for field in fields:
        expected, actual = hf_out[field], kiln_out[field]
        assert actual.shape == expected.shape
        if hf_class is transformers.GPT2ForTokenClassification:  # padded positions carry no meaning
            real = batch["attention_mask"].bool()
            expected, actual = expected[real], actual[real]
        torch.testing.assert_close(actual, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(kiln_out.loss, hf_out.loss, atol=1e-5, rtol=1e-6)
    assert_same_state(to_transformers(kiln_model).state_dict(), hf_model.state_dict())
    assert_same_state(from_transformers(hf_model).state_dict(), kiln_model.state_dict())


# ------------------------------------------------------------------------------------- where convert writes DST
def _tree(folder):
    """Every entry under `folder` (links not followed): its bytes, its link target, or "dir"."""
    import os

    return {
        str(path.relative_to(folder)): "-> " + os.readlink(path)
        if path.is_symlink()
        else ("dir" if path.is_dir() else path.read_bytes())
        for path in sorted(folder.rglob("*"))
    }


@pytest.fixture
def bert_folder(tmp_path):
    bert = transformers.BertForPreTraining(
        transformers.BertConfig(max_position_embeddings=32, **ENCODER_SHAPES[1])
    )
    bert.eval().save_pretrained(tmp_path / "bert")
    (tmp_path / "bert" / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    return tmp_path / "bert"


def _refused(capsys, *argv) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main([str(arg) for arg in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1, err
    return err[0]


def test_a_users_folder_as_dst_is_refused_before_anything_is_written(bert_folder, tmp_path, capsys):
    """transformers' save_pretrained clears the shard files it did not write and replaces config.json: a user's
    folder as DST_DIR is refused in one line, left byte for byte as it was."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"mine": true}\n')
    (mine / "model-00001-of-00002.safetensors").write_bytes(b"my shard")
    (mine / "notes.txt").write_text("notes\n")
    before = _tree(tmp_path)
    line = _refused(capsys, bert_folder, mine)
    assert line == (
        f"error: DST_DIR {mine} holds files convert did not write (config.json, "
        "model-00001-of-00002.safetensors, notes.txt); pick a new or empty DST_DIR: convert replaces only a "
        "folder an earlier convert wrote, and removes only its files"
    )
    assert _tree(tmp_path) == before


def test_src_as_dst_or_a_folder_inside_it_is_refused_and_src_left_whole(bert_folder, tmp_path, capsys):
    before = _tree(tmp_path)
    for dst in (bert_folder, bert_folder / "kiln", bert_folder / "." / "deeper" / ".."):
        line = _refused(capsys, bert_folder, dst)
        assert line == (
            f"error: DST_DIR {dst} is SRC_DIR {bert_folder} or inside it; pick a DST_DIR outside SRC_DIR: "
            "convert writes a new folder and never rewrites the one it reads"
        )
        assert _tree(tmp_path) == before  # not half-converted, nothing made inside it


def test_an_earlier_conversion_is_replaced_whole_unless_something_was_added(bert_folder, tmp_path, capsys):
    dst = tmp_path / "kiln"
    main([str(bert_folder), str(dst)])
    record = json.loads((dst / "kiln-converted.json").read_text())["files"]
    assert {"config.json", "model.safetensors", "vocab.txt"} <= set(record)
    main([str(bert_folder), str(dst)])  # its own earlier output: replaced (no staging folder left beside it)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bert", "kiln"]
    # a file added, a file changed, a link put in place of one: the folder is no longer only convert's
    outside = tmp_path / "outside.json"
    outside.write_text("mine\n")
    for change, named in (
        (lambda: (dst / "notes.txt").write_text("mine\n"), "notes.txt"),
        (lambda: (dst / "vocab.txt").write_text("[PAD]\nmine\n"), "vocab.txt"),
        (lambda: ((dst / "config.json").unlink(), (dst / "config.json").symlink_to(outside)), "config.json"),
    ):
        shutil.rmtree(dst)
        main([str(bert_folder), str(dst)])
        change()
        before = _tree(tmp_path)
        line = _refused(capsys, bert_folder, dst)
        assert line.startswith(f"error: DST_DIR {dst} holds files convert did not write ({named})"), line
        assert _tree(tmp_path) == before

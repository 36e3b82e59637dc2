"""Kiln as a drop-in for transformers' BERT / GPT-2: output shapes, config checks, accepted and refused
arguments, `shift_labels`, `token_type_ids`, all-padding rows (issue 13 and items 10-11 of issue 11)."""

import json

import pytest
import torch
import torch.nn.functional as F
import transformers
from kiln_testing import WITHOUT_THE_PROJECT, tiny_decoder_config, tiny_encoder_config

from pretrain.convert import from_transformers
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

ATOL = 1e-5
BERT = dict(
    vocab_size=211,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=32,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    initializer_range=0.2,
)
GPT2 = dict(
    vocab_size=211,
    n_embd=32,
    n_layer=2,
    n_head=4,
    n_positions=32,
    bos_token_id=1,
    eos_token_id=2,
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attn_pdrop=0.0,
    initializer_range=0.2,
)
ENCODER_CLASSES = [
    KilnEncoderModel,
    KilnEncoderForPreTraining,
    KilnEncoderForMaskedLM,
    KilnEncoderForSequenceClassification,
    KilnEncoderForTokenClassification,
]
DECODER_CLASSES = [KilnDecoderModel, KilnDecoderForCausalLM]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def mlm_batch(seed=0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, BERT["vocab_size"], (3, 10), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 7:] = 0
    labels = torch.full_like(input_ids, -100)
    labels[:, 2::3] = input_ids[:, 2::3]
    labels[attention_mask == 0] = -100
    return input_ids, attention_mask, labels


# ----------------------------------------------------------------------------------- dense logits by default
@pytest.mark.parametrize("hf_class", [transformers.BertForPreTraining, transformers.BertForMaskedLM])
def test_mlm_logits_with_labels_have_berts_shape_and_values_by_default(hf_class):
    hf_model = hf_class(transformers.BertConfig(**BERT)).eval()
    kiln_model = from_transformers(hf_model)
    assert not kiln_model.config.sparse_prediction and not KilnEncoderConfig().sparse_prediction
    input_ids, attention_mask, labels = mlm_batch()
    extra = (
        {"next_sentence_label": torch.tensor([0, 1, 1])}
        if hf_class is transformers.BertForPreTraining
        else {}
    )
    hf_out = hf_model(input_ids, attention_mask=attention_mask, labels=labels, **extra)
    kiln_out = kiln_model(input_ids, attention_mask=attention_mask, labels=labels, **extra)
    name = "prediction_logits" if hf_class is transformers.BertForPreTraining else "logits"
    assert kiln_out[name].shape == hf_out[name].shape == (3, 10, BERT["vocab_size"])
    real = attention_mask.bool()
    torch.testing.assert_close(kiln_out[name][real], hf_out[name][real], atol=1e-4, rtol=0)
    torch.testing.assert_close(kiln_out.loss, hf_out.loss, atol=ATOL, rtol=0)


def test_pretraining_turns_the_sparse_path_on_and_saved_folders_have_it_off(tmp_path):
    from accelerate import Accelerator

    from kiln.export import save_model_files
    from pretrain.run import PRETRAINING_FAST_PATHS

    assert PRETRAINING_FAST_PATHS == {"sparse_prediction": True, "chunked_mlm_loss": True}
    model = KilnEncoderForPreTraining(tiny_encoder_config(**PRETRAINING_FAST_PATHS))
    save_model_files(Accelerator(cpu=True), model, None, tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert saved["sparse_prediction"] is False and saved["chunked_mlm_loss"] is False
    assert model.config.sparse_prediction and model.config.chunked_mlm_loss  # the run itself keeps them
    reloaded = transformers.AutoModelForPreTraining.from_pretrained(tmp_path / "saved").train()
    input_ids, attention_mask, labels = mlm_batch()
    out = reloaded(
        input_ids, attention_mask=attention_mask, labels=labels, next_sentence_label=torch.tensor([0, 1, 0])
    )
    assert out.prediction_logits.shape == (3, 10, reloaded.config.vocab_size)  # like BERT, in train mode too


def test_the_runner_builds_encoders_with_the_sparse_path():
    from kiln_testing import DEBUG

    from kiln.config import build_config
    from pretrain.config import RunConfig
    from pretrain.run import model_config_kwargs

    config = build_config(RunConfig, ["--config", DEBUG], prog="run")
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=__import__("tokenizers").Tokenizer(
            __import__("tokenizers").models.WordLevel({"[PAD]": 0}, "[PAD]")
        ),
        pad_token="[PAD]",
    )
    kwargs = model_config_kwargs(config, 64, tokenizer)
    assert kwargs["sparse_prediction"] is True and kwargs["chunked_mlm_loss"] is True


# ------------------------------------------------------------------------------------ config checks at build
@pytest.mark.parametrize(
    "config_class, model_class",
    [(KilnEncoderConfig, KilnEncoderModel), (KilnDecoderConfig, KilnDecoderModel)],
    ids=["encoder", "decoder"],
)
def test_a_config_takes_any_one_field_and_the_model_build_checks_heads(config_class, model_class):
    config = config_class(hidden_size=32, num_hidden_layers=1, intermediate_size=64)  # default 12 heads
    assert config.hidden_size == 32 and config.num_attention_heads == 12
    with pytest.raises(
        ValueError, match="hidden_size=32 is not divisible by num_attention_heads=12.*e.g. 8 or 16"
    ):
        model_class(config)
    config.num_attention_heads = 8
    assert model_class(config).config.num_attention_heads == 8


# ------------------------------------------------------------------------------------------ decoder inputs
def test_decoder_token_type_ids_index_the_token_embedding_as_in_gpt2():
    hf_model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2)).eval()
    kiln_model = from_transformers(hf_model)
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(3, GPT2["vocab_size"], (2, 7), generator=generator)
    token_type_ids = torch.randint(0, 2, (2, 7), generator=generator)
    hf_logits = hf_model(input_ids, token_type_ids=token_type_ids).logits
    kiln_logits = kiln_model(input_ids, token_type_ids=token_type_ids).logits
    torch.testing.assert_close(kiln_logits, hf_logits, atol=1e-4, rtol=0)
    assert not torch.allclose(kiln_logits, kiln_model(input_ids).logits, atol=1e-3)
    generate = dict(max_new_tokens=5, do_sample=False, pad_token_id=0)
    hf_tokens = hf_model.generate(input_ids, token_type_ids=token_type_ids, **generate)
    kiln_tokens = kiln_model.generate(input_ids, token_type_ids=token_type_ids, **generate)
    assert torch.equal(kiln_tokens, hf_tokens)


# --------------------------------------------------------------------------------- shift_labels, item count
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train-chunked"])
def test_causal_lm_loss_honours_shift_labels_and_num_items_in_batch(training):
    hf_model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2)).eval()
    kiln_model = from_transformers(hf_model).train(training)
    assert kiln_model._uses_chunked_loss() == training
    generator = torch.Generator().manual_seed(2)
    input_ids = torch.randint(3, GPT2["vocab_size"], (2, 9), generator=generator)
    shift_labels = torch.randint(3, GPT2["vocab_size"], (2, 9), generator=generator)  # not input_ids shifted
    shift_labels[0, :3] = -100
    logits = hf_model(input_ids).logits
    expected = F.cross_entropy(logits.flatten(0, 1), shift_labels.flatten(), ignore_index=-100)
    for labels in (input_ids, None):  # shift_labels win over labels, and need no labels
        loss = kiln_model(input_ids, labels=labels, shift_labels=shift_labels).loss
        torch.testing.assert_close(loss, expected, atol=ATOL, rtol=0)
    hf_loss = hf_model(input_ids, labels=input_ids, shift_labels=shift_labels).loss
    torch.testing.assert_close(hf_loss, expected, atol=ATOL, rtol=0)
    # transformers' Trainer passes the window's target count: the loss is then a sum over it
    summed = kiln_model(input_ids, shift_labels=shift_labels, num_items_in_batch=40).loss
    torch.testing.assert_close(summed, expected * 15 / 40, atol=ATOL, rtol=0)
    hf_summed = hf_model(input_ids, labels=input_ids, shift_labels=shift_labels, num_items_in_batch=40).loss
    torch.testing.assert_close(summed, hf_summed, atol=ATOL, rtol=0)


# ------------------------------------------------------------------------------------------ unknown kwargs
@pytest.mark.parametrize("model_class", ENCODER_CLASSES + DECODER_CLASSES, ids=lambda c: c.__name__)
def test_a_mistyped_keyword_argument_is_an_error(model_class):
    config = tiny_encoder_config() if model_class in ENCODER_CLASSES else tiny_decoder_config()
    model = model_class(config).eval()
    input_ids = torch.randint(3, 200, (2, 6))
    with pytest.raises(
        TypeError, match=f"{model_class.__name__}.forward\\(\\) got unexpected keyword argument.*labls"
    ):
        model(input_ids, labls=input_ids)
    # what transformers' Trainer and generate pass to every model is accepted, and without labels changes nothing
    with torch.no_grad():
        passed = model(input_ids, num_items_in_batch=torch.tensor(7), output_attentions=False)
        plain = model(input_ids)
    assert passed.keys() == plain.keys() and "attentions" not in passed
    for name in plain.keys() - {"cache", "past_key_values"}:  # a decoder cache: not a tensor to compare
        torch.testing.assert_close(passed[name], plain[name], atol=0, rtol=0, msg=name)


# ------------------------------------------------------------------------------------------ all-padding rows
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_an_all_padding_row_attends_to_nothing_as_in_bert(implementation):
    hf_model = transformers.BertModel(transformers.BertConfig(**BERT)).eval()  # sdpa: the default kernel
    kiln_model = from_transformers(hf_model)
    kiln_model.config._attn_implementation = implementation
    input_ids, _, _ = mlm_batch(seed=3)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1] = 0  # a whole row of padding
    attention_mask[2, 6:] = 0
    hf_out = hf_model(input_ids, attention_mask=attention_mask).last_hidden_state
    kiln_out = kiln_model(input_ids, attention_mask=attention_mask).last_hidden_state
    torch.testing.assert_close(kiln_out, hf_out, atol=1e-4, rtol=0)
    other = input_ids.clone()
    other[1, 1:] = (other[1, 1:] + 7) % BERT["vocab_size"]  # change the padded tokens the row could read
    again = kiln_model(other, attention_mask=attention_mask).last_hidden_state
    torch.testing.assert_close(again[1, 0], kiln_out[1, 0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_an_all_padding_encoder_row_gives_no_cross_attention_as_in_gpt2(implementation):
    hf_model = transformers.GPT2LMHeadModel(transformers.GPT2Config(add_cross_attention=True, **GPT2)).eval()
    kiln_model = from_transformers(hf_model)
    kiln_model.config._attn_implementation = implementation
    input_ids = torch.randint(3, GPT2["vocab_size"], (2, 5))
    encoder_hidden_states = torch.randn(2, 6, GPT2["n_embd"])
    encoder_attention_mask = torch.tensor([[1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0]])
    batch = dict(encoder_hidden_states=encoder_hidden_states, encoder_attention_mask=encoder_attention_mask)
    hf_logits = hf_model(input_ids, **batch).logits
    kiln_logits = kiln_model(input_ids, **batch).logits
    torch.testing.assert_close(kiln_logits, hf_logits, atol=1e-4, rtol=0)
    batch["encoder_hidden_states"] = encoder_hidden_states + torch.randn(2, 6, GPT2["n_embd"])
    again = kiln_model(input_ids, **batch).logits
    torch.testing.assert_close(again[1], kiln_logits[1], atol=1e-6, rtol=0)


# --------------------------------------------------------------------------- every head, every kernel, no mask
def every_head():
    import pretrain.modeling as modeling

    for name in modeling.__all__:
        model_class = getattr(modeling, name)
        if isinstance(model_class, type) and issubclass(model_class, transformers.PreTrainedModel):
            if not name.endswith("PreTrainedModel"):
                yield model_class


@pytest.mark.parametrize("implementation", ["eager", "sdpa", "flex_attention"])
@pytest.mark.parametrize("model_class", list(every_head()), ids=lambda c: c.__name__)
def test_every_head_loaded_with_each_kernel_runs_without_an_attention_mask(
    model_class, implementation, tmp_path
):
    """A client's call with no `attention_mask` (BERT's and GPT-2's classes take it) gives what an all-ones mask
    gives, for every head and kernel a folder can be loaded with (the encoder's heads under flex attention once
    failed in the unpadding check)."""
    if model_class.__name__.startswith("KilnEncoderDecoder"):
        from pretrain.modeling import KilnEncoderDecoderConfig

        decoder = tiny_decoder_config(is_decoder=True, add_cross_attention=True, use_cache=False)
        config = KilnEncoderDecoderConfig(encoder=tiny_encoder_config().to_dict(), decoder=decoder.to_dict())
    elif "Encoder" in model_class.__name__:
        config = tiny_encoder_config(num_labels=2, unpad_inputs=True)
    else:
        config = tiny_decoder_config(num_labels=2, use_cache=False)
    if model_class.__name__ == "KilnEncoderForElectraPreTraining":  # saved as two folders: see saved_parts
        model = model_class(config).eval()
        model.set_attn_implementation(implementation)
    else:
        model_class(config).save_pretrained(tmp_path)
        if model_class.__name__.startswith("KilnEncoderDecoder") and implementation == "flex_attention":
            with pytest.raises(
                ValueError, match="does not support an attention implementation through torch's flex"
            ):
                model_class.from_pretrained(
                    tmp_path, attn_implementation=implementation
                )  # transformers refuses it
            return
        model = model_class.from_pretrained(tmp_path, attn_implementation=implementation).eval()
    assert model.config._attn_implementation == implementation
    input_ids = torch.randint(3, 200, (2, 2, 8) if "MultipleChoice" in model_class.__name__ else (2, 8))
    inputs = dict(decoder_input_ids=input_ids[:, :5]) if "EncoderDecoder" in model_class.__name__ else {}
    with torch.no_grad():
        plain = model(input_ids, **inputs)
        masked = model(input_ids, attention_mask=torch.ones_like(input_ids), **inputs)
    compared = [name for name, value in masked.items() if isinstance(value, torch.Tensor)]
    assert compared
    for name in compared:
        torch.testing.assert_close(plain[name], masked[name], atol=1e-5, rtol=0, msg=name)


# ------------------------------------------------------------------------------------------------ model cards
def test_model_cards_claim_only_tasks_a_kiln_head_serves(tmp_path):
    from kiln.hub import _AUTO_CLASS, write_model_card
    from pretrain.modeling import DECODER_AUTO_CLASSES, ENCODER_AUTO_CLASSES

    registered = {*ENCODER_AUTO_CLASSES, *DECODER_AUTO_CLASSES, "AutoModelForSeq2SeqLM"}
    assert set(_AUTO_CLASS.values()) <= registered
    for auto_name in ("AutoModelForQuestionAnswering", "AutoModelForMultipleChoice"):
        assert auto_name in ENCODER_AUTO_CLASSES
    card = dict(
        model_id=None,
        model_kind="encoder",
        summary={},
        metrics={},
        datasets=[],
        license="mit",
        tags=[],
        loss_plot=None,
    )
    readme = write_model_card(tmp_path / "qa", task="question-answering", **card)
    assert "AutoModelForQuestionAnswering.from_pretrained(" in open(readme).read()
    with pytest.raises(ValueError, match="No Kiln head serves the task 'image-classification'"):
        write_model_card(tmp_path / "image", task="image-classification", **card)


# ------------------------------------------------------------------------------ seq2seq folder, remote code
REMOTE_CHILD = (
    WITHOUT_THE_PROJECT
    + r"""
import torch, transformers

folder, out_file = sys.argv[2:4]
model = transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
input_ids = (torch.arange(12).view(2, 6) * 7 + 3) % 97
with torch.no_grad():
    generated = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=5)
torch.save({"class": type(model).__module__ + "." + type(model).__name__, "generated": generated,
            "imported_pretrain": "pretrain" in sys.modules}, out_file)
"""
)


@pytest.mark.slow
def test_the_seq2seq_folder_carries_its_code_and_loads_with_trust_remote_code_in_a_fresh_process(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from pretrain.modeling import KilnEncoderDecoderConfig, KilnEncoderDecoderModel

    encoder = KilnEncoderModel(tiny_encoder_config(vocab_size=97))
    decoder = KilnDecoderForCausalLM(
        tiny_decoder_config(vocab_size=97, add_cross_attention=True, bos_token_id=1, eos_token_id=2)
    )
    model = KilnEncoderDecoderModel(encoder=encoder, decoder=decoder).eval()
    assert isinstance(model.config, KilnEncoderDecoderConfig) and isinstance(
        model, transformers.EncoderDecoderModel
    )
    model.config.decoder_start_token_id, model.config.pad_token_id = 1, 0
    model.save_pretrained(tmp_path / "s2s")
    saved = json.loads((tmp_path / "s2s" / "config.json").read_text())
    assert saved["model_type"] == "kiln_encoder_decoder"
    assert saved["auto_map"] == {
        "AutoConfig": "configuration_kiln.KilnEncoderDecoderConfig",
        "AutoModelForSeq2SeqLM": "modeling_kiln_encoder_decoder.KilnEncoderDecoderModel",
    }
    assert (tmp_path / "s2s" / "modeling_kiln_encoder_decoder.py").is_file()

    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("HF_")}
    environment.update(HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    repo = Path(__file__).resolve().parents[1]
    command = [sys.executable, "-c", REMOTE_CHILD, str(repo), str(tmp_path / "s2s"), str(tmp_path / "out.pt")]
    subprocess.run(command, cwd=tmp_path, env=environment, check=True, timeout=120, stdin=subprocess.DEVNULL)
    result = torch.load(tmp_path / "out.pt")
    assert result["imported_pretrain"] is False
    assert result["class"].startswith("transformers_modules.") and result["class"].endswith(
        "KilnEncoderDecoderModel"
    )
    input_ids = (torch.arange(12).view(2, 6) * 7 + 3) % 97
    with torch.no_grad():
        expected = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=5)
    assert torch.equal(result["generated"], expected)
    # an older plain EncoderDecoderModel folder (Kiln halves) still loads through the same Auto class
    transformers.EncoderDecoderModel(encoder=encoder, decoder=decoder).save_pretrained(tmp_path / "plain")
    assert (
        type(transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "plain")).__name__
        == "EncoderDecoderModel"
    )


# ------------------------------------------------------------------------------------------------------ noise
def test_checkpoints_do_not_warn_about_the_tied_output_projection(tmp_path, caplog):
    import logging

    from kiln_testing import run

    with caplog.at_level(logging.WARNING):
        run(
            tmp_path / "run",
            "--training.max_steps",
            4,
            "--training.save_steps",
            2,
            "--training.eval_steps",
            0,
        )
    assert len(list((tmp_path / "run" / "checkpoints").iterdir())) >= 1
    assert not [r for r in caplog.records if "Removed shared tensor" in r.getMessage()]


def test_other_shared_tensors_still_warn():
    import logging

    from kiln.run_setup import _TiedWeightsFilter

    def record(names):
        message = f"Removed shared tensor {names} while saving. This should be OK"
        return logging.LogRecord("accelerate.utils.other", logging.WARNING, __file__, 1, message, None, None)

    keep = _TiedWeightsFilter().filter
    assert not keep(record({"mlm_head.decoder.weight"})) and not keep(record({"lm_head.weight"}))
    assert keep(record({"lm_head.weight", "model.layers.0.mlp.fc_in.weight"}))
    assert keep(record({"encoder.embeddings.weight"}))


# --------------------------------------------------------------------------- Trainer's label names, eval loss
@pytest.mark.parametrize(
    "kiln_class, hf_class",
    [
        (KilnDecoderForCausalLM, transformers.GPT2LMHeadModel),
        (KilnEncoderForPreTraining, transformers.BertForPreTraining),
        (KilnEncoderForMaskedLM, transformers.BertForMaskedLM),
        (KilnEncoderForSequenceClassification, transformers.BertForSequenceClassification),
        (KilnEncoderForTokenClassification, transformers.BertForTokenClassification),
    ],
    ids=lambda c: c.__name__,
)
def test_trainer_finds_the_label_names_transformers_models_have(kiln_class, hf_class):
    from transformers.utils.generic import find_labels

    assert find_labels(kiln_class) == find_labels(hf_class)


def test_trainer_evaluates_the_decoder_with_default_arguments(tmp_path):
    from datasets import Dataset

    model = KilnDecoderForCausalLM(tiny_decoder_config())
    generator = torch.Generator().manual_seed(0)
    rows = torch.randint(3, 200, (6, 8), generator=generator).tolist()
    data = Dataset.from_dict({"input_ids": rows, "labels": rows})
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    seen = []

    def compute_metrics(prediction):
        seen.append(prediction.label_ids.shape)
        return {"rows": len(prediction.label_ids)}

    metrics = transformers.Trainer(model, args, eval_dataset=data, compute_metrics=compute_metrics).evaluate()
    with torch.no_grad():
        batch = torch.tensor(rows)
        expected = model.eval()(batch, labels=batch).loss.item()
    assert metrics["eval_loss"] == pytest.approx(expected, rel=1e-5)
    assert metrics["eval_rows"] == 6 and seen == [(6, 8)]

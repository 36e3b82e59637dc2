"""A plain transformers BERT, ELECTRA or GPT-2 folder or Hub id as a run's start (`--model.init_from`,
`--model.checkpoint`): converted to Kiln on the way in, with one log line, the same function as the original (logits
on a batch), and the run starts; what cannot be converted is one line naming the fix, and what no model.kind accepts
is never advised to change model.kind. Folders are written by transformers' own classes with save_pretrained."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
import transformers
from kiln_testing import DEBUG, DECODER, cli_in_process, one_torch_thread, run_main
from test_finetune_scripts import write_sentiment

SHAPE = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
)
WORDS = ["the", "was", "good", "bad", "film", "plot", "great", "awful", "it", "a", "and", "of", "to", "."]


@pytest.fixture(autouse=True)
def _one_torch_thread():
    with one_torch_thread():
        yield


def wordpiece_tokenizer(folder: Path) -> int:
    """A BERT tokenizer (WordPiece, lower case) saved into `folder`: any English text; its vocabulary size."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)] + list(",.'!?-")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *letters, *(f"##{c}" for c in letters)]
    tokenizer = transformers.BertTokenizerFast(
        vocab={token: i for i, token in enumerate(dict.fromkeys(vocab))}
    )
    tokenizer.save_pretrained(folder)
    return len(tokenizer)


def bpe_tokenizer(folder: Path) -> int:
    """A GPT-2 tokenizer (byte-level BPE trained on a few sentences) saved into `folder`; its vocabulary size."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([" ".join(WORDS)] * 20, vocab_size=300, special_tokens=["<|endoftext|>"])
    tokenizer = transformers.GPT2TokenizerFast(
        tokenizer_object=bpe._tokenizer,
        eos_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    tokenizer.save_pretrained(folder)
    return len(tokenizer)


def transformers_folder(folder: Path, name: str, **config) -> torch.nn.Module:
    """transformers' `name` (BertForPreTraining, GPT2LMHeadModel, ...), tiny and seeded, saved with its tokenizer."""
    torch.manual_seed(0)
    if name.startswith("GPT2"):
        vocab = bpe_tokenizer(folder)
        model_config = transformers.GPT2Config(
            vocab_size=vocab,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=64,
            bos_token_id=0,
            eos_token_id=0,
            **config,
        )
    elif name.startswith("Llama"):  # grouped-query heads, its own rope base, untied embeddings
        vocab = bpe_tokenizer(folder)
        model_config = transformers.LlamaConfig(
            vocab_size=vocab,
            **SHAPE,
            num_key_value_heads=2,
            bos_token_id=0,
            eos_token_id=0,
            tie_word_embeddings=False,
            initializer_range=0.1,
            rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
            **config,
        )
    else:
        vocab = wordpiece_tokenizer(folder)
        config_class = transformers.ElectraConfig if name.startswith("Electra") else transformers.BertConfig
        extra = {"embedding_size": 16} if name.startswith("Electra") else {}
        model_config = config_class(vocab_size=vocab, **SHAPE, **extra, **config)
    model = getattr(transformers, name)(model_config).eval()
    model.save_pretrained(folder)
    return model


def logits(output) -> torch.Tensor:
    for field in ("logits", "prediction_logits", "last_hidden_state"):
        if getattr(output, field, None) is not None:
            return getattr(output, field)
    raise AssertionError(f"no output to compare in {type(output).__name__}")


# ----------------------------------------------------------------------------------------------------------
# the conversion: same function, one log line, converted once


@pytest.mark.parametrize(
    "name",
    [
        "BertForPreTraining",
        "BertForMaskedLM",
        "BertModel",
        "ElectraForPreTraining",
        "GPT2LMHeadModel",
        "LlamaForCausalLM",
    ],
)
def test_a_transformers_folder_converts_to_the_same_function(tmp_path, name, caplog):
    import pretrain.modeling
    from pretrain.convert import converted_start

    original = transformers_folder(tmp_path / "original", name)
    with caplog.at_level(logging.INFO, logger="kiln"):
        folder = converted_start(str(tmp_path / "original"), "--model.init_from")
    kiln_class = json.loads((Path(folder) / "config.json").read_text())["architectures"][0]
    assert kiln_class.startswith("Kiln")
    assert [r.getMessage() for r in caplog.records if "converted" in r.getMessage()] == [
        f"--model.init_from {tmp_path / 'original'} is a transformers "
        f"{ {'Bert': 'BERT', 'Elec': 'ELECTRA', 'GPT2': 'GPT-2', 'Llam': 'Llama'}[name[:4]] } checkpoint ({name}): converted to "
        f"Kiln's {kiln_class}, same weights (kept for the next run)"
    ]
    assert (Path(folder) / "tokenizer.json").is_file()  # the tokenizer travels with it
    converted = getattr(pretrain.modeling, kiln_class).from_pretrained(folder).eval()
    batch = torch.randint(5, original.config.vocab_size, (3, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(logits(converted(batch)), logits(original(batch)), atol=1e-5, rtol=1e-5)


def test_bert_base_layout_keeps_both_pretraining_heads(tmp_path):
    """bert-base-uncased's config says BertForMaskedLM while its weights hold the NSP head and pooler too: the
    converted start keeps both (a pretraining run with mlm+nsp starts from the real NSP head)."""
    from pretrain.convert import converted_start
    from pretrain.modeling import KilnEncoderForPreTraining

    original = transformers_folder(tmp_path / "original", "BertForPreTraining")
    config = json.loads((tmp_path / "original" / "config.json").read_text())
    config["architectures"] = ["BertForMaskedLM"]
    (tmp_path / "original" / "config.json").write_text(json.dumps(config))
    folder = converted_start(str(tmp_path / "original"), "--model.init_from")
    converted = KilnEncoderForPreTraining.from_pretrained(folder).eval()
    batch = torch.randint(5, 60, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ours, theirs = converted(batch), original(batch)
    torch.testing.assert_close(
        ours.seq_relationship_logits, theirs.seq_relationship_logits, atol=1e-5, rtol=1e-5
    )


# ----------------------------------------------------------------------------------------------------------
# runs start from them: pretraining, task-adaptive pretraining, fine-tuning, locally and from the Hub


def pretrain(*args):
    from pretrain.run import main

    return run_main(
        main,
        "--config",
        DEBUG,
        "--training.max_steps",
        2,
        "--training.eval_steps",
        0,
        "--training.save_steps",
        0,
        *args,
    )


def classify(*args):
    from finetune.classify import main

    return run_main(main, *args)


def start_weights(run: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(run / "final" / "model.safetensors")


def test_pretraining_continues_a_bert_and_a_gpt2_folder(tmp_path, caplog):
    bert = tmp_path / "bert"
    transformers_folder(bert, "BertForMaskedLM")
    with caplog.at_level(logging.INFO, logger="kiln"):
        state = pretrain(
            "--model.init_from",
            bert,
            "--tokenizer.name_or_path",
            bert,
            "--model.objective",
            "mlm",
            "--training.output_dir",
            tmp_path / "enc",
            "--training.lr",
            1e-30,
        )
    assert state.global_step == 2
    assert any(
        "is a transformers BERT checkpoint (BertForMaskedLM): converted" in r.getMessage()
        for r in caplog.records
    )
    # lr 1e-30 changes no weight: the run trained the original's weights
    original = transformers.BertForMaskedLM.from_pretrained(bert).state_dict()
    trained = start_weights(tmp_path / "enc")
    torch.testing.assert_close(
        trained["model.embeddings.word_embeddings.weight"], original["bert.embeddings.word_embeddings.weight"]
    )
    card = (tmp_path / "enc" / "final" / "README.md").read_text()
    assert "| initialised from | bert |" in card and "kiln-converted" not in card

    gpt2 = tmp_path / "gpt2"
    transformers_folder(gpt2, "GPT2LMHeadModel")
    state = pretrain(
        *DECODER,
        "--model.init_from",
        gpt2,
        "--tokenizer.name_or_path",
        gpt2,
        "--training.output_dir",
        tmp_path / "dec",
    )
    assert state.global_step == 2 and (tmp_path / "dec" / "final" / "model.safetensors").is_file()


def test_fine_tuning_and_adapt_start_from_bert_and_electra_folders(tmp_path):
    from finetune.adapt import main as adapt

    files = write_sentiment(tmp_path, sizes=(16, 8, 8))
    data = [
        "--data.train_file",
        files["train"],
        "--data.validation_file",
        files["validation"],
        "--data.test_file",
        files["test"],
        "--training.max_steps",
        2,
        "--training.per_device_train_batch_size",
        8,
    ]
    for name in ("BertForPreTraining", "ElectraForPreTraining"):
        folder = tmp_path / name
        transformers_folder(folder, name)
        result = classify(
            "--model.checkpoint", folder, "--training.output_dir", tmp_path / f"c-{name}", *data
        )
        assert "accuracy" in result.test_metrics
        card = (tmp_path / f"c-{name}" / "final" / "README.md").read_text()
        assert f"pretrained ({name})" in card or f"pretrained ({folder.name})" in card, card
    task = tmp_path / "task.yaml"
    task.write_text(f"data:\n  train_file: {files['train']}\n  text_columns: [sentence]\n")
    state = run_main(
        adapt,
        "--task",
        "classify",
        "--task_config",
        task,
        "--model.init_from",
        tmp_path / "BertForPreTraining",
        "--training.output_dir",
        tmp_path / "adapted",
        "--training.max_steps",
        2,
        "--training.eval_steps",
        0,
        "--training.save_steps",
        0,
        "--data.max_seq_length",
        32,
        "--training.per_device_train_batch_size",
        4,
    )
    assert state.global_step == 2


def test_a_bert_on_the_hub_starts_fine_tuning_and_pretraining(tmp_path, hub):
    from huggingface_hub import HfApi

    folder = tmp_path / "bert"
    original = transformers_folder(folder, "BertForPreTraining")
    hub.create_repo("someone/bert-tiny")
    HfApi().upload_folder(repo_id="someone/bert-tiny", folder_path=folder, commit_message="init")
    files = write_sentiment(tmp_path, sizes=(16, 8, 8))
    result = classify(
        "--model.checkpoint",
        "someone/bert-tiny",
        "--training.output_dir",
        tmp_path / "c",
        "--data.train_file",
        files["train"],
        "--data.validation_file",
        files["validation"],
        "--data.test_file",
        files["test"],
        "--training.max_steps",
        2,
        "--training.per_device_train_batch_size",
        8,
    )
    assert "accuracy" in result.test_metrics
    assert "pretrained (someone/bert-tiny)" in (tmp_path / "c" / "final" / "README.md").read_text()
    state = pretrain(
        "--model.init_from",
        "someone/bert-tiny",
        "--tokenizer.name_or_path",
        "someone/bert-tiny",
        "--training.output_dir",
        tmp_path / "p",
        "--training.lr",
        1e-30,
    )
    assert state.global_step == 2
    trained = start_weights(tmp_path / "p")
    torch.testing.assert_close(trained["nsp_head.weight"], original.cls.seq_relationship.weight.detach())

    # the converter's command takes the Hub id too
    from pretrain.convert import main as convert
    from pretrain.modeling import KilnEncoderForPreTraining

    convert(["someone/bert-tiny", str(tmp_path / "kiln-bert")])
    converted = KilnEncoderForPreTraining.from_pretrained(tmp_path / "kiln-bert").eval()
    batch = torch.randint(5, 60, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(
            converted(batch).prediction_logits, original(batch).prediction_logits, atol=1e-5, rtol=1e-5
        )


# ----------------------------------------------------------------------------------------------------------
# what cannot be converted: one line, naming the fix; never "change model.kind" where no kind would do


def cli_error(capsys, *args) -> str:
    """`pretrain/run.py --config debug.yaml ARGS` on the command line: its one-line error (exit status 2)."""
    code, lines = cli_in_process(capsys, *args)
    errors = [line for line in lines if line.startswith("error: ")]
    assert code == 2 and len(errors) == 1, lines
    return errors[0]


def test_a_start_that_cannot_be_converted_is_one_line_naming_the_fix(tmp_path, capsys):
    gpt2, bert = tmp_path / "gpt2", tmp_path / "bert"
    transformers_folder(gpt2, "GPT2LMHeadModel")
    transformers_folder(bert, "BertModel")
    assert cli_error(capsys, "--model.init_from", gpt2) == (
        f"error: --model.init_from {gpt2} is a transformers GPT-2 (decoder) checkpoint but --model.kind is encoder; "
        "set --model.kind decoder"
    )
    # a model type no model.kind accepts: no "change model.kind" advice
    roberta = tmp_path / "roberta"
    transformers.RobertaModel(transformers.RobertaConfig(vocab_size=60, **SHAPE)).save_pretrained(roberta)
    message = cli_error(capsys, "--model.init_from", roberta)
    assert (
        message
        == (
            f"error: --model.init_from {roberta} is a roberta checkpoint, which Kiln cannot start an encoder from; point "
            "it at a Kiln encoder checkpoint or a transformers BERT or ELECTRA one (converted on the way in)"
        )
        and "model.kind" not in message
    )
    # a type only the converter's command takes: run it first
    modern = tmp_path / "modernbert"
    modern.mkdir()
    (modern / "config.json").write_text(json.dumps({"model_type": "modernbert", "hidden_size": 32}))
    assert cli_error(capsys, "--model.init_from", modern) == (
        f"error: --model.init_from {modern} is a transformers ModernBERT checkpoint; convert it first with "
        f"`python -m pretrain.convert {modern} DST` and point --model.init_from at DST"
    )
    # weights as a pickle only: not read here (the model gate refuses them); the converter's command does it when
    # the user opts in
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((bert / "config.json").read_text())
    (pickled / "pytorch_model.bin").write_bytes(b"not read")
    assert cli_error(capsys, "--model.init_from", pickled) == (
        f"error: --model.init_from {pickled}: its weights are only in pytorch_model.bin, torch's pickle format, which "
        "Kiln does not unpickle unless you opt in (unpickling can run code); convert them to safetensors first with "
        f"`python -m pretrain.convert {pickled} DST --trust_pickles` (only for a file you trust) and point "
        "--model.init_from at DST"
    )
    # no weights at all: said so
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text((bert / "config.json").read_text())
    assert cli_error(capsys, "--model.init_from", bare) == (
        f"error: --model.init_from {bare} is a transformers BERT checkpoint without a model.safetensors; point "
        "--model.init_from at a folder written by save_pretrained (safetensors)"
    )
    # a config.json whose sizes are not sizes, or that disagree with the weights: checked before anything is built
    for field, value, said in (
        ("hidden_size", "32", "'32'"),
        ("num_hidden_layers", -2, "-2"),
        ("vocab_size", 10**12, str(10**12)),
    ):
        hostile = tmp_path / f"hostile-{field}"
        hostile.mkdir()
        (hostile / "model.safetensors").write_bytes((bert / "model.safetensors").read_bytes())
        config = json.loads((bert / "config.json").read_text())
        config[field] = value
        (hostile / "config.json").write_text(json.dumps(config))
        assert cli_error(capsys, "--model.init_from", hostile) == (
            f"error: --model.init_from {hostile}: its config.json's {field} is {said}, not a size a BERT model has; "
            "point it at a folder written by save_pretrained"
        )
    wider = tmp_path / "wider"
    wider.mkdir()
    (wider / "model.safetensors").write_bytes((bert / "model.safetensors").read_bytes())
    config = json.loads((bert / "config.json").read_text())
    config["vocab_size"] += 1000
    (wider / "config.json").write_text(json.dumps(config))
    message = cli_error(capsys, "--model.init_from", wider)
    assert message.startswith(
        f"error: --model.init_from {wider}: its weights' word embeddings are ("
    ) and message.endswith("point it at a folder written by save_pretrained")

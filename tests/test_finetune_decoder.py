"""finetune/classify.py and finetune/tag.py on a Kiln decoder, as transformers users fine-tune GPT-2: the head the
Auto classes pick, padded on the right with the pad (or EOS) token, the sequence classifier reading each sequence's
last real token, sentence pairs joined by the EOS token without token_type_ids, pre-split words tokenized after a
space with the label on their first piece; end to end through `accelerate launch` on the shipped samples.

The quick tests build tiny decoder folders in seconds (random weights and a byte-level BPE tokenizer trained on a
few stories, as pretraining saves them); the launched runs start from the pretrained `kiln_checkpoints` decoder."""

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from kiln_testing import REPO, finetune_cli_error, one_torch_thread, reset_accelerate, run_main


@pytest.fixture(autouse=True)
def _one_torch_thread():
    with one_torch_thread():
        yield


def tiny_decoder(folder: Path, preset: str, pad: bool) -> Path:
    """A Kiln decoder folder as pretraining leaves it (KilnDecoderForCausalLM, its byte-level BPE tokenizer),
    random weights; `pad`: whether the tokenizer names a pad token (Kiln's does: its EOS; GPT-2's does not) and
    the config a pad_token_id."""
    from pretrain.data.tokenizer import EOS, train_tokenizer
    from pretrain.modeling import KilnDecoderConfig, KilnDecoderForCausalLM

    stories = (REPO / "data/tinystories/tinystories_v2_train_head.txt").read_text(encoding="utf-8")
    tokenizer = train_tokenizer(stories.split("\n\n")[:400], kind="bpe", vocab_size=512, model_max_length=64)
    eos = tokenizer.convert_tokens_to_ids(EOS)
    if not pad:
        tokenizer.pad_token = None
    torch.manual_seed(0)
    config = KilnDecoderConfig(
        preset=preset,
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1 if preset == "llama" else None,
        intermediate_size=64,
        max_position_embeddings=64,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos if pad else None,
    )
    KilnDecoderForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def decoders(tmp_path_factory):
    """{preset: folder}: a GPT-2-preset decoder whose tokenizer has no pad token (as GPT-2's) and a Llama-preset
    one whose tokenizer pads with its EOS token (as Kiln's pretraining saves it)."""
    root = tmp_path_factory.mktemp("decoders")
    return {
        "gpt2": tiny_decoder(root / "gpt2", "gpt2", pad=False),
        "llama": tiny_decoder(root / "llama", "llama", pad=True),
    }


def model_section(checkpoint, **settings):
    from finetune.common import ClassifierModelConfig

    return ClassifierModelConfig(checkpoint=str(checkpoint), **settings)


def classify_head(checkpoint, num_labels=3, **settings):
    """What classify.py's head step builds from `checkpoint`: (the Head, the model in eval mode)."""
    from finetune.classify import Labels, build_classifier
    from finetune.runner import classifier_checkpoint, classifier_head

    names = {i: f"class-{i}" for i in range(num_labels)}
    labels = Labels(False, {name: i for i, name in names.items()}, names)
    model_cfg = model_section(checkpoint, **settings)
    start = classifier_checkpoint(model_cfg)
    head = classifier_head(
        model_cfg, None, start, lambda: build_classifier(start.path, model_cfg, labels, False), num_labels, {}
    )
    return head, head.model.eval()


def tag_head(checkpoint, tags=("DET", "NOUN", "VERB", "PUNCT")):
    """What tag.py's head step builds from `checkpoint`."""
    from finetune.tag import TagConfig, head, start

    config = TagConfig(model=model_section(checkpoint))
    label2id = {tag: i for i, tag in enumerate(tags)}
    return head(config, start(config), (label2id, dict(enumerate(tags)), False))


SENTENCES = [
    "The little dog ran to the park.",
    "Once upon a time there was a girl who loved to sing in the garden with her friends.",
    "Tom smiled.",
    "She found a big red ball under the old tree near the river.",
]


# ----------------------------------------------------------------------------------------------------------
# the model: the head the Auto class picks, last-token pooling under padding


@pytest.mark.parametrize("preset", ["gpt2", "llama"])
def test_sequence_classifier_reads_the_last_real_token_alone_and_in_a_right_padded_batch(decoders, preset):
    from transformers import DataCollatorWithPadding

    from pretrain.modeling import KilnDecoderForSequenceClassification

    head, model = classify_head(decoders[preset])
    tokenizer = head.tokenizer
    assert isinstance(model, KilnDecoderForSequenceClassification)
    # the pad token is the tokenizer's (its EOS where it had none) and the model finds the last token by it
    assert tokenizer.pad_token == tokenizer.eos_token and tokenizer.padding_side == "right"
    assert model.config.pad_token_id == tokenizer.pad_token_id is not None
    encoded = [tokenizer(text) for text in SENTENCES]
    assert all("token_type_ids" not in e for e in encoded)
    batch = DataCollatorWithPadding(tokenizer)(encoded)
    lengths = batch["attention_mask"].sum(-1)
    assert len(set(lengths.tolist())) == len(SENTENCES)  # every sentence but the longest is padded
    assert (batch["input_ids"][batch["attention_mask"] == 0] == tokenizer.pad_token_id).all()
    with torch.no_grad():
        batched = model(**batch).logits
        alone = torch.cat([model(**{k: torch.tensor([v]) for k, v in e.items()}).logits for e in encoded])
        # what reading the padded batch's last position would give: not the sentence's logits
        last_position = model.score(model.model(**batch).last_hidden_state)[:, -1]
    assert torch.allclose(batched, alone, atol=1e-5), (batched - alone).abs().max()
    padded = lengths < lengths.max()
    assert not torch.allclose(last_position[padded], alone[padded], atol=1e-3)


def test_a_pretraining_folder_gets_a_new_head_and_missing_decoder_layers_still_refuse(decoders, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from finetune.classify import HEADS, Labels, build_classifier
    from finetune.tag import build_tagger
    from kiln.errors import ConfigError

    labels = Labels(False, {"a": 0, "b": 1}, {0: "a", 1: "b"})
    model = build_classifier(str(decoders["gpt2"]), model_section(decoders["gpt2"]), labels, False)
    assert HEADS["decoder"].new_weights == ("score.",) and model.score.weight.shape == (2, 32)
    tagger = build_tagger(str(decoders["llama"]), model_section(decoders["llama"]), {"X": 0}, {0: "X"}, False)
    assert tagger.classifier.weight.shape == (1, 32)
    # the token classifier's dropout follows the decoder's hidden dropout, as the encoder's follows its own
    assert tagger.config.classifier_dropout == tagger.config.resid_pdrop == 0.0  # the llama preset's
    dropped = build_tagger(
        str(decoders["llama"]), model_section(decoders["llama"], dropout=0.2), {"X": 0}, {0: "X"}, False
    )
    assert dropped.config.classifier_dropout == dropped.config.attn_pdrop == 0.2

    broken = tmp_path / "broken"
    shutil.copytree(decoders["gpt2"], broken)
    weights = load_file(broken / "model.safetensors")
    del weights["model.layers.1.mlp.fc_in.weight"]
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        ConfigError, match=r"lacks weights the model needs \(model\.layers\.1\.mlp\.fc_in\.weight\)"
    ):
        build_classifier(str(broken), model_section(broken), labels, False)


def test_from_scratch_keeps_the_decoder_shape_and_draws_other_weights(decoders):
    from finetune.tag import build_tagger

    folder = decoders["llama"]
    tags = ({"X": 0, "Y": 1}, {0: "X", 1: "Y"}, False)
    pretrained = build_tagger(str(folder), model_section(folder), *tags)
    scratch = build_tagger(str(folder), model_section(folder, from_scratch=True), *tags)
    a, b = pretrained.state_dict(), scratch.state_dict()
    assert a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)
    matrices = [k for k in a if a[k].dim() == 2 and not k.startswith("classifier.")]
    assert matrices and not any(torch.equal(a[k], b[k]) for k in matrices)
    assert scratch.config.preset == "llama" and scratch.config.num_key_value_heads == 1


# ----------------------------------------------------------------------------------------------------------
# the tokenizer: pairs and pre-split words


def test_sentence_pairs_are_joined_by_eos_without_token_type_ids(decoders, tmp_path):
    from datasets import Dataset, DatasetDict
    from transformers import AutoTokenizer

    from finetune.classify import ClassifyDataConfig, join_pairs, tokenize_splits

    head, _ = classify_head(decoders["gpt2"])
    tokenizer = join_pairs(head.tokenizer)
    first, second = "The dog ran home.", "It was late."
    split = Dataset.from_dict({"text": [first], "text_pair": [second], "label": [1]})
    tokenized = tokenize_splits(DatasetDict(train=split), tokenizer, 64, 64, ClassifyDataConfig())["train"]
    assert set(tokenized.column_names) == {"input_ids", "attention_mask", "labels"}
    a, b = tokenizer(first)["input_ids"], tokenizer(second)["input_ids"]
    assert tokenized[0]["input_ids"] == a + [tokenizer.eos_token_id] + b
    assert join_pairs(tokenizer)(first, second)["input_ids"] == tokenized[0]["input_ids"]  # joined once
    # the saved tokenizer joins a pair the same way: what the text-classification pipeline reads
    tokenizer.save_pretrained(tmp_path / "saved")
    reloaded = AutoTokenizer.from_pretrained(tmp_path / "saved", trust_remote_code=False)
    assert reloaded(first, second) == {
        "input_ids": tokenized[0]["input_ids"],
        "attention_mask": [1] * (len(a) + len(b) + 1),
    }


def test_pre_split_words_get_their_leading_space_and_the_first_piece_the_label(decoders, tmp_path):
    from transformers import AutoTokenizer

    from finetune.data import tokenize_and_align

    tokenizer = tag_head(decoders["llama"]).tokenizer
    words = ["The", "grumpy", "dragon", "slept", "."]
    tags = [0, 1, 1, 2, 3]
    encoding = tokenize_and_align({"tokens": [words], "tags": [tags]}, tokenizer, return_word_ids=True)
    assert "token_type_ids" not in encoding
    pieces = tokenizer.convert_ids_to_tokens(encoding["input_ids"][0])
    word_ids, labels = encoding["word_ids"][0], encoding["labels"][0]
    assert any(word_ids.count(i) > 1 for i in range(len(words)))  # some word is several pieces
    firsts = [i for i, w in enumerate(word_ids) if w is not None and (i == 0 or word_ids[i - 1] != w)]
    assert [word_ids[i] for i in firsts] == list(range(len(words)))
    for i, word_id in enumerate(word_ids):
        assert labels[i] == (tags[word_id] if i in firsts else -100)
    # each word is tokenized as in running text, after a space (byte-level BPE's Ġ), the first word too
    assert all(pieces[i].startswith("Ġ") for i in firsts)
    for w, word in enumerate(words):
        mine = [p for p, i in zip(pieces, word_ids) if i == w]
        assert mine == tokenizer.convert_ids_to_tokens(
            tokenizer(" " + word, add_special_tokens=False)["input_ids"]
        )
    # the saved tokenizer keeps it: a sentence's words come out as the tagger was trained on them
    tokenizer.save_pretrained(tmp_path / "saved")
    reloaded = AutoTokenizer.from_pretrained(tmp_path / "saved", trust_remote_code=False)
    assert reloaded.tokenize("The grumpy dragon slept") == pieces[: firsts[4]]


# ----------------------------------------------------------------------------------------------------------
# refusals: one line


def test_what_neither_script_takes_is_refused_in_one_line(decoders, tmp_path, capsys):
    from pretrain.modeling import (
        KilnDecoderConfig,
        KilnDecoderForCausalLM,
        KilnEncoderConfig,
        KilnEncoderDecoderModel,
        KilnEncoderModel,
    )

    shape = dict(
        vocab_size=97, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    encoder = KilnEncoderModel(KilnEncoderConfig(**shape, max_position_embeddings=32))
    decoder = KilnDecoderForCausalLM(
        KilnDecoderConfig(
            **shape, max_position_embeddings=32, add_cross_attention=True, bos_token_id=1, eos_token_id=2
        )
    )
    seq2seq = tmp_path / "seq2seq"
    KilnEncoderDecoderModel(encoder=encoder, decoder=decoder).save_pretrained(seq2seq)
    out = ["--training.output_dir", tmp_path / "out"]
    for script in ("classify", "tag"):
        message = finetune_cli_error(script, capsys, "--model.checkpoint", seq2seq, *out)
        assert (
            "is a kiln_encoder_decoder checkpoint, but a kiln_encoder or kiln_decoder checkpoint" in message
        )
        assert "BERT, ELECTRA, GPT-2 or Llama" in message
    message = finetune_cli_error(
        "classify", capsys, "--model.checkpoint", decoders["gpt2"], "--model.classifier_dropout", 0.2, *out
    )
    assert "--model.classifier_dropout 0.2" in message and "decoder's sequence classifier" in message
    message = finetune_cli_error("tag", capsys, "--predict", "--model.checkpoint", decoders["gpt2"], *out)
    assert "fine-tuned tagger" in message and "pretraining checkpoint" in message
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------------------------
# end to end: accelerate launch on the shipped samples, the saved folder loaded by the Auto classes


def launch(script: str, *args) -> subprocess.CompletedProcess:
    """`accelerate launch finetune/<script>.py ARGS` in a fresh process, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--cpu"]
    done = subprocess.run(
        [*command, f"finetune/{script}.py", *map(str, args)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


QUICK_RUN = ["--data.max_eval_samples", 32, "--data.max_predict_samples", 24, "--logging.logging_steps", 5]


@pytest.mark.slow
def test_tag_fine_tunes_a_decoder_on_the_ud_sample_and_the_saved_tagger_predicts_the_same(
    kiln_checkpoints, tmp_path
):
    from transformers import AutoModelForTokenClassification, AutoTokenizer, pipeline

    from finetune.tag import main as tag
    from pretrain.modeling import KilnDecoderForTokenClassification

    _, decoder = kiln_checkpoints
    out = tmp_path / "tag"
    done = launch(
        "tag",
        "--model.checkpoint",
        decoder,
        "--training.output_dir",
        out,
        "--data.max_train_samples",
        800,
        "--training.num_train_epochs",
        4,
        "--training.per_device_train_batch_size",
        16,
        "--training.lr",
        1e-2,
        "--data.truncation",
        "quiet",  # the debug decoder takes 64 positions: a few long sentences lose their last words
        *QUICK_RUN,
    )
    assert "test: loss" in done.stdout + done.stderr
    test = json.loads((out / "test_results.json").read_text())
    rows = read_jsonl(out / "predictions_test.jsonl")
    assert len(rows) == 24
    # scored on the words the model saw; well above tagging every word with the commonest tag
    seen = [(p, r) for row in rows for p, r in zip(row["predictions"], row["references"])]
    assert sum(p == r for p, r in seen) / len(seen) == pytest.approx(test["accuracy"])
    commonest = max(Counter(r for _, r in seen).values()) / len(seen)
    assert test["accuracy"] > commonest + 0.2, (test["accuracy"], commonest)
    final = out / "final"
    assert json.loads((final / "config.json").read_text())["architectures"] == [
        "KilnDecoderForTokenClassification"
    ]
    card = (final / "README.md").read_text()
    assert "A decoder fine-tuned" in card and "pipeline_tag: token-classification" in card

    model = AutoModelForTokenClassification.from_pretrained(final).eval()
    tokenizer = AutoTokenizer.from_pretrained(final)
    assert isinstance(model, KilnDecoderForTokenClassification)
    words = [row["tokens"] for row in rows]
    batch = tokenizer(
        words,
        is_split_into_words=True,
        padding=True,
        truncation=True,
        max_length=model.config.max_position_embeddings,
        return_tensors="pt",
    )
    with torch.no_grad():
        predicted = model(**batch).logits.argmax(-1)
    for i, row in enumerate(rows):
        word_ids, seen, tags = batch.word_ids(i), set(), []
        for position, word in enumerate(word_ids):
            if word is not None and word not in seen:
                seen.add(word)
                tags.append(model.config.id2label[int(predicted[i, position])])
        assert tags == row["predictions"]
    # the pipeline, on the running text of the first sentence, tags its first word as the run did
    first = pipeline("token-classification", model=str(final))(" ".join(words[0]))
    assert first[0]["entity"] == rows[0]["predictions"][0]

    # --predict with the fine-tuned decoder: the same predictions
    reset_accelerate()
    run_main(
        tag, "--predict", "--model.checkpoint", final, "--training.output_dir", tmp_path / "again", *QUICK_RUN
    )
    assert read_jsonl(tmp_path / "again" / "predictions_test.jsonl") == rows


@pytest.mark.slow
def test_classify_fine_tunes_a_decoder_on_the_authorship_sample_and_the_saved_classifier_predicts_the_same(
    kiln_checkpoints, tmp_path, hub
):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    _, decoder = kiln_checkpoints
    out = tmp_path / "classify"
    launch(  # the launched process pushes to the test Hub (it inherits HF_ENDPOINT and HF_TOKEN)
        "classify",
        "--model.checkpoint",
        decoder,
        "--training.output_dir",
        out,
        "--data.max_train_samples",
        256,
        "--training.num_train_epochs",
        1,
        "--hub.push_to_hub",
        "--hub.model_id",
        "kiln-test/tiny-decoder-classifier",
        *QUICK_RUN,
    )
    test = json.loads((out / "test_results.json").read_text())
    assert {"accuracy", "f1", "matthews_correlation", "loss"} <= set(test)
    final = out / "final"
    config = json.loads((final / "config.json").read_text())
    assert config["architectures"] == ["KilnDecoderForSequenceClassification"]
    assert config["pad_token_id"] is not None and len(config["id2label"]) == 4
    pushed = hub.files("kiln-test/tiny-decoder-classifier")
    assert {"model.safetensors", "config.json", "tokenizer.json", "modeling_kiln_decoder.py"} <= set(pushed)
    assert b"A decoder fine-tuned" in pushed["README.md"]

    rows = read_jsonl(out / "predictions_test.jsonl")
    texts = [row["text"] for row in rows]
    model = AutoModelForSequenceClassification.from_pretrained(final).eval()
    tokenizer = AutoTokenizer.from_pretrained(final)
    with torch.no_grad():  # one right-padded batch: each sentence read at its own last token
        logits = model(**tokenizer(texts, padding=True, truncation=True, return_tensors="pt")).logits
    assert [model.config.id2label[i] for i in logits.argmax(-1).tolist()] == [
        row["prediction"] for row in rows
    ]
    classifier = pipeline("text-classification", model=str(final))
    assert [p["label"] for p in classifier(texts[:8], truncation=True)] == [
        row["prediction"] for row in rows[:8]
    ]

"""The fine-tuning scripts end to end on tiny pretrained Kiln checkpoints: they learn, score, keep the best model,
write predictions, export a model that reloads (and works in `pipeline`) and predicts the same, push to the Hub,
and refuse bad input with one line. NER data is synthetic (CoNLL-2003 is never read here)."""

import csv
import json
import random
from pathlib import Path

import pytest
import torch
from kiln_testing import REPO, finetune_cli_error, one_torch_thread, run_main

FAST = ["--logging.logging_steps", "1"]


def classify(*args):
    from finetune.classify import main

    return run_main(main, *args)


def tag(*args):
    from finetune.tag import main

    return run_main(main, *args)


def seq2seq(*args):
    from finetune.seq2seq import main

    return run_main(main, *args)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    with one_torch_thread():
        yield


def train_losses(output_dir) -> list[float]:
    rows = [json.loads(line) for line in (Path(output_dir) / "metrics.jsonl").read_text().splitlines()]
    return [row["train/loss"] for row in rows if "train/loss" in row]


def eval_rows(output_dir) -> list[dict]:
    rows = [json.loads(line) for line in (Path(output_dir) / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if any(key.startswith("eval/") for key in row)]


def assert_loss_falls(output_dir, window=4, margin=0.1):
    losses = train_losses(output_dir)
    first, last = sum(losses[:window]) / window, sum(losses[-window:]) / window
    assert last < first - margin, f"training loss did not fall: {first:.3f} -> {last:.3f}"


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


# ----------------------------------------------------------------------------------------------------------
# synthetic data


POSITIVE = ["good", "great", "happy", "wonderful", "kind", "bright"]
NEGATIVE = ["bad", "awful", "sad", "terrible", "cruel", "dark"]
SUBJECTS = ["the day", "the man", "her house", "the story", "his friend", "the night", "the town"]


def write_sentiment(folder: Path, sizes=(160, 32, 16), int_labels=False) -> dict[str, Path]:
    """Short sentences whose label is decided by one word: learnable in a few dozen steps by a tiny model."""
    rng = random.Random(0)
    paths = {}
    for split, size in zip(("train", "validation", "test"), sizes):
        paths[split] = folder / f"{split}.csv"
        with open(paths[split], "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["sentence", "label"])
            for _ in range(size):
                positive = rng.random() < 0.5
                word = rng.choice(POSITIVE if positive else NEGATIVE)
                text = f"{rng.choice(SUBJECTS)} was {word}"
                label = int(positive) if int_labels else ("positive" if positive else "negative")
                writer.writerow([text, label])
    return paths


FIRST_NAMES = ["John", "Mary", "Anna", "Peter", "Paul", "Emma", "James", "Alice", "Tom", "Lucy"]
LAST_NAMES = ["Smith", "Brown", "Taylor", "Wilson", "Clark", "Walker"]
PLACES = [["Paris"], ["London"], ["Berlin"], ["Rome"], ["Madrid"], ["New", "York"], ["Hong", "Kong"]]
PATTERNS = [
    "{PER} lives in {LOC} .",
    "{PER} went to {LOC} with {PER} .",
    "we met {PER} near {LOC} yesterday .",
    "the train from {LOC} to {LOC} was late .",
    "{PER} said that {LOC} is cold in winter .",
]


def synthetic_ner_sentences(n: int, seed: int) -> list[list[tuple[str, str]]]:
    rng = random.Random(seed)
    sentences = []
    for _ in range(n):
        words = []
        for slot in rng.choice(PATTERNS).split():
            if slot == "{PER}":
                name = [rng.choice(FIRST_NAMES)] + ([rng.choice(LAST_NAMES)] if rng.random() < 0.5 else [])
                words += [(w, ("B-" if i == 0 else "I-") + "PER") for i, w in enumerate(name)]
            elif slot == "{LOC}":
                words += [(w, ("B-" if i == 0 else "I-") + "LOC") for i, w in enumerate(rng.choice(PLACES))]
            else:
                words.append((slot, "O"))
        sentences.append(words)
    return sentences


def write_conll(path: Path, sentences) -> Path:
    lines = ["-DOCSTART- O", ""]
    for sentence in sentences:
        lines += [f"{word} {tag}" for word, tag in sentence] + [""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


@pytest.fixture
def ner_files(tmp_path):
    return {
        split: write_conll(tmp_path / f"{split}.txt", synthetic_ner_sentences(n, seed))
        for split, n, seed in (("train", 128, 0), ("validation", 32, 1), ("test", 16, 2))
    }


# ----------------------------------------------------------------------------------------------------------
# classification


def test_classify_learns_keeps_the_best_and_exports_a_pipeline_ready_model(kiln_checkpoints, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    encoder, _ = kiln_checkpoints
    files = write_sentiment(tmp_path)
    out = tmp_path / "run"
    result = classify(
        "--model.checkpoint",
        encoder,
        "--training.output_dir",
        out,
        *FAST,
        "--data.train_file",
        files["train"],
        "--data.validation_file",
        files["validation"],
        "--data.test_file",
        files["test"],
        "--training.num_train_epochs",
        3,
        "--training.lr",
        1e-2,
        "--training.per_device_train_batch_size",
        16,
    )
    assert_loss_falls(out)
    evals = eval_rows(out)
    assert len(evals) == 3  # once per epoch
    assert {"eval/accuracy", "eval/f1", "eval/matthews_correlation", "eval/loss"} <= set(evals[-1])
    best = max(row["eval/accuracy"] for row in evals)
    assert result.state.best_metric == best and best > 0.8
    assert (out / "best" / "model.safetensors").is_file()

    final = out / "final"
    config = json.loads((final / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    card = (final / "README.md").read_text()
    assert "pipeline_tag: text-classification" in card and "accuracy" in card

    rows = read_jsonl(out / "predictions_test.jsonl")
    assert len(rows) == 16 and set(rows[0]) == {"text", "prediction", "reference"}
    accuracy = sum(row["prediction"] == row["reference"] for row in rows) / len(rows)
    assert result.test_metrics["accuracy"] == pytest.approx(accuracy)
    assert json.loads((out / "test_results.json").read_text())["accuracy"] == pytest.approx(accuracy)

    # the exported model, reloaded, predicts what the script wrote; so does the pipeline
    texts = [row["text"] for row in rows]
    model = AutoModelForSequenceClassification.from_pretrained(final).eval()
    tokenizer = AutoTokenizer.from_pretrained(final)
    with torch.no_grad():
        logits = model(**tokenizer(texts, padding=True, truncation=True, return_tensors="pt")).logits
    assert [model.config.id2label[i] for i in logits.argmax(-1).tolist()] == [
        row["prediction"] for row in rows
    ]
    classifier = pipeline("text-classification", model=str(final))
    assert [p["label"] for p in classifier(texts[:8])] == [row["prediction"] for row in rows[:8]]

    # --predict with the fine-tuned model and a test file alone: the same predictions, as tsv
    predicted = tmp_path / "predicted"
    classify(
        "--predict",
        "--model.checkpoint",
        final,
        "--training.output_dir",
        predicted,
        "--data.train_file",
        "",
        "--data.validation_file",
        "",
        "--data.test_file",
        files["test"],
        "--eval.predictions_format",
        "tsv",
    )
    lines = (predicted / "predictions_test.tsv").read_text().splitlines()
    assert lines[0] == "text\tprediction\treference"
    assert [line.split("\t")[1] for line in lines[1:]] == [row["prediction"] for row in rows]


def test_classify_sentence_pairs_with_float_labels_is_regression(kiln_checkpoints, tmp_path):
    encoder, _ = kiln_checkpoints
    rng = random.Random(1)
    path = tmp_path / "pairs.jsonl"
    with open(path, "w") as f:
        for _ in range(96):
            a, b = rng.choice(SUBJECTS), rng.choice(SUBJECTS)
            f.write(
                json.dumps(
                    {
                        "sentence1": f"{a} was here",
                        "sentence2": f"{b} was there",
                        "score": 5.0 if a == b else rng.uniform(0, 2),
                    }
                )
                + "\n"
            )
    out = tmp_path / "run"
    # lr 1e-30, too small to change any weight (0 is refused): the eval loss cannot improve after the first
    # epoch, so patience 1 stops training after the second
    result = classify(
        "--model.checkpoint",
        encoder,
        "--training.output_dir",
        out,
        "--data.train_file",
        path,
        "--data.validation_file",
        "",
        "--data.test_file",
        "",
        "--data.label_column",
        "score",
        "--data.validation_split_percentage",
        25,
        "--training.num_train_epochs",
        5,
        "--training.lr",
        1e-30,
        "--training.metric_for_best_model",
        "loss",
        "--training.greater_is_better",
        "false",
        "--training.early_stopping_patience",
        1,
        # 16 per optimizer step = 8 per device x 2 accumulated micro-steps (ignored, 32 per device: 1 step/epoch)
        "--training.total_train_batch_size",
        16,
        "--training.gradient_accumulation_steps",
        2,
        "--training.per_device_eval_batch_size",
        8,
    )
    # 72 rows an epoch, global batch 16: 4 optimizer steps (the last 8 rows of each epoch's order left out)
    steps_per_epoch = 72 // 16
    assert result.state.stop_reason == "early_stopping" and result.state.global_step == 2 * steps_per_epoch
    evals = eval_rows(out)
    assert {"eval/pearson", "eval/spearmanr", "eval/mse"} <= set(evals[-1])
    # at lr 1e-30 the model never changes: every evaluation scores the same predictions (dropout is off in evaluation)
    assert len(evals) >= 2 and len({(row["eval/pearson"], row["eval/mse"]) for row in evals}) == 1
    assert result.state.best_step == steps_per_epoch and result.predictions_file is None
    config = json.loads((out / "final" / "config.json").read_text())
    assert len(config["id2label"]) == 1 and config["problem_type"] == "regression"


def test_classify_int_labels_and_hub_push(kiln_checkpoints, tmp_path, hub):
    encoder, _ = kiln_checkpoints
    files = write_sentiment(tmp_path, sizes=(64, 16, 8), int_labels=True)
    out = tmp_path / "run"
    classify(
        "--model.checkpoint",
        encoder,
        "--training.output_dir",
        out,
        "--data.train_file",
        files["train"],
        "--data.validation_file",
        files["validation"],
        "--data.test_file",
        files["test"],
        "--training.max_steps",
        2,
        "--training.per_device_train_batch_size",
        16,
        "--hub.push_to_hub",
        "--hub.model_id",
        "kiln-test/tiny-classifier",
    )
    rows = read_jsonl(out / "predictions_test.jsonl")
    assert all(row["prediction"] in (0, 1) and row["reference"] in (0, 1) for row in rows)
    pushed = hub.files("kiln-test/tiny-classifier")
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md"} <= set(pushed)
    assert json.loads(pushed["config.json"])["id2label"] == {"0": "0", "1": "1"}
    assert b"pipeline_tag: text-classification" in pushed["README.md"]


# ----------------------------------------------------------------------------------------------------------
# tagging


def test_tag_ner_learns_entities_and_matches_the_pipeline(kiln_checkpoints, tmp_path, ner_files):
    from transformers import AutoTokenizer, pipeline

    encoder, _ = kiln_checkpoints
    out = tmp_path / "run"
    result = tag(
        "--model.checkpoint",
        encoder,
        "--training.output_dir",
        out,
        *FAST,
        "--data.train_file",
        ner_files["train"],
        "--data.validation_file",
        ner_files["validation"],
        "--data.test_file",
        ner_files["test"],
        "--data.label_all_tokens",
        "--training.num_train_epochs",
        3,
        "--training.lr",
        1e-2,
        "--training.per_device_train_batch_size",
        16,
    )
    assert_loss_falls(out, margin=0.3)
    last = eval_rows(out)[-1]
    assert {"eval/precision", "eval/recall", "eval/f1", "eval/PER_f1", "eval/LOC_f1", "eval/accuracy"} <= set(
        last
    )
    assert result.state.best_metric > 0.5  # entity F1, the default best-model metric for IOB tags
    assert result.test_metrics["f1"] > 0.5

    final = out / "final"
    rows = read_jsonl(out / "predictions_test.jsonl")
    assert len(rows) == 16 and all(
        len(r["predictions"]) == len(r["tokens"]) == len(r["references"]) for r in rows
    )
    tokenizer = AutoTokenizer.from_pretrained(final)
    tagger = pipeline("token-classification", model=str(final), ignore_labels=[])
    for row in rows[:6]:
        by_piece = {entity["index"]: entity["entity"] for entity in tagger(" ".join(row["tokens"]))}
        word_ids = tokenizer(row["tokens"], is_split_into_words=True).word_ids()
        first_pieces = [
            i for i, w in enumerate(word_ids) if w is not None and (i == 0 or word_ids[i - 1] != w)
        ]
        assert [by_piece[i] for i in first_pieces] == row["predictions"]

    # a checkpoint fine-tuned for these tags refuses data with another tag set
    other = write_conll(tmp_path / "pos.txt", [[("the", "DET"), ("cat", "NOUN")]] * 20)
    retag = [
        "--model.checkpoint",
        final,
        "--training.output_dir",
        tmp_path / "other",
        "--data.train_file",
        other,
        "--data.validation_file",
        other,
        "--data.test_file",
        "",
        "--training.max_steps",
        1,
        "--training.per_device_train_batch_size",
        8,
    ]
    with pytest.raises(ValueError, match="tag set mismatch.*DET"):
        tag(*retag)
    tag(*retag, "--model.reset_head")  # ... unless asked for a new head
    assert json.loads((tmp_path / "other/final/config.json").read_text())["id2label"] == {
        "0": "DET",
        "1": "NOUN",
    }


def test_tag_default_ud_sample_scores_pos_accuracy_and_writes_conll(kiln_checkpoints, tmp_path):
    encoder, _ = kiln_checkpoints
    out = tmp_path / "run"
    tag(
        "--model.checkpoint",
        encoder,
        "--training.output_dir",
        out,
        "--data.max_train_samples",
        64,
        "--data.max_eval_samples",
        16,
        "--data.max_predict_samples",
        8,
        "--training.max_steps",
        3,
        "--training.per_device_train_batch_size",
        16,
        "--eval.predictions_format",
        "tsv",
        "--data.truncation",
        "quiet",
    )
    last = eval_rows(out)[-1]
    assert "eval/accuracy" in last and "eval/f1" not in last  # UPOS is not an IOB tag set
    upos = json.loads((out / "final" / "config.json").read_text())["id2label"]
    assert len(upos) == 17 and "PROPN" in upos.values()
    text = (out / "predictions_test.tsv").read_text()
    assert text.startswith("# tokens\tpredictions\treferences\n")
    sentences = [block.splitlines() for block in text.split("\n\n")[:-1]]
    sentences[0] = sentences[0][1:]
    assert len(sentences) == 8
    assert all(len(line.split("\t")) == 3 for sentence in sentences for line in sentence)


# ----------------------------------------------------------------------------------------------------------
# seq2seq


@pytest.mark.filterwarnings("error:`past_key_values` is deprecated:FutureWarning")  # the cache API of 5.24+
def test_seq2seq_summarization_learns_saves_both_tokenizers_and_generates_the_same(
    kiln_checkpoints, tmp_path
):
    from transformers import AutoModelForSeq2SeqLM

    from finetune.seq2seq import Seq2SeqTokenizers

    encoder, decoder = kiln_checkpoints
    out = tmp_path / "run"
    result = seq2seq(
        "--model.encoder_checkpoint",
        encoder,
        "--model.decoder_checkpoint",
        decoder,
        "--training.output_dir",
        out,
        *FAST,
        "--data.max_train_samples",
        64,
        "--data.max_eval_samples",
        8,
        "--data.max_predict_samples",
        8,
        "--training.num_train_epochs",
        3,
        "--training.lr",
        1e-2,
        "--generation.max_new_tokens",
        8,
        "--data.truncation",
        "quiet",
    )
    assert_loss_falls(out, margin=0.3)
    last = eval_rows(out)[-1]
    assert {"eval/loss", "eval/rouge1", "eval/rouge2", "eval/rougeL", "eval/rougeLsum"} <= set(last)
    assert {"rouge1", "rougeL", "loss"} <= set(result.test_metrics)

    final = out / "final"
    assert (final / "encoder_tokenizer" / "tokenizer.json").is_file()
    assert (final / "decoder_tokenizer" / "tokenizer.json").is_file()
    card = (final / "README.md").read_text()
    assert "pipeline_tag: text2text-generation" in card and "rougeL" in card
    usage = card.split("```python\n")[-1].split("```")[0]
    # a card names no local folder (it is published): its usage code says path/to/final where a Hub id would be
    assert "path/to/final" in usage and str(tmp_path) not in card
    exec(usage.replace("path/to/final", str(final)), {})  # the card's usage code loads and generates
    rows = read_jsonl(out / "predictions_test.jsonl")
    assert len(rows) == 8 and set(rows[0]) == {"source", "prediction", "reference"}

    model = AutoModelForSeq2SeqLM.from_pretrained(final, trust_remote_code=True).eval()
    assert type(model).__name__ == "KilnEncoderDecoderModel"  # the folder carries its code (test_dropin.py)
    tokenizers = Seq2SeqTokenizers.from_pretrained(str(final))
    assert model.config.decoder_start_token_id == tokenizers.decoder.eos_token_id
    assert model.generation_config.max_new_tokens == 8
    inputs = tokenizers.encoder(
        [row["source"] for row in rows],
        padding=True,
        truncation=True,
        return_tensors="pt",
        return_token_type_ids=False,
    )
    with torch.no_grad():
        generated = model.generate(**inputs)
    texts = [text.strip() for text in tokenizers.decoder.batch_decode(generated, skip_special_tokens=True)]
    assert texts == [row["prediction"] for row in rows]

    # --predict with beam search writes generated outputs for the test split
    predicted = tmp_path / "predicted"
    again = seq2seq(
        "--predict",
        "--model.checkpoint",
        final,
        "--training.output_dir",
        predicted,
        "--data.max_predict_samples",
        4,
        "--generation.num_beams",
        2,
        "--generation.max_new_tokens",
        6,
        "--data.truncation",
        "quiet",
    )
    beams = read_jsonl(predicted / "predictions_test.jsonl")
    assert [row["source"] for row in beams] == [row["source"] for row in rows[:4]]
    with torch.no_grad():
        expected = model.generate(**{k: v[:4] for k, v in inputs.items()}, num_beams=2, max_new_tokens=6)
    expected_texts = [t.strip() for t in tokenizers.decoder.batch_decode(expected, skip_special_tokens=True)]
    assert [row["prediction"] for row in beams] == expected_texts
    assert "rougeL" in again.test_metrics


@pytest.mark.filterwarnings("error:`past_key_values` is deprecated:FutureWarning")  # the cache API of 5.24+
def test_seq2seq_translation_from_scratch(kiln_checkpoints, tmp_path):
    from safetensors.torch import load_file

    encoder, decoder = kiln_checkpoints
    numbers = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    rng = random.Random(0)
    for split, size in (("train", 64), ("val", 16), ("test", 8)):
        digits = [[rng.randrange(10) for _ in range(rng.randint(2, 5))] for _ in range(size)]
        (tmp_path / f"{split}.en").write_text(
            "\n".join(" ".join(numbers[d] for d in ds) for ds in digits) + "\n"
        )
        (tmp_path / f"{split}.de").write_text("\n".join(" ".join(str(d) for d in ds) for ds in digits) + "\n")
    command = (
        "--model.encoder_checkpoint",
        encoder,
        "--model.decoder_checkpoint",
        decoder,
        "--model.from_scratch",
        "--data.task",
        "translation",
        "--data.source_lang",
        "en",
        "--data.target_lang",
        "de",
        "--data.train_file",
        tmp_path / "train.en",
        "--data.validation_file",
        tmp_path / "val.en",
        "--data.test_file",
        tmp_path / "test.en",
        "--training.per_device_train_batch_size",
        16,
        "--generation.max_new_tokens",
        8,
    )
    # the untrained start, scored: one step at learning rate 1e-30 changes no weight (0 is refused)
    seq2seq(
        *command,
        "--training.output_dir",
        tmp_path / "untrained",
        "--training.max_steps",
        1,
        "--training.lr",
        1e-30,
    )
    out = tmp_path / "run"
    result = seq2seq(
        *command, "--training.output_dir", out, "--training.max_steps", 12, "--training.lr", 5e-3
    )
    untrained, last = eval_rows(tmp_path / "untrained")[-1], eval_rows(out)[-1]
    assert {"eval/bleu", "eval/chrf", "eval/loss"} <= set(last) and "bleu" in result.test_metrics
    # the translation model learns: 12 steps take the dev loss well below the untrained start's (6.2 -> 4.5 here;
    # BLEU stays 0 this early, the outputs still being too short for a 4-gram)
    assert last["eval/loss"] < 0.8 * untrained["eval/loss"], (untrained["eval/loss"], last["eval/loss"])
    assert last["eval/bleu"] >= untrained["eval/bleu"]
    # from scratch: the encoder's embeddings are not the pretrained ones
    pretrained = load_file(encoder / "model.safetensors")["model.embeddings.word_embeddings.weight"]
    trained = load_file(out / "final" / "model.safetensors")["encoder.embeddings.word_embeddings.weight"]
    assert pretrained.shape == trained.shape and not torch.allclose(pretrained, trained, atol=1e-2)


# ----------------------------------------------------------------------------------------------------------
# bad input: one line, naming the fix


def test_bad_input_gives_one_line_errors(kiln_checkpoints, tmp_path, capsys):
    encoder, _ = kiln_checkpoints
    files = write_sentiment(tmp_path, sizes=(32, 8, 8))
    out = ["--training.output_dir", tmp_path / "out"]
    data = [
        "--data.train_file",
        files["train"],
        "--data.validation_file",
        files["validation"],
        "--data.test_file",
        files["test"],
    ]

    message = finetune_cli_error(
        "classify", capsys, "--model.checkpoint", tmp_path / "runs/encoder-tiny/final", *out
    )
    assert "not found" in message and "accelerate launch pretrain/run.py" in message
    message = finetune_cli_error(
        "seq2seq",
        capsys,
        "--model.encoder_checkpoint",
        encoder,
        "--model.decoder_checkpoint",
        tmp_path / "nowhere",
        *out,
    )
    assert "configs/pretrain/decoder-tiny.yaml" in message
    message = finetune_cli_error(
        "seq2seq", capsys, "--model.encoder_checkpoint", encoder, "--model.decoder_checkpoint", encoder, *out
    )
    assert "is a kiln_encoder checkpoint" in message and "kiln_decoder" in message
    message = finetune_cli_error(
        "tag",
        capsys,
        "--model.checkpoint",
        encoder,
        *out,
        "--training.total_train_batch_size",
        6,
        "--training.gradient_accumulation_steps",
        4,
    )
    assert "total_train_batch_size 6" in message and "multiple of 4" in message

    message = finetune_cli_error(
        "classify", capsys, "--model.checkpoint", encoder, *out, *data, "--data.label_column", "author"
    )
    assert "'author' not found" in message and "sentence, label" in message
    unseen = tmp_path / "unseen.csv"
    unseen.write_text("sentence,label\nthe day was odd,neutral\nthe day was fine,positive\n")
    message = finetune_cli_error(
        "classify", capsys, "--model.checkpoint", encoder, *out, *data, "--data.validation_file", unseen
    )
    assert "'neutral'" in message and "validation" in message
    empty = tmp_path / "empty.csv"
    empty.write_text("sentence,label\n")
    message = finetune_cli_error(
        "classify", capsys, "--model.checkpoint", encoder, *out, *data, "--data.test_file", empty
    )
    assert "empty" in message
    message = finetune_cli_error(
        "classify",
        capsys,
        "--model.checkpoint",
        encoder,
        *out,
        *data,
        "--data.max_seq_length",
        4,
        "--data.truncation",
        "error",
    )
    assert "longer than 4 tokens" in message and "max_seq_length" in message
    message = finetune_cli_error(
        "classify",
        capsys,
        "--model.checkpoint",
        encoder,
        *out,
        *data,
        "--training.metric_for_best_model",
        "bleu",
    )
    assert "'bleu'" in message and "accuracy" in message
    message = finetune_cli_error("classify", capsys, "--predict", "--model.checkpoint", encoder, *out, *data)
    assert "fine-tuned classifier" in message
    message = finetune_cli_error("seq2seq", capsys, "--predict", *out)
    assert "--model.checkpoint" in message
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_truncation_warns_by_default(kiln_checkpoints, tmp_path, caplog):
    encoder, _ = kiln_checkpoints
    files = write_sentiment(tmp_path, sizes=(32, 16, 8))
    with caplog.at_level("WARNING", logger="kiln"):
        classify(
            "--model.checkpoint",
            encoder,
            "--training.output_dir",
            tmp_path / "out",
            "--data.train_file",
            files["train"],
            "--data.validation_file",
            files["validation"],
            "--data.test_file",
            files["test"],
            "--data.max_seq_length",
            4,
            "--training.max_steps",
            1,
            "--training.per_device_train_batch_size",
            16,
            "--data.max_eval_samples",
            2,
        )
    assert any(
        "32 of 32 train" in record.getMessage() and "truncated" in record.getMessage()
        for record in caplog.records
    )


@pytest.mark.parametrize("script", ["classify", "tag", "seq2seq"])
def test_help_lists_every_field_with_its_doc(script, capsys):
    import dataclasses
    import typing

    from kiln.config import field_docs

    module = __import__(f"finetune.{script}", fromlist=["main"])
    root = getattr(
        module, {"classify": "ClassifyConfig", "tag": "TagConfig", "seq2seq": "Seq2SeqConfig"}[script]
    )
    with pytest.raises(SystemExit):
        module.main(["--help"])
    text = capsys.readouterr().out
    sections = typing.get_type_hints(root)
    for name, section in sections.items():
        if not dataclasses.is_dataclass(section):  # a top-level flag such as --predict
            assert f"--{name} (" in text and field_docs(root)[name].split(":")[0] in text
            continue
        docs = field_docs(section)
        for item in dataclasses.fields(section):
            assert f"--{name}.{item.name} (" in text
            assert docs.get(item.name), f"{section.__name__}.{item.name} has no doc"
            assert " ".join(docs[item.name].split()[:3]) in " ".join(text.split())


@pytest.mark.parametrize("path", sorted((REPO / "configs/finetune").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_parse_and_the_defaults_match_the_dataclasses(path):
    import dataclasses

    import yaml

    from kiln.config import build_config

    script = path.name.split("-")[0]
    module = __import__(f"finetune.{script}", fromlist=["main"])
    config_class = {"classify": "ClassifyConfig", "tag": "TagConfig", "seq2seq": "Seq2SeqConfig"}[script]
    config = build_config(getattr(module, config_class), ["--config", str(path)])
    assert config.training.output_dir == f"runs/{path.stem}"
    if "does the same" in path.read_text():  # the default run: the file restates the dataclass defaults
        defaults = dataclasses.asdict(getattr(module, config_class)())
        for section, values in yaml.safe_load(path.read_text()).items():
            for key, value in values.items():
                default = defaults[section][key]
                assert default is None or default == value or default == [value], (
                    section,
                    key,
                    value,
                    default,
                )

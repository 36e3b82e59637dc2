"""Fine-tune a Kiln encoder or decoder for token classification: part-of-speech tags or named entities, one tag
per word.

accelerate launch finetune/tag.py                                   # UD English-EWT sample, UPOS tags
accelerate launch finetune/tag.py --data.tag_field xpos             # the same words, Penn Treebank tags
accelerate launch finetune/tag.py --config configs/finetune/tag-conll2003.yaml
accelerate launch finetune/tag.py --model.checkpoint runs/decoder-tiny/final       # a decoder
accelerate launch finetune/tag.py --predict --model.checkpoint runs/tag-ud-ewt/final
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a script (accelerate launch finetune/tag.py): import the packages
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from dataclasses import dataclass, field  # noqa: E402

from finetune.common import (  # noqa: E402
    ClassifierModelConfig,
    EvalConfig,
    finetune_training,
    is_fine_tuned,
    pop_flags,
    report_truncation,
    run_finetune_cli,
)
from finetune.runner import (  # noqa: E402
    FinetuneTask,
    TaskHead,
    classifier_checkpoint,
    classifier_head,
    classifier_model,
    run_task,
)
from kiln.config import HubConfig, LoggingConfig, TrainingConfig  # noqa: E402
from kiln.errors import ConfigError  # noqa: E402
from kiln.option_range import bounded  # noqa: E402
from pretrain.config import LONGEST  # noqa: E402

DESCRIPTION = """Fine-tune a pretrained Kiln encoder or decoder (a local runs/.../final folder or a Hub id) for
token classification: CoNLL-style column files (tag column chosen), CoNLL-U files (UPOS or XPOS), or a Hub
dataset with lists of tokens and tags. Each word's tag goes on its first piece (a WordPiece, or a byte-level BPE
token with the word's leading space; the other pieces are ignored, or labelled too with label_all_tokens), and
predictions are mapped back to one tag per word. Reports seqeval
entity precision/recall/F1 (overall and per type) for IOB tag sets, token accuracy for POS tags, keeps the
best model, writes test-split predictions and output_dir/final (loadable with
pipeline("token-classification")), and can push it to the Hub. Guide: docs/finetuning.md."""

IOB_PREFIXES = ("B-", "I-", "E-", "S-", "L-", "U-")
MOST_COLUMNS = 2**10
"""A CoNLL-style line holds at most this many columns (CoNLL-U: 10): tag_column and token_column index them."""


@dataclass
class TagDataConfig:
    dataset_name: str | None = None
    """Hub dataset (e.g. `eriktks/conll2003`) or a local dataset folder; when set, the *_file options are ignored."""
    dataset_config: str | None = None
    """Hub dataset configuration name."""
    dataset_revision: str | None = None
    """Hub dataset revision: a branch, tag or commit, or `refs/convert/parquet` for the Hub's Parquet export of a dataset that has only a loading script (which `datasets` no longer runs)."""
    train_file: str | None = "data/finetune/ud-english-ewt/en_ewt-ud-train-sample.conllu.gz"
    """Training data: .conllu, .json/.jsonl/.parquet with token and tag lists, or any other name read as CoNLL columns (.gz allowed); relative paths are also looked up from the repo root."""
    validation_file: str | None = "data/finetune/ud-english-ewt/en_ewt-ud-dev-sample.conllu.gz"
    """Validation data; without it, validation_split_percentage of the training sentences are held out."""
    test_file: str | None = "data/finetune/ud-english-ewt/en_ewt-ud-test-sample.conllu.gz"
    """Test data to predict after training (tags optional in json/parquet; with tags, test metrics are computed too)."""
    tag_field: str = "upos"
    """CoNLL-U files: which tags to learn, `upos` (17 universal tags) or `xpos` (language-specific tags)."""
    tag_column: int = bounded(-1, -MOST_COLUMNS, MOST_COLUMNS - 1)  # from the end when negative
    """Other CoNLL-style files: the column holding the tag (CoNLL-2003: -1 or 3 = NER, 1 = POS, 2 = chunk)."""
    token_column: int = bounded(0, -MOST_COLUMNS, MOST_COLUMNS - 1)
    """Other CoNLL-style files: the column holding the word."""
    tokens_column: str = "tokens"
    """Hub datasets and json/parquet files: the column with the lists of words."""
    tags_column: str = "tags"
    """Hub datasets and json/parquet files: the column with the lists of tags (e.g. `ner_tags`, `upos`)."""
    label_list: list[str] | None = None
    """The full tag set, when some tags are missing from the training split (default: the training tags)."""
    label_all_tokens: bool = False
    """Label every piece of a word (B-X becoming I-X on continuation pieces) instead of only the first one; evaluation is per word either way."""
    validation_split_percentage: float = bounded(10.0, 0, 100, high_open=True)
    """Percent of the training sentences held out for validation when there is no validation split."""
    max_seq_length: int | None = bounded(None, 2, LONGEST)  # [CLS] and [SEP]
    """Tokens per sentence, an encoder's [CLS] and [SEP] included; None: the checkpoint's max_position_embeddings."""
    truncation: str = "warn"
    """Longer sentences are truncated (their last words get no prediction): `warn` says how many, `quiet` does not, `error` refuses them."""
    max_train_samples: int | None = bounded(None, low=1)
    """Use only the first N training sentences (quick runs)."""
    max_eval_samples: int | None = bounded(None, low=1)
    """Use only the first N validation sentences."""
    max_predict_samples: int | None = bounded(None, low=1)
    """Predict only the first N test sentences."""


@dataclass
class TagConfig:
    model: ClassifierModelConfig = field(default_factory=ClassifierModelConfig)
    data: TagDataConfig = field(default_factory=TagDataConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    training: TrainingConfig = field(
        default_factory=lambda: finetune_training("runs/tag-ud-ewt", num_train_epochs=5.0, lr=5e-4)
    )
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    hub: HubConfig = field(default_factory=HubConfig)
    predict: bool = False
    """Do not train: load --model.checkpoint (a fine-tuned tagger) and write the predictions (and metrics, when tagged) of the test split into output_dir."""


def is_iob(tags) -> bool:
    return all(tag == "O" or tag.startswith(IOB_PREFIXES) for tag in tags)


def best_metric_choices(tag_names) -> tuple[list[str], str]:
    """The metrics this tag set gets, and the default one to pick the best model by."""
    if not is_iob(tag_names):
        return ["loss", "accuracy"], "accuracy"
    types = sorted({tag[2:] for tag in tag_names if tag != "O"})
    per_type = [f"{kind}_{name}" for kind in types for name in ("precision", "recall", "f1")]
    return ["loss", "accuracy", "precision", "recall", "f1", *per_type], "f1"


# ----------------------------------------------------------------------------------------------------------
# tags and model


def choose_tags(dataset, data, checkpoint_config, model_cfg, predict: bool) -> tuple[dict, dict, bool]:
    """(label2id, id2label, keep the checkpoint's head): the checkpoint's tag set when it was fine-tuned
    for tagging (its tags must cover the data's), else a new one from the data."""
    from finetune.data import build_label_maps, collect_labels

    fine_tuned = is_fine_tuned(checkpoint_config, "ForTokenClassification")
    if predict and not fine_tuned:
        raise ConfigError(
            f"--predict needs a fine-tuned tagger, but {model_cfg.checkpoint} is a pretraining checkpoint; "
            "point --model.checkpoint at one, e.g. runs/tag-ud-ewt/final"
        )
    if fine_tuned and (predict or not model_cfg.reset_head):
        saved = {str(name): int(i) for name, i in checkpoint_config.label2id.items()}
        unknown = [tag for tag in collect_labels(dataset) if tag not in saved]
        if unknown:
            shown = ", ".join(unknown[:10]) + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else "")
            raise ConfigError(
                f"tag set mismatch: {model_cfg.checkpoint} was fine-tuned with the tags "
                f"{', '.join(sorted(saved, key=saved.get))}, but the data has {shown}; train a new head with "
                "--model.reset_head true, or use data with the checkpoint's tags"
            )
        return saved, {i: name for name, i in saved.items()}, True
    label2id, id2label = build_label_maps(data.label_list or dataset["train"]["tags"])
    return label2id, id2label, False


# new by design on a pretraining checkpoint, by model kind: the classifier, and the modernbert preset's token
# transform (`head`: dense + activation + norm; none for BERT), which the pretraining folder keeps in its MLM head;
# a decoder's classifier (GPT-2's: dropout + linear on every token)
HEADS = {"encoder": TaskHead(("classifier.", "head.")), "decoder": TaskHead(("classifier.",))}


def build_tagger(path: str, model_cfg, label2id: dict, id2label: dict, keep_head: bool):
    from transformers import AutoModelForTokenClassification

    new_head = None if keep_head else dict(num_labels=len(id2label), id2label=id2label, label2id=label2id)
    return classifier_model(AutoModelForTokenClassification, path, model_cfg, new_head, HEADS)


# ----------------------------------------------------------------------------------------------------------
# data


def tokenize_splits(
    dataset, encoded, tokenizer, label2id: dict, max_length: int, positions: int, data
) -> dict:
    """Tokenized copies of the splits (input_ids, attention_mask, labels aligned to the pieces). The piece ->
    word map of each sentence is added to the raw splits as `word_ids`, to map predictions back to words."""
    from finetune.data import b_to_i_map, tokenize_and_align

    b_to_i = b_to_i_map(label2id)

    def tokenize(batch, label_all_tokens: bool):
        encoding = tokenize_and_align(
            batch, tokenizer, label_all_tokens, max_length, b_to_i=b_to_i, return_word_ids=True
        )
        encoding["truncated"] = [
            max((i for i in ids if i is not None), default=-1) + 1 < len(words)
            for ids, words in zip(encoding["word_ids"], batch["tokens"])
        ]
        return encoding

    tokenized, counts = {}, {}
    for split_name, split in encoded.items():
        # only training labels every piece; evaluation and predictions are on each word's first piece
        label_all = data.label_all_tokens and split_name == "train"
        mapped = split.map(
            tokenize,
            batched=True,
            remove_columns=split.column_names,
            fn_kwargs={"label_all_tokens": label_all},
            desc=f"tokenizing {split_name}",
        )
        mapped, truncated = pop_flags(mapped, "truncated")
        counts[split_name] = (truncated, len(mapped))
        dataset[split_name] = dataset[split_name].add_column("word_ids", mapped["word_ids"])
        tokenized[split_name] = mapped.remove_columns("word_ids")
    report_truncation(counts, "sentences", max_length, positions, "--data.max_seq_length", data.truncation)
    return tokenized


# ----------------------------------------------------------------------------------------------------------
# predicting and scoring


def infer(model, loader, accelerator):
    """Piece-level predicted tag ids per sentence ([CLS]/[SEP] included, padding dropped), and the mean loss
    over labelled pieces."""
    import torch
    import torch.nn.functional as F

    predictions, loss_sum, count = [], 0.0, 0
    for batch in loader:
        labels = batch.pop("labels", None)
        logits = model(**batch).logits.float()  # (B, T, num_labels)
        if labels is not None:
            token_loss = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
            labelled = (labels != -100).sum(-1).float()
            per_sentence = torch.stack([token_loss.sum(-1), labelled], dim=-1)  # (B, 2)
            sums = accelerator.gather_for_metrics(per_sentence).sum(0)
            loss_sum, count = loss_sum + float(sums[0]), count + float(sums[1])
        pieces = logits.argmax(-1).masked_fill(batch["attention_mask"] == 0, -100)
        pieces = accelerator.gather_for_metrics(
            accelerator.pad_across_processes(pieces, dim=1, pad_index=-100)
        )
        predictions.extend([int(p) for p in row if p != -100] for row in pieces.tolist())
    return predictions, (loss_sum / count if count else None)


def make_scoring(id2label: dict):
    from finetune.data import words_from_predictions
    from finetune.metrics import load_metric

    metric = load_metric("seqeval_tags")

    def word_tags(predictions, split) -> list[list[str]]:
        return [
            [id2label[i] for i in words_from_predictions(pieces, word_ids)]
            for pieces, word_ids in zip(predictions, split["word_ids"])
        ]

    def compute_metrics(predictions, split) -> dict[str, float]:
        predicted = word_tags(predictions, split)
        # words cut off by truncation have no prediction: score the words that were seen
        references = [tags[: len(tags_predicted)] for tags, tags_predicted in zip(split["tags"], predicted)]
        return metric.compute(predictions=predicted, references=references)

    def prediction_rows(predictions, split) -> list[dict]:
        predicted = word_tags(predictions, split)
        references = split["tags"] if "tags" in split.column_names else None
        rows = []
        for i, (tokens, tags) in enumerate(zip(split["tokens"], predicted)):
            row = {"tokens": tokens, "predictions": tags}
            if references is not None:
                row["references"] = references[i]
            rows.append(row)
        return rows

    return compute_metrics, prediction_rows


# ----------------------------------------------------------------------------------------------------------


# the task


def start(config):
    return classifier_checkpoint(config.model)


def read(config, files: dict, start):
    from finetune.data import load_tagging_data

    data = config.data
    return load_tagging_data(
        dataset_name=data.dataset_name,
        dataset_config=data.dataset_config,
        dataset_revision=data.dataset_revision,
        **files,
        tokens_column=data.tokens_column,
        tags_column=data.tags_column,
        tag_column=data.tag_column,
        token_column=data.token_column,
        tag_field=data.tag_field,
        label_list=data.label_list,
        validation_split_percentage=data.validation_split_percentage,
        seed=config.training.seed,
    )


def tags(config, start, dataset) -> tuple[dict, dict, bool]:
    return choose_tags(dataset, config.data, start.checkpoint_config, config.model, config.predict)


def best_metric(config, chosen) -> tuple[list[str], str]:
    return best_metric_choices(list(chosen[0]))


def head(config, start, chosen):
    from finetune.data import words_with_leading_space

    label2id, id2label, keep_head = chosen
    facts = {
        "tags": ", ".join(id2label[i] for i in sorted(id2label)),
        "label all pieces": config.data.label_all_tokens,
    }
    built = classifier_head(
        config.model,
        config.data.max_seq_length,
        start,
        lambda: build_tagger(start.path, config.model, label2id, id2label, keep_head),
        len(id2label),
        facts,
    )
    words_with_leading_space(built.tokenizer)  # pre-split words tokenized as in running text
    return built


def tokenize(config, head, dataset, chosen, accelerator) -> dict:
    from finetune.data import encode_labels

    label2id = chosen[0]
    with accelerator.main_process_first():
        encoded = encode_labels(dataset, label2id)
        positions = head.model.config.max_position_embeddings
        return tokenize_splits(
            dataset, encoded, head.tokenizer, label2id, head.max_length, positions, config.data
        )


def collator(head):
    from transformers import DataCollatorForTokenClassification

    return DataCollatorForTokenClassification(head.tokenizer)


def scoring(config, head, chosen):
    return (infer, *make_scoring(chosen[1]))


TASK = FinetuneTask(
    script="finetune/tag.py",
    config=TagConfig,
    description=DESCRIPTION,
    pipeline_tag="token-classification",
    reference_column="tags",
    start=start,
    read=read,
    labels=tags,
    best_metric=best_metric,
    head=head,
    tokenize=tokenize,
    collator=collator,
    scoring=scoring,
)


def main(argv: list[str] | None = None):
    return run_task(TASK, argv)


if __name__ == "__main__":
    run_finetune_cli(main)

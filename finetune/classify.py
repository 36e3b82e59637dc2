"""Fine-tune a Kiln encoder or decoder for sequence classification (single sentences or sentence pairs) or
regression.

accelerate launch finetune/classify.py                              # authorship sample: which of 4 authors
accelerate launch finetune/classify.py --config configs/finetune/classify-sst2.yaml
accelerate launch finetune/classify.py --data.glue_task mrpc --data.glue_dir glue_data/MRPC   # GLUE presets
accelerate launch finetune/classify.py --model.checkpoint runs/decoder-tiny/final   # a decoder: its last token
accelerate launch finetune/classify.py --predict --model.checkpoint runs/classify-authorship/final
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a script (accelerate launch finetune/classify.py): import the packages
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
sequence classification: single sentences or sentence pairs (GLUE-style; a decoder reads the pair joined by its
EOS token, and classifies from its last token), labels given as names or ints (saved as label2id/id2label in the
model config), or regression when the labels are floats. Data from a Hub dataset or
csv/tsv/json/parquet files; --data.glue_task presets the nine GLUE tasks (finetune/glue.py runs the suite).
Reports accuracy, F1 and Matthews correlation (Pearson/Spearman for regression) after every epoch, keeps the
best model, writes test-split predictions and output_dir/final (loadable with pipeline("text-classification")),
and can push it to the Hub. Guide: docs/finetuning.md."""


@dataclass
class ClassifyDataConfig:
    dataset_name: str | None = None
    """Hub dataset (e.g. `nyu-mll/glue`) or a local dataset folder; when set, the *_file options are ignored."""
    dataset_config: str | None = None
    """Hub dataset configuration (e.g. `sst2`, `mrpc`, `stsb`)."""
    dataset_revision: str | None = None
    """Hub dataset revision: a branch, tag or commit, or `refs/convert/parquet` for the Hub's Parquet export of a dataset that has only a loading script (which `datasets` no longer runs)."""
    train_file: str | None = "data/finetune/authorship/train.csv"
    """Training data: .csv, .tsv, .json/.jsonl or .parquet (.gz allowed); relative paths are also looked up from the repo root."""
    validation_file: str | None = "data/finetune/authorship/validation.csv"
    """Validation data; without it, validation_split_percentage of the training rows are held out."""
    test_file: str | None = "data/finetune/authorship/test.csv"
    """Test data to predict after training (labels optional; with labels, test metrics are computed too)."""
    text_columns: list[str] | None = None
    """One text column, or two for sentence pairs (e.g. `sentence1,sentence2`); default: the first of (sentence1, sentence2), sentence, text that exists."""
    label_column: str = "label"
    """Column with the labels: names (`positive`), ints, or floats for regression."""
    label_list: list[str] | None = None
    """The full label set in class-id order (e.g. `[not_equivalent, equivalent]`: binary F1 scores class 1), also when some labels are missing from the training split (default: the training labels, sorted)."""
    glue_task: str | None = None
    """A GLUE task preset (cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli; finetune/glue_tasks.py): sets the data source, text and label columns, label set and best-model metric, and scores MNLI's mismatched dev set too; the data comes from glue_dir, else the Hub dataset nyu-mll/glue. The run writes to runs/glue/<task> unless training.output_dir is given."""
    glue_dir: str | None = None
    """With glue_task: the task's folder of the GLUE data (e.g. glue_data/MRPC with train.tsv, dev.tsv, test.tsv as in the GLUE zips); replaces dataset_name, the *_file options and text_columns, label_column, label_list."""
    validation_split_percentage: float = bounded(10.0, 0, 100, high_open=True)
    """Percent of the training rows held out for validation when there is no validation split."""
    max_seq_length: int | None = bounded(None, 2, LONGEST)  # [CLS] and [SEP]
    """Tokens per example (a pair counts both sentences and what joins them); None: the checkpoint's max_position_embeddings."""
    truncation: str = "warn"
    """Examples longer than max_seq_length are truncated: `warn` says how many, `quiet` does not, `error` refuses them."""
    max_train_samples: int | None = bounded(None, low=1)
    """Use only the first N training examples (quick runs)."""
    max_eval_samples: int | None = bounded(None, low=1)
    """Use only the first N validation examples."""
    max_predict_samples: int | None = bounded(None, low=1)
    """Predict only the first N test examples."""


@dataclass
class ClassifyConfig:
    model: ClassifierModelConfig = field(default_factory=ClassifierModelConfig)
    data: ClassifyDataConfig = field(default_factory=ClassifyDataConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    training: TrainingConfig = field(
        default_factory=lambda: finetune_training("runs/classify-authorship", num_train_epochs=5.0, lr=5e-4)
    )
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    hub: HubConfig = field(default_factory=HubConfig)
    predict: bool = False
    """Do not train: load --model.checkpoint (a fine-tuned classifier) and write the predictions (and metrics, when labelled) of the test split into output_dir."""


CLASSIFICATION_METRICS = ("loss", "accuracy", "f1", "matthews_correlation")
REGRESSION_METRICS = ("loss", "pearson", "spearmanr", "combined_score", "mse")


# ----------------------------------------------------------------------------------------------------------
# labels and model


@dataclass
class Labels:
    regression: bool
    label2id: dict | None = None
    """Label as found in the data (name or int) -> class id; None for regression."""
    names: dict | None = None
    """Class id -> label as found in the data (or the checkpoint's name for ids the data never uses)."""

    @property
    def num_labels(self) -> int:
        return 1 if self.regression else len(self.names)


def _label_list(data) -> list | None:
    """label_list arrives as strings; ints are added so that it also matches int label columns."""
    if not data.label_list:
        return None
    as_ints = [int(name) for name in data.label_list if name.lstrip("-").isdigit()]
    return [*data.label_list, *as_ints]


def choose_labels(dataset, data, checkpoint_config, model_cfg, predict: bool) -> tuple[Labels, bool]:
    """The label maps, and whether the checkpoint's own head is kept (continued fine-tuning, --predict)."""
    from finetune.data import build_label_maps, collect_labels, is_regression

    regression = is_regression(dataset["train"]["label"])
    fine_tuned = is_fine_tuned(checkpoint_config, "ForSequenceClassification")
    if predict and not fine_tuned:
        raise ConfigError(
            f"--predict needs a fine-tuned classifier, but {model_cfg.checkpoint} is a pretraining checkpoint; "
            "point --model.checkpoint at one, e.g. runs/classify-authorship/final"
        )
    if fine_tuned and (predict or not model_cfg.reset_head):
        saved_regression = checkpoint_config.problem_type == "regression"
        if regression != saved_regression:
            kinds = {True: "regression", False: "classification"}
            raise ConfigError(
                f"{model_cfg.checkpoint} was fine-tuned for {kinds[saved_regression]} but the data is "
                f"{kinds[regression]}; train a new head with --model.reset_head true, or use matching data"
            )
        if regression:
            return Labels(True), True
        saved = {str(name): int(i) for name, i in checkpoint_config.label2id.items()}
        found = collect_labels(dataset)
        unknown = [label for label in found if str(label) not in saved]
        if unknown:
            raise ConfigError(
                f"{model_cfg.checkpoint} was fine-tuned with labels {sorted(saved)}, but the data also has "
                f"{sorted(map(str, unknown))}; train a new head with --model.reset_head true, or fix the labels"
            )
        label2id = {label: saved[str(label)] for label in found}
        names = {i: name for name, i in saved.items()} | {i: label for label, i in label2id.items()}
        return Labels(False, label2id, dict(sorted(names.items()))), True
    if regression:
        return Labels(True), False
    labels = dataset["train"]["label"]
    if not data.label_list:
        label2id, id2label = build_label_maps(labels)
        return Labels(False, label2id, id2label), False
    wanted_ints = all(isinstance(label, int) for label in labels)
    ordered = dict.fromkeys(
        int(name) if wanted_ints else name for name in data.label_list
    )  # ids in list order
    return Labels(False, {label: i for i, label in enumerate(ordered)}, dict(enumerate(ordered))), False


# the head a pretraining checkpoint lacks, by model kind: an encoder's classifier and pooler, a decoder's `score`
# (GPT-2's: a bias-free linear layer on the last token's hidden state, no dropout before it)
HEADS = {
    "encoder": TaskHead(("classifier.", "model.pooler.")),
    "decoder": TaskHead(
        ("score.",), no_dropout="a Kiln decoder's sequence classifier (GPT-2's `score` head) has none"
    ),
}


def build_classifier(path: str, model_cfg, labels: Labels, keep_head: bool):
    from transformers import AutoModelForSequenceClassification

    new_head = None
    if not keep_head:
        new_head = dict(
            num_labels=labels.num_labels,
            problem_type="regression" if labels.regression else "single_label_classification",
        )
        if not labels.regression:
            new_head["id2label"] = {i: str(name) for i, name in labels.names.items()}
            new_head["label2id"] = {str(name): i for i, name in labels.names.items()}
    return classifier_model(AutoModelForSequenceClassification, path, model_cfg, new_head, HEADS)


# ----------------------------------------------------------------------------------------------------------
# data


def join_pairs(tokenizer):
    """A tokenizer that joins a sentence pair with nothing between (byte-level BPE, Kiln's decoder tokenizer) gets
    a template that puts its EOS token there (`A <eos> B`), as GPT-style classifiers delimit the two sentences; one
    whose template already separates a pair keeps it. Saved with the model, so the pipeline joins pairs the same
    way."""
    from tokenizers import processors

    if tokenizer.num_special_tokens_to_add(pair=True) > tokenizer.num_special_tokens_to_add(pair=False):
        return tokenizer
    separator = tokenizer.sep_token or tokenizer.eos_token
    if separator is None:
        raise ConfigError(
            "sentence pairs need a token between the two sentences, and this tokenizer has neither a "
            "separator nor an EOS token; give one text column, or a tokenizer with an EOS token"
        )
    template = processors.TemplateProcessing(
        single="$A",
        pair=f"$A {separator} $B:1",
        special_tokens=[(separator, tokenizer.convert_tokens_to_ids(separator))],
    )
    backend = tokenizer.backend_tokenizer
    steps = [backend.post_processor] if backend.post_processor is not None else []
    backend.post_processor = processors.Sequence([*steps, template])
    return tokenizer


def tokenize_splits(dataset, tokenizer, max_length: int, positions: int, data) -> dict:
    """Tokenized copies of the splits (input_ids, attention_mask, labels, and token_type_ids where the tokenizer
    makes them: an encoder's), truncated to max_length, with the truncation reported per split."""
    pairs = "text_pair" in next(iter(dataset.values())).column_names

    def tokenize(batch):
        texts = (batch["text"], batch["text_pair"]) if pairs else (batch["text"],)
        encoding = tokenizer(*texts, truncation=True, max_length=max_length)
        full_lengths = [len(ids) for ids in tokenizer(*texts, verbose=False)["input_ids"]]
        encoding["truncated"] = [length > max_length for length in full_lengths]
        if "label" in batch:
            encoding["labels"] = batch["label"]
        return encoding

    tokenized, counts = {}, {}
    for split_name, split in dataset.items():
        mapped = split.map(
            tokenize, batched=True, remove_columns=split.column_names, desc=f"tokenizing {split_name}"
        )
        tokenized[split_name], truncated = pop_flags(mapped, "truncated")
        counts[split_name] = (truncated, len(mapped))
    report_truncation(counts, "examples", max_length, positions, "--data.max_seq_length", data.truncation)
    return tokenized


# ----------------------------------------------------------------------------------------------------------
# predicting and scoring


def make_infer(regression: bool):
    def infer(model, loader, accelerator):
        import torch
        import torch.nn.functional as F

        predictions, losses = [], []
        for batch in loader:
            labels = batch.pop("labels", None)
            logits = model(**batch).logits.float()  # (B, num_labels)
            if regression:
                outputs = logits.squeeze(-1)
                if labels is not None:
                    losses.append(accelerator.gather_for_metrics((outputs - labels.float()) ** 2))
            else:
                outputs = logits.argmax(-1)
                if labels is not None:
                    losses.append(
                        accelerator.gather_for_metrics(F.cross_entropy(logits, labels, reduction="none"))
                    )
            predictions.extend(accelerator.gather_for_metrics(outputs).tolist())
        loss = float(torch.cat(losses).mean()) if losses else None
        return predictions, loss

    return infer


def make_scoring(labels: Labels):
    from finetune.metrics import load_metric

    metric = load_metric("regression" if labels.regression else "classification")

    def compute_metrics(predictions, split) -> dict[str, float]:
        if labels.regression:
            references = [float(label) for label in split["label"]]
            scores = metric.compute(predictions=predictions, references=references)
            mse = sum((p - r) ** 2 for p, r in zip(predictions, references)) / len(references)
            return {**scores, "mse": mse}
        references = [labels.label2id[label] for label in split["label"]]
        return metric.compute(predictions=predictions, references=references, labels=list(labels.names))

    def prediction_rows(predictions, split) -> list[dict]:
        columns = {name: split[name] for name in ("text", "text_pair", "label") if name in split.column_names}
        rows = []
        for i, prediction in enumerate(predictions):
            row = {name: columns[name][i] for name in ("text", "text_pair") if name in columns}
            row["prediction"] = prediction if labels.regression else labels.names[prediction]
            if "label" in columns:
                row["reference"] = columns["label"][i]
            rows.append(row)
        return rows

    return compute_metrics, prediction_rows


# ----------------------------------------------------------------------------------------------------------


# the task


def start(config):
    """The GLUE preset (--data.glue_task) and the checkpoint, before the run starts."""
    from finetune.glue_tasks import apply_preset

    return classifier_checkpoint(
        config.model, apply_preset(config.data, config.training) if config.data.glue_task else {}
    )


def read(config, files: dict, start):
    from finetune.data import load_classification_data

    data = config.data
    return load_classification_data(
        dataset_name=data.dataset_name,
        dataset_config=data.dataset_config,
        dataset_revision=data.dataset_revision,
        **files,
        text_columns=data.text_columns,
        label_column=data.label_column,
        label_list=_label_list(data),
        validation_split_percentage=data.validation_split_percentage,
        seed=config.training.seed,
        **start.loader_options,
    )


def labels(config, start, dataset) -> tuple[Labels, bool]:
    return choose_labels(dataset, config.data, start.checkpoint_config, config.model, config.predict)


def best_metric(config, chosen) -> tuple[tuple[str, ...], str]:
    return (REGRESSION_METRICS, "pearson") if chosen[0].regression else (CLASSIFICATION_METRICS, "accuracy")


def head(config, start, chosen):
    labels, keep_head = chosen
    names = "regression" if labels.regression else ", ".join(map(str, labels.names.values()))
    return classifier_head(
        config.model,
        config.data.max_seq_length,
        start,
        lambda: build_classifier(start.path, config.model, labels, keep_head),
        labels.num_labels,
        {"labels": names},
    )


def tokenize(config, head, dataset, chosen, accelerator) -> dict:
    from finetune.data import encode_labels

    labels = chosen[0]
    encoded = dataset if labels.regression else encode_labels(dataset, labels.label2id)
    positions = head.model.config.max_position_embeddings
    if head.model_kind == "decoder" and "text_pair" in next(iter(dataset.values())).column_names:
        join_pairs(head.tokenizer)
    with accelerator.main_process_first():
        return tokenize_splits(encoded, head.tokenizer, head.max_length, positions, config.data)


def collator(head):
    from transformers import DataCollatorWithPadding

    return DataCollatorWithPadding(head.tokenizer)


def scoring(config, head, chosen):
    return (make_infer(chosen[0].regression), *make_scoring(chosen[0]))


TASK = FinetuneTask(
    script="finetune/classify.py",
    config=ClassifyConfig,
    description=DESCRIPTION,
    pipeline_tag="text-classification",
    reference_column="label",
    start=start,
    read=read,
    labels=labels,
    best_metric=best_metric,
    preset_output_dir=("glue_task", "runs/glue/{}", ClassifyConfig().training.output_dir),
    head=head,
    tokenize=tokenize,
    collator=collator,
    scoring=scoring,
)


def main(argv: list[str] | None = None):
    return run_task(TASK, argv)


if __name__ == "__main__":
    run_finetune_cli(main)

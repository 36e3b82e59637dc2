"""One job runner for every fine-tuning task: a script declares its task (`FinetuneTask`), `run_task` does the rest.

A task is a declaration: its config dataclass and --help text, when it starts (checks and checkpoints), its reader
(raw splits from the configured source), its label set, its model head, its tokenization, its collator, and its
inference, metric and prediction rows. `run_task` runs every script the same way: it parses the config and hands
the engine one job (`kiln.job.run_job`), whose `build` the engine calls once it has checked its own sections and
started the accelerator:

    config (defaults, --config YAML, --section.key overrides; --help) -> [engine: training, logging, hub checks;
    accelerator, logging, seed] -> shared and task checks (`start`) -> raw splits (`read`) -> label set from the
    whole training split (`labels`) -> max_*_samples cut -> best-model metric checked -> --predict keeps the test
    split -> model (`head`) -> tokenized splits (`tokenize`) -> `FinetuneJob` -> [engine: output folder, resume,
    the loop, final export, Hub], or run_prediction with --predict

A head that needs no label set (seq2seq) is built right after seeding, before the data is read. User errors
raise (ConfigError, FinetuneDataError); a script's `__main__` runs `main` under `finetune.common.run_finetune_cli`, which
prints them as one line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from finetune.common import (
    FinetuneJob,
    FinetuneResult,
    check_best_metric,
    check_vocabulary,
    data_files,
    dataset_names,
    finetune_result,
    initialisation,
    load_checkpoint_tokenizer,
    only_test_split,
    positions_limit,
    predict_files,
    quiet_libraries,
    quiet_transformers,
    report_loading,
    resolve_start_model,
    run_parts,
    run_prediction,
    scratch_model,
    subsample,
    validate_common,
)
from kiln.config import build_config
from kiln.errors import ConfigError
from kiln.job import TrainingJob, run_job, start_predicting
from kiln.model_files import weight_file_errors


@dataclass
class Head:
    """What a task's `head` builds: the model with its task head, and what goes along with it."""

    model: Any
    tokenizer: Any
    """Saved next to the weights: anything with save_pretrained(folder)."""
    summary: dict = field(default_factory=dict)
    """Facts for the model card and the start-up summary (tokenize may add the lengths it settles)."""
    metadata: dict = field(default_factory=dict)
    """The run's metadata (task kind, number of labels)."""
    max_length: int | None = None
    """Tokens per example, for the tasks with one length."""
    flops_per_token: float | None = None
    model_kind: str | None = None
    """What the model card calls the model (`encoder`, `decoder`), when the model section names no kind."""


@dataclass(frozen=True)
class FinetuneTask:
    """A fine-tuning task, declared; `run_task(task, argv)` runs it. The steps are called in the order of the
    module docstring; what `start` returns and the label set `labels` chooses are handed to the later steps."""

    script: str
    """The script's path (finetune/classify.py): --help shows `accelerate launch <script>`."""
    config: type
    """The config dataclass: sections model, data, eval, training, logging, hub, and the flag predict."""
    description: str
    """What --help says the script does."""
    pipeline_tag: str
    """Pipeline tag for the model card: text-classification, token-classification, text2text-generation."""
    reference_column: str
    """Column of the raw splits holding the references (label, tags, target)."""
    start: Callable[[Any], Any]
    """(config) -> what the later steps need from before the run starts: the task's own checks, the checkpoint
    resolved (path and transformers config), loader options."""
    read: Callable[[Any, dict, Any], Any]
    """The reader: (config, data files by split, start) -> raw DatasetDict (finetune.data's loaders)."""
    head: Callable[[Any, Any, Any], Head]
    """The model head: (config, start, labels) -> Head."""
    tokenize: Callable[[Any, Head, Any, Any, Any], dict]
    """(config, head, raw splits, labels, accelerator) -> tokenized splits, row-aligned with the raw ones (it may add
    columns to the raw splits, e.g. tagging's word_ids)."""
    collator: Callable[[Head], Callable]
    """(head) -> the batch collator."""
    scoring: Callable[[Any, Head, Any], tuple[Callable, Callable, Callable]]
    """(config, head, labels) -> (infer, compute_metrics, prediction_rows): inference, the evaluate metric, the
    prediction writer's rows (see FinetuneJob)."""
    labels: Callable[[Any, Any, Any], Any] | None = None
    """(config, start, raw splits) -> the label set, from the whole training split (before any max_*_samples
    cut); None: the head does not depend on the data."""
    best_metric: Callable[[Any, Any], tuple[list[str], str]] | None = None
    """(config, labels) -> (metrics the task computes, default best-model metric); None: `start` checks it."""
    card_usage: str | None = None
    """Python code for the model card's Usage section, when the default one does not fit (see FinetuneJob)."""
    preset_output_dir: tuple[str, str, str] | None = None
    """(a data setting, a folder pattern, the script's default output folder): when that setting is given and
    --training.output_dir is left at that default, the run writes to the pattern filled with the setting (classify: a GLUE preset's own runs/glue/<task>,
    so two presets never share a folder). Data, not a hook: the config enters the engine before any app code."""

    def parse(self, argv: list[str] | None):
        """The config from defaults, --config YAML and overrides; --help prints the options and exits."""
        config = build_config(
            self.config, argv, prog=f"accelerate launch {self.script}", description=self.description
        )
        if self.preset_output_dir is not None:
            setting, pattern, default = self.preset_output_dir
            value = getattr(config.data, setting)
            if value and config.training.output_dir == default:
                config.training.output_dir = pattern.format(value)
        return config


def build_job(task: FinetuneTask, config, accelerator) -> FinetuneJob:
    """The FinetuneJob of a parsed config, once the run has started (`accelerator`)."""
    from finetune.data import SPLITS

    validate_common(config)
    start = task.start(config)
    quiet_libraries()
    head = (
        task.head(config, start, None) if task.labels is None else None
    )  # its new weights drawn right after seeding
    data = config.data
    with accelerator.main_process_first():
        dataset = task.read(config, predict_files(data) if config.predict else data_files(data), start)
    labels = task.labels(config, start, dataset) if task.labels is not None else None
    dataset = subsample(dataset, data)
    if task.best_metric is not None:
        choices, default = task.best_metric(config, labels)
        check_best_metric(config.training, choices, default=default)
    if config.predict:
        dataset = only_test_split(dataset)
    if head is None:
        head = task.head(config, start, labels)
    tokenized = task.tokenize(config, head, dataset, labels, accelerator)
    infer, compute_metrics, prediction_rows = task.scoring(config, head, labels)
    job = FinetuneJob(
        task=task.pipeline_tag,
        model=head.model,
        tokenizer=head.tokenizer,
        collator=task.collator(head),
        infer=infer,
        compute_metrics=compute_metrics,
        prediction_rows=prediction_rows,
        reference_column=task.reference_column,
        train_dataset=tokenized.get("train"),
        eval_dataset=tokenized.get("validation"),
        eval_split=dataset.get("validation"),
        test_dataset=tokenized.get("test"),
        test_split=dataset.get("test"),
        metadata={"task": task.pipeline_tag, **head.metadata},
        datasets=dataset_names(data),
        extra_summary=head.summary,
        flops_per_token=head.flops_per_token,
        card_usage=task.card_usage,
        model_kind=head.model_kind,
        extra_eval={name: (tokenized[name], dataset[name]) for name in dataset if name not in SPLITS},
    )
    return job


def run_task(task: FinetuneTask, argv: list[str] | None = None) -> FinetuneResult:
    """A script's main(): parse its config and hand the engine the job (or, with --predict, only predict)."""
    config = task.parse(argv)
    if config.predict:
        accelerator = start_predicting(config)
        return run_prediction(config, accelerator, build_job(task, config, accelerator))

    def build(accelerator, run_config):  # the run's copy: the task's default best-model metric is set there
        return run_parts(
            build_job(task, run_config, accelerator), run_config.model, run_config.training, run_config.eval
        )

    return finetune_result(run_job(TrainingJob(config, build, eval_each_epoch=config.eval.each_epoch)))


# ----------------------------------------------------------------------------------------------------------
# what the classifier tasks (classify, tag) share: a Kiln encoder or decoder with a task head

# the checkpoint types classify and tag start from, and what the model card calls each
CLASSIFIER_KINDS = {"kiln_encoder": "encoder", "kiln_decoder": "decoder"}


class ClassifierStart(NamedTuple):
    """What a classifier task knows before its run starts."""

    path: str
    """--model.checkpoint as a local folder or Hub id."""
    checkpoint_config: Any
    """Its transformers config (encoder or decoder, whether it was fine-tuned, and with which labels)."""
    loader_options: dict = {}
    """Further options of the task's reader (the GLUE presets')."""

    @property
    def kind(self) -> str:
        """`encoder` or `decoder`."""
        return CLASSIFIER_KINDS[self.checkpoint_config.model_type]


def classifier_checkpoint(model_cfg, loader_options: dict | None = None) -> ClassifierStart:
    """--model.checkpoint (of the model section `model_cfg`) resolved as a Kiln encoder or decoder."""
    path, checkpoint_config = resolve_start_model(
        model_cfg.checkpoint, "--model.checkpoint", tuple(CLASSIFIER_KINDS), model_cfg.revision
    )
    return ClassifierStart(path, checkpoint_config, loader_options or {})


def decoder_tokenizer(tokenizer, checkpoint: str):
    """A decoder's tokenizer made ready for classification batches, as transformers' GPT-2 recipes do: padded on
    the right with its pad token (its EOS token when it has none), and no token_type_ids (a decoder has no
    segments: GPT-2 would add them to the inputs as token embeddings)."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ConfigError(
                f"the tokenizer of --model.checkpoint {checkpoint} has neither a pad nor an EOS token, and a "
                "decoder's batches are padded with one of them; set tokenizer.pad_token and save it into the folder"
            )
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    tokenizer.model_input_names = [name for name in tokenizer.model_input_names if name != "token_type_ids"]
    return tokenizer


def classifier_head(
    model_cfg,
    max_seq_length: int | None,
    start: ClassifierStart,
    build: Callable[[], Any],
    num_labels: int,
    facts: dict,
) -> Head:
    """The Head of a Kiln encoder or decoder with a task head (`model_cfg`: the model section): its tokenizer (a
    decoder's made ready by `decoder_tokenizer`), the model `build()` returns (a decoder's pad_token_id set from
    the tokenizer, which its sequence classifier finds each sequence's last token by), its sequence length
    (data.max_seq_length capped at max_position_embeddings), FLOPs per token and card facts (`facts` between the
    initialisation and the length)."""
    from pretrain.modeling import count_flops_per_token

    tokenizer = load_checkpoint_tokenizer(start.path, "--model.checkpoint", model_cfg.revision)
    if start.kind == "decoder":
        decoder_tokenizer(tokenizer, model_cfg.checkpoint)
    model = build()
    if start.kind == "decoder":
        model.config.pad_token_id = tokenizer.pad_token_id
    check_vocabulary(tokenizer, model.config, model_cfg.checkpoint)
    max_length = positions_limit(max_seq_length, model.config.max_position_embeddings, "data.max_seq_length")
    summary = {
        "base model": model_cfg.checkpoint,
        "initialisation": initialisation(model_cfg),
        **facts,
        "max sequence length": max_length,
    }
    return Head(
        model,
        tokenizer,
        summary=summary,
        metadata={"num_labels": num_labels},
        max_length=max_length,
        flops_per_token=count_flops_per_token(model.config, max_length),
        model_kind=start.kind,
    )


class TaskHead(NamedTuple):
    """A task head of one model kind, as classify and tag declare it."""

    new_weights: tuple[str, ...]
    """The weight-name prefixes a pretraining checkpoint lacks by design, the head's own first (encoder: the
    classifier, the pooler; decoder: GPT-2's `score` or `classifier`)."""
    no_dropout: str | None = None
    """Why the head has no dropout before it (--model.classifier_dropout is then refused, saying so); None: it has."""


def _run_config_settings(kind: str, head: TaskHead, checkpoint_config, model_cfg) -> dict:
    """The config attributes a run sets on its checkpoint's config: the dropout options under the names of the
    model kind, and (encoder) the unpadded blocks."""
    if model_cfg.classifier_dropout is not None and head.no_dropout:
        raise ConfigError(
            f"--model.classifier_dropout {model_cfg.classifier_dropout} has no dropout to set: {head.no_dropout}; "
            "leave it unset (--model.dropout sets the dropout inside the model)"
        )
    settings = {}
    if kind == "encoder":
        settings["unpad_inputs"] = model_cfg.unpad_inputs
        if model_cfg.classifier_dropout is not None:
            settings["classifier_dropout"] = model_cfg.classifier_dropout
        if model_cfg.dropout is not None:
            settings.update(
                hidden_dropout_prob=model_cfg.dropout, attention_probs_dropout_prob=model_cfg.dropout
            )
        return settings
    if model_cfg.dropout is not None:
        settings.update(
            resid_pdrop=model_cfg.dropout, embd_pdrop=model_cfg.dropout, attn_pdrop=model_cfg.dropout
        )
    if model_cfg.classifier_dropout is not None:
        settings["classifier_dropout"] = model_cfg.classifier_dropout
    elif not head.no_dropout and getattr(checkpoint_config, "classifier_dropout", None) is None:
        # as the encoder's: the hidden dropout (a fine-tuned head keeps its own)
        settings["classifier_dropout"] = settings.get("resid_pdrop", checkpoint_config.resid_pdrop)
    settings["use_cache"] = False  # a classifier reads each batch once: no key/value cache to build
    return settings


def classifier_model(auto_class, path: str, model_cfg, new_head: dict | None, heads: dict[str, TaskHead]):
    """A Kiln encoder or decoder with the task head of `auto_class` (e.g. AutoModelForTokenClassification), with
    the dropout settings of `model_cfg`. `new_head`: the config of a new, randomly initialised head (num_labels,
    id2label, ...); None keeps the checkpoint's fine-tuned one. `heads`: the task's head by model kind; a weight
    missing from the checkpoint that is not new by design (the head's) is an error."""
    import torch
    from transformers import AutoConfig

    with quiet_transformers():  # a Kiln type (resolve_start_model): its registered class, never its own code
        config = AutoConfig.from_pretrained(path, revision=model_cfg.revision, trust_remote_code=False)
    kind = CLASSIFIER_KINDS[config.model_type]
    head = heads[kind]
    for name, value in {**_run_config_settings(kind, head, config, model_cfg), **(new_head or {})}.items():
        setattr(config, name, value)
    if model_cfg.from_scratch:
        return scratch_model(auto_class, config, model_cfg)
    keep_head = new_head is None
    with quiet_transformers(), weight_file_errors(path, "--model.checkpoint"):
        model, info = auto_class.from_pretrained(
            path,
            config=config,
            revision=model_cfg.revision,
            attn_implementation=model_cfg.attn_implementation,
            output_loading_info=True,
            trust_remote_code=False,
            # a head fine-tuned for another label count is replaced
            ignore_mismatched_sizes=not keep_head,
        )
    report_loading(info, model_cfg.checkpoint, allowed_missing=lambda key: key.startswith(head.new_weights))
    fine_tuned_before = not any(key.startswith(head.new_weights[0]) for key in info["missing_keys"])
    # --model.reset_head on a fine-tuned checkpoint: a new head (ignore_mismatched_sizes only replaces it when the
    # label count differs)
    if not keep_head and fine_tuned_before:
        layer = getattr(model, head.new_weights[0].rstrip("."))
        with torch.no_grad():
            layer.weight.normal_(0.0, model.config.initializer_range)
            if layer.bias is not None:
                layer.bias.zero_()
    return model


__all__ = [
    "CLASSIFIER_KINDS",
    "ClassifierStart",
    "FinetuneTask",
    "Head",
    "TaskHead",
    "build_job",
    "classifier_checkpoint",
    "classifier_head",
    "classifier_model",
    "decoder_tokenizer",
    "run_task",
]

"""The fine-tuning run's parts, and the helpers the tasks share (finetune/classify.py, finetune/tag.py,
finetune/seq2seq.py).

The job runner (finetune/runner.py) turns a script's config into a `FinetuneJob` (model, tokenizer, tokenized
splits, collator, and how to predict and score) by the steps its `FinetuneTask` declares; `run_parts` makes it what
the engine trains (`kiln.job.run_job`), with the callbacks (`kiln.callbacks.BestModel`, `FinalEvaluation`,
`TestPredictions`) that do what every task needs around the loop:

    evaluation each epoch (or every training.eval_steps) -> best model kept in output_dir/best by
    training.metric_for_best_model (early stopping by training.early_stopping_patience) -> best model loaded
    back -> predictions file for the test split -> [the engine:] output_dir/final (save_pretrained + model card)
    -> Hub push

`run_prediction` is the `--predict` path: no training, only the predictions file (and test metrics when the
test split has references) of an already fine-tuned model.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.callbacks import TrainerCallback
from kiln.cli import run_cli
from kiln.config import TrainingConfig, resolve_path
from kiln.errors import ConfigError, first_line
from kiln.export import quiet_transformers
from kiln.model_files import read_model_config
from kiln.option_range import bounded
from kiln.run_folder import record_files
from kiln.safe_write import open_file, write_file

if TYPE_CHECKING:
    from kiln.job import RunParts

logger = logging.getLogger("kiln")

# Where the default checkpoints come from, for the one-line "missing checkpoint" error.
PRETRAIN_COMMANDS = {
    "kiln_encoder": ("runs/encoder-tiny/final", "accelerate launch pretrain/run.py"),
    "kiln_decoder": (
        "runs/decoder-tiny/final",
        "accelerate launch pretrain/run.py --config configs/pretrain/decoder-tiny.yaml",
    ),
}
TRUNCATION_POLICIES = ("warn", "error", "quiet")
PREDICTIONS_FORMATS = ("jsonl", "tsv")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


# ----------------------------------------------------------------------------------------------------------
# config sections shared by the scripts


@dataclass
class ClassifierModelConfig:
    """The model section of finetune/classify.py and finetune/tag.py: a Kiln encoder or decoder and its task head."""

    checkpoint: str = "runs/encoder-tiny/final"
    """Kiln encoder or decoder checkpoint to start from: a local folder (`runs/encoder-tiny/final` from `accelerate launch pretrain/run.py`, `runs/decoder-tiny/final` from `accelerate launch pretrain/run.py --config configs/pretrain/decoder-tiny.yaml`) or a Hub id (`user/name`). With --predict: a fine-tuned model."""
    revision: str | None = None
    """Hub revision (branch, tag or commit) of the checkpoint."""
    reset_head: bool = False
    """Train a new, randomly initialised head even when the checkpoint was already fine-tuned with another label set."""
    from_scratch: bool = False
    """Random weights with the shape and the tokenizer of `checkpoint` (its weights are not read): the baseline that shows what pretraining buys."""
    classifier_dropout: float | None = bounded(None, 0, 1, high_open=True)  # 1 drops everything
    """Dropout before the classification head (None: the model's hidden dropout, an encoder's hidden_dropout_prob, a decoder's resid_pdrop). A decoder's sequence classifier has none (GPT-2's head), so it refuses this option."""
    dropout: float | None = bounded(None, 0, 1, high_open=True)
    """Dropout inside the encoder or decoder while fine-tuning (hidden and attention; None: the checkpoint's). Useful when the checkpoint was pretrained without dropout."""
    attn_implementation: str = "sdpa"
    """Attention kernel: `sdpa` (PyTorch fused) or `eager`."""
    unpad_inputs: bool = True
    """Run an encoder's blocks on the real tokens of a padded batch only (padding re-added inside attention): the same loss, gradients and predictions for less work (docs/performance.md); false: the plain padded path. A decoder always runs the padded path."""


@dataclass
class EvalConfig:
    each_epoch: bool = True
    """Evaluate (and keep the best model) after every epoch; false: every training.eval_steps optimizer steps (0: only at the end)."""
    predictions_format: str = "jsonl"
    """Format of the test-split predictions file output_dir/predictions_test.<format>: `jsonl` or `tsv`."""


def finetune_training(output_dir: str, **overrides) -> TrainingConfig:
    """TrainingConfig defaults for fine-tuning: epochs instead of steps, warmup, no periodic resumable
    checkpoints (the best and the final model are saved anyway; set save_steps to resume long runs)."""
    values = dict(
        output_dir=output_dir,
        max_steps=-1,
        num_train_epochs=3.0,
        per_device_train_batch_size=32,
        per_device_eval_batch_size=64,
        lr=5e-4,
        warmup_ratio=0.1,
        eval_steps=0,
        save_steps=0,
        save_total_limit=1,
    )
    values.update(overrides)
    return TrainingConfig(**values)


def validate_common(config) -> None:
    """Checks every fine-tuning config needs beyond the engine's own (kiln.job checks training, logging and hub
    first); task checks live in the scripts."""
    training, data = config.training, config.data
    if getattr(config, "predict", False) and getattr(config.model, "from_scratch", False):
        raise ConfigError(
            "--model.from_scratch starts from random weights, so it cannot --predict; drop one of them"
        )
    if training.metric_for_best_model in ("loss", "eval/loss") and training.greater_is_better:
        raise ConfigError(
            "metric_for_best_model loss needs --training.greater_is_better false (lower loss is better)"
        )
    if config.eval.predictions_format not in PREDICTIONS_FORMATS:
        raise ConfigError(
            f"--eval.predictions_format must be jsonl or tsv, got {config.eval.predictions_format!r}"
        )
    if data.truncation not in TRUNCATION_POLICIES:
        raise ConfigError(
            f"--data.truncation must be one of {', '.join(TRUNCATION_POLICIES)}, got {data.truncation!r}"
        )
    attention = getattr(config.model, "attn_implementation", None)
    if attention is not None:  # a kernel Kiln's models run, and (training) one that trains on this device
        from pretrain.modeling.configuration_kiln import check_attn_implementation
        from pretrain.run import training_device

        training = None if getattr(config, "predict", False) else training_device()
        try:
            check_attn_implementation(attention, training)
        except ValueError as error:
            raise ConfigError(f"model: {error}") from None


def check_best_metric(training: TrainingConfig, available: Sequence[str], default: str) -> None:
    """Pick the task's default best-model metric when none is set; refuse one the task never computes."""
    if not training.metric_for_best_model:
        training.metric_for_best_model = default
        training.greater_is_better = default != "loss"
        return
    name = training.metric_for_best_model.removeprefix("eval/")
    if name not in available:
        raise ConfigError(
            f"--training.metric_for_best_model {name!r} is not computed by this task; choose one of: "
            f"{', '.join(available)}"
        )


# ----------------------------------------------------------------------------------------------------------
# checkpoints


def resolve_start_model(spec: str, option: str, expected: Sequence[str], revision: str | None = None):
    """A Kiln checkpoint as a local folder or Hub id -> (path or id, its transformers config); a transformers BERT /
    ELECTRA / GPT-2 / Llama checkpoint of the expected kind is converted on the way in (the path is then the Kiln
    folder).

    `option` names the setting in errors (e.g. "--model.checkpoint"); `expected` lists the accepted
    model_type values (kiln_encoder, kiln_decoder, encoder-decoder)."""
    from transformers import AutoConfig

    import pretrain.modeling  # noqa: F401  (registers the Kiln model types with AutoConfig)
    from pretrain.convert import convert_first_advice, converted_start, convertible
    from pretrain.model_gate import CONVERTIBLE, check_model_folder

    local = resolve_path(spec)
    if os.path.isdir(local):
        if not os.path.isfile(os.path.join(local, "config.json")):
            if os.path.isfile(os.path.join(local, "final", "config.json")):
                raise ConfigError(
                    f"{option} {spec} is a run folder; point it at the model inside: {spec}/final"
                )
            raise ConfigError(f"{option} {spec} holds no config.json, so it is not a saved model")
        path = local
    elif _HUB_ID.match(spec) and not os.path.exists(spec.split("/")[0]):
        path = spec
    else:
        default_dir, command = PRETRAIN_COMMANDS.get(expected[0], (None, None))
        hint = f"create it with `{command}` (writes {default_dir}), or " if command else ""
        raise ConfigError(
            f"{option} {spec} not found; {hint}point {option} at a Kiln checkpoint folder or Hub id"
        )
    try:  # read as data first: a checkpoint of another type never gets its own code (auto_map) imported
        found = read_model_config(path, revision)
    except OSError as err:
        raise ConfigError(f"cannot load {option} {spec}: {err}") from None
    found_type = found.get("model_type")
    family = convertible(found)
    if family is not None and family[2] in expected:  # transformers BERT / ELECTRA / GPT-2: converted to Kiln
        path, found_type = converted_start(path, option, revision), family[2]
    advice = convert_first_advice(found, spec, option)
    if advice and "kiln_encoder" in expected:
        raise ConfigError(advice)
    if (
        family is None
    ):  # the model gate: its files, depth and tensors against its config (a converted one's before)
        check_model_folder(spec, option, found, path, revision)
    if found_type not in expected:
        wanted = " or ".join(expected)
        default_dir, command = PRETRAIN_COMMANDS.get(expected[0], (None, None))
        example = f", e.g. {default_dir} from `{command}`" if command else ""
        families = [name for name, _, kiln_type in CONVERTIBLE.values() if kiln_type in expected]
        listed = " or ".join(filter(None, [", ".join(families[:-1]), families[-1]])) if families else ""
        converts = f" (or a transformers {listed} one, converted on the way in)" if families else ""
        what = f"a transformers {family[0]} ({family[1]})" if family else f"a {found_type}"
        raise ConfigError(
            f"{option} {spec} is {what} checkpoint, but a {wanted} checkpoint{converts} is needed here{example}"
        )
    try:  # a Kiln or transformers type: its registered class, never the checkpoint's own code
        with quiet_transformers():
            config = AutoConfig.from_pretrained(path, revision=revision, trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot load {option} {spec}: {first_line(err)}") from None
    return path, config


def load_checkpoint_tokenizer(path: str, option: str, revision: str | None = None, subfolder: str = ""):
    """The tokenizer saved with checkpoint `path` (`option` names the setting in errors); a tokenizer that needs
    code of its own (auto_map) is refused in one line, never run nor asked about."""
    from transformers import AutoTokenizer

    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(
                path, subfolder=subfolder, revision=revision, trust_remote_code=False
            )
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot load the tokenizer of {option} {path}: {first_line(err)}") from None
    tokenizer.init_kwargs.pop("auto_map", None)  # saved again by this run: name no code it did not run
    return tokenizer


def scratch_model(auto_class, config, model_cfg):
    """`auto_class` (e.g. AutoModelForSequenceClassification) built from `config` (the checkpoint's, with the
    run's settings: num_labels, dropout, ...) with random weights (--model.from_scratch): the checkpoint's weights
    are not read. Weights are drawn from the seeded torch generator, so each training.seed gives its own
    initialisation."""
    with quiet_transformers():
        model = auto_class.from_config(config, attn_implementation=model_cfg.attn_implementation)
    logger.info(
        "%s: shape and tokenizer only, all weights randomly initialised (--model.from_scratch)",
        model_cfg.checkpoint,
    )
    return model


def initialisation(model_cfg) -> str:
    """How the weights started, for the model card and the start-up summary."""
    if getattr(model_cfg, "from_scratch", False):
        return f"random (from scratch, shape and tokenizer of {model_cfg.checkpoint})"
    return f"pretrained ({model_cfg.checkpoint})"


def is_fine_tuned(config, head: str) -> bool:
    """Whether a checkpoint's weights include a task head (e.g. head="ForSequenceClassification")."""
    return any(name.endswith(head) for name in (getattr(config, "architectures", None) or []))


def report_loading(info: dict, what: str, allowed_missing: Callable[[str], bool]) -> None:
    """One log line about new and unused weights; weights missing from the checkpoint that are not new by
    design (e.g. the encoder's own layers) mean the wrong checkpoint, so they are an error."""
    from pretrain.convert import announce_conversions

    announce_conversions()  # the start model's conversion from transformers, if any (before logging was set up)
    missing = sorted(info.get("missing_keys", []))
    unexpected = sorted(info.get("unexpected_keys", []))
    mismatched = sorted(str(key) for key in info.get("mismatched_keys", []))
    wrong = [key for key in missing if not allowed_missing(key)]
    if wrong:
        shown = ", ".join(wrong[:5]) + (f" and {len(wrong) - 5} more" if len(wrong) > 5 else "")
        raise ConfigError(
            f"{what} lacks weights the model needs ({shown}); is it a Kiln checkpoint of the right kind?"
        )
    logger.info(
        "%s: %d new (randomly initialised) weights%s, %d checkpoint weights unused%s%s",
        what,
        len(missing),
        f" ({_summarise(missing)})" if missing else "",
        len(unexpected),
        f" ({_summarise(unexpected)})" if unexpected else "",
        f", {len(mismatched)} re-initialised for new shapes" if mismatched else "",
    )


def _summarise(keys: list[str]) -> str:
    prefixes = sorted({key.rsplit(".", 1)[0] for key in keys})
    return ", ".join(prefixes[:4]) + (", ..." if len(prefixes) > 4 else "")


def check_vocabulary(tokenizer, model_config, path: str) -> None:
    """A tokenizer with more tokens than the model has embeddings makes ids the model cannot look up, which
    fails only at the first batch with an index error: refuse the pair when both are loaded."""
    if len(tokenizer) > model_config.vocab_size:
        raise ConfigError(
            f"{path}: its tokenizer has {len(tokenizer)} tokens but the model only {model_config.vocab_size} "
            "embeddings; put the tokenizer the model was trained with into the folder (pretraining saves it in "
            "final/), or resize the model's embeddings (model.resize_token_embeddings) and save it"
        )


def positions_limit(
    requested: int | None, limit: int, option: str, limit_name: str = "the model's max_position_embeddings"
) -> int:
    """The length to use: `requested` (None: `limit`), capped at `limit` with a warning."""
    if requested is None:
        return limit
    if requested <= 0:
        raise ConfigError(f"{option} must be positive, got {requested}")
    if requested > limit:
        logger.warning("%s=%d is more than %s (%d); using %d", option, requested, limit_name, limit, limit)
        return limit
    return requested


# ----------------------------------------------------------------------------------------------------------
# data helpers


def data_files(data) -> dict[str, str | None]:
    """The configured local files by split, resolved against the repo root (shipped samples); none when a
    dataset_name is given (it takes precedence)."""
    if data.dataset_name:
        if data.train_file or data.validation_file or data.test_file:
            logger.info(
                "data.dataset_name %s is given: the data.*_file options are not used", data.dataset_name
            )
        return {"train_file": None, "validation_file": None, "test_file": None}
    return {
        name: resolve_path(path) if path else None
        for name, path in (
            ("train_file", data.train_file),
            ("validation_file", data.validation_file),
            ("test_file", data.test_file),
        )
    }


def predict_files(data) -> dict[str, str | None]:
    """--predict needs only a test split: with local files and no training file, the test file stands in for
    the train and validation splits the loaders ask for."""
    files = data_files(data)
    if data.dataset_name or files["train_file"]:
        return files
    if not files["test_file"]:
        raise ConfigError(
            "--predict needs a test split: give --data.test_file (or a dataset with a test split)"
        )
    return {
        "train_file": files["test_file"],
        "validation_file": files["test_file"],
        "test_file": files["test_file"],
    }


def only_test_split(dataset):
    """--predict: keep just the test split, so that nothing else is tokenized."""
    from datasets import DatasetDict

    if "test" not in dataset:
        raise ConfigError(
            "--predict needs a test split: give --data.test_file (or a dataset with a test split)"
        )
    return DatasetDict(test=dataset["test"])


def dataset_names(data) -> list[str]:
    """The data named by the model card: the Hub dataset, or the local files (the card names each by its file
    name, size and sha256, never by its folder)."""
    if data.dataset_name:
        return [data.dataset_name]
    names = []
    for path in (data.train_file, data.validation_file, data.test_file):
        if path and str(path) not in names:
            names.append(str(path))
    return names


def subsample(dataset, data):
    """Keep the first max_train/eval/predict_samples rows of each split (quick runs, tests); further evaluation
    splits (MNLI's validation_mismatched) count as validation."""
    limits = {"train": data.max_train_samples, "test": data.max_predict_samples}
    for split in dataset:
        limit = limits.get(split, data.max_eval_samples)
        if limit is not None and limit < len(dataset[split]):
            dataset[split] = dataset[split].select(range(limit))
    return dataset


def report_truncation(
    counts: dict[str, tuple[int, int]], what: str, max_length: int, positions: int, option: str, policy: str
) -> None:
    """counts: split -> (truncated rows, rows). Warn (or fail, or say nothing) about `what` cut at max_length
    tokens; `option` is the setting that raises max_length, up to the model's `positions`."""
    cut = {split: pair for split, pair in counts.items() if pair[0]}
    if not cut or policy == "quiet":
        return
    detail = ", ".join(f"{n} of {total} {split}" for split, (n, total) in cut.items())
    message = f"{detail} {what} are longer than {max_length} tokens"
    if max_length < positions:
        fix = f"raise {option} (the model takes up to {positions})"
    else:
        fix = f"the model takes no more ({positions} positions): shorten the {what}"
    if policy == "error":
        from finetune.data import FinetuneDataError

        raise FinetuneDataError(f"{message}; {fix}, or let them be truncated with --data.truncation warn")
    logger.warning(
        "%s and were truncated; %s, or hide this warning with --data.truncation quiet", message, fix
    )


def pop_flags(dataset, column: str):
    """(dataset without `column`, number of rows where `column` is true): used for per-row truncation flags."""
    flagged = sum(bool(flag) for flag in dataset[column])
    return dataset.remove_columns(column), flagged


def make_loader(accelerator, dataset, batch_size: int, collator):
    """A sequential, sharded loader (evaluation order = dataset order after gather_for_metrics)."""
    from torch.utils.data import DataLoader, SequentialSampler

    loader = DataLoader(
        dataset, batch_size=batch_size, sampler=SequentialSampler(dataset), collate_fn=collator
    )
    return accelerator.prepare(loader)


def write_predictions(rows: list[dict], path: str | os.PathLike, fmt: str) -> Path:
    """Write the rows of `FinetuneJob.prediction_rows`. jsonl: one JSON object per row. tsv: a header line and
    one line per row, whitespace inside values collapsed to single spaces, several references joined by
    ` ||| `; rows of per-word lists (tagging) are written CoNLL-style instead: a `# column names` line, then
    one word per line and a blank line after each sentence (`_` for a word without a prediction)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open_file(path, "w") as f:  # never through a link (kiln.safe_write)
        if fmt == "jsonl":
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
            return path
        columns = list(rows[0]) if rows else []
        if rows and isinstance(rows[0].get("tokens"), list):
            f.write("# " + "\t".join(columns) + "\n")
            for row in rows:
                for i in range(len(row["tokens"])):
                    f.write("\t".join(_tsv_value(_at(row[c], i)) for c in columns) + "\n")
                f.write("\n")
            return path
        f.write("\t".join(columns) + "\n")
        for row in rows:
            f.write("\t".join(_tsv_value(row.get(c)) for c in columns) + "\n")
    return path


def _at(values, i):
    return values[i] if values is not None and i < len(values) else None


def _tsv_value(value) -> str:
    if value is None:
        return "_"
    if isinstance(value, (list, tuple)):
        return " ||| ".join(_tsv_value(v) for v in value)
    return " ".join(str(value).split())


# ----------------------------------------------------------------------------------------------------------
# the run


@dataclass
class FinetuneJob:
    """What the runner builds from a script's task: made the engine's run parts by `run_parts`, or predicted with by
    `run_prediction`.

    `infer(model, loader, accelerator)` runs the model over a sequential loader and returns
    (predictions in dataset order, mean loss or None when the batches have no labels); it is called under
    torch.no_grad with the model in eval mode. `compute_metrics(predictions, raw_split)` scores them against
    the references of the matching raw split; `prediction_rows(predictions, raw_split)` makes the rows of the
    predictions file. Raw splits are row-aligned with the tokenized ones."""

    task: str
    """Pipeline tag for the model card: text-classification, token-classification, text2text-generation."""
    model: Any
    tokenizer: Any
    """Saved next to the weights: anything with save_pretrained(folder)."""
    collator: Callable
    infer: Callable
    compute_metrics: Callable
    prediction_rows: Callable
    reference_column: str
    """Column of the raw splits holding the references (label, tags, target)."""
    train_dataset: Any = None
    eval_dataset: Any = None
    eval_split: Any = None
    test_dataset: Any = None
    test_split: Any = None
    metadata: dict = field(default_factory=dict)
    datasets: list[str] = field(default_factory=list)
    extra_summary: dict = field(default_factory=dict)
    flops_per_token: float | None = None
    card_usage: str | None = None
    """Python code for the model card's Usage section (`{repo}` is filled in), when the default one (Auto
    classes with trust_remote_code) does not fit the saved folder."""
    model_kind: str | None = None
    """What the model card calls the fine-tuned model (`encoder`, `decoder`), when the model section names no kind."""
    extra_eval: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    """Further labelled splits scored once with the final model: name -> (tokenized, raw) (MNLI's
    validation_mismatched); their metrics join the validation split's in eval_results.json and the card."""


@dataclass
class FinetuneResult:
    state: Any
    """The loop's TrainState (None with --predict)."""
    final_dir: Path | None
    test_metrics: dict[str, float]
    predictions_file: Path | None
    eval_metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    """The final model's metrics by evaluation split: "validation" (from its last evaluation) and each of
    `FinetuneJob.extra_eval`; also written to output_dir/eval_results.json."""


def quiet_libraries() -> None:
    """Library chatter no fine-tuning run needs to show."""
    # EncoderDecoderModel warns on every forward that it computes the loss itself: we know, and want it
    warnings.filterwarnings(
        "ignore", message="Version v4.12.0 introduces a better way", category=FutureWarning
    )
    # rouge_score logs "Using default tokenizer" at INFO on every call
    logging.getLogger("absl").setLevel(logging.WARNING)


def _evaluator(job: FinetuneJob):
    def evaluate(model, loader, accelerator) -> dict[str, float]:
        predictions, loss = job.infer(model, loader, accelerator)
        # max_eval_batches may stop early: score against the rows that were predicted
        references = job.eval_split.select(range(len(predictions)))
        metrics = job.compute_metrics(predictions, references)
        return {"loss": loss, **metrics} if loss is not None else metrics

    return evaluate


def _score_split(
    training, accelerator, job: FinetuneJob, model, tokenized, raw
) -> tuple[list, dict[str, float]]:
    """Predictions for one split, and its metrics (with the loss) when it has references."""
    import torch

    loader = make_loader(accelerator, tokenized, training.per_device_eval_batch_size, job.collator)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        predictions, loss = job.infer(model, loader, accelerator)
    model.train(was_training)
    metrics = {}
    if job.reference_column in raw.column_names:
        metrics = job.compute_metrics(predictions, raw)
        if loss is not None:
            metrics = {"loss": loss, **metrics}
    return predictions, metrics


def _predict_split(
    training, eval_cfg, accelerator, job: FinetuneJob, model
) -> tuple[dict[str, float], Path | None]:
    """Predictions file for the test split (and its metrics when it has references)."""
    if job.test_dataset is None:
        return {}, None
    predictions, metrics = _score_split(training, accelerator, job, model, job.test_dataset, job.test_split)
    out = Path(training.output_dir)
    path = out / f"predictions_test.{eval_cfg.predictions_format}"
    if accelerator.is_main_process:
        write_predictions(job.prediction_rows(predictions, job.test_split), path, eval_cfg.predictions_format)
        if metrics:
            write_file(out / "test_results.json", json.dumps(metrics, indent=2))
        # on the run folder's record (--predict writes into a folder of no run: none there)
        record_files(out, path.name, *(["test_results.json"] if metrics else []))
        accelerator.print(f"predictions for {len(predictions)} test examples written to {path}")
        if metrics:
            accelerator.print("test: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
    accelerator.wait_for_everyone()
    return metrics, path


class TestPredictions(TrainerCallback):
    """Callback: at the end of training, the predictions file (and metrics) of the test split, with the model
    the run exports (the best one, once BestModel has loaded it back)."""

    def __init__(self, training, eval_cfg, job: FinetuneJob):
        self.training, self.eval, self.job = training, eval_cfg, job
        self.metrics: dict[str, float] = {}
        self.path: Path | None = None

    def on_train_end(self, trainer, end) -> None:
        acc, state = trainer.accelerator, trainer.state
        if not end.completed:  # stopped by a signal or failed: no model to predict with
            return
        self.metrics, self.path = _predict_split(self.training, self.eval, acc, self.job, trainer.model)
        if self.metrics and acc.is_main_process and acc.trackers:
            acc.log({f"test/{k}": v for k, v in self.metrics.items()}, step=state.global_step)
        if self.metrics:
            end.summary["test"] = {k: round(v, 6) for k, v in self.metrics.items() if math.isfinite(v)}


class FinalEvaluation(TrainerCallback):
    """Callback: at the end of training, the exported model's validation metrics (its last evaluation: the best
    one, once BestModel has loaded it back) and those of the further evaluation splits (`job.extra_eval`),
    scored now; written to eval_results.json and, for the further splits, to the model card."""

    def __init__(self, training, job: FinetuneJob):
        self.training, self.job = training, job
        self.metrics: dict[str, dict[str, float]] = {}

    def on_train_end(self, trainer, end) -> None:
        from kiln.export import latest_metrics

        acc = trainer.accelerator
        if not end.completed:
            return
        history = end.card_state.history
        metrics = {
            "validation": {
                k.removeprefix("eval/"): v
                for k, v in latest_metrics(history).items()
                if k.startswith("eval/")
            }
        }
        for name, (tokenized, raw) in self.job.extra_eval.items():
            metrics[name] = _score_split(self.training, acc, self.job, trainer.model, tokenized, raw)[1]
            acc.print(f"{name}: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics[name].items()))
            end.summary[name] = {k: round(v, 6) for k, v in metrics[name].items() if math.isfinite(v)}
        if acc.is_main_process:
            write_file(Path(self.training.output_dir) / "eval_results.json", json.dumps(metrics, indent=2))
            record_files(self.training.output_dir, "eval_results.json")
        self.metrics = metrics


def run_parts(job: FinetuneJob, model_cfg, training, eval_cfg) -> RunParts:
    """What the engine trains (kiln.job.run_job): the job's model and data, scored by its metrics, with the callbacks
    every task needs before the engine's export: best model kept and loaded back -> final scores (validation and
    the further evaluation splits, test predictions). `finetune_result` reads their results after the run."""
    from kiln.callbacks import BestModel
    from kiln.export import ModelCardFacts
    from kiln.job import RunParts

    kind = getattr(
        model_cfg, "kind", None
    )  # the seq2seq model section names its kind, classify's and tag's do not
    card = ModelCardFacts(
        model_kind=kind or job.model_kind,
        objective=model_cfg.objective if kind is not None else None,
        task=job.task,
        datasets=job.datasets,
        base_model=hub_base_models(model_cfg),
        summary=dict(job.extra_summary),
        usage=job.card_usage,
    )
    return RunParts(
        model=job.model,
        tokenizer=job.tokenizer,
        card=card,
        train_dataset=lambda epoch: job.train_dataset,
        collator=job.collator,
        eval_dataset=job.eval_dataset,
        evaluator=_evaluator(job),
        flops_per_token=job.flops_per_token,
        metadata=job.metadata,
        callbacks=[
            BestModel(Path(training.output_dir) / "best", job.tokenizer),
            FinalEvaluation(training, job),
            TestPredictions(training, eval_cfg, job),
        ],
    )


def finetune_result(trainer) -> FinetuneResult:
    """What a fine-tuning run gives back, from the finished Trainer and its scoring callbacks."""
    evaluation = next(c for c in trainer.callbacks if isinstance(c, FinalEvaluation))
    predictions = next(c for c in trainer.callbacks if isinstance(c, TestPredictions))
    return FinetuneResult(
        trainer.state, trainer.end.final_dir, predictions.metrics, predictions.path, evaluation.metrics
    )


def hub_base_models(model_config) -> list[str] | None:
    """The Hub ids among the checkpoints a run started from (local folders are not named in card metadata)."""
    if getattr(model_config, "from_scratch", False):
        return None  # only the shapes and tokenizers came from there
    specs = [
        getattr(model_config, name, None)
        for name in ("checkpoint", "encoder_checkpoint", "decoder_checkpoint")
    ]
    ids = [s for s in specs if s and not Path(s).exists() and _HUB_ID.match(s) and "/" in s]
    return ids or None


def run_prediction(config, accelerator, job: FinetuneJob) -> FinetuneResult:
    """--predict: the predictions file (and test metrics) of a fine-tuned model, without training."""
    if job.test_dataset is None:
        raise ConfigError(
            "--predict needs a test split: give --data.test_file (or a dataset with a test split)"
        )
    Path(config.training.output_dir).mkdir(parents=True, exist_ok=True)
    model = accelerator.prepare(job.model)
    metrics, path = _predict_split(config.training, config.eval, accelerator, job, model)
    accelerator.end_training()
    return FinetuneResult(None, None, metrics, path)


def run_finetune_cli(main: Callable, argv: list[str] | None = None):
    """Run a script's main(); user errors print one line `error: ...` and exit with status 2."""

    def user_errors():
        from finetune.data import FinetuneDataError
        from pretrain.data import DataError

        return (FinetuneDataError, DataError)

    return run_cli(main, argv, user_errors)


__all__ = [
    "ClassifierModelConfig",
    "EvalConfig",
    "FinetuneJob",
    "FinetuneResult",
    "check_best_metric",
    "check_vocabulary",
    "finetune_result",
    "run_finetune_cli",
    "data_files",
    "dataset_names",
    "finetune_training",
    "hub_base_models",
    "initialisation",
    "is_fine_tuned",
    "load_checkpoint_tokenizer",
    "make_loader",
    "only_test_split",
    "pop_flags",
    "positions_limit",
    "predict_files",
    "quiet_transformers",
    "report_loading",
    "report_truncation",
    "resolve_start_model",
    "run_parts",
    "scratch_model",
    "run_prediction",
    "quiet_libraries",
    "subsample",
    "validate_common",
    "write_predictions",
]

"""GLUE's nine task presets: each task's data layout (GLUE's TSV folders and the Hub dataset nyu-mll/glue), label
set and metrics, and `apply_preset`, which fills a `finetune/classify.py` config from `--data.glue_task NAME`.

Used by the classify script (the presets) and by the suite runner `finetune/glue.py` (the scores), which runs
the classify script: a module of its own, so that neither of the two imports the other in a circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

HUB_DATASET = "nyu-mll/glue"
FILES = {"train": "train.tsv", "validation": "dev.tsv", "test": "test.tsv"}
ACCURACY = (("validation", "accuracy"),)
F1_ACCURACY = (("validation", "f1"), ("validation", "accuracy"))
METRIC_NAMES = {
    "accuracy": "accuracy",
    "f1": "F1",
    "matthews_correlation": "Matthews corr.",
    "pearson": "Pearson",
    "spearmanr": "Spearman",
}


@dataclass(frozen=True)
class GlueTask:
    name: str
    folder: str
    """The task's folder in the GLUE distribution (glue_data/CoLA, ...)."""
    text_columns: tuple[str, ...]
    """Text column(s) of the GLUE TSV files."""
    hub_text_columns: tuple[str, ...]
    """Text column(s) of the Hub dataset nyu-mll/glue."""
    label_column: str
    """Label column of the TSV files (the Hub's is `label`)."""
    labels: tuple[str, ...] | None
    """Label names in GLUE's id order (nyu-mll/glue's ClassLabel; TSV files with 0/1 use these ids);
    None: regression (num_labels=1)."""
    score: tuple[tuple[str, str], ...]
    """(evaluation split, metric) pairs whose mean is the task's GLUE score; the first picks the best model."""
    files: dict[str, str] = field(default_factory=lambda: FILES)
    """Split -> file name in the task folder; splits beyond train/validation/test are further dev sets."""
    hub_splits: dict[str, str] | None = None
    """Split -> nyu-mll/glue split name, where they differ from train/validation/test."""
    headerless: tuple[str, ...] = ()
    """Columns of the train and dev files when they have no header line (CoLA)."""

    def label_text(self) -> str:
        metrics = [METRIC_NAMES[metric] for _, metric in self.score]
        if self.name == "mnli":
            return "accuracy matched / mismatched"
        return " / ".join(metrics)


MNLI_FILES = {
    "train": "train.tsv",
    "validation": "dev_matched.tsv",
    "validation_mismatched": "dev_mismatched.tsv",
    "test": "test_matched.tsv",
}
MNLI_HUB_SPLITS = {
    "train": "train",
    "validation": "validation_matched",
    "validation_mismatched": "validation_mismatched",
    "test": "test_matched",
}
PAIR = ("sentence1", "sentence2")
NLI = ("entailment", "not_entailment")

GLUE_TASKS = {
    task.name: task
    for task in (
        GlueTask(
            "cola",
            "CoLA",
            ("sentence",),
            ("sentence",),
            "label",
            ("unacceptable", "acceptable"),
            (("validation", "matthews_correlation"),),
            headerless=("source", "label", "original_label", "sentence"),
        ),
        GlueTask("sst2", "SST-2", ("sentence",), ("sentence",), "label", ("negative", "positive"), ACCURACY),
        GlueTask(
            "mrpc",
            "MRPC",
            ("#1 String", "#2 String"),
            PAIR,
            "Quality",
            ("not_equivalent", "equivalent"),
            F1_ACCURACY,
        ),
        GlueTask(
            "qqp",
            "QQP",
            ("question1", "question2"),
            ("question1", "question2"),
            "is_duplicate",
            ("not_duplicate", "duplicate"),
            F1_ACCURACY,
        ),
        GlueTask(
            "stsb",
            "STS-B",
            PAIR,
            PAIR,
            "score",
            None,
            (("validation", "pearson"), ("validation", "spearmanr")),
        ),
        GlueTask(
            "mnli",
            "MNLI",
            PAIR,
            ("premise", "hypothesis"),
            "gold_label",
            ("entailment", "neutral", "contradiction"),
            (("validation", "accuracy"), ("validation_mismatched", "accuracy")),
            files=MNLI_FILES,
            hub_splits=MNLI_HUB_SPLITS,
        ),
        GlueTask("qnli", "QNLI", ("question", "sentence"), ("question", "sentence"), "label", NLI, ACCURACY),
        GlueTask("rte", "RTE", PAIR, PAIR, "label", NLI, ACCURACY),
        GlueTask("wnli", "WNLI", PAIR, PAIR, "label", ("not_entailment", "entailment"), ACCURACY),
    )
}


def glue_task(name: str) -> GlueTask:
    from kiln.errors import ConfigError

    if name not in GLUE_TASKS:
        raise ConfigError(
            f"--data.glue_task {name!r} is not a GLUE task; choose one of: {', '.join(GLUE_TASKS)}"
        )
    return GLUE_TASKS[name]


def apply_preset(data, training) -> dict:
    """Fill the classify config's data section from `data.glue_task` (the source, text and label columns and
    the label set in GLUE's order; `data.glue_dir` for the TSV files, else the Hub) and the task's main metric
    as the default best-model metric. Returns the further loader options (load_classification_data)."""
    from kiln.config import resolve_path
    from kiln.errors import ConfigError

    task = glue_task(data.glue_task)
    data.label_list = list(task.labels) if task.labels else None
    if not training.metric_for_best_model:
        training.metric_for_best_model, training.greater_is_better = task.score[0][1], True
    if data.glue_dir is None:
        data.dataset_name, data.dataset_config = HUB_DATASET, task.name
        data.train_file = data.validation_file = data.test_file = None
        data.text_columns, data.label_column = list(task.hub_text_columns), "label"
        # without the Hub: the GLUE distribution's folder of the task
        offline_fix = f"--data.glue_dir DIR, the {task.folder} folder of the GLUE data (python finetune/glue.py: --glue-dir)"
        return {"hub_splits": task.hub_splits, "unlabelled_test": True, "offline_fix": offline_fix}
    folder = Path(resolve_path(data.glue_dir))
    paths = {split: folder / name for split, name in task.files.items()}
    missing = [str(paths[split]) for split in ("train", "validation") if not paths[split].is_file()]
    if missing:
        raise ConfigError(
            f"{', '.join(missing)} not found: --data.glue_dir must be the {task.folder} folder of the GLUE data "
            f"(with {', '.join(task.files.values())})"
        )
    data.dataset_name = data.dataset_config = None
    data.train_file, data.validation_file = str(paths["train"]), str(paths["validation"])
    data.test_file = str(paths["test"]) if paths["test"].is_file() else None
    data.text_columns, data.label_column = list(task.text_columns), task.label_column
    extra = {split: str(path) for split, path in paths.items() if split not in FILES}
    return {
        "extra_files": extra,
        "column_names": {"train": task.headerless, "validation": task.headerless}
        if task.headerless
        else None,
        "int_label_names": task.labels,
    }

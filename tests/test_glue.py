"""GLUE presets (`finetune/classify.py --data.glue_task NAME`) and the suite runner (`finetune/glue.py`), on small
files synthesised here in each task's real layout (as in the GLUE zips: CoLA without a header line, MRPC's
`Quality #1 ID ...` with a byte-order mark, MNLI's matched and mismatched dev files, unlabelled test files), and
on stand-ins for the Hub dataset nyu-mll/glue (no network here)."""

import json
import random
from types import SimpleNamespace

import pytest
import torch
from kiln_testing import reset_accelerate

from finetune.glue_tasks import GLUE_TASKS

WORDS = {
    0: ["bad", "awful", "sad", "cruel"],
    1: ["good", "great", "happy", "kind"],
    2: ["blue", "green", "red"],
}
SUBJECTS = ["the day", "the man", "her house", "the story", "his friend", "the night"]
MNLI_COLUMNS = "index promptID pairID genre sentence1_binary_parse sentence2_binary_parse sentence1_parse sentence2_parse"


def tsv_label(task, y: int, rng):
    """The label as the task's TSV files write it, for class y."""
    if task.name == "stsb":
        return f"{5.0 * y / 2 + rng.uniform(0, 0.5):.3f}"  # scores 0-5
    if task.name in ("mnli", "qnli", "rte"):
        return task.labels[y]
    return str(y)  # CoLA, SST-2, MRPC (Quality), QQP (is_duplicate), WNLI: ids


def layout(name: str):
    """(header of train/dev or None, row(i, a, b, label), header of test, test row(i, a, b)) of a task."""
    pair_index = (
        "index\tsentence1\tsentence2\tlabel",
        lambda i, a, b, y: [str(i), a, b, y],
        "index\tsentence1\tsentence2",
        lambda i, a, b: [str(i), a, b],
    )
    mnli_parses = lambda i, a, b: [str(i), str(i), f"{i}e", "fiction", a, b, a, b, a, b]  # noqa: E731
    return {
        "cola": (
            None,
            lambda i, a, b, y: ["gj04", y, "" if y == "1" else "*", a],
            "index\tsentence",
            lambda i, a, b: [str(i), a],
        ),
        "sst2": (
            "sentence\tlabel",
            lambda i, a, b, y: [a + " ", y],
            "index\tsentence",
            lambda i, a, b: [str(i), a],
        ),
        "mrpc": (
            "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String",
            lambda i, a, b, y: [y, str(i), str(i + 1), a, b],
            "index\t#1 ID\t#2 ID\t#1 String\t#2 String",
            lambda i, a, b: [str(i), str(i), str(i + 1), a, b],
        ),
        "qqp": (
            "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
            lambda i, a, b, y: [str(i), str(2 * i), str(2 * i + 1), a + "?", b + "?", y],
            "id\tquestion1\tquestion2",
            lambda i, a, b: [str(i), a + "?", b + "?"],
        ),
        "stsb": (
            "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore",
            lambda i, a, b, y: [
                str(i),
                "main-captions",
                "MSRvid",
                "2012test",
                str(i),
                "none",
                "none",
                a,
                b,
                y,
            ],
            "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2",
            lambda i, a, b: [str(i), "main-news", "MSRvid", "2012test", str(i), "none", "none", a, b],
        ),
        "mnli": (
            "\t".join([*MNLI_COLUMNS.split(), "sentence1", "sentence2", "label1", "gold_label"]),
            lambda i, a, b, y: [*mnli_parses(i, a, b), y, y],
            "\t".join([*MNLI_COLUMNS.split(), "sentence1", "sentence2"]),
            mnli_parses,
        ),
        "qnli": (
            "index\tquestion\tsentence\tlabel",
            lambda i, a, b, y: [str(i), a + "?", b, y],
            "index\tquestion\tsentence",
            lambda i, a, b: [str(i), a + "?", b],
        ),
        "rte": pair_index,
        "wnli": pair_index,
    }[name]


MNLI_DEV_HEADER = "\t".join(
    [*MNLI_COLUMNS.split(), "sentence1", "sentence2", *(f"label{i}" for i in range(1, 6)), "gold_label"]
)


def write_task(folder, name: str, sizes=None, seed=0) -> dict:
    """The task's files in `folder`, in the GLUE distribution's layout; returns the rows written per split
    as (text_a, text_b, label as written)."""
    task = GLUE_TASKS[name]
    rng = random.Random(seed)
    classes = len(task.labels) if task.labels else 3
    header, row, test_header, test_row = layout(name)
    folder.mkdir(parents=True, exist_ok=True)
    sizes = sizes or {"train": 32, "validation": 16, "validation_mismatched": 12, "test": 8}
    written = {}
    for split, file_name in task.files.items():
        lines, rows = [], []
        for i in range(sizes[split]):
            y = rng.randrange(classes)
            a = f"{rng.choice(SUBJECTS)} was {rng.choice(WORDS[y])}"
            b = f"{rng.choice(SUBJECTS)} is {rng.choice(WORDS[y])}" + (
                " too" if split == "validation_mismatched" else ""
            )
            label = tsv_label(task, y, rng)
            rows.append((a, b, label))
            if split == "test":
                lines.append("\t".join(test_row(i, a, b)))
            elif name == "mnli" and split != "train":  # dev files have five annotator labels
                lines.append("\t".join([*row(i, a, b, label)[:-2], *[label] * 5, label]))
            else:
                lines.append("\t".join(row(i, a, b, label)))
        top = (
            test_header
            if split == "test"
            else MNLI_DEV_HEADER
            if name == "mnli" and split != "train"
            else header
        )
        (folder / file_name).write_text(
            "".join(f"{line}\n" for line in ([top] if top else []) + lines), "utf-8"
        )
        written[split] = rows
    return written


def preset(name, glue_dir=None):
    """The data section classify.py would have after the preset, and the loader options it returns."""
    from finetune.glue_tasks import apply_preset

    data = SimpleNamespace(
        glue_task=name,
        glue_dir=None if glue_dir is None else str(glue_dir),
        dataset_name=None,
        dataset_config=None,
        train_file="x.csv",
        validation_file="y.csv",
        test_file="z.csv",
        text_columns=None,
        label_column="label",
        label_list=None,
    )
    training = SimpleNamespace(metric_for_best_model=None, greater_is_better=True)
    options = apply_preset(data, training)
    return data, training, options


def load(data, options):
    from finetune.data import load_classification_data

    return load_classification_data(
        dataset_name=data.dataset_name,
        dataset_config=data.dataset_config,
        train_file=data.train_file,
        validation_file=data.validation_file,
        test_file=data.test_file,
        text_columns=data.text_columns,
        label_column=data.label_column,
        label_list=data.label_list,
        **options,
    )


# ----------------------------------------------------------------------------------------------------------
# presets: every task's files read as written


@pytest.mark.parametrize("name", list(GLUE_TASKS))
def test_every_preset_reads_its_tasks_tsv_layout(tmp_path, name):
    task = GLUE_TASKS[name]
    written = write_task(tmp_path / task.folder, name)
    data, training, options = preset(name, tmp_path / task.folder)
    dataset = load(data, options)

    expected_splits = {"train", "validation", "test"} | (
        {"validation_mismatched"} if name == "mnli" else set()
    )
    assert set(dataset) == expected_splits
    assert training.metric_for_best_model == task.score[0][1]
    for split, rows in written.items():
        part = dataset[split]
        assert len(part) == len(rows), split  # no data row taken for a header, no header taken for data
        first_a, first_b, first_label = rows[0]
        assert part[0]["text"].strip() == first_a + ("?" if name in ("qqp", "qnli") else "")
        if name not in ("cola", "sst2"):
            assert part[0]["text_pair"].strip().startswith(first_b.split(" is ")[0])
        else:
            assert "text_pair" not in part.column_names
        if split == "test":
            assert "label" not in part.column_names  # GLUE's test sets are unlabelled: predicted, not scored
        elif task.labels is None:
            assert part[0]["label"] == pytest.approx(float(first_label))
        else:  # names, whatever the file wrote (ids for CoLA, SST-2, MRPC, QQP, WNLI)
            names = task.labels
            assert part[0]["label"] == (first_label if first_label in names else names[int(first_label)])
            assert set(part["label"]) <= set(names)


def test_the_label_set_keeps_glues_order_so_binary_f1_scores_the_positive_class():
    from datasets import Dataset, DatasetDict

    from finetune.classify import choose_labels

    dataset = DatasetDict(train=Dataset.from_dict({"label": ["equivalent", "not_equivalent"]}))
    data = SimpleNamespace(label_list=["not_equivalent", "equivalent"])
    model = SimpleNamespace(checkpoint="x", reset_head=False)
    labels, _ = choose_labels(
        dataset, data, SimpleNamespace(architectures=["KilnEncoderForPreTraining"]), model, False
    )
    assert labels.names == {0: "not_equivalent", 1: "equivalent"}
    # without a label list: sorted, as before
    labels, _ = choose_labels(
        dataset, SimpleNamespace(label_list=None), SimpleNamespace(architectures=[]), model, False
    )
    assert labels.names == {0: "equivalent", 1: "not_equivalent"}


class FakeHub:
    """Stands in for `datasets.load_dataset("nyu-mll/glue", task)`: the Hub's splits, columns and features
    (ClassLabel names, float STS-B scores, -1 for the unlabelled test sets)."""

    def __init__(self):
        self.calls = []

    def __call__(self, name, config):
        from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

        self.calls.append((name, config))
        task = GLUE_TASKS[config]
        a, b = task.hub_text_columns if len(task.hub_text_columns) == 2 else (*task.hub_text_columns, None)
        label = Value("float32") if task.labels is None else ClassLabel(names=list(task.labels))
        columns = {
            a: Value("string"),
            **({b: Value("string")} if b else {}),
            "label": label,
            "idx": Value("int32"),
        }
        splits = (
            ["train", "validation_matched", "validation_mismatched", "test_matched", "test_mismatched"]
            if (config == "mnli")
            else ["train", "validation", "test"]
        )

        def rows(split, n=6):
            values = {a: [f"{split} a {i}" for i in range(n)], "idx": list(range(n))}
            if b:
                values[b] = [f"{split} b {i}" for i in range(n)]
            unlabelled = split.startswith("test")
            if task.labels is None:
                values["label"] = [-1.0 if unlabelled else i * 0.8 for i in range(n)]
            else:
                values["label"] = [-1 if unlabelled else i % len(task.labels) for i in range(n)]
            return Dataset.from_dict(values, features=Features(columns))

        return DatasetDict({split: rows(split) for split in splits})


@pytest.mark.parametrize("name", ["mnli", "stsb", "mrpc"])
def test_without_a_glue_dir_the_preset_reads_the_hub_dataset(monkeypatch, name):
    import finetune.data

    hub = FakeHub()
    monkeypatch.setattr(finetune.data, "load_dataset", hub)
    data, _, options = preset(name)
    dataset = load(data, options)
    assert hub.calls == [("nyu-mll/glue", name)]
    assert data.dataset_name == "nyu-mll/glue" and data.train_file is None
    if name == "mnli":
        assert set(dataset) == {"train", "validation", "validation_mismatched", "test"}
        assert dataset["validation"][0]["text"] == "validation_matched a 0"
        assert dataset["validation_mismatched"][0]["text_pair"] == "validation_mismatched b 0"
        assert dataset["test"][0]["text"] == "test_matched a 0"
    assert "label" not in dataset["test"].column_names  # -1 placeholders dropped, also STS-B's float ones
    if name == "stsb":
        assert dataset["validation"]["label"] == pytest.approx([i * 0.8 for i in range(6)])
    else:
        assert set(dataset["train"]["label"]) <= set(GLUE_TASKS[name].labels)


def test_a_wrong_glue_task_or_folder_is_a_one_line_error(tmp_path):
    from kiln.errors import ConfigError

    with pytest.raises(ConfigError, match="'sst' is not a GLUE task; choose one of: cola, sst2"):
        preset("sst")
    write_task(tmp_path / "SST-2", "sst2")
    with pytest.raises(
        ConfigError, match="dev_matched.tsv not found: --data.glue_dir must be the MNLI folder"
    ):
        preset("mnli", tmp_path / "SST-2")


# ----------------------------------------------------------------------------------------------------------
# the suite end to end


def predict(final, rows):
    """The final model's predictions for (a, b) rows: label names, or scores for regression."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(final).eval()
    tokenizer = AutoTokenizer.from_pretrained(final)
    batch = tokenizer([a for a, _, _ in rows], [b for _, b, _ in rows], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
    if model.config.num_labels == 1:
        return logits.squeeze(-1).tolist()
    return [model.config.id2label[i] for i in logits.argmax(-1).tolist()]


def test_glue_runs_all_nine_tasks_and_writes_the_table_score_and_cards(kiln_checkpoints, tmp_path):
    import shutil

    from scipy.stats import pearsonr
    from sklearn.metrics import f1_score

    from finetune.glue import main

    encoder = shutil.copytree(kiln_checkpoints[0], tmp_path / "encoder")  # its card gets the table too
    glue_dir, out = tmp_path / "glue_data", tmp_path / "glue"
    written = {  # SST-2 in a folder named after the task (sst2/), as ../shared/data/sst2; the rest as in the zips
        name: write_task(glue_dir / (name if name == "sst2" else task.folder), name, seed=i)
        for i, (name, task) in enumerate(GLUE_TASKS.items())
    }
    reset_accelerate()
    summary = main(
        [
            "--checkpoint",
            str(encoder),
            "--glue-dir",
            str(glue_dir),
            "--output-dir",
            str(out),
            "--update-checkpoint-card",
            "--",
            "--training.max_steps",
            "2",
            "--training.per_device_train_batch_size",
            "16",
            "--logging.logging_steps",
            "1",
            "--data.truncation",
            "quiet",
        ]
    )

    # every task ran through classify.py with its preset
    evals = {name: json.loads((out / name / "eval_results.json").read_text()) for name in GLUE_TASKS}
    configs = {name: json.loads((out / name / "final" / "config.json").read_text()) for name in GLUE_TASKS}
    for name, task in GLUE_TASKS.items():
        if task.labels is None:
            assert configs[name]["problem_type"] == "regression" and len(configs[name]["id2label"]) == 1
        else:
            assert configs[name]["id2label"] == {str(i): label for i, label in enumerate(task.labels)}
        test_rows = (out / name / "predictions_test.jsonl").read_text().splitlines()
        assert len(test_rows) == len(written[name]["test"])
    assert set(evals["mnli"]) == {"validation", "validation_mismatched"}
    assert set(evals["cola"]) == {"validation"} and "matthews_correlation" in evals["cola"]["validation"]

    # the scores are those of the exported models, recomputed here from their predictions
    mismatched = written["mnli"]["validation_mismatched"]
    predicted = predict(out / "mnli" / "final", mismatched)
    accuracy = sum(p == label for p, (_, _, label) in zip(predicted, mismatched)) / len(mismatched)
    assert evals["mnli"]["validation_mismatched"]["accuracy"] == pytest.approx(accuracy)
    dev = written["stsb"]["validation"]
    scores = predict(out / "stsb" / "final", dev)
    assert evals["stsb"]["validation"]["pearson"] == pytest.approx(
        pearsonr([float(y) for *_, y in dev], scores)[0], abs=1e-4
    )
    dev = written["mrpc"]["validation"]
    names = predict(out / "mrpc" / "final", dev)
    f1 = f1_score(
        [GLUE_TASKS["mrpc"].labels[int(y)] for *_, y in dev], names, pos_label="equivalent", zero_division=0
    )
    assert evals["mrpc"]["validation"]["f1"] == pytest.approx(f1)

    # task scores as GLUE defines them, and the GLUE score as their mean
    def metric(name, split, key):
        return 100 * evals[name][split][key]

    expected = {
        "cola": metric("cola", "validation", "matthews_correlation"),
        "mrpc": (metric("mrpc", "validation", "f1") + metric("mrpc", "validation", "accuracy")) / 2,
        "qqp": (metric("qqp", "validation", "f1") + metric("qqp", "validation", "accuracy")) / 2,
        "stsb": (metric("stsb", "validation", "pearson") + metric("stsb", "validation", "spearmanr")) / 2,
        "mnli": (
            metric("mnli", "validation", "accuracy") + metric("mnli", "validation_mismatched", "accuracy")
        )
        / 2,
        **{name: metric(name, "validation", "accuracy") for name in ("sst2", "qnli", "rte", "wnli")},
    }
    assert {name: row["score"] for name, row in summary["tasks"].items()} == pytest.approx(expected, abs=0.01)
    assert summary["glue_score"] == pytest.approx(sum(expected.values()) / 9, abs=0.01)
    assert summary["complete"] is True
    assert json.loads((out / "glue_results.json").read_text()) == summary

    table = (out / "glue_results.md").read_text()
    for task in GLUE_TASKS.values():
        assert f"| {task.folder} |" in table
    assert (
        f"| **GLUE score** | mean of the task scores (all 9 tasks) | **{summary['glue_score']:.1f}** |"
        in table
    )
    assert "accuracy matched / mismatched" in table and "| MRPC | F1 / accuracy |" in table
    cards = [out / name / "final" / "README.md" for name in GLUE_TASKS] + [encoder / "README.md"]
    for path in cards:  # every task's model card and the checkpoint's carry the table; Usage stays last
        card = path.read_text()
        assert f"## GLUE\n\n{table}" in card and card.index("## GLUE") < card.index("## Usage")


def test_a_partial_suite_says_so_and_a_new_table_replaces_the_old_one(tmp_path):
    from finetune.glue import add_to_card, markdown_table, results

    runs = {
        "rte": {"validation": {"accuracy": 0.5}},
        "stsb": {"validation": {"pearson": 0.2, "spearmanr": 0.4}},
    }
    summary = results("my/encoder", runs)
    assert summary["tasks"]["stsb"] == {
        "score": 30.0,
        "metrics": {"validation/pearson": 20.0, "validation/spearmanr": 40.0},
    }
    assert summary["glue_score"] == 40.0 and summary["complete"] is False
    table = markdown_table(summary)
    assert "| STS-B | Pearson / Spearman | 20.0 / 40.0 (30.0) |" in table
    assert "| **GLUE score** | mean of the task scores (2 of 9 tasks) | **40.0** |" in table

    card = tmp_path / "README.md"
    card.write_text("# model\n\n## Results\n\nx\n\n## Usage\n\ncode\n")
    add_to_card(card, "old table\n")
    add_to_card(card, table)
    text = card.read_text()
    assert "old table" not in text and text.count("## GLUE") == 1
    assert text.index("## Results") < text.index("## GLUE") < text.index("## Usage") and text.endswith(
        "code\n"
    )


@pytest.mark.slow
def test_glue_runs_with_no_arguments_from_the_hub_and_the_default_checkpoint(kiln_checkpoints, tmp_path, hub):
    """`python finetune/glue.py`, nothing else: the nine tasks from the Hub dataset nyu-mll/glue (here the test Hub
    serves it in the Hub's layout: a folder of parquet files per config, declared in the card) and the encoder
    `accelerate launch pretrain/run.py` leaves in runs/encoder-tiny/final."""
    import io
    import os
    import shutil
    import subprocess
    import sys

    from datasets import concatenate_datasets
    from huggingface_hub import CommitOperationAdd, HfApi
    from kiln_testing import REPO

    fake, files, card = FakeHub(), {}, ["---", "configs:"]
    for name in GLUE_TASKS:
        card += [f"- config_name: {name}", "  data_files:"]
        for split, dataset in fake("nyu-mll/glue", name).items():
            if split == "train":  # one batch of the default size (32) at least
                dataset = concatenate_datasets([dataset] * 6)
            buffer = io.BytesIO()
            dataset.to_parquet(buffer)
            files[f"{name}/{split}-00000-of-00001.parquet"] = buffer.getvalue()
            card += [f"  - split: {split}", f"    path: {name}/{split}-*"]
    files["README.md"] = "\n".join([*card, "---", ""]).encode()
    api = HfApi()
    api.create_repo("nyu-mll/glue", repo_type="dataset")
    api.create_commit(
        "nyu-mll/glue",
        repo_type="dataset",
        commit_message="glue",
        operations=[CommitOperationAdd(path, data) for path, data in files.items()],
    )
    shutil.copytree(kiln_checkpoints[0], tmp_path / "runs" / "encoder-tiny" / "final")

    env = {**os.environ, "HF_HOME": str(tmp_path / "hf-home"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(REPO / "finetune" / "glue.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr.strip().splitlines()[-5:]
    summary = json.loads((tmp_path / "runs" / "glue" / "glue_results.json").read_text())
    assert summary["complete"] and set(summary["tasks"]) == set(GLUE_TASKS)
    assert summary["checkpoint"] == "runs/encoder-tiny/final"
    assert "GLUE score" in (tmp_path / "runs" / "glue" / "glue_results.md").read_text()


def test_a_preset_writes_to_its_own_folder_unless_one_is_given():
    """`--data.glue_task mrpc` and `--data.glue_task stsb` write to runs/glue/mrpc and runs/glue/stsb, not both into
    the authorship default (where the second would refuse to mix two runs); a chosen folder is kept."""
    from finetune.classify import TASK

    assert TASK.parse([]).training.output_dir == "runs/classify-authorship"
    for name in ("mrpc", "stsb"):
        assert TASK.parse(["--data.glue_task", name]).training.output_dir == f"runs/glue/{name}"
    chosen = TASK.parse(["--data.glue_task", "mrpc", "--training.output_dir", "runs/mine"])
    assert chosen.training.output_dir == "runs/mine"
    sst2 = TASK.parse(["--config", "configs/finetune/classify-sst2.yaml", "--data.glue_task", "sst2"])
    assert sst2.training.output_dir == "runs/classify-sst2"  # the config's own folder

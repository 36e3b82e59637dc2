"""Task-adaptive pretraining: continue pretraining an encoder on a fine-tuning task's own training text, then
fine-tune the adapted encoder (Gururangan et al. 2020, "Don't Stop Pretraining").

accelerate launch finetune/adapt.py --task classify --task_config configs/finetune/classify-sst2.yaml \\
    --model.init_from runs/encoder-tiny/final --training.max_steps 2000 --training.output_dir runs/sst2-adapted
accelerate launch finetune/classify.py --config configs/finetune/classify-sst2.yaml \\
    --model.checkpoint runs/sst2-adapted/final
"""

from __future__ import annotations

import hashlib
import os
import sys

if __package__ in (None, ""):  # run as a script (accelerate launch finetune/adapt.py): import the packages
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from pathlib import Path  # noqa: E402

from kiln.errors import ConfigError  # noqa: E402

DESCRIPTION = """Task-adaptive pretraining: continue pretraining a Kiln encoder (--model.init_from: a runs/.../final
folder or a Hub id) with masked-language modelling on the training text of a fine-tuning task, then fine-tune the
adapted encoder (--model.checkpoint OUTPUT_DIR/final) with the task's own script. The task's data is read by the
task's own reader from --task_config (the fine-tuning script's YAML; default: the script's shipped sample), the
training split only: its text columns (classify: text and text pair; tag: the words; seq2seq: the source side),
one document per example; labels are not read and the validation and test splits never are.

The run is an ordinary pretraining run through the same engine (its own checkpoints, exact resume with
--training.resume_from_checkpoint latest, final/ with a model card naming the start checkpoint and the task text)
and takes every pretraining option (python pretrain/run.py --help). Defaults that differ from pretraining's:
tokenizer.name_or_path = model.init_from (the checkpoint's own vocabulary), model.objective = mlm (task examples
are single sentences: no sentence pairs to learn from), data.document_separator = line.

Options of this command:
  --task {classify,tag,seq2seq}   the fine-tuning script whose data is read (required)
  --task_config FILE              that script's YAML config (its data section names the training data)
  --task_data.KEY VALUE           overrides of the task's data section (e.g. --task_data.train_file x.tsv)

Guide: docs/finetuning.md (Task-adaptive pretraining)."""

TASKS = ("classify", "tag", "seq2seq")

ADAPT_OPTIONS = (
    (
        "--task NAME",
        "str",
        "required",
        "the fine-tuning script whose training text is read: classify, tag or seq2seq",
    ),
    (
        "--task_config FILE",
        "str",
        None,
        "that script's YAML config; its data section names the training data "
        "(default: the script's shipped sample)",
    ),
    (
        "--task_data.KEY VALUE",
        "str",
        None,
        "an override of the task config's data section, e.g. --task_data.train_file reviews.csv",
    ),
)
"""The options of `finetune/adapt.py` besides pretraining's: (flag, type, default, meaning)."""

TASK_TEXT = "(the task's training text)"
"""What --print_config shows as data.data_files: the file is written when the run starts."""


def _task(name: str):
    if name == "classify":
        from finetune.classify import TASK
    elif name == "tag":
        from finetune.tag import TASK
    elif name == "seq2seq":
        from finetune.seq2seq import TASK
    else:
        raise ConfigError(f"--task {name!r} is unknown; use one of {', '.join(TASKS)}")
    return TASK


def split_arguments(argv: list[str]) -> tuple[str, list[str], list[str]]:
    """(task name, the task config's argv, pretraining's argv) from this command's argv."""
    task, task_argv, rest, i = None, [], [], 0
    while i < len(argv):
        key, eq, inline = argv[i].partition("=")
        if key in ("--task", "--task_config") or key.startswith("--task_data."):
            if not eq and i + 1 >= len(argv):
                raise ConfigError(f"{key} needs a value")
            value = inline if eq else argv[i + 1]
            i += 1 if eq else 2
            if key == "--task":
                task = value
            elif key == "--task_config":
                task_argv = ["--config", value, *task_argv]
            else:
                task_argv += [f"--data.{key[len('--task_data.') :]}", value]
            continue
        rest.append(argv[i])
        i += 1
    return task, task_argv, rest


def example_text(row: dict) -> str:
    """One document per training example: its text columns as the task's reader normalised them."""
    if "text" in row:  # classify: text, and text_pair for sentence pairs
        return " ".join(str(part) for part in (row["text"], row.get("text_pair")) if part)
    if "tokens" in row:  # tag: the words of the sentence
        return " ".join(row["tokens"])
    if "source" in row:  # seq2seq: the encoder's side
        source = row["source"]
        return " ".join(source) if isinstance(source, list) else str(source)
    raise ConfigError(f"the task's training split has no text column Kiln knows (columns: {', '.join(row)})")


def task_training_text(task_name: str, task_argv: list[str], checkpoint: str) -> tuple[list[str], list[str]]:
    """(the documents, the data's public names) of the task's training split, read by the task's own reader with
    only the training file given: validation and test files are never opened, labels never used."""
    from finetune.common import dataset_names, quiet_libraries

    task = _task(task_name)
    config = task.parse([*task_argv, "--model.checkpoint", checkpoint])
    data = config.data
    quiet_libraries()
    if not data.dataset_name and not data.train_file:
        raise ConfigError("the task config names no training data (--data.train_file or --data.dataset_name)")
    from kiln.config import resolve_path

    files = {
        "train_file": None if data.dataset_name else resolve_path(data.train_file),
        "validation_file": None,
        "test_file": None,
    }
    dataset = task.read(config, files, task.start(config))
    # a Hub dataset brings its own dev and test splits: only its train split is read; from local files only the
    # training file was given, so every split the reader made (a held-out share of it) is training text
    splits = ["train"] if data.dataset_name else [name for name in dataset if name != "test"]
    documents = []
    for name in splits:
        rows = dataset[name]
        if data.max_train_samples is not None and name == "train":
            rows = rows.select(range(min(data.max_train_samples, len(rows))))
        documents += [text for text in (example_text(row) for row in rows) if text.strip()]
    if not documents:
        raise ConfigError("the task's training split has no text to adapt to")
    names = (
        [name for name in dataset_names(data) if name] if data.dataset_name else [Path(data.train_file).name]
    )
    return documents, names


def write_task_text(documents: list[str], name: str, cache_dir: str | None) -> Path:
    """The documents as one text file (one per line), named by the task data and stored under a folder named by
    its content: the same task text is the same file, so a resumed run finds its data unchanged."""
    text = "".join(" ".join(doc.split()) + "\n" for doc in documents)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    if cache_dir is None:
        import datasets

        cache_dir = datasets.config.HF_DATASETS_CACHE
    folder = Path(cache_dir) / "kiln-task-text" / digest
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{name}-train-text.txt"
    if not target.is_file() or target.stat().st_size != len(text.encode("utf-8")):
        partial = target.with_name(f".{target.name}.tmp-{os.getpid()}")  # every process writes the same bytes
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, target)
    return target


def main(argv: list[str] | None = None):
    from kiln.config import _walk_fields, build_config, parse_overrides
    from pretrain.config import RunConfig
    from pretrain.run import run_pretraining

    argv = list(sys.argv[1:] if argv is None else argv)
    task_name, task_argv, argv = split_arguments(argv)
    print_config = "--print_config" in argv
    argv = [arg for arg in argv if arg != "--print_config"]
    config = build_config(
        RunConfig, argv, prog="accelerate launch finetune/adapt.py", description=DESCRIPTION
    )
    _, nested = parse_overrides(argv, {key for key, tp, _, _ in _walk_fields(RunConfig) if tp is bool})
    given = {
        f"{section}.{key}" for section, values in nested.items() if isinstance(values, dict) for key in values
    }
    if task_name is None and not print_config:
        raise ConfigError(
            f"--task is required: the fine-tuning script whose training text to adapt to ({', '.join(TASKS)})"
        )
    if not config.model.init_from and not print_config:
        raise ConfigError(
            "--model.init_from is required: the pretrained encoder to adapt (e.g. runs/encoder-tiny/final)"
        )
    if config.model.kind != "encoder":
        raise ConfigError("task-adaptive pretraining adapts an encoder; set --model.kind encoder")
    for key in ("data.data_files", "data.dataset_name", "data.prepared", "data.validation_files"):
        if key in given:
            raise ConfigError(
                f"--{key} is not for finetune/adapt.py: the data is the task's training text "
                "(--task_config, --task_data.KEY)"
            )
    # a --config YAML's corpus is replaced by the task text
    config.data.dataset_name = config.data.prepared = None
    config.data.validation_files = []
    if "tokenizer.name_or_path" not in given:
        config.tokenizer.name_or_path = config.model.init_from
    if "model.objective" not in given:
        config.model.objective = "mlm"
    if "data.document_separator" not in given:
        config.data.document_separator = "line"
    if print_config:
        from kiln.config import config_yaml

        config.data.data_files = [TASK_TEXT]
        print(config_yaml(config, None), end="")
        raise SystemExit(0)
    from pretrain.run import check_init_from

    # the start model through the model gate under this command's own option, before the task's text is read
    check_init_from(config.model)
    documents, names = task_training_text(task_name, task_argv, config.model.init_from)
    name = Path(str(names[0])).name.replace("/", "-") if names else task_name
    config.data.data_files = [str(write_task_text(documents, name, config.data.cache_dir))]
    summary = {  # the start checkpoint is named by pretraining's "initialised from" row
        "task-adaptive pretraining": f"{task_name} training split of {', '.join(map(str, names))} "
        f"({len(documents):,} examples, labels unused)",
    }
    return run_pretraining(config, card_summary=summary)


if __name__ == "__main__":
    from finetune.common import run_finetune_cli

    run_finetune_cli(main)

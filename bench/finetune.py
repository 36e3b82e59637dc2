"""Fine-tuning on real SST-2: Kiln's finetune/classify.py against transformers' Trainer, same start, same settings.

    python bench/finetune.py --json bench/results/finetune-sst2.json
    python bench/finetune.py --rounds 2 -- --training.group_by_length true     # Kiln options after `--`

Both sides start from the same weights: a BertForSequenceClassification (2 labels, head included) is built from
a seed and saved, then converted with `pretrain.convert.from_transformers` and saved as a Kiln checkpoint; the
WordPiece tokenizer (`pretrain.data.tokenizer.train_tokenizer`, trained on the subset's sentences) is saved with
both. Before training, both models must give the same logits on the first dev sentences.

- Kiln: `finetune.classify.main` (the script's own machinery: data loading, tokenization, collator, the shared
  accelerate loop) with `--config configs/finetune/offline/classify-sst2.yaml` (local files), evaluation only after training, and any
  options given after `--` (e.g. `--training.group_by_length true`). Training examples/s = examples trained /
  the loop's `train_time_s`; dev accuracy from its final evaluation.
- transformers: `Trainer` + `BertForSequenceClassification` with the same batch size, learning rate, epochs,
  seed, linear schedule with the same warmup share, weight decay, Adam betas/epsilon, gradient clipping and
  maximum length, `DataCollatorWithPadding`, no evaluation during training; its other settings are its defaults
  (fused AdamW, random sampler). Examples/s = examples trained / `train_runtime`; dev accuracy from
  `Trainer.predict`.

Rounds alternate the two (Kiln first in odd rounds) in one process; the speed-up is the median over rounds of
the paired examples/s ratio (Kiln / transformers), which cancels slow drifts of the machine's load.

`--task conll2003` does the same for token classification: `finetune/tag.py` (`configs/finetune/offline/tag-conll2003.yaml`)
against `Trainer` + `BertForTokenClassification` on the first `--train-samples` CoNLL-2003 training sentences
(research-only data, read from `--conll2003`, copied only into a temporary folder), both tokenized with
`finetune.data.tokenize_and_align` (first piece of each word labelled) and scored with the same seqeval entity F1
on the dev sentences (the transformers model's piece predictions are mapped to words as tag.py maps Kiln's).

Ablations: `--variant NAME='OPTIONS'` (repeatable) adds a Kiln run with OPTIONS appended to the Kiln options in
every round (e.g. `--variant padded='--model.unpad_inputs false'`), reported under `variants` with its own paired
speed-up. The JSON file is rewritten after every run, so a benchmark cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # python bench/finetune.py: import the repository's packages
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import transformers  # noqa: E402

from bench.machine import cpu_name  # noqa: E402

SHARED_DATA = REPO.parent / "shared" / "data"  # ../shared/data, resolved against the repository root
DEFAULT_SST2 = Path(os.environ.get("KILN_SST2", SHARED_DATA / "sst2"))
DEFAULT_CONLL = Path(os.environ.get("KILN_CONLL2003", SHARED_DATA / "conll2003"))
SHAPES = {  # layers, hidden, heads
    "test": (1, 32, 2),
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "base": (12, 768, 12),
}
# Kiln's fine-tuning defaults that the transformers side is given too (finetune.common.finetune_training and
# kiln.config.TrainingConfig); batch size, lr, epochs and seed come from the command line
MATCHED = dict(weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.98, adam_epsilon=1e-6, max_grad_norm=1.0)
WARMUP_RATIO = 0.1


def portable(value: str, work: Path | None = None) -> str:
    """A path or option as a result JSON records it: the run's temporary folder as `$WORK`, files of the
    repository and beside it (`../shared/data`) relative to the repository root, so a record names no machine's
    folders."""
    if work is not None and (value == str(work) or value.startswith(str(work) + os.sep)):
        return "$WORK" + value[len(str(work)) :]
    for root in (REPO, REPO.parent):
        if root != Path(root.anchor) and (value == str(root) or value.startswith(str(root) + os.sep)):
            return os.path.relpath(value, REPO)
    return value


def read_tsv(path: Path, limit: int | None = None) -> list[dict]:
    with open(path, newline="") as file:
        rows = list(csv.DictReader(file, delimiter="\t", quoting=csv.QUOTE_NONE))
    return rows[:limit] if limit else rows


def write_tsv(rows: list[dict], path: Path) -> Path:
    with open(path, "w") as file:
        file.write("sentence\tlabel\n")
        for row in rows:
            file.write(f"{row['sentence']}\t{row['label']}\n")
    return path


def reset_accelerate() -> None:
    """accelerate keeps process-wide singletons; each in-process run must start from a clean state."""
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    PartialState._reset_state()


# ------------------------------------------------------------------------------------------------ the start
def prepare_start(work: Path, args) -> dict:
    """Subset files, tokenizer, and the same initial weights saved for transformers and for Kiln."""
    if args.task == "conll2003":
        return prepare_tagging(work, args)
    from pretrain.data.tokenizer import train_tokenizer

    train_rows = read_tsv(args.sst2 / "train.tsv", args.train_samples)
    dev_rows = read_tsv(args.sst2 / "dev.tsv", args.eval_samples)
    files = {"train": write_tsv(train_rows, work / "train.tsv"), "dev": write_tsv(dev_rows, work / "dev.tsv")}
    tokenizer = train_tokenizer([row["sentence"] for row in train_rows], "wordpiece", args.vocab_size)
    reference, kiln, folders = save_start(
        work, args, tokenizer, transformers.BertForSequenceClassification, {0: "0", 1: "1"}
    )
    check = same_start(reference, kiln, tokenizer, [row["sentence"] for row in dev_rows[:64]])
    return {
        "files": files,
        "folders": folders,
        "tokenizer": tokenizer,
        "check": check,
        "train_rows": len(train_rows),
        "dev_rows": len(dev_rows),
    }


def save_start(work: Path, args, tokenizer, model_class, id2label: dict) -> tuple:
    """The seeded transformers model of the benchmark's shape and its Kiln conversion, both saved with the
    tokenizer: (reference, kiln, folders), the models in eval mode."""
    from pretrain.convert import from_transformers

    layers, hidden, heads = SHAPES[args.shape]
    torch.manual_seed(args.seed)
    config = transformers.BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        num_labels=len(id2label),
        id2label=id2label,
        label2id={name: i for i, name in id2label.items()},
    )
    reference = model_class(config)
    kiln = from_transformers(reference)
    folders = {"reference": work / "start-transformers", "kiln": work / "start-kiln"}
    for name, model in (("reference", reference), ("kiln", kiln)):
        model.save_pretrained(folders[name])
        tokenizer.save_pretrained(folders[name])
    return reference.eval(), kiln.eval(), folders


def same_start(
    reference, kiln, tokenizer, texts: list, atol: float = 1e-4, max_length: int = 128, **encode
) -> dict:
    """Refuse two starts that are not the same function: their logits on `texts` (at the real tokens, for token
    classification) must agree within `atol`. `encode` goes to the tokenizer (e.g. is_split_into_words)."""
    batch = tokenizer(
        texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt", **encode
    )
    with torch.no_grad():
        a, b = reference(**batch).logits, kiln(**batch).logits
    if a.dim() == 3:  # per token: padded positions are not compared
        a, b = a[batch["attention_mask"] == 1], b[batch["attention_mask"] == 1]
    difference = (a - b).abs().max().item()
    if difference > atol:
        raise SystemExit(
            f"the starting models differ (max |logit difference| {difference:.2e}): not the same function"
        )
    return {"max_logit_diff": difference, "sentences": len(texts)}


# ------------------------------------------------------------------------------------------------- the runs
def run_kiln(start: dict, work: Path, args, extra: list[str]) -> dict:
    """The task's own Kiln script (classify.py for SST-2, tag.py for CoNLL-2003) through its main(), in this
    process, with the benchmark's settings."""
    from finetune import classify, tag

    script, config = (
        (tag, "offline/tag-conll2003.yaml")
        if args.task == "conll2003"
        else (classify, "offline/classify-sst2.yaml")
    )  # the configs on local files: the benchmark's subsets replace their paths
    out = work / "kiln-run"
    argv = [
        "--config",
        str(REPO / "configs/finetune" / config),
        "--model.checkpoint",
        str(start["folders"]["kiln"]),
        "--data.train_file",
        str(start["files"]["train"]),
        "--data.validation_file",
        str(start["files"]["dev"]),
        "--data.test_file",
        "none",
        "--data.max_seq_length",
        str(args.max_length),
        "--training.output_dir",
        str(out),
        "--training.overwrite_output_dir",
        "true",
        "--training.per_device_train_batch_size",
        str(args.batch_size),
        "--training.per_device_eval_batch_size",
        str(args.eval_batch_size),
        "--training.lr",
        str(args.lr),
        "--training.num_train_epochs",
        str(args.epochs),
        "--training.seed",
        str(args.seed),
        "--training.warmup_ratio",
        str(WARMUP_RATIO),
        "--training.eval_steps",
        "0",
        "--eval.each_epoch",
        "false",
        "--logging.logging_steps",
        "50",
        *extra,
    ]
    reset_accelerate()
    try:
        result = script.main(argv)
    finally:
        reset_accelerate()
    state = result.state
    last_eval = [entry for entry in state.history if any(key.startswith("eval/") for key in entry)][-1]
    trained = min(state.global_step * args.batch_size, start["train_rows"] * args.epochs)
    shutil.rmtree(out, ignore_errors=True)
    scores = {"dev_accuracy": last_eval["eval/accuracy"]}
    if args.task == "conll2003":
        scores = {
            "dev_f1": last_eval["eval/f1"],
            "dev_accuracy": last_eval.get("eval/accuracy", last_eval["eval/f1"]),
        }
    return {
        "train_time_s": state.train_time_s,
        "examples_trained": trained,
        "examples_per_s": trained / state.train_time_s,
        "tokens_seen": state.tokens_seen,
        "optimizer_steps": state.global_step,
        **scores,
        "dev_loss": last_eval.get("eval/loss"),
        "argv": [portable(arg, work) for arg in argv],
    }


def run_reference(start: dict, work: Path, args) -> dict:
    from datasets import Dataset

    if args.task == "conll2003":
        return run_reference_tagging(start, work, args)

    tokenizer = start["tokenizer"]

    def encode(path: Path) -> Dataset:
        rows = read_tsv(path)
        encoding = tokenizer([r["sentence"] for r in rows], truncation=True, max_length=args.max_length)
        return Dataset.from_dict({**encoding, "labels": [int(r["label"]) for r in rows]})

    train, dev = encode(start["files"]["train"]), encode(start["files"]["dev"])
    model = transformers.BertForSequenceClassification.from_pretrained(start["folders"]["reference"])
    steps = -(-len(train) // args.batch_size) * args.epochs
    reset_accelerate()  # TrainingArguments builds accelerate's state afresh
    training_args = transformers.TrainingArguments(
        output_dir=str(work / "transformers-run"),
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.eval_batch_size,
        learning_rate=args.lr,
        num_train_epochs=args.epochs,
        seed=args.seed,
        lr_scheduler_type="linear",
        warmup_steps=round(WARMUP_RATIO * steps),
        eval_strategy="no",
        save_strategy="no",
        logging_steps=50,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        train_sampling_strategy="group_by_length" if args.reference_group_by_length else "random",
        **MATCHED,
    )
    trainer = transformers.Trainer(
        model=model,
        args=training_args,
        train_dataset=train,
        data_collator=transformers.DataCollatorWithPadding(tokenizer),
    )
    try:
        output = trainer.train()
        start_eval = time.perf_counter()
        predictions = trainer.predict(dev)
        eval_time = time.perf_counter() - start_eval
    finally:
        reset_accelerate()
    accuracy = float((predictions.predictions.argmax(-1) == predictions.label_ids).mean())
    shutil.rmtree(work / "transformers-run", ignore_errors=True)
    trained = len(train) * args.epochs
    return {
        "train_time_s": output.metrics["train_runtime"],
        "examples_trained": trained,
        "examples_per_s": trained / output.metrics["train_runtime"],
        "optimizer_steps": output.global_step,
        "dev_accuracy": accuracy,
        "dev_loss": predictions.metrics.get("test_loss"),
        "eval_time_s": eval_time,
        "optim": str(training_args.optim),
    }


# ------------------------------------------------------------------------------------------ token classification
def prepare_tagging(work: Path, args) -> dict:
    """CoNLL-2003 subsets as JSON lines (tokens, tags), a WordPiece tokenizer, the same start for both sides."""
    from finetune.data import build_label_maps, load_tagging_data
    from pretrain.data.tokenizer import train_tokenizer

    data = load_tagging_data(
        train_file=str(args.conll2003 / "train.txt"),
        validation_file=str(args.conll2003 / "valid.txt"),
        tag_column=-1,
    )
    train = data["train"].select(range(min(args.train_samples, len(data["train"]))))
    dev = data["validation"]
    if args.eval_samples:
        dev = dev.select(range(min(args.eval_samples, len(dev))))
    files = {"train": work / "train.jsonl", "dev": work / "dev.jsonl"}
    for split, path in ((train, files["train"]), (dev, files["dev"])):
        with open(path, "w") as file:
            for row in split:
                file.write(json.dumps({"tokens": row["tokens"], "tags": row["tags"]}) + "\n")
    label2id, id2label = build_label_maps(train["tags"])  # what tag.py builds from the same training tags
    tokenizer = train_tokenizer([" ".join(row) for row in train["tokens"]], "wordpiece", args.vocab_size)
    reference, kiln, folders = save_start(
        work,
        args,
        tokenizer,
        transformers.BertForTokenClassification,
        {i: str(n) for i, n in id2label.items()},
    )
    check = same_start(
        reference,
        kiln,
        tokenizer,
        [list(t) for t in dev["tokens"][:64]],
        max_length=args.max_length,
        is_split_into_words=True,
    )
    return {
        "files": files,
        "folders": folders,
        "tokenizer": tokenizer,
        "label2id": label2id,
        "id2label": id2label,
        "dev": {"tokens": [list(t) for t in dev["tokens"]], "tags": [list(t) for t in dev["tags"]]},
        "check": check,
        "train_rows": len(train),
        "dev_rows": len(dev),
    }


def run_reference_tagging(start: dict, work: Path, args) -> dict:
    from datasets import Dataset

    from finetune.data import b_to_i_map, tokenize_and_align, words_from_predictions
    from finetune.metrics import load_metric

    tokenizer, label2id, id2label = start["tokenizer"], start["label2id"], start["id2label"]
    b_to_i = b_to_i_map(label2id)

    def encode(split) -> tuple[Dataset, list]:
        rows = {
            "tokens": list(split["tokens"]),
            "tags": [[label2id[t] for t in tags] for tags in split["tags"]],
        }
        encoding = tokenize_and_align(
            rows, tokenizer, False, args.max_length, b_to_i=b_to_i, return_word_ids=True
        )
        word_ids = encoding.pop("word_ids")
        return Dataset.from_dict(dict(encoding)), word_ids

    with open(start["files"]["train"]) as file:
        train_rows = [json.loads(line) for line in file]
    train, _ = encode({"tokens": [r["tokens"] for r in train_rows], "tags": [r["tags"] for r in train_rows]})
    dev, dev_word_ids = encode(start["dev"])
    model = transformers.BertForTokenClassification.from_pretrained(start["folders"]["reference"])
    steps = -(-len(train) // args.batch_size) * args.epochs
    reset_accelerate()
    training_args = transformers.TrainingArguments(
        output_dir=str(work / "transformers-run"),
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.eval_batch_size,
        learning_rate=args.lr,
        num_train_epochs=args.epochs,
        seed=args.seed,
        lr_scheduler_type="linear",
        warmup_steps=round(WARMUP_RATIO * steps),
        eval_strategy="no",
        save_strategy="no",
        logging_steps=50,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        train_sampling_strategy="group_by_length" if args.reference_group_by_length else "random",
        **MATCHED,
    )
    trainer = transformers.Trainer(
        model=model,
        args=training_args,
        train_dataset=train,
        data_collator=transformers.DataCollatorForTokenClassification(tokenizer),
    )
    try:
        output = trainer.train()
        start_eval = time.perf_counter()
        predictions = trainer.predict(dev)
        eval_time = time.perf_counter() - start_eval
    finally:
        reset_accelerate()
    pieces = predictions.predictions.argmax(-1)
    predicted = [
        [id2label[i] for i in words_from_predictions(row.tolist(), word_ids)]
        for row, word_ids in zip(pieces, dev_word_ids)
    ]
    references = [tags[: len(p)] for tags, p in zip(start["dev"]["tags"], predicted)]
    scores = load_metric("seqeval_tags").compute(predictions=predicted, references=references)
    shutil.rmtree(work / "transformers-run", ignore_errors=True)
    trained = len(train) * args.epochs
    return {
        "train_time_s": output.metrics["train_runtime"],
        "examples_trained": trained,
        "examples_per_s": trained / output.metrics["train_runtime"],
        "optimizer_steps": output.global_step,
        "dev_f1": scores["f1"],
        "dev_accuracy": scores.get("accuracy", scores["f1"]),
        "dev_loss": predictions.metrics.get("test_loss"),
        "eval_time_s": eval_time,
        "optim": str(training_args.optim),
    }


def run(args, kiln_extra: list[str], on_run=None) -> dict:
    torch.set_num_threads(args.threads or torch.get_num_threads())
    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory(prefix="kiln-bench-finetune-") as tmp:
        work = Path(tmp)
        start = prepare_start(work, args)
        print(f"same start: {start['check']}", flush=True)
        variants = dict(parse_variant(text) for text in args.variant)
        rounds = {"kiln": [], "reference": [], **{name: [] for name in variants}}
        load = [os.getloadavg()[0]]
        names = list(rounds)
        for index in range(args.rounds):
            shift = index % len(names)  # each side takes each slot in turn
            for name in names[shift:] + names[:shift]:
                if name == "reference":
                    result = run_reference(start, work, args)
                else:
                    result = run_kiln(start, work, args, kiln_extra + variants.get(name, []))
                rounds[name].append(result)
                load.append(os.getloadavg()[0])
                print(
                    f"round {index + 1}/{args.rounds} {name}: {result['examples_per_s']:.1f} examples/s "
                    f"({result['train_time_s']:.1f}s), dev {metric_name(result)} {dev_metric(result):.4f}  "
                    f"(load {load[-1]:.2f})",
                    flush=True,
                )
                if on_run is not None:  # after every run: a benchmark cut short keeps what it measured
                    on_run(report(args, start, kiln_extra, variants, rounds, load))
    return report(args, start, kiln_extra, variants, rounds, load)


def metric_name(result: dict) -> str:
    return "entity F1" if "dev_f1" in result else "accuracy"


def dev_metric(result: dict) -> float:
    return result.get("dev_f1", result["dev_accuracy"])


def parse_variant(text: str) -> tuple[str, list[str]]:
    name, _, options = text.partition("=")
    if not name or name in ("kiln", "reference"):
        raise SystemExit(f"--variant wants NAME='OPTIONS' with a new name, got {text!r}")
    return name, shlex.split(options)


def paired_speedups(runs: list[dict], reference: list[dict]) -> list[float]:
    return [k["examples_per_s"] / r["examples_per_s"] for k, r in zip(runs, reference)]


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def report(args, start: dict, kiln_extra: list[str], variants: dict, rounds: dict, load: list[float]) -> dict:
    paired = paired_speedups(rounds["kiln"], rounds["reference"])
    layers, hidden, heads = SHAPES[args.shape]
    return {
        "task": args.task,
        "shape": {
            "name": args.shape,
            "layers": layers,
            "hidden": hidden,
            "heads": heads,
            "vocab": len(start["tokenizer"]),
        },
        "data": {
            "train_examples": start["train_rows"],
            "dev_examples": start["dev_rows"],
            "source": portable(str((args.conll2003 if args.task == "conll2003" else args.sst2).resolve())),
        },
        "settings": {
            "batch_size": args.batch_size,
            "lr": args.lr,
            "epochs": args.epochs,
            "seed": args.seed,
            "max_length": args.max_length,
            "warmup_ratio": WARMUP_RATIO,
            **MATCHED,
            "kiln_options": [portable(option) for option in kiln_extra],
            "reference_group_by_length": args.reference_group_by_length,
        },
        "check": start["check"],
        "kiln": rounds["kiln"],
        "reference": rounds["reference"],
        "speedup": median_or_none(paired),
        "speedup_rounds": paired,
        "rounds_done": min(len(runs) for runs in rounds.values()),
        "variants": {
            name: {
                "options": kiln_extra + options,
                "runs": rounds[name],
                "speedup": median_or_none(paired_speedups(rounds[name], rounds["reference"])),
                "speedup_rounds": paired_speedups(rounds[name], rounds["reference"]),
            }
            for name, options in variants.items()
        },
        "load_average": load,
        "machine": {
            "cpu": cpu_name(),
            "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
    }


def print_report(report: dict) -> None:
    print(f"\n{'':<14} {'examples/s (median)':>20} {'dev accuracy per round':>30}")
    for name, label in (("kiln", "Kiln"), ("reference", "transformers")):
        runs = report[name]
        rate = statistics.median(r["examples_per_s"] for r in runs)
        accuracy = ", ".join(f"{dev_metric(r):.4f}" for r in runs)
        print(f"{label:<14} {rate:>20.1f} {accuracy:>30}")
    loads = report["load_average"]
    for name, variant in report["variants"].items():
        rate = statistics.median(r["examples_per_s"] for r in variant["runs"])
        accuracy = ", ".join(f"{dev_metric(r):.4f}" for r in variant["runs"])
        print(f"{name:<14} {rate:>20.1f} {accuracy:>30}   speed-up {variant['speedup']:.2f}")
    print(
        f"speed-up (median of paired Kiln/transformers examples/s): {report['speedup']:.2f} "
        f"(rounds: {', '.join(f'{x:.2f}' for x in report['speedup_rounds'])}); "
        f"{report['machine']['cpu']}, {report['machine']['threads']} threads, load {min(loads):.1f}-{max(loads):.1f}"
    )


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    kiln_extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Options after `--` go to finetune/classify.py unchanged.",
    )
    parser.add_argument("--shape", choices=sorted(SHAPES), default="mini")
    parser.add_argument("--train-samples", type=int, default=8000, help="first N SST-2 training sentences")
    parser.add_argument("--eval-samples", type=int, help="first N dev sentences (default: all 872)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--eval-batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=1, help="alternating Kiln/transformers runs")
    parser.add_argument(
        "--reference-group-by-length", action="store_true", help="transformers' length-grouped sampler"
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME='OPTIONS'",
        help="an extra Kiln run per round with these options appended (ablations); repeatable",
    )
    parser.add_argument("--threads", type=int)
    parser.add_argument("--task", choices=["sst2", "conll2003"], default="sst2")
    parser.add_argument("--sst2", type=Path, default=DEFAULT_SST2)
    parser.add_argument(
        "--conll2003", type=Path, default=DEFAULT_CONLL, help="folder with train.txt, valid.txt"
    )
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    def write(result: dict) -> None:
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as file:
                json.dump(result, file, indent=1)

    result = run(args, kiln_extra, on_run=write)
    print_report(result)
    write(result)
    if args.json:
        print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main()

"""Summarise docs/results/runs.jsonl into docs/results/finetune.md and docs/results/finetune.json: per task,
starting point ("scratch", or the pretraining run the checkpoint came from), learning rate and epochs, the dev metric over
seeds (mean, std, n), the median wall clock, and the test metric of runs that read the test file (their
test_results.json, or a --predict pass recorded with tag `<task>-test`).

    python experiments/summarize.py
"""

import json
import statistics
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
METRIC = {"sst2": "eval/accuracy", "ud-pos": "eval/accuracy", "conll2003": "eval/f1", "multi30k": "eval/bleu"}
TEST_METRIC = {"sst2": "accuracy", "ud-pos": "accuracy", "conll2003": "f1", "multi30k": "bleu"}
PERCENT = {"sst2": 100, "ud-pos": 100, "conll2003": 100, "multi30k": 1}  # sacreBLEU is already on a 0-100 scale


# Scratch runs take only the shape and tokenizer from their checkpoint; those made from these folders form the first
# baseline (commits up to 79a2f1b), and those made from a later pretraining run's folder are kept apart, as a
# baseline re-measured on that later code (e.g. "scratch (encoder-30min-sop30)").
FIRST_SCRATCH_SHAPES = {"encoder-30min", "encoder-30min-shape"}


def start(note: list[str]) -> str:
    """'scratch', or the pretraining run a fine-tuning run started from (ckpt=runs/NAME/final -> NAME; a seq2seq
    run that names its decoder, dec=runs/DEC/final: 'NAME + DEC')."""
    ckpt = next((word.split("=", 1)[1] for word in note if word.startswith("ckpt=")), "")
    parts = Path(ckpt).parts
    name = parts[1] if len(parts) > 2 and parts[0] == "runs" else note[1]
    decoder = next((word.split("=", 1)[1] for word in note if word.startswith("dec=")), "")
    if decoder:  # seq2seq runs that name their decoder: encoder + decoder run
        parts = Path(decoder).parts
        name += f" + {parts[1] if len(parts) > 2 and parts[0] == 'runs' else decoder}"
    if note[1] == "scratch":
        return "scratch" if name in FIRST_SCRATCH_SHAPES or name == "scratch" else f"scratch ({name})"
    return name


def epochs(row: dict) -> str:
    """The fine-tuning epochs a run was given (its saved config), '' when the record has none."""
    value = row.get("config", {}).get("training", {}).get("num_train_epochs")
    return "" if value is None else f"{value:g}"


def main() -> None:
    rows = [json.loads(line) for line in (REPO / "docs/results/runs.jsonl").read_text().splitlines() if line.strip()]
    groups = defaultdict(list)
    tests = defaultdict(list)
    for row in rows:
        tag = row["tag"]
        if tag in METRIC and "eval_last" in row:
            note = row["note"].split()
            key = (tag, start(note), note[2].split("=")[1], epochs(row))
            groups[key].append(row)
            if "test" in row:
                tests[key].append(row["test"][TEST_METRIC[tag]])
        elif tag.endswith("-test") and "test" in row:
            task = tag.removesuffix("-test")
            note = row["note"].split()
            tests[(task, start(note), note[2].split("=")[1], epochs(row))].append(row["test"][TEST_METRIC[task]])
    summary = []
    for (task, init, lr, n_epochs), runs in sorted(groups.items()):
        runs = list({r["note"].split()[3]: r for r in runs}.values())  # a seed run again: its newest record counts
        values = [r["eval_last"][METRIC[task]] for r in runs]
        seeds = [r["note"].split()[3] for r in runs]
        entry = {
            "task": task, "init": init, "lr": lr, "epochs": n_epochs, "n": len(values), "seeds": seeds,
            "dev_mean": statistics.mean(values), "dev_std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "dev_values": values, "wall_s_median": statistics.median(r["wall_s"] for r in runs),
            "commits": sorted({r["commit"] for r in runs}),
        }
        if (task, init, lr, n_epochs) in tests:
            t = tests[(task, init, lr, n_epochs)]
            entry.update(test_mean=statistics.mean(t), test_std=statistics.stdev(t) if len(t) > 1 else 0.0, test_n=len(t))
        summary.append(entry)
    (REPO / "docs/results/finetune.json").write_text(json.dumps(summary, indent=2))
    lines = ["| task | init | lr | epochs | seeds | dev (mean ± std) | test (mean ± std) | median wall clock |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for e in summary:
        k = PERCENT[e["task"]]
        test = f"{k * e['test_mean']:.2f} ± {k * e['test_std']:.2f} (n={e['test_n']})" if "test_mean" in e else ""
        lines.append(f"| {e['task']} | {e['init']} | {e['lr']} | {e['epochs']} | {e['n']} | {k * e['dev_mean']:.2f} ± "
                     f"{k * e['dev_std']:.2f} | {test} | {e['wall_s_median'] / 60:.1f} min |")
    (REPO / "docs/results/finetune.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

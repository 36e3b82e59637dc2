"""GLUE: the nine task presets `finetune/classify.py --data.glue_task NAME` uses, and the suite runner.

python finetune/glue.py                          # all nine, from the Hub, starting from runs/encoder-tiny/final
python finetune/glue.py --checkpoint you/kiln-encoder --glue-dir glue_data --tasks cola mrpc stsb \\
    -- --training.num_train_epochs 3 --training.lr 1e-4       # after --: options for every classify run

Each task runs through the same entry as `accelerate launch finetune/classify.py --data.glue_task NAME
--data.glue_dir DIR` (in this process, one after the other; `accelerate launch finetune/glue.py ...` spreads
every run over the processes), into OUTPUT_DIR/<task>/. The runner then writes OUTPUT_DIR/glue_results.md and
glue_results.json: each task's GLUE score on its dev set (the final model's) and the GLUE score, the mean of
the task scores, and puts the same table into every task's model card.

A task's score is GLUE's: the mean of its metrics (MRPC and QQP: F1 and accuracy; STS-B: Pearson and Spearman
correlation; MNLI: accuracy on the matched and on the mismatched dev set), x 100. GLUE's test sets have no
public labels: their predictions are written (predictions_test.jsonl) for the GLUE server, and not scored.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script (python finetune/glue.py): import the packages
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from finetune.glue_tasks import GLUE_TASKS, GlueTask  # noqa: E402 (after the sys.path set-up)
from kiln.cli import add_print_config, answer_print_config  # noqa: E402

# ----------------------------------------------------------------------------------------------------------
# scores and the results table


def task_score(task: GlueTask, eval_metrics: dict[str, dict[str, float]]) -> float:
    """The task's GLUE score (x 100): the mean of its metrics on its dev set(s)."""
    values = [eval_metrics[split][metric] for split, metric in task.score]
    return 100 * sum(values) / len(values)


def results(checkpoint: str, runs: dict[str, dict[str, dict[str, float]]]) -> dict:
    """The suite's results: per task its score and metrics, and the GLUE score over the tasks run."""
    tasks = {
        name: {
            "score": round(task_score(GLUE_TASKS[name], metrics), 2),
            "metrics": {
                f"{split}/{metric}": round(100 * metrics[split][metric], 2)
                for split, metric in GLUE_TASKS[name].score
            },
        }
        for name, metrics in runs.items()
    }
    glue = sum(row["score"] for row in tasks.values()) / len(tasks)
    return {
        "checkpoint": checkpoint,
        "tasks": tasks,
        "glue_score": round(glue, 2),
        "complete": len(tasks) == 9,
    }


def markdown_table(summary: dict) -> str:
    lines = [
        f"GLUE dev-set results of `{summary['checkpoint']}` (finetune/glue.py; scores x 100):",
        "",
        "| task | metric | score |",
        "|---|---|---:|",
    ]
    for name, row in summary["tasks"].items():
        task = GLUE_TASKS[name]
        parts = " / ".join(f"{value:.1f}" for value in row["metrics"].values())
        shown = f"{parts} ({row['score']:.1f})" if len(row["metrics"]) > 1 else f"{row['score']:.1f}"
        lines.append(f"| {task.folder} | {task.label_text()} | {shown} |")
    scope = "all 9 tasks" if summary["complete"] else f"{len(summary['tasks'])} of 9 tasks"
    lines.append(f"| **GLUE score** | mean of the task scores ({scope}) | **{summary['glue_score']:.1f}** |")
    return "\n".join(lines) + "\n"


def add_to_card(card: Path, table: str) -> None:
    """Put the table into a model card as its `## GLUE` section (replacing an older one), before Usage; never
    written through a link at the card (`kiln.safe_write`: refused in one line)."""
    from kiln.safe_write import refuse_link, write_file

    refuse_link(card)  # before it is read: a link's target is neither read into the card nor replaced
    text = card.read_text(encoding="utf-8") if card.is_file() else ""
    if "\n## GLUE\n" in text:
        head, rest = text.split("\n## GLUE\n", 1)
        tail = rest[rest.index("\n## ") :] if "\n## " in rest else "\n"
        text = head + tail
    section = f"## GLUE\n\n{table}\n"
    if "## Usage" in text:
        at = text.index("## Usage")
        text = text[:at] + section + text[at:]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    write_file(card, text)


# ----------------------------------------------------------------------------------------------------------
# the runner


DESCRIPTION = """Fine-tune and score a Kiln encoder on the nine GLUE tasks: each task runs through finetune/classify.py
with its --data.glue_task preset, into OUTPUT_DIR/<task>/, and the runner writes OUTPUT_DIR/glue_results.md and
glue_results.json (each task's GLUE score on its dev set, and the GLUE score, their mean). The data comes from the
Hub dataset nyu-mll/glue (downloaded on first use), or from the GLUE distribution's folders with --glue-dir.
Options after -- go to every classify run (e.g. -- --training.lr 1e-4 --training.num_train_epochs 3).
Guide: docs/finetuning.md; every option: docs/configuration.md."""


def glue_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python finetune/glue.py",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--checkpoint",
        default="runs/encoder-tiny/final",
        help="pretrained encoder: a local final/ folder or Hub id (default: runs/encoder-tiny/final, "
        "written by `accelerate launch pretrain/run.py`)",
    )
    parser.add_argument(
        "--tasks",
        nargs="+",
        default=list(GLUE_TASKS),
        choices=list(GLUE_TASKS),
        metavar="TASK",
        help=f"tasks to run (default: all nine: {' '.join(GLUE_TASKS)})",
    )
    parser.add_argument(
        "--glue-dir",
        help="folder of the GLUE data (CoLA/, SST-2/, ... or cola/, sst2/, ...; "
        "default: the Hub dataset nyu-mll/glue)",
    )
    parser.add_argument("--output-dir", default="runs/glue", help="each task runs in OUTPUT_DIR/<task>")
    parser.add_argument(
        "--update-checkpoint-card",
        action="store_true",
        help="also put the results into the checkpoint's own README.md (a local folder)",
    )
    add_print_config(parser)
    return parser


def parse_args(argv: list[str] | None):
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    args = glue_parser().parse_args(own)
    answer_print_config(args, classify_options=overrides)
    return args, overrides


def task_folder(glue_dir: str, task: GlueTask) -> str:
    for name in (task.folder, task.name):
        if (Path(glue_dir) / name).is_dir():
            return str(Path(glue_dir) / name)
    from kiln.errors import ConfigError

    raise ConfigError(f"no {task.folder}/ (or {task.name}/) folder in {glue_dir}")


def run_classify(args: list[str]):
    """One `finetune/classify.py` run in this process; accelerate's process-wide state is reset around it."""
    from accelerate.state import AcceleratorState, GradientState

    from finetune.classify import main as classify

    def reset():
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()

    reset()
    try:
        return classify(args)
    finally:
        reset()


def main(argv: list[str] | None = None) -> dict:
    args, overrides = parse_args(argv)
    from finetune.classify import ClassifyConfig
    from finetune.common import resolve_start_model
    from kiln.config import build_config

    # the options every classify run gets (their ranges among them) checked once, before the first task starts
    build_config(ClassifyConfig, overrides, prog="python finetune/glue.py ... --")

    # the model gate once, under GLUE's own option name, before any task's data is read or folder written
    resolve_start_model(args.checkpoint, "--checkpoint", ("kiln_encoder",))
    out = Path(args.output_dir)
    runs, finals = {}, []
    for name in args.tasks:
        task = GLUE_TASKS[name]
        source = ["--data.glue_dir", task_folder(args.glue_dir, task)] if args.glue_dir else []
        result = run_classify(
            [
                "--data.glue_task",
                name,
                "--model.checkpoint",
                args.checkpoint,
                "--training.output_dir",
                str(out / name),
                *source,
                *overrides,
            ]
        )
        if result.final_dir is None:  # stopped by a signal: its checkpoint is saved, the suite stops here
            break
        runs[name] = result.eval_metrics
        finals.append(result.final_dir)
    if not runs:
        return {}
    summary = results(args.checkpoint, runs)
    table = markdown_table(summary)
    from accelerate import PartialState

    if PartialState().is_main_process:
        from kiln.safe_write import make_folder, write_file

        # the tasks' run folders are in `out`, so the results are written file by file, not as a staged folder:
        # each never through a link (a link at either name, or at `out`, is refused in one line)
        make_folder(out)
        write_file(out / "glue_results.json", json.dumps(summary, indent=2))
        write_file(out / "glue_results.md", table)
        cards = [Path(final) / "README.md" for final in finals]
        if args.update_checkpoint_card and Path(args.checkpoint).is_dir():
            cards.append(Path(args.checkpoint) / "README.md")
        for card in cards:
            add_to_card(card, table)
        print(table)
    return summary


if __name__ == "__main__":
    from finetune.common import run_finetune_cli

    run_finetune_cli(main)

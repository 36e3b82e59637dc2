"""Loss against wall clock for pretraining runs: train MLM loss (and eval MLM loss) from output_dir/metrics.jsonl,
placed on the time axis by the tqdm progress lines of the run's log (step -> elapsed seconds of the loop).

    python experiments/plot_pretraining.py --png docs/encoder-30min-loss.png runs/encoder-30min:runs/logs/encoder-30min.log [more RUN:LOG ...]
"""

import argparse
import json
import math
import re
from pathlib import Path

PROGRESS = re.compile(r"train:\s+\d+%\|[^|]*\|\s*(\d+)/\d+ \[(?:(\d+):)?(\d+):(\d+)<")


def step_times(log: Path) -> dict[int, float]:
    times = {}
    for piece in log.read_text(errors="replace").replace("\r", "\n").split("\n"):
        m = PROGRESS.search(piece)
        if m:
            step, h, mnt, s = int(m.group(1)), int(m.group(2) or 0), int(m.group(3)), int(m.group(4))
            times.setdefault(step, h * 3600 + mnt * 60 + s)
    return times


def series(run: Path, log: Path, key: str):
    times = step_times(log)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    points = []
    for row in rows:
        if key in row and row["step"] in times:
            points.append((times[row["step"]] / 60, row[key]))
    return points


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="+", help="RUN_DIR:LOG_FILE[:LABEL]")
    parser.add_argument("--png", required=True)
    parser.add_argument("--title", default="MLM loss against wall clock (2-core CPU, shared)")
    parser.add_argument(
        "--train-key", default="train/mlm_loss", help="metrics.jsonl key of the training curve"
    )
    parser.add_argument("--eval-key", default="eval/mlm_loss", help="metrics.jsonl key of the eval points")
    parser.add_argument("--ylabel", default="MLM cross-entropy")
    parser.add_argument(
        "--train-exp", action="store_true", help="plot exp(train value): a loss as a perplexity"
    )
    parser.add_argument("--log-y", action="store_true", help="logarithmic y axis (e.g. perplexity)")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for spec in args.runs:
        parts = spec.split(":")
        run, log = Path(parts[0]), Path(parts[1])
        label = parts[2] if len(parts) > 2 else run.name
        train = series(run, log, args.train_key)
        if args.train_exp:
            train = [(t, math.exp(v)) for t, v in train]
        evals = series(run, log, args.eval_key)
        line = ax.plot([t for t, _ in train], [v for _, v in train], lw=1, alpha=0.8, label=f"{label} train")[
            0
        ]
        if evals:
            ax.plot(
                [t for t, _ in evals],
                [v for _, v in evals],
                "o-",
                color=line.get_color(),
                label=f"{label} eval",
            )
    ax.set_xlabel("training-loop wall clock (minutes)")
    ax.set_ylabel(args.ylabel)
    if args.log_y:
        ax.set_yscale("log")
    ax.set_title(args.title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    Path(args.png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.png, dpi=110)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()

"""Append one measured run to docs/results/runs.jsonl: its name, the command line that made it, the git commit,
the best/last dev metrics from output_dir/metrics.jsonl, steps, tokens/s and wall clock.

    python experiments/record.py RUN_DIR --tag sweep-lr --wall 312.4 [--note "..."] [--file docs/results/runs.jsonl]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def summarise(run: Path) -> dict:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in rows if "train/loss" in r]
    evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
    out = {"steps": max((r["step"] for r in rows), default=0)}
    if train:
        rates = [r["train/tokens_per_s"] for r in train if "train/tokens_per_s" in r]
        out["train_loss_last"] = train[-1]["train/loss"]
        if rates:
            out["tokens_per_s_median"] = sorted(rates)[len(rates) // 2]
    if evals:
        out["eval_last"] = {k: v for k, v in evals[-1].items() if k.startswith("eval/")}
        for key in ("eval/accuracy", "eval/f1"):
            values = [r[key] for r in evals if key in r]
            if values:
                out[f"best_{key.split('/')[1]}"] = max(values)
    test = run / "test_results.json"
    if test.is_file():
        out["test"] = json.loads(test.read_text())
    config = run / "config.yaml"
    if config.is_file():
        out["config"] = yaml.safe_load(config.read_text())
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run")
    parser.add_argument("--tag", required=True)
    parser.add_argument("--wall", type=float, default=None, help="wall clock of the command, seconds")
    parser.add_argument("--note", default="")
    parser.add_argument("--command", default="")
    parser.add_argument("--file", default=str(REPO / "docs/results/runs.jsonl"))
    args = parser.parse_args()
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None
    row = {
        "tag": args.tag,
        "run": args.run,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit.stdout.strip(),
        "wall_s": args.wall,
        "loadavg_at_end": load,
        "command": args.command,
        "note": args.note,
        **summarise(Path(args.run)),
    }
    with open(args.file, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    shown = {k: v for k, v in row.items() if k not in ("config", "command")}
    print(json.dumps(shown))


if __name__ == "__main__":
    main()

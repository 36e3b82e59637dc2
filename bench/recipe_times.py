"""How long docs/recipes.md's training commands take: each recipe's first try run as the page gives it, on the text
the project ships, and the full run's time estimated from it: bench/results/recipe-times.json.

    python bench/recipe_times.py                      # the four first tries in page order (~10 minutes on 2 idle cores)
    python bench/recipe_times.py --quick --json quick.json   # a check: a few steps each, no measurement
    python bench/report.py --update docs/recipes.md

The page's commands are read from docs/recipes.md itself: every `kiln-launch` command whose `--training.output_dir`
ends in `-first-try` is a first try, and the command after it that writes to the same folder without that ending
is its full run. They run in page order in a fresh folder that holds the user's files the page names, made from the
samples in data/: `my-text/*.txt` are the six books of data/pretrain, `reviews.csv` is
data/finetune/authorship/train.csv (its `sentence` column named `text`), `ner.conll` is the UD English EWT sample's
training file as CoNLL (word and UPOS tag per line). The classifier's and the tagger's first tries start from the
encoder's first try, as on the page.

Per first try the record holds: its wall clock and CPU-seconds end to end, and its rate in optimizer steps per
second after warm-up, from the training progress bar's updates as they arrive (the first `WARMUP_STEPS` steps are not
timed: they allocate, start the data workers and warm the caches). The full run's time is an **estimate**: its
optimizer steps (the config's `max_steps`, or its epochs times the steps per epoch the first try printed) at the
first try's rate, plus the first try's time outside its timed steps (start-up, tokenizer, data, evaluation, saving).
And the machine (CPU model, cores, thread count), torch, the load average before and after, the commit and the date.
Measure on an otherwise idle machine. `--quick` runs a few steps each (a check of the script, not a measurement:
`bench/report.py` refuses its record).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import importlib
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # python bench/X.py, or loaded by path: import the repository's bench package
    sys.path.insert(0, str(REPO))

from bench.machine import children_cpu_seconds, load_average, run_stamp  # noqa: E402
from bench.pages import page_commands  # noqa: E402

# run as `python bench/recipe_times.py`, bench/ is on the path first, and its finetune.py would hide the finetune
# package whose task configs read the full runs' commands
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO))

PAGE = REPO / "docs/recipes.md"
KILN_LAUNCH = (sys.executable, "-m", "kiln.launcher")  # = `kiln-launch`
FIRST_TRY = "-first-try"
WARMUP_STEPS = 10
QUICK_STEPS, QUICK_WARMUP = 6, 2
LINKED = ("configs", "pretrain", "finetune", "kiln", "data")  # a checkout, as the page's commands expect it
UD_TRAIN = REPO / "data/finetune/ud-english-ewt/en_ewt-ud-train-sample.conllu.gz"
AUTHORSHIP_TRAIN = REPO / "data/finetune/authorship/train.csv"
PROGRESS = re.compile(
    r"\s*train[^:]*:\s*\d+%\|[^|]*\|\s*(\d+)/(\d+)\s"
)  # a tqdm bar: `train:  33%|███▎ | 2/6 [`


def _output_dir(words: list[str]) -> str | None:
    return words[words.index("--training.output_dir") + 1] if "--training.output_dir" in words else None


def recipes(page: Path = PAGE) -> list[dict]:
    """The page's (first try, full run) pairs in page order: name (the full run's folder, `runs/` dropped), both
    commands and the script."""
    commands = [shlex.split(c) for c in page_commands(page) if c.startswith("kiln-launch ")]
    pairs = []
    for i, words in enumerate(commands):
        out = _output_dir(words)
        if not out or not out.endswith(FIRST_TRY):
            continue
        full = next((w for w in commands[i + 1 :] if _output_dir(w) == out[: -len(FIRST_TRY)]), None)
        if full is None:
            raise SystemExit(f"error: {page}: the first try into {out} has no full run after it")
        script = next(w for w in words if w.endswith(".py"))
        pairs.append(
            {
                "name": Path(out[: -len(FIRST_TRY)]).name,
                "script": script,
                "first_try": shlex.join(words),
                "full": shlex.join(full),
            }
        )
    return pairs


def make_user_files(work: Path) -> dict[str, str]:
    """The user's files the page names, from the project's samples; what each one is."""
    for name in LINKED:
        (work / name).symlink_to(REPO / name, target_is_directory=True)
    books = sorted((REPO / "data/pretrain").glob("*.txt"))
    (work / "my-text").mkdir()
    for book in books:
        (work / "my-text" / book.name).symlink_to(book)
    with AUTHORSHIP_TRAIN.open(newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["sentence", "label"], rows[0]
    with (work / "reviews.csv").open("w", newline="") as fh:
        csv.writer(fh).writerows([["text", "label"], *rows[1:]])
    sentences, words = [], []
    with gzip.open(UD_TRAIN, "rt", encoding="utf-8") as fh:
        for line in fh:
            line = line.rstrip("\n")
            if not line:
                if words:
                    sentences.append("\n".join(words))
                words = []
            elif not line.startswith("#"):
                cols = line.split("\t")
                if cols[0].isdigit():  # not a multiword range (1-2) or an empty node (1.1)
                    words.append(f"{cols[1]} {cols[3]}")
    if words:
        sentences.append("\n".join(words))
    (work / "ner.conll").write_text("\n\n".join(sentences) + "\n")
    size = sum(book.stat().st_size for book in books)
    return {
        "my-text/*.txt": f"the {len(books)} books of data/pretrain ({size / 1e6:.1f} MB of text)",
        "reviews.csv": f"data/finetune/authorship/train.csv, its sentence column named text ({len(rows) - 1:,} rows)",
        "ner.conll": f"the UD English EWT sample's training file, word and UPOS tag per line ({len(sentences):,} "
        "sentences)",
    }


def launch_first_try(words: list[str], work: Path, log: Path) -> dict:
    """Run `kiln-launch ...` in `work`, its output to `log`; the wall clock, CPU-seconds and the progress bar's
    (seconds since start, step, total) updates as they arrived."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "PYTHONUNBUFFERED": "1",
    }
    cpu_before = children_cpu_seconds()
    start = time.perf_counter()
    process = subprocess.Popen(
        [*KILN_LAUNCH, *words[1:]], cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    updates, text, pending, counted = [], [], "", False
    while True:
        chunk = os.read(process.stdout.fileno(), 65536)
        if not chunk:
            break
        now = time.perf_counter() - start
        piece = chunk.decode(errors="replace")
        text.append(piece)
        parts = re.split(r"[\r\n]", pending + piece)  # tqdm redraws its bar after a carriage return
        for i, segment in enumerate(parts):
            found = PROGRESS.match(segment)
            if found and not (i == 0 and counted):  # the first part may be a bar already counted
                updates.append((round(now, 3), int(found.group(1)), int(found.group(2))))
        counted = bool(PROGRESS.match(parts[-1]))
        pending = parts[-1]
    process.wait()
    wall = time.perf_counter() - start
    cpu = children_cpu_seconds() - cpu_before
    output = "".join(text)
    log.write_text(output)
    if process.returncode != 0:
        tail_lines = "\n".join(output.replace("\r", "\n").splitlines()[-30:])
        raise SystemExit(
            f"error: `{shlex.join(words)}` failed ({process.returncode}); its log: {log}\n{tail_lines}"
        )
    return {"wall_s": wall, "cpu_s": cpu, "updates": updates, "output": output}


def timed_rate(updates: list[tuple[float, int, int]], warmup: int) -> tuple[int, float]:
    """(steps, seconds) between the first progress update at or past `warmup` steps and the last one."""
    timed = [(t, n) for t, n, _ in updates if n >= warmup]
    if len(timed) < 2 or timed[-1][1] <= timed[0][1]:
        raise SystemExit(
            f"error: too few progress updates after {warmup} steps to time the run: {updates[-5:]}"
        )
    (t0, n0), (t1, n1) = timed[0], timed[-1]
    return n1 - n0, t1 - t0


def full_steps(recipe: dict, output: str) -> dict:
    """The full run's optimizer steps, from its command's config and the first try's printed steps per epoch."""
    words = shlex.split(recipe["full"])
    script = words.index(recipe["script"])
    argv = words[script + 1 :]
    here = os.getcwd()
    os.chdir(REPO)  # the page's config paths are relative to a checkout
    try:
        if recipe["script"] == "pretrain/run.py":
            from kiln.config import build_config
            from pretrain.config import RunConfig

            training = build_config(RunConfig, argv).training
        else:
            task = importlib.import_module(f"finetune.{Path(recipe['script']).stem}").TASK
            training = task.parse(argv).training
    finally:
        os.chdir(here)
    per_epoch = re.search(r"\(([\d,]+) optimizer steps each\)", output)
    examples = re.search(r"examples = ([\d,]+)", output)
    facts = {
        "train_examples": int(examples.group(1).replace(",", "")) if examples else None,
        "steps_per_epoch": int(per_epoch.group(1).replace(",", "")) if per_epoch else None,
    }
    if training.max_steps > 0:
        return {**facts, "full_steps": training.max_steps, "full_steps_from": "max_steps"}
    if not per_epoch:
        raise SystemExit(f"error: the {recipe['name']} first try printed no steps per epoch")
    steps = math.ceil(training.num_train_epochs * facts["steps_per_epoch"])
    return {
        **facts,
        "full_steps": steps,
        "full_steps_from": f"{training.num_train_epochs:g} epochs",
        "epochs": training.num_train_epochs,
    }


def run_first_try(recipe: dict, work: Path, quick: bool) -> dict:
    words = shlex.split(recipe["first_try"])
    steps = int(words[words.index("--training.max_steps") + 1])
    warmup = WARMUP_STEPS
    if quick:
        words = [*words, "--training.max_steps", str(QUICK_STEPS)]
        steps, warmup = QUICK_STEPS, QUICK_WARMUP
    print(f"{recipe['name']}: {recipe['first_try']}{' (quick)' if quick else ''}", flush=True)
    done = launch_first_try(words, work, work / f"{recipe['name']}.log")
    timed_steps, timed_s = timed_rate(done["updates"], warmup)
    rate = timed_steps / timed_s
    if done["updates"][-1][1] != steps:
        raise SystemExit(
            f"error: the {recipe['name']} first try ended at step {done['updates'][-1][1]}, not {steps}"
        )
    outside = done["wall_s"] - steps / rate  # start-up, tokenizer, data, evaluation, saving
    full = full_steps(recipe, done["output"])
    threads = re.search(r"device = cpu, (\d+) threads? per process", done["output"])
    return {
        **recipe,
        "first_try_steps": steps,
        "first_try_wall_s": round(done["wall_s"], 1),
        "first_try_cpu_s": round(done["cpu_s"], 1),
        "threads": int(threads.group(1)) if threads else None,
        "warmup_steps": warmup,
        "timed_steps": timed_steps,
        "timed_s": round(timed_s, 2),
        "steps_per_s": round(rate, 4),
        "outside_steps_s": round(max(0.0, outside), 1),
        **full,
        "full_estimate_s": round(full["full_steps"] / rate + max(0.0, outside), 1),
    }


def measure(quick: bool, keep: Path | None = None) -> dict:
    import torch

    record = {
        "quick": quick,
        "page": "docs/recipes.md",
        **run_stamp(OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS")),
        "torch": torch.__version__,
        "estimate": "the full run's optimizer steps at the first try's rate after warm-up, plus the first try's time "
        "outside its timed steps",
        "load_average_before": load_average(),
    }
    with tempfile.TemporaryDirectory(prefix="kiln-recipe-times-") as tmp:
        work = keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        record["data"] = make_user_files(work)
        record["recipes"] = [run_first_try(recipe, work, quick) for recipe in recipes()]
    record["load_average_after"] = load_average()
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="the record (default: bench/results/recipe-times.json)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a few steps each: checks the script, measures nothing (needs --json)",
    )
    parser.add_argument(
        "--keep", type=Path, help="run in this new folder and keep it (default: a temporary one)"
    )
    args = parser.parse_args(argv)
    if args.quick and args.json is None:
        parser.error(
            "--quick measures nothing: give --json for its record (the default record is the measurement)"
        )
    if args.keep and args.keep.exists():
        parser.error(f"--keep {args.keep}: give a new folder")
    if not args.quick and load_average()[0] > 0.5:
        print(
            f"warning: the 1-minute load average is {load_average()[0]:.1f}: this record wants an idle machine"
        )
    record = measure(args.quick, args.keep)
    out = args.json or REPO / "bench/results/recipe-times.json"
    out.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    for r in record["recipes"]:
        print(
            f"{r['name']}: first try {r['first_try_wall_s']:.0f} s ({r['first_try_steps']} steps, "
            f"{r['steps_per_s']:.3f} steps/s after warm-up); full run about {r['full_estimate_s'] / 60:.0f} min "
            f"({r['full_steps']:,} steps)"
        )
    print(
        f"{out}: load average {record['load_average_before'][0]:.1f} -> {record['load_average_after'][0]:.1f}"
    )


if __name__ == "__main__":
    main()

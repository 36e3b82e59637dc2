"""Run the fine-tuning commands docs/finetuning.md lists and keep what they gave: bench/results/shipped-commands.json.

    python bench/shipped_commands.py                      # every row (about 25 minutes on 2 idle cores)
    python bench/shipped_commands.py --only classify,tag  # some rows (the record then holds only those)
    python bench/report.py --update docs/finetuning.md

Each command runs as the page gives it (`accelerate launch finetune/<script>.py ...`, in a fresh process) in a fresh
folder of its own, after the two pretraining commands the page documents above it (`accelerate launch
pretrain/run.py` and the decoder-tiny one), whose `runs/encoder-tiny` and `runs/decoder-tiny` every command's
folder sees. The rows on the full public sets read local copies in ../shared/data through
configs/finetune/offline/*.yaml; they are skipped, with a message, where that folder is absent.

The record holds, per row: the command as documented, the data it trained on (examples counted by the run
itself), the wall clock of the command, and the test metrics from the run's own test_results.json; and the
machine (CPU, cores, torch, load average at start and end, date, commit). `--quick` runs every command a few
steps on a few examples (a check that the script works, not a measurement; `bench/report.py` refuses its record).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # python bench/X.py, or loaded by path: import the repository's bench package
    sys.path.insert(0, str(REPO))

from bench.machine import load_average, run_stamp  # noqa: E402

SHARED_DATA = REPO.parent / "shared" / "data"  # what ../shared/data in the offline configs means
LAUNCH = (sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch")  # = `accelerate launch`


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    script: str  # relative to the repository
    args: tuple[str, ...] = ()
    needs: tuple[str, ...] = ("encoder",)  # the pretrained checkpoints the command starts from
    data: str = ""  # filled with {train} (examples the run counted), {labels}, {epochs}
    offline: bool = False  # reads ../shared/data through configs/finetune/offline/


ROWS = (
    Row("classify", "finetune/classify.py", data="{train:,} train sentences, {labels} authors"),
    Row(
        "classify-padded",
        "finetune/classify.py",
        ("--model.unpad_inputs", "false"),
        data="{train:,} train sentences, {labels} authors",
    ),
    Row("tag", "finetune/tag.py", data="{train:,} train sentences, {labels} UPOS tags"),
    Row("seq2seq", "finetune/seq2seq.py", needs=("encoder", "decoder"), data="{train:,} train abstracts"),
    Row(
        "seq2seq-scratch",
        "finetune/seq2seq.py",
        ("--model.from_scratch",),
        needs=("encoder", "decoder"),
        data="{train:,} train abstracts",
    ),
    Row(
        "sst2",
        "finetune/classify.py",
        ("--config", "configs/finetune/offline/classify-sst2.yaml", "--training.num_train_epochs", "1"),
        data="SST-2, {train_k}k sentences, labelled test file",
        offline=True,
    ),
    Row(
        "conll2003",
        "finetune/tag.py",
        ("--config", "configs/finetune/offline/tag-conll2003.yaml"),
        data="CoNLL-2003 NER, {train_k}k sentences, {epochs} epochs",
        offline=True,
    ),
    Row(
        "multi30k",
        "finetune/seq2seq.py",
        ("--config", "configs/finetune/offline/seq2seq-multi30k.yaml", "--training.num_train_epochs", "1"),
        needs=("encoder", "decoder"),
        data="Multi30k en→de, {train_k}k pairs",
        offline=True,
    ),
)
PRETRAIN = {
    "encoder": ("pretrain/run.py",),
    "decoder": ("pretrain/run.py", "--config", "configs/pretrain/decoder-tiny.yaml"),
}
FOLDERS = {
    "encoder": "encoder-tiny",
    "decoder": "decoder-tiny",
}  # the runs/ folders the pretraining commands fill
QUICK_PRETRAIN = (
    "--training.max_steps",
    "3",
    "--training.eval_steps",
    "3",
    "--training.save_steps",
    "3",
    "--training.max_eval_batches",
    "1",
)
QUICK_FINETUNE = (
    "--training.max_steps",
    "2",
    "--data.max_train_samples",
    "32",
    "--data.max_eval_samples",
    "16",
    "--data.max_predict_samples",
    "16",
)
QUICK_SEQ2SEQ = ("--generation.max_new_tokens", "8", "--generation.num_beams", "1")


def documented(script: str, args: tuple[str, ...]) -> str:
    return " ".join(["accelerate launch", script, *args])


def offline_files(row: Row) -> list[str]:
    """The local files an offline row's config reads (as written there: relative to the repository)."""
    config = REPO / row.args[row.args.index("--config") + 1]
    data = yaml.safe_load(config.read_text())["data"]
    return [data[key] for key in ("train_file", "validation_file", "test_file") if data.get(key)]


def missing_offline_data(row: Row) -> str | None:
    """Why an offline row cannot run here (its local copy is absent), or None."""
    if not SHARED_DATA.is_dir():  # named as the configs name it: the record holds no folder of this machine
        return "../shared/data is absent (the offline configs read local copies of the full sets from there)"
    for name in offline_files(row):
        if not (SHARED_DATA / Path(name).relative_to("../shared/data")).is_file():
            return f"{name} is absent"
    return None


def launch(script: str, args: tuple[str, ...], cwd: Path, log: Path) -> tuple[float, str]:
    """`accelerate launch <script> <args>` in `cwd` with this repository's code; (wall seconds, its output).
    `cwd` sees this repository's configs/ as a user's checkout does: the documented `--config configs/...` paths
    are relative to the folder the command runs in."""
    if not (cwd / "configs").exists():
        (cwd / "configs").symlink_to(REPO / "configs", target_is_directory=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "PYTHONUNBUFFERED": "1",
    }
    start = time.perf_counter()
    done = subprocess.run(
        [*LAUNCH, str(REPO / script), *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wall = time.perf_counter() - start
    log.write_text(done.stdout)
    if done.returncode != 0:
        tail = "\n".join(done.stdout.splitlines()[-30:])
        raise SystemExit(
            f"error: `{documented(script, args)}` failed ({done.returncode}) in {cwd}; its log: {log}\n{tail}"
        )
    return wall, done.stdout


def printed(pattern: str, output: str, what: str) -> str:
    found = re.search(pattern, output)
    if not found:
        raise SystemExit(f"error: the run's output has no {what} (looked for {pattern!r})")
    return found.group(1)


def parameters(final: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(final / "model.safetensors"), "pt") as weights:
        return sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())


def training_loop_s(run: Path) -> float:
    """The training loop's own clock (steps and their evaluations), as the run's last checkpoint keeps it."""
    from kiln.checkpoint_files import find_checkpoints

    last = find_checkpoints(run)[-1]
    return round(json.loads((last / "loop_state.json").read_text())["counters"]["train_time_s"], 1)


def run_folder(cwd: Path) -> Path:
    """The one run folder a command made under cwd/runs (the pretrained ones are links)."""
    made = [p for p in (cwd / "runs").iterdir() if not p.is_symlink()]
    if len(made) != 1:
        raise SystemExit(
            f"error: expected one new run folder in {cwd / 'runs'}, found {[p.name for p in made]}"
        )
    return made[0]


def pretrain(kind: str, work: Path, quick: bool) -> dict:
    cwd = work / "pretrain"
    cwd.mkdir(exist_ok=True)
    script, *args = PRETRAIN[kind]
    extra = QUICK_PRETRAIN if quick else ()
    print(f"pretraining: {documented(script, tuple(args))}", flush=True)
    wall, output = launch(script, (*args, *extra), cwd, work / f"pretrain-{kind}.log")
    folder = cwd / "runs" / FOLDERS[kind]
    return {
        "command": documented(script, tuple(args)),
        "wall_s": round(wall, 1),
        "training_loop_s": training_loop_s(folder),
        "parameters": parameters(folder / "final"),
        "threads": printed(r"device = cpu, (\d+) threads? per process", output, "thread count"),
        "folder": folder,
    }


def finetune(row: Row, work: Path, pretrained: dict[str, Path], quick: bool) -> dict:
    cwd = work / row.name
    (cwd / "runs").mkdir(parents=True)
    for kind in row.needs:  # the pretraining commands' runs/ folders, seen from this command's own folder
        (cwd / "runs" / FOLDERS[kind]).symlink_to(pretrained[kind], target_is_directory=True)
    extra = QUICK_FINETUNE + (QUICK_SEQ2SEQ if row.script.endswith("seq2seq.py") else ()) if quick else ()
    print(f"{row.name}: {documented(row.script, row.args)}", flush=True)
    wall, output = launch(row.script, (*row.args, *extra), cwd, work / f"{row.name}.log")
    out = run_folder(cwd)
    results = out / "test_results.json"
    if not results.is_file():
        raise SystemExit(f"error: {row.name} wrote no {results}")
    metrics = json.loads(results.read_text())
    settings = yaml.safe_load((out / "config.yaml").read_text())
    model = json.loads((out / "final" / "config.json").read_text())
    train = int(printed(r"examples = ([\d,]+)", output, "training example count").replace(",", ""))
    labels = len(model.get("id2label") or {})
    epochs = settings["training"]["num_train_epochs"]
    return {
        "name": row.name,
        "command": documented(row.script, row.args),
        "offline": row.offline,
        "data": row.data.format(
            train=train, train_k=round(train / 1000), labels=labels, epochs=f"{epochs:g}"
        ),
        "train_examples": train,
        "labels": labels or None,
        "num_train_epochs": epochs,
        "num_beams": (settings.get("generation") or {}).get("num_beams"),
        "wall_s": round(wall, 1),
        "threads": printed(r"device = cpu, (\d+) threads? per process", output, "thread count"),
        "test": metrics,
    }


def run_rows(names: list[str], work: Path, quick: bool, given: dict[str, Path]) -> dict:
    rows = [row for row in ROWS if row.name in names]
    skipped = {}
    for row in rows:
        why = missing_offline_data(row) if row.offline else None
        if why:
            print(f"skipping {row.name} ({documented(row.script, row.args)}): {why}", flush=True)
            skipped[row.name] = why
    rows = [row for row in rows if row.name not in skipped]
    import torch

    record = {
        "quick": quick,
        **run_stamp(OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS")),
        "torch": torch.__version__,
        "load_average_start": load_average(),
        "output": "a new folder per command, beside a folder of the two pretraining runs",
    }
    pretrained, facts = {}, {}
    for kind in sorted({kind for row in rows for kind in row.needs}):
        if kind in given:
            pretrained[kind] = given[kind].resolve().parent  # the run folder of a given final/
            facts[kind] = {
                "given": f"--{kind}",
                "parameters": parameters(given[kind]),
            }  # not the path: no machine folders
        else:
            facts[kind] = pretrain(kind, work, quick)
            pretrained[kind] = facts[kind].pop("folder")
    record["pretrained"] = facts
    record["rows"] = [finetune(row, work, pretrained, quick) for row in rows]
    record["skipped"] = skipped
    record["load_average_end"] = load_average()
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only", help=f"comma-separated rows to run (default: all): {','.join(r.name for r in ROWS)}"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a few steps on a few examples: checks the script, measures nothing (needs --json)",
    )
    parser.add_argument("--json", type=Path, help="the record (default: bench/results/shipped-commands.json)")
    parser.add_argument(
        "--encoder",
        type=Path,
        help="an encoder final/ folder to start from instead of running "
        "the pretraining command (the record says so)",
    )
    parser.add_argument("--decoder", type=Path, help="likewise, a decoder final/ folder")
    parser.add_argument(
        "--keep", type=Path, help="run in this new folder and keep it (default: a temporary one)"
    )
    args = parser.parse_args(argv)
    known = [row.name for row in ROWS]
    names = known if not args.only else [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        parser.error(
            f"--only: unknown row(s) {', '.join(unknown) or '(none given)'}; rows: {', '.join(known)}"
        )
    if args.quick and args.json is None:
        parser.error(
            "--quick measures nothing: give --json for its record (the default record is the measurement)"
        )
    given = {kind: path for kind, path in (("encoder", args.encoder), ("decoder", args.decoder)) if path}
    for kind, path in given.items():
        if not (path / "config.json").is_file():
            parser.error(f"--{kind} {path}: not a final/ folder (no config.json)")
    if args.keep and args.keep.exists():
        parser.error(f"--keep {args.keep}: give a new folder (the commands each need a fresh one)")
    out = args.json or REPO / "bench/results/shipped-commands.json"
    if args.keep:
        args.keep.mkdir(parents=True)
        record = run_rows(names, args.keep, args.quick, given)
    else:
        work = Path(tempfile.mkdtemp(prefix="kiln-shipped-commands-"))
        try:
            record = run_rows(names, work, args.quick, given)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    out.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    for row in record["rows"]:
        print(f"{row['name']}: {row['wall_s']:.0f} s, test {json.dumps(row['test'])[:200]}")
    print(
        f"{out}: {len(record['rows'])} rows, {len(record['skipped'])} skipped, load average "
        f"{record['load_average_start'][0]:.1f} -> {record['load_average_end'][0]:.1f}"
    )


if __name__ == "__main__":
    main()

"""How long the commands of the docs pages take, and what they print that the pages quote:
bench/results/page-times.json.

    python bench/page_times.py                          # every page below, in order (~40 minutes on 2 idle cores)
    python bench/page_times.py --only pretraining       # one page; the record keeps the other pages' entries
    python bench/page_times.py --quick --only installation --json quick.json   # a check: a few steps each
    python bench/report.py --update docs/pretraining.md docs/zero-shot.md docs/electra.md docs/models.md \\
        docs/installation.md docs/multi-node.md

The pages (`PAGES`) are read as they are: every command of their bash blocks (bench.pages.page_commands), in page
order, less those that take seconds (`UNDER_10_S`: they train, evaluate and download nothing) and those this
machine cannot run (`NOT_HERE`: the Hub, GPUs, files only the user has, hours of compute; each page says so next to
the command). Each page's commands run one at a time, as the page gives them (`accelerate launch`, `kiln-launch`,
`python -m ...`, `lm_eval`, in a fresh process each), in a fresh folder of the page's own that holds a checkout's
links (configs/, data/, the scripts) and a copy of the run folders the page starts from (`NEEDS`: the main job,
the decoder of docs/pretraining.md, the authorship classifier of docs/finetuning.md), made first by their own
documented commands. A placeholder a page writes (`runs/<run>/final`) is its page's run (`PLACEHOLDERS`).

Per command the record holds its wall clock and the CPU-seconds of its processes (launcher and training processes
alike), the threads per process it used (as a training run prints them, else torch's default in that
environment), and what it printed that the page quotes, read from its output or its run folder: a training run's
first and last logged train loss, its last evaluation and its median tokens/s; a BLiMP score; lm-eval's accuracy;
a conversion's or an export's closing line; and for the decoder the page shows a sample of, the greedy
continuation of its prompt from the saved `final/` (`SAMPLES`, made in a fresh process after the command, not
timed). A quoted item the command no longer prints is an error, not an empty cell. And the machine (CPU model,
cores), torch, the load average at the start and end of the run and of each page, the commit and the date.

Measure on an otherwise idle machine: `bench/report.py` refuses a page whose run started at a load average of 1 or
more, and a `--quick` record (a few steps each: a check of this script, not a measurement).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
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

PAGES = {
    "pretraining": "docs/pretraining.md",
    "zero-shot": "docs/zero-shot.md",
    "electra": "docs/electra.md",
    "models": "docs/models.md",
    "installation": "docs/installation.md",
    "multi-node": "docs/multi-node.md",
}
"""The pages this script times, in the order it runs them (a later page may start from an earlier page's run)."""

UNDER_10_S = (
    (r"(^| )--help( |$)", "prints the options"),
    (r"^python -c ", "an import check"),
    (r"^accelerate config default$", "writes accelerate's one-process config file"),
    (r"^export [A-Z_]+=\S+$", "sets a shell variable"),
    (r"^(ls|tail) ", "lists a folder or prints a file's last lines"),
    (r"^mkdocs build --strict$", "builds the documentation site from its Markdown"),
    (
        r"^python experiments/run\.py (summarize|table|levers|plot)( |$)",
        "a table or plot from the run records",
    ),
    (
        r"^python experiments/run\.py run \S+ --dry-run$",
        "prints an experiment's commands without running them",
    ),
    (r"^python experiments/blimp_results\.py (record|update)( |$)", "files a score or redraws its table"),
    (r"^python bench/report\.py --update ", "rewrites a page's generated blocks from the records"),
    (r"^python bench/throughput\.py --plot ", "draws a figure from two records"),
)
"""Commands that take seconds: they train, evaluate, download and build nothing, reading records or files and
writing text, a figure or a config (1 to 8 s each, caches warm, on a busy 2-core machine). Not timed."""

MEASUREMENT = re.compile(r"^python bench/(?!report\.py)\w+\.py( |$)(?!--plot)")
"""A benchmark script's own command: what it measures is its record, which the page's generated table shows."""

HUB, GPU, USER_FILES, LONG, DOWNLOADS = (
    "the Hugging Face Hub",
    "GPUs",
    "files the user brings",
    "tens of minutes to hours",
    "the package index",
)
NOT_HERE: dict[str, tuple[str, dict[str, str]]] = {
    # command (as page_commands gives it, spaces collapsed): (what it needs, {page: the words there that say so})
    'pip install -e ".[dev]"': (
        DOWNLOADS,
        {
            "README.md": "as long as its downloads take",
            "docs/getting-started.md": "as long as its downloads take",
            "docs/index.md": "as long as its downloads take",
            "docs/installation.md": "as long as its downloads take",
        },
    ),
    "python -m pytest -n 2 -q": (
        LONG,
        {
            "README.md": "about 20 minutes on an idle 2-core machine",
            "docs/getting-started.md": "about 20 minutes on an idle 2-core machine",
            "docs/installation.md": "about 20 minutes on 2 idle cores",
        },
    ),
    "hf upload you/kiln-encoder-tiny runs/encoder-tiny/final": (HUB, {"README.md": "on the Hub"}),
    "kiln-launch finetune/classify.py --model.checkpoint you/kiln-encoder-tiny --training.output_dir "
    "runs/kiln-authorship --hub.push_to_hub --hub.model_id you/kiln-authorship": (
        HUB,
        {"README.md": "fine-tune it from the Hub"},
    ),
    'python -m pretrain.data prepare --config configs/pretrain/encoder-small.yaml --data.data_files "corpus/*.txt" '
    "--output prepared/corpus --num_proc 8": (
        USER_FILES,
        {"README.md": "your text in corpus/", "docs/data-and-scale.md": "your text in corpus/"},
    ),
    "kiln-launch --config_file configs/accelerate/multi-gpu.yaml pretrain/run.py --config "
    "configs/pretrain/encoder-small.yaml --data.prepared prepared/corpus --training.output_dir runs/corpus-small": (
        GPU,
        {"README.md": "every GPU of every node"},
    ),
    "hf download google-bert/bert-base-uncased --local-dir bert-base-uncased": (
        HUB,
        {"docs/continue-pretraining.md": "from the Hub"},
    ),
    "hf download openai-community/gpt2 --local-dir gpt2": (
        HUB,
        {"docs/continue-pretraining.md": "from the Hub"},
    ),
    "hf download HuggingFaceTB/SmolLM2-135M --local-dir smollm2": (
        HUB,
        {"docs/continue-pretraining.md": "from the Hub"},
    ),
    "accelerate launch pretrain/run.py --config configs/pretrain/encoder-small.yaml --model.init_from "
    'bert-base-uncased --tokenizer.name_or_path bert-base-uncased --data.data_files "corpus/*.txt" --training.lr '
    "5e-5 --training.output_dir runs/bert-continued": (
        USER_FILES,
        {"docs/continue-pretraining.md": "your text in corpus/"},
    ),
    "accelerate launch pretrain/run.py --config configs/pretrain/decoder-tiny.yaml --model.init_from gpt2 "
    '--tokenizer.name_or_path gpt2 --data.data_files "corpus/*.txt" --training.lr 5e-5 --training.output_dir '
    "runs/gpt2-continued": (USER_FILES, {"docs/continue-pretraining.md": "your text in corpus/"}),
    "accelerate launch pretrain/run.py --config configs/pretrain/decoder-llama-tiny.yaml --model.init_from "
    'smollm2 --tokenizer.name_or_path smollm2 --data.data_files "corpus/*.txt" --training.lr 5e-5 '
    "--training.output_dir runs/smollm2-continued": (
        USER_FILES,
        {"docs/continue-pretraining.md": "your text in corpus/"},
    ),
    "python -m pretrain.convert bert-base-uncased kiln-bert-base": (
        HUB,
        {"docs/continue-pretraining.md": "downloaded from the Hub"},
    ),
    "python -m pretrain.convert runs/bert-continued/final bert-continued": (
        USER_FILES,
        {"docs/continue-pretraining.md": "the runs above"},
    ),
    "python -m pretrain.convert runs/gpt2-continued/final gpt2-continued": (
        USER_FILES,
        {"docs/continue-pretraining.md": "the runs above"},
    ),
    "python -m pretrain.convert runs/smollm2-continued/final smollm2-continued": (
        USER_FILES,
        {"docs/continue-pretraining.md": "the runs above"},
    ),
    "accelerate launch pretrain/run.py --config configs/pretrain/encoder-small.yaml --data.prepared "
    "prepared/corpus": (USER_FILES, {"docs/data-and-scale.md": "your text in corpus/"}),
    "python -m pretrain.convert google-electra-small-discriminator-folder kiln-disc": (
        HUB,
        {"docs/electra.md": "downloaded from the Hub"},
    ),
    "python experiments/run.py run experiments/electra-sweep.yaml": (LONG, {"docs/electra.md": "hours"}),
    "python experiments/run.py run experiments/electra.yaml": (LONG, {"docs/electra.md": "hours"}),
    "python experiments/run.py run experiments/electra-own.yaml": (LONG, {"docs/electra.md": "hours"}),
    "accelerate launch finetune/classify.py --config configs/finetune/classify-sst2.yaml": (
        HUB,
        {"docs/finetuning.md": "from the Hugging Face Hub"},
    ),
    "accelerate launch finetune/tag.py --config configs/finetune/tag-conll2003.yaml": (
        HUB,
        {"docs/finetuning.md": "from the Hugging Face Hub"},
    ),
    "accelerate launch finetune/seq2seq.py --config configs/finetune/seq2seq-multi30k.yaml": (
        HUB,
        {"docs/finetuning.md": "from the Hugging Face Hub"},
    ),
    "accelerate launch finetune/adapt.py --task classify --task_config configs/finetune/classify-sst2.yaml "
    "--model.init_from runs/encoder-tiny/final --training.max_steps 2000 --training.output_dir runs/sst2-adapted": (
        HUB,
        {"docs/finetuning.md": "SST-2 from the Hub"},
    ),
    "accelerate launch finetune/classify.py --config configs/finetune/classify-sst2.yaml --model.checkpoint "
    "runs/sst2-adapted/final --training.output_dir runs/classify-sst2-adapted": (
        HUB,
        {"docs/finetuning.md": "SST-2 from the Hub"},
    ),
    "accelerate launch finetune/classify.py --data.glue_task mrpc --data.glue_dir glue_data/MRPC": (
        USER_FILES,
        {"docs/finetuning.md": "GLUE's files in glue_data/"},
    ),
    "accelerate launch finetune/classify.py --data.glue_task stsb --model.checkpoint runs/encoder-tiny/final": (
        HUB,
        {"docs/finetuning.md": "from the Hub"},
    ),
    "python finetune/glue.py --output-dir runs/glue-hub": (HUB, {"docs/finetuning.md": "from the Hub"}),
    "python finetune/glue.py --glue-dir glue_data --output-dir runs/glue-3-epochs -- --training.num_train_epochs 3": (
        USER_FILES,
        {"docs/finetuning.md": "GLUE's files in glue_data/"},
    ),
    "python finetune/glue.py --glue-dir glue_data --tasks sst2 rte --output-dir runs/glue-sst2-rte": (
        USER_FILES,
        {"docs/finetuning.md": "GLUE's files in glue_data/"},
    ),
    "hf auth login": (HUB, {"docs/hub.md": "Pushing a run to the Hub"}),
    "accelerate launch pretrain/run.py --training.output_dir runs/encoder-tiny-hub --hub.push_to_hub "
    "--hub.model_id you/kiln-encoder-tiny --hub.strategy checkpoint": (
        HUB,
        {"docs/hub.md": "Pushing a run to the Hub"},
    ),
    "python -m pretrain.convert google-bert/bert-base-uncased kiln-bert": (
        HUB,
        {"docs/models.md": "from the Hub"},
    ),
    "python -m pretrain.convert answerdotai/ModernBERT-base kiln-modernbert-base": (
        HUB,
        {"docs/models.md": "from the Hub"},
    ),
    "python -m pretrain.convert path/to/llama-folder runs/llama-kiln": (
        USER_FILES,
        {"docs/models.md": "a Llama folder of yours"},
    ),
    "accelerate launch --config_file configs/accelerate/single-gpu.yaml pretrain/run.py --config "
    "configs/pretrain/encoder-small.yaml --training.output_dir runs/encoder-small-1gpu": (
        GPU,
        {"docs/multi-node.md": "on GPUs"},
    ),
    "accelerate launch --config_file configs/accelerate/multi-gpu.yaml pretrain/run.py --config "
    "configs/pretrain/encoder-base.yaml": (GPU, {"docs/multi-node.md": "on GPUs"}),
    "accelerate launch --config_file configs/accelerate/fsdp.yaml pretrain/run.py --config "
    "configs/pretrain/decoder-small.yaml": (GPU, {"docs/multi-node.md": "on GPUs"}),
    "accelerate launch --config_file configs/accelerate/deepspeed-zero2.yaml pretrain/run.py ...": (
        GPU,
        {"docs/multi-node.md": "on GPUs"},
    ),
    "python bench/engines.py --engine fsdp --engine deepspeed-zero2 --steps 300 --json "
    "bench/results/engines-h100.json": (GPU, {"docs/multi-node.md": "Measured on one NVIDIA H100"}),
    "python run_mlm.py --model_name_or_path runs/encoder-tiny/final --trust_remote_code --train_file train.txt "
    "--validation_file valid.txt --do_train --do_eval --output_dir out/mlm": (
        USER_FILES,
        {"docs/other-tools.md": "transformers' `examples/pytorch/`"},
    ),
    "python run_clm.py --model_name_or_path runs/decoder-tiny/final --trust_remote_code --train_file train.txt "
    "--validation_file valid.txt --do_train --do_eval --output_dir out/clm": (
        USER_FILES,
        {"docs/other-tools.md": "transformers' `examples/pytorch/`"},
    ),
    "python run_glue.py --model_name_or_path runs/encoder-tiny/final --trust_remote_code --task_name mrpc "
    "--do_train --do_eval --do_predict --output_dir out/mrpc": (
        USER_FILES,
        {"docs/other-tools.md": "transformers' `examples/pytorch/`"},
    ),
    "python run_ner.py --model_name_or_path runs/encoder-tiny/final --trust_remote_code --dataset_name conll2003 "
    "--do_train --do_eval --output_dir out/ner": (
        USER_FILES,
        {"docs/other-tools.md": "transformers' `examples/pytorch/`"},
    ),
    "accelerate launch run_mlm_no_trainer.py --model_name_or_path runs/encoder-tiny/final --trust_remote_code "
    "--train_file train.txt --validation_file valid.txt --output_dir out/mlm-nt": (
        USER_FILES,
        {"docs/other-tools.md": "transformers' `examples/pytorch/`"},
    ),
    "hf upload you/my-encoder runs/my-encoder/final": (HUB, {"docs/recipes.md": "a Hub model repository"}),
    "hf upload you/my-classifier runs/my-classifier/final": (
        HUB,
        {"docs/recipes.md": "a Hub model repository"},
    ),
    **{
        f"python experiments/run.py run experiments/{name}.yaml": (LONG, {"docs/results.md": "takes hours"})
        for name in (
            "recipe",
            "multi30k-de-sweep",
            "multi30k-de",
            "ablation",
            "decoder-30min",
            "first-recipe",
        )
    },
    "python experiments/run.py run experiments/compute-curve.yaml": (
        LONG,
        {"docs/results.md": "~85 min of one core"},
    ),
    "python experiments/run.py run experiments/sst2-labels.yaml": (LONG, {"docs/results.md": "takes hours"}),
    "python experiments/run.py run experiments/sst2-labels-sweep.yaml": (
        LONG,
        {"docs/results.md": "takes hours"},
    ),
    "OMP_NUM_THREADS=1 python -m pretrain.zero_shot blimp --model runs/encoder-30min-zs/final --data BLIMP/data "
    "--pairs 100 --json blimp-30min.json": (
        USER_FILES,
        {"docs/results.md": "BLiMP's own files in BLIMP/data"},
    ),
    "python -m pretrain.data prepare --config configs/pretrain/bert-base-wiki-books.yaml --output "
    "prepared/wiki-books --num_proc 32": (USER_FILES, {"docs/scaling.md": "your Wikipedia and books text"}),
    "accelerate launch --config_file configs/accelerate/bert-base-1x8.yaml pretrain/run.py --config "
    "configs/pretrain/bert-base-wiki-books.yaml": (GPU, {"docs/scaling.md": "8 GPUs"}),
    'python -m pretrain.data prepare --config configs/pretrain/bert-base-wiki-books.yaml --data.data_files "corpus/*.txt" '
    "--output prepared/my-corpus --num_proc 16": (USER_FILES, {"docs/walkthrough.md": "your corpus"}),
    "kiln-launch --config_file configs/accelerate/bert-base-1x8.yaml pretrain/run.py --config "
    'configs/pretrain/bert-base-wiki-books.yaml --data.data_files "corpus/*.txt" --data.prepared prepared/my-corpus '
    "--training.output_dir runs/my-bert": (GPU, {"docs/walkthrough.md": "GPUs"}),
    "kiln-launch --config_file configs/accelerate/bert-base-1x8.yaml pretrain/run.py --config "
    'configs/pretrain/bert-base-wiki-books.yaml --data.data_files "corpus/*.txt" --data.prepared prepared/my-corpus '
    "--training.output_dir runs/my-bert --training.resume_from_checkpoint latest": (
        GPU,
        {"docs/walkthrough.md": "GPUs"},
    ),
    "hf upload you/my-bert runs/my-bert/final": (HUB, {"docs/walkthrough.md": "Hugging Face Hub"}),
    "accelerate launch finetune/classify.py --config configs/finetune/classify-sst2.yaml --model.checkpoint "
    "you/my-bert --training.output_dir runs/my-bert-sst2": (HUB, {"docs/walkthrough.md": "from the Hub"}),
    "lm_eval --model hf --model_args pretrained=runs/decoder-tiny/final,trust_remote_code=True --tasks blimp": (
        HUB,
        {"docs/zero-shot.md": "reads BLiMP from the Hub"},
    ),
}
"""Every documented command this machine cannot run or time, with what it needs, and the words its page says it
with, next to the command (a test holds each page to them)."""

MAIN_JOB = "accelerate launch pretrain/run.py"
DECODER_TINY = "accelerate launch pretrain/run.py --config configs/pretrain/decoder-tiny.yaml"
AUTHORSHIP = "accelerate launch finetune/classify.py"
NEEDS = {"zero-shot": (MAIN_JOB, DECODER_TINY), "models": (MAIN_JOB, AUTHORSHIP)}
"""The run folders a page starts from (docs/zero-shot.md: "made on earlier pages"), each made by its documented
command (the main job of the README, the decoder of docs/pretraining.md, the authorship classifier of
docs/finetuning.md, which starts from the main job's encoder) and copied into the page's folder."""
PLACEHOLDERS = {"docs/electra.md": {"<run>": "encoder-tiny-electra"}}
"""What a page's placeholder stands for when it runs: the page's own run above the command."""
SAMPLES = {DECODER_TINY: ("Once upon a time", 24)}
"""Commands whose page shows a sample of the model they leave: (prompt, new tokens), greedy."""

QUICK_PRETRAIN = (
    "--training.max_steps",
    "3",
    "--training.eval_steps",
    "3",
    "--training.save_steps",
    "3",
    "--training.max_eval_batches",
    "1",
    "--logging.logging_steps",
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
QUICK_BLIMP_PAIRS = "2"
LAUNCHERS = {
    "accelerate": (sys.executable, "-m", "accelerate.commands.accelerate_cli"),
    "kiln-launch": (sys.executable, "-m", "kiln.launcher"),
    "lm_eval": (sys.executable, "-m", "lm_eval"),
    "python": (sys.executable,),
}
"""How each command's first word runs: the same program, from this Python (its environment's packages)."""
LINKED = ("configs", "pretrain", "finetune", "kiln", "data")  # a checkout, as the pages' commands expect it


def collapsed(command: str) -> str:
    return " ".join(command.split())


def under_10_s(command: str) -> str | None:
    """Why `command` takes seconds (UNDER_10_S), or None."""
    return next((why for pattern, why in UNDER_10_S if re.search(pattern, collapsed(command))), None)


def page_plan(name: str) -> list[str]:
    """The commands of page `name` this script runs, in page order, as the page writes them (spaces collapsed)."""
    page = REPO / PAGES[name]
    return [
        command
        for command in map(collapsed, page_commands(page))
        if command not in NOT_HERE and not under_10_s(command) and not MEASUREMENT.match(command)
    ]


def as_run(command: str, page: str) -> str:
    """The command with the page's placeholders filled in."""
    for placeholder, value in PLACEHOLDERS.get(page, {}).items():
        command = command.replace(placeholder, value)
    return command


def quick_extra(words: list[str]) -> list[str]:
    """What `--quick` adds to a command: a few steps, a few pairs, a few examples."""
    if "pretrain/run.py" in words:
        blimp = ["--eval.blimp", QUICK_BLIMP_PAIRS] if "--eval.blimp" in words else []
        return [*QUICK_PRETRAIN, *blimp]
    if any(word.startswith("finetune/") for word in words):
        return list(QUICK_FINETUNE)
    if words[:3] == ["-m", "pretrain.zero_shot", "blimp"]:
        return ["--pairs", QUICK_BLIMP_PAIRS]
    if words[0] == "lm_eval":
        return ["--limit", QUICK_BLIMP_PAIRS]
    return []


def argv_of(command: str, quick: bool) -> tuple[list[str], dict[str, str]]:
    """The program and arguments `command` runs, and the variables it sets before them (`VAR=value cmd`)."""
    words, env = shlex.split(command), {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    if words[0] not in LAUNCHERS:
        raise SystemExit(
            f"error: no rule for running {command!r} (its program is not one of {sorted(LAUNCHERS)})"
        )
    extra = quick_extra(words if words[0] != "python" else words[1:]) if quick else []
    return [*LAUNCHERS[words[0]], *words[1:], *extra], env


def run_as_written(command: str, cwd: Path, log: Path, quick: bool) -> dict:
    """Run `command` in `cwd` with this repository's code; its wall clock, CPU-seconds and output."""
    argv, variables = argv_of(command, quick)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "PYTHONUNBUFFERED": "1",
        **variables,
    }
    cpu_before = children_cpu_seconds()
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - start
    cpu = children_cpu_seconds() - cpu_before
    log.write_text(done.stdout)
    if done.returncode != 0:
        tail = "\n".join(done.stdout.replace("\r", "\n").splitlines()[-30:])
        raise SystemExit(f"error: `{command}` failed ({done.returncode}) in {cwd}; its log: {log}\n{tail}")
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "output": done.stdout, "env": env}


def torch_default_threads(env: dict[str, str]) -> int:
    """The threads torch takes in a fresh process of this environment (a command that does not print its own)."""
    done = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout.split()[-1])


def _printed(pattern: str, output: str, what: str, command: str) -> re.Match:
    found = re.search(pattern, output, flags=re.M)
    if not found:
        raise SystemExit(f"error: `{command}` printed no {what} (looked for {pattern!r})")
    return found


def trained_folder(output: str, cwd: Path, command: str) -> Path:
    """The run folder a training command filled, from its `final model saved in RUN/final` line."""
    return (
        cwd / _printed(r"^final model saved in (.+?)\s*$", output, "final folder", command).group(1)
    ).parent


def training_facts(output: str, cwd: Path, command: str) -> dict:
    """A training run's quoted numbers: from its output (parameters, processes) and its run folder's
    metrics.jsonl (first and last logged train loss, the last evaluation, median tokens/s)."""
    run = trained_folder(output, cwd, command)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [row for row in rows if "train/loss" in row]
    evals = [row for row in rows if any(key.startswith("eval/") for key in row)]
    if not train or not evals:
        raise SystemExit(f"error: `{command}` logged no {'training' if not train else 'evaluation'} row")
    parameters = _printed(r"with ([\d.]+)M parameters", output, "parameter count", command)
    processes = _printed(r"processes = (\d+)", output, "process count", command)
    rates = [row["train/tokens_per_s"] for row in train if "train/tokens_per_s" in row]
    return {
        "kind": "training",
        "run": run.relative_to(cwd).as_posix(),
        "parameters_m": float(parameters.group(1)),
        "processes": int(processes.group(1)),
        "steps": train[-1]["step"],
        "train_loss": [[row["step"], row["train/loss"]] for row in (train[0], train[-1])],
        "eval": evals[-1],
        "tokens_per_s_median": round(statistics.median(rates), 1) if rates else None,
    }


def blimp_facts(output: str, command: str) -> dict:
    found = _printed(
        r"^BLiMP: ([\d.]+) \(mean over (\d+) paradigms; ([\d,]+) of ([\d,]+) pairs right\)",
        output,
        "BLiMP score",
        command,
    )
    return {
        "kind": "blimp",
        "mean_percent": float(found.group(1)),
        "paradigms": int(found.group(2)),
        "pairs": int(found.group(4).replace(",", "")),
    }


def lm_eval_facts(output: str, command: str) -> dict:
    task = shlex.split(command)[shlex.split(command).index("--tasks") + 1]
    found = _printed(
        rf"^\|{re.escape(task)}\s*\|[^\n]*?\|acc\s*\|[^|]*\|\s*([\d.]+)\s*\|",
        output,
        f"{task} accuracy",
        command,
    )
    return {"kind": "lm-eval", "task": task, "acc": float(found.group(1))}


def closing_line_facts(output: str, command: str) -> dict:
    """A conversion's or an ONNX export's `wrote ...` line."""
    found = _printed(r"^(wrote .+?)\s*$", output, "`wrote ...` line", command)
    return {"kind": "wrote", "line": found.group(1)}


def greedy_sample(folder: Path, prompt: str, new_tokens: int, env: dict[str, str]) -> dict:
    """The greedy continuation of `prompt` by the saved causal LM in `folder`, in a fresh process."""
    code = (
        "import json, sys\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "folder, prompt, n = sys.argv[1], sys.argv[2], int(sys.argv[3])\n"
        "tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)\n"
        "model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()\n"
        "ids = tokenizer(prompt, return_tensors='pt')\n"
        "out = model.generate(**ids, max_new_tokens=n, do_sample=False)\n"
        "print('SAMPLE ' + json.dumps(tokenizer.decode(out[0], skip_special_tokens=True)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(folder), prompt, str(new_tokens)],
        env=env,
        capture_output=True,
        text=True,
    )
    found = re.search(r"^SAMPLE (.+)$", done.stdout, flags=re.M)
    if done.returncode != 0 or not found:
        raise SystemExit(f"error: no greedy sample from {folder}:\n{done.stderr[-2000:]}")
    return {"prompt": prompt, "max_new_tokens": new_tokens, "text": json.loads(found.group(1))}


def quoted(command: str, output: str, cwd: Path, env: dict[str, str]) -> dict:
    """What `command` printed that its page quotes, by the kind of command it is."""
    words = shlex.split(command)
    if "pretrain/run.py" in words or any(word.startswith("finetune/") for word in words):
        facts = training_facts(output, cwd, command)
        if command in SAMPLES:
            prompt, new_tokens = SAMPLES[command]
            facts["sample"] = greedy_sample(cwd / facts["run"] / "final", prompt, new_tokens, env)
        return facts
    if "pretrain.zero_shot" in words:
        return blimp_facts(output, command)
    if words[0] == "lm_eval":
        return lm_eval_facts(output, command)
    if "pretrain.convert" in words or "pretrain.export_onnx" in words:
        return closing_line_facts(output, command)
    raise SystemExit(f"error: no rule for what `{command}` prints")


def threads_used(output: str, env: dict[str, str]) -> tuple[int, str]:
    found = re.search(r"device = cpu, (\d+) threads? per process", output)
    if found:
        return int(found.group(1)), "printed"
    return torch_default_threads(env), "torch's default"


def run_one(command: str, page: str, cwd: Path, logs: Path, quick: bool, index: int) -> dict:
    ran = as_run(command, page)
    print(f"{page}: {command}{' (quick)' if quick else ''}", flush=True)
    done = run_as_written(ran, cwd, logs / f"{Path(page).stem}-{index:02d}.log", quick)
    threads, source = threads_used(done["output"], done["env"])
    row = {
        "command": command,
        "wall_s": done["wall_s"],
        "cpu_s": done["cpu_s"],
        "threads": threads,
        "threads_from": source,
        "printed": quoted(ran, done["output"], cwd, done["env"]),
    }
    if ran != command:
        row["ran"] = ran
    return row


def fresh_folder(work: Path) -> Path:
    """A new folder with a checkout's links (configs, data, the scripts), as the pages' commands expect."""
    work.mkdir(parents=True)
    for name in LINKED:
        (work / name).symlink_to(REPO / name, target_is_directory=True)
    (work / "runs").mkdir()
    return work


class Needs:
    """The run folders pages start from, each made once by its documented command in one folder of its own."""

    FIRST = {AUTHORSHIP: (MAIN_JOB,)}  # the classifier starts from the main job's encoder

    def __init__(self, work: Path, logs: Path, quick: bool):
        self.work, self.logs, self.quick = work, logs, quick
        self.made: dict[str, Path] = {}
        self.rows: list[dict] = []

    def register(self, command: str, folder: Path) -> None:
        """A page command that is also a needed one (docs/pretraining.md's decoder) leaves its folder for later."""
        if command in (MAIN_JOB, DECODER_TINY, AUTHORSHIP) and command not in self.made:
            self.made[command] = folder

    def folder(self, command: str) -> Path:
        if command not in self.made:
            for first in self.FIRST.get(command, ()):
                self.folder(first)
            cwd = self.work if self.work.exists() else fresh_folder(self.work)
            for first in self.FIRST.get(command, ()):  # where the command expects it
                target = cwd / "runs" / self.made[first].name
                if not target.exists():
                    shutil.copytree(self.made[first], target, symlinks=True)
            print(f"needed first: {command}{' (quick)' if self.quick else ''}", flush=True)
            done = run_as_written(command, cwd, self.logs / f"needed-{len(self.rows):02d}.log", self.quick)
            self.made[command] = trained_folder(done["output"], cwd, command)
            self.rows.append({"command": command, "wall_s": done["wall_s"], "cpu_s": done["cpu_s"]})
        return self.made[command]


def run_page(name: str, work: Path, logs: Path, needs: Needs, quick: bool, stamp: dict) -> dict:
    page = PAGES[name]
    cwd = fresh_folder(work / name)
    entry = {"page": page, **stamp, "load_average_page_start": load_average()}
    used = []
    for command in NEEDS.get(name, ()):
        source = needs.folder(command)
        shutil.copytree(source, cwd / "runs" / source.name, symlinks=True)
        used.append(command)
    entry["started_from"] = used
    rows = []
    for i, command in enumerate(page_plan(name)):
        row = run_one(command, page, cwd, logs, quick, i)
        if row["printed"]["kind"] == "training":
            needs.register(command, cwd / row["printed"]["run"])
        rows.append(row)
    entry["commands"] = rows
    entry["load_average_end"] = load_average()
    return entry


def measure_pages(names: list[str], quick: bool, keep: Path | None) -> dict:
    import torch

    stamp = {
        "quick": quick,
        **run_stamp(OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS")),
        "torch": torch.__version__,
        "load_average_start": load_average(),
    }
    record = {**stamp, "pages": {}}
    work = keep or Path(tempfile.mkdtemp(prefix="kiln-page-times-"))
    try:
        work.mkdir(parents=True, exist_ok=True)
        logs = work / "logs"
        logs.mkdir()
        needs = Needs(work / "needed", logs, quick)
        for name in names:
            record["pages"][name] = run_page(name, work, logs, needs, quick, stamp)
        record["needed_first"] = needs.rows
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
    record["load_average_end"] = load_average()
    return record


def merged(record: dict, out: Path) -> dict:
    """A measurement of some pages, with the pages of the measurement already in `out` that it did not run."""
    if record["quick"] or not out.is_file():
        return record
    before = json.loads(out.read_text())
    if before.get("quick"):
        return record
    return {**record, "pages": {**before.get("pages", {}), **record["pages"]}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help=f"comma-separated pages (default: all): {','.join(PAGES)}")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a few steps each: checks the script, measures nothing (needs --json)",
    )
    parser.add_argument("--json", type=Path, help="the record (default: bench/results/page-times.json)")
    parser.add_argument(
        "--keep", type=Path, help="run in this new folder and keep it (default: a temporary one)"
    )
    args = parser.parse_args(argv)
    names = list(PAGES) if not args.only else [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in names if name not in PAGES]
    if unknown or not names:
        parser.error(
            f"--only: unknown page(s) {', '.join(unknown) or '(none given)'}; pages: {', '.join(PAGES)}"
        )
    names = [
        name for name in PAGES if name in names
    ]  # page order: a later page may start from an earlier run
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
    out = args.json or REPO / "bench/results/page-times.json"
    record = merged(measure_pages(names, args.quick, args.keep), out)
    out.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    for name in names:
        for row in record["pages"][name]["commands"]:
            print(f"{row['wall_s']:8.1f} s {row['cpu_s']:8.1f} CPU-s  {row['command']}")
    print(f"{out}: load average {record['load_average_start'][0]:.1f} -> {record['load_average_end'][0]:.1f}")


if __name__ == "__main__":
    main()

"""A newcomer's path through the pages: every command of the README, docs/getting-started.md and docs/recipes.md
run in page order in a fresh folder, and every documented training command of the docs site writing to a folder
of its own, so that following the pages never ends in "already holds a run". (docs/walkthrough.md's commands run
in page order in tests/test_walkthrough.py.)

A page's commands run as written, with what a CPU and two cores cannot run changed, each change named here: runs
are cut to a few steps of small batches (the overrides below); an accelerate config for GPUs becomes the 2-process
CPU one with a tiny model (tests/test_bert_base_plan.py's overrides); the Hub is the test Hub (user `you` is its
test user); `--num_proc 8` becomes 1. Three commands are not run here, each for its reason: the install (the suite
runs in the installed environment), the test suite itself, and the docs build (tests/test_docs.py builds it).
"""

from __future__ import annotations

import json
import math
import random
import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml
from conftest import TEST_USER
from kiln_testing import REPO, free_port
from test_bert_base_plan import MUST_SHRINK
from test_walkthrough import ACCELERATE, BOOK, HF, KILN_LAUNCH, run

from bench.pages import page_commands

INSTALL = 'pip install -e ".[dev]"'
NOT_RUN = {
    INSTALL: "the install: the suite runs in the installed environment",
    "python -m pytest -n 2 -q": "the test suite: this is it",
    "mkdocs build --strict": "the docs build: tests/test_docs.py builds the site strictly",
}
# a pretraining run cut to 3 steps of 4 sequences, one evaluation batch, no tracker
PRETRAIN_SHORT = [
    "--training.max_steps",
    "3",
    "--training.per_device_train_batch_size",
    "4",
    "--training.eval_steps",
    "3",
    "--training.max_eval_batches",
    "1",
    "--training.mixed_precision",
    "null",
    "--logging.report_to",
    "none",
    "--logging.logging_steps",
    "1",
]
# a fine-tuning run cut to 2 steps of 4 examples, 8 evaluated and 8 predicted
FINETUNE_SHORT = [
    "--training.max_steps",
    "2",
    "--training.per_device_train_batch_size",
    "4",
    "--data.max_eval_samples",
    "8",
    "--data.max_predict_samples",
    "8",
    "--logging.logging_steps",
    "1",
]
GPU_CONFIGS = {
    "configs/accelerate/multi-gpu.yaml",
    "configs/accelerate/single-gpu.yaml",
    "configs/accelerate/bert-base-1x8.yaml",
}


def as_run_here(command: str, work: Path) -> tuple[list[str] | None, dict]:
    """The page's command as this machine runs it (the changes named in the module docstring), or None: not run."""
    if command in NOT_RUN:
        return None, {}
    argv, env = shlex.split(command.replace("you/", f"{TEST_USER}/")), {"HF_HOME": str(work / ".hf-home")}
    if argv[0] in ("kiln-launch", "accelerate"):
        launcher = KILN_LAUNCH if argv[0] == "kiln-launch" else [*ACCELERATE, "launch"]
        args = argv[1:] if argv[0] == "kiln-launch" else argv[2:]
        if argv[0] == "accelerate" and argv[1] != "launch":
            return [*ACCELERATE, *argv[1:]], env  # accelerate config default: into this run's own HF_HOME
        script = next(i for i, arg in enumerate(args) if arg.endswith(".py"))
        launch, args = args[:script], args[script:]
        shrink = PRETRAIN_SHORT if args[0] == "pretrain/run.py" else FINETUNE_SHORT
        if "--config_file" in launch:
            config = launch[launch.index("--config_file") + 1]
            assert config in GPU_CONFIGS, config
            launch = [
                "--config_file",
                "configs/accelerate/cpu-2proc.yaml",
                "--main_process_port",
                str(free_port()),
            ]
            shrink = [*shrink, *MUST_SHRINK]  # a tiny model, 4 sequences a process
            env["ACCELERATE_USE_CPU"] = "1"
        return [*launcher, *launch, *args, *shrink], env
    if argv[0] == "python":
        argv = [a if a != "8" or argv[i - 1] != "--num_proc" else "1" for i, a in enumerate(argv)]
        return [REPO_PYTHON, *argv[1:]], env
    if argv[0] == "hf":
        return [HF, *argv[1:]], env
    raise AssertionError(f"no rule for running {command!r}")


REPO_PYTHON = KILN_LAUNCH[0]


def fresh_folder(tmp_path: Path, files: dict[str, str] | None = None) -> Path:
    """A checkout's scripts and configs (links) in a new folder, and the user's own files."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("configs", "pretrain", "finetune", "kiln", "data"):
        (work / name).symlink_to(REPO / name)
    for name, text in (files or {}).items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text)
    return work


def run_page(page: str, work: Path) -> list[tuple[str, str | None]]:
    """Every command of the page in order: (command, its output, or None where not run)."""
    done = []
    for command in page_commands(REPO / page):
        argv, env = as_run_here(command, work)
        done.append((command, None if argv is None else run(argv, work, env)))
    return done


def test_every_page_gives_the_one_install_command_and_states_the_torch_build_once():
    """README, getting-started and installation install Kiln with the same command; the CPU-only torch index is
    named on the installation page only."""
    for page in ("README.md", "docs/getting-started.md", "docs/installation.md"):
        installs = [c for c in page_commands(REPO / page) if c.startswith("pip install")]
        assert installs == [INSTALL], (page, installs)
    for page in ("README.md", "docs/getting-started.md"):
        assert "download.pytorch.org" not in (REPO / page).read_text(), page
    assert (REPO / "docs/installation.md").read_text().count("https://download.pytorch.org/whl/cpu") == 1


@pytest.mark.slow
def test_the_readme_runs_in_page_order_getting_started_with_it_and_the_main_job_leaves_a_loadable_folder(
    tmp_path, hub
):
    """The README's commands in page order in a fresh folder. docs/getting-started.md's commands that run are the
    README's first ones, in the same order and run the same way (its install and test suite are not run), so this
    one run is getting-started's too. The README's "main job" (`kiln-launch pretrain/run.py`, the default
    encoder-tiny config, shortened as PRETRAIN_SHORT says) leaves a folder that loads and a log the results
    page's plot reads (`accelerate launch pretrain/run.py` in a fresh process: tests/test_walkthrough.py's
    continued pretraining and tests/test_documented_commands.py's two-process run)."""
    corpus = {"corpus/book.txt": BOOK.read_text()}  # the at-scale section's "your text in corpus/"
    work = fresh_folder(tmp_path, corpus)
    done = run_page("README.md", work)
    assert [c for c, out in done if out is None] == list(NOT_RUN), [c for c, _ in done]
    assert [shlex.split(c)[0] for c, out in done if out is not None] == [
        "accelerate",
        "kiln-launch",
        "hf",
        "kiln-launch",
        "python",
        "kiln-launch",
    ]
    assert (work / ".hf-home/accelerate/default_config.yaml").is_file()  # accelerate config default
    assert (work / "runs/encoder-tiny/final/model.safetensors").is_file()
    assert "model.safetensors" in hub.files(f"{TEST_USER}/kiln-encoder-tiny")
    assert (work / "runs/kiln-authorship/final/model.safetensors").is_file()
    assert "model.safetensors" in hub.files(f"{TEST_USER}/kiln-authorship")
    assert (work / "prepared/corpus/manifest.json").is_file()
    # the at-scale command, on configs/accelerate/cpu-2proc.yaml: docs/multi-node.md's two-process CPU config
    # (`accelerate launch --config_file configs/accelerate/cpu-2proc.yaml`; kiln-launch runs accelerate's own launch
    # code on the same arguments) trains on two processes, each step logged once
    launched = done[-1][1]
    assert "processes = 2" in launched and (work / "runs/corpus-small/final/model.safetensors").is_file()
    assert "global batch = 8 sequences" in launched  # 2 processes x 4 per device
    steps = [json.loads(line) for line in (work / "runs/corpus-small/metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in steps if "train/loss" in row] == [1, 2, 3]

    # docs/getting-started.md in page order: the README's first commands that run, nothing else run
    started = page_commands(REPO / "docs/getting-started.md")
    assert [c for c in started if c in NOT_RUN] == [INSTALL, "python -m pytest -n 2 -q"]
    ran = [c for c in started if c not in NOT_RUN]
    assert ran == ["accelerate config default", "kiln-launch pretrain/run.py"]
    assert [c for c, out in done if out is not None][: len(ran)] == ran
    final = work / "runs/encoder-tiny/final"
    assert json.loads((final / "config.json").read_text())["model_type"] == "kiln_encoder"

    # the main job: the default (encoder-tiny) config's model, its files, its metrics
    (main_job,) = [out for c, out in done if c == "kiln-launch pretrain/run.py"]
    out = work / "runs/encoder-tiny"
    default = yaml.safe_load((REPO / "configs/pretrain/encoder-tiny.yaml").read_text())
    saved = json.loads((final / "config.json").read_text())
    assert saved["model_type"] == "kiln_encoder" and "AutoModelForPreTraining" in saved["auto_map"]
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads"):  # the default run's shape
        wanted = default.get("model", {}).get(key)
        assert wanted is None or saved[key] == wanted, (key, saved[key], wanted)
    assert saved["vocab_size"] == 4096  # the WordPiece of the default config, trained on data/pretrain
    for name in (
        "model.safetensors",
        "tokenizer.json",
        "README.md",
        "loss_curve.png",
        "modeling_kiln_encoder.py",
    ):
        assert (final / name).is_file(), name
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [row for row in rows if "train/loss" in row]
    assert [row["step"] for row in train] == [1, 2, 3]
    # an untrained model guesses: MLM loss near ln(vocab), NSP loss near ln 2
    assert train[0]["train/mlm_loss"] == pytest.approx(math.log(4096), abs=0.4)
    assert train[0]["train/nsp_loss"] == pytest.approx(math.log(2), abs=0.1)
    evaluation = [row for row in rows if "eval/mlm_loss" in row]
    assert [row["step"] for row in evaluation] == [3]
    assert {"eval/mlm_accuracy", "eval/nsp_accuracy", "eval/loss"} <= set(evaluation[0])

    # docs/results.md's loss-against-wall-clock plot (experiments/plot_pretraining.py) reads this run and its log
    log, png = tmp_path / "run.log", tmp_path / "loss.png"
    log.write_text(main_job)
    run([REPO_PYTHON, str(REPO / "experiments/plot_pretraining.py"), "--png", str(png), f"{out}:{log}"], REPO)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sys.path.insert(0, str(REPO / "experiments"))
    try:
        from plot_pretraining import series
    finally:
        sys.path.remove(str(REPO / "experiments"))
    points = series(out, log, "train/mlm_loss")  # (minutes, loss) at the steps the progress bar timed
    assert len(points) >= 2 and {loss for _, loss in points} <= {row["train/mlm_loss"] for row in train}


WORDS = (
    "river stone garden window letter morning village doctor winter market bridge candle forest harbor "
    "engine silver orchard lantern meadow captain"
).split()


def my_text(rng: random.Random) -> dict[str, str]:
    """Two .txt files of made-up documents (sentences of a small vocabulary), blank lines between documents."""

    def sentence():
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))).capitalize() + "."

    def document():
        return " ".join(sentence() for _ in range(rng.randint(3, 8)))

    return {f"my-text/part-{i}.txt": "\n\n".join(document() for _ in range(40)) + "\n" for i in (1, 2)}


def my_csv(rng: random.Random) -> str:
    rows = ["text,label"]
    for i in range(64):
        label = ("positive", "negative")[i % 2]
        words = ("good", "great", "lovely") if label == "positive" else ("bad", "dull", "awful")
        rows.append(f'"A {rng.choice(words)} {rng.choice(WORDS)}, truly {rng.choice(words)}.",{label}')
    return "\n".join(rows) + "\n"


def my_conll(rng: random.Random) -> str:
    sentences = []
    for _ in range(48):
        name = rng.choice(["Anna", "Berlin", "Oslo", "Marek"])
        tag = "B-PER" if name in ("Anna", "Marek") else "B-LOC"
        words = [(w, "O") for w in rng.sample(WORDS, 4)]
        words.insert(rng.randint(0, 4), (name, tag))
        sentences.append("\n".join(f"{w} {tag}" for w, tag in words))
    return "\n\n".join(sentences) + "\n"


@pytest.mark.slow
def test_the_task_recipes_run_in_page_order_on_files_of_the_user(tmp_path, hub):
    rng = random.Random(0)
    work = fresh_folder(tmp_path, {**my_text(rng), "reviews.csv": my_csv(rng), "ner.conll": my_conll(rng)})
    done = run_page("docs/recipes.md", work)
    assert all(out is not None for _, out in done)
    assert [shlex.split(c)[:2] for c, _ in done] == [
        *[["kiln-launch", "pretrain/run.py"]] * 4,  # each recipe's first try, then its full run
        *[["kiln-launch", "finetune/classify.py"]] * 2,
        *[["kiln-launch", "finetune/tag.py"]] * 2,
        ["hf", "upload"],
        ["hf", "upload"],
    ]
    first_tries = [c for c, _ in done if "-first-try" in c]
    assert len(first_tries) == 4 and all("--training.max_steps" in c for c in first_tries)
    for kind in ("encoder", "decoder", "classifier", "tagger"):  # a first try leaves a folder of its own
        assert (work / f"runs/my-{kind}-first-try/final/config.json").is_file(), kind
    encoder, decoder = (
        json.loads((work / f"runs/my-{kind}/final/config.json").read_text())
        for kind in ("encoder", "decoder")
    )
    assert (
        encoder["model_type"] == "kiln_encoder" and encoder["hidden_size"] == 256
    )  # BERT-mini, as the page says
    assert decoder["model_type"] == "kiln_decoder"
    vocabulary = json.loads((work / "runs/my-encoder/final/tokenizer.json").read_text())["model"]["vocab"]
    assert "captain" in vocabulary  # the tokenizer was trained on the user's text, not the shipped books
    classifier = json.loads((work / "runs/my-classifier/final/config.json").read_text())
    assert sorted(classifier["id2label"].values()) == ["negative", "positive"]
    tagger = json.loads((work / "runs/my-tagger/final/config.json").read_text())
    assert sorted(tagger["id2label"].values()) == ["B-LOC", "B-PER", "O"]
    for repo in ("my-encoder", "my-classifier"):
        assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(
            hub.files(f"{TEST_USER}/{repo}")
        ), repo


# ---------------------------------------------------------------------------------------------------------------
# every documented training command of the docs site, in the navigation's order: a folder of its own

SITE_PAGES = [
    "docs/installation.md",
    "docs/getting-started.md",
    "docs/recipes.md",
    "docs/walkthrough.md",
    "docs/pretraining.md",
    "docs/data-and-scale.md",
    "docs/scaling.md",
    "docs/continue-pretraining.md",
    "docs/finetuning.md",
    "docs/models.md",
    "docs/electra.md",
    "docs/zero-shot.md",
    "docs/hub.md",
    "docs/multi-node.md",
    "docs/launching.md",
    "docs/failure-handling.md",
    "docs/troubleshooting.md",
]
CONTINUES = ("--training.resume_from_checkpoint", "--training.overwrite_output_dir", "--predict")


def output_folder(command: str) -> list[str]:
    """The folders a documented command trains into (none for commands that train nothing), as the script's own
    config parsing resolves them: --training.output_dir, else the --config file's, else the script's default."""
    words = shlex.split(command)
    while words and re.match(r"^[A-Z_]+=", words[0]):  # VAR=value before the command
        words = words[1:]
    if not words:
        return []
    if words[0] == "python" and words[1:2] == ["finetune/glue.py"]:
        args = words[2:]
        own = args[: args.index("--")] if "--" in args else args
        out = own[own.index("--output-dir") + 1] if "--output-dir" in own else "runs/glue"
        tasks = own[own.index("--tasks") + 1 :] if "--tasks" in own else ["all"]
        return [f"{out}/{task}" for task in tasks if not task.startswith("--")]
    if words[0] not in ("kiln-launch", "accelerate") or (
        words[0] == "accelerate" and words[1:2] != ["launch"]
    ):
        return []
    script = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
    if script is None or "--help" in words or words[script + 1 :][:1] == ["..."]:
        return []
    name, argv = words[script], [w for w in words[script + 1 :] if w != "..."]
    if name == "finetune/adapt.py":
        assert "--training.output_dir" in argv, command  # its folder is named by the page
        return [argv[argv.index("--training.output_dir") + 1]]
    if name == "pretrain/run.py":
        from kiln.config import build_config
        from pretrain.config import RunConfig

        return [build_config(RunConfig, argv).training.output_dir]
    if name.startswith("finetune/"):
        import importlib

        task = importlib.import_module(f"finetune.{Path(name).stem}").TASK
        return [task.parse(argv).training.output_dir]
    return []


def test_every_documented_training_command_of_the_site_has_a_folder_of_its_own(monkeypatch):
    """Run in the order of the navigation, no command of the docs site trains into a folder an earlier one used,
    unless it says it continues or starts over there (--training.resume_from_checkpoint, overwrite_output_dir)."""
    monkeypatch.chdir(REPO)
    used: dict[str, str] = {}
    clashes, counted = [], 0
    for page in SITE_PAGES:
        for command in page_commands(REPO / page):
            folders = output_folder(command)
            counted += bool(folders)
            for folder in folders:
                if folder in used and not any(flag in command for flag in CONTINUES):
                    clashes.append(f"{page}: `{command}` trains into {folder}, which `{used[folder]}` used")
                used.setdefault(folder, f"{page}: {command}")
    assert counted >= 25, counted
    assert not clashes, "\n".join(clashes)


@pytest.mark.parametrize(
    "command, folders",
    [
        ("accelerate launch pretrain/run.py", ["runs/encoder-tiny"]),
        ("kiln-launch pretrain/run.py --config configs/pretrain/decoder-tiny.yaml", ["runs/decoder-tiny"]),
        ("accelerate launch finetune/classify.py --data.glue_task stsb", ["runs/glue/stsb"]),
        ("python finetune/glue.py --tasks sst2 rte", ["runs/glue/sst2", "runs/glue/rte"]),
        (
            "ACCELERATE_USE_CPU=1 accelerate launch --config_file x.yaml pretrain/run.py --training.output_dir runs/a",
            ["runs/a"],
        ),
        ("accelerate config default", []),
    ],
)
def test_the_folder_a_command_trains_into_is_the_one_its_script_resolves(command, folders, monkeypatch):
    monkeypatch.chdir(REPO)
    assert output_folder(command) == folders

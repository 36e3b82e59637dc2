"""The commands the README and docs/ give run, shortened to tiny settings, the way a user types them: in a fresh
process, from the repository root, through `accelerate launch` where the docs say so.

Each run is cut short (a few steps, a small corpus); what is checked is that the command works end to end and
leaves what the docs say it leaves, not the numbers of the full runs.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import yaml
from kiln_testing import REPO

ACCELERATE_LAUNCH = (
    sys.executable,
    "-m",
    "accelerate.commands.accelerate_cli",
    "launch",
)  # = `accelerate launch`


def command(*args, env_extra=None, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    done = subprocess.run(
        [*map(str, args)], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def metrics(output_dir) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


# The README's "main job" (`kiln-launch pretrain/run.py`, the default config) runs and is checked (its saved
# shape, files, metrics and the results page's plot of its log) in tests/test_page_commands.py's README run, which
# trains it anyway; `accelerate launch pretrain/run.py` runs in a fresh process in tests/test_walkthrough.py (one
# process) and kiln_testing.launch_two_processes's tests (two).


# docs/multi-node.md's two-process CPU config (configs/accelerate/cpu-2proc.yaml) trains on two processes (2 x 4 =
# 8 sequences a step, each step logged once, a final model) in tests/test_page_commands.py's README run (its
# at-scale command, launched with that config) and in tests/test_walkthrough.py; plain `accelerate launch` on two
# processes runs in a fresh process in kiln_testing.launch_two_processes's tests.


# docs/multi-node.md's `python bench/engines.py`, as its own CPU smoke form (`--engine none --kind encoder --steps 3
# --small --eval-batches 1`), runs in a fresh process as bench/gpu.py --smoke's engines stage: its summary is
# checked in tests/test_bench.py's test_gpu_bench_runs_every_stage_and_makes_its_tables_from_the_record.


def test_data_bench_measures_every_stage(tmp_path):
    """docs/performance.md's `python bench/data.py`, on one shipped book and a small vocabulary."""
    result = tmp_path / "data.json"
    command(
        sys.executable,
        "bench/data.py",
        "--data-files",
        "data/pretrain/alice_in_wonderland.txt",
        "--vocab-size",
        600,
        "--repeats",
        1,
        "--train-tokens-per-s",
        1000,
        "--json",
        result,
    )
    report = json.loads(result.read_text())
    assert set(report["stages_tokens_per_s"]) == {
        "create_nsp_examples (tokenize + pairs)",
        "MLMCollator",
        "build_pair_instances (pairs only)",
        "train_dataset(epoch) + DataLoader + collator",
    }
    assert all(rate > 0 for rate in report["stages_tokens_per_s"].values())
    assert report["training_tokens_per_s"] == {"kiln": 1000} and 0 <= report["padding_share"] < 0.5
    assert report["examples_per_epoch"] > 10


@pytest.mark.slow
def test_throughput_plot_draws_the_committed_results(tmp_path):
    """docs/performance.md's `python bench/throughput.py --plot ... --png docs/throughput.png`."""
    png = tmp_path / "throughput.png"
    command(
        sys.executable,
        "bench/throughput.py",
        "--plot",
        "bench/results/l4.json",
        "bench/results/encoder-l12.json",
        "--png",
        png,
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_make_corpus_builds_every_source_folder(tmp_path):
    """docs/results.md's `python experiments/make_corpus.py`, on a made-up miniature of ../shared/data."""
    shared, out = tmp_path / "shared", tmp_path / "corpus"
    (shared / "gutenberg").mkdir(parents=True)
    book = (
        "The Project Gutenberg eBook of X\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\n\nIt was a dark\n"
        "and stormy night.\n\nThe end came.\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\nLicense text.\n"
    )
    with gzip.open(shared / "gutenberg" / "pg1_x.txt.gz", "wt", encoding="utf-8") as file:
        file.write(book)
    (shared / "wikitext-2-raw").mkdir()
    for split in ("valid", "test"):
        (shared / "wikitext-2-raw" / f"wiki.{split}.raw").write_text(
            f" = Title {split} = \n\n A well @-@ known fact , 1 @,@ 000 times . \n\n"
        )
    stories = shared / "tinystories"
    stories.mkdir()
    for name, text in (
        ("tinystories_sample3000.json.gz", json.dumps({"texts": ["Tom ran.\nHe fell."]})),
        ("tinystoriesV2_gpt4_train_head10k.txt.gz", "Ann sang.<|endoftext|>Bob hid."),
        ("tinystories_train_first1000.one_per_line.txt.gz", "Cat sat.\nDog dug."),
        ("tinystories_valid_head.txt.gz", "Sun rose.\n\nMoon set."),
    ):
        with gzip.open(stories / name, "wt", encoding="utf-8") as file:
            file.write(text)
    (shared / "multi30k").mkdir()
    (shared / "multi30k" / "train.de").write_text("Ein Hund läuft.\nZwei Katzen.\n")
    (shared / "multi30k" / "val.de").write_text("Ein Mann.\n")
    done = command(sys.executable, "experiments/make_corpus.py", "--shared", shared, "--out", out)
    words = json.loads(done.stdout.strip().splitlines()[-1])["words"]
    assert set(words) == {
        "gutenberg",
        "wikitext",
        "tinystories",
        "tinystories-valid",
        "multi30k-de",
        "multi30k-de-valid",
    }
    book_text = (out / "gutenberg" / "pg1_x.txt").read_text()
    assert (
        "It was a dark and stormy night." in book_text and "Gutenberg" not in book_text
    )  # header, footer gone
    assert "well-known fact, 1,000 times" in (out / "wikitext" / "valid.txt").read_text().replace(" ,", ",")
    assert (out / "multi30k-de" / "train.txt").read_text().split("\n\n")[0].strip() == "Ein Hund läuft."


def test_summarize_rebuilds_the_committed_fine_tuning_table(tmp_path):
    """docs/results.md: `python experiments/run.py summarize` rebuilds docs/results/finetune.md and .json from the
    records in docs/results/runs.jsonl; into another folder, it must give the committed files byte for byte."""
    command(sys.executable, "experiments/run.py", "summarize", "--out", tmp_path)
    for name in ("finetune.md", "finetune.json"):
        assert (tmp_path / name).read_text() == (REPO / "docs/results" / name).read_text(), name


def test_the_results_tables_are_the_ones_the_records_give():
    """The README's and docs/results.md's pretrained-vs-scratch table is `experiments/run.py table` of the recipe's
    declarations, not numbers typed by hand."""
    done = command(
        sys.executable,
        "experiments/run.py",
        "table",
        "experiments/recipe.yaml",
        "experiments/multi30k-de.yaml",
    )
    assert done.stdout.count("\n") == 2 + 4  # header and the four tasks
    assert "| CoNLL-2003 NER (entity F1) | 75.45 ± 0.17 | 62.50 ± 0.48 |" in done.stdout
    for page in ("README.md", "docs/results.md"):
        marked = (REPO / page).read_text().split("<!-- generated by experiments/run.py table ", 1)[1]
        assert marked.split("-->\n", 1)[1].split("<!-- end of generated table -->")[0] == done.stdout, page


def test_every_experiment_declaration_plans_its_runs():
    """`experiments/run.py run X.yaml --dry-run` for each declaration: the commands it would run, nothing run."""
    declarations = sorted((REPO / "experiments").glob("*.yaml"))
    assert len(declarations) >= 8
    planned = {}
    for declaration in declarations:
        if set(yaml.safe_load(declaration.read_text())) <= {
            "description",
            "levers",
            "levers_reference",
        }:  # tables
            failed = subprocess.run(
                [sys.executable, "experiments/run.py", "run", declaration.relative_to(REPO), "--dry-run"],
                cwd=REPO,
                capture_output=True,
                text=True,
            )
            assert (
                failed.returncode == 1
                and failed.stderr.count("\n") == 1
                and "declares no runs" in failed.stderr
            )
            continue
        done = command(
            sys.executable, "experiments/run.py", "run", declaration.relative_to(REPO), "--dry-run"
        )
        assert "accelerate launch" in done.stdout, declaration.name
        planned[declaration.name] = done.stdout
    recipe = planned["recipe.yaml"]  # `experiments/run.py run experiments/recipe.yaml --dry-run`, run above
    phases = [block.strip().splitlines()[1:] for block in recipe.split("# phase ")[1:]]
    assert [len(commands) for commands in phases] == [
        1,
        1,
        18,
    ]  # corpus; the encoder; 3 tasks x 2 inits x 3 seeds
    assert phases[1] == [
        "accelerate launch pretrain/run.py --config configs/experiments/encoder-30min.yaml "
        "--training.output_dir runs/encoder-30min-sop13k"
    ]
    assert (
        "accelerate launch finetune/classify.py --config configs/experiments/sst2.yaml --model.checkpoint "
        "runs/encoder-30min-sop13k/final --model.from_scratch --training.lr 2.5e-4 --training.seed 3 "
        "--training.output_dir runs/ft/sst2-scratch-lr2.5e-4-s3 --training.overwrite_output_dir "
        "--logging.logging_steps 100 --data.test_file ../shared/data/sst2/test-labeled.tsv"
    ) in phases[2]


def _runner():
    spec = importlib.util.spec_from_file_location("kiln_experiments_run", REPO / "experiments/run.py")
    runner = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = runner  # dataclasses look their module up there
    spec.loader.exec_module(runner)
    return runner


def test_only_plans_the_named_runs_after_the_corpus():
    """`run X.yaml --only NAME`: the corpus, then just that pretraining run (no fine-tuning), or just the fine-tuning
    run of that folder name; a name the declaration does not have is a one-line error naming it."""
    done = command(
        sys.executable,
        "experiments/run.py",
        "run",
        "experiments/grid.yaml",
        "--only",
        "grid-decoder-wsd",
        "--dry-run",
    )
    phases = [block.strip().splitlines()[1:] for block in done.stdout.split("# phase ")[1:]]
    local = " --shared ../shared/data" if (REPO.parent / "shared" / "data").is_dir() else ""
    assert phases == [
        ["python experiments/make_corpus.py" + local],
        [
            "accelerate launch pretrain/run.py --config configs/experiments/grid-decoder-wsd.yaml "
            "--training.output_dir runs/grid-decoder-wsd"
        ],
    ]
    failed = subprocess.run(
        [
            sys.executable,
            "experiments/run.py",
            "run",
            "experiments/grid.yaml",
            "--only",
            "grid-nothing",
            "--dry-run",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert failed.returncode == 1 and failed.stderr.count("\n") == 1 and "grid-nothing" in failed.stderr

    # fine-tuning runs by their folder's name: just those (no corpus in this declaration), nothing else
    done = command(
        sys.executable,
        "experiments/run.py",
        "run",
        "experiments/grid-finetune.yaml",
        "--only",
        "ud-pos-pretrained-lr4e-3-s1-grid-encoder-mask30",
        "--dry-run",
    )
    phases = [block.strip().splitlines()[1:] for block in done.stdout.split("# phase ")[1:]]
    assert len(phases) == 1 and len(phases[0]) == 1, phases
    assert "--model.checkpoint runs/grid-encoder-mask30/final" in phases[0][0]
    assert "--training.output_dir runs/ft/ud-pos-pretrained-lr4e-3-s1-grid-encoder-mask30 " in phases[0][0]


def test_a_pretraining_run_stopped_before_its_end_continues_from_its_checkpoint(tmp_path):
    """A run folder with checkpoints and no final/ (a session's cut): `run` continues it with
    `--training.resume_from_checkpoint latest` and its record says from which step; a finished run or a fresh folder
    runs its command as declared."""
    runner = _runner()
    argv_file = tmp_path / "argv.json"
    script = f"import json, sys; json.dump(sys.argv[1:], open({str(argv_file)!r}, 'w'))"

    def run(out):
        job = runner.Job("grid-x", str(out), "", [sys.executable, "-c", script, "--config", "x.yaml"])
        with open(tmp_path / "log", "a") as log:
            assert runner.execute(job, log, dict(os.environ)) == 0
        return job, json.loads(argv_file.read_text())

    stopped = tmp_path / "stopped"
    (stopped / "checkpoints" / "step-600").mkdir(parents=True)
    (stopped / "checkpoints" / "step-1200").mkdir()
    job, argv = run(stopped)
    assert argv == ["--config", "x.yaml", "--training.resume_from_checkpoint", "latest"]
    assert job.resumed_from_step == 1200
    (stopped / "final").mkdir()  # finished: nothing to continue
    job, argv = run(stopped)
    assert argv == ["--config", "x.yaml"] and job.resumed_from_step == 0
    job, argv = run(tmp_path / "fresh")
    assert argv == ["--config", "x.yaml"] and job.resumed_from_step == 0


def _record(task: str, init: str, lr: str, seed: int, dev: float, ckpt: str, samples=None, epochs=1) -> dict:
    note = f"{task} {init} lr={lr} seed={seed} ckpt={ckpt}"
    config = {"training": {"num_train_epochs": epochs}, "data": {"max_train_samples": samples}}
    metric = "eval/f1" if task == "conll2003" else "eval/accuracy"
    return {
        "tag": task,
        "run": "x",
        "note": note,
        "wall_s": 1.0,
        "commit": "abc",
        "eval_last": {metric: dev},
        "config": config,
    }


def test_plot_draws_the_declared_curves_from_the_records(tmp_path):
    """`experiments/run.py plot X.yaml`: a label curve (dev metric against --data.max_train_samples) and a compute
    curve (dev metric over scratch against pretraining minutes), each a PNG and a Markdown table of the records'
    means; a curve whose records are missing is a one-line error."""
    records = []
    for seed, noise in ((1, 0.0), (2, 0.01), (3, -0.01)):
        for samples, pre, scr in ((500, 0.60, 0.55), (None, 0.82, 0.80)):
            epochs = 4 if samples else 1
            records.append(
                _record("sst2", "pretrained", "2e-3", seed, pre + noise, "runs/enc-30/final", samples, epochs)
            )
            records.append(
                _record("sst2", "scratch", "2.5e-4", seed, scr + noise, "runs/enc-30/final", samples, epochs)
            )
        records.append(_record("sst2", "pretrained", "5e-4", seed, 0.66 + noise, "runs/enc-30/final", 500, 4))
        for init, dev in (("runs/enc-7/final", 0.70), ("runs/enc-30/final", 0.75)):
            records.append(_record("conll2003", "pretrained", "2e-3", seed, dev, init, epochs=3))
        records.append(_record("conll2003", "scratch", "4e-3", seed, 0.62, "runs/enc-30/final", epochs=3))
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    declaration = {
        "description": "test",
        "curves": [
            {
                "kind": "labels",
                "png": "labels.png",
                "task": "sst2",
                "sizes": [500, 67349],
                "full": 67349,
                "lines": [
                    {"label": "pretrained", "group": {"init": "enc-30", "lr": "2e-3"}},
                    {"label": "scratch", "group": {"init": "scratch (enc-30)", "lr": "2.5e-4"}},
                    {
                        "label": "pretrained, rate per size",
                        "group": {"init": "enc-30", "lr": "2e-3"},
                        "lr_by_size": {500: "5e-4"},
                    },
                ],
            },
            {
                "kind": "compute",
                "png": "compute.png",
                "minutes": {"enc-7": 7.5, "enc-30": 30},
                "tasks": [
                    {
                        "task": "conll2003",
                        "label": "CoNLL",
                        "pretrained": {"lr": "2e-3"},
                        "scratch": {"init": "scratch (enc-30)", "lr": "4e-3"},
                    }
                ],
            },
        ],
    }
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(declaration))
    done = command(
        sys.executable,
        "experiments/run.py",
        "plot",
        tmp_path / "x.yaml",
        "--records",
        tmp_path / "runs.jsonl",
        "--root",
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    for name in ("labels", "compute"):
        assert (tmp_path / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    labels = (tmp_path / "labels.md").read_text()
    assert "| 500 | 60.00 ± 1.00 (n=3) | 55.00 ± 1.00 (n=3) | 66.00 ± 1.00 (n=3, lr 5e-4) |" in labels, labels
    assert "| 67,349 | 82.00 ± 1.00 (n=3) | 80.00 ± 1.00 (n=3) | 82.00 ± 1.00 (n=3, lr 2e-3) |" in labels, (
        labels
    )
    compute = (tmp_path / "compute.md").read_text()
    assert "| 7.5 | +8.00 ± 0.00 (n=3) |" in compute and "| 30 | +13.00 ± 0.00 (n=3) |" in compute, compute

    declaration["curves"][0]["sizes"] = [2000, 67349]  # no records at 2,000 examples
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(declaration))
    failed = subprocess.run(
        [
            sys.executable,
            "experiments/run.py",
            "plot",
            tmp_path / "x.yaml",
            "--records",
            tmp_path / "runs.jsonl",
            "--root",
            tmp_path,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert (
        failed.returncode == 1
        and failed.stderr.count("\n") == 1
        and "0 record groups for sst2" in failed.stderr
    )


def test_levers_renders_record_groups_against_their_baseline_and_keeps_the_page_s_other_block(tmp_path):
    """`experiments/run.py levers X.yaml --update PAGE`: one row per record group (dev and test mean ± std, n; dev
    over the baseline row, or over the row a lever names as `versus`; the command of its declaration), written
    into its own block of the page; `table --update` of the same page rewrites only its own block. A lever whose
    record group is missing is a one-line error."""
    records = []
    for seed, noise in ((1, 0.0), (2, 0.01), (3, -0.01)):
        records.append(_record("sst2", "scratch", "2.5e-4", seed, 0.80 + noise, "runs/enc-30/final"))
        records.append(_record("sst2", "pretrained", "2e-3", seed, 0.83 + noise, "runs/enc-30/final"))
        records.append(_record("sst2", "scratch", "5e-5", seed, 0.60 + noise, "runs/enc-30/final", 500, 64))
        records.append(
            _record("sst2", "pretrained", "1e-3", seed, 0.65 + noise, "runs/enc-30/final", 500, 64)
        )
    records[0]["test"] = {"accuracy": 0.79}
    records[1]["test"] = {"accuracy": 0.81}
    records.append(_record("sst2", "pretrained", "2e-3", 1, 0.78, "runs/enc-7/final"))
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    full = {"lr": "2.5e-4", "epochs": "1", "train_samples": ""}
    declaration = {
        "description": "test",
        "levers": [
            {
                "label": "scratch",
                "task": "sst2",
                "group": {"init": "scratch (enc-30)", **full},
                "experiment": "experiments/recipe.yaml",
                "baseline": True,
            },
            {
                "label": "recipe",
                "task": "sst2",
                "group": {"init": "enc-30", "lr": "2e-3", "train_samples": ""},
                "experiment": "experiments/recipe.yaml",
                "note": "pretraining 30 min",
            },
            {
                "label": "7.5 min",
                "task": "sst2",
                "group": {"init": "enc-7", "lr": "2e-3"},
                "experiment": ["experiments/compute-curve.yaml", "experiments/recipe.yaml"],
            },
            {
                "label": "scratch, 500",
                "task": "sst2",
                "group": {"init": "scratch (enc-30)", "lr": "5e-5"},
                "experiment": "experiments/sst2-labels.yaml",
                "baseline": True,
            },
            {
                "label": "recipe, 500",
                "task": "sst2",
                "group": {"init": "enc-30", "lr": "1e-3", "train_samples": "500"},
                "experiment": "experiments/sst2-labels.yaml",
                "versus": "scratch, 500",
            },
        ],
        "table": [
            {
                "task": "sst2",
                "label": "SST-2",
                "pretrained": {"init": "enc-30", "lr": "2e-3", "epochs": "1"},
                "scratch": {"init": "scratch (enc-30)", **full},
            }
        ],
    }
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(declaration))
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n<!-- generated by experiments/run.py table old -->\n| old table |\n"
        "<!-- end of generated table -->\n\n<!-- generated by experiments/run.py levers other.yaml -->\n"
        "| other levers |\n<!-- end of generated table -->\n\nBetween.\n\n"
        f"<!-- generated by experiments/run.py levers {tmp_path / 'x.yaml'} -->\n"
        "| old levers |\n<!-- end of generated table -->\n\nAfter.\n"
    )
    run = (sys.executable, "experiments/run.py")
    done = command(
        *run, "levers", tmp_path / "x.yaml", "--records", tmp_path / "runs.jsonl", "--update", page
    )
    lines = done.stdout.splitlines()
    assert (
        lines[0]
        == "| lever | budget and settings | dev (mean ± std) | test (mean ± std) | dev over scratch | command |"
    )
    assert lines[2:] == [
        "| scratch |  | 80.00 ± 1.00 (n=3) | 79.00 (n=1) | baseline | `python experiments/run.py run experiments/recipe.yaml` |",
        "| recipe | pretraining 30 min | 83.00 ± 1.00 (n=3) | 81.00 (n=1) | +3.00 | "
        "`python experiments/run.py run experiments/recipe.yaml` |",
        "| 7.5 min |  | 78.00 (n=1) |  | -2.00 | `python experiments/run.py run experiments/compute-curve.yaml`, then "
        "`python experiments/run.py run experiments/recipe.yaml` |",
        "| scratch, 500 |  | 60.00 ± 1.00 (n=3) |  | baseline | `python experiments/run.py run experiments/sst2-labels.yaml` |",
        "| recipe, 500 |  | 65.00 ± 1.00 (n=3) |  | +5.00 (vs scratch, 500) | "
        "`python experiments/run.py run experiments/sst2-labels.yaml` |",
    ]
    text = page.read_text()
    assert "| old table |" in text and "| old levers |" not in text and text.endswith("\n\nAfter.\n")
    assert "| other levers |" in text  # another declaration's levers block on the same page: left alone
    assert f"<!-- generated by experiments/run.py levers {tmp_path / 'x.yaml'} -->\n{done.stdout}" in text

    table = command(
        *run, "table", tmp_path / "x.yaml", "--records", tmp_path / "runs.jsonl", "--update", page
    )
    assert "| SST-2 | 83.00 ± 1.00 | 80.00 ± 1.00 | +3.00 | 81.00 vs 79.00 (+2.00) | 3 |" in table.stdout
    spec = importlib.util.spec_from_file_location("kiln_run_levers", REPO / "experiments/run.py")
    runner = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = runner  # dataclasses look their module up there
    spec.loader.exec_module(runner)
    assert runner.generated_block(page) == table.stdout
    assert (
        runner.generated_block(page, f"{runner.LEVERS_BEGIN} {tmp_path / 'x.yaml'}") == done.stdout
    )  # untouched
    assert page.read_text().startswith("# Page\n\n") and page.read_text().endswith("\n\nAfter.\n")

    for broken, message in (
        ({"lr": "4e-3"}, "0 record groups for sst2"),
        ({"lr": None}, "2 record groups for sst2"),
    ):
        group = {"init": "enc-30", "lr": "2e-3", **broken}
        declaration["levers"][1]["group"] = {k: v for k, v in group.items() if v is not None}
        (tmp_path / "x.yaml").write_text(yaml.safe_dump(declaration))
        failed = subprocess.run(
            [*run, "levers", tmp_path / "x.yaml", "--records", tmp_path / "runs.jsonl"],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        assert failed.returncode == 1 and failed.stderr.count("\n") == 1 and message in failed.stderr, (
            failed.stderr
        )
        assert "lever 'recipe'" in failed.stderr

"""The measurement scripts behind docs tables that quote whole commands (bench/shipped_commands.py, bench/threads.py)
run end to end in their --quick mode, write the record bench/report.py reads, and report.py makes its table from it.
Nothing is timed here: the quick records hold a few steps, not a measurement, and report.py refuses them.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys

import pytest
from kiln_testing import REPO


def load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


shipped = load("kiln_bench_shipped_commands", "bench/shipped_commands.py")
report = load("kiln_bench_report_for_records", "bench/report.py")


@pytest.mark.slow
def test_shipped_commands_quick_runs_the_documented_command_and_records_its_results(
    kiln_checkpoints, tmp_path, monkeypatch, capsys
):
    """`--quick --only classify,sst2` from a given encoder: the classify row runs through `accelerate launch` in a
    fresh folder and its metrics are the run's test_results.json; the offline row is skipped, with the reason, where
    ../shared/data is absent."""
    encoder, _ = kiln_checkpoints
    monkeypatch.setattr(shipped, "SHARED_DATA", tmp_path / "no-shared-data")
    out, work = tmp_path / "record.json", tmp_path / "work"
    shipped.main(
        [
            "--quick",
            "--only",
            "classify,sst2",
            "--encoder",
            str(encoder),
            "--json",
            str(out),
            "--keep",
            str(work),
        ]
    )
    printed = capsys.readouterr().out
    assert "skipping sst2" in printed and "../shared/data is absent" in printed
    record = json.loads(out.read_text())
    assert record["quick"] is True and set(record["skipped"]) == {"sst2"}
    assert [row["name"] for row in record["rows"]] == ["classify"]
    (row,) = record["rows"]
    assert row["command"] == "accelerate launch finetune/classify.py"
    assert (
        row["data"] == "32 train sentences, 4 authors" and row["train_examples"] == 32 and row["labels"] == 4
    )
    written = json.loads(
        (work / "classify" / "runs" / "classify-authorship" / "test_results.json").read_text()
    )
    assert row["test"] == written and {"accuracy", "f1", "matthews_correlation"} <= set(written)
    assert all(math.isfinite(value) for value in row["test"].values())
    assert row["wall_s"] > 0 and int(row["threads"]) >= 1
    assert (
        record["pretrained"]["encoder"]["given"] == "--encoder"
        and record["pretrained"]["encoder"]["parameters"] > 0
    )
    for key in ("date_utc", "commit", "torch", "load_average_start", "load_average_end"):
        assert record[key], key
    assert record["machine"]["cores"] >= 1

    monkeypatch.setattr(report, "RESULTS", tmp_path)
    (tmp_path / "shipped-commands.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="--quick record"):
        report.shipped_commands_table()
    (tmp_path / "shipped-commands.json").write_text(json.dumps({**record, "quick": False}))
    table = report.shipped_commands_table()
    assert (
        # seconds, or minutes and seconds from 100 s on (a loaded machine): the table's own rule
        f"| `accelerate launch finetune/classify.py` | 32 train sentences, 4 authors | {report._duration(row['wall_s'])} | "
        f"accuracy {written['accuracy']:.3f}, macro F1 {written['f1']:.3f}"
    ) in table
    assert "Not run (no local copy): sst2." in table


@pytest.mark.slow
def test_shipped_commands_run_the_documented_config_paths_from_a_fresh_folder(tmp_path):
    """The documented commands name `--config configs/...` relative to the folder they run in: each command's fresh
    folder sees the repository's configs/, as a user's checkout does."""
    cwd = tmp_path / "decoder"
    cwd.mkdir()
    _, output = shipped.launch(
        "pretrain/run.py",
        ("--config", "configs/pretrain/decoder-tiny.yaml", "--print_config"),
        cwd,
        tmp_path / "decoder.log",
    )
    assert "kind: decoder" in output and "config file not found" not in output


def test_shipped_commands_refuses_unknown_rows_a_quick_run_without_its_own_record_and_a_used_folder(
    tmp_path, capsys
):
    for argv in (
        ["--only", "classify,nope"],
        ["--quick", "--only", "classify"],
        ["--only", "classify", "--keep", str(tmp_path)],
    ):
        with pytest.raises(SystemExit) as stop:
            shipped.main(argv)
        assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "unknown row(s) nope" in err and "give --json" in err and "give a new folder" in err


def test_the_shipped_commands_table_formats_every_row_from_the_record(tmp_path, monkeypatch):
    """A record of every row (numbers made up here): each row's command, data, time and task metrics appear as the
    page writes them, and the sentences after the table are computed from the rows they compare."""
    rows = []
    tests = {
        "classify": {"accuracy": 0.52, "f1": 0.507, "matthews_correlation": 0.365},
        "classify-padded": {"accuracy": 0.546, "f1": 0.5, "matthews_correlation": 0.39},
        "tag": {"accuracy": 0.783},
        "seq2seq": {"rouge1": 0.184, "rouge2": 0.03, "rougeL": 0.166},
        "seq2seq-scratch": {"rouge1": 0.153, "rouge2": 0.02, "rougeL": 0.138},
        "sst2": {"accuracy": 0.795, "f1": 0.794, "matthews_correlation": 0.59},
        "conll2003": {
            "f1": 0.417,
            "precision": 0.424,
            "recall": 0.411,
            "LOC_f1": 0.545,
            "ORG_f1": 0.433,
            "PER_f1": 0.342,
            "MISC_f1": 0.249,
        },
        "multi30k": {"bleu": 8.98, "chrf": 31.7},
    }
    for i, row in enumerate(shipped.ROWS):
        rows.append(
            {
                "name": row.name,
                "command": shipped.documented(row.script, row.args),
                "offline": row.offline,
                "data": row.data.format(train=2000, train_k=14, labels=4, epochs="3"),
                "train_examples": 2000,
                "labels": 4,
                "num_beams": 4,
                "wall_s": 60.0 + 50 * i,
                "threads": "2",
                "test": tests[row.name],
            }
        )
    record = {
        "quick": False,
        "date_utc": "2030-01-02T03:04:05Z",
        "machine": {"cores": 2, "cpu": "AMD EPYC"},
        "torch": "2.13.0+cpu",
        "load_average_start": [1.0, 1, 1],
        "load_average_end": [3.5, 1, 1],
        "skipped": {},
        "rows": rows,
        "pretrained": {
            "encoder": {"wall_s": 130.0, "parameters": 975362},
            "decoder": {"wall_s": 95.0, "parameters": 1_234_567},
        },
    }
    (tmp_path / "shipped-commands.json").write_text(json.dumps(record))
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    table = report.shipped_commands_table()
    assert table.startswith(
        "What these commands gave (2-core AMD EPYC, 2 threads per process, torch 2.13, 2030-01-02; "
        "load average 1.0 at the start and 3.5 at the end"
    )
    for row in rows:  # the default: one thread, said in the singular
        row["threads"] = "1"
    (tmp_path / "shipped-commands.json").write_text(json.dumps(record))
    assert report.shipped_commands_table().startswith(
        "What these commands gave (2-core AMD EPYC, 1 thread per process, "
    )
    for row in rows:
        row["threads"] = "2"
    (tmp_path / "shipped-commands.json").write_text(json.dumps(record))
    assert (
        "from the default pretrained checkpoints above (1.0M and 1.2M parameters), which their commands made first"
        in table
    )
    assert (
        "2m10s" not in table and "95 s" not in table
    )  # their times are the default run's record's, not this one's
    assert "the last three rows read local copies" in table
    for expected in (
        "| `accelerate launch finetune/classify.py` | 2,000 train sentences, 4 authors | 60 s | accuracy 0.520, "
        "macro F1 0.507, MCC 0.365 (chance: 0.25) |",
        "| `… classify.py --model.unpad_inputs false` | same | 1m50s | accuracy 0.546,",
        "| `accelerate launch finetune/tag.py` | 2,000 train sentences, 4 UPOS tags | 2m40s | token accuracy 0.783 |",
        "| `… seq2seq.py --model.from_scratch` | same | 4m20s | ROUGE-1 0.153, ROUGE-2 0.020, ROUGE-L 0.138 |",
        "| `… tag.py --config configs/finetune/offline/tag-conll2003.yaml` | CoNLL-2003 NER, 14k sentences, 3 epochs | "
        "6m00s | entity F1 0.417 (P 0.424, R 0.411; LOC 0.545, ORG 0.433, PER 0.342, MISC 0.249) |",
        "| Multi30k en→de, 14k pairs | 6m50s | BLEU 8.98, chrF 31.7 (beam 4) |",
        "gave accuracy 0.546 against 0.520: on 2,000 training sentences, dropout alone moves the authorship result "
        "by 2.6 points.",
        "The pretrained seq2seq beats the same shapes from scratch (ROUGE-L 0.166 against 0.138).",
    ):
        assert expected in table, expected


threads = load("kiln_bench_threads", "bench/threads.py")


@pytest.mark.slow
def test_threads_quick_runs_the_default_command_on_one_thread_and_per_core(tmp_path, monkeypatch):
    """`bench/threads.py --quick`: the default run twice through `accelerate launch`, with OMP_NUM_THREADS=1 and with
    a thread per physical core (whatever this process's environment says), each with the thread count it printed,
    its logged tokens/s windows, the training loop's clock, its wall clock and CPU-seconds and its last
    evaluation."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the thread-per-core run must not inherit it
    out = tmp_path / "threads-quiet.json"
    threads.main(["--quick", "--json", str(out)])
    record = json.loads(out.read_text())
    one, per_core = record["runs"]
    cores = threads.physical_cores()
    assert (one["label"], one["environment"]) == ("one thread", {"OMP_NUM_THREADS": "1"})
    assert (per_core["label"], per_core["environment"]) == (
        "a thread per core",
        {"OMP_NUM_THREADS": str(cores)},
    )
    assert one["threads"] == 1 and per_core["threads"] == cores
    for run in (one, per_core):
        assert run["steps"] == 6 and len(run["tokens_per_s_windows"]) == 3  # logged every 2 steps
        assert run["tokens_per_s_median"] == pytest.approx(sorted(run["tokens_per_s_windows"])[1], abs=0.1)
        assert 0 < run["training_loop_s"] < run["wall_s"]
        assert 0 < run["cpu_s"]  # the launcher's and the training process's, counted once they ended
        assert run["last_eval"]["step"] == 6 and math.isfinite(run["last_eval"]["eval/mlm_loss"])
    assert record["quick"] is True and record["condition"] == "quiet" and "background" not in record
    assert record["command"] == "accelerate launch pretrain/run.py" and record["machine"]["cpu"]
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    with pytest.raises(ValueError, match="--quick record"):
        report.threads_table()


def test_the_busy_load_runs_a_busy_loop_per_process_and_stops_them():
    """`--busy`'s background: the processes spin (they use CPU) while the block runs and are gone after it."""
    import resource
    import time

    load = threads.BusyLoad(processes=1, settle_s=0.3)
    assert load.describe()["processes"] == 1 and "while True: pass" in load.describe()["each"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with load:
        (process,) = load.started
        assert process.poll() is None
        time.sleep(0.2)
    assert process.poll() is not None
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert after.ru_utime + after.ru_stime > before.ru_utime + before.ru_stime  # it spun


def threads_record(condition: str, one: tuple[float, float], per_core: tuple[float, float], **extra) -> dict:
    """A synthetic bench/threads.py record: (wall_s, cpu_s) of each setting."""
    run = {"tokens_per_s_windows": [], "steps": 600}
    record = {
        "quick": False,
        "condition": condition,
        "command": "accelerate launch pretrain/run.py",
        "date_utc": "2030-01-02T03:04:05Z" if condition == "quiet" else "2030-01-03T03:04:05Z",
        "machine": {"cpu": "AMD EPYC 7B13", "cores": 2, "physical_cores": 2},
        "torch": "2.13.0+cpu",
        "load_average_before": [0.2, 0, 0] if condition == "quiet" else [2.1, 0, 0],
        "load_average_after": [1.1, 0, 0] if condition == "quiet" else [3.9, 0, 0],
        "runs": [
            {
                **run,
                "label": "one thread",
                "environment": {"OMP_NUM_THREADS": "1"},
                "threads": 1,
                "tokens_per_s_median": 20735.4,
                "training_loop_s": one[0] - 8,
                "wall_s": one[0],
                "cpu_s": one[1],
                "last_eval": {"step": 600, "eval/mlm_loss": 6.029814706324721},
            },
            {
                **run,
                "label": "a thread per core",
                "environment": {"OMP_NUM_THREADS": "2"},
                "threads": 2,
                "tokens_per_s_median": 32845.0,
                "training_loop_s": per_core[0] - 8,
                "wall_s": per_core[0],
                "cpu_s": per_core[1],
                "last_eval": {"step": 600, "eval/mlm_loss": 6.029814706355},
            },
        ],
        **extra,
    }
    if condition == "busy":
        record["background"] = threads.BusyLoad(processes=2).describe()
    return record


def test_the_default_thread_count_is_the_one_with_the_fewest_cpu_seconds_quiet_and_busy():
    """choose_default: fewest CPU-seconds summed over the quiet and the busy record; within 1%, the lower summed
    wall clock; refused for quick records, records measured the other way and thread counts that differ."""
    quiet = threads_record("quiet", one=(92.0, 91.0), per_core=(57.4, 110.0))
    busy = threads_record("busy", one=(180.0, 95.0), per_core=(1361.0, 903.0))
    chosen = threads.choose_default(quiet, busy)
    assert (chosen["label"], chosen["threads"]) == ("one thread", 1)
    assert chosen["sums"] == {
        "one thread": {"threads": 1, "cpu_s": 186.0, "wall_s": 272.0},
        "a thread per core": {"threads": 2, "cpu_s": 1013.0, "wall_s": 1418.4},
    }
    cheap_busy = threads_record("busy", one=(180.0, 95.0), per_core=(120.0, 60.0))
    assert threads.choose_default(quiet, cheap_busy)["label"] == "a thread per core"  # 170 against 186
    tie = threads_record("busy", one=(180.0, 95.0), per_core=(100.0, 75.5))  # 185.5 against 186: within 1%
    assert threads.choose_default(quiet, tie)["label"] == "a thread per core"  # and faster
    with pytest.raises(ValueError, match="--quick"):
        threads.choose_default({**quiet, "quick": True}, busy)
    with pytest.raises(ValueError, match="measured quiet"):
        threads.choose_default(quiet, {**busy, "condition": "quiet"})
    odd = threads_record("busy", one=(180.0, 95.0), per_core=(120.0, 60.0))
    odd["runs"][1]["threads"] = 4
    with pytest.raises(ValueError, match="2 threads quiet, 4 busy"):
        threads.choose_default(quiet, odd)


def test_the_threads_table_is_its_records(tmp_path, monkeypatch):
    quiet = threads_record("quiet", one=(129.0, 128.2), per_core=(85.3, 161.0))
    busy = threads_record("busy", one=(250.4, 130.0), per_core=(1361.0, 903.0))
    (tmp_path / "threads-quiet.json").write_text(json.dumps(quiet))
    (tmp_path / "threads-busy.json").write_text(json.dumps(busy))
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    table = report.threads_table()
    assert table.startswith(
        "Measured on an AMD EPYC 7B13 (2 cores, torch 2.13), `accelerate launch pretrain/run.py` without a config, "
        "once with `OMP_NUM_THREADS=1` and once with a thread per physical core: quiet (2030-01-02, load average "
        "0.2 before the first run and 1.1 after the last) and busy (2030-01-03, beside two busy-looping processes, "
        "one per core; load average 2.1 before and 3.9 at the end)"
    )
    assert (
        "| quiet | one thread | 20,735 | 2:09 | 128 |\n"
        "| quiet | a thread per core (2) | 32,845 | 1:25 | 161 |\n"
        "| busy | one thread | 20,735 | 4:10 | 130 |\n"
        "| busy | a thread per core (2) | 32,845 | 22:41 | 903 |\n" in table
    )
    assert (
        "Fewest CPU-seconds, quiet and busy summed: **one thread** (258 for one thread against 1,064 for a "
        in table
    )
    assert (
        "eval MLM loss at step 600 agreed to 11 significant digits (6.029814706325 and 6.029814706355)"
        in table
    )
    assert report.agreeing_digits(1.5, 1.5) is None and report.agreeing_digits(0.1234, 0.1235) == 3
    assert report.agreeing_digits(6.03, 5.99) == 0 and report.agreeing_digits(100.0, 10.0) == 0
    (tmp_path / "threads-quiet.json").write_text(json.dumps({**quiet, "load_average_before": [1.8, 0, 0]}))
    with pytest.raises(ValueError, match="not on a quiet machine"):
        report.threads_table()
    (tmp_path / "threads-quiet.json").write_text(json.dumps(quiet))
    (tmp_path / "threads-busy.json").write_text(json.dumps({**busy, "quick": True}))
    with pytest.raises(ValueError, match="threads-busy.json is a --quick record"):
        report.threads_table()


recipe_times = load("kiln_bench_recipe_times", "bench/recipe_times.py")


def test_every_training_recipe_has_a_first_try_before_its_full_run():
    """docs/recipes.md, as bench/recipe_times.py reads it: four (first try, full run) pairs in page order; a first try
    is its full run cut by --training.max_steps to a small share of the full run's steps, into a folder of its own,
    and the fine-tuning first tries start from the encoder's first try."""
    pairs = recipe_times.recipes()
    assert [p["name"] for p in pairs] == ["my-encoder", "my-decoder", "my-classifier", "my-tagger"]
    assert set(report.RECIPE_TITLES) == {p["name"] for p in pairs}
    for pair in pairs:
        first, full = pair["first_try"].split(), pair["full"].split()
        steps = int(first[first.index("--training.max_steps") + 1])
        assert 10 <= steps <= 100 and "--training.max_steps" not in full, pair
        assert first[first.index("--training.output_dir") + 1] == f"runs/{pair['name']}-first-try"
        assert full[full.index("--training.output_dir") + 1] == f"runs/{pair['name']}"
        dropped = {
            "--training.max_steps",
            str(steps),
            f"runs/{pair['name']}-first-try",
            "runs/my-encoder-first-try/final",
        }
        assert [w for w in first if w not in dropped] == [
            w for w in full if w not in {f"runs/{pair['name']}", "runs/my-encoder/final"}
        ], pair
        if pair["script"].startswith("finetune/"):
            assert "runs/my-encoder-first-try/final" in first and "runs/my-encoder/final" in full
    encoder = pairs[0]
    assert "configs/pretrain/encoder-mini.yaml" in encoder["full"]


def test_the_recipe_times_user_files_are_the_shipped_samples(tmp_path):
    facts = recipe_times.make_user_files(tmp_path)
    assert sorted(p.name for p in (tmp_path / "my-text").iterdir()) == sorted(
        p.name for p in (REPO / "data/pretrain").glob("*.txt")
    )
    lines = (tmp_path / "reviews.csv").read_text().splitlines()
    assert lines[0] == "text,label" and len(lines) > 1000
    sentences = (tmp_path / "ner.conll").read_text().strip().split("\n\n")
    assert len(sentences) > 1000 and all(len(line.split(" ")) == 2 for line in sentences[0].splitlines())
    assert "(2,000 rows)" in facts["reviews.csv"] and f"({len(sentences):,} sentences)" in facts["ner.conll"]
    assert (tmp_path / "configs").resolve() == REPO / "configs"


def test_the_recipe_rate_is_timed_after_warm_up_from_the_progress_bar():
    bar = "train:  33%|███▎      | 2/6 [00:01<00:03,  1.14it/s, loss=8.3349, lr=8.00e-04]"
    assert recipe_times.PROGRESS.match(bar).groups() == ("2", "6")
    assert recipe_times.PROGRESS.match("eval:  50%|█████     | 1/2 [00:00<00:00,  1.39it/s]") is None
    updates = [(1.0, 0, 20), (5.0, 1, 20), (9.0, 5, 20), (11.0, 10, 20), (21.0, 20, 20)]
    assert recipe_times.timed_rate(updates, warmup=5) == (15, 12.0)
    with pytest.raises(SystemExit, match="too few progress updates"):
        recipe_times.timed_rate(updates[:3], warmup=5)


def recipe_record(**extra) -> dict:
    def recipe(name, steps, wall, full, estimate, source="max_steps", examples=None):
        return {
            "name": name,
            "first_try_steps": steps,
            "first_try_wall_s": wall,
            "threads": 2,
            "warmup_steps": 10,
            "timed_steps": steps - 10,
            "full_steps": full,
            "full_steps_from": source,
            "train_examples": examples,
            "full_estimate_s": estimate,
        }

    return {
        "quick": False,
        "date_utc": "2030-01-02T03:04:05Z",
        "machine": {"cpu": "AMD EPYC 7B13", "cores": 2},
        "torch": "2.13.0+cpu",
        "load_average_before": [0.1, 0, 0],
        "load_average_after": [1.9, 0, 0],
        "data": {
            "my-text/*.txt": "the 6 books of data/pretrain (2.0 MB of text)",
            "reviews.csv": "data/finetune/authorship/train.csv, its sentence column named text (2,000 rows)",
            "ner.conll": "the UD English EWT sample's training file, word and UPOS tag per line (1,501 sentences)",
        },
        "recipes": [
            recipe("my-encoder", 100, 190.4, 5000, 8123.0),
            recipe("my-decoder", 50, 41.0, 400, 160.2),
            recipe("my-classifier", 50, 30.0, 285, 95.0, "5 epochs", 1800),
        ],
        **extra,
    }


def test_the_recipe_times_table_is_its_record(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    (tmp_path / "recipe-times.json").write_text(json.dumps(recipe_record()))
    table = report.recipe_times_table()
    assert table.startswith(
        "Measured on an **AMD EPYC 7B13** (2 cores, 2 threads per process, torch 2.13, 2030-01-02; load average "
        "0.1 at the start and 1.9 at the end), `my-text/` being the 6 books of data/pretrain (2.0 MB of text)"
    )
    assert "| My text → an encoder | 3m10s (100 steps) | about **2h15m** (5,000 steps) |" in table
    assert "| My text → a decoder | 41 s (50 steps) | about **3m** (400 steps) |" in table
    assert (
        "| My CSV → a classifier | 30 s (50 steps) | about **95 s** (285 steps; 1,800 training examples, "
        "5 epochs) |" in table
    )
    assert "after 10 steps of warm-up (40–90 steps timed)" in table
    (tmp_path / "recipe-times.json").write_text(json.dumps(recipe_record(quick=True)))
    with pytest.raises(ValueError, match="--quick record"):
        report.recipe_times_table()
    (tmp_path / "recipe-times.json").write_text(json.dumps(recipe_record(load_average_before=[2.5, 0, 0])))
    with pytest.raises(ValueError, match="not on a quiet machine"):
        report.recipe_times_table()


@pytest.mark.slow
def test_recipe_times_quick_runs_the_page_s_first_tries_in_page_order(tmp_path, monkeypatch):
    """`bench/recipe_times.py --quick`: the page's four first tries, each cut to a few steps, in one folder with the
    shipped samples as the user's files; each timed from its progress bar, each full run's steps from its command."""
    out = tmp_path / "recipe-times.json"
    recipe_times.main(["--quick", "--json", str(out), "--keep", str(tmp_path / "work")])
    record = json.loads(out.read_text())
    assert record["quick"] is True and record["machine"]["cpu"]
    rows = {r["name"]: r for r in record["recipes"]}
    assert list(rows) == ["my-encoder", "my-decoder", "my-classifier", "my-tagger"]
    for row in rows.values():
        assert row["first_try_steps"] == recipe_times.QUICK_STEPS and row["timed_steps"] >= 2
        assert 0 < row["steps_per_s"] and 0 < row["first_try_wall_s"] < row["full_estimate_s"]
    assert rows["my-encoder"]["full_steps"] == 5000 and rows["my-decoder"]["full_steps"] == 400
    for name in ("my-classifier", "my-tagger"):
        row = rows[name]
        assert row["full_steps_from"] == "5 epochs" and row["full_steps"] == 5 * row["steps_per_epoch"]
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    with pytest.raises(ValueError, match="--quick record"):
        report.recipe_times_table()


page_times = load("kiln_bench_page_times", "bench/page_times.py")


@pytest.mark.slow
def test_page_times_quick_runs_a_page_s_command_as_written_and_report_refuses_its_record(
    tmp_path, monkeypatch
):
    """`bench/page_times.py --quick --only installation`: the page's one command of more than seconds (the 20-step
    check) runs through `kiln-launch` in a fresh folder, cut to a few steps, and its record holds the time, the
    CPU-seconds, the threads it printed and the evaluation it logged; report.py refuses the quick record and renders
    the same entry once marked as a quiet measurement."""
    out, work = tmp_path / "page-times.json", tmp_path / "work"
    page_times.main(["--quick", "--only", "installation", "--json", str(out), "--keep", str(work)])
    record = json.loads(out.read_text())
    assert record["quick"] is True and list(record["pages"]) == ["installation"] and record["machine"]["cpu"]
    entry = record["pages"]["installation"]
    (row,) = entry["commands"]
    assert (
        row["command"]
        == "kiln-launch pretrain/run.py --training.max_steps 20 --training.output_dir runs/check-install"
    )
    assert row["wall_s"] > 0 and row["cpu_s"] > 0 and row["threads"] >= 1 and row["threads_from"] == "printed"
    printed = row["printed"]
    assert (
        printed["kind"] == "training" and printed["run"] == "runs/check-install" and printed["processes"] == 1
    )
    assert (
        printed["steps"] == 3
        and printed["eval"]["step"] == 3
        and math.isfinite(printed["eval"]["eval/mlm_loss"])
    )
    assert (work / "installation" / "runs" / "check-install" / "final" / "config.json").is_file()
    for key in (
        "date_utc",
        "commit",
        "torch",
        "load_average_start",
        "load_average_end",
        "load_average_page_start",
    ):
        assert entry[key], key

    monkeypatch.setattr(report, "RESULTS", tmp_path)
    with pytest.raises(ValueError, match="--quick record"):
        report.page_times_table("installation")
    quiet = {**entry, "quick": False, "load_average_start": [0.2, 0, 0]}
    (tmp_path / "page-times.json").write_text(
        json.dumps({**record, "quick": False, "pages": {"installation": quiet}})
    )
    table = report.page_times_table("installation")
    assert (
        f"| `{row['command']}` | {report._duration(row['wall_s'])} | {row['cpu_s']:,.0f} | {row['threads']} |"
        in table
    )
    assert f"eval MLM loss {printed['eval']['eval/mlm_loss']:.3f}" in table


def page_times_record(**page) -> dict:
    """A synthetic bench/page_times.py record of docs/pretraining.md (numbers made up here)."""
    entry = {
        "page": "docs/pretraining.md",
        "quick": False,
        "date_utc": "2030-01-02T03:04:05Z",
        "commit": "abc1234",
        "machine": {"cpu": "AMD EPYC 7B13", "cores": 2},
        "torch": "2.13.0+cpu",
        "load_average_start": [0.1, 0, 0],
        "load_average_page_start": [0.1, 0, 0],
        "load_average_end": [1.9, 0, 0],
        "started_from": [],
        "commands": [
            {
                "command": page_times.DECODER_TINY,
                "wall_s": 113.4,
                "cpu_s": 205.2,
                "threads": 2,
                "threads_from": "printed",
                "printed": {
                    "kind": "training",
                    "run": "runs/decoder-tiny",
                    "parameters_m": 0.95,
                    "processes": 1,
                    "steps": 400,
                    "train_loss": [[10, 8.1912], [400, 3.9071]],
                    "eval": {
                        "step": 400,
                        "eval/loss": 3.9321,
                        "eval/perplexity": 51.01,
                        "eval/accuracy": 0.2771,
                    },
                    "tokens_per_s_median": 8123.4,
                    "sample": {
                        "prompt": "Once upon a time",
                        "max_new_tokens": 24,
                        "text": "Once upon a time, a cat.",
                    },
                },
            },
            {
                "command": "python -m pretrain.zero_shot blimp --model runs/encoder-tiny/final --data data/blimp",
                "wall_s": 61.0,
                "cpu_s": 118.0,
                "threads": 2,
                "threads_from": "torch's default",
                "printed": {"kind": "blimp", "mean_percent": 55.2, "paradigms": 67, "pairs": 3350},
            },
            {
                "command": "ACCELERATE_USE_CPU=1 accelerate launch --config_file configs/accelerate/cpu-2proc.yaml "
                "pretrain/run.py --training.output_dir runs/encoder-tiny-2proc",
                "wall_s": 150.0,
                "cpu_s": 290.0,
                "threads": 1,
                "threads_from": "printed",
                "printed": {
                    "kind": "training",
                    "processes": 2,
                    "eval": {
                        "step": 600,
                        "eval/mlm_loss": 6.0301,
                        "eval/mlm_accuracy": 0.105,
                        "eval/nsp_accuracy": 0.5,
                    },
                },
            },
            {
                "command": "python -m pretrain.convert runs/encoder-tiny/final bert-out",
                "wall_s": 6.2,
                "cpu_s": 5.9,
                "threads": 2,
                "threads_from": "torch's default",
                "printed": {"kind": "wrote", "line": "wrote BertForPreTraining to bert-out"},
            },
        ],
        **page,
    }
    return {"quick": False, "pages": {"pretraining": entry}}


def test_the_page_times_blocks_are_their_record(tmp_path, monkeypatch):
    """Each row: the command, its time in the page's unit, CPU-seconds, threads (torch's default said so, processes
    counted) and what it printed; the decoder paragraph: time, loss, perplexity, accuracy and the sample, from the
    record; a page without an entry says it is not measured yet; quick and busy records are refused."""
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    assert report.page_times_table("pretraining").startswith(
        "Not measured yet: `python bench/page_times.py --only"
    )
    (tmp_path / "page-times.json").write_text(json.dumps(page_times_record()))
    table = report.page_times_table("pretraining")
    assert table.startswith(
        "Measured on an **AMD EPYC 7B13** (2 cores, torch 2.13, 2030-01-02; load average 0.1 at the start and 1.9 at "
        "the end), one command at a time as the page gives it, in a fresh folder:"
    )
    for expected in (
        f"| `{page_times.DECODER_TINY}` | 1m53s | 205 | 2 | step 400: eval loss 3.932, perplexity 51.0, next-token "
        "accuracy 27.7% |",
        "| 61 s | 118 | 2 (torch's default) | BLiMP 55.2 (3,350 pairs) |",
        "| 2m30s | 290 | 2 processes × 1 | step 600: eval MLM loss 6.030, MLM accuracy 10.5%, NSP accuracy 50.0% |",
        "| 6 s | 6 | 2 (torch's default) | wrote BertForPreTraining to bert-out |",
    ):
        assert expected in table, expected
    paragraph = report.page_times_decoder()
    assert (
        "took **1m53s** end to end (**205 CPU-seconds**, 2 threads, ≈ 8k tokens/s) and trained 0.95M parameters: "
        "train loss 8.19 at step 10 → 3.91 at step 400; eval loss 3.932, perplexity 51.0, next-token accuracy "
        '27.7%. Greedy `generate` from "Once upon a time" (24 new tokens) gives "Once upon a time, a cat.".'
    ) in paragraph
    assert report.page_times_table("zero-shot").startswith(
        "Not measured yet: `python bench/page_times.py --only zero-shot`"
    )
    (tmp_path / "page-times.json").write_text(json.dumps({**page_times_record(), "quick": True}))
    with pytest.raises(ValueError, match="--quick record"):
        report.page_times_table("pretraining")
    (tmp_path / "page-times.json").write_text(json.dumps(page_times_record(load_average_start=[1.4, 0, 0])))
    with pytest.raises(ValueError, match="not on a quiet machine"):
        report.page_times_decoder()


def test_page_times_runs_each_command_as_written_and_reads_what_it_printed(tmp_path):
    """The launchers are the programs the page names, from this Python; `VAR=value` before a command is its
    environment; --quick adds a few steps or pairs at the end; a placeholder is the page's own run; a quoted item
    the output lacks is an error."""
    argv, env = page_times.argv_of(
        "ACCELERATE_USE_CPU=1 accelerate launch --config_file configs/accelerate/cpu-2proc.yaml pretrain/run.py",
        True,
    )
    assert env == {"ACCELERATE_USE_CPU": "1"}
    assert argv[:4] == [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch"]
    assert argv[4:7] == ["--config_file", "configs/accelerate/cpu-2proc.yaml", "pretrain/run.py"]
    assert argv[7:] == list(page_times.QUICK_PRETRAIN)
    argv, _ = page_times.argv_of(
        "python -m pretrain.zero_shot blimp --model m --data data/blimp --pairs 20", True
    )
    assert argv[0] == sys.executable and argv[-2:] == ["--pairs", page_times.QUICK_BLIMP_PAIRS]
    argv, _ = page_times.argv_of("lm_eval --model hf --tasks kiln_blimp_sample", False)
    assert argv == [sys.executable, "-m", "lm_eval", "--model", "hf", "--tasks", "kiln_blimp_sample"]
    argv, _ = page_times.argv_of("kiln-launch pretrain/run.py --eval.blimp 50", True)
    assert argv[:3] == [sys.executable, "-m", "kiln.launcher"] and argv[-2:] == ["--eval.blimp", "2"]
    with pytest.raises(SystemExit, match="no rule for running"):
        page_times.argv_of("hf upload you/x runs/x/final", False)
    assert page_times.as_run("python -m pretrain.convert runs/<run>/final x", "docs/electra.md") == (
        "python -m pretrain.convert runs/encoder-tiny-electra/final x"
    )

    blimp = "BLiMP: 52.3 (mean over 67 paradigms; 1,752 of 3,350 pairs right)\nBLiMP, mean over 12 phenomena: 51.0\n"
    assert page_times.blimp_facts(blimp, "c") == {
        "kind": "blimp",
        "mean_percent": 52.3,
        "paradigms": 67,
        "pairs": 3350,
    }
    table = (
        "|     Groups      |Version|Filter|n-shot|Metric|   |Value |   |Stderr|\n"
        "|-----------------|------:|------|-----:|------|---|-----:|---|-----:|\n"
        "|kiln_blimp_sample|      1|none  |     0|acc   |↑  |0.4851|±  |0.0373|\n"
    )
    command = "lm_eval --model hf --include_path configs/lm-eval --tasks kiln_blimp_sample"
    assert page_times.lm_eval_facts(table, command) == {
        "kind": "lm-eval",
        "task": "kiln_blimp_sample",
        "acc": 0.4851,
    }
    wrote = "Loading weights: 100%\nwrote onnx/c/model.onnx; onnxruntime vs PyTorch, largest difference: logits 4.2e-07\n"
    assert page_times.closing_line_facts(wrote, "c")["line"].endswith("logits 4.2e-07")
    for reader, output in ((page_times.blimp_facts, "BLiMP: n/a"), (page_times.closing_line_facts, "done")):
        with pytest.raises(SystemExit, match="printed no"):
            reader(output, "c")
    with pytest.raises(SystemExit, match="printed no final folder"):
        page_times.training_facts("no final line", tmp_path, "c")

    run = tmp_path / "runs" / "x"
    (run / "final").mkdir(parents=True)
    rows = [
        {"step": 10, "train/loss": 8.2, "train/tokens_per_s": 100.0},
        {"step": 20, "train/loss": 7.1, "train/tokens_per_s": 300.0},
        {"step": 20, "eval/loss": 7.0, "eval/perplexity": 1096.6, "eval/accuracy": 0.1},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    output = (
        "KilnDecoderForCausalLM with 0.95M parameters, vocab 4096\n  processes = 1 (no data parallelism)\n"
        "final model saved in runs/x/final\n"
    )
    facts = page_times.training_facts(output, tmp_path, "c")
    assert facts["train_loss"] == [[10, 8.2], [20, 7.1]] and facts["eval"]["eval/perplexity"] == 1096.6
    assert (
        facts["parameters_m"] == 0.95 and facts["tokens_per_s_median"] == 200.0 and facts["run"] == "runs/x"
    )


def test_page_times_refuses_unknown_pages_a_quick_run_without_its_own_record_and_a_used_folder(
    tmp_path, capsys
):
    for argv in (
        ["--only", "installation,nope"],
        ["--quick", "--only", "installation"],
        ["--only", "installation", "--keep", str(tmp_path)],
    ):
        with pytest.raises(SystemExit) as stop:
            page_times.main(argv)
        assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "unknown page(s) nope" in err and "give --json" in err and "give a new folder" in err


@pytest.mark.slow
def test_page_times_reads_the_sample_the_page_shows_from_the_saved_decoder(kiln_checkpoints):
    """The decoder paragraph's sample: greedy `generate` from the prompt by the saved folder, in a fresh process,
    the prompt and its continuation."""
    _, decoder = kiln_checkpoints
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    sample = page_times.greedy_sample(decoder, "Once upon a time", 8, env)
    assert sample["prompt"] == "Once upon a time" and sample["max_new_tokens"] == 8
    text = sample["text"].lower()  # the tokenizer may lowercase
    assert text.startswith("once upon a time") and len(text) > len("once upon a time")


def test_the_quick_tier_record_counts_what_pytest_printed_and_its_sentence_names_the_cpu(
    tmp_path, monkeypatch
):
    """bench/quick_tier.py reads pytest's last line as counts (a subtest count is not a test count; failures are
    counted, so such a run is not recorded), and report.py's sentence gives the tier's tests, time and CPU from the
    record, refusing a record that did not start on a quiet machine."""
    quick_tier = load("kiln_bench_quick_tier", "bench/quick_tier.py")
    line = "3 failed, 1749 passed, 325 skipped, 107 warnings, 6704 subtests passed in 204.48s (0:03:24)"
    assert quick_tier.tier_counts(line) == {"passed": 1749, "skipped": 325, "failed": 3, "errors": 0}
    assert quick_tier.tier_counts("12 passed, 1 error in 3.0s")["errors"] == 1
    record = {
        "command": 'python -m pytest -n 2 -q -m "not slow"',
        "date_utc": "2030-01-02T03:04:05Z",
        "machine": {"cores": 2, "cpu": "AMD EPYC"},
        "torch": "2.13.0+cpu",
        "wall_s": 205.4,
        "passed": 1756,
        "skipped": 325,
        "failed": 0,
        "errors": 0,
        "load_average_before": [0.8, 1, 1],
        "load_average_after": [1.9, 1, 1],
    }
    (tmp_path / "quick-tier.json").write_text(json.dumps(record))
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    assert report.quick_tier_time() == (
        'While changing code, `python -m pytest -n 2 -q -m "not slow"` runs the quick tier: 1,756 tests in '
        "**3m25s** on an idle 2-core AMD EPYC (2030-01-02, load average 0.8 at the start; `python "
        "bench/quick_tier.py` measures it again).\n"
    )
    record["load_average_before"] = [1.6, 1, 1]
    (tmp_path / "quick-tier.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="not on a quiet"):
        report.quick_tier_time()

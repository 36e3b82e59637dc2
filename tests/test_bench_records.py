"""The measurement scripts behind docs tables that quote whole commands (bench/shipped_commands.py, bench/threads.py)
run end to end in their --quick mode, write the record bench/report.py reads, and report.py makes its table from it.
Nothing is timed here: the quick records hold a few steps, not a measurement, and report.py refuses them.
"""

from __future__ import annotations

import importlib.util
import json
import math
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
        "machine": {"cores": 2},
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
        "What these commands gave (2-core CPU, 2 threads per process, torch 2.13, 2030-01-02; "
        "load average 1.0 at the start and 3.5 at the end"
    )
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
def test_threads_quick_runs_the_default_command_pinned_and_per_core(tmp_path, monkeypatch):
    """`bench/threads.py --quick`: the default run twice through `accelerate launch`, once with OMP_NUM_THREADS=1 and
    once without it (whatever this process's environment says), each with the thread count it printed, its logged
    tokens/s windows, the training loop's clock and its last evaluation."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the thread-per-core run must not inherit it
    out = tmp_path / "threads.json"
    threads.main(["--quick", "--json", str(out)])
    record = json.loads(out.read_text())
    one, per_core = record["runs"]
    assert (one["label"], one["environment"]) == ("one thread", {"OMP_NUM_THREADS": "1"})
    assert (per_core["label"], per_core["environment"]) == ("a thread per core", {})
    assert one["threads"] == 1 and per_core["threads"] >= 1
    for run in (one, per_core):
        assert run["steps"] == 6 and len(run["tokens_per_s_windows"]) == 3  # logged every 2 steps
        assert run["tokens_per_s_median"] == pytest.approx(sorted(run["tokens_per_s_windows"])[1], abs=0.1)
        assert 0 < run["training_loop_s"] < run["wall_s"]
        assert run["last_eval"]["step"] == 6 and math.isfinite(run["last_eval"]["eval/mlm_loss"])
    assert record["quick"] is True and record["command"] == "accelerate launch pretrain/run.py"
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    with pytest.raises(ValueError, match="--quick record"):
        report.threads_table()


def test_the_threads_table_is_its_record(tmp_path, monkeypatch):
    run = {"tokens_per_s_windows": [], "steps": 600, "environment": {}}
    record = {
        "quick": False,
        "command": "accelerate launch pretrain/run.py",
        "date_utc": "2030-01-02T03:04:05Z",
        "machine": {"cores": 2},
        "torch": "2.13.0+cpu",
        "load_average_before": [0.2, 0, 0],
        "load_average_after": [1.1, 0, 0],
        "runs": [
            {
                **run,
                "label": "one thread",
                "threads": 1,
                "tokens_per_s_median": 20735.4,
                "training_loop_s": 116.2,
                "wall_s": 129.0,
                "last_eval": {"step": 600, "eval/mlm_loss": 6.029814706324721},
            },
            {
                **run,
                "label": "a thread per core",
                "threads": 2,
                "tokens_per_s_median": 32845.0,
                "training_loop_s": 72.4,
                "wall_s": 85.3,
                "last_eval": {"step": 600, "eval/mlm_loss": 6.029814706355},
            },
        ],
    }
    (tmp_path / "threads.json").write_text(json.dumps(record))
    monkeypatch.setattr(report, "RESULTS", tmp_path)
    table = report.threads_table()
    assert table.startswith(
        "Measured on a 2-core CPU (torch 2.13, 2030-01-02; load average 0.2 before the first "
        "run and 1.1 after the last)"
    )
    assert (
        "| 1 | 20,735 | 1:56 | 2:09 |\n| a thread per core (2) | 32,845 (**1.58×**) | 1:12 | 1:25 |\n"
        in table
    )
    assert (
        "eval MLM loss at step 600 agreed to 11 significant digits (6.029814706325 and 6.029814706355)"
        in table
    )
    assert report.agreeing_digits(1.5, 1.5) is None and report.agreeing_digits(0.1234, 0.1235) == 3
    assert report.agreeing_digits(6.03, 5.99) == 0 and report.agreeing_digits(100.0, 10.0) == 0

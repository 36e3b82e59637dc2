"""Prepare once, train many: `python -m pretrain.data prepare` and `--data.prepared`.

The prepared path must give exactly the examples (and so the masks and losses) of the in-memory path with the
same tokenizer; a prepare killed with SIGKILL resumes to byte-identical shards; `--shard 0/2` + `--shard 1/2`
equal the single-machine prepare; a run that disagrees with the manifest is one line.
"""

from __future__ import annotations

import filecmp
import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from kiln_testing import cli_in_process, losses, run, run_main

REPO = Path(__file__).resolve().parent.parent


def _corpus(folder: Path) -> list[str]:
    """About 1,300 one-paragraph documents from the shipped books in three files of different sizes (more than
    DOCUMENT_POOL documents, so the per-epoch shuffle and several NSP pools are exercised)."""
    lines = []
    for path in sorted(glob.glob(str(REPO / "data/pretrain/*.txt"))):
        lines += [
            line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()
        ]
    lines = lines[:1300]
    folder.mkdir(parents=True)
    parts = {"a.txt": lines[:500], "b.txt": lines[500:1280], "c.txt": lines[1280:]}
    for name, documents in parts.items():
        (folder / name).write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    return lines


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """(config path, corpus folder, prepared folder) of a small encoder corpus, prepared in this process."""
    from kiln.config import build_config
    from pretrain.config import RunConfig
    from pretrain.data.prepare import prepare

    root = tmp_path_factory.mktemp("prepared")
    corpus = root / "corpus"
    _corpus(corpus)
    config = yaml.safe_load((REPO / "configs/pretrain/debug.yaml").read_text())
    config["data"].update(data_files=[str(corpus / "*.txt")], max_train_documents=None)
    config["tokenizer"].update(input_sentence_size=2000)
    config_path = root / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    cfg = build_config(RunConfig, ["--config", str(config_path)])
    prepare(cfg, str(root / "out"), shard_size_mb=0.1, say=lambda *_: None)
    return config_path, corpus, root / "out"


def _config(config_path, *overrides):
    from kiln.config import build_config
    from pretrain.config import RunConfig

    return build_config(RunConfig, ["--config", str(config_path), *map(str, overrides)])


def _same_rows(a, b, what):
    assert len(a) == len(b) > 0, (what, len(a), len(b))
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert x.keys() == y.keys(), what
        for key in x:
            assert torch.equal(torch.as_tensor(x[key]), torch.as_tensor(y[key])), (what, i, key)


def test_shards_hold_every_document_of_the_files_read_whole(prepared):
    from pretrain.data import load_documents
    from pretrain.data.prepared import PreparedCorpus

    config_path, _, out = prepared
    corpus = PreparedCorpus.open(str(out))
    manifest = corpus.manifest
    assert len(manifest["shards"]["train"]) >= 4  # the two larger files were split into byte ranges
    assert [s["name"] for s in manifest["sources"]["train"]] == [
        "a.txt",
        "b.txt",
        "c.txt",
    ]  # no absolute paths
    assert str(out.parent) not in (out / "manifest.json").read_text()
    whole = load_documents(_config(config_path, "--data.validation_split_percentage", 0).data).train
    assert manifest["totals"]["documents"] == len(whole) == 1300
    rows = corpus.dataset("train")
    assert len(rows) == len(whole) and rows.column_names == ["sentence_ids", "document_hash"]


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["mlm+nsp", "mlm+sop", "mlm"])
def test_prepared_examples_and_masks_equal_the_in_memory_path(prepared, objective):
    """Same tokenizer, same settings: every example of two epochs and of the validation set is identical, and so
    are the collated (masked) batches."""
    from pretrain.data import build_pretraining_data
    from pretrain.data.prepared import PreparedCorpus, build_prepared_data

    config_path, _, out = prepared
    cfg = _config(config_path, "--model.objective", objective)
    corpus = PreparedCorpus.open(str(out))
    tokenizer = corpus.load_tokenizer(cfg.data.max_seq_length)
    args = (cfg.data, tokenizer, "encoder", objective, 42, 64)
    memory, mapped = build_pretraining_data(*args), build_prepared_data(corpus, *args)
    for epoch in (0, 1):
        _same_rows(memory.train_dataset(epoch), mapped.train_dataset(epoch), f"epoch {epoch}")
    _same_rows(memory.eval_dataset, mapped.eval_dataset, "validation")
    for data in (memory, mapped):
        data.collator.set_epoch(1)
    rows = [5, 17, 300, 2]
    batches = [
        data.collator([{**data.train_dataset(1)[i], "example_index": i} for i in rows])
        for data in (memory, mapped)
    ]
    assert batches[0].keys() == batches[1].keys()
    for key in batches[0]:
        assert torch.equal(batches[0][key], batches[1][key]), key


@pytest.mark.parametrize("max_num_tokens", [1, 17, 125])
def test_pair_truncation_from_raw_bits_equals_truncate_seq_pair(max_num_tokens):
    """The prepared planner truncates its pairs from getrandbits(64 per removed token) in numpy: the same tokens
    removed as nsp.truncate_seq_pair's loop of random() calls, and the generator left in the same state."""
    import random
    from array import array

    import numpy as np

    from pretrain.data.nsp import truncate_seq_pair
    from pretrain.data.prepared import _truncate_pairs

    lengths = [(la, lb) for la in range(40) for lb in range(40)] + [(700, 3), (2, 900), (400, 401), (0, 300)]
    loop, bits = random.Random("truncation"), random.Random("truncation")
    ranges, pairs, draws, expected = [array("q") for _ in range(4)], array("q"), bytearray(), []
    for n, (la, lb) in enumerate(lengths):
        a0, b0 = 10_000 * n, 10_000 * n + 5_000
        tokens_a, tokens_b = list(range(a0, a0 + la)), list(range(b0, b0 + lb))
        truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, loop)
        expected.append((tokens_a, tokens_b))
        for values, value in zip(ranges, (a0, a0 + la, b0, b0 + lb)):
            values.append(value)
        excess = la + lb - max_num_tokens
        if excess > 0:  # as _plan_pool takes them
            pairs.append(n)
            draws += bits.getrandbits(64 * excess).to_bytes(8 * excess, "little")
    _truncate_pairs(ranges, np.frombuffer(pairs, dtype=np.int64), draws, max_num_tokens)
    got = [(list(range(a0, a1)), list(range(b0, b1))) for a0, a1, b0, b1 in zip(*ranges)]
    assert got == expected
    assert bits.getstate() == loop.getstate()


def test_decoder_blocks_equal_the_in_memory_path(prepared, tmp_path):
    from pretrain.data import build_pretraining_data
    from pretrain.data.prepare import prepare
    from pretrain.data.prepared import PreparedCorpus, build_prepared_data

    config_path, _, _ = prepared
    cfg = _config(config_path, "--model.kind", "decoder", "--model.objective", "clm")
    prepare(cfg, str(tmp_path / "decoder"), shard_size_mb=0.1, say=lambda *_: None)
    corpus = PreparedCorpus.open(str(tmp_path / "decoder"))
    tokenizer = corpus.load_tokenizer(cfg.data.max_seq_length)
    args = (cfg.data, tokenizer, "decoder", "clm", 42, 64)
    memory, mapped = build_pretraining_data(*args), build_prepared_data(corpus, *args)
    _same_rows(memory.train_dataset(0), mapped.train_dataset(0), "blocks")
    _same_rows(memory.eval_dataset, mapped.eval_dataset, "validation blocks")


def test_the_piece_cache_gives_the_tokenizers_ids(prepared):
    from pretrain.data.corpus import split_documents, split_sentences
    from pretrain.data.prepare import TokenEncoder
    from pretrain.data.prepared import PreparedCorpus

    tokenizer = PreparedCorpus.open(str(prepared[2])).load_tokenizer()
    text = Path(REPO / "data/pretrain/frankenstein.txt").read_text(encoding="utf-8")[:100_000]
    texts = [s for doc in split_documents(text, "blank_line") for s in split_sentences(doc)]
    texts += [
        "Héllo wörld café",
        "a [MASK] b",
        "x[SEP]y",
        "tab\there",
        "ctrl\x01char",
        "naïve ÀÉÎ",
        "中文 mixed",
        "e\u0301 combining",
        "a  b",
        "\xa0nbsp\xa0",
        "İstanbul ΣΑΣ",
        "",
        "Ａ全角",
        "“Well,” he said.",
    ]
    encoder = TokenEncoder(tokenizer)
    assert encoder.piece_cache_usable
    expected = tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert encoder.encode(texts) == expected
    assert encoder.encode(texts) == expected  # from the cache


def _prepare_cli(config_path, output, *extra):
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pretrain.data",
            "prepare",
            "--config",
            str(config_path),
            "--output",
            str(output),
            "--shard_size_mb",
            "0.1",
            *extra,
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _same_folder(a: Path, b: Path):
    names = sorted(p.name for p in a.iterdir() if p.is_file())
    assert names == sorted(p.name for p in b.iterdir() if p.is_file())
    match, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    assert not mismatch and not errors, (mismatch, errors)
    assert filecmp.cmp(a / "tokenizer/tokenizer.json", b / "tokenizer/tokenizer.json", shallow=False)


@pytest.mark.slow
def test_a_prepare_killed_with_sigkill_resumes_to_identical_shards(prepared, tmp_path):
    config_path, _, reference = prepared
    output = tmp_path / "killed"
    process = _prepare_cli(config_path, output)
    deadline = time.time() + 120
    while time.time() < deadline and not list(output.glob("train-*.json")) and process.poll() is None:
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait()
    done = len(list(output.glob("train-*.json")))
    assert 1 <= done < len(json.loads((reference / "manifest.json").read_text())["shards"]["train"])
    assert not (output / "manifest.json").exists()
    process = _prepare_cli(config_path, output)
    log, _ = process.communicate(timeout=120)
    assert process.returncode == 0, log
    assert f"{done} already done" in log
    _same_folder(output, reference)


def test_shard_parts_equal_the_single_machine_prepare(prepared, tmp_path):
    from pretrain.data.common import DataError
    from pretrain.data.prepare import prepare
    from pretrain.data.prepared import PreparedCorpus

    config_path, _, reference = prepared
    cfg = _config(config_path)
    output = tmp_path / "parts"
    assert prepare(cfg, str(output), shard=(1, 2), shard_size_mb=0.1, say=lambda *_: None) is None
    with pytest.raises(DataError, match=r"incomplete: \d+ shard\(s\) missing \(e.g. train-00000\)"):
        PreparedCorpus.open(str(output))
    manifest = prepare(cfg, str(output), shard=(0, 2), shard_size_mb=0.1, say=lambda *_: None)
    assert manifest == json.loads((reference / "manifest.json").read_text())
    _same_folder(output, reference)


def test_a_run_that_disagrees_with_the_manifest_is_one_line(prepared, tmp_path, capsys):
    _, _, out = prepared
    cases = [
        (
            ["--tokenizer.vocab_size", 1024],
            "was prepared with tokenizer.vocab_size=512 but this run has 1024",
        ),
        (["--model.kind", "decoder"], "was prepared with model.kind='encoder' but this run has 'decoder'"),
        (
            ["--data.sentence_split", "line"],
            "was prepared with data.sentence_split='rule' but this run has 'line'",
        ),
        (["--tokenizer.name_or_path", REPO / "tests"], "could not load tokenizer"),
    ]
    for extra, message in cases:
        code, lines = cli_in_process(
            capsys,
            "--training.output_dir",
            tmp_path / "run",
            "--data.prepared",
            out,
            "--tokenizer.vocab_size",
            512,
            *extra,
        )
        assert code == 2 and len(lines) == 1 and message in lines[0], lines
    code, lines = cli_in_process(capsys, "--training.output_dir", tmp_path / "x", "--data.prepared", tmp_path)
    assert code == 2 and lines == [
        f"error: --data.prepared {tmp_path} is not a prepared folder (no manifest.json); "
        "make one with `python -m pretrain.data prepare --config X --output DIR`"
    ]


@pytest.mark.slow
def test_training_from_a_prepared_folder_on_1_process_and_through_accelerate_launch_on_2(prepared, tmp_path):
    """The in-memory run with the prepared tokenizer, the run on the prepared folder with 1 process (in this
    process, as the in-memory one), and `accelerate launch` on the prepared folder with 2 processes (half the
    per-device batch) log the same losses."""
    config_path, corpus, out = prepared
    common = [
        "--training.max_steps",
        4,
        "--training.save_steps",
        0,
        "--training.eval_steps",
        0,
        "--model.hidden_dropout_prob",
        0,
        "--model.attention_probs_dropout_prob",
        0,
    ]
    memory = tmp_path / "memory"
    run(
        memory,
        *common,
        "--data.data_files",
        str(corpus / "*.txt"),
        "--data.max_train_documents",
        100000,
        "--tokenizer.name_or_path",
        out / "tokenizer",
    )
    from pretrain.run import main as run_script

    results = {}
    one = tmp_path / "prepared-1"
    run_main(
        run_script,
        "--config",
        config_path,
        "--training.output_dir",
        one,
        "--data.prepared",
        out,
        *common,
        "--training.per_device_train_batch_size",
        8,
    )
    results[1] = losses(one)
    env = {**os.environ, "PYTHONPATH": str(REPO), "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    folder = tmp_path / "launch-2"
    launcher = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--multi_gpu",
        "--main_process_port",
        "0",
    ]
    # 0: accelerate picks a free port
    result = subprocess.run(
        [
            *launcher,
            str(REPO / "pretrain/run.py"),
            "--config",
            str(config_path),
            "--training.output_dir",
            str(folder),
            "--data.prepared",
            str(out),
            *map(str, common),
            "--training.per_device_train_batch_size",
            "4",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results[2] = losses(folder)
    reference = losses(memory)
    assert sorted(reference) == [1, 2, 3, 4]
    assert results[1] == reference  # one process: the same batches, the same arithmetic
    for step, loss in reference.items():
        assert abs(results[2][step] - loss) < 1e-4, (step, loss, results[2][step])


def test_the_spaced_sentence_rule_gives_the_general_rules_sentences(monkeypatch):
    import re

    from pretrain.data import corpus

    text = Path(REPO / "data/pretrain/pride_and_prejudice.txt").read_text(encoding="utf-8")[:200_000]
    documents = corpus.split_documents(text, "blank_line") + [
        "Mr. Smith went. He said “Hi.” Then (A. B. Wells) left!  Yes?\nNo. x.  Y",
        " lead. Trail ",
        "a.\nB",
        "Dr.\nWho. The end… And “So.” ‘Ok’ (Yes.) [No.] Z",
    ]
    fast = [corpus.split_sentences(doc) for doc in documents]
    monkeypatch.setattr(corpus, "_OTHER_WHITESPACE", re.compile(r""))  # every document takes the general rule
    assert fast == [corpus.split_sentences(doc) for doc in documents]


def test_prepare_draws_a_progress_bar_on_a_terminal_and_writes_lines_in_a_log(
    prepared, tmp_path, monkeypatch, capsys
):
    """On a terminal, one bar over the shards with its count, rate and ETA instead of a line per shard; in a log
    (not a terminal), the lines, and no bar."""
    from pretrain.data.prepare import prepare

    cfg = _config(prepared[0])
    said = []
    prepare(cfg, str(tmp_path / "log"), shard_size_mb=0.1, say=said.append)
    shard_lines = [line for line in said if line.startswith("prepare: ") and "tokens) [" in line]
    assert len(shard_lines) > 1 and "prepare:" not in capsys.readouterr().err

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    said.clear()
    prepare(cfg, str(tmp_path / "terminal"), shard_size_mb=0.1, say=said.append)
    drawn = capsys.readouterr().err
    assert not [line for line in said if "tokens) [" in line]
    assert f"{len(shard_lines)}/{len(shard_lines)}" in drawn and "shard" in drawn and "tokens" in drawn

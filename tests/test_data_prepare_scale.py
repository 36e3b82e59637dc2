"""`prepare` on corpora with a wide vocabulary: the piece cache fills up and starts again without losing the
pieces of the batch at hand, through the real command in a fresh process."""

from __future__ import annotations

import filecmp
import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent


def _book_corpus(folder: Path, documents: int = 400) -> None:
    lines = []
    for path in sorted(glob.glob(str(REPO / "data/pretrain/*.txt"))):
        lines += [
            line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()
        ]
    lines = lines[:documents]
    folder.mkdir(parents=True)
    half = len(lines) // 2
    (folder / "a.txt").write_text("\n\n".join(lines[:half]) + "\n", encoding="utf-8")
    (folder / "b.txt").write_text("\n\n".join(lines[half:]) + "\n", encoding="utf-8")


def _write_config(root: Path, corpus: Path, *, kind: str = "encoder") -> Path:
    config = yaml.safe_load((REPO / "configs/pretrain/debug.yaml").read_text())
    config["data"].update(
        data_files=[str(corpus / "*.txt")], max_train_documents=None, max_eval_documents=None
    )
    config["tokenizer"].update(input_sentence_size=2000)
    config["model"]["kind"] = kind
    path = root / f"config-{kind}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _same_shards(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir() if p.is_file())
    assert names == sorted(p.name for p in b.iterdir() if p.is_file())
    assert any(name.endswith(".arrow") for name in names)
    match, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    assert not mismatch and not errors, (mismatch, errors)


def _prepare_with_cache_limit(config: Path, output: Path, limit: int | None, *extra: str):
    """`python -m pretrain.data prepare ...` in a fresh interpreter, with TokenEncoder.CACHE_LIMIT set first (the
    forked workers inherit it)."""
    code = (
        "import sys\n"
        "from pretrain.data.prepare import TokenEncoder\n"
        + (f"TokenEncoder.CACHE_LIMIT = {limit}\n" if limit is not None else "")
        + "from pretrain.data.__main__ import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "prepare",
            "--config",
            str(config),
            "--output",
            str(output),
            "--shard_size_mb",
            "0.05",
            *extra,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_the_wide_corpus_has_a_growing_vocabulary_and_is_the_same_in_both_layouts(tmp_path):
    from bench.wide_corpus import write_wide_corpus

    assert write_wide_corpus(tmp_path / "big", 1.5, "big", seed=3) == 1_500_000
    assert write_wide_corpus(tmp_path / "files", 1.5, "files", seed=3) == 1_500_000
    files = sorted((tmp_path / "files").glob("*.txt"))
    assert len(files) == 1 and files[0].read_bytes() == (tmp_path / "big" / "corpus.txt").read_bytes()
    assert write_wide_corpus(tmp_path / "other", 1.5, "big", seed=4) == 1_500_000
    assert (tmp_path / "other" / "corpus.txt").read_bytes() != (tmp_path / "big" / "corpus.txt").read_bytes()
    text = (tmp_path / "big" / "corpus.txt").read_text(encoding="utf-8")
    documents = [d for d in text.split("\n\n") if d.strip()]
    first, second = text[: len(text) // 2].split(), text[len(text) // 2 :].split()
    assert len(documents) > 1000
    # many distinct pieces (one-off codes, numbers, URLs, user names, a Zipf tail), and still new ones coming
    assert len(set(first)) > 0.15 * len(first) and len(set(second) - set(first)) > 0.1 * len(second)
    for pattern in ("REF-", "https://", "@"):
        assert text.count(pattern) > 500, pattern


@pytest.mark.slow
def test_a_full_piece_cache_starts_again_without_losing_the_batch(tmp_path):
    from bench.wide_corpus import write_wide_corpus

    corpus = tmp_path / "corpus"
    write_wide_corpus(corpus, 0.6, "big")
    config = _write_config(tmp_path, corpus)
    reference = _prepare_with_cache_limit(config, tmp_path / "reference", None)
    assert reference.returncode == 0, reference.stdout + reference.stderr
    # a few hundred pieces: every worker's cache fills up and starts again many times (each shard is one batch)
    small = _prepare_with_cache_limit(config, tmp_path / "small", 300, "--num_proc", "2")
    assert small.returncode == 0, small.stdout + small.stderr
    assert "Traceback" not in small.stderr
    _same_shards(tmp_path / "small", tmp_path / "reference")


def test_the_piece_cache_gives_the_tokenizers_ids_across_resets(tmp_path):
    from pretrain.data.corpus import split_documents, split_sentences
    from pretrain.data.prepare import TokenEncoder
    from pretrain.data.tokenizer import train_tokenizer

    text = Path(REPO / "data/pretrain/frankenstein.txt").read_text(encoding="utf-8")[:60_000]
    texts = [s for doc in split_documents(text, "blank_line") for s in split_sentences(doc)]
    tokenizer = train_tokenizer(
        texts, kind="wordpiece", vocab_size=400, lowercase=True, min_frequency=2, model_max_length=64
    )
    resets = []

    class Small(TokenEncoder):
        CACHE_LIMIT = 150

        def _reset(self):
            resets.append(len(getattr(self, "cache", ())))
            super()._reset()

    encoder = Small(tokenizer)
    assert encoder.piece_cache_usable
    for i in range(0, len(texts), 10):
        batch = texts[i : i + 10]
        assert encoder.encode(batch) == tokenizer(batch, add_special_tokens=False)["input_ids"]
    assert len([size for size in resets if size > 0]) >= 3  # the cache filled up and started again


def _with_truncation_and_padding(source: Path, target: Path) -> None:
    """A copy of a saved tokenizer whose tokenizer.json carries truncation (3 tokens) and padding."""
    import shutil

    from tokenizers import Tokenizer

    shutil.copytree(source, target)
    backend = Tokenizer.from_file(str(target / "tokenizer.json"))
    pad = "[PAD]" if backend.token_to_id("[PAD]") is not None else "<|endoftext|>"
    backend.enable_truncation(3)
    backend.enable_padding(pad_id=backend.token_to_id(pad), pad_token=pad)
    backend.save(str(target / "tokenizer.json"))
    assert json.loads((target / "tokenizer.json").read_text())["truncation"]["max_length"] == 3


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_a_given_tokenizer_with_truncation_saved_never_cuts_a_document(tmp_path, kind):
    corpus = tmp_path / "corpus"
    _book_corpus(corpus, documents=150)
    config = _write_config(tmp_path, corpus, kind=kind)
    trained = _prepare_with_cache_limit(config, tmp_path / "trained", None)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    _with_truncation_and_padding(tmp_path / "trained" / "tokenizer", tmp_path / "truncating")
    given = _prepare_with_cache_limit(
        config, tmp_path / "given", None, "--tokenizer.name_or_path", str(tmp_path / "truncating")
    )
    assert given.returncode == 0, given.stdout + given.stderr
    # the same token ids as the tokenizer it was given without truncation: the trained one
    shards = sorted(p.name for p in (tmp_path / "trained").glob("*.arrow"))
    assert shards == sorted(p.name for p in (tmp_path / "given").glob("*.arrow"))
    for name in shards:
        assert filecmp.cmp(tmp_path / "trained" / name, tmp_path / "given" / name, shallow=False), name
    manifest = json.loads((tmp_path / "given" / "manifest.json").read_text())
    assert manifest["totals"]["tokens"] > 3 * manifest["totals"]["sentences"]


@pytest.fixture(scope="module")
def prepared_books(tmp_path_factory):
    """(config path, prepared folder) of a small encoder corpus, prepared in this process."""
    from kiln.config import build_config
    from pretrain.config import RunConfig
    from pretrain.data.prepare import prepare

    root = tmp_path_factory.mktemp("books")
    _book_corpus(root / "corpus")
    config = _write_config(root, root / "corpus")
    prepare(
        build_config(RunConfig, ["--config", str(config)]),
        str(root / "out"),
        shard_size_mb=0.05,
        say=lambda *_: None,
    )
    return config, root / "out"


def test_prepared_examples_know_their_lengths(prepared_books, tmp_path):
    from kiln.config import build_config
    from pretrain.config import RunConfig
    from pretrain.data.prepare import prepare
    from pretrain.data.prepared import PreparedCorpus, build_prepared_data

    config, out = prepared_books
    decoder = ["--model.kind", "decoder", "--model.objective", "clm"]
    prepare(
        build_config(RunConfig, ["--config", str(config), *decoder]),
        str(tmp_path / "decoder"),
        shard_size_mb=0.05,
        say=lambda *_: None,
    )
    for folder, extra in ((out, []), (tmp_path / "decoder", decoder)):
        cfg = build_config(RunConfig, ["--config", str(config), *extra])
        corpus = PreparedCorpus.open(str(folder))
        data = build_prepared_data(
            corpus,
            cfg.data,
            corpus.load_tokenizer(cfg.data.max_seq_length),
            cfg.model.kind,
            cfg.model.objective,
            42,
            64,
        )
        for dataset in (data.train_dataset(0), data.train_dataset(1), data.eval_dataset):
            assert len(dataset) > 10
            assert dataset.lengths().tolist() == [len(dataset[i]["input_ids"]) for i in range(len(dataset))]


def test_group_by_length_on_a_prepared_corpus_reads_no_example_to_order_them(
    prepared_books, tmp_path, monkeypatch
):
    from kiln_testing import losses, run

    from pretrain.data.prepared import PairExamples

    config, out = prepared_books
    common = [
        "--config",
        str(config),
        "--data.prepared",
        str(out),
        "--training.group_by_length",
        "true",
        "--training.max_steps",
        3,
        "--training.save_steps",
        0,
        "--training.eval_steps",
        0,
    ]
    reads: dict[int, list[int]] = {}  # per dataset: [its size, rows read]
    getitem = PairExamples.__getitem__

    def counting(self, i):
        reads.setdefault(id(self), [len(self), 0])[1] += 1
        return getitem(self, i)

    def train_reads():  # the training examples are the largest dataset (the validation split is a few %)
        size, count = max(reads.values())
        reads.clear()
        return size, count

    monkeypatch.setattr(PairExamples, "__getitem__", counting)
    run(tmp_path / "lengths", *common)
    size, count = train_reads()
    assert count <= 4 * 8 < size  # the batches' rows only (accelerate reads one batch ahead)
    grouped = losses(tmp_path / "lengths")
    # the order is the one the examples' own lengths give
    monkeypatch.delattr(PairExamples, "lengths")
    run(tmp_path / "rows", *common)
    size, count = train_reads()
    assert count >= size
    assert losses(tmp_path / "rows") == grouped and sorted(grouped) == [1, 2, 3]


def test_offsets_and_pair_plans_are_mapped_from_a_cache_written_once(prepared_books, tmp_path):
    """A run's offset arrays and each epoch's pair plan are files in the cache folder, mapped (not held) by
    every process; a second build maps them without writing; the next epoch's plan replaces the previous one;
    and the examples are those planned in memory."""
    from kiln.config import build_config
    from pretrain.config import RunConfig
    from pretrain.data.pipeline import EVAL_EPOCH
    from pretrain.data.prepared import (
        PairExamples,
        PreparedCorpus,
        build_prepared_data,
        plan_pairs,
        split_documents_like_memory,
    )

    config, out = prepared_books
    cache = tmp_path / "cache"
    cfg = build_config(RunConfig, ["--config", str(config), "--data.cache_dir", str(cache)])
    corpus = PreparedCorpus.open(str(out))
    tokenizer = corpus.load_tokenizer(cfg.data.max_seq_length)

    def build():
        return build_prepared_data(corpus, cfg.data, tokenizer, "encoder", cfg.model.objective, 42, 64)

    data = build()
    folder = corpus.cache_folder(str(cache))
    assert folder.parent == cache / "kiln-prepared"
    train = data.train_dataset(0)
    assert isinstance(train, PairExamples) and isinstance(train.plan.a_start, np.memmap)
    assert isinstance(train.index.sentence_tokens, np.memmap)
    names = sorted(p.name for p in folder.iterdir())
    assert [n.split("-")[1] for n in names if n.startswith("pairs-")] == ["eval", "train"]
    assert "index-train" in names
    stamps = {p: p.stat().st_mtime_ns for p in folder.rglob("*.bin")}
    again = build()
    again_train = again.train_dataset(0)
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("*.bin")} == stamps  # mapped, not written again
    # the mapped plan is the one planned in memory (the validation pairs: one pool, epoch "eval")
    _, validation = split_documents_like_memory(again_train.index, cfg.data, False)
    task = "nsp" if cfg.model.objective == "mlm+nsp" else "sop"
    memory = plan_pairs(
        again_train.index,
        validation,
        64,
        cfg.data.short_seq_prob,
        cfg.data.nsp_probability,
        42,
        EVAL_EPOCH,
        task,
        len(validation),
    )
    for name in ("a_start", "a_end", "b_start", "b_end", "label"):
        assert np.array_equal(getattr(memory, name), getattr(again.eval_dataset.plan, name)), name
    assert len(memory.label) > 10
    # epoch 1 replaces epoch 0's plan (written by this process)
    previous = {n for n in names if n.startswith("pairs-train")}
    data.train_dataset(1)
    now = {p.name for p in folder.iterdir()}
    assert not previous & now and len([n for n in now if n.startswith("pairs-train")]) == 1
    assert again_train[0]["input_ids"].numel() > 0  # a mapping of the removed plan stays readable


def test_a_cache_folder_that_cannot_be_written_is_one_line(prepared_books, tmp_path):
    from kiln.config import build_config
    from pretrain.config import RunConfig
    from pretrain.data.common import DataError
    from pretrain.data.prepared import PreparedCorpus, build_prepared_data

    config, out = prepared_books
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    cfg = build_config(RunConfig, ["--config", str(config), "--data.cache_dir", str(blocked)])
    corpus = PreparedCorpus.open(str(out))
    with pytest.raises(
        DataError,
        match=r"^cannot write the prepared corpus's offset arrays to .*a-file/kiln-prepared/"
        r"[0-9a-f]+ \(Not a directory\); set --data.cache_dir to a writable folder with free space$",
    ):
        build_prepared_data(corpus, cfg.data, corpus.load_tokenizer(64), "encoder", "mlm+nsp", 42, 64)

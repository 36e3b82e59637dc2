"""build_pretraining_data end to end (encoder objectives, streaming, caching), its errors, and the inspection CLI."""

import contextlib
from pathlib import Path

import pytest
import torch
from datasets import IterableDataset

from kiln.config import REPO_ROOT
from pretrain.config import DataConfig
from pretrain.data import DataError, build_pretraining_data, train_tokenizer
from pretrain.data.__main__ import main

BOOK = REPO_ROOT / "data/pretrain/the_time_machine.txt"  # 16 chapters = 16 documents


class FakeAccelerator:
    """The parts of accelerate.Accelerator the data path uses, for one rank of a multi-process run."""

    def __init__(self, rank: int, world: int):
        self.process_index, self.num_processes, self.is_main_process = rank, world, rank == 0

    def main_process_first(self):
        return contextlib.nullcontext()

    def local_main_process_first(self):
        return contextlib.nullcontext()


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer([BOOK.read_text(encoding="utf-8")], vocab_size=600, model_max_length=64)


def config(tmp_path: Path, **overrides) -> DataConfig:
    values = dict(data_files=[str(BOOK)], cache_dir=str(tmp_path / "cache"), max_seq_length=64)
    return DataConfig(**{**values, **overrides})


def as_lists(dataset) -> list[list[int]]:
    return [ids.tolist() for ids in dataset["input_ids"]]


def test_encoder_nsp_data_is_cached_and_redrawn_every_epoch(tmp_path, tokenizer):
    cfg = config(tmp_path)
    data = build_pretraining_data(cfg, tokenizer, "encoder", "mlm+nsp", seed=1, max_position_embeddings=64)
    assert data.num_train_documents == 14 and len(data.eval_dataset) > 10
    epoch0 = data.train_dataset(0)
    assert data.train_dataset(0) is epoch0 and len(epoch0) > 300
    assert as_lists(data.train_dataset(1)) != as_lists(epoch0)
    assert max(len(ids) for ids in as_lists(epoch0)) <= 64
    batch = data.collator([epoch0[i] for i in range(16)])
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels", "next_sentence_label"}
    assert batch["input_ids"].dtype == torch.long and batch["input_ids"].shape[1] % 8 == 0

    rebuilt = build_pretraining_data(cfg, tokenizer, "encoder", "mlm+nsp", seed=1, max_position_embeddings=64)
    again = rebuilt.train_dataset(0)
    assert as_lists(again) == as_lists(epoch0)
    assert [f["filename"] for f in again.cache_files] == [f["filename"] for f in epoch0.cache_files]
    other_seed = build_pretraining_data(
        cfg, tokenizer, "encoder", "mlm+nsp", seed=2, max_position_embeddings=64
    )
    assert as_lists(other_seed.train_dataset(0)) != as_lists(epoch0)


def test_parallel_tokenization_gives_the_same_examples(tmp_path, tokenizer):
    serial = build_pretraining_data(
        config(tmp_path), tokenizer, "encoder", "mlm+nsp", seed=3, max_position_embeddings=64
    )
    parallel = build_pretraining_data(
        config(tmp_path / "p", num_proc=2), tokenizer, "encoder", "mlm+nsp", 3, 64
    )
    assert as_lists(parallel.train_dataset(0)) == as_lists(serial.train_dataset(0))
    assert as_lists(parallel.eval_dataset) == as_lists(serial.eval_dataset)


def test_eval_collator_is_separate_and_repeatable(tmp_path, tokenizer):
    data = build_pretraining_data(
        config(tmp_path), tokenizer, "encoder", "mlm+nsp", seed=1, max_position_embeddings=64
    )
    examples = [data.eval_dataset[i] for i in range(8)]
    data.eval_collator.set_epoch(0)
    first = data.eval_collator(examples)["labels"]
    data.eval_collator.set_epoch(0)
    assert data.eval_collator is not data.collator and torch.equal(
        data.eval_collator(examples)["labels"], first
    )


@pytest.mark.parametrize("objective", ["mlm", "mlm+sop"])
def test_mlm_only_and_sop_objectives(tmp_path, tokenizer, objective):
    data = build_pretraining_data(
        config(tmp_path), tokenizer, "encoder", objective, seed=0, max_position_embeddings=64
    )
    train = data.train_dataset(0)
    batch = data.collator([train[i] for i in range(8)])
    assert ("next_sentence_label" in batch) == (objective == "mlm+sop")
    if objective == "mlm":  # one segment: [CLS] ... [SEP], segment ids all 0
        assert (batch["token_type_ids"] == 0).all()
        assert ((batch["input_ids"] == tokenizer.sep_token_id).sum(1) <= 1).all()


def test_streaming_examples_are_split_between_processes(tmp_path, tokenizer):
    cfg = config(tmp_path, streaming=True, validation_split_percentage=0)
    per_rank = []
    for rank in range(2):
        data = build_pretraining_data(
            cfg, tokenizer, "encoder", "mlm+nsp", 0, 64, accelerator=FakeAccelerator(rank, 2)
        )
        train = data.train_dataset(0)
        assert isinstance(train, IterableDataset) and data.eval_dataset is None
        per_rank.append({tuple(example["input_ids"].tolist()) for example in train})
    assert len(per_rank[0]) > 100 and len(per_rank[1]) > 100
    assert len(per_rank[0] & per_rank[1]) < 0.01 * len(per_rank[0])


def test_settings_and_corpus_errors_name_the_fix(tmp_path, tokenizer):
    with pytest.raises(DataError, match=r"max_seq_length=128 exceeds .*max_position_embeddings=64: lower"):
        build_pretraining_data(config(tmp_path, max_seq_length=128), tokenizer, "encoder", "mlm+nsp", 0, 64)
    with pytest.raises(DataError, match="600 tokens but the model's vocab_size is 512"):
        build_pretraining_data(config(tmp_path), tokenizer, "encoder", "mlm", 0, 64, vocab_size=512)
    with pytest.raises(DataError, match="objective 'clm' does not fit a encoder"):
        build_pretraining_data(config(tmp_path), tokenizer, "encoder", "clm", 0, 64)
    one = tmp_path / "one.txt"
    one.write_text("The only document. It has three sentences. Nothing else.\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"NSP needs at least 2 training documents.*model.objective=mlm\+sop"):
        build_pretraining_data(
            config(tmp_path, data_files=[str(one)]), tokenizer, "encoder", "mlm+nsp", 0, 64
        )


def test_inspection_command_prints_examples_and_statistics(tmp_path, capsys):
    common = [
        "--data.data_files",
        str(BOOK),
        "--data.cache_dir",
        str(tmp_path / "cache"),
        "--tokenizer.vocab_size",
        "600",
    ]
    shape = ["--model.max_position_embeddings", "64", "--data.max_seq_length", "64"]
    assert main(common + shape + ["--stat_sequences", "400", "--examples", "2"]) == 0
    out = capsys.readouterr().out
    assert "example 1" in out and "[MASK/" in out and "[CLS]" in out
    assert "selected for MLM" in out and "IsNext (label 0)" in out and "statistics over" in out

    assert main(common + ["--data.max_seq_length", "512"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --data.max_seq_length=512 exceeds") and "\n" not in err

    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    assert "--stat_sequences" in help_text and "--data.mlm_probability" in help_text


@pytest.mark.slow
def test_streamed_examples_are_masked_alike_on_any_number_of_processes(tmp_path, tokenizer):
    """A streamed example's masks follow from its content, not from its rank or batch: the examples one process
    and each of two processes stream (single segments, no short targets: the same examples in every split) get
    the same masks."""
    cfg = config(tmp_path, streaming=True, validation_split_percentage=0, short_seq_prob=0.0)
    masks = []
    for world in (1, 2):
        found = {}
        for rank in range(world):
            data = build_pretraining_data(
                cfg, tokenizer, "encoder", "mlm", 0, 64, accelerator=FakeAccelerator(rank, world)
            )
            data.collator.set_epoch(0)
            examples = list(data.train_dataset(0))
            for start in range(0, len(examples) - 7, 8):
                rows = examples[start : start + 8]
                batch = data.collator(rows)
                for row, ids, labels, attention in zip(
                    rows, batch["input_ids"], batch["labels"], batch["attention_mask"]
                ):
                    length = int(attention.sum())
                    found[tuple(row["input_ids"].tolist())] = (
                        ids[:length].tolist(),
                        labels[:length].tolist(),
                    )
        masks.append(found)
    common = masks[0].keys() & masks[1].keys()
    assert len(common) > 100
    assert all(masks[0][key] == masks[1][key] for key in common)
    assert any(label != -100 for key in common for label in masks[0][key][1])


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["mlm+nsp", "mlm+sop"])
def test_pair_examples_are_the_same_for_any_num_proc(tmp_path, tokenizer, objective):
    """2,500 documents are 3 pools of 834: with datasets' own sharding, 2 or 3 processes cut the pools at other
    places (834/833/833 rows per process) and drew other pairs; every num_proc must give the one-process examples,
    in every epoch, so a run may also resume with another data.num_proc."""
    lines = [
        line.strip()
        for path in sorted((REPO_ROOT / "data/pretrain").glob("*.txt"))
        for line in path.read_text(encoding="utf-8").splitlines()
        if len(line.split()) > 3
    ]
    corpus = tmp_path / "paragraphs.txt"
    corpus.write_text("\n\n".join(lines[:2500]) + "\n", encoding="utf-8")
    examples = {}
    for num_proc in (1, 2, 3):
        cfg = config(
            tmp_path / f"p{num_proc}",
            data_files=[str(corpus)],
            num_proc=num_proc,
            validation_split_percentage=0,
        )
        data = build_pretraining_data(
            cfg, tokenizer, "encoder", objective, seed=5, max_position_embeddings=64
        )
        assert data.num_train_documents == 2500
        examples[num_proc] = [as_lists(data.train_dataset(epoch)) for epoch in (0, 1)]
        examples[num_proc].append(data.train_dataset(0)["next_sentence_label"])
    assert examples[2] == examples[1] and examples[3] == examples[1]
    assert examples[1][0] != examples[1][1]  # each epoch draws its own pairs

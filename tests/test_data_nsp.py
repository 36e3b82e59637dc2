"""NSP/SOP pair building: label balance, provenance of segments, lengths, short sequences, seeds, bad input."""

import random

import numpy as np
import pytest

from kiln.config import REPO_ROOT
from pretrain.data import (
    DataError,
    build_pair_instances,
    create_nsp_examples,
    instance_features,
    train_tokenizer,
)
from pretrain.data.corpus import split_sentences
from pretrain.data.nsp import pair_examples_batch

MAX_SEQ = 64
MAX_TOKENS = MAX_SEQ - 3
MAX_SENTENCE = 25
STRIDE = 1_000_000  # token id = document * STRIDE + position of the token in its document


def synthetic_documents(count: int, seed: int = 0) -> list[list[list[int]]]:
    """Documents whose token ids reveal where each token came from; a few have a single sentence."""
    rng = random.Random(seed)
    documents = []
    for d in range(count):
        position, doc = 0, []
        for _ in range(rng.choice([1, 2, 3]) if d % 10 == 0 else rng.randint(4, 30)):
            length = rng.randint(3, MAX_SENTENCE)
            doc.append([d * STRIDE + position + k for k in range(length)])
            position += length
        documents.append(doc)
    return documents


def instances_until(count: int, task: str = "nsp", nsp_probability: float = 0.5):
    documents = synthetic_documents(300)
    instances, seed = [], 0
    while len(instances) < count:
        instances += build_pair_instances(documents, MAX_SEQ, 0.1, nsp_probability, random.Random(seed), task)
        seed += 1
    return instances


def origin(tokens: list[int]) -> tuple[set[int], np.ndarray]:
    ids = np.asarray(tokens)
    return set((ids // STRIDE).tolist()), ids % STRIDE


def contiguous(positions: np.ndarray) -> bool:
    return bool(np.all(np.diff(positions) == 1))


@pytest.fixture(scope="module")
def nsp_instances():
    return instances_until(10_000)


def test_isnext_share_lengths_and_short_sequences(nsp_instances):
    labels = np.array([inst.label for inst in nsp_instances])
    lengths = np.array([len(inst.tokens_a) + len(inst.tokens_b) + 3 for inst in nsp_instances])
    short = np.array([inst.short_target for inst in nsp_instances])
    assert len(nsp_instances) >= 10_000
    # tolerance: IsNext share 50% +-2 pt (std 0.5 pt); short targets 10% +-1.5 pt (std 0.3 pt)
    assert abs((labels == 0).mean() - 0.5) < 0.02
    assert lengths.max() <= MAX_SEQ and min(min(len(i.tokens_a), len(i.tokens_b)) for i in nsp_instances) >= 1
    assert abs(short.mean() - 0.1) < 0.015
    assert lengths[short].mean() < 0.75 * lengths[~short].mean()  # a short target really shortens


def test_notnext_b_comes_from_another_document_and_isnext_b_follows_a(nsp_instances):
    exact_follow = 0
    for inst in nsp_instances:
        a_docs, a_pos = origin(inst.tokens_a)
        b_docs, b_pos = origin(inst.tokens_b)
        assert a_docs == {inst.a_document} and b_docs == {inst.b_document}
        assert contiguous(a_pos) and contiguous(b_pos)  # truncation only trims the ends
        if inst.label == 1:
            assert inst.b_document != inst.a_document
            continue
        assert inst.b_document == inst.a_document
        gap = b_pos[0] - a_pos[-1] - 1  # tokens trimmed between A's end and B's start
        assert 0 <= gap < MAX_SENTENCE
        if len(inst.tokens_a) + len(inst.tokens_b) < MAX_TOKENS:  # nothing trimmed: B starts right after A
            assert gap == 0
            exact_follow += 1
    assert exact_follow > 500


def test_nsp_probability_is_the_share_of_notnext():
    labels = np.array([inst.label for inst in instances_until(5_000, nsp_probability=0.2)])
    assert abs(labels.mean() - 0.2) < 0.02


def test_sop_keeps_both_segments_in_one_document_and_swaps_half():
    instances = instances_until(5_000, task="sop")
    labels = np.array([inst.label for inst in instances])
    assert abs(labels.mean() - 0.5) < 0.03
    for inst in instances:
        a_docs, a_pos = origin(inst.tokens_a)
        b_docs, b_pos = origin(inst.tokens_b)
        assert a_docs == b_docs == {inst.a_document}
        assert (a_pos.max() < b_pos.min()) if inst.label == 0 else (b_pos.max() < a_pos.min())


def test_single_segment_examples_for_mlm_only():
    instances = build_pair_instances(synthetic_documents(50), MAX_SEQ, 0.1, 0.5, random.Random(0), "none")
    features = [instance_features(inst, 101, 102, "none") for inst in instances]
    assert all(not inst.tokens_b and contiguous(origin(inst.tokens_a)[1]) for inst in instances)
    assert all(set(f) == {"input_ids", "token_type_ids"} and len(f["input_ids"]) <= MAX_SEQ for f in features)
    assert all(
        f["input_ids"][0] == 101 and f["input_ids"][-1] == 102 and set(f["token_type_ids"]) == {0}
        for f in features
    )


def test_each_epoch_gets_different_pairs_and_an_epoch_repeats_exactly():
    batch = {"sentence_ids": synthetic_documents(40, seed=1)}
    kwargs = dict(
        cls_id=2,
        sep_id=3,
        max_seq_length=MAX_SEQ,
        short_seq_prob=0.1,
        nsp_probability=0.5,
        seed=42,
        task="nsp",
    )
    epoch0 = pair_examples_batch(batch, list(range(40)), epoch=0, **kwargs)
    epoch1 = pair_examples_batch(batch, list(range(40)), epoch=1, **kwargs)
    again = pair_examples_batch(batch, list(range(40)), epoch=0, **kwargs)
    assert epoch0 == again and epoch0["input_ids"] != epoch1["input_ids"]


def test_create_nsp_examples_from_sentences_builds_cls_a_sep_b_sep():
    text = (REPO_ROOT / "data/pretrain/the_time_machine.txt").read_text(encoding="utf-8")
    documents = [split_sentences(chapter) for chapter in text.split("\n\n")]
    tokenizer = train_tokenizer([text], vocab_size=600)
    examples = create_nsp_examples(documents, tokenizer, max_seq_length=48, seed=3)
    assert len(examples) > 200
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    for ex in examples:
        ids, types = ex["input_ids"], ex["token_type_ids"]
        assert len(ids) == len(types) <= 48 and ex["next_sentence_label"] in (0, 1)
        first_sep = ids.index(sep)
        assert ids[0] == cls and ids[-1] == sep and ids.count(sep) == 2 and ids.count(cls) == 1
        assert types == [0] * (first_sep + 1) + [1] * (len(ids) - first_sep - 1)
    assert create_nsp_examples(documents, tokenizer, max_seq_length=48, seed=3) == examples
    assert create_nsp_examples(documents, tokenizer, max_seq_length=48, seed=4) != examples


def test_one_document_needs_sop_and_too_short_sequences_fail():
    tokenizer = train_tokenizer(["The cat sat. The dog ran. A bird flew away. It rained."], vocab_size=300)
    one = [["The cat sat.", "The dog ran.", "A bird flew away.", "It rained."]]
    with pytest.raises(DataError, match=r"NSP needs at least 2 documents.*mlm\+sop"):
        create_nsp_examples(one, tokenizer, max_seq_length=32)
    sop = create_nsp_examples(one, tokenizer, max_seq_length=32, task="sop")
    assert sop and all(ex["input_ids"].count(tokenizer.sep_token_id) == 2 for ex in sop)
    with pytest.raises(DataError, match="max_seq_length=4"):
        build_pair_instances(synthetic_documents(3), 4)


def test_notnext_segments_come_from_across_a_corpus_sorted_by_source(monkeypatch):
    """A corpus of 4 books, 8 chapters each, in order, with pools of 4 documents: without the per-epoch document
    shuffle every pool is one book and every NotNext B segment comes from A's own book."""
    from types import SimpleNamespace

    from datasets import Dataset

    from pretrain.config import DataConfig
    from pretrain.data import pipeline

    monkeypatch.setattr(pipeline, "DOCUMENT_POOL", 4)
    book_of = {}
    documents = []
    for book in range(4):
        for _chapter in range(8):
            ids = list(range(1000 * (book + 1), 1000 * (book + 1) + 60))
            for token in ids:
                book_of[token] = book
            documents.append([ids[i : i + 6] for i in range(0, 60, 6)])  # 10 sentences of 6 tokens
    tokens = Dataset.from_dict({"sentence_ids": documents})
    shaper = pipeline._PairShaper(
        DataConfig(max_seq_length=32), SimpleNamespace(cls_token_id=1, sep_token_id=2), "nsp", seed=0
    )
    same_book = not_next = 0
    orders = []
    for epoch in (0, 1):
        examples = shaper.train_examples(tokens, epoch)
        orders.append(examples["input_ids"][:5])
        for row in examples:
            if row["next_sentence_label"] != 1:
                continue
            sep = row["input_ids"].index(2)
            a_book, b_book = book_of[row["input_ids"][1]], book_of[row["input_ids"][sep + 1]]
            not_next += 1
            same_book += a_book == b_book
    assert not_next > 50
    assert same_book / not_next < 0.6  # 1/4 expected when pools are random; 1.0 when they are single books
    assert orders[0] != orders[1]  # another shuffle each epoch

"""Sentence-pair examples for the encoder: NSP (BERT), SOP (ALBERT), or plain single segments for MLM only.

Follows Google BERT's `create_pretraining_data.py` (`create_instances_from_document`):
- the target length is `max_seq_length - 3` ([CLS] A [SEP] B [SEP]); with probability `short_seq_prob` a
  shorter one is drawn uniformly from [2, max_seq_length - 3];
- whole sentences are gathered into a chunk until it reaches the target length; segment A is the first
  1..n-1 sentences of the chunk (chosen at random);
- NSP: with probability `nsp_probability`, B is taken from a different document, starting at a random sentence,
  and the chunk's unused sentences are put back (label 1, NotNext); otherwise B is the rest of the chunk (label
  0, IsNext, the transformers convention). SOP: B is always the rest of the chunk, and with probability
  `nsp_probability` A and B are swapped (label 1);
- the pair is truncated to fit by removing tokens one at a time from the longer segment, at its front or its
  back (a coin flip each time).

Two deliberate differences from BERT, so the statistics match the settings on any corpus:
- the target length is drawn again for every chunk (BERT draws it once per document, which makes the share of
  short sequences depend on how long the documents are);
- a chunk of a single sentence is cut at a random token to make an IsNext (or SOP) pair. BERT forces NotNext
  there, which skews the labels toward NotNext on corpora with short documents or very long sentences.

The pseudo-random numbers come from `random.Random` seeded by (seed, epoch, first document index of the map
batch), so each epoch gives different pairs and the same epoch always gives the same pairs.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from .common import DataError

TASKS = ("nsp", "sop", "none")  # "none": one segment per example ([CLS] A [SEP]) for MLM-only training
IS_NEXT, NOT_NEXT = 0, 1


@dataclass
class PairInstance:
    """One example before special tokens; documents are indices into the list the builder was given."""

    tokens_a: list[int]
    tokens_b: list[int]
    label: int  # NSP: 1 = B from another document; SOP: 1 = swapped
    a_document: int
    b_document: int
    short_target: bool  # the target length was shortened (short_seq_prob)


def truncate_seq_pair(
    tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random
) -> None:
    """Remove tokens from the longer segment, at a random end, until the pair fits (in place, as BERT)."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def build_pair_instances(
    documents: Sequence[Sequence[Sequence[int]]],
    max_seq_length: int,
    short_seq_prob: float = 0.1,
    nsp_probability: float = 0.5,
    rng: random.Random | None = None,
    task: str = "nsp",
) -> list[PairInstance]:
    """Pair instances from tokenized documents (each a list of sentences, each a list of token ids)."""
    if task not in TASKS:
        raise DataError(f"sentence-pair task {task!r} is unknown; use one of {', '.join(TASKS)}")
    rng = rng or random.Random(0)
    documents = [[list(s) for s in doc if len(s)] for doc in documents]
    nonempty = [i for i, doc in enumerate(documents) if doc]
    if task == "nsp" and len(nonempty) < 2:
        raise DataError(
            f"NSP needs at least 2 documents to draw NotNext segments from, found {len(nonempty)}: add documents, "
            f"split them differently (--data.document_separator), or use --model.objective=mlm+sop"
        )
    max_num_tokens = max_seq_length - (3 if task != "none" else 2)
    if max_num_tokens < 2:
        raise DataError(
            f"--data.max_seq_length={max_seq_length} leaves no room for two segments; use at least 8"
        )
    builder = _PairBuilder(documents, nonempty, max_num_tokens, short_seq_prob, nsp_probability, rng, task)
    return [instance for doc_index in nonempty for instance in builder.from_document(doc_index)]


@dataclass
class _PairBuilder:
    documents: list[list[list[int]]]
    nonempty: list[int]  # sorted indices of the documents with at least one sentence
    max_num_tokens: int
    short_seq_prob: float
    nsp_probability: float
    rng: random.Random
    task: str

    def target_length(self) -> tuple[int, bool]:
        if self.rng.random() < self.short_seq_prob:
            return self.rng.randint(2, self.max_num_tokens), True
        return self.max_num_tokens, False

    def from_document(self, doc_index: int) -> Iterator[PairInstance]:
        document = self.documents[doc_index]
        target, short = self.target_length()
        chunk: list[list[int]] = []
        chunk_length = 0
        i = 0
        while i < len(document):
            chunk.append(document[i])
            chunk_length += len(document[i])
            if i == len(document) - 1 or chunk_length >= target:
                instance, unused = self.pair_from_chunk(chunk, doc_index, target, short)
                i -= unused  # NotNext: the sentences not used for A go back to the document
                if instance is not None:
                    yield instance
                chunk, chunk_length = [], 0
                target, short = self.target_length()
            i += 1

    def pair_from_chunk(self, chunk, doc_index, target, short) -> tuple[PairInstance | None, int]:
        """(instance or None, number of the chunk's sentences to put back)."""
        rng = self.rng
        if self.task == "none":
            tokens_a = [t for sentence in chunk for t in sentence][: self.max_num_tokens]
            return PairInstance(tokens_a, [], 0, doc_index, doc_index, short), 0
        a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
        tokens_a = [t for sentence in chunk[:a_end] for t in sentence]
        unused = 0
        if self.task == "nsp" and rng.random() < self.nsp_probability:
            tokens_b, b_doc = self.random_segment(doc_index, target - len(tokens_a))
            label, unused = NOT_NEXT, len(chunk) - a_end
        else:
            tokens_b, b_doc, label = [t for sentence in chunk[a_end:] for t in sentence], doc_index, IS_NEXT
            if not tokens_b:  # a one-sentence chunk: cut it at a random token
                if len(tokens_a) < 2:
                    return None, 0
                cut = rng.randint(1, len(tokens_a) - 1)
                tokens_a, tokens_b = tokens_a[:cut], tokens_a[cut:]
            if self.task == "sop" and rng.random() < self.nsp_probability:
                tokens_a, tokens_b, label = tokens_b, tokens_a, NOT_NEXT
        truncate_seq_pair(tokens_a, tokens_b, self.max_num_tokens, rng)
        return PairInstance(tokens_a, tokens_b, label, doc_index, b_doc, short), unused

    def random_segment(self, doc_index: int, target_b_length: int) -> tuple[list[int], int]:
        """Sentences of a random other document, from a random start, until target_b_length tokens."""
        pick = self.rng.randrange(len(self.nonempty) - 1)  # nonempty is sorted and holds doc_index: skip it
        other = self.nonempty[pick] if self.nonempty[pick] < doc_index else self.nonempty[pick + 1]
        random_document = self.documents[other]
        tokens_b: list[int] = []
        for sentence in random_document[self.rng.randrange(len(random_document)) :]:
            tokens_b.extend(sentence)
            if len(tokens_b) >= target_b_length:
                break
        return tokens_b, other


def instance_features(
    instance: PairInstance, cls_id: int, sep_id: int, task: str = "nsp"
) -> dict[str, list[int] | int]:
    """`[CLS] A [SEP] B [SEP]` with token_type_ids (and next_sentence_label unless task is "none")."""
    input_ids = [cls_id, *instance.tokens_a, sep_id]
    token_type_ids = [0] * len(input_ids)
    if instance.tokens_b:
        input_ids += [*instance.tokens_b, sep_id]
        token_type_ids += [1] * (len(instance.tokens_b) + 1)
    features: dict = {"input_ids": input_ids, "token_type_ids": token_type_ids}
    if task != "none":
        features["next_sentence_label"] = instance.label
    return features


def create_nsp_examples(
    documents: Sequence[Sequence[str]],
    tokenizer,
    max_seq_length: int,
    short_seq_prob: float = 0.1,
    nsp_probability: float = 0.5,
    seed: int = 0,
    task: str = "nsp",
) -> list[dict]:
    """NSP (task="nsp"), SOP ("sop") or single-segment ("none") examples from documents of sentence strings.

    Returns feature dicts with `input_ids`, `token_type_ids` and (NSP/SOP) `next_sentence_label`.
    """
    flat = [sentence for doc in documents for sentence in doc]
    # verbose=False: sentences longer than model_max_length are expected here (pairs truncate them later)
    ids = tokenizer(flat, add_special_tokens=False, verbose=False)["input_ids"] if flat else []
    tokenized, start = [], 0
    for doc in documents:
        tokenized.append(ids[start : start + len(doc)])
        start += len(doc)
    instances = build_pair_instances(
        tokenized, max_seq_length, short_seq_prob, nsp_probability, random.Random(seed), task
    )
    return [
        instance_features(inst, tokenizer.cls_token_id, tokenizer.sep_token_id, task) for inst in instances
    ]


def pair_examples_batch(
    batch,
    indices,
    *,
    cls_id: int,
    sep_id: int,
    max_seq_length: int,
    short_seq_prob: float,
    nsp_probability: float,
    seed: int,
    epoch: int | str,
    task: str,
):
    """`datasets.map(batched=True, with_indices=True)` function: tokenized documents -> examples.

    The documents of one map batch are the pool NotNext segments are drawn from.
    """
    rng = random.Random(f"{task}:{seed}:{epoch}:{indices[0] if indices else 0}")
    documents = batch["sentence_ids"]
    if task == "nsp" and sum(1 for doc in documents if doc) < 2:  # a lone document at the end of the data
        return {
            "input_ids": [],
            "token_type_ids": [],
            **({"next_sentence_label": []} if task != "none" else {}),
        }
    instances = build_pair_instances(documents, max_seq_length, short_seq_prob, nsp_probability, rng, task)
    features = [instance_features(inst, cls_id, sep_id, task) for inst in instances]
    return {key: [f[key] for f in features] for key in _feature_keys(task)}


def _feature_keys(task: str) -> list[str]:
    return ["input_ids", "token_type_ids"] + (["next_sentence_label"] if task != "none" else [])


__all__ = [
    "IS_NEXT",
    "NOT_NEXT",
    "PairInstance",
    "build_pair_instances",
    "create_nsp_examples",
    "instance_features",
    "pair_examples_batch",
    "truncate_seq_pair",
]

"""From config to training examples: documents -> tokens -> NSP/SOP pairs or packed CLM blocks -> collator.

    data = build_pretraining_data(cfg.data, tokenizer, "encoder", "mlm+nsp", seed=42, max_position_embeddings=128)
    train = data.train_dataset(epoch)            # NSP pairs drawn again for every epoch
    batch = data.collator([train[i] for i in range(8)])

Map-style datasets are cached by `datasets` fingerprints (tokenization once; the pairs of epoch e once), and
built under `accelerator.main_process_first()` so the main process writes the cache and the others read it:
every process must call `build_pretraining_data` and `train_dataset` together. Streaming datasets are split
across processes with `split_dataset_by_node` and shuffled with a buffer.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from datasets import Dataset, IterableDataset
from datasets.distributed import split_dataset_by_node
from datasets.fingerprint import Hasher

from .clm import BlockPacker
from .collator import CLMCollator, ElectraCollator, HybridCollator, MLMCollator
from .common import DataError, main_process_first, num_proc_for, process_rank_and_count
from .corpus import load_documents, split_sentences
from .nsp import pair_examples_batch
from .tokenizer import check_special_tokens, check_tokenizer_fits

if TYPE_CHECKING:
    from ..config import DataConfig

logger = logging.getLogger(__name__)

OBJECTIVES = {"encoder": ("mlm+nsp", "mlm+sop", "mlm", "electra"), "decoder": ("clm", "clm+mntp")}
PAIR_TASK = {"mlm+nsp": "nsp", "mlm+sop": "sop", "mlm": "none", "electra": "none"}  # ELECTRA: single segments
DOCUMENT_POOL = 1000
"""Documents per map batch: NotNext segments are drawn from the same batch. The training documents are
shuffled (seeded, per epoch) first, as Google's create_pretraining_data.py does, so a pool is a random sample of
the whole corpus even when the corpus is sorted by source (one book or topic after another)."""
EVAL_EPOCH = "eval"  # the pairs of the validation set use this in place of an epoch number


@dataclass
class PretrainingData:
    """Everything the training loop needs from the data path.

    `collator` masks training batches (seeded per batch, see collator.py); `eval_collator` is a separate
    instance, so evaluation never moves the training collator's batch counter: call
    `eval_collator.set_epoch(0)` before each evaluation to see the same masks every time.
    `eval_dataset` is None when there is no validation data (validation_split_percentage 0 and none given).
    """

    tokenizer: Any
    eval_dataset: Dataset | None
    collator: Callable[[list[dict]], dict]
    eval_collator: Callable[[list[dict]], dict]
    objective: str
    streaming: bool
    num_train_documents: int | None
    _build_train: Callable[[int], Dataset | IterableDataset] = field(repr=False)
    _train_cache: dict = field(default_factory=dict, repr=False)

    def train_dataset(self, epoch: int) -> Dataset | IterableDataset:
        """Training examples for `epoch` (encoder: pairs drawn with seed + epoch; decoder: the same blocks)."""
        if epoch not in self._train_cache:
            self._train_cache.clear()  # keep one epoch: an old one is never asked for again
            self._train_cache[epoch] = self._build_train(epoch)
        return self._train_cache[epoch]


def validate_settings(
    data_cfg: DataConfig, model_kind: str, objective: str, max_position_embeddings: int
) -> None:
    """Cheap checks before any data is read; each failure is a one-line DataError naming the fix."""
    if model_kind not in OBJECTIVES:
        raise DataError(f"--model.kind={model_kind!r}: choose 'encoder' or 'decoder'")
    if objective not in OBJECTIVES[model_kind]:
        raise DataError(
            f"objective {objective!r} does not fit a {model_kind}; use one of {', '.join(OBJECTIVES[model_kind])}"
        )
    if data_cfg.max_seq_length > max_position_embeddings:
        raise DataError(
            f"--data.max_seq_length={data_cfg.max_seq_length} exceeds the model's max_position_embeddings="
            f"{max_position_embeddings}: lower --data.max_seq_length or raise --model.max_position_embeddings"
        )
    shortest = 8 if model_kind == "encoder" else 2
    if data_cfg.max_seq_length < shortest:
        raise DataError(
            f"--data.max_seq_length={data_cfg.max_seq_length} is too short; use at least {shortest}"
        )


def build_pretraining_data(
    data_cfg: DataConfig,
    tokenizer,
    model_kind: str,
    objective: str,
    seed: int,
    max_position_embeddings: int,
    accelerator=None,
    vocab_size: int | None = None,
) -> PretrainingData:
    """Read, tokenize and shape the corpus for `objective` ("mlm+nsp" | "mlm+sop" | "mlm" | "electra" | "clm").

    `vocab_size` (the model's, when known) is checked against the tokenizer.
    """
    validate_settings(data_cfg, model_kind, objective, max_position_embeddings)
    check_special_tokens(tokenizer, model_kind, objective)
    if vocab_size is not None:
        check_tokenizer_fits(tokenizer, vocab_size)
    if model_kind == "encoder":
        collator, eval_collator = (
            make_mlm_collator(data_cfg, tokenizer, seed, objective),
            make_mlm_collator(data_cfg, tokenizer, seed + 1, objective),
        )
    else:
        collator, eval_collator = make_decoder_collators(data_cfg, tokenizer, seed, objective)

    with main_process_first(accelerator):
        splits = load_documents(data_cfg)
        if model_kind == "encoder":
            shaper = _PairShaper(data_cfg, tokenizer, PAIR_TASK[objective], seed)
        else:
            shaper = _BlockShaper(data_cfg, tokenizer)
        train_tokens = shaper.tokenize(splits.train)
        shaper.check_train(train_tokens)
        eval_dataset = None
        if splits.validation is not None:
            validation = splits.validation
            if isinstance(validation, IterableDataset):  # the eval set is held in memory
                validation = Dataset.from_dict({"text": [row["text"] for row in validation]})
            eval_tokens = shaper.tokenize(validation) if len(validation) else validation
            eval_dataset = shaper.eval_examples(eval_tokens) if len(eval_tokens) else None
            if eval_dataset is not None and len(eval_dataset) == 0:
                eval_dataset = None
        if eval_dataset is None:
            logger.warning(
                "no validation examples (%s): this run will not evaluate; give data.validation_files, "
                "raise data.validation_split_percentage, or add documents",
                "no validation split"
                if splits.validation is None
                else "the validation split is empty"
                if not len(validation)
                else f"{len(validation)} validation document(s), too short for one example",
            )

    streaming = isinstance(train_tokens, IterableDataset)
    if streaming:
        rank, world = process_rank_and_count(accelerator)
        train_tokens = split_dataset_by_node(train_tokens, rank=rank, world_size=world)

    def build_train(epoch: int):
        if streaming:
            stream = shaper.train_examples(train_tokens, epoch)
            if getattr(collator, "wants_example_index", False):
                stream = stream.map(_content_indices, batched=True)
            stream = stream.shuffle(seed=seed, buffer_size=data_cfg.shuffle_buffer_size)
            stream.set_epoch(epoch)
            return stream.with_format("torch")
        with main_process_first(accelerator):
            return shaper.train_examples(train_tokens, epoch).with_format("torch")

    return PretrainingData(
        tokenizer=tokenizer,
        eval_dataset=eval_dataset.with_format("torch") if eval_dataset is not None else None,
        collator=collator,
        eval_collator=eval_collator,
        objective=objective,
        streaming=streaming,
        num_train_documents=None if streaming else len(train_tokens),
        _build_train=build_train,
    )


def _content_indices(batch) -> dict[str, list[int]]:
    """A streamed example's `example_index`: a 63-bit hash of its tokens and segments, where a map-style example
    has its position. The masks come from (seed, epoch, example index) (collator.py), so a streamed example is
    masked alike on any number of processes, in any batch, after a resume: a position would not do, as
    `split_dataset_by_node` gives each process its own shards and each process counts its own examples."""
    segments = batch.get("token_type_ids") or [[] for _ in batch["input_ids"]]
    keys = []
    for ids, types in zip(batch["input_ids"], segments):
        digest = hashlib.blake2b(np.asarray(ids, dtype=np.int64).tobytes(), digest_size=8)
        digest.update(np.asarray(types, dtype=np.int8).tobytes())
        keys.append(int.from_bytes(digest.digest(), "little") >> 1)
    return {"example_index": keys}


def make_decoder_collators(data_cfg: DataConfig, tokenizer, seed: int, objective: str = "clm"):
    """(training, evaluation) collators of a decoder: causal LM; for `clm+mntp` the training rows mix causal and
    masked next-token prediction (`HybridCollator`) while evaluation stays causal, so its loss and perplexity
    compare with any causal run's."""
    causal = CLMCollator(tokenizer, data_cfg.pad_to_multiple_of, data_cfg.document_masking)
    if objective != "clm+mntp":
        return causal, causal
    hybrid = HybridCollator(
        tokenizer,
        causal_share=data_cfg.causal_share,
        document_masking=data_cfg.document_masking,
        seed=seed,
        **masking_options(data_cfg),
    )
    return hybrid, causal


def masking_options(data_cfg: DataConfig) -> dict:
    """The `data` section's masking options, as `MLMCollator` (and the hybrid's masked rows) take them."""
    return {
        "mlm_probability": data_cfg.mlm_probability,
        "mask_replace_prob": data_cfg.mask_replace_prob,
        "random_replace_prob": data_cfg.random_replace_prob,
        "whole_word_mask": data_cfg.whole_word_mask,
        "max_predictions_per_seq": data_cfg.max_predictions_per_seq,
        "pad_to_multiple_of": data_cfg.pad_to_multiple_of,
    }


def make_mlm_collator(
    data_cfg: DataConfig, tokenizer, seed: int | None, objective: str = "mlm"
) -> MLMCollator:
    """The MLM collator configured by `data_cfg` (seed None: global torch RNG); ELECTRA's adds the uniforms its
    generator samples replacements with."""
    collator_class = ElectraCollator if objective == "electra" else MLMCollator
    return collator_class(tokenizer, seed=seed, **masking_options(data_cfg))


# ----------------------------------------------------------------------------------------------------------
# shapers: how tokens become examples for each model kind


def _tokenizer_fingerprint(tokenizer) -> str:
    return Hasher.hash([tokenizer.backend_tokenizer.to_str(), tokenizer.all_special_tokens])


def _fingerprint(ds: Dataset, *parts) -> str:
    return Hasher.hash([ds._fingerprint, *parts])


def _map(ds, function, *, fingerprint_parts, num_proc=None, desc=None, **kwargs):
    """datasets.map with an explicit fingerprint (map-style) or lazily (streaming)."""
    if isinstance(ds, IterableDataset):
        return ds.map(function, **kwargs)
    return ds.map(
        function,
        num_proc=num_proc,
        desc=desc,
        new_fingerprint=_fingerprint(
            ds, getattr(function, "__qualname__", type(function).__qualname__), *fingerprint_parts
        ),
        **kwargs,
    )


def _tokenize_sentences_batch(batch, tokenizer, sentence_split: str):
    documents = [split_sentences(text, sentence_split) for text in batch["text"]]
    flat = [sentence for doc in documents for sentence in doc]
    ids = _encode(tokenizer, flat)
    sentence_ids, start = [], 0
    for doc in documents:
        sentences = [s for s in ids[start : start + len(doc)] if s]
        start += len(doc)
        if sentences:
            sentence_ids.append(sentences)
    return {"sentence_ids": sentence_ids}


def _tokenize_documents_batch(batch, tokenizer):
    return {"input_ids": [ids for ids in _encode(tokenizer, batch["text"]) if ids]}


def _encode(tokenizer, texts: list[str]) -> list[list[int]]:
    if not texts:
        return []
    return tokenizer(
        texts,
        add_special_tokens=False,
        return_attention_mask=False,
        return_token_type_ids=False,
        verbose=False,
    )["input_ids"]


class _PairShaper:
    """Encoder: documents -> sentence token ids -> NSP/SOP pairs (or single segments)."""

    def __init__(self, cfg: DataConfig, tokenizer, task: str, seed: int):
        self.cfg, self.tokenizer, self.task, self.seed = cfg, tokenizer, task, seed

    def tokenize(self, documents):
        rows = len(documents) if isinstance(documents, Dataset) else 0
        return _map(
            documents,
            _tokenize_sentences_batch,
            fingerprint_parts=[_tokenizer_fingerprint(self.tokenizer), self.cfg.sentence_split],
            num_proc=num_proc_for(self.cfg.num_proc, rows),
            desc="Tokenizing sentences",
            batched=True,
            fn_kwargs={"tokenizer": self.tokenizer, "sentence_split": self.cfg.sentence_split},
            remove_columns=["text"],
        )

    def check_train(self, tokens) -> None:
        if isinstance(tokens, Dataset):
            count = len(tokens)
        else:
            count = sum(1 for _ in tokens.take(2))
        if count == 0:
            raise DataError("no training document has any tokens; check the corpus and --data.text_column")
        if self.task == "nsp" and count < 2:
            raise DataError(
                "NSP needs at least 2 training documents but the corpus has 1: add documents, split them "
                "differently (--data.document_separator=line or heading), or use --model.objective=mlm+sop"
            )

    def _examples(self, tokens, epoch, pool: int, num_proc=None, desc=None):
        kwargs = {
            "cls_id": self.tokenizer.cls_token_id,
            "sep_id": self.tokenizer.sep_token_id,
            "max_seq_length": self.cfg.max_seq_length,
            "short_seq_prob": self.cfg.short_seq_prob,
            "nsp_probability": self.cfg.nsp_probability,
            "seed": self.seed,
            "epoch": epoch,
            "task": self.task,
        }
        if num_proc is None:
            return _map(
                tokens,
                pair_examples_batch,
                fingerprint_parts=[sorted(kwargs.items()), pool],
                desc=desc,
                batched=True,
                batch_size=pool,
                with_indices=True,
                fn_kwargs=kwargs,
                remove_columns=["sentence_ids"],
            )
        # Several processes: datasets would cut the documents into one contiguous shard per process and restart
        # its batches at every shard, so the pools (and their seeds) would move with num_proc. Mapping over the
        # pools' numbers instead keeps each pool whole in one process: the same examples for any num_proc
        pools = Dataset.from_dict({"pool": list(range(math.ceil(len(tokens) / pool)))})
        return pools.map(
            _pair_pools,
            num_proc=num_proc,
            desc=desc,
            batched=True,
            batch_size=1,
            fn_kwargs={"tokens": tokens, "pool": pool, "kwargs": kwargs},
            remove_columns=["pool"],
            new_fingerprint=_fingerprint(tokens, "_pair_pools", sorted(kwargs.items()), pool),
        )

    def train_examples(self, tokens, epoch: int):
        if isinstance(tokens, IterableDataset):
            tokens = tokens.shuffle(
                seed=self.seed, buffer_size=max(self.cfg.shuffle_buffer_size, DOCUMENT_POOL)
            )
            tokens.set_epoch(epoch)
            return self._examples(tokens, epoch, DOCUMENT_POOL)
        if len(tokens) > DOCUMENT_POOL:  # smaller corpora are one pool anyway
            tokens = tokens.shuffle(seed=int(np.random.SeedSequence([self.seed, epoch]).generate_state(1)[0]))
        batches = math.ceil(len(tokens) / DOCUMENT_POOL)
        pool = math.ceil(len(tokens) / batches)  # even batches: no lone document at the end
        desc = (
            f"Building {self.task.upper()} examples (epoch {epoch})"
            if self.task != "none"
            else f"Building examples (epoch {epoch})"
        )
        return self._examples(tokens, epoch, pool, num_proc_for(self.cfg.num_proc, batches), desc)

    def eval_examples(self, tokens):
        if self.task == "nsp" and len(tokens) < 2:
            raise DataError(
                f"the validation split has {len(tokens)} document(s) but NSP needs 2: raise "
                f"--data.validation_split_percentage, give --data.validation_files, or use --model.objective=mlm+sop"
            )
        return self._examples(tokens, EVAL_EPOCH, max(len(tokens), 1), desc="Building validation examples")


def _pair_pools(batch, *, tokens, pool: int, kwargs: dict) -> dict[str, list]:
    """The examples of the pools numbered in `batch`: pool k is documents k*pool ... (k+1)*pool - 1, built exactly as
    `pair_examples_batch` builds a map batch of `pool` documents starting at document k*pool."""
    out: dict[str, list] = {}
    for k in batch["pool"]:
        start, end = k * pool, min((k + 1) * pool, len(tokens))
        examples = pair_examples_batch(tokens[start:end], list(range(start, end)), **kwargs)
        for key, values in examples.items():
            out.setdefault(key, []).extend(values)
    return out


class _BlockShaper:
    """Decoder: documents -> token ids -> EOS-separated stream cut into max_seq_length blocks."""

    def __init__(self, cfg: DataConfig, tokenizer):
        self.cfg, self.tokenizer = cfg, tokenizer
        self.eos_id = tokenizer.eos_token_id
        self._train_blocks = None  # map-style: the same blocks every epoch

    def tokenize(self, documents):
        rows = len(documents) if isinstance(documents, Dataset) else 0
        return _map(
            documents,
            _tokenize_documents_batch,
            fingerprint_parts=[_tokenizer_fingerprint(self.tokenizer)],
            num_proc=num_proc_for(self.cfg.num_proc, rows),
            desc="Tokenizing documents",
            batched=True,
            fn_kwargs={"tokenizer": self.tokenizer},
            remove_columns=["text"],
        )

    def check_train(self, tokens) -> None:
        empty = len(tokens) == 0 if isinstance(tokens, Dataset) else next(iter(tokens.take(1)), None) is None
        if empty:
            raise DataError("no training document has any tokens; check the corpus and --data.text_column")

    def _blocks(self, tokens, desc=None):
        num_rows = len(tokens) if isinstance(tokens, Dataset) else None
        packer = BlockPacker(self.cfg.max_seq_length, self.eos_id, num_rows)
        return _map(
            tokens,
            packer,
            fingerprint_parts=[self.cfg.max_seq_length, self.eos_id],
            desc=desc,  # one process, in order: the remainder of each batch is carried into the next
            batched=True,
            with_indices=True,
        )

    def train_examples(self, tokens, epoch: int):
        if isinstance(tokens, IterableDataset):
            return self._blocks(tokens)
        if self._train_blocks is None:
            self._train_blocks = self._blocks(tokens, desc="Packing blocks")
        return self._train_blocks

    def eval_examples(self, tokens):
        return self._blocks(tokens, desc="Packing validation blocks")


__all__ = [
    "DOCUMENT_POOL",
    "OBJECTIVES",
    "PretrainingData",
    "build_pretraining_data",
    "make_mlm_collator",
    "validate_settings",
]

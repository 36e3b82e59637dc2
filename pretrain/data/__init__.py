"""Kiln's data path: corpus -> tokenizer -> NSP/SOP pairs or packed CLM blocks -> collator.

`python -m pretrain.data --help` inspects the examples and masking statistics of a run config.
"""

import importlib
from typing import TYPE_CHECKING

# Each name is imported from its module when first used: `python -m pretrain.data prepare` runs this file first
# and needs neither torch nor datasets (seconds of start-up before its worker processes can share the work).
_HOMES = {
    "BlockPacker": "clm",
    "pack_documents": "clm",
    "CLMCollator": "collator",
    "ElectraCollator": "collator",
    "MLMCollator": "collator",
    "pad_batch": "collator",
    "DataError": "common",
    "CorpusSplits": "corpus",
    "load_documents": "corpus",
    "resolve_data_files": "corpus",
    "split_documents": "corpus",
    "split_sentences": "corpus",
    "PairInstance": "nsp",
    "build_pair_instances": "nsp",
    "create_nsp_examples": "nsp",
    "instance_features": "nsp",
    "PretrainingData": "pipeline",
    "build_pretraining_data": "pipeline",
    "make_mlm_collator": "pipeline",
    "validate_settings": "pipeline",
    "check_tokenizer_fits": "tokenizer",
    "load_tokenizer": "tokenizer",
    "padded_vocab_size": "tokenizer",
    "prepare_tokenizer": "tokenizer",
    "train_tokenizer": "tokenizer",
}


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from .clm import BlockPacker, pack_documents
    from .collator import CLMCollator, ElectraCollator, MLMCollator, pad_batch
    from .common import DataError
    from .corpus import CorpusSplits, load_documents, resolve_data_files, split_documents, split_sentences
    from .nsp import PairInstance, build_pair_instances, create_nsp_examples, instance_features
    from .pipeline import PretrainingData, build_pretraining_data, make_mlm_collator, validate_settings
    from .tokenizer import (
        check_tokenizer_fits,
        load_tokenizer,
        padded_vocab_size,
        prepare_tokenizer,
        train_tokenizer,
    )

__all__ = [
    "BlockPacker",
    "CLMCollator",
    "CorpusSplits",
    "DataError",
    "ElectraCollator",
    "MLMCollator",
    "PairInstance",
    "PretrainingData",
    "build_pair_instances",
    "build_pretraining_data",
    "check_tokenizer_fits",
    "create_nsp_examples",
    "instance_features",
    "load_documents",
    "load_tokenizer",
    "make_mlm_collator",
    "pack_documents",
    "pad_batch",
    "padded_vocab_size",
    "prepare_tokenizer",
    "resolve_data_files",
    "split_documents",
    "split_sentences",
    "train_tokenizer",
    "validate_settings",
]

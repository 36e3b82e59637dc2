"""Kiln's data path: corpus -> tokenizer -> NSP/SOP pairs or packed CLM blocks -> collator.

`python -m pretrain.data --help` inspects the examples and masking statistics of a run config.
"""

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

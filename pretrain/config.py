"""The pretraining run's configuration: the model, tokenizer, data and eval sections of the pretraining app, with
the engine's training, logging and hub sections (kiln.config, which also holds the YAML and command-line machinery).

Every field carries a docstring (the string literal right under it); `--help` prints them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from kiln.config import HubConfig, LoggingConfig, TrainingConfig
from kiln.option_range import bounded

# Upper bounds of the model's shape, far beyond any model trained (the widest public ones are about 16k wide and
# 128 blocks deep, the longest contexts about a million tokens): a value past them is a typo whose build would run
# out of memory, or never end, after config.yaml and tokenizer/ were written
WIDEST = 2**16
DEEPEST = 2**12
LONGEST = 2**21
LARGEST_VOCABULARY = 2**24


@dataclass
class ModelConfig:
    kind: str = "encoder"
    """`encoder` (BERT-like, masked LM) or `decoder` (GPT-like, causal LM)."""
    objective: str = "mlm+nsp"
    """Encoder pretraining objective: `mlm+nsp`, `mlm+sop` (sentence-order prediction), `mlm`, or `electra` (replaced-token detection with a small MLM generator, docs/electra.md). Decoders use `clm`, or `clm+mntp`: GPT-BERT's hybrid (Charpentier & Samuel 2024), where a share `data.causal_share` of the rows trains causally and the rest by masked next-token prediction (tokens masked at `data.mlm_probability`, attention over the whole document, each masked token predicted at the position before it), one model usable both ways (docs/zero-shot.md)."""
    generator_size: float = bounded(0.25, 0, 1, low_open=True)  # a fraction of the discriminator
    """ELECTRA only: the generator's hidden size, attention heads and feed-forward width as a fraction of this model's (the paper's 1/4); same depth."""
    discriminator_weight: float = bounded(50.0, low=0, low_open=True)
    """ELECTRA only: lambda, the weight of the discriminator's replaced-token loss beside the generator's MLM loss (the paper's 50)."""
    init_from: str | None = None
    """Start from this Kiln checkpoint (local folder or Hub id) instead of random weights; a transformers BERT, ELECTRA, GPT-2 or Llama checkpoint is converted to Kiln on the way in (docs/continue-pretraining.md). Its config.json is read as data and its weights loaded with Kiln's own classes: Python files the checkpoint names (`auto_map`) are not run."""
    trust_remote_code: bool = False
    """Run the Python files that model.init_from names in its config.json (`auto_map`), as transformers' `trust_remote_code=True` does. Only for a checkpoint whose code you have read and trust: it runs inside the training process."""
    hidden_size: int = bounded(128, 1, WIDEST)
    """Width of the residual stream."""
    num_hidden_layers: int = bounded(2, 1, DEEPEST)
    """Number of transformer blocks."""
    num_attention_heads: int = bounded(2, 1, WIDEST)
    """Attention heads per block; must divide hidden_size."""
    intermediate_size: int = bounded(512, 1, 4 * WIDEST)
    """Width of the feed-forward layer (usually 4 x hidden_size)."""
    hidden_act: str | None = None
    """Feed-forward activation (`gelu`, `gelu_new`, `relu`, `silu`, ...); None: the preset's (`llama` silu, the others BERT's erf `gelu`)."""
    hidden_dropout_prob: float | None = bounded(None, 0, 1, high_open=True)  # 1 drops everything
    """Dropout on embeddings and sublayer outputs; None: the preset's (`llama` 0, the others 0.1)."""
    attention_probs_dropout_prob: float | None = bounded(None, 0, 1, high_open=True)
    """Dropout on attention probabilities; None: the preset's (`llama` 0, the others 0.1)."""
    max_position_embeddings: int = bounded(128, 1, LONGEST)
    """Longest sequence the model accepts."""
    position_embedding_type: str | None = None
    """Encoder only: `learned`, `sinusoidal` (fixed sin/cos table) or `rotary` (RoPE in every attention); None: the preset's (`learned` for `bert`)."""
    type_vocab_size: int = bounded(2, 0, 2**16)  # 0: no segment embeddings
    """Encoder only: number of segment (token type) ids."""
    layer_norm_eps: float | None = bounded(None, low=0, low_open=True)  # 0 divides by zero
    """LayerNorm (RMSNorm) epsilon; None: the preset's (`llama` 1e-5, the others BERT's 1e-12; GPT-2 uses 1e-5)."""
    initializer_range: float = bounded(0.02, low=0, low_open=True)
    """Std of the normal initialisation."""
    preset: str | None = None
    """The block's pieces set together. Encoder: `bert` (BERT's post-LN block, the default) or `modernbert` (ModernBERT's: rotary positions, GeGLU, pre-LN without biases, local attention in two blocks of three); each encoder piece below left at None takes the preset's value. Decoder: `gpt2` (the default: learned positions, GELU MLP, LayerNorm, biases) or `llama` (rotary positions, SwiGLU, RMSNorm, no biases; converts to transformers' LlamaForCausalLM); hidden_act, the dropouts and layer_norm_eps left unset take the preset's values (`llama`: Llama's silu, 0, 1e-5; the others: BERT's gelu, 0.1, 1e-12), an option given always wins, even one equal to a preset's value. docs/models.md."""
    norm_position: str | None = None
    """Encoder only: `post` (LayerNorm after each residual sum, BERT) or `pre` (before each sublayer, with a final LayerNorm); None: the preset's."""
    mlp_type: str | None = None
    """Encoder only: `mlp` (fc_in, activation, fc_out) or `glu` (gated, GeGLU with `gelu`; intermediate_size is the width of one of its two halves); None: the preset's."""
    bias: bool | None = None
    """Encoder only: biases in the attention's and the feed-forward's linear layers, in every LayerNorm and in the heads' dense layers (the MLM vocabulary projection keeps its bias); None: the preset's (`bert` True, `modernbert` False)."""
    classifier_head: str | None = None
    """Encoder only: what the classification heads read, `tanh_pooler` (BERT's pooler on the first token) or `transform` (dense, activation, LayerNorm, also before the token classifier, ModernBERT's); None: the preset's."""
    local_attention: int | None = bounded(None, 0, LONGEST)
    """Encoder only: window of the local-attention blocks in tokens (a token sees `local_attention // 2` positions each side; 0: none); None: the preset's (`modernbert` 128)."""
    global_attn_every_n_layers: int | None = bounded(None, 1, DEEPEST)
    """Encoder only: blocks 0, n, 2n, ... attend globally, the others locally (1: all global); None: the preset's (`modernbert` 3)."""
    rope_theta: float | None = bounded(None, low=0, low_open=True)  # inf: no position information
    """Rotary positions: the base of the rotary frequencies; None: the model's (encoder: the global blocks', ModernBERT's 160,000; decoder: 10,000, Llama 2's; Llama 3 uses 500,000)."""
    local_rope_theta: float = bounded(10_000.0, low=0, low_open=True)
    """Encoder with rotary positions: the local blocks' rotary base (ModernBERT's 10,000)."""
    attn_implementation: str = "sdpa"
    """Attention kernel: `sdpa` (PyTorch fused), `eager`, or `flex_attention` (trains on a CUDA GPU only, without attention dropout); other values are refused."""
    num_key_value_heads: int | None = bounded(None, 1, WIDEST)
    """Decoder only: key/value heads of grouped-query attention (must divide num_attention_heads; None: one per attention head)."""
    tie_word_embeddings: bool = True
    """Decoder only: the LM head shares the token embedding matrix (False: a separate output matrix)."""


# The values of the model options that depend on the preset, for each model kind and preset: an option left
# at None ("not given") takes its preset's, one given always wins (even one equal to a preset's value). The
# encoders and the `gpt2` decoder take BERT's (configs/model/decoder-*.yaml give GPT-2's gelu_new and 1e-5,
# encoder-modern-*.yaml ModernBERT's dropout 0 and 1e-5); `llama` takes Llama's, as KilnDecoderConfig's.
_BERT_OPTIONS = {
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "layer_norm_eps": 1e-12,
}
PRESET_OPTIONS = {
    ("encoder", "bert"): _BERT_OPTIONS,
    ("encoder", "modernbert"): _BERT_OPTIONS,
    ("decoder", "gpt2"): _BERT_OPTIONS,
    ("decoder", "llama"): {
        "hidden_act": "silu",
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "layer_norm_eps": 1e-5,
    },
}
DEFAULT_PRESETS = {"encoder": "bert", "decoder": "gpt2"}
"""The preset of a model kind whose `preset` is None."""


def preset_options(kind: str | None, preset: str | None, given: dict[str, Any]) -> dict[str, Any]:
    """The preset-dependent model options (`hidden_act`, `hidden_dropout_prob`,
    `attention_probs_dropout_prob`, `layer_norm_eps`) as the model is built with them: each one `given` holds
    (not None), else its preset's. The one place they are resolved: the encoder and decoder configs, the
    attention-dropout check and the resume comparison read them here. An unknown kind or preset (refused by
    the run's checks) reads as BERT's."""
    values = PRESET_OPTIONS.get((kind, preset or DEFAULT_PRESETS.get(kind)), _BERT_OPTIONS)
    return {name: value if given.get(name) is None else given[name] for name, value in values.items()}


def model_options(model: ModelConfig) -> dict[str, Any]:
    """`preset_options` of a run's model section."""
    return preset_options(model.kind, model.preset, dataclasses.asdict(model))


@dataclass
class TokenizerConfig:
    name_or_path: str | None = None
    """Reuse this tokenizer (local folder or Hub id) instead of training one."""
    vocab_size: int = bounded(4096, 1, LARGEST_VOCABULARY)
    """Vocabulary size to train (before rounding up)."""
    pad_vocab_to_multiple_of: int = bounded(64, 0, 2**16)
    """Round the model's vocab_size up to a multiple of this (0 disables); faster matmuls."""
    lowercase: bool = True
    """Lowercase and strip accents before WordPiece (BERT-uncased style). Ignored by byte-level BPE."""
    min_frequency: int = bounded(2, low=0)
    """Minimum pair frequency for a merge."""
    max_training_texts: int | None = bounded(None, low=1)
    """Train the tokenizer on at most this many texts (None: the whole training split)."""
    input_sentence_size: int = bounded(50_000, low=0)
    """`python -m pretrain.data prepare` only: train the tokenizer on a seeded sample of at most this many lines of text (SentencePiece's input_sentence_size), read from random places of the corpus, so its time and memory stay bounded however large the corpus is (about 16 MB of book paragraphs at the default; training costs about 0.5 CPU-seconds per MB of sample); 0: every line."""


@dataclass
class DataConfig:
    dataset_name: str | None = None
    """Hub dataset name (e.g. `wikitext`); takes precedence over data_files."""
    dataset_config: str | None = None
    """Hub dataset configuration name (e.g. `wikitext-103-raw-v1`)."""
    dataset_split: str = "train"
    """Split of the Hub dataset to train on."""
    data_files: list[str] = field(default_factory=lambda: ["data/pretrain/*.txt"])
    """Local training files or globs (txt, json/jsonl, csv, parquet); relative paths are taken from the repo root."""
    validation_files: list[str] | None = None
    """Local validation files; when absent, validation_split_percentage of the documents is held out."""
    validation_split_percentage: float = bounded(5.0, 0, 100, high_open=True)  # 100: nothing to train on
    """Percent of documents held out for evaluation when no validation split is given."""
    text_column: str = "text"
    """Column holding the text (json/csv/parquet/Hub datasets)."""
    document_separator: str = "blank_line"
    """How text is split into documents: `blank_line`, `heading` (WikiText ` = Title = ` articles), `line` (one document per line), `file`, or any other string as a literal separator (e.g. `<|endoftext|>`). See pretrain/data/corpus.py."""
    sentence_split: str = "rule"
    """How documents are split into sentences: `rule` (punctuation rule for cased text, see pretrain/data/corpus.py) or `line` (one sentence per line)."""
    max_seq_length: int = bounded(128, 2, LONGEST)  # an encoder needs 8: validate_settings
    """Tokens per training sequence (encoder: [CLS] A [SEP] B [SEP]; decoder: block size)."""
    short_seq_prob: float = bounded(0.1, 0, 1)
    """NSP: probability of a shorter target length (BERT's short_seq_prob)."""
    nsp_probability: float = bounded(0.5, 0, 1)
    """NSP: probability that segment B comes from another document."""
    mlm_probability: float = bounded(
        0.15, 0, 1, low_open=True, high_open=True
    )  # 0 or 1: nothing to learn from
    """Fraction of tokens selected for masked LM (and for the masked rows of a decoder's `clm+mntp`)."""
    mask_replace_prob: float = bounded(0.8, 0, 1)  # with random_replace_prob at most 1: the collator
    """Of the selected tokens, fraction replaced by [MASK]."""
    random_replace_prob: float = bounded(0.1, 0, 1)
    """Of the selected tokens, fraction replaced by a random token (the rest stay unchanged)."""
    causal_share: float = bounded(0.0625, 0, 1)
    """Decoder objective `clm+mntp` only: the share of training rows trained causally, the rest by masked next-token prediction; drawn per row from the run's seed. 0.0625 is GPT-BERT's 1:15 causal-to-masked ratio."""
    whole_word_mask: bool = False
    """Mask all WordPiece pieces of a word together."""
    max_predictions_per_seq: int | None = bounded(None, low=1)
    """Cap on masked positions per sequence (None: no cap)."""
    pad_to_multiple_of: int = bounded(8, 0, 2**16)  # 0 or 1: no padding beyond the longest
    """Pad batches to a multiple of this length."""
    streaming: bool = False
    """Stream the corpus (IterableDataset) instead of loading it into memory."""
    num_proc: int | None = bounded(None, 1, 4096)
    """Processes for datasets.map (None: single process)."""
    max_train_documents: int | None = bounded(None, low=1)
    """Use at most this many training documents (quick experiments)."""
    max_eval_documents: int | None = bounded(None, low=1)
    """Use at most this many validation documents (None: all; streaming: 1000, as the validation set is held in memory)."""
    shuffle_buffer_size: int = bounded(10000, low=1)
    """Streaming: examples in the shuffle buffer of the training stream."""
    cache_dir: str | None = None
    """datasets cache directory (default: the HF datasets cache)."""
    num_workers: int = bounded(0, 0, 4096)
    """DataLoader worker processes."""
    document_masking: bool = True
    """Decoder: a packed block's documents do not see each other; position ids restart after every EOS and a token attends only within its own document (attention kernels `sdpa`, `eager`, `flex_attention`; with others a line at start says the blocks are packed as plain rows). False: one causal stream per block, positions counted across documents."""
    prepared: str | None = None
    """Train from a folder written by `python -m pretrain.data prepare` (tokenizer + tokenized shards, memory-mapped; the corpus is not read or tokenized again). The corpus and tokenizer settings must match its manifest."""


@dataclass
class PretrainEvalConfig:
    blimp: int = bounded(0, low=0)
    """Score BLiMP's minimal pairs zero-shot at every evaluation (encoder: pseudo-log-likelihood, decoder: log-probability; docs/zero-shot.md): the first N pairs of each of its 67 paradigms, logged as eval/blimp, the mean accuracy over paradigms; split across the processes, the same number on any number of them. 0: off. The shipped sample holds 50 per paradigm."""
    blimp_data: str = "data/blimp"
    """Folder of BLiMP's <paradigm>.jsonl files (gzipped or not) for eval.blimp; relative paths are taken from the repo root. The default is the sample shipped with Kiln (the first 50 pairs of each paradigm); `hub` reads the Hub dataset nyu-mll/blimp."""


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    hub: HubConfig = field(default_factory=HubConfig)
    eval: PretrainEvalConfig = field(default_factory=PretrainEvalConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def compared_on_resume(flat: dict[str, Any]) -> dict[str, Any]:
        """A config, saved or new, flattened (`model.hidden_act`, ...), as a resume compares it
        (kiln.resume.setting_changes): the preset-dependent model options by the values the
        model is built with, so a value left unset and the same value given are the same run. Before these
        options defaulted to None, a run's config.yaml held all four (gelu, 0.1, 0.1, 1e-12 when not given)
        and a decoder of another preset than `gpt2` read a value equal to those as not given: a config holding
        all four is read that way, so a folder saved then resumes with the same command."""
        model = {key[len("model.") :]: value for key, value in flat.items() if key.startswith("model.")}
        kind, preset = model.get("kind"), model.get("preset")
        given = {name: model.get(name) for name in _BERT_OPTIONS}
        if None not in given.values() and kind == "decoder" and preset not in (None, "gpt2"):
            given = {name: None if value == _BERT_OPTIONS[name] else value for name, value in given.items()}
        options = preset_options(kind, preset, given)
        resolved = {f"model.{name}": value for name, value in options.items()}
        return {**flat, **{key: value for key, value in resolved.items() if key in flat}}


__all__ = [
    "DEFAULT_PRESETS",
    "PRESET_OPTIONS",
    "DataConfig",
    "ModelConfig",
    "PretrainEvalConfig",
    "RunConfig",
    "TokenizerConfig",
    "model_options",
    "preset_options",
]

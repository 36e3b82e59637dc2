"""Convert transformers BERT / ELECTRA / ModernBERT / GPT-2 / Llama models to Kiln and back: the proof that Kiln
computes the same function.

    from_transformers(BertModel | BertForPreTraining | BertForMaskedLM | BertForNextSentencePrediction
                      | BertForSequenceClassification | BertForMultipleChoice | BertForTokenClassification
                      | BertForQuestionAnswering | ElectraModel | ElectraForPreTraining (discriminator)
                      | ElectraForMaskedLM (generator) | ModernBertModel | ModernBertForMaskedLM
                      | ModernBertForSequenceClassification | ModernBertForTokenClassification
                      | ModernBertForQuestionAnswering | ModernBertForMultipleChoice | GPT2Model | GPT2LMHeadModel
                      | GPT2ForSequenceClassification | GPT2ForTokenClassification | LlamaModel
                      | LlamaForCausalLM | LlamaForSequenceClassification | LlamaForTokenClassification)
                      -> matching Kiln model (Llama: the decoder's `llama` preset)
    to_transformers(Kiln model, family=None) -> matching transformers model (BERT; ELECTRA for the
                      discriminator and for encoders with an embedding projection; ModernBERT for encoders built
                      with the `modernbert` preset's pieces; family="electra" / "modernbert" forces it; a decoder:
                      GPT-2, or Llama for the `llama` preset's pieces)

Layouts differ in three places only: Kiln fuses the query/key/value projections into one `qkv` Linear (BERT's
and Llama's three Linears are concatenated along the output dimension), Llama's gate and up projections into one
`gate_up` Linear, and GPT-2's Conv1D stores weights transposed. ModernBERT's layout is Kiln's own under other names
(`MODERNBERT_NAMES`).

CLI:  python -m pretrain.convert SRC_DIR DST_DIR   (direction from SRC_DIR's config.json `model_type`)

A run started from a transformers BERT / ELECTRA / GPT-2 / Llama folder or Hub id (`--model.init_from`,
`--model.checkpoint`) converts it on the way in: `converted_start` reads its config.json as data, checks it and the
weight file's shapes, converts with the classes above and keeps the Kiln folder in the Hugging Face cache, named by
the source's content, so the next run reuses it once the sha256 of each file written matches its record.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

if (
    __name__ == "__main__"
):  # `python -m pretrain.convert SRC_DIR DST_DIR`: a missing SRC_DIR said before torch loads
    from kiln.model_files import model_source_problem

    _named = [arg for arg in sys.argv[1:] if not arg.startswith("-")]
    if len(_named) == 2 and (_problem := model_source_problem(_named[0], "SRC_DIR")):
        print(f"error: {_problem}", file=sys.stderr)  # a refused input: exit status 2, as argparse's
        sys.exit(2)

import torch
import transformers
from transformers import BertConfig, GPT2Config

from kiln.errors import ConfigError, first_line
from kiln.file_hash import sha256_file
from kiln.model_files import (
    PICKLE_WEIGHT_FILES,
    WEIGHT_FILES,
    carries_code,
    pickle_weight_files,
    read_model_config,
    weight_file_errors,
    weight_files,
)
from pretrain.model_gate import CONVERTIBLE, check_model_folder
from pretrain.modeling import (
    KilnDecoderConfig,
    KilnDecoderForCausalLM,
    KilnDecoderForSequenceClassification,
    KilnDecoderForTokenClassification,
    KilnDecoderModel,
    KilnEncoderConfig,
    KilnEncoderForMaskedLM,
    KilnEncoderForMultipleChoice,
    KilnEncoderForNextSentencePrediction,
    KilnEncoderForPreTraining,
    KilnEncoderForQuestionAnswering,
    KilnEncoderForReplacedTokenDetection,
    KilnEncoderForSequenceClassification,
    KilnEncoderForTokenClassification,
    KilnEncoderModel,
)
from pretrain.modeling.configuration_kiln import ENCODER_PRESETS
from pretrain.modeling.modeling_kiln_encoder import embedding_width

logger = logging.getLogger("kiln")

# transformers class name -> Kiln class; the reverse direction uses the same table
ENCODER_CLASSES = {
    "BertModel": KilnEncoderModel,
    "BertForPreTraining": KilnEncoderForPreTraining,
    "BertForMaskedLM": KilnEncoderForMaskedLM,
    "BertForSequenceClassification": KilnEncoderForSequenceClassification,
    "BertForTokenClassification": KilnEncoderForTokenClassification,
    "BertForNextSentencePrediction": KilnEncoderForNextSentencePrediction,
    "BertForMultipleChoice": KilnEncoderForMultipleChoice,
    "BertForQuestionAnswering": KilnEncoderForQuestionAnswering,
}
DECODER_CLASSES = {
    "GPT2Model": KilnDecoderModel,
    "GPT2LMHeadModel": KilnDecoderForCausalLM,
    "GPT2ForSequenceClassification": KilnDecoderForSequenceClassification,
    "GPT2ForTokenClassification": KilnDecoderForTokenClassification,
}
# ELECTRA's discriminator and generator are BERT-shaped encoders with other heads (and, in the generator, an
# embedding projection); ElectraModel has no pooler
ELECTRA_CLASSES = {
    "ElectraModel": KilnEncoderModel,
    "ElectraForPreTraining": KilnEncoderForReplacedTokenDetection,
    "ElectraForMaskedLM": KilnEncoderForMaskedLM,
}
# ModernBERT: the encoder with the `modernbert` preset's pieces; ModernBertModel has no pooler
MODERNBERT_CLASSES = {
    "ModernBertModel": KilnEncoderModel,
    "ModernBertForMaskedLM": KilnEncoderForMaskedLM,
    "ModernBertForSequenceClassification": KilnEncoderForSequenceClassification,
    "ModernBertForTokenClassification": KilnEncoderForTokenClassification,
    "ModernBertForQuestionAnswering": KilnEncoderForQuestionAnswering,
    "ModernBertForMultipleChoice": KilnEncoderForMultipleChoice,
}
TO_MODERNBERT = {kiln_class: name for name, kiln_class in MODERNBERT_CLASSES.items()}
# the `llama` preset of the decoder (KilnDecoderConfig(preset="llama"))
LLAMA_CLASSES = {
    "LlamaModel": KilnDecoderModel,
    "LlamaForCausalLM": KilnDecoderForCausalLM,
    "LlamaForSequenceClassification": KilnDecoderForSequenceClassification,
    "LlamaForTokenClassification": KilnDecoderForTokenClassification,
}
TO_KILN = {**ENCODER_CLASSES, **ELECTRA_CLASSES, **MODERNBERT_CLASSES, **DECODER_CLASSES, **LLAMA_CLASSES}
TO_TRANSFORMERS = {kiln_class: name for name, kiln_class in {**ENCODER_CLASSES, **DECODER_CLASSES}.items()}
TO_LLAMA = {kiln_class: name for name, kiln_class in LLAMA_CLASSES.items()}
TO_ELECTRA = {kiln_class: name for name, kiln_class in ELECTRA_CLASSES.items()}
TO_TRANSFORMERS[KilnEncoderForReplacedTokenDetection] = "ElectraForPreTraining"

ENCODER_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps",
    "initializer_range",
    "pad_token_id",
    "classifier_dropout",
)
# Kiln decoder field -> GPT-2 field
DECODER_FIELDS = {
    "vocab_size": "vocab_size",
    "max_position_embeddings": "n_positions",
    "hidden_size": "n_embd",
    "num_hidden_layers": "n_layer",
    "num_attention_heads": "n_head",
    "activation_function": "activation_function",
    "resid_pdrop": "resid_pdrop",
    "embd_pdrop": "embd_pdrop",
    "attn_pdrop": "attn_pdrop",
    "layer_norm_epsilon": "layer_norm_epsilon",
    "initializer_range": "initializer_range",
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
    "pad_token_id": "pad_token_id",
    "add_cross_attention": "add_cross_attention",
    "tie_word_embeddings": "tie_word_embeddings",
}
TASK_FIELDS = ("id2label", "label2id", "problem_type")


# ---------------------------------------------------------------------------------------------------- configs
def _task_fields(config) -> dict:
    return {name: getattr(config, name) for name in TASK_FIELDS if getattr(config, name, None) is not None}


def encoder_config_from_bert(config: BertConfig) -> KilnEncoderConfig:
    """The KilnEncoderConfig of a transformers BertConfig: the same shape and task fields (num_labels, id2label,
    ...), learned absolute positions. A BERT decoder or relative position embeddings raise ValueError."""
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        raise ValueError(
            "A BERT decoder (is_decoder / add_cross_attention) has no Kiln equivalent; convert encoders."
        )
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        raise ValueError(
            f"BERT position_embedding_type={config.position_embedding_type!r} is not supported by Kiln."
        )
    if not isinstance(config.hidden_act, str):
        raise ValueError("Only string hidden_act (e.g. 'gelu') can be converted.")
    fields = {name: getattr(config, name) for name in ENCODER_FIELDS}
    return KilnEncoderConfig(position_embedding_type="learned", **fields, **_task_fields(config))


def encoder_config_from_electra(config: transformers.ElectraConfig) -> KilnEncoderConfig:
    """The KilnEncoderConfig of a transformers ElectraConfig: the same shape and task fields; an embedding size
    other than hidden_size is kept (Kiln then projects the embeddings up, as ELECTRA does)."""
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        raise ValueError(
            f"ELECTRA position_embedding_type={config.position_embedding_type!r} is not supported by Kiln."
        )
    if not isinstance(config.hidden_act, str):
        raise ValueError("Only string hidden_act (e.g. 'gelu') can be converted.")
    fields = {name: getattr(config, name) for name in ENCODER_FIELDS}
    embedding_size = config.embedding_size if config.embedding_size != config.hidden_size else None
    return KilnEncoderConfig(
        position_embedding_type="learned", embedding_size=embedding_size, **fields, **_task_fields(config)
    )


def electra_config_from_encoder(config: KilnEncoderConfig) -> transformers.ElectraConfig:
    """The transformers ElectraConfig of a KilnEncoderConfig (the inverse of `encoder_config_from_electra`)."""
    fields = {name: getattr(config, name) for name in ENCODER_FIELDS}
    return transformers.ElectraConfig(
        embedding_size=embedding_width(config), **fields, **_task_fields(config)
    )


# Kiln encoder field -> ModernBERT field, same meaning
MODERNBERT_FIELDS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_hidden_layers": "num_hidden_layers",
    "num_attention_heads": "num_attention_heads",
    "intermediate_size": "intermediate_size",
    "hidden_act": "hidden_activation",
    "attention_probs_dropout_prob": "attention_dropout",
    "max_position_embeddings": "max_position_embeddings",
    "layer_norm_eps": "norm_eps",
    "initializer_range": "initializer_range",
    "pad_token_id": "pad_token_id",
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
    "classifier_dropout": "classifier_dropout",
    "attention_bias": "attention_bias",
    "mlp_bias": "mlp_bias",
    "norm_bias": "norm_bias",
    "classifier_bias": "classifier_bias",
    "decoder_bias": "decoder_bias",
    "classifier_pooling": "classifier_pooling",
    "local_attention": "local_attention",
    "tie_word_embeddings": "tie_word_embeddings",
}
# the pieces a Kiln encoder needs to be a ModernBERT (the rest of the preset is in MODERNBERT_FIELDS)
MODERNBERT_PIECES = {
    "position_embedding_type": "rotary",
    "norm_position": "pre",
    "mlp_type": "glu",
    "classifier_head": "transform",
    "type_vocab_size": 0,
}


def _every_n(layer_types: list[str]) -> int:
    """The `global_attn_every_n_layers` that gives these layer types (global at 0, n, 2n, ...); ValueError if none."""
    full = [i for i, kind in enumerate(layer_types) if kind == "full_attention"]
    every = full[1] if len(full) > 1 else max(len(layer_types), 1)
    expected = ["sliding_attention" if i % every else "full_attention" for i in range(len(layer_types))]
    if not full or full[0] != 0 or expected != list(layer_types):
        raise ValueError(
            f"ModernBERT layer_types {layer_types} are not 'global every n layers from the first'; Kiln's encoder "
            "has that pattern only (global_attn_every_n_layers)."
        )
    return every


def encoder_config_from_modernbert(config: transformers.ModernBertConfig) -> KilnEncoderConfig:
    """The KilnEncoderConfig of a transformers ModernBertConfig: the `modernbert` preset with its shape, biases,
    window, rotary thetas and task fields. RoPE scaling, a head size other than hidden / heads and layer patterns
    other than 'global every n layers' raise ValueError."""
    thetas = {}
    for kind in ("full_attention", "sliding_attention"):
        rope = (config.rope_parameters or {}).get(kind) or {}
        if rope.get("rope_type", "default") != "default":
            raise ValueError(
                f"ModernBERT rope_type={rope['rope_type']!r} is not supported by Kiln; only 'default'."
            )
        thetas[kind] = rope.get("rope_theta")
    head_dim = getattr(config, "head_dim", None)
    if head_dim and head_dim != config.hidden_size // config.num_attention_heads:
        raise ValueError(
            f"ModernBERT head_dim={head_dim} differs from hidden_size / heads; Kiln cannot hold it."
        )
    if not isinstance(config.hidden_activation, str) or not isinstance(config.classifier_activation, str):
        raise ValueError("Only string activations (e.g. 'gelu') can be converted.")
    fields = {kiln: getattr(config, theirs) for kiln, theirs in MODERNBERT_FIELDS.items()}
    return KilnEncoderConfig(
        preset="modernbert",
        **{name: value for name, value in MODERNBERT_PIECES.items()},
        **fields,
        hidden_dropout_prob=config.mlp_dropout,
        classifier_activation=config.classifier_activation,
        global_attn_every_n_layers=_every_n(config.layer_types),
        rope_theta=thetas["full_attention"] or 160_000.0,
        local_rope_theta=thetas["sliding_attention"] or 10_000.0,
        sparse_prediction=config.sparse_prediction,
        cls_token_id=config.cls_token_id,
        sep_token_id=config.sep_token_id,
        **_task_fields(config),
    )


def modernbert_shaped(config) -> bool:
    """A Kiln encoder built with any of the `modernbert` preset's pieces (not BERT's block)."""
    if not isinstance(config, KilnEncoderConfig):
        return False
    bert = {**ENCODER_PRESETS["bert"], "position_embedding_type": config.position_embedding_type}
    return config.position_embedding_type == "rotary" or any(getattr(config, k) != v for k, v in bert.items())


def modernbert_config_from_encoder(config: KilnEncoderConfig) -> transformers.ModernBertConfig:
    """The transformers ModernBertConfig of a KilnEncoderConfig (the inverse of `encoder_config_from_modernbert`);
    an encoder without every ModernBERT piece (or with embeddings of another width) raises ValueError."""
    wrong = {
        name: getattr(config, name)
        for name, value in MODERNBERT_PIECES.items()
        if getattr(config, name) != value
    }
    if wrong or embedding_width(config) != config.hidden_size:
        details = ", ".join(f"{name}={value!r}" for name, value in wrong.items()) or "embedding_size"
        raise ValueError(
            f"This encoder has no ModernBERT equivalent ({details}); ModernBERT needs "
            f"{', '.join(f'{name}={value!r}' for name, value in MODERNBERT_PIECES.items())} and no embedding_size."
        )
    fields = {theirs: getattr(config, kiln, None) for kiln, theirs in MODERNBERT_FIELDS.items()}
    if config.classifier_dropout is None:  # Kiln's None: the hidden dropout
        fields["classifier_dropout"] = config.hidden_dropout_prob
    return transformers.ModernBertConfig(
        **fields,
        embedding_dropout=config.hidden_dropout_prob,
        mlp_dropout=config.hidden_dropout_prob,
        classifier_activation=config.classifier_activation or config.hidden_act,
        layer_types=list(config.layer_types),
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": config.rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": config.local_rope_theta},
        },
        sparse_prediction=config.sparse_prediction,
        cls_token_id=getattr(config, "cls_token_id", None),
        sep_token_id=getattr(config, "sep_token_id", None),
        **_task_fields(config),
    )


def bert_config_from_encoder(config: KilnEncoderConfig) -> BertConfig:
    """The transformers BertConfig of a KilnEncoderConfig (the inverse of `encoder_config_from_bert`); a
    sinusoidal position table becomes BERT's learned table, initialised to it by the weight conversion."""
    # A sinusoidal table becomes BERT's learned table (initialised to it): same function
    fields = {name: getattr(config, name) for name in ENCODER_FIELDS}
    return BertConfig(**fields, **_task_fields(config))


def decoder_config_from_gpt2(config: GPT2Config) -> KilnDecoderConfig:
    """The KilnDecoderConfig of a transformers GPT2Config (n_embd -> hidden_size, n_inner -> intermediate_size,
    ...); attention scalings GPT-2 offers beyond its default raise ValueError."""
    if not config.scale_attn_weights or config.scale_attn_by_inverse_layer_idx:
        raise ValueError(
            "GPT-2 configs with scale_attn_weights=False or scale_attn_by_inverse_layer_idx=True "
            "are not supported."
        )
    fields = {kiln: getattr(config, gpt2) for kiln, gpt2 in DECODER_FIELDS.items()}
    inner = config.n_inner if config.n_inner is not None else 4 * config.n_embd
    return KilnDecoderConfig(intermediate_size=inner, **fields, **_task_fields(config))


def gpt2_config_from_decoder(config: KilnDecoderConfig) -> GPT2Config:
    """The transformers GPT2Config of a KilnDecoderConfig (the inverse of `decoder_config_from_gpt2`)."""
    fields = {gpt2: getattr(config, kiln) for kiln, gpt2 in DECODER_FIELDS.items()}
    inner = None if config.intermediate_size == 4 * config.hidden_size else config.intermediate_size
    return GPT2Config(n_inner=inner, **fields, **_task_fields(config))


# Kiln decoder field -> Llama field (besides rope_parameters and head_dim, set from them)
LLAMA_FIELDS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "intermediate_size": "intermediate_size",
    "num_hidden_layers": "num_hidden_layers",
    "num_attention_heads": "num_attention_heads",
    "num_key_value_heads": "num_key_value_heads",
    "activation_function": "hidden_act",
    "max_position_embeddings": "max_position_embeddings",
    "initializer_range": "initializer_range",
    "layer_norm_epsilon": "rms_norm_eps",
    "attention_bias": "attention_bias",
    "mlp_bias": "mlp_bias",
    "attn_pdrop": "attention_dropout",
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
    "pad_token_id": "pad_token_id",
    "tie_word_embeddings": "tie_word_embeddings",
    "use_cache": "use_cache",
}
# the pieces that make a Kiln decoder Llama's (attention/MLP biases and grouped-query attention map as they are)
LLAMA_PIECES = {
    "position_embedding_type": "rotary",
    "norm_type": "rmsnorm",
    "mlp_type": "glu",
    "qk_norm": False,
}
GPT2_PIECES = {
    "position_embedding_type": "learned",
    "norm_type": "layernorm",
    "mlp_type": "mlp",
    "qk_norm": False,
    "attention_bias": True,
    "mlp_bias": True,
}


def decoder_config_from_llama(config: transformers.LlamaConfig) -> KilnDecoderConfig:
    """The KilnDecoderConfig (preset `llama`) of a transformers LlamaConfig; what Kiln's decoder does not compute
    (rope scaling other than the default, a head_dim other than hidden_size / heads) raises ValueError."""
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default":
        raise ValueError(
            f"Llama rope_type={rope['rope_type']!r} is not supported by Kiln (only the default rotary "
            "embedding); convert a model without rope scaling."
        )
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim * config.num_attention_heads != config.hidden_size:
        raise ValueError(
            f"Llama head_dim={head_dim} x {config.num_attention_heads} heads != hidden_size={config.hidden_size}; "
            "Kiln's decoder needs head_dim = hidden_size / num_attention_heads."
        )
    if not isinstance(config.hidden_act, str):
        raise ValueError("Only string hidden_act (e.g. 'silu') can be converted.")
    fields = {kiln: getattr(config, llama) for kiln, llama in LLAMA_FIELDS.items()}
    return KilnDecoderConfig(
        preset="llama",
        rope_theta=float(rope.get("rope_theta", 10000.0)),
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        **fields,
        **_task_fields(config),
    )


def llama_config_from_decoder(config: KilnDecoderConfig) -> transformers.LlamaConfig:
    """The transformers LlamaConfig of a Llama-shaped KilnDecoderConfig (the inverse of
    `decoder_config_from_llama`)."""
    fields = {llama: getattr(config, kiln) for kiln, llama in LLAMA_FIELDS.items()}
    fields["num_key_value_heads"] = config.num_key_value_heads or config.num_attention_heads
    return transformers.LlamaConfig(
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        head_dim=config.hidden_size // config.num_attention_heads,
        **fields,
        **_task_fields(config),
    )


def decoder_family(config: KilnDecoderConfig) -> str:
    """`gpt2` or `llama`: the transformers family a Kiln decoder's pieces convert to; ValueError naming what
    differs when neither holds them."""
    if all(getattr(config, name) == value for name, value in GPT2_PIECES.items()) and (
        config.num_key_value_heads in (None, config.num_attention_heads)
    ):
        return "gpt2"
    if all(getattr(config, name) == value for name, value in LLAMA_PIECES.items()):
        if getattr(config, "add_cross_attention", False):
            raise ValueError("Llama has no cross-attention; a llama-preset decoder with it does not convert.")
        return "llama"
    differs = {
        name: getattr(config, name) for name, value in LLAMA_PIECES.items() if getattr(config, name) != value
    }
    raise ValueError(
        f"This decoder mixes GPT-2's and Llama's pieces ({', '.join(f'{k}={v!r}' for k, v in differs.items())} "
        "differ from Llama's); transformers has no class computing it. Build it with preset='llama' or 'gpt2' "
        "as they are to convert."
    )


# ------------------------------------------------------------------------------------------------ state dicts
def _prefixes(name: str) -> tuple[str, str]:
    """(transformers, Kiln) prefix of the base model's keys; bare models have none."""
    if name in ("BertModel", "ElectraModel", "GPT2Model", "LlamaModel"):
        return "", ""
    family = next(prefix for family, prefix in FAMILY_PREFIXES.items() if name.startswith(family))
    return family, "model."


FAMILY_PREFIXES = {"Bert": "bert.", "Electra": "electra.", "GPT2": "transformer.", "Llama": "model."}
# ELECTRA head and projection names -> Kiln's (both directions; the encoder blocks are named as in BERT)
ELECTRA_HEADS = {
    "discriminator_predictions.dense.": "discriminator_head.dense.",
    "discriminator_predictions.dense_prediction.": "discriminator_head.dense_prediction.",
    "generator_predictions.dense.": "mlm_head.dense.",
    "generator_predictions.LayerNorm.": "mlm_head.layer_norm.",
    "generator_lm_head.": "mlm_head.decoder.",
}


# ModernBERT key fragment -> Kiln's: the base model (under `model.` in both, except the bare models) ...
MODERNBERT_NAMES = (
    (".embeddings.tok_embeddings.", ".embeddings.word_embeddings."),
    (".embeddings.norm.", ".embeddings.layer_norm."),
    (".attn_norm.", ".attention_norm."),
    (".attn.Wqkv.", ".attention.qkv."),
    (".attn.Wo.", ".attention.out."),
    (".mlp.Wi.", ".mlp.gate_up."),
    (".mlp.Wo.", ".mlp.fc_out."),
)
# ... and each head's (ModernBERT's `head` transform sits in Kiln's pooler for the sequence heads)
MODERNBERT_HEADS = {
    "ModernBertModel": (),
    "ModernBertForMaskedLM": (
        ("decoder.", "mlm_head.decoder."),
        ("head.norm.", "mlm_head.layer_norm."),
        ("head.", "mlm_head."),
    ),
    "ModernBertForSequenceClassification": (
        ("head.norm.", "model.pooler.layer_norm."),
        ("head.", "model.pooler."),
    ),
    "ModernBertForMultipleChoice": (("head.norm.", "model.pooler.layer_norm."), ("head.", "model.pooler.")),
    "ModernBertForTokenClassification": (("head.norm.", "head.layer_norm."),),
    "ModernBertForQuestionAnswering": (("head.norm.", "head.layer_norm."), ("classifier.", "qa_outputs.")),
}


def _rename(key: str, name: str, reverse: bool) -> str:
    """One key in the other layout: its head prefix (MODERNBERT_HEADS, anchored at the start), then the first
    base-model fragment (MODERNBERT_NAMES) found in it."""
    for theirs, ours in MODERNBERT_HEADS[name]:
        old, new = (ours, theirs) if reverse else (theirs, ours)
        if key.startswith(old):
            key = new + key[len(old) :]
            break
    dotted = "." + key
    for theirs, ours in MODERNBERT_NAMES:
        old, new = (ours, theirs) if reverse else (theirs, ours)
        if old in dotted:
            return dotted.replace(old, new, 1)[1:]
    return key


def modernbert_to_kiln_state(state: dict, name: str) -> dict:
    """ModernBERT's state dict under Kiln's names (the same tensors: the layouts are the same)."""
    return {_rename(key, name, reverse=False): value for key, value in state.items()}


def kiln_to_modernbert_state(state: dict, name: str) -> dict:
    """The inverse of `modernbert_to_kiln_state`."""
    return {_rename(key, name, reverse=True): value for key, value in state.items()}


def electra_to_kiln_state(electra: dict, num_layers: int, name: str) -> dict:
    b, k = _prefixes(name)
    out = bert_to_kiln_state(electra, num_layers, name)
    for p in ("weight", "bias"):
        if f"{b}embeddings_project.{p}" in electra:
            out[f"{k}embeddings_project.{p}"] = electra[f"{b}embeddings_project.{p}"]
        for theirs, ours in ELECTRA_HEADS.items():
            if f"{theirs}{p}" in electra:
                out[f"{ours}{p}"] = electra[f"{theirs}{p}"]
    return out


def kiln_to_electra_state(kiln: dict, num_layers: int, name: str) -> dict:
    b, k = _prefixes(name)
    out = kiln_to_bert_state(kiln, num_layers, name, position_table=None)
    for key in [key for key in out if key.startswith("cls.")]:  # BERT's MLM head names: ELECTRA's come below
        del out[key]
    for p in ("weight", "bias"):
        if f"{k}embeddings_project.{p}" in kiln:
            out[f"{b}embeddings_project.{p}"] = kiln[f"{k}embeddings_project.{p}"]
        for theirs, ours in ELECTRA_HEADS.items():
            if f"{ours}{p}" in kiln:
                out[f"{theirs}{p}"] = kiln[f"{ours}{p}"]
    return out


def bert_to_kiln_state(bert: dict, num_layers: int, name: str) -> dict:
    b, k = _prefixes(name)
    out = {}
    for part in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        out[f"{k}embeddings.{part}.weight"] = bert[f"{b}embeddings.{part}.weight"]
    for p in ("weight", "bias"):
        out[f"{k}embeddings.layer_norm.{p}"] = bert[f"{b}embeddings.LayerNorm.{p}"]
    for i in range(num_layers):
        src, dst = f"{b}encoder.layer.{i}.", f"{k}layers.{i}."
        for p in ("weight", "bias"):
            out[f"{dst}attention.qkv.{p}"] = torch.cat(
                [bert[f"{src}attention.self.{proj}.{p}"] for proj in ("query", "key", "value")]
            )
            out[f"{dst}attention.out.{p}"] = bert[f"{src}attention.output.dense.{p}"]
            out[f"{dst}attention_norm.{p}"] = bert[f"{src}attention.output.LayerNorm.{p}"]
            out[f"{dst}mlp.fc_in.{p}"] = bert[f"{src}intermediate.dense.{p}"]
            out[f"{dst}mlp.fc_out.{p}"] = bert[f"{src}output.dense.{p}"]
            out[f"{dst}mlp_norm.{p}"] = bert[f"{src}output.LayerNorm.{p}"]
    for p in ("weight", "bias"):
        if f"{b}pooler.dense.{p}" in bert:
            out[f"{k}pooler.dense.{p}"] = bert[f"{b}pooler.dense.{p}"]
        if f"cls.predictions.transform.dense.{p}" in bert:
            out[f"mlm_head.dense.{p}"] = bert[f"cls.predictions.transform.dense.{p}"]
            out[f"mlm_head.layer_norm.{p}"] = bert[f"cls.predictions.transform.LayerNorm.{p}"]
        if f"cls.seq_relationship.{p}" in bert:
            out[f"nsp_head.{p}"] = bert[f"cls.seq_relationship.{p}"]
        for head in ("classifier", "qa_outputs"):  # same names in both
            if f"{head}.{p}" in bert:
                out[f"{head}.{p}"] = bert[f"{head}.{p}"]
    if "cls.predictions.bias" in bert:
        out["mlm_head.decoder.weight"] = out[f"{k}embeddings.word_embeddings.weight"]  # tied
        out["mlm_head.decoder.bias"] = bert["cls.predictions.bias"]
    return out


def kiln_to_bert_state(kiln: dict, num_layers: int, name: str, position_table: torch.Tensor | None) -> dict:
    b, k = _prefixes(name)
    out = {}
    for part in ("word_embeddings", "token_type_embeddings"):
        out[f"{b}embeddings.{part}.weight"] = kiln[f"{k}embeddings.{part}.weight"]
    out[f"{b}embeddings.position_embeddings.weight"] = (
        kiln[f"{k}embeddings.position_embeddings.weight"] if position_table is None else position_table
    )
    for p in ("weight", "bias"):
        out[f"{b}embeddings.LayerNorm.{p}"] = kiln[f"{k}embeddings.layer_norm.{p}"]
    for i in range(num_layers):
        src, dst = f"{k}layers.{i}.", f"{b}encoder.layer.{i}."
        for p in ("weight", "bias"):
            query, key, value = kiln[f"{src}attention.qkv.{p}"].chunk(3)
            out[f"{dst}attention.self.query.{p}"] = query
            out[f"{dst}attention.self.key.{p}"] = key
            out[f"{dst}attention.self.value.{p}"] = value
            out[f"{dst}attention.output.dense.{p}"] = kiln[f"{src}attention.out.{p}"]
            out[f"{dst}attention.output.LayerNorm.{p}"] = kiln[f"{src}attention_norm.{p}"]
            out[f"{dst}intermediate.dense.{p}"] = kiln[f"{src}mlp.fc_in.{p}"]
            out[f"{dst}output.dense.{p}"] = kiln[f"{src}mlp.fc_out.{p}"]
            out[f"{dst}output.LayerNorm.{p}"] = kiln[f"{src}mlp_norm.{p}"]
    for p in ("weight", "bias"):
        if f"{k}pooler.dense.{p}" in kiln:
            out[f"{b}pooler.dense.{p}"] = kiln[f"{k}pooler.dense.{p}"]
        if f"mlm_head.dense.{p}" in kiln:
            out[f"cls.predictions.transform.dense.{p}"] = kiln[f"mlm_head.dense.{p}"]
            out[f"cls.predictions.transform.LayerNorm.{p}"] = kiln[f"mlm_head.layer_norm.{p}"]
        if f"nsp_head.{p}" in kiln:
            out[f"cls.seq_relationship.{p}"] = kiln[f"nsp_head.{p}"]
        for head in ("classifier", "qa_outputs"):
            if f"{head}.{p}" in kiln:
                out[f"{head}.{p}"] = kiln[f"{head}.{p}"]
    if "mlm_head.decoder.bias" in kiln:
        out["cls.predictions.bias"] = kiln["mlm_head.decoder.bias"]
        out["cls.predictions.decoder.bias"] = kiln["mlm_head.decoder.bias"]  # tied to cls.predictions.bias
        out["cls.predictions.decoder.weight"] = out[f"{b}embeddings.word_embeddings.weight"]  # tied
    return out


def gpt2_to_kiln_state(gpt2: dict, num_layers: int, name: str) -> dict:
    g, k = _prefixes(name)
    out = {
        f"{k}word_embeddings.weight": gpt2[f"{g}wte.weight"],
        f"{k}position_embeddings.weight": gpt2[f"{g}wpe.weight"],
    }
    conv = {  # Conv1D weights are (in, out): transpose to Linear's (out, in)
        "attn.c_attn": "attention.qkv",
        "attn.c_proj": "attention.out",
        "crossattention.q_attn": "cross_attention.q",
        "crossattention.c_attn": "cross_attention.kv",
        "crossattention.c_proj": "cross_attention.out",
        "mlp.c_fc": "mlp.fc_in",
        "mlp.c_proj": "mlp.fc_out",
    }
    norms = {"ln_1": "attention_norm", "ln_cross_attn": "cross_attention_norm", "ln_2": "mlp_norm"}
    for i in range(num_layers):
        src, dst = f"{g}h.{i}.", f"{k}layers.{i}."
        for theirs, ours in conv.items():
            if f"{src}{theirs}.weight" in gpt2:
                out[f"{dst}{ours}.weight"] = gpt2[f"{src}{theirs}.weight"].t().contiguous()
                out[f"{dst}{ours}.bias"] = gpt2[f"{src}{theirs}.bias"]
        for theirs, ours in norms.items():
            for p in ("weight", "bias"):
                if f"{src}{theirs}.{p}" in gpt2:
                    out[f"{dst}{ours}.{p}"] = gpt2[f"{src}{theirs}.{p}"]
    for p in ("weight", "bias"):
        out[f"{k}final_norm.{p}"] = gpt2[f"{g}ln_f.{p}"]
    for head in ("lm_head.weight", "score.weight", "classifier.weight", "classifier.bias"):  # same names
        if head in gpt2:
            out[head] = gpt2[head]
    return out


def kiln_to_gpt2_state(kiln: dict, num_layers: int, name: str) -> dict:
    g, k = _prefixes(name)
    out = {
        f"{g}wte.weight": kiln[f"{k}word_embeddings.weight"],
        f"{g}wpe.weight": kiln[f"{k}position_embeddings.weight"],
    }
    linear = {
        "attention.qkv": "attn.c_attn",
        "attention.out": "attn.c_proj",
        "cross_attention.q": "crossattention.q_attn",
        "cross_attention.kv": "crossattention.c_attn",
        "cross_attention.out": "crossattention.c_proj",
        "mlp.fc_in": "mlp.c_fc",
        "mlp.fc_out": "mlp.c_proj",
    }
    norms = {"attention_norm": "ln_1", "cross_attention_norm": "ln_cross_attn", "mlp_norm": "ln_2"}
    for i in range(num_layers):
        src, dst = f"{k}layers.{i}.", f"{g}h.{i}."
        for ours, theirs in linear.items():
            if f"{src}{ours}.weight" in kiln:
                out[f"{dst}{theirs}.weight"] = kiln[f"{src}{ours}.weight"].t().contiguous()
                out[f"{dst}{theirs}.bias"] = kiln[f"{src}{ours}.bias"]
        for ours, theirs in norms.items():
            for p in ("weight", "bias"):
                if f"{src}{ours}.{p}" in kiln:
                    out[f"{dst}{theirs}.{p}"] = kiln[f"{src}{ours}.{p}"]
    for p in ("weight", "bias"):
        out[f"{g}ln_f.{p}"] = kiln[f"{k}final_norm.{p}"]
    for head in ("lm_head.weight", "score.weight", "classifier.weight", "classifier.bias"):
        if head in kiln:
            out[head] = kiln[head]
    return out


LLAMA_HEADS = {"lm_head.weight": "lm_head.weight", "score.weight": "score.weight"}  # Llama name -> Kiln name
LLAMA_TOKEN_HEAD = {
    "score.weight": "classifier.weight",
    "score.bias": "classifier.bias",
}  # token classification


def llama_to_kiln_state(llama: dict, num_layers: int, name: str) -> dict:
    """Llama's separate q/k/v and gate/up projections become Kiln's fused `qkv` and `gate_up` (concatenated
    along the output dimension, in that order)."""
    m, k = _prefixes(name)
    out = {
        f"{k}word_embeddings.weight": llama[f"{m}embed_tokens.weight"],
        f"{k}final_norm.weight": llama[f"{m}norm.weight"],
    }
    for i in range(num_layers):
        src, dst = f"{m}layers.{i}.", f"{k}layers.{i}."
        for p in ("weight", "bias"):
            if f"{src}self_attn.q_proj.{p}" in llama:
                out[f"{dst}attention.qkv.{p}"] = torch.cat(
                    [llama[f"{src}self_attn.{proj}_proj.{p}"] for proj in ("q", "k", "v")]
                )
            if f"{src}self_attn.o_proj.{p}" in llama:
                out[f"{dst}attention.out.{p}"] = llama[f"{src}self_attn.o_proj.{p}"]
            if f"{src}mlp.gate_proj.{p}" in llama:
                out[f"{dst}mlp.gate_up.{p}"] = torch.cat(
                    [llama[f"{src}mlp.{proj}_proj.{p}"] for proj in ("gate", "up")]
                )
                out[f"{dst}mlp.fc_out.{p}"] = llama[f"{src}mlp.down_proj.{p}"]
        out[f"{dst}attention_norm.weight"] = llama[f"{src}input_layernorm.weight"]
        out[f"{dst}mlp_norm.weight"] = llama[f"{src}post_attention_layernorm.weight"]
    heads = LLAMA_TOKEN_HEAD if name == "LlamaForTokenClassification" else LLAMA_HEADS
    out.update({ours: llama[theirs] for theirs, ours in heads.items() if theirs in llama})
    return out


def kiln_to_llama_state(kiln: dict, config: KilnDecoderConfig, name: str) -> dict:
    """The inverse of `llama_to_kiln_state`: the fused projections split back into Llama's."""
    m, k = _prefixes(name)
    out = {
        f"{m}embed_tokens.weight": kiln[f"{k}word_embeddings.weight"],
        f"{m}norm.weight": kiln[f"{k}final_norm.weight"],
    }
    head_size = config.hidden_size // config.num_attention_heads
    key_value_heads = config.num_key_value_heads or config.num_attention_heads
    qkv_sizes = [config.num_attention_heads * head_size] + [key_value_heads * head_size] * 2
    for i in range(config.num_hidden_layers):
        src, dst = f"{k}layers.{i}.", f"{m}layers.{i}."
        for p in ("weight", "bias"):
            if f"{src}attention.qkv.{p}" in kiln:
                for proj, part in zip(("q", "k", "v"), kiln[f"{src}attention.qkv.{p}"].split(qkv_sizes)):
                    out[f"{dst}self_attn.{proj}_proj.{p}"] = part
                out[f"{dst}self_attn.o_proj.{p}"] = kiln[f"{src}attention.out.{p}"]
            if f"{src}mlp.gate_up.{p}" in kiln:
                gate, up = kiln[f"{src}mlp.gate_up.{p}"].chunk(2)
                out[f"{dst}mlp.gate_proj.{p}"], out[f"{dst}mlp.up_proj.{p}"] = gate, up
                out[f"{dst}mlp.down_proj.{p}"] = kiln[f"{src}mlp.fc_out.{p}"]
        out[f"{dst}input_layernorm.weight"] = kiln[f"{src}attention_norm.weight"]
        out[f"{dst}post_attention_layernorm.weight"] = kiln[f"{src}mlp_norm.weight"]
    heads = LLAMA_TOKEN_HEAD if name == "LlamaForTokenClassification" else LLAMA_HEADS
    out.update({theirs: kiln[ours] for theirs, ours in heads.items() if ours in kiln})
    return out


# ----------------------------------------------------------------------------------------------------- models
def _build(model_class, config, state: dict, like: torch.nn.Module, **init_kwargs):
    """Instantiate, load `state` strictly, match `like`'s attention kernel, device, dtype, train/eval mode."""
    model = model_class(config, **init_kwargs)
    model.load_state_dict(state, strict=True)
    model.config._attn_implementation = like.config._attn_implementation
    reference = next(like.parameters())
    return model.to(device=reference.device, dtype=reference.dtype).train(like.training)


def _pooling_kwargs(name: str, model: torch.nn.Module) -> dict:
    if name == "ModernBertModel":
        return {"add_pooling_layer": False}
    return {"add_pooling_layer": model.pooler is not None} if name == "BertModel" else {}


def from_transformers(model: torch.nn.Module) -> torch.nn.Module:
    """A transformers BERT / GPT-2 model -> the matching Kiln model, same weights (config converted too)."""
    name = type(model).__name__
    if name not in TO_KILN:
        raise ValueError(f"Cannot convert {name}; supported: {', '.join(TO_KILN)}.")
    state = {key: value.detach() for key, value in model.state_dict().items()}
    if name in ENCODER_CLASSES:
        config = encoder_config_from_bert(model.config)
        kiln_state = bert_to_kiln_state(state, config.num_hidden_layers, name)
    elif name in MODERNBERT_CLASSES:
        config = encoder_config_from_modernbert(model.config)
        kiln_state = modernbert_to_kiln_state(state, name)
    elif name in ELECTRA_CLASSES:
        config = encoder_config_from_electra(model.config)
        if name == "ElectraForMaskedLM" and config.hidden_act != "gelu":
            raise ValueError(
                f"ElectraForMaskedLM's head always uses gelu, but this model's hidden_act is {config.hidden_act!r}; "
                "Kiln's MLM head uses hidden_act, so the converted generator would compute another function."
            )
        kiln_state = electra_to_kiln_state(state, config.num_hidden_layers, name)
        if name == "ElectraModel":
            return _build(KilnEncoderModel, config, kiln_state, model, add_pooling_layer=False)
    elif name in LLAMA_CLASSES:
        config = decoder_config_from_llama(model.config)
        kiln_state = llama_to_kiln_state(state, config.num_hidden_layers, name)
    else:
        config = decoder_config_from_gpt2(model.config)
        kiln_state = gpt2_to_kiln_state(state, config.num_hidden_layers, name)
    return _build(TO_KILN[name], config, kiln_state, model, **_pooling_kwargs(name, model))


def electra_shaped(model: torch.nn.Module) -> bool:
    """A Kiln encoder only ELECTRA's classes can hold: the discriminator, or embeddings of their own width."""
    config = model.config
    return isinstance(model, KilnEncoderForReplacedTokenDetection) or (
        isinstance(config, KilnEncoderConfig) and embedding_width(config) != config.hidden_size
    )


def to_transformers(model: torch.nn.Module, family: str | None = None) -> torch.nn.Module:
    """A Kiln model -> the matching transformers BERT / ELECTRA / ModernBERT / GPT-2 / Llama model, same weights
    (config converted too). `family`: "bert", "electra" or "modernbert" for an encoder (None: ModernBERT for the
    `modernbert` preset's pieces, ELECTRA where only ELECTRA fits, else BERT); a decoder converts to Llama when it
    has the `llama` preset's pieces, else to GPT-2."""
    if family not in (None, "bert", "electra", "modernbert"):
        raise ValueError(f"family={family!r}: use 'bert', 'electra' or 'modernbert'.")
    if family == "modernbert" or (family is None and modernbert_shaped(model.config)):
        return _to_modernbert(model)
    if family == "electra" or (family is None and electra_shaped(model)):
        return _to_electra(model)
    if modernbert_shaped(model.config):
        raise ValueError(
            f"{type(model).__name__} has the modernbert preset's pieces and no BERT equivalent; convert it to "
            "ModernBERT (family='modernbert')."
        )
    if electra_shaped(model):
        raise ValueError(
            f"{type(model).__name__} with these shapes has no BERT equivalent; convert it to ELECTRA."
        )
    if isinstance(model.config, KilnDecoderConfig) and type(model) in TO_LLAMA:
        if decoder_family(model.config) == "llama":
            name = TO_LLAMA[type(model)]
            state = {key: value.detach() for key, value in model.state_dict().items()}
            llama_state = kiln_to_llama_state(state, model.config, name)
            return _build(
                getattr(transformers, name), llama_config_from_decoder(model.config), llama_state, model
            )
    if type(model) not in TO_TRANSFORMERS:
        supported = ", ".join(kiln_class.__name__ for kiln_class in TO_TRANSFORMERS)
        raise ValueError(f"Cannot convert {type(model).__name__}; supported: {supported}.")
    name = TO_TRANSFORMERS[type(model)]
    state = {key: value.detach() for key, value in model.state_dict().items()}
    if name in ENCODER_CLASSES:
        config = bert_config_from_encoder(model.config)
        embeddings = model.embeddings if name == "BertModel" else model.model.embeddings
        table = getattr(embeddings.position_embeddings, "table", None)  # sinusoidal: BERT's learned table
        hf_state = kiln_to_bert_state(state, config.num_hidden_layers, name, table)
    else:
        config = gpt2_config_from_decoder(model.config)
        hf_state = kiln_to_gpt2_state(state, config.num_hidden_layers, name)
    return _build(getattr(transformers, name), config, hf_state, model, **_pooling_kwargs(name, model))


def _to_modernbert(model: torch.nn.Module) -> torch.nn.Module:
    if type(model) not in TO_MODERNBERT:
        supported = ", ".join(kiln_class.__name__ for kiln_class in TO_MODERNBERT)
        raise ValueError(f"Cannot convert {type(model).__name__} to ModernBERT; supported: {supported}.")
    name = TO_MODERNBERT[type(model)]
    if name == "ModernBertModel" and model.pooler is not None:
        raise ValueError(
            "ModernBertModel has no pooler; convert a KilnEncoderModel built with add_pooling_layer=False."
        )
    config = modernbert_config_from_encoder(model.config)
    state = {key: value.detach() for key, value in model.state_dict().items()}
    return _build(getattr(transformers, name), config, kiln_to_modernbert_state(state, name), model)


def _to_electra(model: torch.nn.Module) -> torch.nn.Module:
    if type(model) not in TO_ELECTRA:
        supported = ", ".join(kiln_class.__name__ for kiln_class in TO_ELECTRA)
        raise ValueError(f"Cannot convert {type(model).__name__} to ELECTRA; supported: {supported}.")
    name = TO_ELECTRA[type(model)]
    config = model.config
    if getattr(model, "pooler", None) is not None:
        raise ValueError(
            "ElectraModel has no pooler; convert a KilnEncoderModel built with add_pooling_layer=False."
        )
    if config.position_embedding_type != "learned":
        raise ValueError(
            "ELECTRA has learned positions only; convert a model with position_embedding_type=learned."
        )
    if name == "ElectraForMaskedLM" and config.hidden_act != "gelu":
        raise ValueError(
            f"ElectraForMaskedLM's head always uses gelu, but this model's hidden_act is {config.hidden_act!r}."
        )
    state = {key: value.detach() for key, value in model.state_dict().items()}
    electra_state = kiln_to_electra_state(state, config.num_hidden_layers, name)
    return _build(getattr(transformers, name), electra_config_from_encoder(config), electra_state, model)


# -------------------------------------------------------------------------------------------------------- CLI
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
)


# the one-line fix of convert's refusal of weights in torch's pickle format (the model gate's)
PICKLE_FIX = "pass --trust_pickles to read them (only for a file you trust)"
# a Hub repo's pickled weights, downloaded only with --trust_pickles
PICKLE_PATTERNS = (*PICKLE_WEIGHT_FILES, "pytorch_model-*-of-*.bin")


class _Stages:
    """A progress bar over a conversion's stages (check, load, convert, write), each named as it starts, on a
    terminal only (in a log or a pipe: nothing). Downloading and loading draw their own bars inside theirs
    (huggingface_hub's, transformers'); writing the converted folder and its checksums has none of its own."""

    NAMES = ("check", "load", "convert", "write")

    def __init__(self):
        self.bar = None
        if sys.stderr.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=len(self.NAMES), desc="convert", unit="stage", dynamic_ncols=True, leave=False
            )
        self.done = 0

    def start(self, name: str) -> None:
        if self.bar is None:
            return
        self.bar.update(self.NAMES.index(name) - self.done)
        self.done = self.NAMES.index(name)
        self.bar.set_postfix_str(name)

    def close(self, finished: bool = True) -> None:
        if self.bar is not None:
            if finished:
                self.bar.update(len(self.NAMES) - self.done)
                self.bar.refresh()  # drawn whole once, however fast the last stage was
            self.bar.close()


def convert_checkpoint(src: str | Path, dst: str | Path, trust_pickles: bool = False) -> torch.nn.Module:
    """Load SRC (transformers BERT/GPT-2 or Kiln), convert it, save it to DST with the tokenizer files.

    SRC's weights are read from safetensors; weights only in torch's pickle format (pytorch_model.bin, older Hub
    repos) are refused (a ConfigError, one line) unless `trust_pickles`: they are then loaded by torch's restricted
    unpickler (`weights_only`), their shapes checked against the config first. A SRC the command refuses (no
    model there, its files or shapes wrong, a model type or shape that does not convert) is a ValueError; an
    OSError is a failure while reading or writing."""
    stages = _Stages()
    try:
        converted = _convert_in_stages(src, dst, trust_pickles, stages)
    except BaseException:
        stages.close(finished=False)
        raise
    stages.close()
    return converted


def _convert_in_stages(
    src: str | Path, dst: str | Path, trust_pickles: bool, stages: _Stages
) -> torch.nn.Module:
    from kiln.model_files import model_source_problem

    stages.start("check")
    problem = model_source_problem(str(src), "SRC_DIR")
    if problem:
        raise ConfigError(problem)
    spec, src, dst = str(src), Path(src), Path(dst)
    refuse_dst(src, dst)  # before anything is written
    hub_id = None
    if not src.is_dir() and HUB_ID.fullmatch(str(src)):  # a Hub id: its config, weights and tokenizer files
        hub_id, src = str(src), _download_start(str(src), "SRC_DIR", None)
        if not any((src / name).is_file() for name in WEIGHT_FILES):  # older repos: a torch file only
            if not trust_pickles:  # the gate asks the Hub: a repo of pickles only is refused in one line
                check_model_folder(hub_id, "", pickle_fix=PICKLE_FIX)
            else:
                src = _download_start(hub_id, "SRC_DIR", None, more=PICKLE_PATTERNS)
    if not (src / "config.json").is_file():
        raise ConfigError(f"{spec} has no config.json; pass a folder written by save_pretrained")
    try:
        config = read_model_config(str(src))
    except OSError as err:
        raise ConfigError(
            f"{spec}: cannot read a model from it ({err}); pass a folder written by save_pretrained"
        ) from None
    # the gate every model-reading command passes: its files, depth and tensor shapes, before anything is built
    check_model_folder(spec, "", config, src, trust_pickles=trust_pickles, pickle_fix=PICKLE_FIX)
    model_type = config.get("model_type")
    converts = ("bert", "electra", "modernbert", "gpt2", "llama", "kiln_encoder", "kiln_decoder")
    if model_type in converts and weight_files(src) is None and pickle_weight_files(src) is None:
        raise ConfigError(
            f"{spec} holds no weights (no model.safetensors); pass a folder written by save_pretrained"
        )
    architecture = (config.get("architectures") or [None])[0]
    stages.start("load")
    if model_type in ("bert", "electra", "modernbert", "gpt2", "llama"):
        default = {
            "bert": "BertForPreTraining",
            "electra": "ElectraForPreTraining",
            "modernbert": "ModernBertForMaskedLM",
            "gpt2": "GPT2LMHeadModel",
            "llama": "LlamaForCausalLM",
        }
        name = architecture if architecture in TO_KILN else default[model_type]
        with weight_file_errors(str(src)):
            loaded = getattr(transformers, name).from_pretrained(src)
        stages.start("convert")
        converted = from_transformers(loaded)
    elif model_type in ("kiln_encoder", "kiln_decoder"):
        by_name = {kiln_class.__name__: kiln_class for kiln_class in TO_TRANSFORMERS}
        default = "KilnEncoderForPreTraining" if model_type == "kiln_encoder" else "KilnDecoderForCausalLM"
        kiln_class = by_name[architecture if architecture in by_name else default]
        with weight_file_errors(str(src)):
            loaded = kiln_class.from_pretrained(src)
        stages.start("convert")
        converted = to_transformers(loaded)
    else:
        raise ValueError(
            f"{src} holds a `{model_type}` model; only bert, electra, modernbert, gpt2, llama, kiln_encoder, "
            "kiln_decoder convert."
        )
    refuse_dst(src, dst)  # SRC resolved (a Hub id's snapshot), and DST as it is now
    from kiln.safe_write import staged_folder

    stages.start("write")
    # written whole into a fresh folder beside DST and renamed into place: nothing in an earlier DST is written
    # through or cleared by transformers (which removes shard files it did not write); the earlier DST, which
    # `refuse_dst` found to hold only the files of an earlier conversion, is removed as the new one takes its place
    with staged_folder(dst, clear=_clear_converted) as staging:
        converted.save_pretrained(staging)
        for file_name in TOKENIZER_FILES:
            if (src / file_name).is_file():
                shutil.copy(src / file_name, staging / file_name)
        written = {path.name: sha256_file(path) for path in sorted(staging.iterdir()) if path.is_file()}
        (staging / CONVERTED_RECORD).write_text(json.dumps({"files": written}, indent=1) + "\n")
    return converted


class DestinationError(ValueError):
    """DST_DIR is a folder `convert` may not write (a user's folder, SRC_DIR or inside it): exit status 2."""


def _foreign_in_dst(dst: Path) -> list[str]:
    """The entries of an existing DST_DIR that its record (`CONVERTED_RECORD`, written by an earlier convert) does
    not list as unchanged since: everything, when it has no record."""
    try:
        files = json.loads((dst / CONVERTED_RECORD).read_text())["files"]
        if not isinstance(files, dict) or (dst / CONVERTED_RECORD).is_symlink():
            files = {}
    except (OSError, ValueError, KeyError, TypeError):
        files = {}
    foreign = []
    for path in sorted(dst.iterdir()):
        if path.name == CONVERTED_RECORD and files:
            continue
        ours = (
            not path.is_symlink()
            and path.is_file()
            and isinstance(files.get(path.name), str)
            and sha256_file(path) == files[path.name]
        )
        if not ours:
            foreign.append(path.name + ("/" if path.is_dir() and not path.is_symlink() else ""))
    return foreign


def refuse_dst(src: Path, dst: Path) -> None:
    """Refuse a DST_DIR that convert would write over what it must keep: SRC_DIR itself or a folder inside it, a
    link, a file, or a folder holding anything but the unchanged files of an earlier conversion (by its record)."""
    from kiln.safe_write import link_refusal

    if src.is_dir():
        src_real, dst_real = src.resolve(), dst.resolve()
        if dst_real == src_real or src_real in dst_real.parents:
            raise DestinationError(
                f"DST_DIR {dst} is SRC_DIR {src} or inside it; pick a DST_DIR outside SRC_DIR: convert writes a "
                "new folder and never rewrites the one it reads"
            )
    if dst.is_symlink():
        raise DestinationError(link_refusal(dst).replace("--training.output_dir", "DST_DIR"))
    if dst.exists() and not dst.is_dir():
        raise DestinationError(f"DST_DIR {dst} is a file; pick a new or empty folder as DST_DIR")
    if dst.is_dir():
        foreign = _foreign_in_dst(dst)
        if foreign:
            more = f" and {len(foreign) - 6} more" if len(foreign) > 6 else ""
            raise DestinationError(
                f"DST_DIR {dst} holds files convert did not write ({', '.join(foreign[:6])}{more}); pick a new or "
                "empty DST_DIR: convert replaces only a folder an earlier convert wrote, and removes only its files"
            )


def _clear_converted(dst: Path) -> None:
    """Remove an earlier conversion at DST_DIR, once more checked to hold nothing else (`refuse_dst`)."""
    foreign = _foreign_in_dst(dst)
    if foreign:
        raise DestinationError(
            f"DST_DIR {dst} holds files convert did not write ({', '.join(foreign[:6])}), put there while it "
            "converted; pick a new or empty DST_DIR"
        )
    shutil.rmtree(dst)


# ------------------------------------------------------------------------------------------ a run's start model
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+|[A-Za-z0-9][\w.-]*")
_converted: dict[tuple[str, str | None], str] = {}
_pending: list[tuple[int, str]] = []  # (logging level, line)


# transformers model types `python -m pretrain.convert` converts but a run does not convert on the way in
CONVERT_FIRST = {"modernbert": "ModernBERT"}


def convert_first_advice(config: dict, spec: str, option: str) -> str | None:
    """For a checkpoint only the converter's command takes (ModernBERT): the one-line advice to run it first."""
    family = CONVERT_FIRST.get(config.get("model_type"))
    if family is None or carries_code(config):
        return None
    return (
        f"{option} {spec} is a transformers {family} checkpoint; convert it first with "
        f"`python -m pretrain.convert {spec} DST` and point {option} at DST"
    )


def convertible(config: dict) -> tuple[str, str, str] | None:
    """(family name, Kiln kind, Kiln model_type) of a transformers BERT / ELECTRA / GPT-2 / Llama config.json read
    as a dict, which a run converts on the way in; None for any other checkpoint, and for one that names Python
    files of its own (auto_map: not plain BERT / ELECTRA / GPT-2 / Llama weights)."""
    if carries_code(config):
        return None
    return CONVERTIBLE.get(config.get("model_type"))


def converted_start(spec: str, option: str, revision: str | None = None) -> str:
    """The local folder of the Kiln model converted from the transformers BERT / ELECTRA / GPT-2 / Llama checkpoint `spec`
    (a folder or Hub id; `option` names the setting in errors), with its tokenizer files. Its config.json is read as
    data and checked, and the weight file's shapes against it, before any model is built; nothing it names is run.
    Converted once per content: the folder sits in the Hugging Face cache under the hash of the source files, with
    the sha256 of each file written recorded beside them (`CONVERTED_RECORD`) and checked once per process, before
    its first use: a copy changed or damaged since is converted again, with a line saying so. (The run's start
    check and its model build share that one check: the copy is hashed once per run, not once per call.)"""
    key = (spec, revision)
    if key not in _converted:
        _converted[key] = _convert_start(spec, option, revision)
    return _converted[key]


def _convert_start(spec: str, option: str, revision: str | None) -> str:
    from huggingface_hub import constants

    source = Path(spec) if os.path.isdir(spec) else _download_start(spec, option, revision)
    try:
        config = read_model_config(str(source))
    except OSError as err:
        raise ConfigError(f"{option} {spec}: {err}") from None
    model_type = config.get("model_type")
    family = CONVERTIBLE[model_type][0]
    # the gate first: weights only in torch's pickle format are refused there (convert them first)
    keys = check_model_folder(spec, option, config, source, revision)
    if weight_files(source) is None:
        if source != Path(spec):  # a Hub repo (its download holds no pickles): the gate asks the Hub
            check_model_folder(spec, option, config, revision=revision)
        raise ConfigError(
            f"{option} {spec} is a transformers {family} checkpoint without a model.safetensors; point {option} "
            "at a folder written by save_pretrained (safetensors)"
        )
    name = _start_class(model_type, config, keys)
    files = [
        source / "config.json",
        *map(Path, weight_files(source) or []),
        *(source / f for f in TOKENIZER_FILES),
    ]
    digest = hashlib.sha256()
    for path in files:
        if path.is_file():
            digest.update(f"{path.name}\0{sha256_file(path)}\0".encode())
    target = Path(constants.HF_HOME) / "kiln-converted" / digest.hexdigest()[:20]
    problem = _converted_copy_problem(target)
    if problem is not None:
        if target.exists():
            said = f"{option} {spec}: the Kiln copy converted from it earlier ({target}) {problem}"
            _pending.append((logging.WARNING, f"{said}; converting it again"))
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".converting-", dir=target.parent))
        from kiln.export import quiet_transformers

        try:
            pooling = {"add_pooling_layer": "pooler.dense.weight" in keys} if name == "BertModel" else {}
            with quiet_transformers(), weight_file_errors(spec, option):
                loaded, info = getattr(transformers, name).from_pretrained(
                    source, dtype=torch.float32, output_loading_info=True, **pooling
                )
            if info["missing_keys"] or info["mismatched_keys"]:
                lacking = sorted(map(str, [*info["missing_keys"], *info["mismatched_keys"]]))
                raise ValueError(f"its weights do not fit {name} (e.g. {lacking[0]})")
            model = from_transformers(loaded)
            with quiet_transformers():
                model.save_pretrained(staging)
            for file_name in TOKENIZER_FILES:
                if (source / file_name).is_file():
                    shutil.copy(source / file_name, staging / file_name)
            written = {path.name: sha256_file(path) for path in sorted(staging.iterdir()) if path.is_file()}
            (staging / CONVERTED_RECORD).write_text(json.dumps({"files": written}, indent=1) + "\n")
            _install_conversion(staging, target)
        except ConfigError:
            raise
        except (ValueError, OSError, RuntimeError) as err:
            raise ConfigError(
                # `python -m pretrain.convert` refuses it for the same reason, so the fix is another checkpoint
                f"{option} {spec} is a transformers {family} checkpoint that Kiln cannot convert "
                f"({first_line(err)}); point {option} at a Kiln checkpoint, or at a {family} checkpoint without "
                "that, saved by save_pretrained"
            ) from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    kiln_type = json.loads((target / "config.json").read_text())["architectures"][0]
    what = f"{option} {spec} is a transformers {family} checkpoint ({name}): converted to Kiln's {kiln_type}"
    _pending.append((logging.INFO, f"{what}, same weights (kept for the next run)"))
    if logger.hasHandlers():  # else checked before the run set up its logging: said when the model is built
        announce_conversions()
    return str(target)


# beside the files of a conversion in the cache: the sha256 of each, as written
CONVERTED_RECORD = "kiln-converted.json"


def _converted_copy_problem(target: Path) -> str | None:
    """Why the converted copy `target` in the cache cannot be trained on (absent, no record, a file missing or
    changed since it was written: edited, truncated); None when each file its record lists has the sha256
    recorded when it was written."""
    if not target.is_dir():
        return "is missing"
    try:
        files = json.loads((target / CONVERTED_RECORD).read_text())["files"]
        if not isinstance(files, dict) or not {"config.json", "model.safetensors"} <= set(files):
            raise ValueError("it does not list the model's files")
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"has no record of the files written ({CONVERTED_RECORD}: {first_line(err)})"
    for name, digest in sorted(files.items()):
        if not isinstance(name, str) or Path(name).name != name or not (target / name).is_file():
            return f"lacks its {name}"
        if sha256_file(target / name) != digest:
            return f"holds a {name} that changed after it was written (not the sha256 recorded)"
    return None


def _install_conversion(staging: Path, target: Path) -> None:
    """Put the conversion in `staging` at `target` (atomic renames: another process may convert the same files
    meanwhile); a damaged copy there is set aside first, unless another process has just replaced it."""
    if target.exists():
        if _converted_copy_problem(target) is None:
            return
        aside = Path(tempfile.mkdtemp(prefix=".damaged-", dir=target.parent))
        try:
            os.replace(target, aside / "copy")
        except OSError:
            pass  # another process set it aside first
        shutil.rmtree(aside, ignore_errors=True)
    try:
        os.replace(staging, target)
    except OSError:
        if _converted_copy_problem(target) is not None:
            raise


def announce_conversions() -> None:
    """Log the line of each start model converted since the last call (converted_start converts before the run
    has set up its logging: the run calls this once it has, when it builds the model)."""
    while _pending:
        logger.log(*_pending.pop(0))


def _download_start(spec: str, option: str, revision: str | None, more: tuple[str, ...] = ()) -> Path:
    """The files of Hub repo `spec` a conversion reads (config, safetensors weights, tokenizer, `more`): never
    code."""
    from huggingface_hub import snapshot_download

    patterns = ["config.json", *WEIGHT_FILES, "model-*-of-*.safetensors", *TOKENIZER_FILES, *more]
    try:
        return Path(snapshot_download(spec, revision=revision, allow_patterns=patterns))
    except Exception as err:  # not found, no access, no network: all mean "cannot read it here"
        raise ConfigError(f"{option} {spec}: cannot download it from the Hub ({first_line(err)})") from None


def _start_class(model_type: str, config: dict, keys: set[str]) -> str:
    """The transformers class the weights were saved from: the config's architecture where Kiln converts it, with
    BERT's pretraining heads decided by the weights (bert-base-uncased says BertForMaskedLM but holds both)."""
    default = {
        "bert": "BertForPreTraining",
        "electra": "ElectraForPreTraining",
        "gpt2": "GPT2LMHeadModel",
        "llama": "LlamaForCausalLM",
    }
    prefix = {"bert": "Bert", "electra": "Electra", "gpt2": "GPT2", "llama": "Llama"}[model_type]
    architecture = (config.get("architectures") or [None])[0]
    name = (
        architecture if architecture in TO_KILN and architecture.startswith(prefix) else default[model_type]
    )
    if model_type == "bert" and name in ("BertForPreTraining", "BertForMaskedLM"):
        if "cls.predictions.bias" in keys:
            name = "BertForPreTraining" if "cls.seq_relationship.weight" in keys else "BertForMaskedLM"
        elif not any(key.startswith("cls.") for key in keys):
            name = "BertModel"
    return name


def convert_parser() -> argparse.ArgumentParser:
    """The command line of `python -m pretrain.convert`."""
    from kiln.cli import add_print_config

    parser = argparse.ArgumentParser(
        prog="python -m pretrain.convert",
        description="Convert a transformers BERT/ELECTRA/ModernBERT/GPT-2/Llama checkpoint to Kiln, or a Kiln "
        "checkpoint to BERT/ELECTRA/ModernBERT/GPT-2/Llama. The direction follows SRC_DIR's config.json model_type; a "
        "Kiln ELECTRA discriminator (final/ of an electra run) becomes ElectraForPreTraining, its generator "
        "(final/generator/) ElectraForMaskedLM, an encoder with the modernbert preset its ModernBertFor* class, a "
        "decoder with the llama preset its LlamaFor* class. Guide: docs/models.md; every option: "
        "docs/configuration.md.",
    )
    parser.add_argument("src_dir", metavar="SRC_DIR", help="folder written by save_pretrained, or a Hub id")
    parser.add_argument("dst_dir", metavar="DST_DIR", help="output folder (created)")
    parser.add_argument(
        "--trust_pickles",
        action="store_true",
        help="read SRC_DIR's weights when they are only in torch's pickle format (pytorch_model.bin), loaded by "
        "torch's restricted unpickler; only for a file you trust: without it such a SRC_DIR is refused",
    )
    add_print_config(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    from kiln.cli import answer_print_config

    args = convert_parser().parse_args(argv)
    answer_print_config(args)
    try:
        converted = convert_checkpoint(args.src_dir, args.dst_dir, args.trust_pickles)
    except ValueError as error:
        # a refused input, said before anything is written: DST_DIR (DestinationError), SRC_DIR (a ConfigError:
        # nothing there, refused by the model gate), a model that does not convert (ValueError): exit status 2,
        # as argparse's
        print(f"error: {first_line(error, 2000)}", file=sys.stderr)
        sys.exit(2)
    except OSError as error:  # a failure while reading or writing files (a full disk): exit status 1
        sys.exit(f"error: {error}")
    print(f"wrote {type(converted).__name__} to {args.dst_dir}")


if __name__ == "__main__":
    main()

"""Kiln models: a BERT-style encoder and a GPT-2-style decoder as transformers `PreTrainedModel`s.

Importing this package registers both model types with transformers' Auto classes (AutoConfig, AutoModel,
AutoModelForPreTraining, AutoModelForMaskedLM, AutoModelForNextSentencePrediction,
AutoModelForSequenceClassification, AutoModelForMultipleChoice, AutoModelForTokenClassification,
AutoModelForQuestionAnswering, AutoModelForCausalLM) and marks the classes with `register_for_auto_class`,
so `save_pretrained` writes `auto_map` and the modeling files: the checkpoint then loads anywhere with
`AutoModelFor*.from_pretrained(dir, trust_remote_code=True)`, without this package.
"""

import transformers

from .configuration_kiln import KilnDecoderConfig, KilnEncoderConfig, KilnEncoderDecoderConfig
from .modeling_kiln_decoder import (
    DECODER_AUTO_CLASSES,
    KilnDecoderForCausalLM,
    KilnDecoderForSequenceClassification,
    KilnDecoderForTokenClassification,
    KilnDecoderModel,
    KilnDecoderPreTrainedModel,
)
from .modeling_kiln_electra import (
    ELECTRA_DEFAULTS,
    KilnElectraPreTrainingOutput,
    KilnEncoderForElectraPreTraining,
    KilnEncoderForReplacedTokenDetection,
    KilnReplacedTokenDetectionOutput,
    electra_generator_shape,
    sample_from_logits,
)
from .modeling_kiln_encoder import (
    ENCODER_AUTO_CLASSES,
    KilnEncoderForMaskedLM,
    KilnEncoderForMultipleChoice,
    KilnEncoderForNextSentencePrediction,
    KilnEncoderForPreTraining,
    KilnEncoderForPreTrainingOutput,
    KilnEncoderForQuestionAnswering,
    KilnEncoderForSequenceClassification,
    KilnEncoderForTokenClassification,
    KilnEncoderModel,
    KilnEncoderPreTrainedModel,
)
from .modeling_kiln_encoder_decoder import ENCODER_DECODER_AUTO_CLASSES, KilnEncoderDecoderModel


def _register() -> None:
    for config_class, auto_classes in (
        (KilnEncoderConfig, ENCODER_AUTO_CLASSES),
        (KilnDecoderConfig, DECODER_AUTO_CLASSES),
        (KilnEncoderDecoderConfig, ENCODER_DECODER_AUTO_CLASSES),
    ):
        transformers.AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
        config_class.register_for_auto_class()
        for auto_name, model_class in auto_classes.items():
            getattr(transformers, auto_name).register(config_class, model_class, exist_ok=True)
            if model_class._auto_class is None:  # a class serving two Auto classes keeps its first
                model_class.register_for_auto_class(auto_name)
    # ELECTRA's discriminator (what its final/ holds) is no Auto class of the Kiln encoder, whose
    # AutoModelForPreTraining is MLM + NSP; marked as this folder's AutoModelForPreTraining (as transformers'
    # ElectraForPreTraining is ELECTRA's), so that save_pretrained ships the code and a remote-code load finds it
    KilnEncoderForReplacedTokenDetection.register_for_auto_class("AutoModelForPreTraining")


_register()


def count_flops_per_token(config, seq_len: int, lm_head_fraction: float = 0.0) -> float:
    """Training FLOPs (forward + backward) per token of a Kiln encoder or decoder, for MFU.

        flops_per_token = 6 * N + 12 * L * h * T + 6 * h * V * lm_head_fraction

    N: non-embedding parameters of the blocks, L * (4h^2 + 2*h*I) (3*h*I with a gated MLP; + 4h^2 per layer with
    cross-attention; grouped-query attention 2h^2 + 2*h*h_kv with h_kv = h * kv heads / heads); local attention
    is counted as global (an upper bound);
    the second term is attention's QK^T and AV matmuls (2 * 2 * h * T forward per layer, x3 with backward)
    with h = hidden size, T = `seq_len`, I = intermediate size; biases, LayerNorms and the pooler are ignored.
    The last term is the vocabulary projection (V = vocab size), run on `lm_head_fraction` of the tokens:
    0 to leave it out (Kaplan et al.), 1 for a causal LM, the masking rate for a sparse MLM head.
    """
    h, L, V = config.hidden_size, config.num_hidden_layers, config.vocab_size
    heads = config.num_attention_heads
    key_value_width = h * (getattr(config, "num_key_value_heads", None) or heads) // heads
    mlp_matrices = 3 if getattr(config, "mlp_type", "mlp") == "glu" else 2  # a gated MLP has two input halves
    per_layer = 2 * h * h + 2 * h * key_value_width + mlp_matrices * h * config.intermediate_size
    if getattr(config, "add_cross_attention", False):
        per_layer += 4 * h * h
    return 6 * L * per_layer + 12 * L * h * seq_len + 6 * h * V * lm_head_fraction


__all__ = [
    "ELECTRA_DEFAULTS",
    "KilnElectraPreTrainingOutput",
    "KilnEncoderForElectraPreTraining",
    "KilnEncoderForReplacedTokenDetection",
    "KilnReplacedTokenDetectionOutput",
    "electra_generator_shape",
    "sample_from_logits",
    "KilnDecoderConfig",
    "KilnDecoderForCausalLM",
    "KilnDecoderForSequenceClassification",
    "KilnDecoderForTokenClassification",
    "KilnDecoderModel",
    "KilnDecoderPreTrainedModel",
    "KilnEncoderConfig",
    "KilnEncoderDecoderConfig",
    "KilnEncoderDecoderModel",
    "KilnEncoderForMaskedLM",
    "KilnEncoderForMultipleChoice",
    "KilnEncoderForNextSentencePrediction",
    "KilnEncoderForPreTraining",
    "KilnEncoderForPreTrainingOutput",
    "KilnEncoderForQuestionAnswering",
    "KilnEncoderForSequenceClassification",
    "KilnEncoderForTokenClassification",
    "KilnEncoderModel",
    "KilnEncoderPreTrainedModel",
    "count_flops_per_token",
]

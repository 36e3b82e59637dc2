"""Configurations of the Kiln encoder (BERT-like, post-LN) and decoder (GPT-2-like, pre-LN).

This file is uploaded to the Hub next to the checkpoints (trust_remote_code): it may import only torch,
transformers and its sibling files, by relative import.
"""

import math
import sys

from transformers.configuration_utils import PreTrainedConfig, SubConfigSpec
from transformers.models.encoder_decoder.configuration_encoder_decoder import EncoderDecoderConfig

POSITION_EMBEDDING_TYPES = ("learned", "sinusoidal", "rotary")
NORM_POSITIONS = ("post", "pre")
MLP_TYPES = ("mlp", "glu")
CLASSIFIER_HEADS = ("tanh_pooler", "transform")
CLASSIFIER_POOLINGS = ("cls", "mean")

# The encoder's block pieces a `preset` sets together; a piece passed explicitly overrides its preset's value.
# `bert`: BERT's 2018 block. `modernbert`: transformers' ModernBERT (Warner et al., 2024).
ENCODER_PRESETS = {
    "bert": {
        "position_embedding_type": "learned",
        "norm_position": "post",
        "mlp_type": "mlp",
        "attention_bias": True,
        "mlp_bias": True,
        "norm_bias": True,
        "classifier_bias": True,
        "classifier_head": "tanh_pooler",
        "global_attn_every_n_layers": 1,
        "local_attention": 0,
    },
    "modernbert": {
        "position_embedding_type": "rotary",
        "norm_position": "pre",
        "mlp_type": "glu",
        "attention_bias": False,
        "mlp_bias": False,
        "norm_bias": False,
        "classifier_bias": False,
        "classifier_head": "transform",
        "global_attn_every_n_layers": 3,
        "local_attention": 128,
    },
}


def _choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"Unknown {name}={value!r}; use one of {tuple(allowed)}.")


# LoRA's default target modules per model type, as PEFT keeps them for transformers' own models: the fused
# query-key-value projection of every self-attention (GPT-2's `c_attn` default), and in the seq2seq model also the
# decoder's cross-attention projections (`q`, `kv`)
LORA_TARGET_MODULES = {
    "kiln_encoder": ["qkv"],
    "kiln_decoder": ["qkv"],
    "kiln_encoder_decoder": ["qkv", "q", "kv"],
}


def register_lora_targets() -> None:
    """Add Kiln's model types to PEFT's table of default LoRA targets (`TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_
    MAPPING`), never replacing an entry, so that `LoraConfig()` without `target_modules` works for Kiln models.

    PEFT looks a model's type up in that table right after reading `model.config.to_dict()`; Kiln's configs call
    this from `to_dict`, so it works whichever of PEFT and Kiln's code (installed or trust_remote_code) is imported
    first. Nothing is imported: without PEFT loaded it does nothing."""
    constants = sys.modules.get("peft.utils.constants")
    table = getattr(constants, "TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING", None)
    if isinstance(table, dict):
        for model_type, targets in LORA_TARGET_MODULES.items():
            table.setdefault(model_type, list(targets))


def check_heads(hidden_size: int, num_attention_heads: int) -> None:
    """Raised when a model is built (as BERT does), not by the config: a config may hold any single field."""
    if num_attention_heads <= 0 or hidden_size % num_attention_heads != 0:
        small = [d for d in range(1, math.isqrt(max(hidden_size, 0)) + 1) if hidden_size % d == 0]
        divisors = sorted({*small, *(hidden_size // d for d in small)})  # up to its square root: any width
        nearest = sorted(divisors, key=lambda d: abs(d - num_attention_heads))[:2]
        raise ValueError(
            f"hidden_size={hidden_size} is not divisible by num_attention_heads={num_attention_heads}; "
            f"use a head count that divides it (e.g. {' or '.join(map(str, sorted(nearest)))})."
        )


def check_rope_theta(name: str, value) -> None:
    """A rotary base must be a finite positive number: 0 or less gives NaN angles from the first step, inf the
    same angle at every position (no position information)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:  # NaN too
        raise ValueError(
            f"{name}={value!r} must be a finite positive number, the base of the rotary frequencies (e.g. 10000)."
        )


def check_size(name: str, value, minimum: int = 1) -> None:
    """A size field (width, depth, head count, vocabulary) is a whole number of at least `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be a whole number >= {minimum}.")


# The attention kernels Kiln's models run (`attn_implementation`, transformers' names): their own masks for
# `sdpa` and `eager`, transformers' BlockMask for `flex_attention`
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flex_attention")
# the fields that size every Kiln model, each a whole number >= 1
SIZE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
)


def check_attn_implementation(value, training_device: str | None = None, attention_dropout: float = 0.0):
    """A kernel Kiln's models run; with `training_device` (the device type a run trains on), one that can train
    there: PyTorch's flex attention has a backward on CUDA only, and no attention dropout."""
    _choice("attn_implementation", value, ATTN_IMPLEMENTATIONS)
    if value != "flex_attention" or training_device is None:
        return
    if training_device != "cuda":
        raise ValueError(
            f"attn_implementation='flex_attention' cannot train on {training_device}: PyTorch's flex "
            "attention has no backward there (CUDA only); use 'sdpa' or 'eager'."
        )
    if attention_dropout > 0:
        raise ValueError(
            f"attn_implementation='flex_attention' has no attention dropout, and the attention dropout is "
            f"{attention_dropout}; set it to 0 or use 'sdpa' or 'eager'."
        )


class _KilnConfig(PreTrainedConfig):
    """Refuses a checkpoint of another model type instead of building a half-random model from it."""

    def check_values(self) -> None:
        """ValueError (one line, naming the field) for a value no model can be built or trained with: sizes, the
        head count against the width, the rotary bases. Not run by `__init__` (a config may hold any single
        field, as transformers' own do): a run calls it before it writes anything, and the model's layers check
        their own shapes when built."""
        for name in SIZE_FIELDS:
            check_size(name, getattr(self, name))
        check_heads(self.hidden_size, self.num_attention_heads)
        check_rope_theta("rope_theta", self.rope_theta)

    def to_dict(self):
        register_lora_targets()  # PEFT reads the model type from here (see `register_lora_targets`)
        return super().to_dict()

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        found = config_dict.get("model_type")
        if found and found != cls.model_type:
            if found.startswith("kiln_"):
                family = "KilnEncoder*" if found == "kiln_encoder" else "KilnDecoder*"
                fix = f"load it with a {family} class or an AutoModel* class instead"
            else:
                fix = "convert it first with `python -m pretrain.convert SRC_DIR DST_DIR`"
            raise ValueError(
                f"This checkpoint is a `{found}` model, but {cls.__name__} expects `{cls.model_type}`; {fix}."
            )
        return super().from_dict(config_dict, **kwargs)


class KilnEncoderConfig(_KilnConfig):
    r"""Configuration of [`KilnEncoderModel`] and its heads (a BERT-style post-LN encoder).

    Args:
        vocab_size: number of token ids.
        hidden_size: width of the residual stream; must be divisible by `num_attention_heads` (checked when a
            model is built, as in BERT).
        num_hidden_layers: number of transformer blocks.
        num_attention_heads: attention heads per block.
        intermediate_size: width of the feed-forward layer.
        hidden_act: feed-forward and MLM-transform activation (`gelu` is BERT's erf GELU).
        hidden_dropout_prob: dropout on the embeddings and on every sublayer output.
        attention_probs_dropout_prob: dropout on the attention probabilities.
        max_position_embeddings: longest sequence the model accepts.
        type_vocab_size: number of segment (token type) ids.
        layer_norm_eps: LayerNorm epsilon.
        initializer_range: std of the normal initialisation.
        pad_token_id: id of the padding token (its embedding row starts at zero and gets no gradient).
        position_embedding_type: `learned` (a trained table), `sinusoidal` (the fixed sin/cos table of
            "Attention Is All You Need"; a buffer, not a parameter) or `rotary` (RoPE: queries and keys rotated by
            their positions in every attention, `rope_theta` / `local_rope_theta`; no table). None: the preset's.
        sparse_prediction: when MLM labels are given, compute vocabulary logits only at the labelled positions
            (`labels != -100`); the MLM logits then have shape (num_masked, vocab_size) instead of BERT's
            (batch, seq_len, vocab_size). The last block, too, then computes only the rows that are read
            (labelled positions and the first token), unless hidden states or attentions are requested. Same
            loss and gradients, far fewer FLOPs. Off by default (transformers' output shapes); the pretraining
            runner turns it on, and saved checkpoints have it off again.
        classifier_dropout: dropout before the classification heads (None: `hidden_dropout_prob`).
        chunked_mlm_loss: when training (train mode, gradients on) with MLM labels, compute the MLM loss with a
            chunked vocabulary projection + cross-entropy that never holds the logits; the MLM logits are then
            None. Same loss and gradients, less time and memory. Off by default so that training code which
            reads the MLM logits keeps getting them; turn it on for pretraining.
        unpad_inputs: when a batch has padding, run every position-wise layer (QKV and output projections, MLP,
            LayerNorm, dropout) on the real tokens only and re-pad them only inside attention; the outputs at
            real positions are the padded path's, those at padded positions are zeros (the padded path returns
            values there that nothing should read). Only batches with at least 10% padding (below that the
            gathers cost more than they save) and right padding; off when per-layer hidden states are requested.
        embedding_size: width of the token, position and segment embeddings (None: `hidden_size`). When it
            differs from `hidden_size`, a linear `embeddings_project` maps the embeddings to the hidden size and
            the MLM head maps back to it before the tied vocabulary projection, as in ELECTRA (`ElectraConfig.
            embedding_size`): an ELECTRA generator narrower than its discriminator shares the discriminator's
            embeddings this way.
        preset: the block's pieces set together (`ENCODER_PRESETS`): `bert` (post-LN, learned positions, GELU MLP,
            biases everywhere, tanh pooler) or `modernbert` (transformers' ModernBERT: rotary positions, GeGLU,
            pre-LN with bias-free LayerNorms and a final norm, no linear biases, local attention in two layers of
            three). Each piece below left at None takes the preset's value; one given explicitly overrides it.
        norm_position: `post` (x = LN(x + f(x)), BERT) or `pre` (x = x + f(LN(x)), with a LayerNorm after the
            last block; the first block's attention reads the normed embeddings directly, as in ModernBERT).
        mlp_type: `mlp` (fc_in -> act -> fc_out) or `glu` (gated: fc_out(act(x W) * x V); GeGLU with `gelu`);
            with `glu`, `intermediate_size` is the width of one of the two halves.
        attention_bias: biases in the attention's linear layers (query-key-value and output projections).
        mlp_bias: biases in the feed-forward's linear layers.
        norm_bias: biases in every LayerNorm.
        classifier_bias: bias of the dense layer in the MLM head and in the pooler / classifier transform.
        decoder_bias: bias of the MLM vocabulary projection.
        classifier_head: what the sequence heads read: `tanh_pooler` (dense + tanh on the first token, BERT's
            pooler; token heads read the states directly) or `transform` (dense + `classifier_activation` +
            LayerNorm, on the pooled state for sequence heads and on every state for token heads, ModernBERT's).
        classifier_activation: activation of the MLM head's and the classifier transform's dense layer (None:
            `hidden_act`).
        classifier_pooling: with `classifier_head: transform`, which state the sequence heads read: `cls` (the
            first token's) or `mean` (the mean over real tokens).
        global_attn_every_n_layers: blocks 0, n, 2n, ... attend globally; the others only within
            `local_attention` (1: every block global).
        local_attention: the local blocks' window, in tokens: a token attends to those at most
            `local_attention // 2` positions away (0: no local attention).
        rope_theta: rotary base of the global blocks (ModernBERT's 160,000).
        local_rope_theta: rotary base of the local blocks (ModernBERT's 10,000).
    """

    model_type = "kiln_encoder"

    def __init__(
        self,
        vocab_size: int = 30522,
        hidden_size: int = 768,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 12,
        intermediate_size: int = 3072,
        hidden_act: str = "gelu",
        hidden_dropout_prob: float = 0.1,
        attention_probs_dropout_prob: float = 0.1,
        max_position_embeddings: int = 512,
        type_vocab_size: int = 2,
        layer_norm_eps: float = 1e-12,
        initializer_range: float = 0.02,
        pad_token_id: int | None = 0,
        position_embedding_type: str | None = None,
        sparse_prediction: bool = False,
        classifier_dropout: float | None = None,
        chunked_mlm_loss: bool = False,
        unpad_inputs: bool = True,
        tie_word_embeddings: bool = True,
        embedding_size: int | None = None,
        preset: str = "bert",
        norm_position: str | None = None,
        mlp_type: str | None = None,
        attention_bias: bool | None = None,
        mlp_bias: bool | None = None,
        norm_bias: bool | None = None,
        classifier_bias: bool | None = None,
        decoder_bias: bool = True,
        classifier_head: str | None = None,
        classifier_activation: str | None = None,
        classifier_pooling: str = "cls",
        global_attn_every_n_layers: int | None = None,
        local_attention: int | None = None,
        rope_theta: float = 160_000.0,
        local_rope_theta: float = 10_000.0,
        **kwargs,
    ):
        _choice("preset", preset, ENCODER_PRESETS)
        pieces = dict(
            position_embedding_type=position_embedding_type,
            norm_position=norm_position,
            mlp_type=mlp_type,
            attention_bias=attention_bias,
            mlp_bias=mlp_bias,
            norm_bias=norm_bias,
            classifier_bias=classifier_bias,
            classifier_head=classifier_head,
            global_attn_every_n_layers=global_attn_every_n_layers,
            local_attention=local_attention,
        )
        for name, value in pieces.items():
            setattr(self, name, ENCODER_PRESETS[preset][name] if value is None else value)
        _choice("position_embedding_type", self.position_embedding_type, POSITION_EMBEDDING_TYPES)
        _choice("norm_position", self.norm_position, NORM_POSITIONS)
        _choice("mlp_type", self.mlp_type, MLP_TYPES)
        _choice("classifier_head", self.classifier_head, CLASSIFIER_HEADS)
        _choice("classifier_pooling", classifier_pooling, CLASSIFIER_POOLINGS)
        if self.global_attn_every_n_layers < 1 or self.local_attention < 0:
            raise ValueError(
                f"global_attn_every_n_layers={self.global_attn_every_n_layers} must be >= 1 and "
                f"local_attention={self.local_attention} >= 0 (1 and 0: every block attends globally)."
            )
        self.preset = preset
        self.decoder_bias = decoder_bias
        self.classifier_activation = classifier_activation
        self.classifier_pooling = classifier_pooling
        self.rope_theta = rope_theta
        self.local_rope_theta = local_rope_theta
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.layer_norm_eps = layer_norm_eps
        self.initializer_range = initializer_range
        self.sparse_prediction = sparse_prediction
        self.classifier_dropout = classifier_dropout
        self.chunked_mlm_loss = chunked_mlm_loss
        self.unpad_inputs = unpad_inputs
        self.embedding_size = embedding_size
        self.is_decoder = False
        self.add_cross_attention = False
        # pad_token_id / tie_word_embeddings go through the base class: some transformers 5.x own them there
        super().__init__(pad_token_id=pad_token_id, tie_word_embeddings=tie_word_embeddings, **kwargs)

    def check_values(self) -> None:
        """`_KilnConfig.check_values`, with the segment vocabulary (0: none), the embedding width and the local
        blocks' rotary base."""
        super().check_values()
        check_size("type_vocab_size", self.type_vocab_size, minimum=0)
        if self.embedding_size is not None:
            check_size("embedding_size", self.embedding_size)
        check_rope_theta("local_rope_theta", self.local_rope_theta)

    @property
    def layer_types(self) -> list[str]:
        """Per block: `full_attention` (global) or `sliding_attention` (within `local_attention`), as
        transformers names them."""
        local = self.local_attention > 0 and self.global_attn_every_n_layers > 1
        return [
            "sliding_attention" if local and i % self.global_attn_every_n_layers else "full_attention"
            for i in range(self.num_hidden_layers)
        ]

    @property
    def sliding_window(self) -> int:
        """How far a local block's token sees on each side (`local_attention // 2`), as transformers' mask
        builders read it."""
        return self.local_attention // 2

    @sliding_window.setter
    def sliding_window(self, value: int) -> None:
        self.local_attention = 2 * value


# What each decoder preset sets (the fields a KilnDecoderConfig leaves at None take these values)
DECODER_PRESETS = {
    "gpt2": {
        "position_embedding_type": "learned",
        "norm_type": "layernorm",
        "mlp_type": "mlp",
        "activation_function": "gelu_new",
        "attention_bias": True,
        "mlp_bias": True,
        "resid_pdrop": 0.1,
        "embd_pdrop": 0.1,
        "attn_pdrop": 0.1,
    },
    "llama": {
        "position_embedding_type": "rotary",
        "norm_type": "rmsnorm",
        "mlp_type": "glu",
        "activation_function": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    },
}
DECODER_CHOICES = {
    "position_embedding_type": ("learned", "rotary"),
    "norm_type": ("layernorm", "rmsnorm"),
    "mlp_type": ("mlp", "glu"),
}


def default_intermediate_size(hidden_size: int, mlp_type: str) -> int:
    """4 x hidden_size for a plain MLP; for a gated one (three matrices instead of two) 8/3 x hidden_size rounded
    up to a multiple of 64, the same parameter count, as Llama sizes it."""
    if mlp_type != "glu":
        return 4 * hidden_size
    return -(-8 * hidden_size // 3 // 64) * 64


def check_key_value_heads(num_attention_heads: int, num_key_value_heads: int) -> None:
    """Raised when a model is built: grouped-query attention needs the query heads to split evenly."""
    if num_key_value_heads <= 0 or num_attention_heads % num_key_value_heads != 0:
        divisors = [d for d in range(1, num_attention_heads + 1) if num_attention_heads % d == 0]
        raise ValueError(
            f"num_key_value_heads={num_key_value_heads} does not divide num_attention_heads={num_attention_heads};"
            f" use one of {divisors}."
        )


class KilnDecoderConfig(_KilnConfig):
    r"""Configuration of [`KilnDecoderModel`] / [`KilnDecoderForCausalLM`] (a GPT-2-style pre-LN decoder).

    GPT-2's names are accepted as aliases (`n_embd`, `n_layer`, `n_head`, `n_positions`, `n_inner`), and so
    are the encoder's (`hidden_act`, `layer_norm_eps`, `attention_probs_dropout_prob`); the encoder's
    `hidden_dropout_prob` sets both `resid_pdrop` and `embd_pdrop`.

    Args:
        vocab_size: number of token ids.
        max_position_embeddings: longest sequence (prompt + generated tokens) the model accepts.
        hidden_size: width of the residual stream; must be divisible by `num_attention_heads` (checked when a
            model is built, as in GPT-2).
        num_hidden_layers: number of transformer blocks.
        num_attention_heads: attention heads per block.
        intermediate_size: width of the feed-forward layer (None: 4 * hidden_size).
        activation_function: feed-forward activation (`gelu_new` is GPT-2's tanh GELU).
        resid_pdrop: dropout on every sublayer output.
        embd_pdrop: dropout on the embeddings.
        attn_pdrop: dropout on the attention probabilities.
        layer_norm_epsilon: LayerNorm epsilon.
        initializer_range: std of the normal initialisation (residual projections get std / sqrt(2 * layers)).
        add_cross_attention: add a cross-attention sublayer to every block, so the model can be the decoder of
            transformers' `EncoderDecoderModel` (`encoder_hidden_states`, `encoder_attention_mask`).
        use_cache: return a key/value cache for fast generation.
        chunked_lm_loss: when training (train mode, gradients on) with `labels`, compute the loss with a chunked
            LM head + cross-entropy that never holds the (B, T, V) logits; `logits` is then None. Same loss and
            gradients, less memory and time at large vocabularies. Evaluation, generation and calls without
            labels always get the logits; set False to get them while training too.
        preset: `gpt2` (the default: learned positions, GELU MLP, LayerNorm, biases, dropout 0.1) or `llama`
            (rotary positions, SwiGLU MLP, RMSNorm, no biases, no dropout; transformers' `LlamaForCausalLM`
            computes the same function, and `pretrain.convert` converts both ways). The preset fills every
            field below (and `activation_function` and the dropouts) that is left at None; a field given
            explicitly wins, so each piece can also be chosen on its own.
        position_embedding_type: `learned` (a trained table added to the token embeddings, GPT-2) or `rotary`
            (rotary embeddings applied to queries and keys in every layer, Llama).
        rope_theta: base of the rotary frequencies (Llama 2: 10000, Llama 3: 500000).
        norm_type: `layernorm` (with bias, GPT-2) or `rmsnorm` (Llama).
        mlp_type: `mlp` (fc_out(act(fc_in(x))), GPT-2) or `glu` (gated: fc_out(act(gate(x)) * up(x)): SwiGLU with
            `silu`, Llama).
        num_key_value_heads: key/value heads of the self-attention (grouped-query attention: each serves
            num_attention_heads / num_key_value_heads query heads); None: num_attention_heads (multi-head).
        attention_bias: biases on the attention projections (GPT-2 yes, Llama no).
        mlp_bias: biases on the feed-forward projections (GPT-2 yes, Llama no).
        qk_norm: RMSNorm each query and key head (over its head_dim) before the rotary embedding, as Qwen3 and
            OLMo 2 do; transformers' Llama has no such norm, so a model with it does not convert to Llama.
    """

    model_type = "kiln_decoder"
    keys_to_ignore_at_inference = ["past_key_values"]
    attribute_map = {
        "n_embd": "hidden_size",
        "n_layer": "num_hidden_layers",
        "n_head": "num_attention_heads",
        "n_positions": "max_position_embeddings",
        "n_inner": "intermediate_size",
        "hidden_act": "activation_function",
        "layer_norm_eps": "layer_norm_epsilon",
        "attention_probs_dropout_prob": "attn_pdrop",
    }

    def __init__(
        self,
        vocab_size: int = 50257,
        max_position_embeddings: int = 1024,
        hidden_size: int = 768,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 12,
        intermediate_size: int | None = None,
        activation_function: str | None = None,
        resid_pdrop: float | None = None,
        embd_pdrop: float | None = None,
        attn_pdrop: float | None = None,
        layer_norm_epsilon: float = 1e-5,
        initializer_range: float = 0.02,
        bos_token_id: int | None = 50256,
        eos_token_id: int | list[int] | None = 50256,
        pad_token_id: int | None = None,
        add_cross_attention: bool = False,
        is_decoder: bool = True,
        tie_word_embeddings: bool = True,
        use_cache: bool = True,
        chunked_lm_loss: bool = True,
        preset: str | None = None,
        position_embedding_type: str | None = None,
        rope_theta: float = 10000.0,
        norm_type: str | None = None,
        mlp_type: str | None = None,
        num_key_value_heads: int | None = None,
        attention_bias: bool | None = None,
        mlp_bias: bool | None = None,
        qk_norm: bool = False,
        **kwargs,
    ):
        aliases = {alias: kwargs.pop(alias) for alias in self.attribute_map if alias in kwargs}
        if (hidden_dropout_prob := kwargs.pop("hidden_dropout_prob", None)) is not None:
            resid_pdrop = embd_pdrop = hidden_dropout_prob
        self.vocab_size = vocab_size
        self.max_position_embeddings = max_position_embeddings
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.activation_function = activation_function
        self.resid_pdrop = resid_pdrop
        self.embd_pdrop = embd_pdrop
        self.attn_pdrop = attn_pdrop
        self.layer_norm_epsilon = layer_norm_epsilon
        self.initializer_range = initializer_range
        self.use_cache = use_cache
        self.chunked_lm_loss = chunked_lm_loss
        self.preset = preset if preset is not None else "gpt2"
        if self.preset not in DECODER_PRESETS:
            raise ValueError(f"Unknown decoder preset={preset!r}; use one of {tuple(DECODER_PRESETS)}.")
        self.position_embedding_type = position_embedding_type
        self.rope_theta = rope_theta
        self.norm_type = norm_type
        self.mlp_type = mlp_type
        self.num_key_value_heads = num_key_value_heads
        self.attention_bias = attention_bias
        self.mlp_bias = mlp_bias
        self.qk_norm = qk_norm
        for alias, value in aliases.items():
            setattr(self, alias, value)  # attribute_map routes it to the canonical field
        for name, value in DECODER_PRESETS[self.preset].items():  # the preset fills what was left at None
            if getattr(self, name) is None:
                setattr(self, name, value)
        for name, choices in DECODER_CHOICES.items():
            if getattr(self, name) not in choices:
                raise ValueError(f"Unknown {name}={getattr(self, name)!r}; use one of {choices}.")
        if self.intermediate_size is None:
            self.intermediate_size = default_intermediate_size(self.hidden_size, self.mlp_type)
        super().__init__(
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            add_cross_attention=add_cross_attention,
            is_decoder=is_decoder,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )

    def check_values(self) -> None:
        """`_KilnConfig.check_values`, with the key/value heads of grouped-query attention."""
        super().check_values()
        if self.num_key_value_heads is not None:
            check_size("num_key_value_heads", self.num_key_value_heads)
            check_key_value_heads(self.num_attention_heads, self.num_key_value_heads)


class KilnEncoderDecoderConfig(EncoderDecoderConfig):
    r"""Configuration of [`KilnEncoderDecoderModel`]: transformers' `EncoderDecoderConfig` whose `encoder` and
    `decoder` are a [`KilnEncoderConfig`] and a [`KilnDecoderConfig`] (cross-attention on). Unlike the plain
    `EncoderDecoderConfig`, it builds both sub-configs from its own classes, so a saved folder loads with
    `trust_remote_code=True` where Kiln is not installed."""

    model_type = "kiln_encoder_decoder"
    sub_configs_defaults = {
        "encoder": SubConfigSpec(config_class=KilnEncoderConfig),
        "decoder": SubConfigSpec(
            config_class=KilnDecoderConfig, init_kwargs={"is_decoder": True, "add_cross_attention": True}
        ),
    }


__all__ = ["ENCODER_PRESETS", "KilnDecoderConfig", "KilnEncoderConfig", "KilnEncoderDecoderConfig"]

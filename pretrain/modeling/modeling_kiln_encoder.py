"""Kiln encoder: a BERT-style bidirectional transformer and its heads.

embeddings (token + position + segment -> LayerNorm -> dropout) -> N post-LN blocks
(x = LN(x + attn(x)); x = LN(x + mlp(x))) -> tanh pooler on the first token.
The `modernbert` preset (KilnEncoderConfig.preset) swaps pieces, each chosen once when the model is built:
rotary positions in the attention instead of a table, GeGLU feed-forward, pre-LN blocks (x = x + attn(LN(x));
x = x + mlp(LN(x))) with a final LayerNorm, no biases, local attention in two blocks of three, and a
dense + activation + LayerNorm transform in place of the tanh pooler.
Heads: pretraining (MLM + NSP/SOP), masked LM, next-sentence prediction, sequence classification, multiple
choice, token classification, extractive question answering: BERT's head family, same weights layout per head.
ELECTRA's discriminator and its joint pretraining model are built from these in `modeling_kiln_electra.py`.

Uploaded to the Hub next to the checkpoints (trust_remote_code): it imports only torch, transformers and
its sibling files (relative imports).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    NextSentencePredictorOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.modeling_utils import PreTrainedModel
from transformers.utils import ModelOutput

from .configuration_kiln import KilnEncoderConfig
from .kiln_layers import (
    ALL_ROWS,
    KilnDropout,
    KilnGatedMLP,
    KilnMLP,
    KilnSelfAttention,
    QueryRows,
    Unpadded,
    activation_module,
    auto_map_for,
    check_input_ids,
    check_kwargs,
    check_sequence_length,
)
from .kiln_losses import linear_cross_entropy, sequence_classification_loss
from .kiln_masks import bidirectional_mask, capturing, sliding_window_mask
from .kiln_positions import (
    KilnRotaryEmbedding,
    KilnSinusoidalPositions,
    position_table,
    rope_inverse_frequencies,
    rotary_positions,
    sinusoidal_table,
)

# Unpadding gathers and scatters the rows around every attention: it pays only with enough padding. Measured on a
# 2-core CPU (docs/performance.md): SST-2 fine-tuning batches, 67% padding, 1.55x faster; the default pretraining
# run's NSP batches, 4% padding, 0.83-0.90x (slower), so batches with less padding than this run padded.
UNPAD_MIN_PADDING = 0.1


def embedding_width(config: KilnEncoderConfig) -> int:
    """Width of the embeddings: `config.embedding_size`, or the hidden size when it is unset."""
    return getattr(config, "embedding_size", None) or config.hidden_size


class KilnEmbeddings(nn.Module):
    def __init__(self, config: KilnEncoderConfig):
        super().__init__()
        self.config = config
        width = embedding_width(config)
        self.word_embeddings = nn.Embedding(config.vocab_size, width, padding_idx=config.pad_token_id)
        # learned or sinusoidal: a table added here; rotary: nothing (the model's `rotary_emb` gives the angles)
        self.position_embeddings = position_table(
            config.position_embedding_type, config.max_position_embeddings, width
        )
        # type_vocab_size 0: no segment table, and token_type_ids (which BERT tokenizers make) are ignored, as
        # ModernBERT has none
        self.token_type_embeddings = (
            nn.Embedding(config.type_vocab_size, width) if config.type_vocab_size else None
        )
        self.layer_norm = nn.LayerNorm(width, eps=config.layer_norm_eps, bias=config.norm_bias)
        self.dropout = KilnDropout(config.hidden_dropout_prob)

    def forward(self, input_ids=None, token_type_ids=None, position_ids=None, inputs_embeds=None):
        if inputs_embeds is None:
            check_input_ids(input_ids, self.config.vocab_size)
            inputs_embeds = self.word_embeddings(input_ids)  # (B, T, C)
        T = inputs_embeds.shape[1]
        check_sequence_length(T, self.config.max_position_embeddings)
        if self.token_type_embeddings is None:
            x = inputs_embeds
        elif token_type_ids is None:  # all segment 0: add the row instead of gathering B*T copies of it
            x = inputs_embeds + self.token_type_embeddings.weight[0]
        else:
            x = inputs_embeds + self.token_type_embeddings(token_type_ids)
        x = self.position_embeddings.add(x, position_ids)
        return self.dropout(self.layer_norm(x))


MLP_CLASSES = {"mlp": KilnMLP, "glu": KilnGatedMLP}


def layer_norm(config: KilnEncoderConfig, width: int | None = None) -> nn.LayerNorm:
    return nn.LayerNorm(width or config.hidden_size, eps=config.layer_norm_eps, bias=config.norm_bias)


class KilnEncoderLayer(GradientCheckpointingLayer):
    """Post-LN block: x = LN(x + attn(x)); x = LN(x + mlp(x)), as in BERT."""

    def __init__(self, config: KilnEncoderConfig, layer_idx: int):
        super().__init__()
        self.attention_type = config.layer_types[layer_idx]  # which mask and rotary angles the model passes
        self.attention = KilnSelfAttention(
            config,
            config.hidden_size,
            config.num_attention_heads,
            config.attention_probs_dropout_prob,
            is_causal=False,
            layer_idx=layer_idx,
            bias=config.attention_bias,
        )
        self.attention_norm = layer_norm(config)
        mlp_class = MLP_CLASSES[config.mlp_type]
        self.mlp = mlp_class(
            config.hidden_size, config.intermediate_size, config.hidden_act, bias=config.mlp_bias
        )
        self.mlp_norm = layer_norm(config)
        self.dropout = KilnDropout(config.hidden_dropout_prob)

    def forward(
        self,
        hidden_states,
        attention_mask=None,
        output_attentions=False,
        rows=ALL_ROWS,
        position_embeddings=None,
    ):
        """rows: which rows to compute (`AllRows`, `Unpadded`: the real tokens only, (N, C) in and out, or
        `QueryRows`: (B, T, C) in, (B, P, C) out at the sparse MLM head's positions); attention still reads keys and
        values at every position. position_embeddings: the rotary (cos, sin) for the attention (see
        `KilnSelfAttention`), or None."""
        residual = rows.queries(hidden_states)  # hidden_states itself, or the rows at the query positions
        attention_output, attention_weights = self.attention(
            hidden_states,
            attention_mask,
            output_attentions=output_attentions,
            rows=rows,
            query_states=residual,
            position_embeddings=position_embeddings,
        )
        hidden_states = self.attention_norm(residual + self.dropout(attention_output))
        hidden_states = self.mlp_norm(hidden_states + self.dropout(self.mlp(hidden_states)))
        return hidden_states, attention_weights


class KilnPreNormEncoderLayer(KilnEncoderLayer):
    """Pre-LN block: x = x + attn(LN(x)); x = x + mlp(LN(x)), as in ModernBERT. The first block's attention reads
    the embeddings as they are (they end in a LayerNorm already): its `attention_norm` is an identity."""

    def __init__(self, config: KilnEncoderConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        if layer_idx == 0:
            self.attention_norm = nn.Identity()

    def forward(
        self,
        hidden_states,
        attention_mask=None,
        output_attentions=False,
        rows=ALL_ROWS,
        position_embeddings=None,
    ):
        """As `KilnEncoderLayer.forward`."""
        normed = self.attention_norm(hidden_states)
        residual, query_states = rows.queries(hidden_states), rows.queries(normed)
        attention_output, attention_weights = self.attention(
            normed,
            attention_mask,
            output_attentions=output_attentions,
            rows=rows,
            query_states=query_states,
            position_embeddings=position_embeddings,
        )
        hidden_states = residual + self.dropout(attention_output)
        hidden_states = hidden_states + self.dropout(self.mlp(self.mlp_norm(hidden_states)))
        return hidden_states, attention_weights


LAYER_CLASSES = {"post": KilnEncoderLayer, "pre": KilnPreNormEncoderLayer}


class KilnPooler(nn.Module):
    """BERT's pooler: dense + tanh on the first ([CLS]) token."""

    def __init__(self, config: KilnEncoderConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)

    def forward(self, hidden_states, attention_mask=None):
        return torch.tanh(self.dense(hidden_states[:, 0]))  # (B, C) from the first ([CLS]) token


def head_activation(config: KilnEncoderConfig) -> nn.Module:
    return activation_module(getattr(config, "classifier_activation", None) or config.hidden_act)


class KilnClassifierTransform(nn.Module):
    """dense + activation + LayerNorm before a classifier (ModernBERT's prediction head): on every token's state
    for the token heads, on the pooled state for the sequence heads (`KilnTransformPooler`)."""

    def __init__(self, config: KilnEncoderConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = head_activation(config)
        self.layer_norm = layer_norm(config)

    def forward(self, hidden_states):
        return self.layer_norm(self.act(self.dense(hidden_states)))


class KilnTransformPooler(KilnClassifierTransform):
    """The first token's state (`classifier_pooling: cls`) or the mean of the real tokens' (`mean`), through
    `KilnClassifierTransform`: what ModernBERT's sequence heads read."""

    def __init__(self, config: KilnEncoderConfig):
        super().__init__(config)
        self.pool = self.first_token if config.classifier_pooling == "cls" else self.mean

    @staticmethod
    def first_token(hidden_states, attention_mask):
        return hidden_states[:, 0]

    @staticmethod
    def mean(hidden_states, attention_mask):
        if attention_mask is None:
            return hidden_states.mean(1)
        weights = attention_mask[..., None].to(hidden_states.dtype)  # (B, T, 1)
        return (hidden_states * weights).sum(1) / weights.sum(1)

    def forward(self, hidden_states, attention_mask=None):
        return super().forward(self.pool(hidden_states, attention_mask))  # (B, C)


POOLER_CLASSES = {"tanh_pooler": KilnPooler, "transform": KilnTransformPooler}


def token_head(config: KilnEncoderConfig) -> nn.Module:
    """What token heads put between the encoder and their classifier: nothing (BERT) or the transform."""
    return KilnClassifierTransform(config) if config.classifier_head == "transform" else nn.Identity()


class KilnMLMHead(nn.Module):
    """dense + act + LayerNorm, then the vocabulary projection (weight tied to the input embeddings). With an
    `embedding_size` other than the hidden size, the dense layer maps to the embedding width (ELECTRA's
    generator head)."""

    def __init__(self, config: KilnEncoderConfig):
        super().__init__()
        width = embedding_width(config)
        self.dense = nn.Linear(config.hidden_size, width, bias=config.classifier_bias)
        self.act = head_activation(config)
        self.layer_norm = layer_norm(config, width)
        self.decoder = nn.Linear(width, config.vocab_size, bias=config.decoder_bias)

    def transform(self, hidden_states):
        return self.layer_norm(self.act(self.dense(hidden_states)))

    def forward(self, hidden_states):
        return self.decoder(self.transform(hidden_states))


class KilnEncoderPreTrainedModel(PreTrainedModel):
    """The base of every Kiln encoder class: its config class, weight initialisation (BERT's: normal with
    `initializer_range`, zero biases, unit LayerNorm), gradient checkpointing and the attention kernels it
    supports (`sdpa`, `eager`, `flex_attention`)."""

    config_class = KilnEncoderConfig
    config: KilnEncoderConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    # one block per unit: also FSDP's wrap units (configs/accelerate/fsdp.yaml names none). Not the embeddings:
    # their word table is tied to the MLM decoder, and a separate FSDP unit for it breaks the tie. Set by
    # KilnEncoderModel to the one block class it builds (accelerate refuses a named class the model lacks); the
    # heads gather it from that child in post_init
    _no_split_modules = None
    _supports_sdpa = True
    _supports_flex_attn = True  # masks from transformers.masking_utils (a BlockMask) for that kernel

    @torch.no_grad()
    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, KilnSinusoidalPositions):  # a buffer, not saved: rebuilt on load
            init.copy_(module.table, sinusoidal_table(*module.table.shape))
        elif isinstance(module, KilnRotaryEmbedding):  # a buffer, not saved: rebuilt on load
            init.copy_(module.inv_freq, rope_inverse_frequencies(module.head_dim, module.theta))

    def save_pretrained(self, save_directory, *args, **kwargs):
        # Registered for trust_remote_code: list every head in auto_map, not only the saved one
        if type(self)._auto_class is not None:
            self.config.auto_map = auto_map_for(self, ENCODER_AUTO_CLASSES)
        return super().save_pretrained(save_directory, *args, **kwargs)


class KilnEncoderModel(KilnEncoderPreTrainedModel):
    """The bare encoder: last hidden states (B, T, C) and the pooled first token (B, C)."""

    def __init__(self, config: KilnEncoderConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = KilnEmbeddings(config)
        width = embedding_width(config)
        # embeddings narrower or wider than the blocks (ELECTRA's generator): one linear map to the hidden size
        self.embeddings_project = (
            nn.Linear(width, config.hidden_size) if width != config.hidden_size else nn.Identity()
        )
        layer_class = LAYER_CLASSES[config.norm_position]
        self.layers = nn.ModuleList(layer_class(config, i) for i in range(config.num_hidden_layers))
        self._no_split_modules = [layer_class.__name__]
        # pre-LN blocks leave the residual stream unnormed: one LayerNorm after the last
        self.final_norm = layer_norm(config) if config.norm_position == "pre" else nn.Identity()
        # rotary: (cos, sin) per attention type, with the global blocks' base and the local blocks' (`rope_theta`,
        # `local_rope_theta`); here, not in the embeddings, which ELECTRA's generator shares at another head size
        thetas = {"full_attention": config.rope_theta, "sliding_attention": config.local_rope_theta}
        self.rotary_emb = rotary_positions(
            config.position_embedding_type,
            config.hidden_size // config.num_attention_heads,
            {kind: thetas[kind] for kind in sorted(set(config.layer_types))},
        )
        self.pooler = POOLER_CLASSES[config.classifier_head](config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def _unpads(self, attention_mask, output_hidden_states) -> bool:
        """Whether a padded batch may run unpadded (`config.unpad_inputs`): only right-padded batches (the pooler
        reads position 0, which must be a real token) with at least UNPAD_MIN_PADDING of padding, not when
        per-layer states are asked for, nor while tracing or compiling (the token count is data-dependent). Never
        without an `attention_mask` (flex attention builds a mask for a batch without one: there is no padding)."""
        return (
            attention_mask is not None
            and getattr(self.config, "unpad_inputs", False)
            and not output_hidden_states
            and not torch.jit.is_tracing()
            and not torch.compiler.is_compiling()
            and not torch.onnx.is_in_onnx_export()
            and bool(attention_mask[:, 0].all())
            and int(attention_mask.sum()) <= (1 - UNPAD_MIN_PADDING) * attention_mask.numel()
        )

    def _masks(self, hidden_states, attention_mask, query_positions) -> list:
        """Each block's attention mask, built once per forward: the padding mask (None | (B, 1, 1, T) | a BlockMask)
        for the global blocks, the window around each token and the padding ((1|B, 1, T, T)) for the local ones;
        a sparse last block (`query_positions`) that is local gets the window around each of its query positions,
        (B, 1, P, T)."""
        masks = {"full_attention": bidirectional_mask(self.config, hidden_states, attention_mask)}
        if "sliding_attention" in self.config.layer_types:
            masks["sliding_attention"] = sliding_window_mask(
                self.config, hidden_states, attention_mask, self.config.sliding_window
            )
        block_masks = [masks[layer.attention_type] for layer in self.layers]
        if (
            query_positions is not None
            and self.layers
            and self.layers[-1].attention_type == "sliding_attention"
        ):
            block_masks[-1] = sliding_window_mask(
                self.config, hidden_states, attention_mask, self.config.sliding_window, query_positions
            )
        return block_masks

    def _rows(self, attention_mask, query_positions, unpad, output_hidden_states) -> list:
        """Which rows each block computes, chosen once per forward: all of them (`ALL_ROWS`); the real tokens only
        (`Unpadded`) when the head allows it (`unpad`) and `_unpads` finds enough padding; and in the last block,
        given `query_positions`, only those rows (`QueryRows`, the sparse MLM heads')."""
        rows = (
            Unpadded(attention_mask)
            if unpad and self._unpads(attention_mask, output_hidden_states)
            else ALL_ROWS
        )
        block_rows = [rows] * len(self.layers)
        if query_positions is not None and block_rows:
            block_rows[-1] = QueryRows(query_positions)
        return block_rows

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        query_positions: torch.LongTensor | None = None,
        unpad: bool = False,
        **kwargs,  # transformers' shared arguments (Trainer's num_items_in_batch, ...); anything else raises
    ) -> BaseModelOutputWithPooling | tuple:
        r"""
        query_positions: (B, P) positions whose final states are needed (the MLM heads pass the labelled ones).
            The last block then computes only those rows (its keys and values still cover every position), and
            `last_hidden_state` (and the last `hidden_states` entry) is (B, P, C), in the order given. The pooler
            reads row 0: put position 0 first when `pooler_output` is used.
        unpad: when the batch has padding and `config.unpad_inputs` is on, run the blocks on the real tokens only
            (see `Unpadded`); `last_hidden_state` is then zero at the padded positions. The heads ask for it
            where nothing they return depends on the padded positions' states.
        """
        check_kwargs(self, kwargs)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        output_attentions = (
            output_attentions if output_attentions is not None else self.config.output_attentions
        )
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        return_dict = return_dict if return_dict is not None else self.config.return_dict

        hidden_states = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)  # (B, T, E)
        hidden_states = self.embeddings_project(hidden_states)  # (B, T, C)
        # chosen once per forward and handed to every block: its mask, the rows it computes, its rotary angles
        masks = self._masks(hidden_states, attention_mask, query_positions)
        rows = self._rows(attention_mask, query_positions, unpad, output_hidden_states)
        angles = self.rotary_emb.angles(hidden_states, position_ids)  # {type: (cos, sin)}; {}: a table
        all_hidden_states = (hidden_states,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        if query_positions is not None and not self.layers:  # no block to compute only those rows: take them
            hidden_states = QueryRows(query_positions).queries(hidden_states)
        layout = ALL_ROWS  # the rows hidden_states holds: (B, T, C)
        for layer, layer_rows, layer_mask in zip(self.layers, rows, masks):
            # into the block's own rows when they change: the real tokens (N, C), or (B, T, C) again
            if layer_rows is not layout:
                hidden_states, layout = layer_rows.unpad(layout.pad(hidden_states)), layer_rows
            hidden_states, attention_weights = layer(
                hidden_states,
                layer_mask,
                output_attentions=output_attentions,
                rows=layer_rows,
                position_embeddings=angles.get(layer.attention_type),
            )
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            if output_attentions:
                all_attentions += (attention_weights,)
        # unpadded: back to (B, T, C), zeros at the padding
        hidden_states = layout.pad(self.final_norm(hidden_states))

        output = BaseModelOutputWithPooling(
            last_hidden_state=hidden_states,
            pooler_output=self.pooler(hidden_states, attention_mask) if self.pooler is not None else None,
            hidden_states=all_hidden_states,
            attentions=all_attentions,
        )
        return output if return_dict else output.to_tuple()


@dataclass
class KilnEncoderForPreTrainingOutput(ModelOutput):
    """Output of [`KilnEncoderForPreTraining`].

    loss: mlm_loss + nsp_loss (either alone when only one kind of label is given).
    mlm_loss / nsp_loss: the two parts.
    prediction_logits: (B, T, V) without labels; with labels and `config.sparse_prediction`, (M, V) for the
        M positions where `labels != -100`, in the order of `labels.view(-1)`; None when training with
        `config.chunked_mlm_loss`.
    seq_relationship_logits: (B, 2) next-sentence (or sentence-order) logits.
    """

    loss: torch.Tensor | None = None
    mlm_loss: torch.Tensor | None = None
    nsp_loss: torch.Tensor | None = None
    prediction_logits: torch.Tensor | None = None
    seq_relationship_logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


class _MaskedLMMixin:
    """MLM logits and loss; with labels and `config.sparse_prediction`, only at the labelled positions."""

    def get_output_embeddings(self):
        return self.mlm_head.decoder

    def set_output_embeddings(self, new_embeddings):
        self.mlm_head.decoder = new_embeddings

    def _sparse_positions(self, labels, output_attentions, output_hidden_states):
        """(B, P) positions for `query_positions`, or None where the full last block is needed.

        Row b holds position 0 (for the pooler), then its labelled positions in order, then unlabelled ones
        as filler; P is the longest such list rounded up to a multiple of 8 (fewer distinct shapes to
        compile). Slots in row-major order then list the labelled positions in the order of `labels.view(-1)`.
        """
        config = self.config
        if labels is None or not config.sparse_prediction or capturing(labels):  # its width reads the labels
            return None
        if output_attentions or (output_attentions is None and config.output_attentions):
            return None  # the attention maps of the last block are wanted over every position
        if output_hidden_states or (output_hidden_states is None and config.output_hidden_states):
            return None
        pooler = getattr(self.model, "pooler", None)
        if (
            pooler is not None
            and config.classifier_head == "transform"
            and config.classifier_pooling == "mean"
        ):
            return None  # mean pooling reads every row of the last block; the head still runs on labelled rows only
        seq_len = labels.shape[1]
        needed = labels != -100
        needed[:, 0] = True
        width = int(needed.sum(1).max())  # one host sync; boolean indexing below needs one anyway
        width = min(seq_len, -(-width // 8) * 8)
        positions = torch.arange(seq_len, device=labels.device).expand_as(labels)
        order_key = torch.where(needed, positions, positions + seq_len)  # needed first, each group in order
        return order_key.argsort(dim=1)[:, :width]

    def _uses_chunked_loss(self) -> bool:
        """Training with `config.chunked_mlm_loss`: the loss never materialises the MLM logits."""
        decoder = self.mlm_head.decoder
        return (
            self.config.chunked_mlm_loss
            and self.training
            and torch.is_grad_enabled()
            and isinstance(decoder, nn.Linear)
        )

    def _mlm_logits_and_loss(self, sequence_output, labels, positions=None):
        """positions: the `query_positions` the encoder was run with (sequence_output is then (B, P, C))."""
        if labels is None:
            return self.mlm_head(sequence_output), None  # (B, T, V)
        if positions is not None:
            labels = labels.gather(1, positions)  # (B, P): the labels of the rows the encoder computed
        if self.config.sparse_prediction or self._uses_chunked_loss():
            flat_labels = labels.reshape(-1)  # (B*T,) or (B*P,)
            predicted = flat_labels != -100
            # Gather before the head: the transform and the vocab projection run on M << B*T rows
            hidden = sequence_output.reshape(-1, sequence_output.shape[-1])[predicted]  # (M, C)
            if self._uses_chunked_loss():
                decoder = self.mlm_head.decoder
                transformed = self.mlm_head.transform(hidden)
                return None, linear_cross_entropy(
                    transformed, decoder.weight, flat_labels[predicted], bias=decoder.bias
                )
            logits = self.mlm_head(hidden)  # (M, V)
            return logits, F.cross_entropy(logits, flat_labels[predicted])
        logits = self.mlm_head(sequence_output)  # (B, T, V)
        return logits, F.cross_entropy(
            logits.view(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100
        )


class KilnEncoderForPreTraining(_MaskedLMMixin, KilnEncoderPreTrainedModel):
    """Encoder + MLM head + NSP head (the NSP head also serves sentence-order prediction)."""

    _tied_weights_keys = {"mlm_head.decoder.weight": "model.embeddings.word_embeddings.weight"}

    def __init__(self, config: KilnEncoderConfig):
        super().__init__(config)
        self.model = KilnEncoderModel(config)
        self.mlm_head = KilnMLMHead(config)
        self.nsp_head = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        next_sentence_label: torch.LongTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> KilnEncoderForPreTrainingOutput | tuple:
        r"""
        labels: (B, T) token ids to predict, -100 where nothing is predicted.
        next_sentence_label: (B,) 0 = B follows A (or: in order), 1 = random B (or: swapped).
        """
        check_kwargs(self, kwargs)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        positions = self._sparse_positions(labels, output_attentions, output_hidden_states)
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            query_positions=positions,
            unpad=positions is not None,  # sparse prediction: only labelled rows are read
        )
        prediction_logits, mlm_loss = self._mlm_logits_and_loss(outputs.last_hidden_state, labels, positions)
        seq_relationship_logits = self.nsp_head(outputs.pooler_output)  # (B, 2)
        nsp_loss = None
        if next_sentence_label is not None:
            nsp_loss = F.cross_entropy(seq_relationship_logits, next_sentence_label.reshape(-1))
        losses = [loss for loss in (mlm_loss, nsp_loss) if loss is not None]
        output = KilnEncoderForPreTrainingOutput(
            loss=sum(losses) if losses else None,
            mlm_loss=mlm_loss,
            nsp_loss=nsp_loss,
            prediction_logits=prediction_logits,
            seq_relationship_logits=seq_relationship_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return output if return_dict else output.to_tuple()


class KilnEncoderForMaskedLM(_MaskedLMMixin, KilnEncoderPreTrainedModel):
    """Encoder + MLM head (fill-mask, MLM-only training)."""

    _tied_weights_keys = {"mlm_head.decoder.weight": "model.embeddings.word_embeddings.weight"}
    # a pretraining run's folder (ForPreTraining) also holds the NSP/SOP head and its pooler: loading its masked
    # LM leaves them out by design, not a fault for transformers' load report to list
    _keys_to_ignore_on_load_unexpected = [r"^nsp_head\.", r"^model\.pooler\."]

    def __init__(self, config: KilnEncoderConfig):
        super().__init__(config)
        self.model = KilnEncoderModel(config, add_pooling_layer=False)
        self.mlm_head = KilnMLMHead(config)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> MaskedLMOutput | tuple:
        r"""labels: (B, T), -100 where nothing is predicted. With labels and `config.sparse_prediction`,
        `logits` is (M, V) for the M labelled positions in the order of `labels.view(-1)`; else (B, T, V);
        None when training with `config.chunked_mlm_loss`."""
        check_kwargs(self, kwargs)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        positions = self._sparse_positions(labels, output_attentions, output_hidden_states)
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            query_positions=positions,
            unpad=positions is not None,  # sparse prediction: only labelled rows are read
        )
        logits, loss = self._mlm_logits_and_loss(outputs.last_hidden_state, labels, positions)
        output = MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return output if return_dict else output.to_tuple()


class KilnEncoderForSequenceClassification(KilnEncoderPreTrainedModel):
    """Encoder + dropout + linear classifier on the pooled output (BERT's problem_type rules)."""

    def __init__(self, config: KilnEncoderConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = KilnEncoderModel(config)
        dropout = (
            config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        )
        self.dropout = KilnDropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> SequenceClassifierOutput | tuple:
        r"""labels: (B,) class ids (single-label), (B, num_labels) floats (multi-label) or (B,) floats
        (regression, num_labels == 1); `config.problem_type` is inferred from them when unset, as in BERT."""
        check_kwargs(self, kwargs)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            unpad=True,
        )
        logits = self.classifier(self.dropout(outputs.pooler_output))  # (B, num_labels)
        loss = sequence_classification_loss(self.config, logits, labels) if labels is not None else None
        output = SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return output if return_dict else output.to_tuple()


class KilnEncoderForTokenClassification(KilnEncoderPreTrainedModel):
    """Encoder + dropout + linear classifier on every token (NER, POS)."""

    def __init__(self, config: KilnEncoderConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = KilnEncoderModel(config, add_pooling_layer=False)
        self.head = token_head(config)  # nothing (BERT) or dense + activation + LayerNorm (ModernBERT)
        dropout = (
            config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        )
        self.dropout = KilnDropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> TokenClassifierOutput | tuple:
        r"""labels: (B, T) class ids, -100 where no prediction is scored (padding, non-first word pieces)."""
        check_kwargs(self, kwargs)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            unpad=True,
        )
        logits = self.classifier(self.dropout(self.head(outputs.last_hidden_state)))  # (B, T, num_labels)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.view(-1, self.num_labels), labels.view(-1))
        output = TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return output if return_dict else output.to_tuple()


class KilnEncoderForNextSentencePrediction(KilnEncoderPreTrainedModel):
    """Encoder + the NSP head alone (BertForNextSentencePrediction): does segment B follow segment A?"""

    def __init__(self, config: KilnEncoderConfig):
        super().__init__(config)
        self.model = KilnEncoderModel(config)
        self.nsp_head = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> NextSentencePredictorOutput | tuple:
        r"""labels: (B,) 0 = B follows A, 1 = B is random. logits: (B, 2)."""
        check_kwargs(self, kwargs)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            unpad=True,
        )
        logits = self.nsp_head(outputs.pooler_output)  # (B, 2)
        loss = F.cross_entropy(logits, labels.view(-1).to(logits.device)) if labels is not None else None
        output = NextSentencePredictorOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return output if return_dict else output.to_tuple()


class KilnEncoderForMultipleChoice(KilnEncoderPreTrainedModel):
    """Encoder + dropout + one score per (context, choice) pair from the pooled output (SWAG, RACE)."""

    def __init__(self, config: KilnEncoderConfig):
        super().__init__(config)
        self.model = KilnEncoderModel(config)
        dropout = (
            config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        )
        self.dropout = KilnDropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> MultipleChoiceModelOutput | tuple:
        r"""Inputs are (B, num_choices, T) (`inputs_embeds` (B, num_choices, T, C)); labels: (B,) the index of
        the right choice. logits: (B, num_choices)."""
        check_kwargs(self, kwargs)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        reference = input_ids if input_ids is not None else inputs_embeds
        num_choices = reference.shape[1] if reference is not None else None

        def flat(tensor, dims=2):  # (B, num_choices, ...) -> (B * num_choices, ...)
            return tensor.reshape(-1, *tensor.shape[dims:]) if tensor is not None else None

        outputs = self.model(
            flat(input_ids),
            attention_mask=flat(attention_mask),
            token_type_ids=flat(token_type_ids),
            position_ids=flat(position_ids),
            inputs_embeds=flat(inputs_embeds),
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            unpad=True,
        )
        logits = self.classifier(self.dropout(outputs.pooler_output)).view(-1, num_choices)  # (B, choices)
        loss = F.cross_entropy(logits, labels.to(logits.device)) if labels is not None else None
        output = MultipleChoiceModelOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return output if return_dict else output.to_tuple()


class KilnEncoderForQuestionAnswering(KilnEncoderPreTrainedModel):
    """Encoder + a linear layer giving start and end logits per token (extractive QA, SQuAD)."""

    def __init__(self, config: KilnEncoderConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = KilnEncoderModel(config, add_pooling_layer=False)
        self.head = token_head(config)  # nothing (BERT) or dense + activation + LayerNorm (ModernBERT)
        self.qa_outputs = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.LongTensor | None = None,
        end_positions: torch.LongTensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> QuestionAnsweringModelOutput | tuple:
        r"""start_positions / end_positions: (B,) token indices of the answer span; positions outside the
        sequence are ignored (BERT's rule). start_logits / end_logits: (B, T)."""
        check_kwargs(self, kwargs)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        logits = self.qa_outputs(self.head(outputs.last_hidden_state))  # (B, T, num_labels)
        start_logits, end_logits = logits.split(1, dim=-1)
        start_logits, end_logits = start_logits.squeeze(-1).contiguous(), end_logits.squeeze(-1).contiguous()
        loss = None
        if start_positions is not None and end_positions is not None:
            ignored = start_logits.shape[1]  # clamped out-of-sequence positions are ignored
            start_positions = start_positions.reshape(-1).clamp(0, ignored).to(logits.device)
            end_positions = end_positions.reshape(-1).clamp(0, ignored).to(logits.device)
            loss = (
                F.cross_entropy(start_logits, start_positions, ignore_index=ignored)
                + F.cross_entropy(end_logits, end_positions, ignore_index=ignored)
            ) / 2
        output = QuestionAnsweringModelOutput(
            loss=loss,
            start_logits=start_logits,
            end_logits=end_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return output if return_dict else output.to_tuple()


# Auto class -> Kiln class: registered by `pretrain.modeling`, written into each saved checkpoint's auto_map
ENCODER_AUTO_CLASSES = {
    "AutoModel": KilnEncoderModel,
    "AutoModelForPreTraining": KilnEncoderForPreTraining,
    "AutoModelForMaskedLM": KilnEncoderForMaskedLM,
    "AutoModelForSequenceClassification": KilnEncoderForSequenceClassification,
    "AutoModelForTokenClassification": KilnEncoderForTokenClassification,
    "AutoModelForNextSentencePrediction": KilnEncoderForNextSentencePrediction,
    "AutoModelForMultipleChoice": KilnEncoderForMultipleChoice,
    "AutoModelForQuestionAnswering": KilnEncoderForQuestionAnswering,
}

__all__ = [
    "ENCODER_AUTO_CLASSES",
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
]

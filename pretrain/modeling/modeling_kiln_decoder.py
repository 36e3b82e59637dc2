"""Kiln decoder: a pre-norm causal transformer, its language-model head, and GPT-2's classification heads.

token (+ learned position) embeddings -> dropout -> N pre-norm blocks
(x = x + attn(norm(x)); [x = x + cross_attn(norm(x), encoder)]; x = x + mlp(norm(x)))
-> final norm -> LM head (tied to the token embeddings unless `tie_word_embeddings` is False).
Two presets of the same classes (`KilnDecoderConfig.preset`): `gpt2` (learned positions, GELU MLP, LayerNorm,
biases) and `llama` (rotary positions, SwiGLU, RMSNorm, grouped-query attention, no biases; transformers'
`LlamaForCausalLM` computes the same function). Each piece is chosen once when the model is built.
Packed rows (position ids that restart at each document) attend within their own document only.
KV cache through transformers' Cache classes, so `generate` (greedy, sampling, beam search) works; the
optional cross-attention lets the model be the decoder of transformers' `EncoderDecoderModel`.

Uploaded to the Hub next to the checkpoints (trust_remote_code): it imports only torch, transformers and
its sibling files (relative imports).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.generation import GenerationMixin
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPastAndCrossAttentions,
    CausalLMOutputWithCrossAttentions,
    SequenceClassifierOutputWithPast,
    TokenClassifierOutput,
)
from transformers.modeling_utils import PreTrainedModel

from .configuration_kiln import KilnDecoderConfig
from .kiln_layers import (
    CACHE_FIELD,
    KilnCrossAttention,
    KilnDropout,
    KilnGatedMLP,
    KilnMLP,
    KilnRMSNorm,
    KilnSelfAttention,
    auto_map_for,
    check_input_ids,
    check_kwargs,
    check_sequence_length,
    takes_cache,
)
from .kiln_losses import linear_cross_entropy, sequence_classification_loss
from .kiln_masks import bidirectional_mask, capturing, decoder_self_mask
from .kiln_positions import KilnRotaryEmbedding, position_table, rope_inverse_frequencies, rotary_positions


def make_norm(config: KilnDecoderConfig) -> nn.Module:
    """The block's norm, chosen by `config.norm_type`: LayerNorm with bias (GPT-2) or RMSNorm (Llama)."""
    if config.norm_type == "rmsnorm":
        return KilnRMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
    return nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)


def make_mlp(config: KilnDecoderConfig) -> nn.Module:
    """The block's feed-forward, chosen by `config.mlp_type`: GPT-2's MLP or a gated one (Llama's SwiGLU)."""
    mlp_class = KilnGatedMLP if config.mlp_type == "glu" else KilnMLP
    return mlp_class(
        config.hidden_size, config.intermediate_size, config.activation_function, bias=config.mlp_bias
    )


class KilnDecoderLayer(GradientCheckpointingLayer):
    """Pre-norm block: x = x + attn(norm(x)); [x = x + cross_attn(norm(x), encoder)]; x = x + mlp(norm(x)).
    The norm, the MLP and the attention's options (rotary, grouped-query, biases, QK-norm) come from the config,
    chosen here once."""

    # every block attends to every earlier token: which rotary angles it reads
    attention_type = "full_attention"

    def __init__(self, config: KilnDecoderConfig, layer_idx: int):
        super().__init__()
        h = config.hidden_size
        self.attention_norm = make_norm(config)
        self.attention = KilnSelfAttention(
            config,
            h,
            config.num_attention_heads,
            config.attn_pdrop,
            is_causal=True,
            layer_idx=layer_idx,
            num_key_value_heads=config.num_key_value_heads,
            bias=config.attention_bias,
            qk_norm_eps=config.layer_norm_epsilon if config.qk_norm else None,
        )
        if config.add_cross_attention:
            self.cross_attention_norm = make_norm(config)
            self.cross_attention = KilnCrossAttention(
                config,
                h,
                config.num_attention_heads,
                config.attn_pdrop,
                layer_idx=layer_idx,
                bias=config.attention_bias,
            )
        else:
            self.cross_attention = None
        self.mlp_norm = make_norm(config)
        self.mlp = make_mlp(config)
        self.dropout = KilnDropout(config.resid_pdrop)
        for projection in (self.attention.out, self.mlp.fc_out, getattr(self.cross_attention, "out", None)):
            if projection is not None:  # writes into the residual stream: GPT-2's scaled init (_init_weights)
                projection.is_residual_projection = True

    def forward(
        self,
        hidden_states,
        attention_mask=None,
        encoder_hidden_states=None,  # positional, so reentrant checkpointing sees it
        encoder_attention_mask=None,
        past_key_values=None,
        output_attentions=False,
        position_embeddings=None,
    ):
        attention_output, attention_weights = self.attention(
            self.attention_norm(hidden_states),
            attention_mask,
            past_key_values,
            output_attentions,
            position_embeddings=position_embeddings,
        )
        hidden_states = hidden_states + self.dropout(attention_output)
        cross_attention_weights = None
        if encoder_hidden_states is not None:
            if self.cross_attention is None:
                raise ValueError(
                    "encoder_hidden_states were passed but the decoder has no cross-attention; "
                    "build it with KilnDecoderConfig(add_cross_attention=True)."
                )
            cross_output, cross_attention_weights = self.cross_attention(
                self.cross_attention_norm(hidden_states),
                encoder_hidden_states,
                encoder_attention_mask,
                past_key_values,
                output_attentions,
            )
            hidden_states = hidden_states + self.dropout(cross_output)
        hidden_states = hidden_states + self.dropout(self.mlp(self.mlp_norm(hidden_states)))
        return hidden_states, attention_weights, cross_attention_weights


class KilnDecoderPreTrainedModel(PreTrainedModel):
    """The base of every Kiln decoder class: its config class, weight initialisation (GPT-2's: normal with
    `initializer_range`, residual projections scaled by 1/sqrt(2 x layers)), gradient checkpointing, the key/value cache and the attention kernels it supports
    (`sdpa`, `eager`, `flex_attention`)."""

    config_class = KilnDecoderConfig
    config: KilnDecoderConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["KilnDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values", "cache"]
    _supports_sdpa = True
    _supports_flex_attn = True  # masks from transformers.masking_utils (a BlockMask) for that kernel

    @torch.no_grad()
    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            if getattr(module, "is_residual_projection", False):
                # GPT-2: two residual writes per block, each scaled by 1/sqrt(2 * layers) to keep the
                # residual stream's variance flat with depth
                std = std / math.sqrt(2 * self.config.num_hidden_layers)
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, KilnRMSNorm):
            init.ones_(module.weight)
        elif isinstance(module, KilnRotaryEmbedding):  # a buffer, not saved: rebuilt when a model is loaded
            init.copy_(module.inv_freq, rope_inverse_frequencies(module.head_dim, module.theta))

    def save_pretrained(self, save_directory, *args, **kwargs):
        # Registered for trust_remote_code: list every head in auto_map, not only the saved one
        if type(self)._auto_class is not None:
            self.config.auto_map = auto_map_for(self, DECODER_AUTO_CLASSES)
        return super().save_pretrained(save_directory, *args, **kwargs)


class KilnDecoderModel(KilnDecoderPreTrainedModel):
    """The bare decoder: final-norm hidden states (B, T, C) and the KV cache. Positions are learned (a table added
    to the token embeddings, `position_embeddings`) or rotary (cos/sin computed once per forward and passed to
    every layer, `rotary_emb`), chosen here once (`config.position_embedding_type`; see `KilnPositions`)."""

    def __init__(self, config: KilnDecoderConfig):
        super().__init__(config)
        kind = config.position_embedding_type
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = position_table(kind, config.max_position_embeddings, config.hidden_size)
        head_size = config.hidden_size // config.num_attention_heads
        self.rotary_emb = rotary_positions(
            kind, head_size, {KilnDecoderLayer.attention_type: config.rope_theta}
        )
        self.dropout = KilnDropout(config.embd_pdrop)
        self.layers = nn.ModuleList(KilnDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = make_norm(config)
        self.gradient_checkpointing = False  # set by gradient_checkpointing_enable(); then no KV cache
        self.post_init()

    def get_input_embeddings(self):
        return self.word_embeddings

    def set_input_embeddings(self, value):
        self.word_embeddings = value

    @takes_cache
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        past_key_values=None,
        cache=None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,  # transformers' shared arguments (Trainer's num_items_in_batch, ...); anything else raises
    ) -> BaseModelOutputWithPastAndCrossAttentions | tuple:
        r"""
        past_key_values: a `DynamicCache` (`EncoderDecoderCache` with cross-attention) from a previous call;
            `input_ids` then holds only the new tokens and `attention_mask` covers past + new tokens.
        token_type_ids: (B, T) ids whose token embeddings are added to the inputs, as in GPT-2 (which has no
            separate segment table).
        """
        check_kwargs(self, kwargs)
        past_key_values = past_key_values if past_key_values is not None else cache
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        config = self.config
        output_attentions = output_attentions if output_attentions is not None else config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else config.output_hidden_states
        )
        return_dict = return_dict if return_dict is not None else config.return_dict
        if use_cache is None:  # a cache only pays off when generating
            use_cache = config.use_cache and not self.training
        if self.gradient_checkpointing and self.training:
            use_cache = False
        if use_cache:
            if past_key_values is None:
                past_key_values = DynamicCache()
            if config.add_cross_attention and not isinstance(past_key_values, EncoderDecoderCache):
                past_key_values = EncoderDecoderCache(past_key_values, DynamicCache())

        if inputs_embeds is None:
            check_input_ids(input_ids, config.vocab_size)
            inputs_embeds = self.word_embeddings(input_ids)  # (B, T, C)
        T = inputs_embeds.shape[1]
        past_length = past_key_values.get_seq_length() if past_key_values is not None else 0
        if position_ids is None and isinstance(
            past_length, torch.Tensor
        ):  # a static cache counts on the device
            position_ids = (torch.arange(T, device=inputs_embeds.device) + past_length)[None]  # (1, T)
        if position_ids is None:
            check_sequence_length(past_length + T, config.max_position_embeddings)
        elif position_ids.device.type == "cpu" and position_ids.numel() and not capturing(position_ids):
            check_sequence_length(int(position_ids.max()) + 1, config.max_position_embeddings)
        # GPT-2: the table's rows added to the embeddings; Llama: (cos, sin) for the attention
        hidden_states = self.position_embeddings.add(inputs_embeds, position_ids, past_length)
        position_embeddings = self.rotary_emb.angles(inputs_embeds, position_ids, past_length)
        if token_type_ids is not None:
            hidden_states = hidden_states + self.word_embeddings(token_type_ids)
        hidden_states = self.dropout(hidden_states)

        self_mask = decoder_self_mask(  # None | (B|1, 1, T, S) | a BlockMask (flex attention)
            config, hidden_states, attention_mask, past_key_values, position_ids, past_length
        )
        cross_mask = None
        if encoder_hidden_states is not None:
            cross_mask = bidirectional_mask(
                config, hidden_states, encoder_attention_mask, encoder_hidden_states
            )

        all_hidden_states = () if output_hidden_states else None
        all_attentions = () if output_attentions else None
        all_cross_attentions = () if output_attentions and encoder_hidden_states is not None else None
        for layer in self.layers:
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            hidden_states, attention_weights, cross_attention_weights = layer(
                hidden_states,
                self_mask,
                encoder_hidden_states,
                cross_mask,
                past_key_values=past_key_values,
                output_attentions=output_attentions,
                position_embeddings=position_embeddings.get(layer.attention_type),
            )
            if output_attentions:
                all_attentions += (attention_weights,)
                if all_cross_attentions is not None:
                    all_cross_attentions += (cross_attention_weights,)
        hidden_states = self.final_norm(hidden_states)
        if output_hidden_states:
            all_hidden_states += (hidden_states,)

        output = BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states,
            **{CACHE_FIELD: past_key_values if use_cache else None},
            hidden_states=all_hidden_states,
            attentions=all_attentions,
            cross_attentions=all_cross_attentions,
        )
        return output if return_dict else output.to_tuple()


class KilnDecoderForCausalLM(KilnDecoderPreTrainedModel, GenerationMixin):
    """Decoder + LM head tied to the token embeddings; `labels` are shifted inside, as in GPT2LMHeadModel."""

    _tied_weights_keys = {"lm_head.weight": "model.word_embeddings.weight"}

    def __init__(self, config: KilnDecoderConfig):
        super().__init__(config)
        self.model = KilnDecoderModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    def _uses_chunked_loss(self) -> bool:
        """Training with labels: nobody reads the logits, so the loss never materialises them."""
        head = self.lm_head
        return (
            self.config.chunked_lm_loss
            and self.training
            and torch.is_grad_enabled()
            and isinstance(head, nn.Linear)
            and head.bias is None
        )

    @takes_cache
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        past_key_values=None,
        cache=None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int = 0,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs,  # `shift_labels`, and transformers' shared arguments; anything else raises
    ) -> CausalLMOutputWithCrossAttentions | tuple:
        r"""
        labels: (B, T), usually `input_ids`; position t is scored against token t+1, -100 is ignored. When
            training with `config.chunked_lm_loss`, the loss comes from a chunked head and `logits` is None.
        logits_to_keep: if > 0, compute logits for the last `logits_to_keep` positions only (generation).
        shift_labels: (B, T) targets already shifted (position t is scored against `shift_labels[:, t]`), as
            sequence/context parallelism passes them; they replace the shift of `labels`, as in transformers.
            Taken through `**kwargs` as transformers' own models take it, so that `Trainer`'s label names (the
            forward parameters named "*label*") are `["labels"]`, as for GPT-2.
        num_items_in_batch: the loss is the sum over scored tokens divided by this (transformers' Trainer passes
            the number of target tokens of the whole accumulation window) instead of their mean.
        """
        shift_labels = kwargs.pop("shift_labels", None)
        check_kwargs(self, kwargs)
        past_key_values = past_key_values if past_key_values is not None else cache
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        has_targets = labels is not None or shift_labels is not None
        if has_targets and use_cache is None:
            use_cache = False
        outputs = self.model(
            input_ids,
            cache=past_key_values,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        hidden_states = outputs.last_hidden_state
        if logits_to_keep > 0:
            hidden_states = hidden_states[:, -logits_to_keep:]
        loss = logits = None
        if shift_labels is not None:
            targets = shift_labels.to(hidden_states.device)  # (B, T)
        elif labels is not None:
            # Shift the labels, not the logits: no copy of the (B, T, V) tensor
            targets = F.pad(labels, (0, 1), value=-100)[:, 1:].to(hidden_states.device)  # (B, T)
        if has_targets and logits_to_keep > 0:
            targets = targets[:, -logits_to_keep:]
        if has_targets and self._uses_chunked_loss():
            loss = linear_cross_entropy(hidden_states, self.lm_head.weight, targets)
        else:
            logits = self.lm_head(hidden_states)  # (B, T, V)
            if has_targets:
                loss = F.cross_entropy(
                    logits.float().view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100
                )
        if (
            loss is not None and num_items_in_batch is not None
        ):  # mean over the scored tokens -> their sum / N
            scored = (targets != -100).sum()
            loss = loss * scored.to(loss.dtype) / torch.as_tensor(num_items_in_batch, device=loss.device)
        output = CausalLMOutputWithCrossAttentions(
            loss=loss,
            logits=logits,
            **{CACHE_FIELD: getattr(outputs, CACHE_FIELD)},
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            cross_attentions=outputs.cross_attentions,
        )
        return output if return_dict else output.to_tuple()


class KilnDecoderForSequenceClassification(KilnDecoderPreTrainedModel):
    """Decoder + a bias-free linear score read at each sequence's last non-padding token (GPT-2's head: the
    rightmost token that is not `config.pad_token_id`, so left and right padding both work)."""

    def __init__(self, config: KilnDecoderConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = KilnDecoderModel(config)
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias=False)
        self.post_init()

    @takes_cache
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        past_key_values=None,
        cache=None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> SequenceClassifierOutputWithPast | tuple:
        r"""labels: (B,) class ids, (B, num_labels) floats (multi-label) or (B,) floats (regression); logits:
        (B, num_labels). A batch of more than one sequence needs `config.pad_token_id`."""
        check_kwargs(self, kwargs)
        past_key_values = past_key_values if past_key_values is not None else cache
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.model(
            input_ids,
            cache=past_key_values,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        logits = self.score(outputs.last_hidden_state)  # (B, T, num_labels)
        batch_size = logits.shape[0]
        pad_token_id = self.config.pad_token_id
        if pad_token_id is None and batch_size != 1:
            raise ValueError(
                "A batch of several sequences needs config.pad_token_id to find each one's last token; set it "
                "(e.g. model.config.pad_token_id = tokenizer.pad_token_id)."
            )
        if (
            pad_token_id is None or input_ids is None
        ):  # with inputs_embeds padding cannot be seen: read the end
            last_token = torch.full((batch_size,), -1, device=logits.device, dtype=torch.long)
        else:
            not_pad = (input_ids != pad_token_id).to(logits.device, torch.int32)
            positions = torch.arange(input_ids.shape[-1], device=logits.device, dtype=torch.int32)
            last_token = (positions * not_pad).argmax(-1)  # the rightmost non-padding token
        pooled_logits = logits[torch.arange(batch_size, device=logits.device), last_token]  # (B, num_labels)
        loss = (
            sequence_classification_loss(self.config, pooled_logits, labels) if labels is not None else None
        )
        output = SequenceClassifierOutputWithPast(
            loss=loss,
            logits=pooled_logits,
            **{CACHE_FIELD: getattr(outputs, CACHE_FIELD)},
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return output if return_dict else output.to_tuple()


class KilnDecoderForTokenClassification(KilnDecoderPreTrainedModel):
    """Decoder + dropout + linear classifier on every token (GPT-2's token-classification head)."""

    def __init__(self, config: KilnDecoderConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = KilnDecoderModel(config)
        dropout = getattr(config, "classifier_dropout", None)
        self.dropout = KilnDropout(dropout if dropout is not None else 0.1)  # GPT-2's default
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @takes_cache
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        past_key_values=None,
        cache=None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> TokenClassifierOutput | tuple:
        r"""labels: (B, T) class ids, -100 where nothing is scored. logits: (B, T, num_labels)."""
        check_kwargs(self, kwargs)
        past_key_values = past_key_values if past_key_values is not None else cache
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.model(
            input_ids,
            cache=past_key_values,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        logits = self.classifier(self.dropout(outputs.last_hidden_state))  # (B, T, num_labels)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.view(-1, self.num_labels), labels.view(-1).to(logits.device))
        output = TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return output if return_dict else output.to_tuple()


# Auto class -> Kiln class: registered by `pretrain.modeling`, written into each saved checkpoint's auto_map
DECODER_AUTO_CLASSES = {
    "AutoModel": KilnDecoderModel,
    "AutoModelForCausalLM": KilnDecoderForCausalLM,
    "AutoModelForPreTraining": KilnDecoderForCausalLM,
    "AutoModelForSequenceClassification": KilnDecoderForSequenceClassification,
    "AutoModelForTokenClassification": KilnDecoderForTokenClassification,
}

__all__ = [
    "DECODER_AUTO_CLASSES",
    "KilnDecoderForCausalLM",
    "KilnDecoderForSequenceClassification",
    "KilnDecoderForTokenClassification",
    "KilnDecoderModel",
    "KilnDecoderPreTrainedModel",
]

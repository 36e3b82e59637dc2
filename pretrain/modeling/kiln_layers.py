"""Pieces shared by the Kiln encoder and decoder: attention, feed-forward, masks, input checks.

Uploaded to the Hub next to the checkpoints (trust_remote_code): it imports only torch, transformers and
its sibling files (relative imports).

Masks are boolean (True = may attend) and `None` whenever the kernel can do without one: no padding in the
batch (encoder), or no padding and no cached prefix (decoder, which then uses SDPA's `is_causal`).
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.cache_utils import EncoderDecoderCache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,  # (B, nh, T, hs)
    key: torch.Tensor,  # (B, nh, S, hs)
    value: torch.Tensor,  # (B, nh, S, hs)
    attention_mask: torch.Tensor | None,  # bool, broadcastable to (B, nh, T, S)
    scaling: float,
    dropout: float = 0.0,
    is_causal: bool = False,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain softmax attention; returns the output as (B, T, nh, hs) and the probabilities (B, nh, T, S)."""
    query_length, key_length = query.shape[2], key.shape[2]
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling  # (B, nh, T, S)
    if attention_mask is None and is_causal and query_length > 1:
        attention_mask = torch.ones(query_length, key_length, dtype=torch.bool, device=query.device).tril(
            key_length - query_length
        )
    if attention_mask is not None:
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    probs = F.dropout(probs, p=dropout, training=module.training)
    output = torch.matmul(probs, value).transpose(1, 2)  # (B, T, nh, hs)
    return output, probs


def attend(module, query, key, value, attention_mask, is_causal, output_attentions):
    """Run the configured kernel (transformers' attention interface); eager when weights are wanted."""
    implementation = module.config._attn_implementation
    if output_attentions or implementation in (None, "eager"):
        attention_function = eager_attention_forward
    else:
        attention_function = ALL_ATTENTION_FUNCTIONS[implementation]
    output, weights = attention_function(
        module,
        query,
        key,
        value,
        attention_mask,
        dropout=module.dropout_p if module.training else 0.0,
        scaling=module.scaling,
        is_causal=is_causal,
    )
    batch_size, query_length = output.shape[:2]
    return output.reshape(batch_size, query_length, -1), weights  # (B, T, C)


class KilnSelfAttention(nn.Module):
    """Multi-head self-attention with one fused QKV projection; optional KV cache (decoder)."""

    def __init__(self, config, hidden_size, num_heads, dropout, is_causal, layer_idx):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_size = hidden_size // num_heads
        self.scaling = self.head_size**-0.5
        self.dropout_p = dropout
        self.is_causal = is_causal
        self.layer_idx = layer_idx
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.out = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden_states, attention_mask=None, past_key_values=None, output_attentions=False):
        B, T, C = hidden_states.shape
        qkv = self.qkv(hidden_states).view(B, T, 3, self.num_heads, self.head_size)
        query, key, value = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 x (B, nh, T, hs), views of one buffer
        if past_key_values is not None:
            cache = past_key_values
            if isinstance(cache, EncoderDecoderCache):
                cache = cache.self_attention_cache
            key, value = cache.update(key, value, self.layer_idx)  # (B, nh, S, hs), S = past + T
        output, weights = attend(self, query, key, value, attention_mask, self.is_causal, output_attentions)
        return self.out(output), weights


class KilnCrossAttention(nn.Module):
    """Multi-head attention from the decoder onto encoder states; keys/values are cached once per prompt."""

    def __init__(self, config, hidden_size, num_heads, dropout, layer_idx):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_size = hidden_size // num_heads
        self.scaling = self.head_size**-0.5
        self.dropout_p = dropout
        self.is_causal = False
        self.layer_idx = layer_idx
        self.q = nn.Linear(hidden_size, hidden_size)
        self.kv = nn.Linear(hidden_size, 2 * hidden_size)
        self.out = nn.Linear(hidden_size, hidden_size)

    def forward(
        self,
        hidden_states,
        encoder_hidden_states,
        attention_mask=None,
        past_key_values=None,
        output_attentions=False,
    ):
        B, T, C = hidden_states.shape
        query = self.q(hidden_states).view(B, T, self.num_heads, self.head_size)
        query = query.transpose(1, 2)  # (B, nh, T, hs)
        if past_key_values is not None and past_key_values.is_updated.get(self.layer_idx):
            cached = past_key_values.cross_attention_cache.layers[self.layer_idx]
            key, value = cached.keys, cached.values  # (B, nh, S, hs)
        else:
            kv = self.kv(encoder_hidden_states).view(*encoder_hidden_states.shape[:2], 2, self.num_heads, -1)
            key, value = kv.permute(2, 0, 3, 1, 4).unbind(0)  # 2 x (B, nh, S, hs)
            if past_key_values is not None:
                key, value = past_key_values.cross_attention_cache.update(key, value, self.layer_idx)
                past_key_values.is_updated[self.layer_idx] = True
        output, weights = attend(self, query, key, value, attention_mask, False, output_attentions)
        return self.out(output), weights


class KilnMLP(nn.Module):
    def __init__(self, hidden_size, intermediate_size, activation):
        super().__init__()
        self.fc_in = nn.Linear(hidden_size, intermediate_size)
        self.act = ACT2FN[activation]
        self.fc_out = nn.Linear(intermediate_size, hidden_size)

    def forward(self, hidden_states):
        return self.fc_out(self.act(self.fc_in(hidden_states)))


def padding_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, S) 0/1 mask -> None when nothing is padded, else (B, 1, 1, S) bool."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2:
        raise ValueError(
            f"attention_mask must be (batch, seq_len) of 0/1, got shape {tuple(attention_mask.shape)}; "
            "pass the tokenizer's 2-D attention_mask."
        )
    if bool(attention_mask.all()):
        return None
    mask = attention_mask[:, None, None, :].bool()
    return mask | ~mask.any(-1, keepdim=True)  # an all-padding row attends everywhere instead of giving NaN


def causal_mask(
    attention_mask: torch.Tensor | None, query_length: int, past_length: int, device
) -> torch.Tensor | None:
    """Causal (+ padding) mask over past + new keys: None if `is_causal` suffices, else (B|1, 1, T, S)."""
    key_length = past_length + query_length
    if attention_mask is not None:
        if attention_mask.dim() != 2 or attention_mask.shape[1] != key_length:
            raise ValueError(
                f"attention_mask must be (batch, past + new tokens) = (batch, {key_length}), got "
                f"{tuple(attention_mask.shape)}; extend it by one column per generated token."
            )
        if bool(attention_mask.all()):
            attention_mask = None
    if attention_mask is None and (past_length == 0 or query_length == 1):
        return None
    query_positions = torch.arange(past_length, key_length, device=device)
    mask = torch.arange(key_length, device=device)[None, :] <= query_positions[:, None]  # (T, S)
    mask = mask[None, None]  # (1, 1, T, S)
    if attention_mask is not None:
        mask = mask & attention_mask[:, None, None, :].bool()  # (B, 1, T, S)
        mask = mask | ~mask.any(-1, keepdim=True)  # left-padding rows see nothing: let them see all, not NaN
    return mask


def check_input_ids(input_ids: torch.Tensor, vocab_size: int) -> None:
    # Checked on CPU only: on accelerators the reduction would force a host sync every step
    if input_ids.device.type != "cpu" or input_ids.numel() == 0:
        return
    largest, smallest = int(input_ids.max()), int(input_ids.min())
    if largest >= vocab_size or smallest < 0:
        bad = largest if largest >= vocab_size else smallest
        raise ValueError(
            f"input_ids contain id {bad}, outside the model's vocabulary [0, {vocab_size}); the tokenizer "
            "and the model disagree: build the model with vocab_size >= len(tokenizer) or call "
            "model.resize_token_embeddings."
        )


def check_sequence_length(length: int, max_positions: int) -> None:
    if length > max_positions:
        raise ValueError(
            f"Sequence length {length} exceeds max_position_embeddings={max_positions}; truncate the inputs "
            f"(tokenizer truncation=True, max_length={max_positions}) or use a model with more positions."
        )


def auto_map_for(model, auto_classes: dict) -> dict:
    """`auto_map` entries for all Auto classes of a model family: one checkpoint loads into any head."""
    entries = {
        name: f"{model_class.__module__.split('.')[-1]}.{model_class.__name__}"
        for name, model_class in auto_classes.items()
    }
    config_class = type(model.config)
    entries["AutoConfig"] = f"{config_class.__module__.split('.')[-1]}.{config_class.__name__}"
    return {**(getattr(model.config, "auto_map", None) or {}), **entries}


__all__ = [
    "KilnCrossAttention",
    "KilnMLP",
    "KilnSelfAttention",
    "attend",
    "auto_map_for",
    "causal_mask",
    "check_input_ids",
    "check_sequence_length",
    "eager_attention_forward",
    "padding_mask",
]

"""Pieces shared by the Kiln encoder and decoder: attention, feed-forward, norms, dropout, input checks.

Uploaded to the Hub next to the checkpoints (trust_remote_code): it imports only torch, transformers and
its sibling files (relative imports). The masks the attention reads are built in `kiln_masks.py`, the positions
(and the rotary angles it rotates by) in `kiln_positions.py`, the heads' losses in `kiln_losses.py`.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.cache_utils import EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils.deprecation import deprecate_kwarg

from .configuration_kiln import check_heads, check_key_value_heads
from .kiln_masks import capturing
from .kiln_positions import rotate

try:  # model-agnostic keyword arguments transformers' own models take through `**kwargs`
    from transformers.utils.generic import TransformersKwargs

    PASSTHROUGH_KWARGS = frozenset(TransformersKwargs.__annotations__)
except ImportError:  # pragma: no cover - older transformers
    PASSTHROUGH_KWARGS = frozenset({"num_items_in_batch", "output_attentions", "output_hidden_states"})


# transformers 5.24 renamed the KV cache `past_key_values` -> `cache`, in forward arguments (generate passes `cache=`)
# and in output fields (generate reads `outputs.cache`); the old names stay as deprecated aliases until 5.40.
# Kiln's decoder takes both names and writes its outputs under the field this transformers has.
_OUTPUT_FIELDS = BaseModelOutputWithPastAndCrossAttentions.__dataclass_fields__
CACHE_FIELD = "cache" if "cache" in _OUTPUT_FIELDS else "past_key_values"


def takes_cache(forward):
    """A decoder forward that takes the KV cache as `cache` (and, on a transformers that renamed it, the old
    `past_key_values` with transformers' own deprecation warning, as its models do until 5.40)."""
    if CACHE_FIELD != "cache":
        return forward
    return deprecate_kwarg("past_key_values", version="5.40.0", new_name="cache")(forward)


def check_kwargs(model: nn.Module, kwargs: dict) -> None:
    """`forward(**kwargs)` takes what transformers' wrappers pass to every model (Trainer's `num_items_in_batch`,
    generate's and EncoderDecoderModel's shared arguments); anything else is a typo and an error, not ignored."""
    unknown = sorted(set(kwargs) - PASSTHROUGH_KWARGS)
    if unknown:
        raise TypeError(
            f"{type(model).__name__}.forward() got unexpected keyword argument(s) {', '.join(unknown)}; "
            f"check the spelling against the documented arguments of {type(model).__name__}.forward."
        )


class _CpuDropout(torch.autograd.Function):
    """Dropout whose mask costs one 64-bit draw per 4 elements (see `apply_dropout`)."""

    @staticmethod
    def forward(ctx, x, keep_threshold):
        draws = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_(-(2**63), 2**63 - 1)
        uniform16 = draws.view(torch.int16)[: x.numel()].view(x.shape)  # uniform over [-32768, 32767]
        keep = uniform16 < keep_threshold - 32768  # P(keep) = keep_threshold / 65536
        ctx.save_for_backward(keep)
        ctx.scale = 65536 / keep_threshold  # the exact inverse: E[output] = x
        return torch.mul(x, keep).mul_(ctx.scale)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        (keep,) = ctx.saved_tensors
        return torch.mul(grad_output, keep).mul_(ctx.scale), None


def apply_dropout(
    x: torch.Tensor, p: float, training: bool = True, fast_cpu_mask: bool = True
) -> torch.Tensor:
    """`F.dropout`, with a cheaper random mask on CPU.

    On CPU, torch draws one Mersenne Twister number per element for the mask, serially (~7 ns/element: a
    tenth of a small encoder's training step). Here four 16-bit uniforms come from each 64-bit draw, so the
    keep probability is rounded to a multiple of 1/65536 (0.9 -> 0.899994) and the scale is its exact inverse.
    The draws come from torch's default generator: `torch.manual_seed` and activation checkpointing (which
    restores the generator's state) see the same masks. Other devices use `F.dropout`.
    """
    if not training or p == 0.0:
        return x
    keep_threshold = round((1.0 - p) * 65536)
    if x.device.type != "cpu" or not fast_cpu_mask or keep_threshold == 0 or not 0 < p < 1:
        return F.dropout(x, p, training)
    return _CpuDropout.apply(x, keep_threshold)


class KilnDropout(nn.Dropout):
    """nn.Dropout through `apply_dropout` (a cheaper mask on CPU); `fast_cpu_mask = False` gives torch's."""

    fast_cpu_mask = True

    def forward(self, x):
        return apply_dropout(x, self.p, self.training, self.fast_cpu_mask)


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
    """Plain softmax attention; returns the output as (B, T, nh, hs) and the probabilities (B, nh, T, S). Keys and
    values with fewer heads (grouped-query attention) serve nh / their heads query heads each."""
    if key.shape[1] != query.shape[1]:  # (B, nkv, S, hs) -> (B, nh, S, hs), as transformers' repeat_kv
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    query_length, key_length = query.shape[2], key.shape[2]
    scores = torch.matmul(query * scaling, key.transpose(-1, -2))  # (B, nh, T, S); scale the smaller operand
    if attention_mask is None and is_causal and query_length > 1:  # SDPA's is_causal: aligned top-left
        attention_mask = torch.ones(query_length, key_length, dtype=torch.bool, device=query.device).tril()
    if attention_mask is not None and attention_mask.dtype != torch.bool:  # transformers' additive float mask
        scores = scores + attention_mask[..., :key_length]
    elif attention_mask is not None:
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        # a row that may attend to nothing attends to nothing (SDPA gives 0 too)
        probs = probs.masked_fill(~attention_mask.any(-1, keepdim=True), 0.0)
    probs = apply_dropout(probs, dropout, module.training, getattr(module, "fast_cpu_mask", True))
    output = torch.matmul(probs, value).transpose(1, 2)  # (B, T, nh, hs)
    return output, probs


def attend(module, query, key, value, attention_mask, is_causal, output_attentions):
    """Run the configured kernel (transformers' attention interface); eager when weights are wanted.

    Training on CPU with attention dropout also runs eager: SDPA has no fused CPU kernel with dropout (it
    falls back to the same math), and eager gets the cheaper dropout mask.
    """
    implementation = module.config._attn_implementation
    cpu_dropout = module.training and module.dropout_p > 0 and query.device.type == "cpu"
    own_masks = implementation in (None, "eager", "sdpa")  # other kernels get their masks from transformers
    if output_attentions and not own_masks:
        raise ValueError(
            f"output_attentions=True needs attn_implementation 'eager' or 'sdpa', not {implementation!r}; "
            "load the model with attn_implementation='eager' to read attention weights."
        )
    if (
        output_attentions
        or implementation in (None, "eager")
        or (cpu_dropout and module.fast_cpu_mask and own_masks)
    ):
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


class AllRows:
    """Which rows of its input a block computes, chosen once per forward by the model and handed to every block
    (`KilnEncoderModel._rows`); this class: all of them, the input and output (B, T, C) (the default, and the
    decoder's only kind). The other kinds, `Unpadded` and `QueryRows`, change only what these four methods do:

    - `unpad` / `pad`: a (B, T, ...) tensor into the block's own layout of rows, and back;
    - `queries`: the rows of a tensor the block computes outputs for (the residual it adds to, the attention's
      query states);
    - `project`: the attention's queries (of the query states), keys and values (of every row), (B, heads, ., hs).
    """

    def unpad(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def pad(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def queries(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def project(
        self, attention: "KilnSelfAttention", query_states: torch.Tensor, hidden_states: torch.Tensor
    ):
        # every row is a query (query_states is hidden_states): one matmul, one buffer
        return attention.split_heads(self.pad(attention.qkv(hidden_states)))


ALL_ROWS = AllRows()


class Unpadded(AllRows):
    """The real tokens of a right- or left-padded (B, T) batch only: `unpad` keeps their rows of a (B, T, ...)
    tensor as (N, ...), `pad` puts (N, ...) rows back into (B, T, ...) with zeros at the padding. Every
    position-wise layer (projections, MLP, LayerNorm, dropout) then runs on the N real tokens only, and only the
    attention itself sees the (B, T) layout (zeros at the padding, which the mask hides)."""

    def __init__(self, attention_mask: torch.Tensor):
        self.batch_size, self.seq_len = attention_mask.shape
        self.indices = attention_mask.reshape(-1).nonzero().squeeze(1)  # (N,)

    def unpad(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.reshape(self.batch_size * self.seq_len, *tensor.shape[2:]).index_select(0, self.indices)

    def pad(self, tensor: torch.Tensor) -> torch.Tensor:
        full = tensor.new_zeros(self.batch_size * self.seq_len, *tensor.shape[1:])
        return full.index_copy(0, self.indices, tensor).view(self.batch_size, self.seq_len, *tensor.shape[1:])


class QueryRows(AllRows):
    """Outputs at (B, P) positions only (the sparse MLM heads' labelled rows, in the last block): the input is
    (B, T, C), the output (B, P, C); keys and values still come from every row. The queries are projected from their
    own rows and the keys and values from all (`KilnSelfAttention.project_queries`), so no FLOP goes to a query
    nobody reads."""

    def __init__(self, positions: torch.Tensor):
        self.positions = positions  # (B, P)

    def queries(self, tensor: torch.Tensor) -> torch.Tensor:
        """(B|1, T, X) -> (B, P, X): the rows at the positions (angles (1, T, hs) serve every batch row)."""
        index = self.positions[..., None].expand(-1, -1, tensor.shape[-1])
        return tensor.expand(self.positions.shape[0], -1, -1).gather(1, index)

    def project(
        self, attention: "KilnSelfAttention", query_states: torch.Tensor, hidden_states: torch.Tensor
    ):
        return attention.project_queries(query_states, hidden_states)


class KilnSelfAttention(nn.Module):
    """Multi-head self-attention with one fused QKV projection; optional KV cache (decoder); rotary positions
    when the model passes `position_embeddings` (see `KilnRotaryPositions`).

    Options, each chosen once here: `num_key_value_heads` fewer than `num_heads` (grouped-query attention: the
    fused projection holds nh query heads, then nkv key and nkv value heads), `bias`, `qk_norm_eps` (an RMSNorm
    over each query and key head before the rotation, as Qwen3's; else `nn.Identity`)."""

    def __init__(
        self,
        config,
        hidden_size,
        num_heads,
        dropout,
        is_causal,
        layer_idx,
        bias=True,
        num_key_value_heads=None,
        qk_norm_eps=None,
    ):
        super().__init__()
        check_heads(hidden_size, num_heads)
        num_key_value_heads = num_key_value_heads or num_heads
        check_key_value_heads(num_heads, num_key_value_heads)
        self.config = config
        self.num_heads = num_heads
        self.num_key_value_heads = num_key_value_heads
        self.num_key_value_groups = num_heads // num_key_value_heads  # read by transformers' sdpa for GQA
        self.head_size = hidden_size // num_heads
        self.scaling = self.head_size**-0.5
        self.dropout_p = dropout
        self.fast_cpu_mask = True  # see `apply_dropout`
        self.is_causal = is_causal
        self.layer_idx = layer_idx
        self.split_sizes = [num_heads, num_key_value_heads, num_key_value_heads]
        self.qkv = nn.Linear(hidden_size, (num_heads + 2 * num_key_value_heads) * self.head_size, bias=bias)
        self.out = nn.Linear(hidden_size, hidden_size, bias=bias)
        with_norm = qk_norm_eps is not None
        self.q_norm = KilnRMSNorm(self.head_size, eps=qk_norm_eps) if with_norm else nn.Identity()
        self.k_norm = KilnRMSNorm(self.head_size, eps=qk_norm_eps) if with_norm else nn.Identity()

    def split_heads(self, qkv: torch.Tensor):
        """(B, T, (nh + 2 nkv) hs) -> query (B, nh, T, hs), key and value (B, nkv, T, hs): views of one buffer."""
        B, T = qkv.shape[:2]
        qkv = qkv.view(B, T, -1, self.head_size).transpose(1, 2)  # (B, nh + 2 nkv, T, hs)
        return qkv.split(self.split_sizes, dim=1)

    def project_queries(self, query_states: torch.Tensor, hidden_states: torch.Tensor):
        """Queries of the (B, P, C) `query_states` alone, keys and values of every row of `hidden_states` (B, T, C):
        the fused weight's two parts, one matmul each."""
        query_width = self.num_heads * self.head_size
        q_weight, kv_weight = self.qkv.weight.split([query_width, self.qkv.out_features - query_width])
        bias = self.qkv.bias
        q_bias, kv_bias = (
            (None, None) if bias is None else bias.split([query_width, bias.shape[0] - query_width])
        )
        (B, P), T = query_states.shape[:2], hidden_states.shape[1]
        query = F.linear(query_states, q_weight, q_bias).view(B, P, self.num_heads, -1).transpose(1, 2)
        kv = F.linear(hidden_states, kv_weight, kv_bias).view(B, T, -1, self.head_size).transpose(1, 2)
        key, value = kv.chunk(2, dim=1)  # 2 x (B, nkv, T, hs)
        return query, key, value

    def forward(
        self,
        hidden_states,
        attention_mask=None,
        past_key_values=None,
        output_attentions=False,
        rows=ALL_ROWS,
        query_states=None,
        position_embeddings=None,
    ):
        """rows: which rows of `hidden_states` to compute outputs for (`AllRows`: (B, T, C) in and out; `Unpadded`:
        (N, C) real tokens in and out; `QueryRows`: (B, T, C) in, (B, P, C) out). query_states: those rows of
        `hidden_states` (`rows.queries(hidden_states)`, which the block may already hold).

        position_embeddings: rotary (cos, sin) of the keys' positions, (B|1, T, hs) each (`KilnRotaryPositions`),
        or None (positions are added to the embeddings instead); the queries take the rows `rows` computes."""
        query_states = rows.queries(hidden_states) if query_states is None else query_states
        # query (B, nh, T|P, hs), key and value (B, nkv, T, hs)
        query, key, value = rows.project(self, query_states, hidden_states)
        query, key = self.q_norm(query), self.k_norm(key)
        if position_embeddings is not None:
            cos, sin = position_embeddings
            query, key = rotate(query, rows.queries(cos), rows.queries(sin)), rotate(key, cos, sin)
        if past_key_values is not None:
            cache = past_key_values
            if isinstance(cache, EncoderDecoderCache):
                cache = cache.self_attention_cache
            key, value = cache.update(key, value, self.layer_idx)  # (B, nkv, S, hs), S = past + T
        output, weights = attend(self, query, key, value, attention_mask, self.is_causal, output_attentions)
        return self.out(rows.unpad(output)), weights


class KilnCrossAttention(nn.Module):
    """Multi-head attention from the decoder onto encoder states; keys/values are cached once per prompt."""

    def __init__(self, config, hidden_size, num_heads, dropout, layer_idx, bias=True):
        super().__init__()
        check_heads(hidden_size, num_heads)
        self.config = config
        self.num_heads = num_heads
        self.head_size = hidden_size // num_heads
        self.scaling = self.head_size**-0.5
        self.dropout_p = dropout
        self.fast_cpu_mask = True  # see `apply_dropout`
        self.is_causal = False
        self.layer_idx = layer_idx
        self.q = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.kv = nn.Linear(hidden_size, 2 * hidden_size, bias=bias)
        self.out = nn.Linear(hidden_size, hidden_size, bias=bias)

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


def activation_module(name: str) -> nn.Module:
    """transformers' activation `name`; GPT-2's `gelu_new` as torch's fused tanh GELU (same formula), which
    transformers runs as eight separate tensor ops."""
    return nn.GELU(approximate="tanh") if name == "gelu_new" else ACT2FN[name]


class KilnMLP(nn.Module):
    """fc_in -> activation -> fc_out (BERT's and GPT-2's feed-forward)."""

    def __init__(self, hidden_size, intermediate_size, activation, bias=True):
        super().__init__()
        self.fc_in = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.act = activation_module(activation)
        self.fc_out = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, hidden_states):
        return self.fc_out(self.act(self.fc_in(hidden_states)))


class KilnGatedMLP(nn.Module):
    """Gated feed-forward (SwiGLU with `silu`, GeGLU with `gelu`): fc_out(act(gate) * up), as Llama's MLP and
    ModernBERT's; the gate and up projections are one fused Linear `gate_up` (h -> 2 x intermediate: gate rows
    first, then up rows), one matmul instead of two."""

    def __init__(self, hidden_size, intermediate_size, activation, bias=False):
        super().__init__()
        self.gate_up = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias)
        self.act = activation_module(activation)
        self.fc_out = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, hidden_states):
        gate, up = self.gate_up(hidden_states).chunk(2, dim=-1)  # 2 x (..., I)
        return self.fc_out(self.act(gate) * up)


class KilnRMSNorm(nn.Module):
    """Root-mean-square norm (Llama's, T5's): x / sqrt(mean(x^2) + eps) * weight, computed in float32 and cast
    back before the weight, as `LlamaRMSNorm` does (so converted models give the same numbers)."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.eps)
        return self.weight * hidden_states.to(input_dtype)

    def extra_repr(self):
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


def check_input_ids(input_ids: torch.Tensor, vocab_size: int) -> None:
    # Checked on CPU only (on accelerators the reduction would force a host sync every step) and in eager mode
    # only (a captured graph cannot branch on the ids' values; see `capturing`)
    if input_ids.device.type != "cpu" or input_ids.numel() == 0 or capturing(input_ids):
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
    "ALL_ROWS",
    "AllRows",
    "KilnCrossAttention",
    "KilnDropout",
    "KilnGatedMLP",
    "KilnMLP",
    "KilnRMSNorm",
    "KilnSelfAttention",
    "QueryRows",
    "Unpadded",
    "activation_module",
    "apply_dropout",
    "attend",
    "auto_map_for",
    "check_input_ids",
    "check_kwargs",
    "check_sequence_length",
    "eager_attention_forward",
]

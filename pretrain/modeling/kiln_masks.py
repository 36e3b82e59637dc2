"""Attention masks for the Kiln encoder and decoder, built once per forward and handed to every layer.

Uploaded to the Hub next to the checkpoints (trust_remote_code): it imports only torch and transformers.

Masks are boolean (True = may attend) and `None` whenever the kernel can do without one: no padding in the
batch (encoder), or no padding and no cached prefix (decoder, which then uses SDPA's `is_causal`). A query row
whose mask is all False (an all-padding sequence in the encoder or in cross-attention) gets a zero attention
output from both kernels, as SDPA gives and transformers' BERT/GPT-2 return: padded tokens never leak into it.
Kernels other than SDPA and eager (flex attention's `BlockMask`, ...), and caches whose keys are not simply past +
new tokens, get their masks from `transformers.masking_utils` instead (`uses_transformers_masks`).
"""

import inspect

import torch
import torch.nn.functional as F
from transformers.masking_utils import (
    create_bidirectional_mask,
    create_bidirectional_sliding_window_mask,
    create_causal_mask,
)


def capturing(tensor: torch.Tensor | None = None) -> bool:
    """Whether a graph is being captured (torch.compile, torch.export, the ONNX exporters, torch.jit/fx tracing,
    fake tensors): then nothing may branch on tensor values, so the eager-mode checks and shortcuts that read
    them (`check_input_ids`, dropping an all-ones mask) are left out and the graph keeps the general path."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
        return True
    return isinstance(tensor, (torch.fx.Proxy, torch._subclasses.FakeTensor))


def padding_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, S) 0/1 mask -> None when nothing is padded, else (B, 1, 1, S) bool (an all-padding row stays all
    False: its queries attend to nothing and get a zero attention output). While a graph is captured the mask
    is kept whatever it holds (see `capturing`)."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2:
        raise ValueError(
            f"attention_mask must be (batch, seq_len) of 0/1, got shape {tuple(attention_mask.shape)}; "
            "pass the tokenizer's 2-D attention_mask."
        )
    if not capturing(attention_mask) and bool(attention_mask.all()):
        return None
    return attention_mask[:, None, None, :].bool()


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
        if not capturing(attention_mask) and bool(attention_mask.all()):
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


_MASK_BUILDER_PARAMETERS = {
    builder: frozenset(inspect.signature(builder).parameters)
    for builder in (create_causal_mask, create_bidirectional_mask, create_bidirectional_sliding_window_mask)
}


def _transformers_mask(builder, **kwargs):
    """Call a `transformers.masking_utils` builder with the argument names of the installed transformers (the
    cache argument was renamed `past_key_values` -> `cache`; older releases also take `cache_position`)."""
    parameters = _MASK_BUILDER_PARAMETERS[builder]
    if "cache" in kwargs and "cache" not in parameters:
        kwargs["past_key_values"] = kwargs.pop("cache")
    if "input_embeds" in parameters:
        kwargs["input_embeds"] = kwargs.pop("inputs_embeds")
    return builder(**{name: value for name, value in kwargs.items() if name in parameters})


def uses_transformers_masks(config, cache=None) -> bool:
    """Whether masks come from `transformers.masking_utils` rather than Kiln's own builders: for kernels that take
    another mask format (flex attention's `BlockMask`, and any other registered kernel), and for caches whose keys
    are not simply past + new tokens (a static cache's fixed length, a sliding window)."""
    if config._attn_implementation not in (None, "eager", "sdpa"):
        return True
    return cache is not None and (
        bool(getattr(cache, "is_compileable", False)) or any(getattr(cache, "is_sliding", None) or ())
    )


def packed_documents(position_ids: torch.Tensor | None, batch_size: int) -> torch.Tensor | None:
    """(B, T) document ids of rows that pack several documents, told by their position ids: a document starts
    wherever a position is not its predecessor + 1 ([0 1 2 0 1] holds two), as transformers'
    `find_packed_sequence_indices` reads them. None when no row restarts (outside graph capture, where the check
    cannot read values and the ids are always returned)."""
    if position_ids is None or position_ids.dim() != 2 or position_ids.shape[1] < 2:
        return None
    position_ids = position_ids.expand(batch_size, -1)
    starts = position_ids[:, 1:] != position_ids[:, :-1] + 1  # (B, T-1)
    if not capturing(position_ids) and not bool(starts.any()):
        return None
    return F.pad(starts, (1, 0), value=False).cumsum(-1)  # (B, T): 0 for the first document of each row


def document_mask(mask: torch.Tensor | None, documents: torch.Tensor, query_length: int) -> torch.Tensor:
    """A causal (+ padding) mask (B|1, 1, T, T), or None for plain causal, restricted to pairs of tokens of the
    same document: block-diagonal within each row. (B, 1, T, T) bool."""
    if mask is None:
        mask = torch.ones(query_length, query_length, dtype=torch.bool, device=documents.device).tril()[
            None, None
        ]
    same_document = documents[:, None, :, None] == documents[:, None, None, :]  # (B, 1, T, T)
    mask = mask & same_document
    return mask | ~mask.any(-1, keepdim=True)  # a row that sees nothing (padding) sees all, not NaN


def decoder_self_mask(config, inputs_embeds, attention_mask, cache, position_ids, past_length):
    """The decoder's self-attention mask: a prepared 4-D mask (as `generate` builds for a static cache) as given;
    Kiln's `causal_mask` for a 2-D mask with no cache or a growing one; else transformers' `create_causal_mask`
    (static and sliding caches, flex attention).

    Packed rows attend within their own document only, read where transformers reads them: from position ids
    that restart at each document, given *without* a padding mask and with nothing cached yet (as Kiln's CLM
    collator sends packed blocks: their padding is at the end, which no real token sees under a causal mask).
    With a padding mask, position ids are positions only: `generate` and transformers' own tests derive them from
    a mask with holes (`[0 1 1 2 3]`), and those rows are one sequence. Kiln's mask gets the block-diagonal
    restriction; for the other kernels transformers' builder reads the same documents. (transformers also asks
    for no cache object, where Kiln asks for nothing cached: a model in eval mode builds an empty cache, and its
    packed evaluation batches stay masked apart.)"""
    if attention_mask is not None and (
        not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() == 4
    ):
        return attention_mask
    nothing_cached = isinstance(past_length, int) and past_length == 0
    packed = attention_mask is None and nothing_cached
    documents = packed_documents(position_ids, inputs_embeds.shape[0]) if packed else None
    if not uses_transformers_masks(config, cache):
        mask = causal_mask(attention_mask, inputs_embeds.shape[1], past_length, inputs_embeds.device)
        return mask if documents is None else document_mask(mask, documents, inputs_embeds.shape[1])
    if position_ids is None:
        position_ids = (torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_length)[None]
    return _transformers_mask(
        create_causal_mask,
        config=config,
        inputs_embeds=inputs_embeds,
        attention_mask=attention_mask,
        cache=cache,
        position_ids=position_ids,
        cache_position=position_ids[0],
    )


def bidirectional_mask(config, inputs_embeds, attention_mask, encoder_hidden_states=None):
    """A padding mask over the keys (the encoder's self-attention; cross-attention onto `encoder_hidden_states`):
    Kiln's `padding_mask` for SDPA and eager, transformers' `create_bidirectional_mask` for other kernels."""
    if not uses_transformers_masks(config):
        return padding_mask(attention_mask)
    return _transformers_mask(
        create_bidirectional_mask,
        config=config,
        inputs_embeds=inputs_embeds,
        attention_mask=attention_mask,
        encoder_hidden_states=encoder_hidden_states,
    )


def sliding_window_mask(
    config, inputs_embeds, attention_mask, window: int, query_positions: torch.Tensor | None = None
) -> torch.Tensor | None:
    """A local block's mask: a query attends to the keys at most `window` positions away, and not to padding
    (ModernBERT's local attention, transformers' `create_bidirectional_sliding_window_mask`). Returns the
    padding mask alone when the sequence fits in the window, else (B|1, 1, T, S) bool; with `query_positions`
    (B, P), only those queries' rows, (B, 1, P, S). Other kernels than SDPA/eager get transformers' mask."""
    key_length = inputs_embeds.shape[1]
    padding = bidirectional_mask(config, inputs_embeds, attention_mask)
    if uses_transformers_masks(config):
        if key_length - 1 <= window:
            return padding
        return _transformers_mask(
            create_bidirectional_sliding_window_mask,
            config=config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
        )
    if key_length - 1 <= window and query_positions is None:
        return padding
    keys = torch.arange(key_length, device=inputs_embeds.device)
    queries = keys[None] if query_positions is None else query_positions  # (1|B, P)
    mask = ((queries[..., None] - keys).abs() <= window)[:, None]  # (1|B, 1, P, S)
    return mask if padding is None else mask & padding


__all__ = [
    "bidirectional_mask",
    "capturing",
    "causal_mask",
    "decoder_self_mask",
    "document_mask",
    "packed_documents",
    "padding_mask",
    "sliding_window_mask",
    "uses_transformers_masks",
]

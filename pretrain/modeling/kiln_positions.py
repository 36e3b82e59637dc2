"""Positions for the Kiln encoder and decoder: learned, sinusoidal and rotary, as modules with one interface.

Every kind has the interface of `KilnPositions`: `add` puts a table's rows onto the token embeddings, `angles` gives
the attention the (cos, sin) it rotates queries and keys by (`apply_rotary_pos_emb`, as transformers' Llama and
ModernBERT). A model holds two of them, built once from `position_embedding_type`: `position_embeddings`, whose
`add` it calls on the token embeddings (`position_table`), and `rotary_emb`, whose `angles` it hands to the layers
(`rotary_positions`); the kind it was not given is a `KilnPositions()`, which adds nothing and gives no angles, so
the encoder and the decoder make the same two calls without asking which kind they hold.

Uploaded to the Hub next to the checkpoints (trust_remote_code): it imports only torch.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


def rope_inverse_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """RoPE's inverse frequencies theta^(-2i/d), i = 0 .. d/2 - 1 (float32), as transformers' default rope."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


class KilnRotaryEmbedding(nn.Module):
    """Rotary position embedding: the (cos, sin) of every position, computed once per forward from the position
    ids and shared by every layer. `inv_freq` is a buffer rebuilt on load (not saved). head_dim must be even."""

    def __init__(self, head_dim: int, theta: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(
                f"Rotary positions need an even head size, got {head_dim}; change hidden_size or heads."
            )
        self.head_dim, self.theta = head_dim, theta
        self.register_buffer("inv_freq", rope_inverse_frequencies(head_dim, theta), persistent=False)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids (B|1, T) -> cos, sin (B|1, T, head_dim) in x's dtype (computed in float32)."""
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float32)
        emb = torch.cat((freqs, freqs), dim=-1)  # (B|1, T, hs)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    def extra_repr(self):
        return f"head_dim={self.head_dim}, theta={self.theta}"


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """One tensor (B, nh, T, hs) rotated by its own angles (cos/sin (B|1, T, hs))."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (x * cos) + (rotate_half(x) * sin)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim: int = 1):
    """Rotate queries and keys (B, nh, T, hs) by their positions' angles; cos/sin (B|1, T, hs) are unsqueezed at
    `unsqueeze_dim` (1 for the (B, nh, T, hs) layout, 2 for (B, T, nh, hs))."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def sinusoidal_table(num_positions: int, dim: int) -> torch.Tensor:
    """(num_positions, dim) table: PE[pos, 2i] = sin(pos / 10000^(2i/dim)), PE[pos, 2i+1] = cos(same)."""
    position = torch.arange(num_positions, dtype=torch.float32)[:, None]  # (P, 1)
    exponents = torch.arange(0, dim, 2, dtype=torch.float32) / dim  # (ceil(dim/2),)
    inv_freq = torch.exp(-math.log(10000.0) * exponents)
    table = torch.zeros(num_positions, dim)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq[: dim // 2])
    return table


class KilnPositions(nn.Module):
    """The interface of a model's positions, the same for the encoder and the decoder, each called once per forward;
    an instance of this class itself is the kind a model does not have (as `nn.Identity` is a layer it does not
    have):

    - `add(embeddings, position_ids, past_length)`: the embeddings (B, T, C) with each position's row of a table
      added (learned, sinusoidal), or as they are (rotary);
    - `angles(hidden_states, position_ids, past_length)`: {attention type: (cos, sin)}, (B|1, T, hs) each, that the
      attention rotates queries and keys by (rotary), or {} (a table): a layer reads its type's entry.

    position_ids: (B|1, T), or None for the positions past_length .. past_length + T - 1 (past_length: the tokens a
    KV cache already holds). Each kind does one of the two; the other is this class's no-op."""

    def add(self, embeddings: torch.Tensor, position_ids=None, past_length=0) -> torch.Tensor:
        return embeddings

    def angles(self, hidden_states: torch.Tensor, position_ids=None, past_length=0) -> dict:
        return {}


def _table_rows(table: torch.Tensor, position_ids, past_length, length: int) -> torch.Tensor:
    """The rows of a (P, C) table for a batch's positions: a slice (T, C), broadcast over the batch, when the
    positions run from past_length on (no gather of B*T copies), else (B|1, T, C) gathered."""
    if position_ids is None:
        return table[past_length : past_length + length]
    return F.embedding(position_ids, table)


class KilnLearnedPositions(nn.Embedding, KilnPositions):
    """A trained table of positions, one row per position up to `max_position_embeddings` (BERT's, GPT-2's); its
    weight is the `position_embeddings.weight` of their checkpoints."""

    def add(self, embeddings, position_ids=None, past_length=0):
        return embeddings + _table_rows(self.weight, position_ids, past_length, embeddings.shape[1])


class KilnSinusoidalPositions(KilnPositions):
    """The fixed sin/cos table of "Attention Is All You Need" (`sinusoidal_table`): a buffer rebuilt on load, not
    saved."""

    def __init__(self, num_positions: int, dim: int):
        super().__init__()
        self.register_buffer("table", sinusoidal_table(num_positions, dim), persistent=False)

    def add(self, embeddings, position_ids=None, past_length=0):
        return embeddings + _table_rows(self.table, position_ids, past_length, embeddings.shape[1])


class KilnRotaryPositions(KilnPositions):
    """Rotary positions (RoFormer; Llama's, ModernBERT's): no table, the embeddings stay as they are, and the angles
    of each attention type come from its own base (`thetas`: ModernBERT's global and local blocks rotate with
    160,000 and 10,000)."""

    def __init__(self, head_dim: int, thetas: dict[str, float]):
        super().__init__()
        self.rotary = nn.ModuleDict(
            {kind: KilnRotaryEmbedding(head_dim, theta) for kind, theta in thetas.items()}
        )

    def angles(self, hidden_states, position_ids=None, past_length=0):
        if position_ids is None:
            position_ids = (torch.arange(hidden_states.shape[1], device=hidden_states.device) + past_length)[
                None
            ]
        return {kind: rotary(hidden_states, position_ids) for kind, rotary in self.rotary.items()}


def position_table(kind: str, num_positions: int, width: int) -> KilnPositions:
    """What a model adds to its token embeddings for `position_embedding_type` `kind`: a learned or a sinusoidal
    (num_positions, width) table, or nothing (rotary)."""
    if kind == "learned":
        return KilnLearnedPositions(num_positions, width)
    if kind == "sinusoidal":
        return KilnSinusoidalPositions(num_positions, width)
    return KilnPositions()


def rotary_positions(kind: str, head_dim: int, thetas: dict[str, float]) -> KilnPositions:
    """The angles a model's attention rotates by for `position_embedding_type` `kind`: rotary angles of head_dim
    per attention type (`thetas`: {attention type: rotary base}), or none (a table)."""
    return KilnRotaryPositions(head_dim, thetas) if kind == "rotary" else KilnPositions()


__all__ = [
    "KilnLearnedPositions",
    "KilnPositions",
    "KilnRotaryEmbedding",
    "KilnRotaryPositions",
    "KilnSinusoidalPositions",
    "apply_rotary_pos_emb",
    "position_table",
    "rope_inverse_frequencies",
    "rotary_positions",
    "rotate",
    "rotate_half",
    "sinusoidal_table",
]

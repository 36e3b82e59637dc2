"""The shared modern block pieces (kiln_layers, kiln_positions) equal transformers' ModernBERT ones: its rotary
module at both thetas, `apply_rotary_pos_emb`, its GeGLU MLP; the self-attention without biases."""

import pytest
import torch
from transformers import ModernBertConfig
from transformers.models.modernbert import modeling_modernbert as reference

from pretrain.modeling.kiln_layers import KilnGatedMLP, KilnSelfAttention
from pretrain.modeling.kiln_positions import KilnRotaryEmbedding, apply_rotary_pos_emb


@pytest.mark.parametrize(
    "layer_type, theta", [("full_attention", 160_000.0), ("sliding_attention", 10_000.0)]
)
def test_rotary_equals_transformers(layer_type, theta):
    config = ModernBertConfig(
        hidden_size=48, num_attention_heads=3, num_hidden_layers=3, max_position_embeddings=64
    )
    theirs = reference.ModernBertRotaryEmbedding(config)
    ours = KilnRotaryEmbedding(16, theta)
    torch.manual_seed(0)
    x = torch.randn(2, 5, 48)
    position_ids = torch.tensor([[0, 1, 2, 3, 63], [7, 8, 9, 10, 11]])
    cos, sin = ours(x, position_ids)
    their_cos, their_sin = theirs(x, position_ids, layer_type)
    assert torch.equal(cos, their_cos) and torch.equal(sin, their_sin)
    query, key = torch.randn(2, 3, 5, 16), torch.randn(2, 3, 5, 16)
    for mine, expected in zip(
        apply_rotary_pos_emb(query, key, cos, sin), reference.apply_rotary_pos_emb(query, key, cos, sin)
    ):
        torch.testing.assert_close(mine, expected, rtol=0, atol=1e-6)


def test_rotation_keeps_relative_positions():
    """RoPE's point: a query-key product depends on the positions' difference only."""
    rotary = KilnRotaryEmbedding(8, 10_000.0)
    torch.manual_seed(0)
    query, key = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(query_position, key_position):
        cos, sin = rotary(query, torch.tensor([[query_position, key_position]]))
        rotated_query, _ = apply_rotary_pos_emb(query, query, cos[:, :1], sin[:, :1])
        _, rotated_key = apply_rotary_pos_emb(key, key, cos[:, 1:], sin[:, 1:])
        return float((rotated_query * rotated_key).sum())

    assert score(3, 1) == pytest.approx(score(12, 10), abs=1e-5)
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-3)


def test_gated_mlp_equals_modernbert_mlp():
    config = ModernBertConfig(hidden_size=16, intermediate_size=24, num_attention_heads=2, mlp_bias=False)
    theirs = reference.ModernBertMLP(config).eval()
    ours = KilnGatedMLP(16, 24, "gelu", bias=False)
    ours.load_state_dict({"gate_up.weight": theirs.Wi.weight, "fc_out.weight": theirs.Wo.weight})
    x = torch.randn(3, 4, 16)
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=1e-6)


def test_attention_without_biases_has_none():
    config = ModernBertConfig()
    attention = KilnSelfAttention(config, 32, 4, 0.0, is_causal=False, layer_idx=0, bias=False)
    assert attention.qkv.bias is None and attention.out.bias is None
    assert {name for name, _ in attention.named_parameters()} == {"qkv.weight", "out.weight"}

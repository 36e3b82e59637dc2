"""The pieces of kiln_layers and kiln_positions shared by the encoder and decoder presets (rotary positions, RMSNorm,
gated MLP) compute what transformers' Llama pieces compute, weight for weight."""

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama import modeling_llama

from pretrain.modeling.kiln_layers import KilnGatedMLP, KilnRMSNorm
from pretrain.modeling.kiln_positions import KilnRotaryEmbedding, apply_rotary_pos_emb


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_equals_llama(dtype):
    torch.manual_seed(0)
    theirs = modeling_llama.LlamaRMSNorm(24, eps=1e-5)
    ours = KilnRMSNorm(24, eps=1e-5)
    with torch.no_grad():
        theirs.weight.normal_()
        ours.weight.copy_(theirs.weight)
    x = (torch.randn(2, 5, 24) * 3).to(dtype)
    torch.testing.assert_close(ours.to(dtype)(x), theirs.to(dtype)(x), rtol=0, atol=0)


@pytest.mark.parametrize("theta", [10000.0, 500000.0])
def test_rotary_embedding_equals_llama(theta):
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64, num_attention_heads=4, rope_parameters={"rope_type": "default", "rope_theta": theta}
    )
    theirs = modeling_llama.LlamaRotaryEmbedding(config)
    ours = KilnRotaryEmbedding(head_dim=16, theta=theta)
    torch.testing.assert_close(ours.inv_freq, theirs.inv_freq, rtol=0, atol=0)
    x = torch.randn(2, 9, 64)
    position_ids = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8], [1, 1, 1, 0, 1, 2, 3, 4, 4000]])
    cos, sin = ours(x, position_ids)
    their_cos, their_sin = theirs(x, position_ids)
    torch.testing.assert_close(cos, their_cos, rtol=0, atol=0)
    torch.testing.assert_close(sin, their_sin, rtol=0, atol=0)
    q, k = torch.randn(2, 4, 9, 16), torch.randn(2, 2, 9, 16)
    for got, want in zip(
        apply_rotary_pos_emb(q, k, cos, sin), modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    ):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_rotary_embedding_rebuilt_by_position_not_stored():
    rotary = KilnRotaryEmbedding(head_dim=8)
    assert "inv_freq" not in rotary.state_dict()  # a buffer rebuilt on load, as transformers' rope
    with pytest.raises(ValueError, match="even head size"):
        KilnRotaryEmbedding(head_dim=7)


@pytest.mark.parametrize("bias", [False, True])
def test_gated_mlp_equals_llama(bias):
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=16, num_attention_heads=2, intermediate_size=40, hidden_act="silu", mlp_bias=bias
    )
    theirs = modeling_llama.LlamaMLP(config)
    ours = KilnGatedMLP(16, 40, "silu", bias=bias)
    with torch.no_grad():
        ours.gate_up.weight.copy_(torch.cat([theirs.gate_proj.weight, theirs.up_proj.weight]))
        ours.fc_out.weight.copy_(theirs.down_proj.weight)
        if bias:
            ours.gate_up.bias.copy_(torch.cat([theirs.gate_proj.bias, theirs.up_proj.bias]))
            ours.fc_out.bias.copy_(theirs.down_proj.bias)
    assert (ours.gate_up.bias is None) == (not bias)
    x = torch.randn(3, 7, 16)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-6, atol=1e-6)

"""Kiln decoder: causal LM loss, KV cache, generate, attention kernels, checkpointing, seq2seq, errors."""

import warnings

import pytest
import torch
import torch.nn.functional as F
import transformers
from kiln_testing import assert_checkpointing_keeps_gradients, tiny_decoder_config, tiny_encoder_config
from transformers import DynamicCache, EncoderDecoderModel

from pretrain.modeling import (
    KilnDecoderConfig,
    KilnDecoderForCausalLM,
    KilnDecoderModel,
    KilnEncoderForPreTraining,
    KilnEncoderModel,
)
from pretrain.modeling.kiln_layers import CACHE_FIELD

# transformers 5.24 renamed the cache argument `past_key_values` -> `cache` (the old name goes in 5.40): Kiln and
# these tests pass it under the name the installed transformers takes, so its deprecation warning is an error here
pytestmark = pytest.mark.filterwarnings("error:`past_key_values` is deprecated:FutureWarning")

VOCAB = 211
PAD, BOS, EOS = 0, 1, 2


def make_config(**overrides) -> KilnDecoderConfig:
    return tiny_decoder_config(
        **{"vocab_size": VOCAB, "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD, **overrides}
    )


def left_padded_prompts(seed=0):
    """Three prompts of length 7, 5 and 7, left-padded as for generation."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, VOCAB, (3, 7), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :2] = 0
    input_ids[attention_mask == 0] = PAD
    return input_ids, attention_mask


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# --------------------------------------------------------------------------------------------- config & input
def test_config_accepts_gpt2_names_and_exposes_generic_ones():
    config = KilnDecoderConfig(
        n_embd=64, n_layer=3, n_head=8, n_positions=99, hidden_act="gelu", layer_norm_eps=1e-6
    )
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (64, 3, 8)
    assert (config.max_position_embeddings, config.n_positions, config.n_embd) == (99, 99, 64)
    assert config.intermediate_size == 4 * 64 and config.activation_function == "gelu"
    assert config.layer_norm_epsilon == 1e-6 and config.tie_word_embeddings and config.is_decoder
    encoder_names = KilnDecoderConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.05)
    assert (encoder_names.resid_pdrop, encoder_names.embd_pdrop, encoder_names.attn_pdrop) == (0.0, 0.0, 0.05)
    assert KilnDecoderConfig().activation_function == "gelu_new"
    with pytest.raises(ValueError, match="hidden_size=64 is not divisible by num_attention_heads=6"):
        KilnDecoderForCausalLM(KilnDecoderConfig(hidden_size=64, num_attention_heads=6, num_hidden_layers=1))


def test_bad_input_gives_clear_errors(tmp_path):
    model = KilnDecoderForCausalLM(make_config()).eval()
    with pytest.raises(ValueError, match="Sequence length 49 exceeds max_position_embeddings=48"):
        model(torch.ones(1, 49, dtype=torch.long))
    cache = getattr(model(torch.ones(1, 40, dtype=torch.long), use_cache=True), CACHE_FIELD)
    with pytest.raises(ValueError, match="Sequence length 49 exceeds max_position_embeddings=48"):
        model(torch.ones(1, 9, dtype=torch.long), **{CACHE_FIELD: cache})
    with pytest.raises(ValueError, match=f"id {VOCAB},.*resize_token_embeddings"):
        model(torch.tensor([[3, VOCAB]]))
    with pytest.raises(ValueError, match="no cross-attention.*add_cross_attention=True"):
        model(torch.ones(1, 3, dtype=torch.long), encoder_hidden_states=torch.zeros(1, 4, 32))
    with pytest.raises(ValueError, match=r"attention_mask must be \(batch, past \+ new tokens\)"):
        model(torch.ones(1, 3, dtype=torch.long), attention_mask=torch.ones(1, 4, dtype=torch.long))
    model.save_pretrained(tmp_path / "decoder")
    with pytest.raises(
        ValueError, match="`kiln_decoder` model, but KilnEncoderConfig expects `kiln_encoder`.*KilnDecoder"
    ):
        KilnEncoderForPreTraining.from_pretrained(tmp_path / "decoder")
    gpt2 = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4, n_positions=48)
    transformers.GPT2LMHeadModel(gpt2).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match="`gpt2` model.*python -m pretrain.convert"):
        KilnDecoderForCausalLM.from_pretrained(tmp_path / "gpt2")


# -------------------------------------------------------------------------------------------------- the model
def test_loss_is_next_token_cross_entropy_with_ignored_positions():
    model = KilnDecoderForCausalLM(make_config()).eval()
    input_ids, _ = left_padded_prompts()
    labels = input_ids.clone()
    labels[:, :2] = -100
    out = model(input_ids, labels=labels)
    expected = F.cross_entropy(out.logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, expected)
    assert getattr(out, CACHE_FIELD) is None  # no cache when training with labels


def test_lm_head_is_tied_and_residual_projections_get_gpt2_scaled_init():
    config = make_config(num_hidden_layers=8, hidden_size=128, num_attention_heads=4)
    model = KilnDecoderForCausalLM(config)
    assert model.lm_head.weight is model.model.word_embeddings.weight
    expected_scaled_std = config.initializer_range / (2 * config.num_hidden_layers) ** 0.5
    residual = torch.cat([layer.mlp.fc_out.weight.flatten() for layer in model.model.layers])
    plain = torch.cat([layer.mlp.fc_in.weight.flatten() for layer in model.model.layers])
    assert residual.std().item() == pytest.approx(expected_scaled_std, rel=0.1)
    assert plain.std().item() == pytest.approx(config.initializer_range, rel=0.1)


def test_cached_decoding_matches_the_full_forward_with_left_padding():
    model = KilnDecoderForCausalLM(make_config()).eval()
    input_ids, attention_mask = left_padded_prompts()
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    full = model(input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    # prefill 4 tokens, then a chunk of 2 (cached prefix + several new tokens), then 1
    cache, logits = DynamicCache(), []
    for start, end in ((0, 4), (4, 6), (6, 7)):
        out = model(
            input_ids[:, start:end],
            attention_mask=attention_mask[:, :end],
            position_ids=position_ids[:, start:end],
            **{CACHE_FIELD: cache},
            use_cache=True,
        )
        cache = getattr(out, CACHE_FIELD)
        logits.append(out.logits)
    real = attention_mask.bool()
    torch.testing.assert_close(torch.cat(logits, 1)[real], full[real], atol=1e-5, rtol=1e-5)
    assert cache.get_seq_length() == 7


def test_eager_and_sdpa_agree_with_padding_and_with_cache():
    sdpa = KilnDecoderForCausalLM(make_config(attn_implementation="sdpa")).eval()
    eager = KilnDecoderForCausalLM(make_config(attn_implementation="eager")).eval()
    eager.load_state_dict(sdpa.state_dict())
    input_ids, attention_mask = left_padded_prompts()
    real = attention_mask.bool()
    for mask in (None, attention_mask):
        a, b = sdpa(input_ids, attention_mask=mask).logits, eager(input_ids, attention_mask=mask).logits
        torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=1e-5)
    prefix_a = getattr(sdpa(input_ids[:, :5], use_cache=True), CACHE_FIELD)
    prefix_b = getattr(eager(input_ids[:, :5], use_cache=True), CACHE_FIELD)
    a = sdpa(input_ids[:, 5:], **{CACHE_FIELD: prefix_a}).logits
    b = eager(input_ids[:, 5:], **{CACHE_FIELD: prefix_b}).logits
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    attentions = eager(input_ids, output_attentions=True).attentions
    assert attentions[0].shape == (3, 4, 7, 7)
    assert torch.triu(attentions[0], diagonal=1).abs().max() == 0  # causal


def test_gradient_checkpointing_gives_the_same_gradients():
    model = KilnDecoderForCausalLM(make_config()).train()
    input_ids, attention_mask = left_padded_prompts()
    assert_checkpointing_keeps_gradients(
        model, lambda: model(input_ids, attention_mask=attention_mask, labels=input_ids).loss
    )


@pytest.mark.parametrize(
    "settings",
    [
        dict(do_sample=False),
        dict(do_sample=False, num_beams=3),
        dict(do_sample=True, top_k=20, temperature=1.5),
    ],
    ids=["greedy", "beam", "sampling"],
)
def test_generate_gives_the_same_tokens_with_and_without_cache(settings):
    model = KilnDecoderForCausalLM(make_config()).eval()
    input_ids, attention_mask = left_padded_prompts()
    outputs = []
    for use_cache in (True, False):
        torch.manual_seed(123)
        outputs.append(
            model.generate(
                input_ids,
                attention_mask=attention_mask,
                max_new_tokens=8,
                min_new_tokens=8,
                use_cache=use_cache,
                pad_token_id=PAD,
                **settings,
            )
        )
    assert outputs[0].shape == (3, 15)
    assert torch.equal(outputs[0], outputs[1])


def test_auto_causal_lm_round_trip(tmp_path):
    model = KilnDecoderForCausalLM(make_config()).eval()
    model.save_pretrained(tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is KilnDecoderForCausalLM
    assert reloaded.lm_head.weight is reloaded.model.word_embeddings.weight
    input_ids, attention_mask = left_padded_prompts()
    torch.testing.assert_close(reloaded(input_ids).logits, model(input_ids).logits)
    assert type(transformers.AutoModel.from_pretrained(tmp_path)) is KilnDecoderModel


# ---------------------------------------------------------------------------------------- EncoderDecoderModel
def make_seq2seq():
    encoder_config = tiny_encoder_config(vocab_size=97, max_position_embeddings=32)
    decoder_config = make_config(add_cross_attention=True, is_decoder=True)
    model = EncoderDecoderModel(
        encoder=KilnEncoderModel(encoder_config), decoder=KilnDecoderForCausalLM(decoder_config)
    )
    model.config.decoder_start_token_id = BOS
    model.config.pad_token_id = PAD
    model.config.eos_token_id = EOS
    return model


def test_encoder_decoder_model_trains_beam_searches_and_reloads(tmp_path):
    model = make_seq2seq()
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(3, 97, (2, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 6:] = 0
    labels = torch.randint(3, VOCAB, (2, 6), generator=generator)

    # one training step reaches both halves, the cross-attention included, and lowers the loss
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with warnings.catch_warnings():
        # EncoderDecoderModel warns that it computes the loss itself (that warning only: the cache's is an error)
        warnings.filterwarnings("ignore", message="Version v4.12.0 introduces", category=FutureWarning)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        cross = model.decoder.model.layers[0].cross_attention
        assert cross.kv.weight.grad.abs().sum() > 0
        assert model.encoder.layers[0].attention.qkv.weight.grad.abs().sum() > 0
        optimizer.step()
        optimizer.zero_grad()
        assert model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss < loss

    model.eval()
    beams = [
        model.generate(
            input_ids, attention_mask=attention_mask, num_beams=3, max_new_tokens=6, use_cache=use_cache
        )
        for use_cache in (True, False)
    ]
    assert beams[0].shape[0] == 2 and (beams[0][:, 0] == BOS).all()
    assert torch.equal(beams[0], beams[1])

    model.save_pretrained(tmp_path)
    reloaded = EncoderDecoderModel.from_pretrained(tmp_path).eval()
    assert type(reloaded.decoder) is KilnDecoderForCausalLM and type(reloaded.encoder) is KilnEncoderModel
    decoder_input_ids = labels[:, :-1]
    expected = model(
        input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids
    ).logits
    actual = reloaded(
        input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids
    ).logits
    torch.testing.assert_close(actual, expected)
    reloaded_beams = reloaded.generate(
        input_ids, attention_mask=attention_mask, num_beams=3, max_new_tokens=6
    )
    assert torch.equal(reloaded_beams, beams[0])


def test_cross_attention_respects_the_encoder_padding():
    model = make_seq2seq().eval()
    input_ids = torch.randint(3, 97, (1, 9))
    decoder_input_ids = torch.tensor([[BOS, 5, 6]])
    padded = torch.cat([input_ids, torch.zeros(1, 3, dtype=torch.long)], 1)
    mask = torch.cat([torch.ones(1, 9), torch.zeros(1, 3)], 1).long()
    a = model(input_ids=input_ids, decoder_input_ids=decoder_input_ids).logits
    b = model(input_ids=padded, attention_mask=mask, decoder_input_ids=decoder_input_ids).logits
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)

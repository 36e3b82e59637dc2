"""The encoder's `modernbert` preset: equal to transformers' ModernBERT both ways (every head it has, on shapes
the pieces are sensitive to: one token, padding, lengths either side of the local window, the last position),
its fast paths equal to the plain ones, each piece usable alone, and every Kiln head trains on it."""

import json

import pytest
import torch
import transformers

from pretrain.convert import from_transformers, main, to_transformers
from pretrain.modeling import (
    KilnDecoderConfig,
    KilnEncoderConfig,
    KilnEncoderDecoderConfig,
    KilnEncoderDecoderModel,
    KilnEncoderForElectraPreTraining,
    KilnEncoderForMaskedLM,
    KilnEncoderForMultipleChoice,
    KilnEncoderForNextSentencePrediction,
    KilnEncoderForPreTraining,
    KilnEncoderForQuestionAnswering,
    KilnEncoderForReplacedTokenDetection,
    KilnEncoderForSequenceClassification,
    KilnEncoderForTokenClassification,
)

ATOL = 1e-5
WINDOW = 8  # local_attention: a local block's token sees 4 positions on each side
MAX_POSITIONS = 40


def modernbert_config(**changes):
    fields = dict(
        vocab_size=101,
        hidden_size=32,
        num_hidden_layers=4,  # global, local, local, global
        num_attention_heads=4,
        intermediate_size=40,
        max_position_embeddings=MAX_POSITIONS,
        local_attention=WINDOW,
        global_attn_every_n_layers=3,
        global_rope_theta=1_000.0,  # small thetas: far positions rotate a lot, so a position slip shows
        local_rope_theta=100.0,
        initializer_range=0.2,  # pre-activations of order 1: a wrong activation or norm shows in the logits
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
        num_labels=3,
        attn_implementation="sdpa",
    )
    fields.update(changes)
    config = transformers.ModernBertConfig(**fields)
    return config


HEADS = {
    "ModernBertForMaskedLM": ("logits", {}),
    "ModernBertForSequenceClassification": ("logits", {}),
    "ModernBertForTokenClassification": ("logits", {}),
    "ModernBertModel": ("last_hidden_state", {}),
    "ModernBertForQuestionAnswering": ("start_logits", {"num_labels": 2}),
}


def batch(lengths, seq_len, seed=0, vocab_size=101):
    """Right-padded ids (pad 0) with these real lengths."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, vocab_size, (len(lengths), seq_len), generator=generator)
    attention_mask = (torch.arange(seq_len)[None] < torch.tensor(lengths)[:, None]).long()
    return input_ids.masked_fill(attention_mask == 0, 0), attention_mask


SHAPES = {
    "batch 1, length 1": ([1], 1),
    "right padding": ([13, 6, 2], 13),
    "window - 1 tokens": ([WINDOW // 2], WINDOW // 2),
    "window + 1 tokens": ([WINDOW // 2 + 2, WINDOW // 2 + 1], WINDOW // 2 + 2),
    "both sides of the window": ([WINDOW + 1, WINDOW - 1, WINDOW], WINDOW + 1),
    "the longest position": ([MAX_POSITIONS, 17], MAX_POSITIONS),
}


def compare(ours, theirs, key, attention_mask):
    """Max difference at the real tokens (padded positions' states are not defined alike)."""
    if ours.dim() == 3 or (ours.dim() == 2 and key == "start_logits"):
        keep = attention_mask.bool()
        return (ours[keep] - theirs[keep]).abs().max().item()
    return (ours - theirs).abs().max().item()


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("name", sorted(HEADS))
def test_modernbert_converts_both_ways_with_equal_outputs(name, implementation):
    key, changes = HEADS[name]
    torch.manual_seed(0)
    reference = getattr(transformers, name)(
        modernbert_config(attn_implementation=implementation, **changes)
    ).eval()
    kiln = from_transformers(reference).eval()
    assert type(kiln).__name__.startswith("KilnEncoder")
    assert kiln.config.preset == "modernbert" and kiln.config._attn_implementation == implementation
    back = to_transformers(kiln).eval()
    assert type(back) is type(reference)
    for shape, (lengths, seq_len) in SHAPES.items():
        input_ids, attention_mask = batch(lengths, seq_len)
        with torch.no_grad():
            expected = getattr(reference(input_ids=input_ids, attention_mask=attention_mask), key)
            ours = getattr(kiln(input_ids=input_ids, attention_mask=attention_mask), key)
            again = getattr(back(input_ids=input_ids, attention_mask=attention_mask), key)
        assert compare(ours, expected, key, attention_mask) < ATOL, (shape, "to Kiln")
        assert compare(again, expected, key, attention_mask) < ATOL, (shape, "and back")


def test_the_local_window_matters_and_is_converted():
    """Lengths beyond the window: a model whose local blocks saw everything would give other logits."""
    torch.manual_seed(0)
    reference = transformers.ModernBertForMaskedLM(modernbert_config()).eval()
    kiln = from_transformers(reference).eval()
    wide = from_transformers(transformers.ModernBertForMaskedLM(modernbert_config(local_attention=64))).eval()
    wide.load_state_dict(kiln.state_dict())
    input_ids, attention_mask = batch([30], 30)
    with torch.no_grad():
        assert (kiln(input_ids).logits - wide(input_ids).logits).abs().max() > 1e-3
        assert torch.allclose(kiln(input_ids[:, :5]).logits, wide(input_ids[:, :5]).logits, atol=ATOL)


def test_masked_lm_loss_and_sparse_prediction_equal_modernbert():
    torch.manual_seed(0)
    reference = transformers.ModernBertForMaskedLM(modernbert_config()).eval()
    kiln = from_transformers(reference).eval()
    input_ids, attention_mask = batch([20, 11, 16], 20, seed=3)
    labels = torch.full_like(input_ids, -100)
    labels[:, 2::5] = input_ids[:, 2::5]
    labels[attention_mask == 0] = -100
    with torch.no_grad():
        expected = reference(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        kiln.config.sparse_prediction = (
            True  # the sparse last block: only the labelled rows, windows included
        )
        sparse = kiln(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    assert sparse.logits.shape[0] == int((labels != -100).sum())
    assert abs(sparse.loss.item() - expected.item()) < ATOL


def test_preset_fast_paths_give_the_plain_loss_and_gradients():
    """Sparse last block, chunked loss and unpadding on the preset give the dense path's loss and gradients."""
    config = KilnEncoderConfig(
        preset="modernbert",
        vocab_size=101,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=40,
        max_position_embeddings=64,
        local_attention=WINDOW,
        type_vocab_size=0,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.2,
    )
    torch.manual_seed(0)
    plain = KilnEncoderForMaskedLM(config).train()
    fast = KilnEncoderForMaskedLM(KilnEncoderConfig.from_dict(config.to_dict()))
    fast.load_state_dict(plain.state_dict())
    fast.config.sparse_prediction = fast.config.chunked_mlm_loss = True
    fast.train()
    input_ids, attention_mask = batch([24, 9, 3, 17], 24, seed=1)
    labels = torch.full_like(input_ids, -100)
    labels[:, 1::4] = input_ids[:, 1::4]
    labels[attention_mask == 0] = -100
    plain_loss = plain(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    fast_loss = fast(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    plain_loss.backward()
    fast_loss.backward()
    assert abs(plain_loss.item() - fast_loss.item()) < ATOL
    for (name, a), (_, b) in zip(plain.named_parameters(), fast.named_parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-5), name


PIECES = {
    "position_embedding_type": "rotary",
    "norm_position": "pre",
    "mlp_type": "glu",
    "attention_bias": False,
    "norm_bias": False,
    "classifier_head": "transform",
    "local_attention": 4,
}


@pytest.mark.parametrize("piece", sorted(PIECES))
def test_each_piece_works_alone_on_the_bert_block(piece):
    small = dict(
        vocab_size=64, hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=24
    )
    changes = {piece: PIECES[piece]}
    if piece == "local_attention":
        changes["global_attn_every_n_layers"] = 2
    config = KilnEncoderConfig(**small, **changes)
    classic = KilnEncoderConfig(**small)
    assert getattr(config, piece) == PIECES[piece] and getattr(classic, piece) != PIECES[piece]
    model = KilnEncoderForSequenceClassification(config)
    input_ids, attention_mask = batch([12, 5], 12, vocab_size=64)
    output = model(input_ids=input_ids, attention_mask=attention_mask, labels=torch.tensor([0, 1]))
    output.loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert set(model.state_dict()) != set(
        KilnEncoderForSequenceClassification(classic).state_dict()
    ) or piece in ("position_embedding_type", "local_attention", "norm_position")


def test_the_classic_block_keeps_its_weights_and_the_preset_drops_biases():
    classic = KilnEncoderForMaskedLM(
        KilnEncoderConfig(hidden_size=16, num_attention_heads=2, num_hidden_layers=2)
    )
    assert "model.embeddings.position_embeddings.weight" in classic.state_dict()
    assert "model.layers.0.attention.qkv.bias" in classic.state_dict()
    assert isinstance(classic.model.final_norm, torch.nn.Identity)  # post-LN blocks end normed
    assert not classic.model.rotary_emb.angles(torch.zeros(1, 3, 16))  # positions come from the table
    modern = KilnEncoderForMaskedLM(
        KilnEncoderConfig(preset="modernbert", hidden_size=16, num_attention_heads=2, num_hidden_layers=2)
    )
    keys = set(modern.state_dict())
    assert not any(key.endswith("bias") for key in keys - {"mlm_head.decoder.bias"})
    assert "model.layers.0.attention_norm.weight" not in keys  # the embeddings' norm serves the first block
    assert "model.final_norm.weight" in keys and not any("position" in key for key in keys)


def test_preset_pieces_can_be_overridden_and_unknown_values_are_refused():
    config = KilnEncoderConfig(preset="modernbert", mlp_type="mlp", attention_bias=True)
    assert (config.mlp_type, config.attention_bias, config.norm_position) == ("mlp", True, "pre")
    with pytest.raises(ValueError, match="Unknown preset='llama'; use one of"):
        KilnEncoderConfig(preset="llama")
    with pytest.raises(ValueError, match="Unknown norm_position='middle'"):
        KilnEncoderConfig(norm_position="middle")


def preset_config(**changes):
    fields = dict(
        preset="modernbert",
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=24,
        max_position_embeddings=32,
        local_attention=4,
        type_vocab_size=2,
        num_labels=3,
    )
    fields.update(changes)
    return KilnEncoderConfig(**fields)


def _labels(model_class, input_ids):
    B, T = input_ids.shape[0], input_ids.shape[-1]
    if model_class in (KilnEncoderForMaskedLM, KilnEncoderForElectraPreTraining):
        labels = torch.full((B, T), -100)
        labels[:, 1::3] = input_ids[:, 1::3]
        return {"labels": labels}
    if model_class is KilnEncoderForPreTraining:
        return {**_labels(KilnEncoderForMaskedLM, input_ids), "next_sentence_label": torch.tensor([0, 1])}
    if model_class in (KilnEncoderForTokenClassification, KilnEncoderForReplacedTokenDetection):
        return {"labels": torch.randint(0, 2, (B, T))}
    if model_class is KilnEncoderForQuestionAnswering:
        return {"start_positions": torch.tensor([1, 2]), "end_positions": torch.tensor([3, 4])}
    return {"labels": torch.tensor([0, 1])}


@pytest.mark.parametrize(
    "model_class",
    [
        KilnEncoderForPreTraining,
        KilnEncoderForMaskedLM,
        KilnEncoderForNextSentencePrediction,
        KilnEncoderForSequenceClassification,
        KilnEncoderForTokenClassification,
        KilnEncoderForQuestionAnswering,
        KilnEncoderForMultipleChoice,
        KilnEncoderForReplacedTokenDetection,
        KilnEncoderForElectraPreTraining,
    ],
)
def test_every_head_trains_on_the_preset(model_class):
    torch.manual_seed(0)
    num_labels = 2 if model_class is KilnEncoderForQuestionAnswering else 3
    model = model_class(preset_config(generator_size=0.5, num_labels=num_labels)).train()
    input_ids, attention_mask = batch([12, 7], 12, vocab_size=64)
    token_type_ids = (torch.arange(12) >= 6).long().expand(2, -1)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
    if model_class is KilnEncoderForMultipleChoice:
        inputs = {name: value[:, None].expand(-1, 3, -1) for name, value in inputs.items()}
    output = model(**inputs, **_labels(model_class, input_ids))
    assert torch.isfinite(output.loss)
    output.loss.backward()
    trained = [name for name, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0]
    assert any("layers.0.attention.qkv" in name for name in trained)


def test_the_seq2seq_model_takes_a_preset_encoder():
    config = KilnEncoderDecoderConfig.from_encoder_decoder_configs(
        preset_config(),
        KilnDecoderConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2),
    )
    config.decoder_start_token_id, config.pad_token_id = 1, 0
    model = KilnEncoderDecoderModel(config)
    assert model.encoder.config.preset == "modernbert"
    input_ids, attention_mask = batch([9, 4], 9, vocab_size=64)
    loss = model(
        input_ids=input_ids, attention_mask=attention_mask, labels=input_ids[:, :5].clamp(min=1)
    ).loss
    loss.backward()
    assert torch.isfinite(loss) and model.encoder.layers[1].attention.qkv.weight.grad is not None


def test_a_bert_block_and_a_preset_refuse_the_other_family():
    bert = KilnEncoderForMaskedLM(
        KilnEncoderConfig(hidden_size=16, num_attention_heads=2, num_hidden_layers=1)
    )
    with pytest.raises(ValueError, match="no ModernBERT equivalent .*position_embedding_type='learned'"):
        to_transformers(bert, family="modernbert")
    modern = KilnEncoderForMaskedLM(preset_config())
    with pytest.raises(ValueError, match="no ModernBERT equivalent .*type_vocab_size=2"):
        to_transformers(modern)
    with pytest.raises(ValueError, match="modernbert preset's pieces and no BERT equivalent"):
        to_transformers(modern, family="bert")
    with pytest.raises(ValueError, match="Cannot convert KilnEncoderForPreTraining to ModernBERT"):
        to_transformers(KilnEncoderForPreTraining(preset_config(type_vocab_size=0)))
    odd = modernbert_config(
        layer_types=["sliding_attention", "full_attention", "full_attention", "full_attention"]
    )
    with pytest.raises(ValueError, match="not 'global every n layers from the first'"):
        from_transformers(transformers.ModernBertModel(odd))


def test_cli_converts_a_modernbert_checkpoint_to_kiln_and_back(tmp_path):
    torch.manual_seed(0)
    reference = transformers.ModernBertForTokenClassification(modernbert_config()).eval()
    reference.save_pretrained(tmp_path / "modernbert")
    main([str(tmp_path / "modernbert"), str(tmp_path / "kiln")])
    saved = json.loads((tmp_path / "kiln" / "config.json").read_text())
    assert saved["model_type"] == "kiln_encoder" and saved["preset"] == "modernbert"
    main([str(tmp_path / "kiln"), str(tmp_path / "back")])
    back = transformers.AutoModelForTokenClassification.from_pretrained(tmp_path / "back").eval()
    kiln = KilnEncoderForTokenClassification.from_pretrained(tmp_path / "kiln").eval()
    input_ids, attention_mask = batch([20, 9], 20)
    with torch.no_grad():
        expected = reference(input_ids=input_ids, attention_mask=attention_mask).logits
        for model in (kiln, back):
            got = model(input_ids=input_ids, attention_mask=attention_mask).logits
            assert compare(got, expected, "logits", attention_mask) < ATOL

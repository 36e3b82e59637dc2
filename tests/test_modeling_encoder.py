"""Kiln encoder: heads, losses, sparse MLM prediction, attention kernels, checkpointing, save/load, errors."""

import math

import pytest
import torch
import torch.nn.functional as F
import transformers
from kiln_testing import assert_checkpointing_keeps_gradients, tiny_encoder_config
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

from pretrain.modeling import (
    KilnDecoderForCausalLM,
    KilnEncoderConfig,
    KilnEncoderForMaskedLM,
    KilnEncoderForPreTraining,
    KilnEncoderForSequenceClassification,
    KilnEncoderForTokenClassification,
    KilnEncoderModel,
    count_flops_per_token,
)

VOCAB = 301


def make_config(**overrides) -> KilnEncoderConfig:
    return tiny_encoder_config(**{"vocab_size": VOCAB, **overrides})


def make_batch(batch_size=3, length=12, seed=0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, VOCAB, (batch_size, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, length - 4 :] = 0  # one padded row
    input_ids[attention_mask == 0] = 0
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, length // 2 :] = 1
    labels = torch.full_like(input_ids, -100)
    labels[:, 2::3] = input_ids[:, 2::3]
    labels[attention_mask == 0] = -100
    return input_ids, attention_mask, token_type_ids, labels


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# --------------------------------------------------------------------------------------------- config & input
def test_model_build_rejects_head_count_that_does_not_divide_hidden_size():
    config = KilnEncoderConfig(hidden_size=48, num_attention_heads=5, num_hidden_layers=1)  # checked at build
    with pytest.raises(ValueError, match="not divisible by num_attention_heads=5.*e.g. 4 or 6"):
        KilnEncoderModel(config)


def test_config_rejects_unknown_position_embedding_type():
    with pytest.raises(ValueError, match="position_embedding_type='alibi'.*learned.*sinusoidal.*rotary"):
        KilnEncoderConfig(position_embedding_type="alibi")


def test_too_long_sequence_and_out_of_vocab_ids_give_clear_errors():
    model = KilnEncoderModel(make_config()).eval()
    with pytest.raises(ValueError, match="Sequence length 41 exceeds max_position_embeddings=40; truncate"):
        model(torch.ones(1, 41, dtype=torch.long))
    with pytest.raises(ValueError, match=f"id {VOCAB},.* vocab_size >= len\\(tokenizer\\)"):
        model(torch.tensor([[1, 2, VOCAB]]))
    with pytest.raises(ValueError, match="exactly one of input_ids or inputs_embeds"):
        model()


def test_loading_the_other_model_type_or_a_bert_checkpoint_names_the_fix(tmp_path):
    KilnEncoderForPreTraining(make_config()).save_pretrained(tmp_path / "kiln")
    with pytest.raises(
        ValueError, match="`kiln_encoder` model, but KilnDecoderConfig expects `kiln_decoder`.*KilnEncoder"
    ):
        KilnDecoderForCausalLM.from_pretrained(tmp_path / "kiln")
    bert = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4
    )
    transformers.BertModel(bert).save_pretrained(tmp_path / "bert")
    with pytest.raises(ValueError, match="`bert` model.*python -m pretrain.convert"):
        KilnEncoderModel.from_pretrained(tmp_path / "bert")


# -------------------------------------------------------------------------------------------------- the model
def test_resize_token_embeddings_keeps_the_head_tied_and_accepts_the_new_ids():
    model = KilnEncoderForPreTraining(make_config()).eval()
    model.resize_token_embeddings(VOCAB + 19)
    assert model.config.vocab_size == VOCAB + 19
    assert model.mlm_head.decoder.weight is model.model.embeddings.word_embeddings.weight
    assert model.mlm_head.decoder.bias.shape == (VOCAB + 19,)
    logits = model(torch.tensor([[5, VOCAB + 18]])).prediction_logits
    assert logits.shape == (1, 2, VOCAB + 19)


def test_padding_does_not_change_the_unpadded_tokens():
    model = KilnEncoderModel(make_config()).eval()
    input_ids, attention_mask, token_type_ids, _ = make_batch()
    padded = model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state
    length = int(attention_mask[1].sum())
    alone = model(input_ids[1:2, :length], token_type_ids=token_type_ids[1:2, :length]).last_hidden_state
    torch.testing.assert_close(padded[1, :length], alone[0], atol=1e-5, rtol=1e-5)


def test_sinusoidal_positions_are_a_fixed_table_rebuilt_on_load(tmp_path):
    model = KilnEncoderForMaskedLM(make_config(position_embedding_type="sinusoidal")).eval()
    table = model.model.embeddings.position_embeddings.table
    assert not any("position" in name for name, _ in model.named_parameters())
    assert not any("position" in name for name in model.state_dict())
    position, dim = 7, 32
    torch.testing.assert_close(table[position, 0], torch.tensor(math.sin(position)))
    torch.testing.assert_close(table[position, 1], torch.tensor(math.cos(position)))
    torch.testing.assert_close(table[position, 2], torch.tensor(math.sin(position / 10000 ** (2 / dim))))
    model.save_pretrained(tmp_path)
    reloaded = KilnEncoderForMaskedLM.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(reloaded.model.embeddings.position_embeddings.table, table)
    input_ids, attention_mask, _, _ = make_batch()
    torch.testing.assert_close(reloaded(input_ids).logits, model(input_ids).logits)


def test_eager_and_sdpa_give_the_same_outputs_and_eager_returns_attentions():
    sdpa = KilnEncoderForPreTraining(make_config(attn_implementation="sdpa")).eval()
    eager = KilnEncoderForPreTraining(make_config(attn_implementation="eager")).eval()
    eager.load_state_dict(sdpa.state_dict())
    assert (sdpa.config._attn_implementation, eager.config._attn_implementation) == ("sdpa", "eager")
    input_ids, attention_mask, token_type_ids, _ = make_batch()
    a = sdpa(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
    b = eager(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, output_attentions=True)
    torch.testing.assert_close(a.prediction_logits, b.prediction_logits, atol=1e-5, rtol=1e-5)
    assert a.attentions is None and len(b.attentions) == 2
    assert b.attentions[0].shape == (3, 4, 12, 12)
    assert b.attentions[0][1, :, :, -4:].abs().max() == 0  # padded keys get no attention
    torch.testing.assert_close(b.attentions[0].sum(-1), torch.ones(3, 4, 12))
    # asking the sdpa model for attention weights falls back to eager for that call
    c = sdpa(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, output_attentions=True)
    torch.testing.assert_close(c.attentions[1], b.attentions[1])


def test_hidden_states_and_tuple_outputs():
    model = KilnEncoderModel(make_config()).eval()
    input_ids, attention_mask, _, _ = make_batch()
    out = model(input_ids, attention_mask=attention_mask, output_hidden_states=True)
    assert len(out.hidden_states) == 3 and out.hidden_states[-1] is out.last_hidden_state
    assert out.pooler_output.shape == (3, 32)
    as_tuple = model(input_ids, attention_mask=attention_mask, return_dict=False)
    torch.testing.assert_close(as_tuple[0], out.last_hidden_state)
    assert KilnEncoderModel(make_config(), add_pooling_layer=False).pooler is None


def test_gradient_checkpointing_gives_the_same_gradients():
    model = KilnEncoderForPreTraining(make_config()).train()
    input_ids, attention_mask, token_type_ids, labels = make_batch()
    nsp = torch.tensor([0, 1, 0])

    def loss():
        return model(input_ids, attention_mask, token_type_ids, labels=labels, next_sentence_label=nsp).loss

    assert_checkpointing_keeps_gradients(model, loss)


# -------------------------------------------------------------------------------------------------- MLM heads
def test_mlm_head_is_tied_to_the_input_embeddings_also_after_reload(tmp_path):
    model = KilnEncoderForPreTraining(make_config())
    assert model.mlm_head.decoder.weight is model.model.embeddings.word_embeddings.weight
    assert model.mlm_head.decoder.bias is not None
    model.save_pretrained(tmp_path)
    reloaded = KilnEncoderForPreTraining.from_pretrained(tmp_path)
    assert reloaded.mlm_head.decoder.weight is reloaded.model.embeddings.word_embeddings.weight
    torch.testing.assert_close(reloaded.mlm_head.decoder.bias, model.mlm_head.decoder.bias)


POOLINGS = {"cls": {}, "mean": {"classifier_head": "transform", "classifier_pooling": "mean"}}


@pytest.mark.parametrize("pooling", list(POOLINGS))
@pytest.mark.parametrize("model_class", [KilnEncoderForPreTraining, KilnEncoderForMaskedLM])
def test_sparse_prediction_gives_the_dense_loss_and_gradients(model_class, pooling):
    """Also with mean pooling (a converted ModernBERT's), whose pooled output reads every row of the last block."""
    dense = model_class(make_config(sparse_prediction=False, **POOLINGS[pooling])).train()
    sparse = model_class(make_config(sparse_prediction=True, **POOLINGS[pooling])).train()
    sparse.load_state_dict(dense.state_dict())
    input_ids, attention_mask, token_type_ids, labels = make_batch()
    sentence_order = (
        {"next_sentence_label": torch.tensor([0, 1, 1])} if model_class is KilnEncoderForPreTraining else {}
    )
    results = {}
    for name, model in (("dense", dense), ("sparse", sparse)):
        out = model(input_ids, attention_mask, token_type_ids, labels=labels, **sentence_order)
        out.loss.backward()
        logits = out.prediction_logits if model_class is KilnEncoderForPreTraining else out.logits
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[name] = (out.loss, logits, grads)
    (dense_loss, dense_logits, dense_grads), (sparse_loss, sparse_logits, sparse_grads) = results.values()
    assert dense_logits.shape == (3, 12, VOCAB)
    num_masked = int((labels != -100).sum())
    assert sparse_logits.shape == (num_masked, VOCAB)
    torch.testing.assert_close(sparse_logits, dense_logits.view(-1, VOCAB)[labels.view(-1) != -100])
    torch.testing.assert_close(sparse_loss, dense_loss)
    assert dense_grads.keys() == sparse_grads.keys()
    for name in dense_grads:
        torch.testing.assert_close(sparse_grads[name], dense_grads[name], msg=name)


def test_pretraining_loss_is_mlm_plus_nsp_and_mlm_alone_without_nsp_labels():
    model = KilnEncoderForPreTraining(make_config()).eval()
    input_ids, attention_mask, token_type_ids, labels = make_batch()
    nsp = torch.tensor([0, 1, 1])
    full = model(input_ids, attention_mask, token_type_ids, labels=labels, next_sentence_label=nsp)
    dense = model(input_ids, attention_mask, token_type_ids)
    expected_mlm = F.cross_entropy(dense.prediction_logits.view(-1, VOCAB), labels.view(-1))
    expected_nsp = F.cross_entropy(dense.seq_relationship_logits, nsp)
    torch.testing.assert_close(full.mlm_loss, expected_mlm)
    torch.testing.assert_close(full.nsp_loss, expected_nsp)
    torch.testing.assert_close(full.loss, expected_mlm + expected_nsp)
    mlm_only = model(input_ids, attention_mask, token_type_ids, labels=labels)
    assert mlm_only.nsp_loss is None
    torch.testing.assert_close(mlm_only.loss, expected_mlm)
    assert dense.loss is None and dense.prediction_logits.shape == (3, 12, VOCAB)


def _tiny_wordpiece_tokenizer():
    words = "the a cat dog sat on mat ran".split()
    vocab = {token: i for i, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def test_fill_mask_pipeline_ranks_by_the_models_logits():
    tokenizer = _tiny_wordpiece_tokenizer()
    model = KilnEncoderForMaskedLM(make_config(vocab_size=len(tokenizer))).eval()
    fill = transformers.pipeline("fill-mask", model=model, tokenizer=tokenizer, top_k=3)
    predictions = fill("the cat [MASK] on the mat")
    encoded = tokenizer("the cat [MASK] on the mat", return_tensors="pt")
    mask_position = int((encoded.input_ids[0] == tokenizer.mask_token_id).nonzero()[0, 0])
    probs = model(**encoded).logits[0, mask_position].softmax(-1)
    assert [p["token"] for p in predictions] == probs.topk(3).indices.tolist()
    torch.testing.assert_close(torch.tensor([p["score"] for p in predictions]), probs.topk(3).values)


# ------------------------------------------------------------------------------------------ task heads & Auto
@pytest.mark.parametrize(
    "num_labels, labels, problem_type",
    [
        (3, torch.tensor([0, 2, 1]), "single_label_classification"),
        (3, torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]]), "multi_label_classification"),
        (1, torch.tensor([0.5, -1.0, 2.0]), "regression"),
    ],
)
def test_sequence_classification_picks_the_problem_type_like_bert(num_labels, labels, problem_type):
    model = KilnEncoderForSequenceClassification(
        make_config(num_labels=num_labels, classifier_dropout=0.3)
    ).eval()
    assert model.dropout.p == 0.3
    input_ids, attention_mask, token_type_ids, _ = make_batch()
    out = model(input_ids, attention_mask, token_type_ids, labels=labels)
    assert model.config.problem_type == problem_type
    assert out.logits.shape == (3, num_labels)
    expected = {
        "single_label_classification": lambda: F.cross_entropy(out.logits, labels),
        "multi_label_classification": lambda: F.binary_cross_entropy_with_logits(out.logits, labels),
        "regression": lambda: F.mse_loss(out.logits.squeeze(), labels),
    }[problem_type]()
    torch.testing.assert_close(out.loss, expected)


def test_token_classification_ignores_minus_100():
    model = KilnEncoderForTokenClassification(make_config(num_labels=5)).eval()
    assert model.dropout.p == model.config.hidden_dropout_prob  # classifier_dropout=None falls back like BERT
    input_ids, attention_mask, _, _ = make_batch()
    labels = torch.randint(0, 5, input_ids.shape)
    labels[attention_mask == 0] = -100
    out = model(input_ids, attention_mask, labels=labels)
    valid = labels != -100
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits[valid], labels[valid]))


def test_auto_classes_load_a_pretraining_checkpoint_into_every_head(tmp_path):
    pretrained = KilnEncoderForPreTraining(make_config()).eval()
    pretrained.save_pretrained(tmp_path)
    input_ids, attention_mask, token_type_ids, _ = make_batch()
    reloaded = transformers.AutoModelForPreTraining.from_pretrained(tmp_path).eval()
    assert type(reloaded) is KilnEncoderForPreTraining
    torch.testing.assert_close(
        reloaded(input_ids, attention_mask, token_type_ids).prediction_logits,
        pretrained(input_ids, attention_mask, token_type_ids).prediction_logits,
    )
    for auto_class, kiln_class in [
        (transformers.AutoModel, KilnEncoderModel),
        (transformers.AutoModelForMaskedLM, KilnEncoderForMaskedLM),
        (transformers.AutoModelForSequenceClassification, KilnEncoderForSequenceClassification),
        (transformers.AutoModelForTokenClassification, KilnEncoderForTokenClassification),
    ]:
        model = auto_class.from_pretrained(tmp_path)
        assert type(model) is kiln_class
        encoder = model if kiln_class is KilnEncoderModel else model.model
        torch.testing.assert_close(
            encoder.layers[1].mlp.fc_out.weight, pretrained.model.layers[1].mlp.fc_out.weight
        )
    assert type(transformers.AutoConfig.from_pretrained(tmp_path)) is KilnEncoderConfig


def test_flop_count_matches_the_parameter_count_of_the_blocks():
    config = make_config()
    model = KilnEncoderModel(config)
    block_matmul_params = sum(
        module.weight.numel() for module in model.layers.modules() if isinstance(module, torch.nn.Linear)
    )
    assert count_flops_per_token(config, seq_len=0) == 6 * block_matmul_params
    h, L, T = config.hidden_size, config.num_hidden_layers, 128
    assert count_flops_per_token(config, T) - count_flops_per_token(config, 0) == 12 * L * h * T
    with_head = count_flops_per_token(config, T, lm_head_fraction=0.15)
    assert with_head - count_flops_per_token(config, T) == pytest.approx(6 * h * VOCAB * 0.15)

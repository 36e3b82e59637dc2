"""The fast paths compute what the plain paths compute: same losses, same gradients.

- `linear_cross_entropy` (chunked LM head + cross-entropy, gradients computed in the forward pass) against
  `F.cross_entropy(hidden @ weight.T)`, and the decoder's `chunked_lm_loss` against its dense head;
- the encoder's sparse last block (only the labelled rows and the first token are computed) against the full
  block and against dense MLM logits, and its `chunked_mlm_loss`;
- the encoder's unpadded path (`unpad_inputs`: position-wise layers on the real tokens only) against the padded
  one, for every encoder head, right and left padding, with gradient checkpointing and the sparse last block;
- the fused tanh GELU used for `gelu_new` against transformers' implementation;
- the cheaper CPU dropout mask: its statistics, gradient, seeding and activation checkpointing.
"""

import warnings

import pytest
import torch
import torch.nn.functional as F
import transformers
from accelerate import Accelerator
from kiln_testing import tiny_decoder_config, tiny_encoder_config

from pretrain.evaluation import evaluate_decoder
from pretrain.modeling import (
    KilnDecoderConfig,
    KilnDecoderForCausalLM,
    KilnEncoderConfig,
    KilnEncoderForMaskedLM,
    KilnEncoderForMultipleChoice,
    KilnEncoderForPreTraining,
    KilnEncoderForQuestionAnswering,
    KilnEncoderForSequenceClassification,
    KilnEncoderForTokenClassification,
    KilnEncoderModel,
)
from pretrain.modeling.kiln_layers import KilnDropout, activation_module, apply_dropout
from pretrain.modeling.kiln_losses import linear_cross_entropy

VOCAB = 257


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def gradients(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_same_gradients(actual: dict, expected: dict, **tolerance):
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], msg=name, **tolerance)


# ------------------------------------------------------------------------------------- chunked cross-entropy
def plain_loss_and_grads(hidden, weight, targets):
    hidden, weight = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
    loss = F.cross_entropy((hidden @ weight.T).float().flatten(0, -2), targets.flatten(), ignore_index=-100)
    loss.backward()
    return loss, hidden.grad, weight.grad


@pytest.mark.parametrize("chunk_rows", [1, 7, 40, 1000])
def test_linear_cross_entropy_matches_the_plain_loss_and_gradients(chunk_rows):
    hidden = torch.randn(4, 10, 24)
    weight = torch.randn(VOCAB, 24) * 0.5
    targets = torch.randint(0, VOCAB, (4, 10))
    targets[0, :3] = -100
    targets[2, -1] = -100
    expected = plain_loss_and_grads(hidden, weight, targets)

    hidden_ = hidden.clone().requires_grad_()
    weight_ = weight.clone().requires_grad_()
    loss = linear_cross_entropy(hidden_, weight_, targets, chunk_rows=chunk_rows)
    (0.5 * loss).backward()  # an upstream gradient other than 1 must scale the saved gradients
    torch.testing.assert_close(loss, expected[0])
    torch.testing.assert_close(hidden_.grad, 0.5 * expected[1])
    torch.testing.assert_close(weight_.grad, 0.5 * expected[2])
    assert hidden_.grad[0, :3].abs().max() == 0  # ignored rows get no gradient


def test_linear_cross_entropy_accumulates_and_needs_no_graph_without_gradients():
    hidden = torch.randn(12, 16, requires_grad=True)
    weight = torch.randn(VOCAB, 16, requires_grad=True)
    targets = torch.randint(0, VOCAB, (12,))
    linear_cross_entropy(hidden, weight, targets, chunk_rows=5).backward()
    linear_cross_entropy(hidden, weight, targets, chunk_rows=5).backward()  # gradient accumulation
    _, hidden_grad, weight_grad = plain_loss_and_grads(hidden, weight, targets)
    torch.testing.assert_close(hidden.grad, 2 * hidden_grad)
    torch.testing.assert_close(weight.grad, 2 * weight_grad)
    with torch.no_grad():
        loss = linear_cross_entropy(hidden, weight, targets)
    assert loss.grad_fn is None
    torch.testing.assert_close(loss, F.cross_entropy(hidden @ weight.T, targets))
    everything_ignored = torch.full((12,), -100)
    assert torch.isnan(linear_cross_entropy(hidden, weight, everything_ignored))  # as F.cross_entropy


def test_linear_cross_entropy_under_bf16_autocast_matches_the_autocast_plain_path():
    hidden = torch.randn(30, 32)
    weight = torch.randn(VOCAB, 32) * 0.3
    targets = torch.randint(0, VOCAB, (30,))
    results = []
    for fast in (False, True):
        hidden_ = hidden.clone().requires_grad_()
        weight_ = weight.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if fast:
                loss = linear_cross_entropy(hidden_, weight_, targets, chunk_rows=8)
            else:
                loss = F.cross_entropy((hidden_ @ weight_.T).float(), targets)
        loss.backward()
        assert loss.dtype == torch.float32 and weight_.grad.dtype == torch.float32
        results.append((loss, hidden_.grad, weight_.grad))
    (plain_loss, *plain_grads), (fast_loss, *fast_grads) = results
    torch.testing.assert_close(fast_loss, plain_loss, atol=1e-3, rtol=1e-3)
    for fast_grad, plain_grad in zip(fast_grads, plain_grads):
        torch.testing.assert_close(fast_grad, plain_grad, atol=2e-3, rtol=2e-2)


def decoder_config(**overrides) -> KilnDecoderConfig:
    return tiny_decoder_config(**{"vocab_size": VOCAB, "max_position_embeddings": 32, **overrides})


def decoder_batch():
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(1, VOCAB, (3, 11), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 8:] = 0  # right padding, as the CLM collator makes it
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def test_chunked_lm_loss_gives_the_dense_head_loss_and_gradients():
    plain = KilnDecoderForCausalLM(decoder_config(chunked_lm_loss=False)).train()
    chunked = KilnDecoderForCausalLM(decoder_config()).train()
    chunked.load_state_dict(plain.state_dict())
    assert chunked.config.chunked_lm_loss  # on by default
    batch = decoder_batch()
    results = {}
    for name, model in (("plain", plain), ("chunked", chunked)):
        out = model(**batch)
        out.loss.backward()
        results[name] = (out.loss, out.logits, gradients(model))
    (plain_loss, plain_logits, plain_grads), (chunked_loss, chunked_logits, chunked_grads) = results.values()
    assert plain_logits.shape == (3, 11, VOCAB) and chunked_logits is None  # never materialised
    torch.testing.assert_close(chunked_loss, plain_loss)
    assert "lm_head.weight" in chunked_grads or "model.word_embeddings.weight" in chunked_grads
    assert_same_gradients(chunked_grads, plain_grads)


def test_chunked_lm_loss_keeps_logits_wherever_a_caller_reads_them():
    model = KilnDecoderForCausalLM(decoder_config()).train()
    batch = decoder_batch()
    without_labels = {key: value for key, value in batch.items() if key != "labels"}
    assert model(**without_labels).logits.shape == (3, 11, VOCAB)  # training forward without labels
    with torch.no_grad():
        no_grad = model(**batch)  # e.g. a validation loss inside a training loop
    assert no_grad.logits.shape == (3, 11, VOCAB)
    model.eval()
    evaluated = model(**batch)
    expected = F.cross_entropy(
        evaluated.logits[:, :-1].reshape(-1, VOCAB), batch["labels"][:, 1:].reshape(-1)
    )
    torch.testing.assert_close(evaluated.loss, expected)
    torch.testing.assert_close(no_grad.loss, expected)

    # evaluate_decoder calls the model without labels and computes the loss from the logits itself
    loader = [batch]
    metrics = evaluate_decoder(model, loader, Accelerator(cpu=True))
    model.train()
    with torch.no_grad():
        train_mode_loss = model(**batch).loss
    assert metrics["loss"] == pytest.approx(expected.item(), rel=1e-5)
    assert float(train_mode_loss) == pytest.approx(metrics["loss"], rel=1e-5)


def test_gelu_new_runs_as_the_fused_tanh_gelu_with_transformers_values():
    x = torch.linspace(-6, 6, 401, dtype=torch.float64, requires_grad=True)
    ours, theirs = activation_module("gelu_new"), transformers.activations.ACT2FN["gelu_new"]
    assert isinstance(ours, torch.nn.GELU) and ours.approximate == "tanh"
    (grad_ours,) = torch.autograd.grad(ours(x).sum(), x)
    (grad_theirs,) = torch.autograd.grad(theirs(x).sum(), x)
    torch.testing.assert_close(ours(x), theirs(x))
    torch.testing.assert_close(grad_ours, grad_theirs)
    assert KilnDecoderForCausalLM(decoder_config()).model.layers[0].mlp.act.approximate == "tanh"


# -------------------------------------------------------------------------------------- sparse last block
def encoder_config(**overrides) -> KilnEncoderConfig:
    return tiny_encoder_config(
        **{"vocab_size": VOCAB, "initializer_range": 0.1, "sparse_prediction": True, **overrides}
    )


def encoder_batch():
    generator = torch.Generator().manual_seed(2)
    input_ids = torch.randint(5, VOCAB, (4, 20), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 14:] = 0
    input_ids[attention_mask == 0] = 0
    token_type_ids = (torch.arange(20) >= 9).long().expand(4, 20).clone()
    selected = torch.rand(4, 20, generator=generator) < 0.3
    selected[0, 0] = True  # a label on the first position, which the pooler also reads
    selected[2] = False  # a sequence without any label
    selected[3, :] = True  # one with a label everywhere: the sparse block computes every row there
    selected &= attention_mask.bool()
    labels = input_ids.masked_fill(~selected, -100)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "token_type_ids": token_type_ids,
        "labels": labels,
        "next_sentence_label": torch.tensor([0, 1, 1, 0]),
    }


@pytest.mark.parametrize("model_class", [KilnEncoderForPreTraining, KilnEncoderForMaskedLM])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_sparse_last_block_gives_the_full_and_the_dense_loss_and_gradients(model_class, checkpointing):
    batch = encoder_batch()
    if model_class is KilnEncoderForMaskedLM:
        batch.pop("next_sentence_label")
    dense = model_class(encoder_config(sparse_prediction=False)).train()
    results = {}
    variants = ("dense", "full last block", "sparse last block", "chunked loss")
    for name in variants:
        config = encoder_config(sparse_prediction=name != "dense", chunked_mlm_loss=name == "chunked loss")
        model = model_class(config).train()
        model.load_state_dict(dense.state_dict())
        if checkpointing:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                model.gradient_checkpointing_enable()
        # requesting hidden states keeps the last block whole
        out = model(**batch, output_hidden_states=name == "full last block")
        out.loss.backward()
        logits = out.prediction_logits if model_class is KilnEncoderForPreTraining else out.logits
        nsp = getattr(out, "seq_relationship_logits", None)
        results[name] = (out.loss, logits, nsp, gradients(model))
    dense_loss, dense_logits, dense_nsp, dense_grads = results["dense"]
    labelled = batch["labels"].reshape(-1) != -100
    for name in variants[1:]:
        loss, logits, nsp, grads = results[name]
        torch.testing.assert_close(loss, dense_loss, msg=name)
        if name == "chunked loss":
            assert logits is None  # never materialised
        else:
            assert logits.shape == (int(labelled.sum()), VOCAB)
            torch.testing.assert_close(logits, dense_logits.reshape(-1, VOCAB)[labelled], msg=name)
        if nsp is not None:
            torch.testing.assert_close(nsp, dense_nsp, msg=name)
        assert_same_gradients(grads, dense_grads)


def test_sparse_positions_list_the_first_token_then_the_labels_in_order():
    model = KilnEncoderForPreTraining(encoder_config())
    labels = torch.full((3, 30), -100)
    labels[0, [3, 17, 29]] = 7
    labels[1, 0] = 5
    positions = model._sparse_positions(labels, None, None)
    assert positions.shape == (3, 8)  # 4 needed in row 0, rounded up to a multiple of 8
    assert positions[0, :4].tolist() == [0, 3, 17, 29]
    assert positions[1, 0] == 0 and positions[2, 0] == 0
    for row in positions:  # every slot a distinct valid position
        assert len(set(row.tolist())) == 8 and int(row.max()) < 30
    assert model._sparse_positions(labels, None, True) is None  # hidden states wanted: full block
    assert model._sparse_positions(labels, True, None) is None  # attention maps wanted: full block
    full = torch.zeros(2, 12, dtype=torch.long)
    assert model._sparse_positions(full, None, None).shape == (2, 12)  # never wider than the sequence


def test_encoder_query_positions_give_the_full_states_at_those_positions():
    model = KilnEncoderModel(encoder_config(num_hidden_layers=3)).eval()
    batch = encoder_batch()
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask", "token_type_ids")}
    full = model(**inputs)
    positions = torch.tensor([[0, 5, 2], [0, 13, 19], [0, 1, 7], [0, 11, 4]])  # any order is kept
    partial = model(**inputs, query_positions=positions)
    expected = full.last_hidden_state.gather(1, positions[..., None].expand(-1, -1, 32))
    torch.testing.assert_close(partial.last_hidden_state, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(partial.pooler_output, full.pooler_output, atol=1e-5, rtol=1e-5)


def test_chunked_mlm_loss_keeps_the_logits_outside_training():
    model = KilnEncoderForPreTraining(encoder_config(chunked_mlm_loss=True)).eval()
    batch = encoder_batch()
    out = model(**batch)
    labelled = batch["labels"] != -100
    assert out.prediction_logits.shape == (int(labelled.sum()), VOCAB)
    mlm_loss = F.cross_entropy(out.prediction_logits, batch["labels"][labelled])
    torch.testing.assert_close(out.mlm_loss, mlm_loss)
    assert KilnEncoderConfig().chunked_mlm_loss is False  # opt-in: training code may read the logits


# ---------------------------------------------------------------------------------------------- unpadding
def padded_batch(left: bool = False, batch_size: int = 5, width: int = 23):
    """Sequences of very different lengths (one unpadded, one of a single token), padded on the right or left."""
    generator = torch.Generator().manual_seed(3)
    lengths = torch.tensor([width, 1, 7, 16, 12][:batch_size])
    input_ids = torch.randint(5, VOCAB, (batch_size, width), generator=generator)
    positions = torch.arange(width)[None, :]
    real = positions >= (width - lengths[:, None]) if left else positions < lengths[:, None]
    input_ids[~real] = 0
    token_type_ids = ((positions >= 5) & real).long()
    return {"input_ids": input_ids, "attention_mask": real.long(), "token_type_ids": token_type_ids}


def head_labels(model_class, batch):
    real = batch["attention_mask"].bool()
    B, T = batch["input_ids"].shape
    generator = torch.Generator().manual_seed(4)
    if model_class is KilnEncoderForSequenceClassification:
        return {"labels": torch.randint(0, 3, (B,), generator=generator)}
    if model_class is KilnEncoderForTokenClassification:
        return {"labels": torch.randint(0, 3, (B, T), generator=generator).masked_fill(~real, -100)}
    if model_class is KilnEncoderForQuestionAnswering:
        return {
            "start_positions": torch.tensor([0, 0, 3, 9, 2]),
            "end_positions": torch.tensor([5, 0, 6, 12, 2]),
        }
    if model_class is KilnEncoderForMaskedLM:
        selected = (torch.rand(B, T, generator=generator) < 0.3) & real
        return {"labels": batch["input_ids"].masked_fill(~selected, -100)}
    if model_class is KilnEncoderForPreTraining:
        selected = (torch.rand(B, T, generator=generator) < 0.3) & real
        selected[1, :] = real[1]
        return {
            "labels": batch["input_ids"].masked_fill(~selected, -100),
            "next_sentence_label": torch.tensor([0, 1, 1, 0, 1]),
        }
    return {}


def main_output(model_class, out):
    if model_class is KilnEncoderModel:
        return out.last_hidden_state
    if model_class is KilnEncoderForPreTraining:
        return out.prediction_logits
    if model_class is KilnEncoderForQuestionAnswering:
        return torch.stack([out.start_logits, out.end_logits], -1)
    return out.logits


UNPADDED_HEADS = [  # the heads that unpad: nothing they return depends on the padded positions' states
    KilnEncoderForSequenceClassification,
    KilnEncoderForTokenClassification,
    KilnEncoderForMaskedLM,  # with sparse prediction
    KilnEncoderForPreTraining,  # with sparse prediction
]
PADDED_HEADS = [  # the bare model returns every position's state; QA's loss reads the padded positions' logits
    KilnEncoderModel,
    KilnEncoderForQuestionAnswering,
]


@pytest.mark.parametrize(
    "model_class",
    UNPADDED_HEADS + PADDED_HEADS,
    ids=lambda c: c.__name__.removeprefix("KilnEncoder") or "Model",
)
@pytest.mark.parametrize("left", [False, True], ids=["right-padded", "left-padded"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_unpadded_encoder_gives_the_padded_loss_gradients_and_predictions(model_class, left, checkpointing):
    batch = padded_batch(left)
    labels = head_labels(model_class, batch)
    sparse = model_class in (KilnEncoderForMaskedLM, KilnEncoderForPreTraining)
    results = {}
    reference = None
    for unpad in (False, True):
        num_labels = 2 if model_class is KilnEncoderForQuestionAnswering else 3
        config = encoder_config(
            num_hidden_layers=3, num_labels=num_labels, unpad_inputs=unpad, sparse_prediction=sparse
        )
        model = model_class(config).train()
        if reference is None:
            reference = model.state_dict()
        model.load_state_dict(reference)
        if checkpointing:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                model.gradient_checkpointing_enable()
        calls = []
        model.get_submodule(
            "model.layers.0" if hasattr(model, "model") else "layers.0"
        ).register_forward_hook(lambda module, args, output, calls=calls: calls.append(output[0].dim()))
        out = model(**batch, **labels)
        if labels:
            out.loss.backward()
        else:
            # padded positions' states are read by nothing (and differ): the objective reads the real ones
            out.last_hidden_state[batch["attention_mask"].bool()].square().sum().backward()
        results[unpad] = (out, gradients(model))
        # the unpadded path really ran ((N, C) rows in the blocks) where it applies: right padding, those heads
        assert calls[0] == (2 if unpad and not left and model_class in UNPADDED_HEADS else 3)
    (plain, plain_grads), (fast, fast_grads) = results[False], results[True]
    if labels:
        torch.testing.assert_close(fast.loss, plain.loss, atol=1e-5, rtol=1e-5)
    expected, actual = main_output(model_class, plain), main_output(model_class, fast)
    real = batch["attention_mask"].bool()
    if (
        expected.shape[:2] == real.shape
    ):  # per-token outputs: equal at the real tokens, nothing read elsewhere
        expected, actual = expected[real], actual[real]
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    if model_class is KilnEncoderForPreTraining:
        torch.testing.assert_close(
            fast.seq_relationship_logits, plain.seq_relationship_logits, atol=1e-5, rtol=1e-5
        )
    if model_class is KilnEncoderModel and not left:
        torch.testing.assert_close(fast.pooler_output, plain.pooler_output, atol=1e-5, rtol=1e-5)
    assert_same_gradients(fast_grads, plain_grads, atol=1e-5, rtol=1e-4)


def test_unpadded_multiple_choice_and_eval_predictions_match_the_padded_path():
    batch = {key: value.view(1, 5, -1) for key, value in padded_batch().items()}
    models = {}
    for unpad in (False, True):
        model = KilnEncoderForMultipleChoice(encoder_config(unpad_inputs=unpad)).eval()
        if models:
            model.load_state_dict(models[False].state_dict())
        models[unpad] = model
    with torch.no_grad():
        plain, fast = (models[u](**batch, labels=torch.tensor([2])) for u in (False, True))
    torch.testing.assert_close(fast.logits, plain.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast.loss, plain.loss, atol=1e-5, rtol=1e-5)
    assert KilnEncoderConfig().unpad_inputs  # on by default: it changes nothing a caller reads


def test_unpadded_path_stays_off_where_it_cannot_apply():
    model = KilnEncoderForSequenceClassification(encoder_config(unpad_inputs=True)).eval()
    batch = padded_batch()
    calls = []
    model.model.layers[0].register_forward_hook(lambda module, args, output: calls.append(output[0].dim()))
    with torch.no_grad():
        model(**batch)  # unpadded
        out = model(**batch, output_hidden_states=True)  # per-layer (B, T, C) states wanted
        model(**{**batch, "attention_mask": torch.ones_like(batch["attention_mask"])})  # nothing to unpad
        little = torch.ones_like(batch["attention_mask"])
        little[1, -2:] = 0  # 2 of 115 positions padded: below UNPAD_MIN_PADDING, cheaper padded
        model(**{**batch, "attention_mask": little})
        model.config.unpad_inputs = False
        model(**batch)
    assert calls == [2, 3, 3, 3, 3]
    assert all(state.shape[:2] == batch["input_ids"].shape for state in out.hidden_states)


# -------------------------------------------------------------------------------------------------- dropout
def test_cpu_dropout_mask_keeps_one_minus_p_and_rescales_exactly():
    x = torch.ones(400_000, requires_grad=True)
    torch.manual_seed(3)
    out = apply_dropout(x, 0.1)
    kept = out != 0
    keep_threshold = round(0.9 * 65536)
    assert abs(kept.float().mean().item() - 0.9) < 0.003
    torch.testing.assert_close(out[kept], torch.full_like(out[kept], 65536 / keep_threshold))
    assert abs(out.mean().item() - 1.0) < 0.004  # unbiased
    out.backward(torch.full_like(out, 2.0))
    torch.testing.assert_close(x.grad, 2.0 * out.detach())  # the same mask and scale
    torch.manual_seed(3)
    assert torch.equal(apply_dropout(x, 0.1), out)  # seeded by torch.manual_seed
    assert not torch.equal(apply_dropout(x, 0.1), out)
    assert apply_dropout(x, 0.1, training=False) is x and apply_dropout(x, 0.0) is x
    layer = KilnDropout(0.3)
    assert isinstance(layer, torch.nn.Dropout) and layer.eval()(x) is x
    assert abs((layer.train()(x.detach()) == 0).float().mean().item() - 0.3) < 0.003


@pytest.mark.parametrize("model_class", [KilnEncoderForPreTraining, KilnDecoderForCausalLM])
def test_dropout_masks_are_replayed_under_activation_checkpointing(model_class):
    if model_class is KilnEncoderForPreTraining:
        config = encoder_config(hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2)
        batch = encoder_batch()
    else:
        config = decoder_config(resid_pdrop=0.2, embd_pdrop=0.2, attn_pdrop=0.2)
        batch = decoder_batch()
    model = model_class(config).train()
    results = []
    for checkpointing in (False, True):
        if checkpointing:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                model.gradient_checkpointing_enable()
        model.zero_grad()
        torch.manual_seed(7)
        loss = model(**batch).loss
        loss.backward()
        results.append((loss.detach(), gradients(model)))
    (plain_loss, plain_grads), (loss, grads) = results
    with torch.no_grad():
        model.eval()
        eval_loss = model(**batch).loss
    assert abs(float(plain_loss) - float(eval_loss)) > 1e-4  # dropout was active
    torch.testing.assert_close(loss, plain_loss)
    assert_same_gradients(grads, plain_grads)

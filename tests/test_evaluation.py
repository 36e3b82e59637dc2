"""Pretraining evaluators weigh every masked/predicted token once, whatever the batching."""

import math

import pytest
import torch
import torch.nn.functional as F
from accelerate import Accelerator

from pretrain.evaluation import evaluate_decoder, evaluate_encoder
from pretrain.modeling import (
    KilnDecoderConfig,
    KilnDecoderForCausalLM,
    KilnEncoderConfig,
    KilnEncoderForPreTraining,
)

VOCAB = 97


def _encoder_batches(generator):
    batches = []
    for size in (3, 5, 2):  # uneven batches with very different numbers of masked tokens
        ids = torch.randint(5, VOCAB, (size, 16), generator=generator)
        labels = torch.full_like(ids, -100)
        mask = torch.rand(ids.shape, generator=generator) < torch.linspace(0.05, 0.6, size)[:, None]
        mask[:, 0] = True  # at least one target per row
        labels[mask] = ids[mask]
        batches.append(
            {
                "input_ids": ids,
                "attention_mask": torch.ones_like(ids),
                "token_type_ids": torch.zeros_like(ids),
                "labels": labels,
                "next_sentence_label": torch.randint(0, 2, (size,), generator=generator),
            }
        )
    return batches


@pytest.mark.parametrize("sparse", [True, False])
def test_encoder_eval_is_token_weighted(sparse):
    torch.manual_seed(0)  # the weights: the last assertion needs batches whose means differ enough
    generator = torch.Generator().manual_seed(0)
    config = KilnEncoderConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        sparse_prediction=sparse,
    )
    model = KilnEncoderForPreTraining(config).eval()
    batches = _encoder_batches(generator)
    metrics = evaluate_encoder(model, batches, Accelerator(cpu=True))

    # reference: one pass over all batches, full logits, every masked token pooled together
    losses, correct, nsp_losses, nsp_correct = [], [], [], []
    with torch.no_grad():
        for batch in batches:
            inputs = {k: v for k, v in batch.items() if k not in ("labels", "next_sentence_label")}
            out = model(**inputs)
            selected = batch["labels"] != -100
            logits = out.prediction_logits[selected]
            targets = batch["labels"][selected]
            losses.append(F.cross_entropy(logits, targets, reduction="none"))
            correct.append(logits.argmax(-1) == targets)
            nsp_losses.append(
                F.cross_entropy(out.seq_relationship_logits, batch["next_sentence_label"], reduction="none")
            )
            nsp_correct.append(out.seq_relationship_logits.argmax(-1) == batch["next_sentence_label"])
    mlm_loss = torch.cat(losses).mean().item()
    nsp_loss = torch.cat(nsp_losses).mean().item()
    assert metrics["mlm_loss"] == pytest.approx(mlm_loss, rel=1e-5)
    assert metrics["mlm_accuracy"] == pytest.approx(torch.cat(correct).float().mean().item())
    assert metrics["nsp_accuracy"] == pytest.approx(torch.cat(nsp_correct).float().mean().item())
    assert metrics["loss"] == pytest.approx(mlm_loss + nsp_loss, rel=1e-5)
    assert metrics["mlm_perplexity"] == pytest.approx(math.exp(mlm_loss), rel=1e-5)
    # token weighting differs from averaging the per-batch means when batches hold different counts
    per_batch_mean = sum(loss.mean().item() for loss in losses) / len(losses)
    assert abs(per_batch_mean - mlm_loss) > 1e-4


def test_decoder_eval_ignores_padding_and_matches_model_loss():
    generator = torch.Generator().manual_seed(1)
    config = KilnDecoderConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=32,
        bos_token_id=1,
        eos_token_id=1,
        pad_token_id=0,
    )
    model = KilnDecoderForCausalLM(config).eval()
    ids = torch.randint(2, VOCAB, (4, 12), generator=generator)
    labels = ids.clone()
    labels[2, 8:] = -100  # a padded tail must not count
    attention = (labels != -100).long()
    batch = {"input_ids": ids, "attention_mask": attention, "labels": labels}
    metrics = evaluate_decoder(model, [batch], Accelerator(cpu=True))
    with torch.no_grad():
        expected = model(**batch).loss.item()  # the model's own mean over non-ignored shifted tokens
    assert metrics["loss"] == pytest.approx(expected, rel=1e-5)
    assert metrics["perplexity"] == pytest.approx(math.exp(expected), rel=1e-5)

"""Pretraining evaluation: token-weighted MLM loss/accuracy, NSP accuracy, CLM loss/perplexity, and BLiMP
zero-shot accuracy beside them (`with_blimp`, scored by pretrain.zero_shot).

Each evaluator computes per-sequence sums so that `gather_for_metrics` (which drops the samples duplicated to
even out the last batch across processes) weighs every real token exactly once.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from tqdm.auto import tqdm


def _sum_gathered(
    accelerator: Accelerator, sums: dict[str, list[torch.Tensor]], per_seq: dict[str, torch.Tensor]
):
    gathered = accelerator.gather_for_metrics(per_seq)
    for key, value in gathered.items():
        sums.setdefault(key, []).append(value.double().sum().cpu())


def _progress(loader, accelerator: Accelerator):
    return tqdm(
        loader, desc="eval", leave=False, disable=not accelerator.is_local_main_process, dynamic_ncols=True
    )


@torch.no_grad()
def evaluate_encoder(model, loader, accelerator: Accelerator) -> dict[str, float]:
    """MLM loss/accuracy over all masked tokens of the eval set (token-weighted), NSP/SOP loss/accuracy per pair;
    for ELECTRA, the generator's MLM numbers and the discriminator's loss/accuracy over every real token."""
    sums: dict[str, list[torch.Tensor]] = {}
    for batch in _progress(loader, accelerator):
        outputs = model(**batch)
        labels = batch["labels"]
        selected = labels != -100
        # the pretraining model's MLM logits, or the MLM-only model's (objective mlm)
        logits = outputs.get("prediction_logits", outputs.get("logits"))
        if logits.dim() == 3:  # dense logits (sparse_prediction off): keep the masked rows only
            logits = logits[selected]
        targets = labels[selected]
        token_loss = F.cross_entropy(logits.float(), targets, reduction="none")
        token_correct = (logits.argmax(-1) == targets).double()
        seq_index = selected.nonzero()[
            :, 0
        ]  # row order of the sparse logits is the order of labels[selected]
        batch_size = labels.shape[0]
        per_seq = {
            "mlm_loss_sum": torch.zeros(batch_size, device=labels.device, dtype=torch.float64).index_add_(
                0, seq_index, token_loss.double()
            ),
            "mlm_correct": torch.zeros(batch_size, device=labels.device, dtype=torch.float64).index_add_(
                0, seq_index, token_correct
            ),
            "mlm_tokens": selected.sum(-1).double(),
        }
        if "next_sentence_label" in batch and outputs.get("seq_relationship_logits") is not None:
            nsp_logits, nsp_labels = outputs.seq_relationship_logits, batch["next_sentence_label"]
            per_seq["nsp_correct"] = (nsp_logits.argmax(-1) == nsp_labels).double()
            per_seq["nsp_loss_sum"] = F.cross_entropy(
                nsp_logits.float(), nsp_labels, reduction="none"
            ).double()
            per_seq["nsp_count"] = torch.ones(batch_size, device=labels.device, dtype=torch.float64)
        if getattr(outputs, "replaced", None) is not None:  # ELECTRA's discriminator
            per_seq.update(_replaced_token_sums(outputs, batch["attention_mask"].bool()))
        _sum_gathered(accelerator, sums, per_seq)
    total = {key: float(torch.stack(values).sum()) for key, values in sums.items()}
    metrics = {}
    if total.get("mlm_tokens"):
        metrics["mlm_loss"] = total["mlm_loss_sum"] / total["mlm_tokens"]
        metrics["mlm_accuracy"] = total["mlm_correct"] / total["mlm_tokens"]
        metrics["mlm_perplexity"] = math.exp(min(metrics["mlm_loss"], 50.0))
    if total.get("nsp_count"):
        metrics["nsp_loss"] = total["nsp_loss_sum"] / total["nsp_count"]
        metrics["nsp_accuracy"] = total["nsp_correct"] / total["nsp_count"]
    if total.get("rtd_tokens"):
        metrics["rtd_loss"] = total["rtd_loss_sum"] / total["rtd_tokens"]
        metrics["rtd_accuracy"] = total["rtd_correct"] / total["rtd_tokens"]
        metrics.update(replaced_token_scores(total))
    # the same definition as the training loss (MLM + NSP/SOP, or MLM + lambda * RTD), so the curves compare
    weight = getattr(accelerator.unwrap_model(model), "discriminator_weight", 1.0)
    metrics["loss"] = (
        metrics.get("mlm_loss", float("nan"))
        + metrics.get("nsp_loss", 0.0)
        + weight * metrics.get("rtd_loss", 0.0)
    )
    return metrics


def replaced_token_scores(total: dict[str, float]) -> dict[str, float]:
    """From the sums of `_replaced_token_sums`: the share of real tokens the generator replaced, and the
    discriminator's recall (replaced tokens it flagged) and precision (flagged tokens that were replaced); 0
    where nothing was replaced or flagged."""
    return {
        "replaced_fraction": total["replaced"] / total["rtd_tokens"],
        "replaced_recall": total["replaced_found"] / max(total["replaced"], 1.0),
        "replaced_precision": total["replaced_found"] / max(total["flagged"], 1.0),
    }


def _replaced_token_sums(outputs, real: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per sequence: the discriminator's loss sum and right answers over its real tokens, how many of them the
    generator replaced, how many it flagged as replaced, and how many replaced ones it found."""
    logits, replaced = outputs.discriminator_logits.float(), outputs.replaced.bool() & real
    token_loss = F.binary_cross_entropy_with_logits(logits, replaced.float(), reduction="none")
    judged = logits > 0
    return {
        "rtd_loss_sum": (token_loss * real).sum(-1).double(),
        "rtd_correct": ((judged == replaced) & real).sum(-1).double(),
        "rtd_tokens": real.sum(-1).double(),
        "replaced": replaced.sum(-1).double(),
        "replaced_found": (judged & replaced).sum(-1).double(),
        "flagged": (judged & real).sum(-1).double(),
    }


@torch.no_grad()
def evaluate_decoder(model, loader, accelerator: Accelerator) -> dict[str, float]:
    """Next-token loss over every predicted token of the eval set, and its perplexity."""
    sums: dict[str, list[torch.Tensor]] = {}
    for batch in _progress(loader, accelerator):
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        logits = model(**inputs).logits
        labels = batch["labels"][:, 1:]
        logits = logits[:, :-1]
        token_loss = F.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]),
            labels.reshape(-1),
            ignore_index=-100,
            reduction="none",
        ).view(labels.shape)
        valid = labels != -100
        per_seq = {
            "loss_sum": (token_loss * valid).sum(-1).double(),
            "correct": ((logits.argmax(-1) == labels) & valid).sum(-1).double(),
            "tokens": valid.sum(-1).double(),
        }
        _sum_gathered(accelerator, sums, per_seq)
    total = {key: float(torch.stack(values).sum()) for key, values in sums.items()}
    if not total.get("tokens"):
        return {}
    loss = total["loss_sum"] / total["tokens"]
    return {
        "loss": loss,
        "perplexity": math.exp(min(loss, 50.0)),
        "accuracy": total["correct"] / total["tokens"],
    }


def with_blimp(evaluator, blimp):
    """`evaluator` (model, loader, accelerator) -> metrics, with `blimp` (a pretrain.zero_shot.BlimpEvaluation)
    scored after it: its mean accuracy over paradigms as `blimp`. Every process scores its share of the batches
    with the unwrapped model and the sums are exchanged, so the number is the same on any number of processes."""

    def evaluate(model, loader, accelerator: Accelerator) -> dict[str, float]:
        metrics = evaluator(model, loader, accelerator)
        result = blimp.evaluate(accelerator.unwrap_model(model), accelerator)
        return {**metrics, "blimp": result["mean"]}

    return evaluate


__all__ = ["evaluate_decoder", "evaluate_encoder", "replaced_token_scores", "with_blimp"]

"""Losses of the Kiln heads: the LM and MLM heads' chunked cross-entropy, which never holds the (N, V) logits, and
the sequence classifiers' BERT/GPT-2 rules.

Uploaded to the Hub next to the checkpoints (trust_remote_code): it imports only torch.
"""

import torch
import torch.nn.functional as F

# Logits per chunk in `linear_cross_entropy` (rows = this // vocab size: 667 at a 50k vocabulary). Measured on
# a 2-core CPU (LM head + loss, 4096 x 256 -> 50257): 166 rows 1.22x the plain path, 333 1.30x, 667 1.37x,
# 1334 1.34x. Small chunks lose because every chunk re-reads and re-writes the (V, C) weight gradient.
LM_LOSS_CHUNK_ELEMENTS = 1 << 25


class _LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of `hidden @ weight.T (+ bias)` against `targets`, chunk by chunk of rows.

    The gradients are computed in the forward pass, while each chunk of logits is at hand (softmax - one-hot,
    then the two matmuls the backward of a Linear would do), so the (N, V) logits are never held whole and the
    backward only scales the saved gradients: the same three matmuls as the plain path, a fraction of its
    memory, and two reused chunk buffers instead of several fresh (N, V) tensors.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk_rows, compute_dtype):
        # hidden (N, C) and targets (N,): only rows with a target; weight (V, C); bias (V,) or None
        wants_grads = any(ctx.needs_input_grad[:3])
        num_rows, vocab_size = hidden.shape[0], weight.shape[0]
        chunk_rows = max(1, min(chunk_rows, num_rows))
        with torch.autocast(hidden.device.type, enabled=False):
            hidden_c, weight_c = hidden.to(compute_dtype), weight.to(compute_dtype)
            bias_c = bias.to(compute_dtype) if bias is not None else None
            logits_buffer = hidden_c.new_empty(chunk_rows, vocab_size)
            log_probs_buffer = hidden_c.new_empty(chunk_rows, vocab_size, dtype=torch.float32)
            loss_sum = hidden.new_zeros((), dtype=torch.float32)
            grad_hidden = torch.empty_like(hidden_c) if wants_grads else None
            grad_weight = torch.zeros_like(weight, dtype=torch.float32) if wants_grads else None
            grad_bias = (
                torch.zeros_like(bias, dtype=torch.float32) if wants_grads and bias is not None else None
            )
            for start in range(0, num_rows, chunk_rows):
                rows = hidden_c[start : start + chunk_rows]  # (n, C)
                chunk_targets = targets[start : start + chunk_rows]  # (n,)
                n = rows.shape[0]
                if bias_c is None:
                    logits = torch.mm(rows, weight_c.T, out=logits_buffer[:n])  # (n, V)
                else:
                    logits = torch.addmm(bias_c, rows, weight_c.T, out=logits_buffer[:n])
                log_probs = torch.log_softmax(logits, -1, dtype=torch.float32, out=log_probs_buffer[:n])
                loss_sum -= log_probs.gather(1, chunk_targets[:, None]).sum()
                if not wants_grads:
                    continue
                probs = log_probs.exp_()
                probs[torch.arange(n, device=probs.device), chunk_targets] -= 1.0
                grad_logits = probs.to(compute_dtype)  # d(sum of losses) / d(logits); no copy in float32
                torch.mm(grad_logits, weight_c, out=grad_hidden[start : start + n])
                if grad_bias is not None:
                    grad_bias += probs.sum(0)
                if grad_logits.dtype == torch.float32:
                    grad_weight.addmm_(grad_logits.T, rows)
                else:
                    grad_weight += grad_logits.T @ rows
        if wants_grads:
            ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
            ctx.num_rows, ctx.dtypes = num_rows, (hidden.dtype, weight.dtype)
        return loss_sum / num_rows  # no rows: nan, as F.cross_entropy gives

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        scale = grad_loss / ctx.num_rows
        hidden_dtype, weight_dtype = ctx.dtypes
        grad_hidden = (grad_hidden * scale).to(hidden_dtype)
        grad_weight = (grad_weight * scale).to(weight_dtype)
        if grad_bias is not None:
            grad_bias = (grad_bias * scale).to(weight_dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """`F.cross_entropy(F.linear(hidden, weight, bias), targets, ignore_index=...)` without the (N, V) logits.

    hidden (..., C), weight (V, C), bias (V,) or None, targets (...). Same loss and gradients as the plain
    path (up to float rounding); under autocast the matmuls run in the autocast dtype and the softmax in
    float32, as they would there. `chunk_rows` defaults to LM_LOSS_CHUNK_ELEMENTS logits per chunk on CPU.
    """
    hidden = hidden.reshape(-1, hidden.shape[-1])
    targets = targets.reshape(-1).to(hidden.device)
    kept = targets != ignore_index
    hidden, targets = hidden[kept], targets[kept]  # ignored rows take no FLOPs and get zero gradient
    device_type = hidden.device.type
    compute_dtype = (
        torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else weight.dtype
    )
    if chunk_rows is None:
        # accelerators: their caching allocators reuse any size, and larger matmuls keep them busier
        elements = LM_LOSS_CHUNK_ELEMENTS if device_type == "cpu" else 2 * LM_LOSS_CHUNK_ELEMENTS
        chunk_rows = max(1, elements // weight.shape[0])
    return _LinearCrossEntropy.apply(hidden, weight, bias, targets, chunk_rows, compute_dtype)


def sequence_classification_loss(config, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """BERT's / GPT-2's rules: `config.problem_type` inferred from the labels when unset; regression (MSE),
    single-label (cross-entropy) or multi-label (BCE with logits). logits (B, num_labels)."""
    num_labels = config.num_labels
    if config.problem_type is None:
        if num_labels == 1:
            config.problem_type = "regression"
        elif num_labels > 1 and labels.dtype in (torch.long, torch.int):
            config.problem_type = "single_label_classification"
        else:
            config.problem_type = "multi_label_classification"
    labels = labels.to(logits.device)
    if config.problem_type == "regression":
        if num_labels == 1:
            return F.mse_loss(logits.squeeze(), labels.squeeze())
        return F.mse_loss(logits, labels)
    if config.problem_type == "single_label_classification":
        return F.cross_entropy(logits.view(-1, num_labels), labels.view(-1))
    return F.binary_cross_entropy_with_logits(logits, labels)


__all__ = ["LM_LOSS_CHUNK_ELEMENTS", "linear_cross_entropy", "sequence_classification_loss"]

"""What a logging window reports: real (non-padding) tokens, the loss parts summed over its optimizer steps, the
printed line, and the accelerator's peak FLOP/s that model FLOP utilisation (MFU) divides by."""

from __future__ import annotations

import time

import torch


def count_real_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Tokens that are not padding (tokens/s, tokens_seen and MFU count these)."""
    mask = batch.get("attention_mask")
    if torch.is_tensor(mask):
        return int(mask.sum())
    ids = batch.get("input_ids")
    return int(ids.numel()) if torch.is_tensor(ids) else 0


class LogWindow:
    """Loss parts, steps and real tokens summed over the optimizer steps of one logging interval."""

    def __init__(self):
        self.sums: dict[str, torch.Tensor] = {}
        self.steps = 0
        self.tokens = 0
        self.start = time.perf_counter()

    def add(self, parts: dict[str, torch.Tensor], tokens: int) -> None:
        for name, value in parts.items():
            self.sums[name] = self.sums[name] + value if name in self.sums else value
        self.steps += 1
        self.tokens += tokens


def format_metrics(step: int, metrics: dict[str, float]) -> str:
    return f"step {step}: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())


# Dense bf16/fp16 tensor-core peaks (no sparsity) of common accelerators, for the MFU estimate.
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "A10G": 125e12, "L4": 121e12, "V100": 125e12}


def guess_peak_flops(device: torch.device, mixed_precision: str) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, peak in PEAK_FLOPS.items():
        if key in name:
            return peak if mixed_precision in ("bf16", "fp16") else peak / 2
    return None


__all__ = ["LogWindow", "PEAK_FLOPS", "count_real_tokens", "format_metrics", "guess_peak_flops"]

"""What a logging window reports: real (non-padding) tokens, the loss parts summed over its optimizer steps, the
printed line, and the accelerator's peak FLOP/s that model FLOP utilisation (MFU) divides by."""

from __future__ import annotations

import time
from typing import Any

import torch


def count_real_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Tokens that are not padding (tokens/s, tokens_seen and MFU count these). A packed causal-LM batch carries
    no padding mask (its documents are read from its position ids); its padding is where the labels are -100."""
    mask = batch.get("attention_mask")
    if (
        torch.is_tensor(mask) and mask.dim() == 4
    ):  # (B, 1, T, T) query x key, as the hybrid objective's: keys some
        return int(mask[:, 0].any(-2).sum())  # query sees (its padding queries see only the first token)
    if torch.is_tensor(mask):
        return int(mask.sum())
    labels = batch.get("labels")
    if torch.is_tensor(labels) and torch.is_tensor(batch.get("position_ids")):
        return int((labels != -100).sum())
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

    def state(self, accelerator) -> dict[str, Any]:
        """The window so far, as plain data for a checkpoint (every process calls it: the sums are gathered): its
        steps, real tokens and seconds, and each loss part's sum on each process with its dtype, so a resumed run
        logs what an uninterrupted one logs at the window's end."""
        names = sorted(self.sums)
        sums: dict[str, list[float]] = {}
        if names:
            local = torch.stack([self.sums[n].detach().to(torch.float64).reshape(()) for n in names])
            shares = accelerator.gather(local.to(accelerator.device).unsqueeze(0))
            shares = shares.reshape(accelerator.num_processes, len(names)).cpu()
            sums = {n: shares[:, i].tolist() for i, n in enumerate(names)}
        return {
            "steps": self.steps,
            "tokens": self.tokens,
            "seconds": time.perf_counter() - self.start,
            "sums": sums,
            "dtypes": {n: str(self.sums[n].dtype).removeprefix("torch.") for n in names},
        }

    @classmethod
    def restored(cls, saved: dict[str, Any] | None, accelerator) -> LogWindow:
        """The window a checkpoint saved (`state`, checked as kiln.checkpoint_state.LOG_WINDOW declares); None: a new
        one. Each process takes its own sums; saved on another number of processes, the first process takes their
        total (the logged mean is the sum over processes)."""
        window = cls()
        if not saved:
            return window
        for name, shares in saved["sums"].items():
            if len(shares) == accelerator.num_processes:
                value = shares[accelerator.process_index]
            else:
                value = sum(shares) if accelerator.process_index == 0 else 0.0
            dtype = getattr(torch, saved["dtypes"][name])
            window.sums[name] = torch.tensor(value, dtype=torch.float64).to(dtype).to(accelerator.device)
        window.steps, window.tokens = saved["steps"], saved["tokens"]
        window.start -= saved["seconds"]
        return window


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

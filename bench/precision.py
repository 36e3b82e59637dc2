"""fp32 against bf16 for Kiln's pretraining step on this machine: tokens/s and achieved GFLOP/s of each precision,
against the machine's measured fp32 and bf16 matmul peaks, at the 30-minute recipes' shapes and at base shapes.

    python bench/precision.py --json bench/results/precision-$(hostname).json        # every preset, one thread
    python bench/precision.py --preset llama-tiny --preset modernbert-tiny --rounds 5

Each preset's model is built once (Kiln's, converted from transformers' class drawn from one seed, as in
bench/throughput.py) and copied per variant, so every variant starts from the same weights:
- `fp32`: what Kiln trains in without mixed precision;
- `bf16-autocast`: `torch.autocast("cpu", torch.bfloat16)` around the forward, fp32 weights and AdamW, which is what
  `--training.mixed_precision bf16` runs through accelerate;
- `bf16-weights`: the whole model and AdamW in bf16, no fp32 master copy: not a recipe (updates below bf16's
  resolution are lost), only the upper bound of what going past autocast (bf16 weights beside fp32 master copies)
  could gain, since that adds a copy per step to this.
Warmed-up steps (forward, backward, fused AdamW) are timed in rounds, every variant once per round in an order
that rotates each round; the speed-up of a variant is the median over rounds of fp32's step time over its own
(paired, so slow drifts of the load cancel). Every round also times a 2048 x 2048 matmul in fp32 and in bf16 (best of
3): a variant's share of peak is its achieved FLOP/s (`count_flops_per_token`, the LM head at the masked share for
encoders) over that round's matmul rate of its own compute precision. Timings need a quiet machine: the record keeps
the CPU, its bf16 units and the load average at both ends.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from dataclasses import asdict

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:  # python bench/precision.py: import the repository's bench package
    sys.path.insert(0, REPO_ROOT)

from bench.machine import cpu_name, load_average  # noqa: E402
from bench.throughput import (  # noqa: E402
    MASK_PROBABILITY,
    MODERNBERT_MASK_PROBABILITY,
    MatmulPeak,
    Preset,
    StepRunner,
    build_kiln,
    build_reference,
    make_batches,
)
from kiln.precision import cpu_bf16_units  # noqa: E402
from pretrain.modeling import count_flops_per_token  # noqa: E402

PRESETS = {
    # the 30-minute recipes' shapes (configs/experiments/grid-*.yaml, encoder-30min.yaml): batch x length as trained
    "bert-tiny": Preset("encoder", 2, 128, 2, 8192, 32, 64, rounds=7),
    "modernbert-tiny": Preset("modernbert", 4, 128, 2, 8192, 32, 64, rounds=7),
    "gpt2-tiny": Preset("decoder", 4, 256, 4, 4096, 16, 128, rounds=7),
    "llama-tiny": Preset("llama", 4, 256, 4, 4096, 16, 128, rounds=7, kv_heads=2),
    # base shapes (BERT-base, ModernBERT-base, GPT-2 small, a 125M Llama) at batches a CPU step takes in seconds
    "bert-base": Preset("encoder", 12, 768, 12, 30522, 8, 128, rounds=3, warmup=1),
    "modernbert-base": Preset("modernbert", 22, 768, 12, 50368, 4, 128, rounds=3, warmup=1),
    "gpt2-base": Preset("decoder", 12, 768, 12, 50257, 4, 128, rounds=3, warmup=1),
    "llama-base": Preset("llama", 12, 768, 12, 32000, 4, 128, rounds=3, warmup=1, kv_heads=4),
}
VARIANTS = ("fp32", "bf16-autocast", "bf16-weights")


def runners_for(preset: Preset, seed: int) -> tuple[dict[str, StepRunner], float]:
    device = torch.device("cpu")
    reference = build_reference(preset, 64, seed, device)
    model = build_kiln(reference, "kiln", preset.kind)
    del reference
    batches = make_batches(preset, model.config.vocab_size, seed, device)
    lm_share = {"encoder": MASK_PROBABILITY, "modernbert": MODERNBERT_MASK_PROBABILITY}.get(preset.kind, 1.0)
    flops_per_token = count_flops_per_token(model.config, preset.seq_len, lm_head_fraction=lm_share)
    runners = {
        "fp32": StepRunner("fp32", model, batches, "fused", False, device),
        "bf16-autocast": StepRunner("bf16-autocast", copy.deepcopy(model), batches, "fused", True, device),
        "bf16-weights": StepRunner(
            "bf16-weights", copy.deepcopy(model).to(torch.bfloat16), batches, "fused", False, device
        ),
    }
    return runners, flops_per_token


def time_preset(name: str, preset: Preset, rounds: int | None, seed: int) -> dict:
    runners, flops_per_token = runners_for(preset, seed)
    peaks = {
        "fp32": MatmulPeak(torch.device("cpu")),
        "bf16": MatmulPeak(torch.device("cpu"), dtype=torch.bfloat16),
    }
    for runner in runners.values():
        for _ in range(preset.warmup):
            runner.step()
    order = list(VARIANTS)
    for _ in range(rounds or preset.rounds):
        for peak in peaks.values():
            peak.sample()
        for variant in order:
            runners[variant].timed_step()
        order = order[1:] + order[:1]
    tokens = preset.batch_size * preset.seq_len
    fp32_times = runners["fp32"].times
    result = {"preset": asdict(preset), "tokens_per_step": tokens, "flops_per_token": flops_per_token}
    result["matmul_gflops"] = {dtype: statistics.median(peak.samples) / 1e9 for dtype, peak in peaks.items()}
    for variant, runner in runners.items():
        compute = "fp32" if variant == "fp32" else "bf16"
        per_round = [tokens * flops_per_token / t for t in runner.times]
        result[variant] = {
            "tokens_per_s": tokens / statistics.median(runner.times),
            "gflops": tokens / statistics.median(runner.times) * flops_per_token / 1e9,
            "share_of_fp32_peak": statistics.median(f / p for f, p in zip(per_round, peaks["fp32"].samples)),
            "share_of_own_peak": statistics.median(f / p for f, p in zip(per_round, peaks[compute].samples)),
            "speedup_over_fp32": statistics.median(f / t for f, t in zip(fp32_times, runner.times)),
            "step_s": runner.times,
        }
    return result


def print_precision_table(results: dict[str, dict]) -> None:
    print(
        f"{'preset':<16} {'fp32 GF/s':>9} {'matmul fp32':>11} {'matmul bf16':>11} "
        + " ".join(f"{v + ' x':>16}" for v in VARIANTS[1:])
        + " "
        + " ".join(f"{v + ' %pk':>18}" for v in VARIANTS)
    )
    for name, r in results.items():
        print(
            f"{name:<16} {r['fp32']['gflops']:>9.1f} {r['matmul_gflops']['fp32']:>11.1f} "
            f"{r['matmul_gflops']['bf16']:>11.1f} "
            + " ".join(f"{r[v]['speedup_over_fp32']:>16.2f}" for v in VARIANTS[1:])
            + " "
            + " ".join(f"{100 * r[v]['share_of_own_peak']:>17.0f}%" for v in VARIANTS)
        )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", action="append", choices=sorted(PRESETS), help="repeatable; default: all")
    parser.add_argument(
        "--rounds", type=int, default=None, help="timed rounds per preset (default: the preset's)"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (default 1: one core, as the recipes)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the record here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    record = {
        "cpu": cpu_name(),
        "bf16_units": list(cpu_bf16_units()),
        "torch": torch.__version__,
        "threads": args.threads,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loadavg_at_start": load_average(),
        "presets": {},
    }
    for name in args.preset or list(PRESETS):
        record["presets"][name] = time_preset(name, PRESETS[name], args.rounds, args.seed)
        print_precision_table({name: record["presets"][name]})
    record["loadavg_at_end"] = load_average()
    print_precision_table(record["presets"])
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(record, file, indent=1)
    return record


if __name__ == "__main__":
    main()

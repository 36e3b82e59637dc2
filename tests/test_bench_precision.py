"""bench/precision.py on a model small enough for the suite: every variant timed from the same weights, its speed-up
paired against fp32, its achieved FLOP/s set against the matmul peak of its own compute precision."""

import json

import pytest
import torch

from bench import precision
from bench.throughput import Preset


@pytest.mark.slow
def test_the_precision_bench_records_every_variant_against_both_peaks(tmp_path, monkeypatch):
    monkeypatch.setattr(
        precision,
        "PRESETS",
        {
            "enc": Preset("encoder", 1, 32, 2, 128, 4, 16, rounds=2, warmup=1),
            "llama": Preset("llama", 1, 32, 2, 128, 4, 16, rounds=2, warmup=1, kv_heads=1),
        },
    )
    out = tmp_path / "precision.json"
    record = precision.main(["--json", str(out)])
    assert json.loads(out.read_text()) == record
    assert set(record["presets"]) == {"enc", "llama"} and "bf16_units" in record and record["cpu"]
    for result in record["presets"].values():
        assert result["matmul_gflops"]["fp32"] > 0 and result["matmul_gflops"]["bf16"] > 0
        for variant in precision.VARIANTS:
            timing = result[variant]
            assert len(timing["step_s"]) == 2 and timing["tokens_per_s"] > 0
            # achieved FLOP/s are the model's FLOPs over the median step time, as tokens/s are
            assert abs(timing["gflops"] * 1e9 / result["flops_per_token"] / timing["tokens_per_s"] - 1) < 1e-9
            assert 0 < timing["share_of_own_peak"] and 0 < timing["speedup_over_fp32"]
        assert result["fp32"]["speedup_over_fp32"] == 1.0  # fp32 paired with itself


def test_the_variants_start_from_the_same_weights():
    runners, _ = precision.runners_for(Preset("llama", 1, 32, 2, 128, 2, 8, rounds=1, kv_heads=1), seed=0)
    fp32, autocast, weights = (dict(runners[v].model.named_parameters()) for v in precision.VARIANTS)
    assert all(weights[name].dtype.is_floating_point for name in weights)
    for name, value in fp32.items():
        assert torch.equal(value, autocast[name]) and value.data_ptr() != autocast[name].data_ptr()
        assert weights[name].dtype == torch.bfloat16 and torch.equal(value.to(torch.bfloat16), weights[name])

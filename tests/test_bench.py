"""The benchmark scripts stay runnable and keep comparing the same function (no timing is asserted here).

bench/throughput.py is what the README's performance table comes from: if its two models stopped computing the
same loss, or an ablation variant stopped being the same function, the table would compare different things.
"""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]


def load_bench(name: str):
    spec = importlib.util.spec_from_file_location(f"kiln_bench_{name}", REPO_ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def throughput():
    return load_bench("throughput")


@pytest.fixture
def tiny_presets(throughput, monkeypatch):
    presets = {
        "encoder-test": throughput.Preset("encoder", 2, 32, 2, 500, 4, 32, rounds=2, warmup=1),
        "decoder-test": throughput.Preset("decoder", 2, 32, 2, 500, 4, 32, rounds=2, warmup=1),
    }
    for name, preset in presets.items():
        monkeypatch.setitem(throughput.PRESETS, name, preset)
    return presets


def test_throughput_times_every_variant_of_the_same_function(throughput, tiny_presets, tmp_path, capsys):
    out = tmp_path / "result.json"
    throughput.main(
        ["--preset", "encoder-test", "--preset", "decoder-test", "--ablate", "--no-memory", "--json", str(out)]
    )
    results = json.loads(out.read_text())
    assert [r["preset"] for r in results] == ["encoder-test", "decoder-test"]
    for result in results:
        kind = result["shape"]["kind"]
        check = result["check"]
        assert math.isclose(check["kiln_loss"], check["reference_loss"], rel_tol=1e-4)
        assert math.isclose(check["kiln_grad_norm"], check["reference_grad_norm"], rel_tol=1e-3)
        expected = {"kiln", "reference", *throughput.ABLATIONS[kind]}
        assert set(result["models"]) == expected
        for name, model in result["models"].items():
            assert len(model["step_times_s"]) == 2 and model["tokens_per_s"] > 0
            if name != "reference":
                reference_times = result["models"]["reference"]["step_times_s"]
                paired = [r / k for r, k in zip(reference_times, model["step_times_s"])]
                assert model["speedup"] == pytest.approx(statistics.median(paired))
        assert result["flops_per_token"] > 0 and result["machine"]["device"] == "cpu"
    table = capsys.readouterr().out
    assert "encoder-test" in table and "decoder-test" in table and "transformers" in table


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_every_ablation_variant_computes_the_reference_loss_and_gradients(throughput, tiny_presets, kind):
    preset = tiny_presets[f"{kind}-test"]
    device = torch.device("cpu")
    reference = throughput.build_reference(preset, 1, 0, device)
    batches = throughput.make_batches(preset, reference.config.vocab_size, 0, device)
    reference_runner = throughput.StepRunner("reference", reference, batches, "forloop", False, device)
    for variant in ["kiln", *throughput.ABLATIONS[kind]]:
        model = throughput.build_kiln(reference, variant, kind)
        runner = throughput.StepRunner(variant, model, batches, "forloop", False, device)
        check = throughput.check_same_function(reference_runner, runner, batches[1], 1e-4)
        assert math.isclose(check["kiln_loss"], check["reference_loss"], rel_tol=1e-4), variant


def test_a_model_that_differs_from_the_reference_is_refused(throughput, tiny_presets):
    preset = tiny_presets["encoder-test"]
    device = torch.device("cpu")
    reference = throughput.build_reference(preset, 1, 0, device)
    batches = throughput.make_batches(preset, reference.config.vocab_size, 0, device)
    kiln = throughput.build_kiln(reference, "kiln", "encoder")
    with torch.no_grad():
        kiln.mlm_head.dense.weight.mul_(1.5)
    runners = [
        throughput.StepRunner(name, model, batches, "forloop", False, device)
        for name, model in (("reference", reference), ("kiln", kiln))
    ]
    with pytest.raises(SystemExit, match="not the same function"):
        throughput.check_same_function(*runners, batches[0], 1e-4)


def test_vocab_padding_pads_the_reference_and_kiln_alike(throughput, tiny_presets):
    preset = tiny_presets["decoder-test"]
    reference = throughput.build_reference(preset, 64, 0, torch.device("cpu"))
    kiln = throughput.build_kiln(reference, "kiln", "decoder")
    assert reference.config.vocab_size == kiln.config.vocab_size == 512

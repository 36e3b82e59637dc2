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
        "modernbert-test": throughput.Preset("modernbert", 4, 32, 2, 500, 4, 48, rounds=2, warmup=1),
        "llama-test": throughput.Preset("llama", 2, 32, 2, 500, 4, 32, rounds=2, warmup=1, kv_heads=1),
    }
    for name, preset in presets.items():
        monkeypatch.setitem(throughput.PRESETS, name, preset)
    return presets


@pytest.mark.slow
def test_throughput_times_every_variant_of_the_same_function(throughput, tiny_presets, tmp_path, capsys):
    out = tmp_path / "result.json"
    throughput.main(
        [
            "--preset",
            "encoder-test",
            "--preset",
            "decoder-test",
            "--preset",
            "llama-test",
            "--ablate",
            "--no-memory",
            "--json",
            str(out),
        ]
    )
    results = json.loads(out.read_text())
    assert [r["preset"] for r in results] == ["encoder-test", "decoder-test", "llama-test"]
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
    assert (
        "encoder-test" in table
        and "decoder-test" in table
        and "llama-test" in table
        and "transformers" in table
    )


@pytest.mark.parametrize("kind", ["encoder", "decoder", "modernbert", "llama"])
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


def test_throughput_measures_the_matmul_peak_and_a_cpu_mfu(throughput, tiny_presets, tmp_path):
    out = tmp_path / "result.json"
    throughput.main(
        [
            "--preset",
            "encoder-test",
            "--no-memory",
            "--matmul-size",
            "64",
            "--matmul-repeats",
            "2",
            "--json",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    rates = result["matmul_flops_per_round"]
    assert len(rates) == 2 and all(rate > 0 for rate in rates)
    assert result["peak_flops"] == max(rates) and result["peak_source"].startswith("measured")
    for model in result["models"].values():
        per_round = [
            result["flops_per_token"] * 4 * 32 / time / rate
            for time, rate in zip(model["step_times_s"], rates)
        ]
        assert model["mfu_rounds"] == pytest.approx(per_round)
        assert model["mfu"] == pytest.approx(statistics.median(per_round))
        assert model["mfu_cpu_time"] > 0
    assert len(result["matmul_flops_per_cpu_s"]) == 2


# ------------------------------------------------------------------------------------------------- inference
SST2 = REPO_ROOT.parent / "shared" / "data" / "sst2"  # not shipped: ../shared/data beside the repository


@pytest.fixture(scope="module")
def inference():
    return load_bench("inference")


@pytest.fixture
def tiny_sst2(tmp_path):
    """A few SST-2-shaped rows (the real folder is not shipped with the repository)."""
    words = "a film of great charm and wit , but the plot is thin and dull in its second half".split()
    rows = ["sentence\tlabel"] + [f"{' '.join(words[i:] + words[:i])}\t{i % 2}" for i in range(len(words))]
    for split in ("train", "dev"):
        (tmp_path / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    return tmp_path


def test_inference_checks_equal_outputs_and_times_both_models(inference, tiny_sst2, tmp_path, capsys):
    out = tmp_path / "inference.json"
    report = inference.main(
        [
            "--shape",
            "tiny",
            "--rounds",
            "2",
            "--latency-inputs",
            "2",
            "--batch",
            "1",
            "--batch",
            "3",
            "--new-tokens",
            "5",
            "--vocab-size",
            "300",
            "--sst2",
            str(tiny_sst2),
            "--json",
            str(out),
        ]
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    cases = {(r["task"], r["batch"]) for r in report["results"]}
    assert cases == {(t, b) for t in ("fill-mask", "text-classification", "generate") for b in (1, 3)}
    for r in report["results"]:
        assert len(r["kiln_times_s"]) == len(r["reference_times_s"]) == 2
        paired = [a / b for a, b in zip(r["reference_times_s"], r["kiln_times_s"])]
        assert r["speedup"] == pytest.approx(statistics.median(paired))
        assert r["check"]["max_score_diff"] <= 1e-4
        if r["task"] == "generate":  # exactly new_tokens more than the (padded) prompt, for every row
            assert r["check"]["tokens_compared"] > 0
    assert "transformers" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["fill-mask", "text-classification", "generate"])
def test_inference_pairs_are_the_same_function_and_a_different_one_is_refused(inference, tiny_sst2, kind):
    sentences = inference.read_sentences(tiny_sst2, "dev")
    wordpiece, bpe = inference.build_tokenizers(sentences, 300)
    tokenizer = bpe if kind == "generate" else wordpiece
    reference, kiln = inference.build_pair(
        kind, inference.SHAPES["tiny"], len(tokenizer), 0, tokenizer.pad_token_id
    )
    assert type(kiln).__name__.startswith("Kiln") and not type(reference).__name__.startswith("Kiln")
    inputs = sentences[:3]
    if kind == "fill-mask":
        inputs = inference.masked_inputs(inputs, wordpiece.mask_token)
    tasks = [inference.Task(kind, model, tokenizer, inputs, 3, 6) for model in (reference, kiln)]
    inference.compare_outputs(kind, tasks[0].run(), tasks[1].run(), 1e-4)
    with torch.no_grad():  # a different function must be caught before anything is timed
        generator = torch.Generator().manual_seed(0)
        for parameter in kiln.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator))
    with pytest.raises(SystemExit, match="not the same function|different"):
        inference.compare_outputs(kind, tasks[0].run(), tasks[1].run(), 1e-4)


# ------------------------------------------------------------------------------------------------- fine-tuning
@pytest.fixture(scope="module")
def finetune_bench():
    return load_bench("finetune")


@pytest.mark.slow
def test_finetune_bench_trains_both_from_the_same_start_and_passes_kiln_options(
    finetune_bench, tiny_sst2, tmp_path
):
    out = tmp_path / "finetune.json"
    report = finetune_bench.main(
        [
            "--shape",
            "test",
            "--train-samples",
            "12",
            "--batch-size",
            "4",
            "--eval-batch-size",
            "8",
            "--vocab-size",
            "300",
            "--rounds",
            "2",
            "--sst2",
            str(tiny_sst2),
            "--json",
            str(out),
            "--",
            "--training.max_steps",
            "2",
        ]
    )
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert report["check"]["max_logit_diff"] <= 1e-4
    assert report["settings"]["kiln_options"] == ["--training.max_steps", "2"]
    assert len(report["kiln"]) == len(report["reference"]) == 2
    for kiln, reference in zip(report["kiln"], report["reference"]):
        assert (
            kiln["optimizer_steps"] == 2 and kiln["examples_trained"] == 8
        )  # the option reached classify.py
        assert reference["optimizer_steps"] == 3 and reference["examples_trained"] == 12
        assert "--training.max_steps" in kiln["argv"]
    # each side is seeded: the same start, data and seed give the same dev scores in every round, so a round's
    # differences are timing only
    for side in ("kiln", "reference"):
        first, second = report[side]
        assert (first["dev_accuracy"], first["dev_loss"]) == (second["dev_accuracy"], second["dev_loss"]), (
            side
        )
    # the record names no machine folder: the repository's config relative to it, the temporary files as $WORK
    argv = report["kiln"][0]["argv"]
    assert argv[argv.index("--config") + 1] == "configs/finetune/offline/classify-sst2.yaml"
    assert argv[argv.index("--data.train_file") + 1] == "$WORK/train.tsv"
    assert str(REPO_ROOT) not in out.read_text() and "kiln-bench-finetune-" not in out.read_text()
    paired = [k["examples_per_s"] / r["examples_per_s"] for k, r in zip(report["kiln"], report["reference"])]
    assert report["speedup"] == pytest.approx(statistics.median(paired))


@pytest.fixture
def tiny_conll(tmp_path):
    """A few CoNLL-2003-shaped sentences (word POS chunk NER; made up: the real data is research-only)."""
    sentences = [
        [("Anna", "B-PER"), ("visited", "O"), ("Paris", "B-LOC"), ("in", "O"), ("May", "O")],
        [("The", "O"), ("United", "B-ORG"), ("Nations", "I-ORG"), ("met", "O"), ("today", "O"), (".", "O")],
        [("Berlin", "B-LOC"), ("won", "O")],
        [
            ("John", "B-PER"),
            ("Smith", "I-PER"),
            ("likes", "O"),
            ("French", "B-MISC"),
            ("wine", "O"),
            (".", "O"),
        ],
    ]
    lines = ["-DOCSTART- -X- -X- O", ""]
    for index in range(8):
        for word, tag in sentences[index % len(sentences)]:
            lines.append(f"{word} NN B-NP {tag}")
        lines.append("")
    for split in ("train", "valid"):
        (tmp_path / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return tmp_path


@pytest.mark.slow
def test_finetune_bench_tagging_mode_trains_both_and_scores_the_same_way(
    finetune_bench, tiny_conll, tmp_path
):
    report = finetune_bench.main(
        [
            "--task",
            "conll2003",
            "--shape",
            "test",
            "--train-samples",
            "8",
            "--batch-size",
            "4",
            "--eval-batch-size",
            "4",
            "--vocab-size",
            "120",
            "--conll2003",
            str(tiny_conll),
            "--variant",
            "padded=--model.unpad_inputs false",
            "--json",
            str(tmp_path / "tag.json"),
        ]
    )
    assert report["task"] == "conll2003" and report["check"]["max_logit_diff"] <= 1e-4
    for run in report["kiln"] + report["reference"] + report["variants"]["padded"]["runs"]:
        assert 0 <= run["dev_f1"] <= 1 and run["examples_trained"] == 8
    assert report["variants"]["padded"]["options"] == ["--model.unpad_inputs", "false"]
    assert "--model.unpad_inputs" in report["variants"]["padded"]["runs"][0]["argv"]


def test_finetune_bench_refuses_a_start_that_is_not_the_same_function(finetune_bench, tiny_sst2):
    import transformers

    from pretrain.convert import from_transformers
    from pretrain.data.tokenizer import train_tokenizer

    sentences = [row["sentence"] for row in finetune_bench.read_tsv(tiny_sst2 / "dev.tsv")]
    tokenizer = train_tokenizer(sentences, "wordpiece", 300)
    config = transformers.BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=2,
    )
    reference = transformers.BertForSequenceClassification(config).eval()
    kiln = from_transformers(reference).eval()
    assert finetune_bench.same_start(reference, kiln, tokenizer, sentences)["max_logit_diff"] <= 1e-4
    with torch.no_grad():
        kiln.classifier.bias.add_(1.0)
    with pytest.raises(SystemExit, match="not the same function"):
        finetune_bench.same_start(reference, kiln, tokenizer, sentences)


@pytest.mark.slow
def test_throughput_profile_splits_a_step_into_phases_and_op_categories(throughput, tiny_presets, tmp_path):
    out = tmp_path / "profile.json"
    throughput.main(["--preset", "encoder-test", "--profile", "--no-memory", "--json", str(out)])
    result = json.loads(out.read_text())
    assert set(result["profile"]) == {"kiln", "reference"}
    for profile in result["profile"].values():
        assert set(profile["phases_s"]) == {"forward", "backward", "optimizer"}
        assert sum(profile["categories_share"].values()) == pytest.approx(1.0)
        assert "matmul (linear layers, LM head)" in profile["categories_s"]


@pytest.mark.slow
def test_padding_bench_counts_real_tokens_and_profiles_the_runs_step(tmp_path, monkeypatch):
    """bench/padding.py on the shipped corpus, a small run: the counts add up, the padding fraction is what they
    say, the profile (bench/throughput.py's op categories) and data-path timing (README "Pretraining on real
    corpora") are filled in, and --time leaves the model's unpadding threshold as it found it."""
    import pretrain.modeling.modeling_kiln_encoder as encoder

    padding = load_bench("padding")
    threshold = encoder.UNPAD_MIN_PADDING
    monkeypatch.chdir(
        REPO_ROOT
    )  # main() moves to the repository (the run's relative data paths); undone after
    report = padding.main(
        [
            "--profile",
            "2",
            "--time",
            "3",
            "--json",
            str(tmp_path / "padding.json"),
            "--",
            "--model.hidden_size",
            "32",
            "--model.num_hidden_layers",
            "1",
            "--model.num_attention_heads",
            "2",
            "--model.intermediate_size",
            "64",
            "--training.max_steps",
            "4",
            "--training.per_device_train_batch_size",
            "8",
        ]
    )
    assert (
        encoder.UNPAD_MIN_PADDING == threshold > 0
    )  # --time unpads every batch, then puts the threshold back
    assert report == json.loads((tmp_path / "padding.json").read_text())
    assert 0 < report["real"] <= report["unrounded"] <= report["padded"]
    assert report["padding_fraction"] == pytest.approx(1 - report["real"] / report["padded"])
    profile = report["profile"]
    assert profile["steps"] == 2 and profile["step_ms"] > 0
    assert sum(profile["categories_share"].values()) == pytest.approx(1.0)
    assert 0 < profile["categories_share"]["matmul (linear layers, LM head)"] < 1
    top = list(profile["top_ops_s"].values())
    assert top == sorted(top, reverse=True) and sum(top) <= profile["profiled_self_cpu_s"] * (1 + 1e-9)
    assert profile["data_path_ms"]["fetch"] > 0 and profile["data_path_ms"]["collate"] > 0
    assert set(report["timing"]["variants"]) == set(padding.VARIANTS)
    check = report["timing"]["check"]  # padded and unpadded agree before anything is timed
    assert check["loss_padded"] == pytest.approx(check["loss_unpadded"], rel=1e-4)


@pytest.mark.slow
def test_data_scale_bench_prepares_its_corpus_and_writes_the_measurements(tmp_path):
    """bench/data_scale.py on a 0.3 MB corpus: the generated corpus has the asked size in both layouts, and one
    prepare (2 worker processes) and a 1-step run from it are measured into the JSON (the README's corpus-size
    table comes from it)."""
    data_scale = load_bench("data_scale")
    for layout, files in (("big", 1), ("files", 2)):
        written = data_scale.write_corpus(tmp_path / layout, 3.0, layout)
        assert 2_999_990 < written <= 3_000_000 and len(list((tmp_path / layout).glob("*.txt"))) == files
    results = data_scale.main(
        [
            "--sizes",
            "0.3",
            "--layouts",
            "files",
            "--num_proc",
            "2",
            "--no-first-step",
            "--workdir",
            str(tmp_path / "work"),
            "--json",
            str(tmp_path / "scale.json"),
            "--",
            "--tokenizer.vocab_size",
            "512",
        ]
    )
    row = json.loads((tmp_path / "scale.json").read_text())["rows"][0]
    assert results["rows"] == [row]
    assert row["corpus_mb"] == 0.3 and row["num_proc"] == 2 and row["cpu_s"] > 0 and row["disk_mb"] > 0
    assert row["peak_rss_mb"] > 50 and row["mb_per_cpu_s"] == round(0.3 / row["cpu_s"], 2)
    assert "manifest.json" in row["log_tail"]
    assert set(row["phases_s"]) >= {"sample", "tokenizer", "shards", "manifest"} and row["startup_s"] > 0
    # the 1-step run's own memory, and the corpus: the wide-vocabulary generator's
    assert 100 < row["train_peak_anon_mb"] < row["train_peak_rss_mb"] and len(row["train_load"]) == 2
    assert results["corpus"] == "wide" and "REF-" in (tmp_path / "big" / "corpus.txt").read_text()


# ------------------------------------------------------------------------------------------------- bench/gpu.py
@pytest.mark.slow
def test_gpu_bench_runs_every_stage_and_makes_its_tables_from_the_record(tiny_sst2, tmp_path, capsys):
    """bench/gpu.py --smoke: every stage (pretraining step, engines with resume and final/, fine-tuning, inference)
    runs the real benchmark script in a fresh process and keeps its record (the engines stage is
    `python bench/engines.py --engine none --kind encoder --steps 3 --small --eval-batches 1`, checked whole here); the Markdown is made from the JSON
    alone, so --tables remakes it byte for byte; on a GPU the stages' limits fit in 8 minutes."""
    gpu = load_bench("gpu")
    record, tables = tmp_path / "gpu.json", tmp_path / "gpu.md"
    report = gpu.main(["--smoke", "--json", str(record), "--md", str(tables), "--sst2", str(tiny_sst2)])
    assert json.loads(record.read_text()) == json.loads(json.dumps(report))
    stages = report["stages"]
    assert list(stages) == ["pretrain-encoder", "pretrain-decoder", "engines", "finetune", "inference"]
    for name, stage in stages.items():
        assert stage["status"] == "ok", (name, stage.get("log_tail"))
        assert stage["record"], name
    assert (
        stages["pretrain-encoder"]["record"]["check"]
        and stages["pretrain-decoder"]["record"]["shape"]["kind"] == "decoder"
    )
    (engine_row,) = stages["engines"]["record"]
    assert engine_row["resume_max_abs_diff"] == 0.0 and "error" not in engine_row["final"]
    # docs/multi-node.md's `python bench/engines.py` in its CPU smoke form (`--engine none --small`), the stage's
    # command: it trains, resumes from its step-2 checkpoint and loads final/
    assert engine_row["run1_exit"] == 0 and engine_row["run2_exit"] == 0 and engine_row["resumed_from"] == 2
    assert (
        engine_row["resume_max_abs_diff"] == 0
    )  # step 3 re-trained from the step-2 checkpoint: the same loss
    final = engine_row["final"]
    assert math.isfinite(final["heldout_mlm_loss"]) and len(final["fill_mask"]) == 5
    assert final["auto_map"]["AutoModelForPreTraining"].endswith("KilnEncoderForPreTraining")
    text = tables.read_text()
    for heading in ("## Pretraining step", "## FSDP2 and DeepSpeed ZeRO-2", "## Fine-tuning", "## Inference"):
        assert heading in text
    kiln_rate = stages["pretrain-encoder"]["record"]["models"]["kiln"]["tokens_per_s"]
    assert f"{kiln_rate:,.0f}" in text and "not measured" not in text and "smoke run" in text
    assert str(tmp_path) not in record.read_text()  # temporary folders are named $WORK, the data SST2
    again = tmp_path / "again.md"
    gpu.main(["--tables", str(record), "--md", str(again)])
    assert again.read_text() == text
    # a stage whose data is missing is recorded as skipped and its table row says so
    skipped = gpu.main(
        [
            "--smoke",
            "--stage",
            "inference",
            "--sst2",
            str(tmp_path / "none"),
            "--json",
            str(tmp_path / "s.json"),
            "--md",
            str(tmp_path / "s.md"),
        ]
    )
    assert skipped["stages"]["inference"]["status"] == "skipped"
    assert "not measured (skipped" in (tmp_path / "s.md").read_text()
    full = gpu.stage_commands(
        gpu.main.__globals__["argparse"].Namespace(smoke=False, sst2=tiny_sst2), tmp_path
    )
    assert sum(stage["limit_s"] for stage in full.values()) <= 480
    assert any("deepspeed-zero2" in stage["argv"] for stage in full.values())
    assert any("fsdp" in stage["argv"] for stage in full.values())


@pytest.mark.parametrize("sparse_reference", [False, True])
def test_the_modernbert_presets_time_the_preset_against_modernbert(
    throughput, tiny_presets, sparse_reference, tmp_path
):
    """Kiln's modernbert preset against transformers' ModernBertForMaskedLM, from the same weights, with a local
    window shorter than the batch (48 tokens, ModernBERT's 128-token window cut to 16 by the test)."""
    out = tmp_path / "modernbert.json"
    argv = ["--preset", "modernbert-test", "--no-memory", "--matmul-repeats", "0", "--json", str(out)]
    original = throughput.build_reference

    def narrow_window(*args, **kwargs):
        model = original(*args, **kwargs)
        model.config.local_attention = 16
        return type(model)(model.config)

    throughput.build_reference = narrow_window
    try:
        throughput.main(argv + (["--reference-sparse"] if sparse_reference else []))
    finally:
        throughput.build_reference = original
    result = json.loads(out.read_text())
    assert type(result["check"]) is dict and result["shape"]["kind"] == "modernbert"
    assert math.isclose(result["check"]["kiln_loss"], result["check"]["reference_loss"], rel_tol=1e-4)
    assert result["settings"]["reference_sparse_prediction"] is sparse_reference
    assert set(result["models"]) == {"kiln", "reference"} and result["models"]["kiln"]["speedup"] > 0
    assert result["date_utc"] and result["machine"]["cpu"]

"""ELECTRA (`--model.objective electra`, issue 26): the replaced-token labels and masking rates over thousands
of tokens, the generator's samples drawn from its softmax, training through the one loop (loss falls, exact
resume, 2 processes = 1), final/ as a plain Kiln encoder that AutoModel and the fine-tuning scripts load with
the generator beside it, and equality with transformers' ElectraForPreTraining / ElectraForMaskedLM."""

import json
import os
import subprocess
import sys

import pytest
import torch
import transformers
from kiln_testing import (
    REPO,
    WITHOUT_THE_PROJECT,
    launch_two_processes,
    losses,
    run,
    tiny_encoder_config,
)
from safetensors.torch import load_file

from kiln.config import REPO_ROOT
from kiln.errors import ConfigError
from pretrain.convert import from_transformers, main, to_transformers
from pretrain.data import ElectraCollator, train_tokenizer
from pretrain.modeling import (
    KilnEncoderForElectraPreTraining,
    KilnEncoderForMaskedLM,
    KilnEncoderForReplacedTokenDetection,
    KilnEncoderModel,
    sample_from_logits,
)

ELECTRA = ["--model.objective", "electra"]
BOOK = (REPO_ROOT / "data/pretrain/alice_in_wonderland.txt").read_text(encoding="utf-8").split("\n")


def rows(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# ----------------------------------------------------------------------------------------------------------
# masking, replacement and labels


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(BOOK, kind="wordpiece", vocab_size=400, model_max_length=128)


def single_segments(tokenizer, count: int, frequent: range, seed: int = 0) -> list[dict]:
    """[CLS] ... [SEP] sequences of 8..60 tokens, a third of them from the `frequent` ids, with their index."""
    g = torch.Generator().manual_seed(seed)
    features = []
    for index in range(count):
        length = int(torch.randint(8, 60, (), generator=g))
        ids = torch.randint(5, len(tokenizer), (length,), generator=g)
        common = torch.rand(length, generator=g) < 1 / 3
        ids[common] = torch.randint(frequent.start, frequent.stop, (int(common.sum()),), generator=g)
        body = torch.cat(
            [torch.tensor([tokenizer.cls_token_id]), ids, torch.tensor([tokenizer.sep_token_id])]
        )
        features.append({"input_ids": body, "example_index": index})
    return features


def test_replaced_labels_masking_rates_and_samples_over_thousands_of_tokens(tokenizer):
    """3,000 sequences (~100,000 tokens): the collator masks 15% of the maskable tokens with 80/10/10, the
    discriminator sees the original everywhere but the masked positions, where it sees the generator's
    samples; its labels are exactly (input != original); the samples follow the generator's softmax."""
    torch.manual_seed(0)
    model = KilnEncoderForElectraPreTraining(
        tiny_encoder_config(vocab_size=len(tokenizer), max_position_embeddings=64, sparse_prediction=True)
    ).eval()
    frequent = range(5, 7)
    with torch.no_grad():  # a peaked generator: the original token is often sampled back (then not replaced)
        model.generator.mlm_head.decoder.bias[frequent.start : frequent.stop] = 8.0
    collator = ElectraCollator(tokenizer, seed=3)
    special = torch.tensor(tokenizer.all_special_ids)
    counts = dict.fromkeys(
        (
            "maskable",
            "selected",
            "mask",
            "random",
            "kept",
            "replaced",
            "expected_replaced",
            "variance_replaced",
        ),
        0.0,
    )
    sampled_frequent = torch.zeros(len(frequent))
    expected_frequent = torch.zeros(len(frequent))
    variance_frequent = torch.zeros(len(frequent))
    features = single_segments(tokenizer, 3000, frequent)
    for start in range(0, len(features), 250):
        batch = collator(features[start : start + 250])
        ids, labels, real = batch["input_ids"], batch["labels"], batch["attention_mask"].bool()
        selected = labels != -100
        original = torch.where(selected, labels, ids)
        with torch.no_grad():
            out = model(**batch)
        seen = out.discriminator_input_ids
        # the labels and the discriminator's input, exactly
        assert torch.equal(out.replaced, (seen != original).long())
        assert torch.equal(seen[~selected], original[~selected]), "an unmasked token changed"
        assert not (out.replaced.bool() & ~selected).any()
        assert out.rtd_loss == pytest.approx(
            float(
                torch.nn.functional.binary_cross_entropy_with_logits(
                    out.discriminator_logits[real], out.replaced[real].float()
                )
            ),
            rel=1e-6,
        )
        counts["maskable"] += int((real & ~torch.isin(original, special)).sum())
        counts["selected"] += int(selected.sum())
        counts["mask"] += int((selected & (ids == tokenizer.mask_token_id)).sum())
        counts["kept"] += int((selected & (ids == original)).sum())
        counts["random"] += int((selected & (ids != original) & (ids != tokenizer.mask_token_id)).sum())
        # the samples: P(replaced) = 1 - p(original) at each masked position; counts of the frequent ids
        probs = torch.softmax(out.prediction_logits.float(), dim=-1)  # (M, V), rows in the order of labels
        p_original = probs.gather(1, labels[selected][:, None]).squeeze(1)
        counts["replaced"] += int(out.replaced.sum())
        counts["expected_replaced"] += float((1 - p_original).sum())
        counts["variance_replaced"] += float((p_original * (1 - p_original)).sum())
        samples = seen[selected]
        for j, token in enumerate(frequent):
            sampled_frequent[j] += int((samples == token).sum())
            expected_frequent[j] += float(probs[:, token].sum())
            variance_frequent[j] += float((probs[:, token] * (1 - probs[:, token])).sum())
    assert counts["maskable"] > 90_000

    def within(observed, expected, variance, sigmas=4.5):
        return abs(observed - expected) <= sigmas * variance**0.5 + 1e-9

    n, k = counts["maskable"], counts["selected"]
    assert within(k, 0.15 * n, n * 0.15 * 0.85), k / n
    assert within(counts["mask"], 0.8 * k, k * 0.8 * 0.2), counts["mask"] / k
    assert within(counts["random"], 0.1 * k, k * 0.1 * 0.9), counts["random"] / k
    assert within(counts["kept"], 0.1 * k, k * 0.1 * 0.9) or counts["kept"] >= 0.1 * k  # random may hit it
    # not vacuous: the peaked generator gives the original back often, so many masked tokens are not replaced
    assert counts["expected_replaced"] < 0.9 * k
    assert within(counts["replaced"], counts["expected_replaced"], counts["variance_replaced"])
    for j in range(len(frequent)):
        assert within(sampled_frequent[j], expected_frequent[j], variance_frequent[j]), (
            j,
            sampled_frequent,
            expected_frequent,
        )  # noqa: E501


def test_samples_are_a_function_of_the_uniforms_and_follow_the_softmax():
    logits = torch.log(torch.tensor([[0.5, 0.0, 0.25, 0.25]]).clamp_min(1e-30)).expand(4, 4)
    uniforms = torch.tensor([0.0, 0.49, 0.5, 0.99])
    assert sample_from_logits(logits, uniforms).tolist() == [0, 0, 2, 3]  # never the zero-probability id 1
    big = torch.randn(20_000, 7) * 2
    draws = sample_from_logits(big, torch.rand(20_000, generator=torch.Generator().manual_seed(0)))
    mean_probs = torch.softmax(big, -1).mean(0)
    frequencies = torch.bincount(draws, minlength=7).float() / len(draws)
    torch.testing.assert_close(frequencies, mean_probs, atol=0.012, rtol=0)


def test_generator_shares_the_embeddings_and_takes_no_gradient_through_sampling():
    torch.manual_seed(0)
    model = KilnEncoderForElectraPreTraining(
        tiny_encoder_config(generator_size=0.5, discriminator_weight=7.0)
    )
    generator, discriminator = model.generator, model.discriminator
    assert generator.model.embeddings is discriminator.model.embeddings
    assert generator.mlm_head.decoder.weight is discriminator.model.embeddings.word_embeddings.weight
    assert (generator.config.hidden_size, generator.config.num_attention_heads) == (16, 2)
    assert generator.config.intermediate_size == 32 and generator.config.embedding_size == 32
    assert generator.model.embeddings_project.weight.shape == (16, 32)
    ids = torch.randint(5, 256, (2, 12))
    labels = torch.full_like(ids, -100)
    labels[:, 2::3] = ids[:, 2::3]
    out = model(ids.masked_fill(labels != -100, 4), labels=labels)
    torch.testing.assert_close(out.loss, out.mlm_loss + 7.0 * out.rtd_loss)
    # the discriminator's loss reaches the generator's own layers only through the shared embeddings
    out.rtd_loss.backward()
    assert all(p.grad is None for p in generator.model.layers.parameters())
    assert discriminator.model.embeddings.word_embeddings.weight.grad.abs().sum() > 0


# ----------------------------------------------------------------------------------------------------------
# training through the loop


@pytest.fixture(scope="module")
def electra_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("electra") / "run"
    state = run(
        out,
        *ELECTRA,
        "--training.max_steps",
        40,
        "--training.lr",
        3e-3,
        "--training.save_steps",
        0,
        "--training.eval_steps",
        20,
    )
    return out, state


def test_electra_learns_and_logs_its_curves(electra_run):
    out, state = electra_run
    assert state.global_step == 40
    train = [r for r in rows(out) if "train/loss" in r]
    assert {"train/mlm_loss", "train/rtd_loss", "train/rtd_accuracy"} <= set(train[0])
    for r in train:  # train/loss is the objective: MLM + lambda (50) x RTD
        assert r["train/loss"] == pytest.approx(r["train/mlm_loss"] + 50 * r["train/rtd_loss"], rel=1e-5)
        assert 0 <= r["train/rtd_accuracy"] <= 1

    def mean(key, steps):
        return sum(train[s - 1][key] for s in steps) / len(steps)

    first, last = range(1, 6), range(36, 41)
    assert mean("train/loss", last) < mean("train/loss", first) - 3.0
    assert mean("train/rtd_loss", last) < mean("train/rtd_loss", first) - 0.05
    assert mean("train/mlm_loss", last) < mean("train/mlm_loss", first) - 0.05
    assert mean("train/rtd_accuracy", last) > mean("train/rtd_accuracy", first)
    evals = [r for r in rows(out) if "eval/rtd_accuracy" in r]
    assert len(evals) == 2
    for r in evals:
        assert {"eval/mlm_loss", "eval/mlm_accuracy", "eval/rtd_loss", "eval/replaced_fraction"} <= set(r)
        assert r["eval/loss"] == pytest.approx(r["eval/mlm_loss"] + 50 * r["eval/rtd_loss"], rel=1e-6)
        assert 0 < r["eval/replaced_fraction"] < 0.15  # at most the masked share of the real tokens


RECALL_FLOOR, PRECISION_FLOOR = 0.2, 0.6


def assert_finds_replaced_tokens(scores: dict) -> None:
    """The discriminator flags a share of the replaced tokens, and mostly replaced ones: a discriminator that
    answers "original" everywhere (recall and precision 0) fails, and so does one that flags everything
    (precision = the replaced share, ~0.14)."""
    assert scores["replaced_recall"] >= RECALL_FLOOR, scores
    assert scores["replaced_precision"] >= PRECISION_FLOOR, scores


def detectable_corpus(folder) -> tuple:
    """(corpus file, tokenizer folder) where replacements can be told from the start: 400 documents of 13 words
    in a fixed cycle, and a 1,000-token vocabulary from a book. The young generator samples mostly tokens the
    corpus never holds (told by the token alone), later wrong words in the cycle (told by their neighbours)."""
    import random

    tokenizer = train_tokenizer(BOOK, kind="wordpiece", vocab_size=1000, model_max_length=128)
    tokenizer.save_pretrained(folder / "tokenizer")
    words = "the cat sat on a mat and she said it was very good".split()
    rng = random.Random(0)
    documents = []
    for _ in range(400):
        start = rng.randrange(len(words))
        documents.append(
            " ".join(words[(start + i) % len(words)] for i in range(rng.randrange(20, 50))) + "."
        )
    corpus = folder / "cycle.txt"
    corpus.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    return corpus, folder / "tokenizer"


def test_the_discriminator_finds_replaced_tokens_where_they_can_be_told(tmp_path):
    corpus, tokenizer = detectable_corpus(tmp_path)
    out = tmp_path / "run"
    run(
        out,
        *ELECTRA,
        "--data.data_files",
        corpus,
        "--tokenizer.name_or_path",
        tokenizer,
        "--training.max_steps",
        80,
        "--training.lr",
        3e-3,
        "--training.save_steps",
        0,
        "--training.eval_steps",
        40,
    )
    evals = {r["step"]: r for r in rows(out) if "eval/replaced_recall" in r}
    scores = {key.removeprefix("eval/"): value for key, value in evals[40].items()}
    assert 0.1 < scores["replaced_fraction"] < 0.2
    assert_finds_replaced_tokens(scores)


def test_the_replaced_token_check_fails_for_a_discriminator_that_answers_original_everywhere():
    from types import SimpleNamespace

    from pretrain.evaluation import _replaced_token_sums, replaced_token_scores

    g = torch.Generator().manual_seed(0)
    real = torch.arange(64).expand(32, 64) < torch.randint(8, 64, (32, 1), generator=g)  # padded rows
    replaced = (torch.rand(real.shape, generator=g) < 0.14) & real
    for logits in (
        torch.full(real.shape, -5.0),
        torch.full(real.shape, 5.0),
    ):  # "original" / "replaced" everywhere
        sums = _replaced_token_sums(SimpleNamespace(discriminator_logits=logits, replaced=replaced), real)
        scores = replaced_token_scores({key: float(value.sum()) for key, value in sums.items()})
        with pytest.raises(AssertionError):
            assert_finds_replaced_tokens(scores)
    # the right answers pass
    sums = _replaced_token_sums(
        SimpleNamespace(discriminator_logits=replaced * 10.0 - 5.0, replaced=replaced), real
    )
    assert_finds_replaced_tokens(
        replaced_token_scores({key: float(value.sum()) for key, value in sums.items()})
    )


def test_final_is_the_discriminator_with_the_generator_beside_it(electra_run, tmp_path):
    from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

    out, _ = electra_run
    final = out / "final"
    config = json.loads((final / "config.json").read_text())
    assert config["model_type"] == "kiln_encoder" and config["architectures"] == [
        "KilnEncoderForReplacedTokenDetection"
    ]
    assert "generator_size" not in config and not config["sparse_prediction"]
    encoder, info = AutoModel.from_pretrained(final, output_loading_info=True)
    assert type(encoder) is KilnEncoderModel and set(info["missing_keys"]) == {
        "pooler.dense.weight",
        "pooler.dense.bias",
    }
    discriminator, info = KilnEncoderForReplacedTokenDetection.from_pretrained(
        final, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    generator, info = AutoModelForMaskedLM.from_pretrained(final / "generator", output_loading_info=True)
    assert type(generator) is KilnEncoderForMaskedLM and not info["missing_keys"]
    assert generator.config.hidden_size == 8 and generator.config.embedding_size == 32
    shared = "model.embeddings.word_embeddings.weight"
    assert torch.equal(generator.state_dict()[shared], discriminator.state_dict()[shared])
    tokenizer = AutoTokenizer.from_pretrained(final / "generator")
    batch = tokenizer(["it was a [MASK] night"], return_tensors="pt")
    assert generator.eval()(**batch).logits.shape[-1] == generator.config.vocab_size
    assert "AutoModelForMaskedLM.from_pretrained" in (final / "README.md").read_text()

    # conversion of both folders to transformers' ELECTRA classes and back, with the CLI
    main([str(final), str(tmp_path / "disc")])
    main([str(final / "generator"), str(tmp_path / "gen")])
    hf_disc = transformers.ElectraForPreTraining.from_pretrained(tmp_path / "disc").eval()
    hf_gen = transformers.ElectraForMaskedLM.from_pretrained(tmp_path / "gen").eval()
    discriminator.eval()
    with torch.no_grad():
        torch.testing.assert_close(hf_disc(**batch).logits, discriminator(**batch).logits, atol=1e-5, rtol=0)
        torch.testing.assert_close(hf_gen(**batch).logits, generator(**batch).logits, atol=1e-5, rtol=0)


# a fresh interpreter that cannot import Kiln: what a Hub user of the pushed folder has
REMOTE_CHILD = (
    WITHOUT_THE_PROJECT
    + r"""
import torch, transformers

final, out_file = sys.argv[2:4]
ids = torch.tensor([[2, 40, 41, 42, 43, 3]])
load = dict(trust_remote_code=True)
with torch.no_grad():
    results = {
        "encoder": transformers.AutoModel.from_pretrained(final, **load).eval()(ids).last_hidden_state,
        "discriminator": transformers.AutoModelForPreTraining.from_pretrained(final, **load).eval()(ids).logits,
        "generator": transformers.AutoModelForMaskedLM.from_pretrained(final, subfolder="generator", **load)
        .eval()(ids).logits,
    }
torch.save(results, out_file)
"""
)


@pytest.mark.slow
def test_final_loads_with_remote_code_where_kiln_is_not_installed(electra_run, tmp_path):
    out, _ = electra_run
    final = out / "final"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, "-c", REMOTE_CHILD, str(REPO), str(final), str(tmp_path / "r.pt")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    remote = torch.load(tmp_path / "r.pt")
    ids = torch.tensor([[2, 40, 41, 42, 43, 3]])
    with torch.no_grad():
        encoder = KilnEncoderModel.from_pretrained(final).eval()
        discriminator = KilnEncoderForReplacedTokenDetection.from_pretrained(final).eval()
        generator = KilnEncoderForMaskedLM.from_pretrained(final / "generator").eval()
        torch.testing.assert_close(remote["encoder"], encoder(ids).last_hidden_state)
        torch.testing.assert_close(remote["discriminator"], discriminator(ids).logits)
        torch.testing.assert_close(remote["generator"], generator(ids).logits)


def test_a_fine_tuning_script_runs_from_final(electra_run, tmp_path):
    from test_finetune_scripts import FAST, classify, write_sentiment

    out, _ = electra_run
    files = write_sentiment(tmp_path)
    result = classify(
        "--model.checkpoint",
        out / "final",
        "--training.output_dir",
        tmp_path / "cls",
        *FAST,
        "--data.train_file",
        files["train"],
        "--data.validation_file",
        files["validation"],
        "--data.test_file",
        files["test"],
        "--training.max_steps",
        4,
        "--training.per_device_train_batch_size",
        16,
    )
    assert result.state.global_step == 4
    assert (tmp_path / "cls" / "final" / "model.safetensors").is_file()


def test_resume_is_bit_identical(tmp_path):
    """Stop at step 4 of 8 (accumulation 2, evaluations every 3 steps), resume: the same losses, accuracies,
    evaluations and final weights of both models as the uninterrupted run."""
    common = [
        *ELECTRA,
        "--training.gradient_accumulation_steps",
        2,
        "--training.max_steps",
        8,
        "--training.eval_steps",
        3,
        "--training.save_total_limit",
        3,
        "--data.max_train_documents",
        40,
    ]
    full = tmp_path / "full"
    run(full, *common, "--training.save_steps", 4)
    resumed = tmp_path / "resumed"
    run(
        resumed,
        *common,
        "--training.save_steps",
        0,
        "--tokenizer.name_or_path",
        full / "tokenizer",
        "--training.resume_from_checkpoint",
        full / "checkpoints" / "step-00000004",
    )

    def after(out, step):
        return [
            {k: v for k, v in r.items() if "tokens_per_s" not in k} for r in rows(out) if r["step"] > step
        ]

    assert after(resumed, 4) == after(full, 4) and len(after(full, 4)) >= 5
    for folder in ("final", "final/generator"):
        a, b = (
            load_file(full / folder / "model.safetensors"),
            load_file(resumed / folder / "model.safetensors"),
        )
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), folder


@pytest.mark.slow
def test_two_processes_match_one(tmp_path):
    """DDP over 2 gloo processes with half the batch: the same losses, accuracies and evaluations as 1 process
    (dropout off): masks and the generator's samples are drawn per example, not per process."""
    common = [
        *ELECTRA,
        "--data.max_train_documents",
        2,
        "--training.eval_steps",
        5,
        "--training.max_steps",
        10,
        "--training.gradient_accumulation_steps",
        2,
        "--training.save_steps",
        0,
        "--model.hidden_dropout_prob",
        0,
        "--model.attention_probs_dropout_prob",
        0,
    ]
    one = tmp_path / "one"
    run(one, *common, "--training.per_device_train_batch_size", 8)
    two = tmp_path / "two"
    # max_eval_batches counts batches of the whole evaluation: the same sequences on any number of processes
    launch_two_processes(
        two,
        *common,
        "--training.per_device_train_batch_size",
        4,
        "--tokenizer.name_or_path",
        one / "tokenizer",
    )
    a, b = losses(one), losses(two)
    assert sorted(a) == sorted(b) == list(range(1, 11))
    for step in a:
        assert abs(a[step] - b[step]) < 1e-3, (step, a[step], b[step])  # loss ~40: 50 x the RTD loss
    train = {
        name: [r for r in rows(folder) if "train/rtd_accuracy" in r]
        for name, folder in (("1", one), ("2", two))
    }
    for x, y in zip(train["1"], train["2"]):
        assert x["train/rtd_accuracy"] == pytest.approx(y["train/rtd_accuracy"], abs=1e-6)
        assert x["train/mlm_loss"] == pytest.approx(y["train/mlm_loss"], abs=1e-4)
    evals = {
        name: [r for r in rows(folder) if "eval/rtd_accuracy" in r]
        for name, folder in (("1", one), ("2", two))
    }
    assert len(evals["1"]) == len(evals["2"]) == 2
    for x, y in zip(evals["1"], evals["2"]):
        assert x["eval/rtd_accuracy"] == pytest.approx(y["eval/rtd_accuracy"], abs=1e-9)
        assert x["eval/replaced_fraction"] == pytest.approx(y["eval/replaced_fraction"], abs=1e-9)
        assert x["eval/mlm_loss"] == pytest.approx(y["eval/mlm_loss"], abs=1e-4)


def test_bad_electra_settings_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"^--model.generator_size must be a number in \(0, 1\], got 1.5$"):
        run(tmp_path / "a", *ELECTRA, "--model.generator_size", 1.5)
    with pytest.raises(ConfigError, match="do not divide it"):
        run(tmp_path / "b", *ELECTRA, "--model.num_attention_heads", 4, "--model.generator_size", 0.4)
    with pytest.raises(ConfigError, match="init_from is not supported with --model.objective electra"):
        run(tmp_path / "c", *ELECTRA, "--model.init_from", tmp_path)


# ----------------------------------------------------------------------------------------------------------
# conversion with transformers' ELECTRA classes

ATOL = 1e-4
SHAPES = [  # unseen shapes: a generator narrower than its embeddings, and one as wide (no projection)
    dict(
        vocab_size=211,
        embedding_size=24,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=40,
        type_vocab_size=3,
    ),
    dict(
        vocab_size=97,
        embedding_size=48,
        hidden_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=64,
    ),
]
ELECTRA_TO_KILN = {
    transformers.ElectraForPreTraining: KilnEncoderForReplacedTokenDetection,
    transformers.ElectraForMaskedLM: KilnEncoderForMaskedLM,
    transformers.ElectraModel: KilnEncoderModel,
}


def electra_batch(vocab_size, seed):
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, vocab_size, (3, 13), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 8:] = 0
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, 6:] = 1
    batch = dict(
        input_ids=input_ids.masked_fill(attention_mask == 0, 0),
        attention_mask=attention_mask,
        token_type_ids=token_type_ids,
    )
    replaced = (torch.rand(input_ids.shape, generator=g) < 0.3).long()
    mlm_labels = torch.full_like(input_ids, -100)
    mlm_labels[:, 1::3] = input_ids[:, 1::3]
    return batch, {
        "ElectraForPreTraining": replaced,
        "ElectraForMaskedLM": mlm_labels.masked_fill(attention_mask == 0, -100),
    }


def assert_same(hf_model, kiln_model, batch, labels):
    real = batch["attention_mask"].bool()
    hf_out, kiln_out = hf_model(**batch), kiln_model(**batch)
    name = "logits" if getattr(hf_out, "logits", None) is not None else "last_hidden_state"
    torch.testing.assert_close(kiln_out[name][real], hf_out[name][real], atol=ATOL, rtol=0)
    if labels is not None:
        torch.testing.assert_close(
            kiln_model(**batch, labels=labels).loss,
            hf_model(**batch, labels=labels).loss,
            atol=1e-5,
            rtol=1e-6,
        )


@pytest.mark.parametrize("shape", SHAPES, ids=["projected", "same-width"])
@pytest.mark.parametrize("hf_class", list(ELECTRA_TO_KILN), ids=lambda c: c.__name__)
def test_electra_to_kiln_and_back(hf_class, shape):
    torch.manual_seed(0)
    config = transformers.ElectraConfig(max_position_embeddings=24, initializer_range=0.2, **shape)
    hf_model = hf_class(config).eval()
    kiln_model = from_transformers(hf_model)
    assert type(kiln_model) is ELECTRA_TO_KILN[hf_class]
    batch, labels = electra_batch(shape["vocab_size"], seed=1)
    assert_same(hf_model, kiln_model, batch, labels.get(hf_class.__name__))
    back = to_transformers(kiln_model, family="electra")
    assert type(back) is hf_class
    assert back.state_dict().keys() == hf_model.state_dict().keys()
    assert all(torch.equal(back.state_dict()[k], v) for k, v in hf_model.state_dict().items())


@pytest.mark.parametrize("kiln_class", [KilnEncoderForReplacedTokenDetection, KilnEncoderForMaskedLM])
def test_kiln_electra_to_transformers_and_back(kiln_class):
    torch.manual_seed(1)
    config = tiny_encoder_config(
        vocab_size=150, embedding_size=40, initializer_range=0.2, max_position_embeddings=24
    )
    kiln_model = kiln_class(config).eval()
    hf_model = to_transformers(kiln_model)  # the projection (or the head) makes it ELECTRA
    assert (
        type(hf_model).__name__
        == {
            KilnEncoderForReplacedTokenDetection: "ElectraForPreTraining",
            KilnEncoderForMaskedLM: "ElectraForMaskedLM",
        }[kiln_class]
    )
    batch, labels = electra_batch(150, seed=2)
    assert_same(hf_model, kiln_model, batch, labels.get(type(hf_model).__name__))
    again = from_transformers(hf_model)
    assert all(torch.equal(again.state_dict()[k], v) for k, v in kiln_model.state_dict().items())

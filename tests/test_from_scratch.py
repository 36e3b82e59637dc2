"""--model.from_scratch on finetune/classify.py and finetune/tag.py: the checkpoint's shape and tokenizer with
random weights (the baseline of the pretraining-vs-scratch experiments, configs/experiments/), on the shipped
samples (authorship, UD English-EWT)."""

import json

import pytest
import torch
from kiln_testing import DEBUG, REPO, one_torch_thread, run_main


@pytest.fixture(autouse=True)
def _one_torch_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """A tiny pretrained Kiln encoder (debug config, 8 steps)."""
    from pretrain.run import main as pretrain

    out = tmp_path_factory.mktemp("scratch-enc")
    run_main(
        pretrain,
        "--config",
        DEBUG,
        "--training.max_steps",
        8,
        "--training.lr",
        3e-3,
        "--training.save_steps",
        0,
        "--training.eval_steps",
        0,
        "--training.output_dir",
        out,
        "--training.overwrite_output_dir",
    )
    return out / "final"


def body(model) -> dict[str, torch.Tensor]:
    """The encoder's weights (without the task head), by name."""
    return {k: v for k, v in model.state_dict().items() if not k.startswith("classifier.")}


def built(script: str, checkpoint, from_scratch: bool, seed: int = 0, dropout=None):
    from finetune.classify import Labels, build_classifier
    from finetune.common import ClassifierModelConfig
    from finetune.tag import build_tagger

    torch.manual_seed(seed)
    cfg = ClassifierModelConfig(checkpoint=str(checkpoint), from_scratch=from_scratch, dropout=dropout)
    if script == "classify":
        labels = Labels(False, {"a": 0, "b": 1, "c": 2}, {0: "a", 1: "b", 2: "c"})
        return build_classifier(str(checkpoint), cfg, labels, keep_head=False)
    tags = ["O", "B-PER", "I-PER"]
    return build_tagger(
        str(checkpoint), cfg, {t: i for i, t in enumerate(tags)}, dict(enumerate(tags)), False
    )


@pytest.mark.parametrize("script", ["classify", "tag"])
def test_from_scratch_has_the_checkpoint_shapes_and_config_but_other_weights(encoder, script):
    pretrained, scratch = built(script, encoder, False), built(script, encoder, True)
    a, b = body(pretrained), body(scratch)
    assert a.keys() == b.keys() and len(a) > 10
    assert all(a[k].shape == b[k].shape for k in a)
    differing = [k for k in a if not torch.equal(a[k], b[k])]
    # every weight matrix and embedding differs (LayerNorms start at 1/0, so they may match after 8 steps)
    matrices = [k for k in a if a[k].dim() == 2]
    assert set(matrices) <= set(differing)
    for name in (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
        "num_labels",
    ):
        assert getattr(pretrained.config, name) == getattr(scratch.config, name), name
    assert scratch.config.id2label == pretrained.config.id2label
    # the random weights come from the seeded generator: a seed reproduces them, another seed changes them
    again, other = body(built(script, encoder, True, seed=0)), body(built(script, encoder, True, seed=1))
    assert all(torch.equal(b[k], again[k]) for k in b)
    assert not all(torch.equal(b[k], other[k]) for k in matrices)


@pytest.mark.parametrize("from_scratch", [False, True])
def test_dropout_override_reaches_the_encoder(encoder, from_scratch):
    """--model.dropout: the fine-tuning dropout of a checkpoint pretrained without (or with another) dropout."""
    for script in ("classify", "tag"):
        model = built(script, encoder, from_scratch, dropout=0.25)
        assert model.config.hidden_dropout_prob == model.config.attention_probs_dropout_prob == 0.25
        assert built(script, encoder, from_scratch).config.hidden_dropout_prob == 0.1  # the checkpoint's


def test_classify_and_tag_from_scratch_train_on_the_shipped_samples(encoder, tmp_path):
    from safetensors.torch import load_file

    from finetune.classify import main as classify
    from finetune.tag import main as tag

    pretrained = load_file(encoder / "model.safetensors")
    common = [
        "--model.checkpoint",
        encoder,
        "--model.from_scratch",
        "--training.max_steps",
        2,
        "--training.per_device_train_batch_size",
        8,
        "--data.max_train_samples",
        32,
        "--data.max_eval_samples",
        16,
        "--data.max_predict_samples",
        8,
        "--data.truncation",
        "quiet",
    ]
    for name, main in (("classify", classify), ("tag", tag)):
        out = tmp_path / name
        result = run_main(main, *common, "--training.output_dir", out)
        # the reported test accuracy is that of the predictions written for the 8 test rows
        rows = [json.loads(line) for line in (out / "predictions_test.jsonl").read_text().splitlines()]
        assert len(rows) == 8
        if name == "classify":
            pairs = [(row["prediction"], row["reference"]) for row in rows]
        else:  # token accuracy over the words that were seen
            pairs = [pair for row in rows for pair in zip(row["predictions"], row["references"])]
        assert result.test_metrics["accuracy"] == pytest.approx(sum(p == r for p, r in pairs) / len(pairs))
        final = out / "final"
        card = (final / "README.md").read_text()
        assert "random (from scratch" in card
        assert "base_model:" not in card  # only the shape came from the checkpoint
        weights = load_file(final / "model.safetensors")
        embeddings = [k for k in weights if k.endswith("word_embeddings.weight")]
        assert len(embeddings) == 1
        [key] = embeddings
        source = next(v for k, v in pretrained.items() if k.endswith("word_embeddings.weight"))
        assert weights[key].shape == source.shape
        # two steps at a small learning rate cannot turn random weights into the checkpoint's
        assert (weights[key] - source).abs().mean() > 1e-3
        config = json.loads((final / "config.json").read_text())
        assert config["hidden_size"] == json.loads((encoder / "config.json").read_text())["hidden_size"]


def test_from_scratch_cannot_predict(encoder, tmp_path):
    from finetune.classify import main as classify
    from kiln.errors import ConfigError

    with pytest.raises(ConfigError, match="--model.from_scratch"):
        run_main(
            classify,
            "--predict",
            "--model.from_scratch",
            "--model.checkpoint",
            encoder,
            "--training.output_dir",
            tmp_path / "p",
        )


def test_experiment_configs_parse():
    from finetune.classify import ClassifyConfig
    from finetune.seq2seq import Seq2SeqConfig
    from finetune.tag import TagConfig
    from kiln.config import build_config
    from pretrain.config import RunConfig

    folder = REPO / "configs/experiments"
    for name, cls in (("sst2", ClassifyConfig), ("ud-pos", TagConfig), ("conll2003", TagConfig)):
        config = build_config(cls, ["--config", str(folder / f"{name}.yaml")])
        assert config.model.checkpoint == "runs/encoder-30min/final"
        assert not config.model.from_scratch
    config = build_config(Seq2SeqConfig, ["--config", str(folder / "multi30k.yaml")])
    assert (config.model.encoder_checkpoint, config.model.decoder_checkpoint) == (
        "runs/encoder-30min/final",
        "runs/decoder-30min-de/final",
    )
    assert config.data.test_file is None  # the test file is read once, by the final runs that name it
    for name in ("encoder-30min", "decoder-30min-de"):  # capped by the wall clock, as they were run
        config = build_config(RunConfig, ["--config", str(folder / f"{name}.yaml")])
        assert config.training.max_train_time_s and config.training.max_train_time_s <= 1800
    # the 30-minute decoders: a fixed step count (30 minutes of one quiet core), the same run under any load
    for name, steps in (
        ("decoder-30min", 3000),
        ("decoder-30min-llama", 3400),
        ("decoder-30min-nomask", 3000),
    ):
        config = build_config(RunConfig, ["--config", str(folder / f"{name}.yaml")])
        assert (config.training.max_train_time_s, config.training.max_steps) == (0, steps), name
    assert not build_config(
        RunConfig, ["--config", str(folder / "decoder-30min-nomask.yaml")]
    ).data.document_masking
    german = build_config(RunConfig, ["--config", str(folder / "decoder-30min-de.yaml")])
    assert german.data.data_files == ["runs/corpus/multi30k-de/*.txt"]
    assert german.training.output_dir == "runs/decoder-30min-de"

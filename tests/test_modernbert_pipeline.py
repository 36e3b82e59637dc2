"""The `modernbert` preset through the pipeline: pretraining with ModernBERT's recipe knobs (MLM only, 30% masking,
warmup-stable-decay) resumes exactly, its final/ converts to transformers' ModernBertForMaskedLM with equal logits,
a converted ModernBERT continues pretraining through --model.init_from, and the task scripts adapt and fine-tune it."""

import json

import pytest
import torch
import transformers
from kiln_testing import one_torch_thread, run, run_main

from pretrain.convert import main as convert

PRESET = [
    "--model.preset",
    "modernbert",
    "--model.type_vocab_size",
    0,
    "--model.objective",
    "mlm",
    "--model.local_attention",
    16,
    "--model.num_hidden_layers",
    3,
    "--data.mlm_probability",
    0.3,
    "--training.lr_scheduler_type",
    "warmup_stable_decay",
    "--training.warmup_steps",
    2,
    "--training.decay_ratio",
    0.5,
    "--training.max_steps",
    8,
    "--training.save_steps",
    4,
    "--training.eval_steps",
    0,
    "--logging.logging_steps",
    1,
]


def _rows(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def _losses(folder):
    return {r["step"]: r["train/loss"] for r in _rows(folder) if "train/loss" in r}


@pytest.fixture(scope="module")
def modern_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("modern") / "run"
    with one_torch_thread():
        run(out, *PRESET)
    return out


def test_preset_pretraining_uses_the_recipe_and_resumes_exactly(modern_run, tmp_path):
    saved = (modern_run / "final" / "config.json").read_text()
    config = json.loads(saved)
    assert config["preset"] == "modernbert" and config["position_embedding_type"] == "rotary"
    assert config["architectures"] == ["KilnEncoderForMaskedLM"] and config["local_attention"] == 16
    rates = {r["step"]: r["train/lr"] for r in _rows(modern_run) if "train/lr" in r}
    # warm-up over 2 steps, stable until the last 4 (decay_ratio 0.5 of 8), then decaying
    assert rates[2] == rates[3] == rates[4] and rates[1] < rates[2] and rates[8] < rates[6] < rates[4]
    first = _losses(modern_run)
    assert sorted(first) == list(range(1, 9))
    again = tmp_path / "again"
    with one_torch_thread():
        run(
            again,
            *PRESET,
            "--training.resume_from_checkpoint",
            modern_run / "checkpoints" / "step-00000004",
            "--tokenizer.name_or_path",
            modern_run / "tokenizer",
        )
    assert _losses(again) == {step: first[step] for step in range(5, 9)}


def test_final_converts_to_modernbert_and_a_modernbert_continues_pretraining(modern_run, tmp_path):
    convert([str(modern_run / "final"), str(tmp_path / "modernbert")])
    reference = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "modernbert").eval()
    assert type(reference).__name__ == "ModernBertForMaskedLM"
    from pretrain.modeling import KilnEncoderForMaskedLM

    kiln = KilnEncoderForMaskedLM.from_pretrained(modern_run / "final").eval()
    input_ids = torch.randint(5, kiln.config.vocab_size, (2, 40))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 25:] = 0
    with torch.no_grad():
        expected = reference(input_ids=input_ids, attention_mask=attention_mask).logits
        got = kiln(input_ids=input_ids, attention_mask=attention_mask).logits
    keep = attention_mask.bool()
    assert (got[keep] - expected[keep]).abs().max() < 1e-5

    # a ModernBERT folder, converted to Kiln, is where a run continues from (--model.init_from)
    convert([str(tmp_path / "modernbert"), str(tmp_path / "kiln")])
    continued = tmp_path / "continued"
    with one_torch_thread():
        run(
            continued,
            *PRESET,
            "--model.init_from",
            tmp_path / "kiln",
            "--tokenizer.name_or_path",
            tmp_path / "kiln",
            "--training.max_steps",
            2,
            "--training.save_steps",
            0,
        )
    assert sorted(_losses(continued)) == [1, 2]
    assert json.loads((continued / "final" / "config.json").read_text())["preset"] == "modernbert"


def test_adapt_and_classify_fine_tune_a_preset_encoder(modern_run, tmp_path):
    from finetune.adapt import main as adapt
    from finetune.classify import main as classify

    rows = ["sentence,label"] + [
        f'"a {word} film number {i}",{word}' for i in range(24) for word in ("good", "bad")
    ]
    (tmp_path / "reviews.csv").write_text("\n".join(rows) + "\n")
    task = tmp_path / "task.yaml"
    task.write_text(
        f"data:\n  train_file: {tmp_path / 'reviews.csv'}\n  validation_file: {tmp_path / 'reviews.csv'}\n"
        f"  test_file: {tmp_path / 'reviews.csv'}\n  text_columns: [sentence]\n"
    )
    with one_torch_thread():
        run_main(
            adapt,
            "--task",
            "classify",
            "--task_config",
            task,
            "--model.init_from",
            modern_run / "final",
            "--training.output_dir",
            tmp_path / "adapted",
            "--training.max_steps",
            2,
            "--training.save_steps",
            0,
            "--training.eval_steps",
            0,
            "--training.per_device_train_batch_size",
            4,
            "--data.max_seq_length",
            32,
        )
        run_main(
            classify,
            "--config",
            task,
            "--model.checkpoint",
            tmp_path / "adapted" / "final",
            "--training.output_dir",
            tmp_path / "tuned",
            "--training.max_steps",
            2,
            "--training.per_device_train_batch_size",
            8,
        )
    tuned = json.loads((tmp_path / "tuned" / "final" / "config.json").read_text())
    assert tuned["preset"] == "modernbert" and tuned["architectures"] == [
        "KilnEncoderForSequenceClassification"
    ]
    from pretrain.modeling import KilnEncoderForSequenceClassification

    model = KilnEncoderForSequenceClassification.from_pretrained(tmp_path / "tuned" / "final")
    assert type(model.model.pooler).__name__ == "KilnTransformPooler"


def test_a_preset_encoders_pretraining_folder_fine_tunes_a_tagger(modern_run, tmp_path):
    """The modernbert preset's token head puts a transform (dense + activation + norm) before its classifier;
    a pretraining folder has none (its transform is the MLM head's), so the tagger starts it new, as the
    classifier, instead of refusing the folder."""
    from test_finetune_scripts import synthetic_ner_sentences, write_conll

    from finetune.tag import main as tag

    files = {
        split: write_conll(tmp_path / f"{split}.txt", synthetic_ner_sentences(n, seed))
        for split, n, seed in (("train", 16, 0), ("validation", 8, 1))
    }
    with one_torch_thread():
        run_main(
            tag,
            "--model.checkpoint",
            modern_run / "final",
            "--data.train_file",
            files["train"],
            "--data.validation_file",
            files["validation"],
            "--data.test_file",
            "none",
            "--training.output_dir",
            tmp_path / "tagger",
            "--training.max_steps",
            2,
            "--training.save_steps",
            0,
            "--training.per_device_train_batch_size",
            8,
        )
    from pretrain.modeling import KilnEncoderForTokenClassification

    tagger = KilnEncoderForTokenClassification.from_pretrained(tmp_path / "tagger" / "final")
    assert type(tagger.head).__name__ == "KilnClassifierTransform" and tagger.config.preset == "modernbert"

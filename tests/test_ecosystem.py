"""Kiln models work with the rest of the ecosystem: pipeline, transformers.Trainer, PEFT."""

import pytest
import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
    pipeline,
)

from pretrain.modeling import (
    KilnDecoderConfig,
    KilnDecoderForCausalLM,
    KilnEncoderConfig,
    KilnEncoderForMaskedLM,
    KilnEncoderForSequenceClassification,
)

WORDS = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "the",
    "cat",
    "dog",
    "sat",
    "ran",
    "on",
    "mat",
    "away",
    "a",
]


@pytest.fixture(scope="module")
def tokenizer():
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def _encoder_config(**kwargs):
    return KilnEncoderConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        **kwargs,
    )


def test_fill_mask_pipeline_matches_the_model(tokenizer):
    torch.manual_seed(0)
    model = KilnEncoderForMaskedLM(_encoder_config()).eval()
    fill = pipeline("fill-mask", model=model, tokenizer=tokenizer, top_k=3)
    predictions = fill("the cat [MASK] on the mat")
    ids = tokenizer("the cat [MASK] on the mat", return_tensors="pt")
    with torch.no_grad():
        logits = model(**ids).logits[0, 2]
    expected = logits.softmax(-1).topk(3)
    assert [p["token"] for p in predictions] == expected.indices.tolist()
    assert [p["score"] for p in predictions] == pytest.approx(expected.values.tolist(), rel=1e-4)


def test_a_pretraining_folder_loads_as_a_masked_lm_without_a_load_report(tokenizer, tmp_path, capfd):
    """fill-mask on a pretraining run's final/ (docs/index.md) loads its masked LM: the NSP head and pooler it
    leaves out are not listed as UNEXPECTED by transformers' load report; every weight it needs is there."""
    from pretrain.modeling import KilnEncoderForPreTraining

    torch.manual_seed(0)
    KilnEncoderForPreTraining(_encoder_config()).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    capfd.readouterr()
    model, info = KilnEncoderForMaskedLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["unexpected_keys"] and not info["missing_keys"] and not info["mismatched_keys"], info
    pipeline("fill-mask", model=str(tmp_path))("the cat [MASK] on the mat")
    printed = capfd.readouterr()
    assert "LOAD REPORT" not in printed.out + printed.err and "UNEXPECTED" not in printed.out + printed.err


def test_transformers_trainer_fits_a_kiln_classifier(tokenizer, tmp_path):
    torch.manual_seed(0)
    model = KilnEncoderForSequenceClassification(_encoder_config(num_labels=2, hidden_dropout_prob=0.0))
    texts = ["the cat sat on the mat", "the dog ran away"] * 16
    data = Dataset.from_dict({"text": texts, "label": [0, 1] * 16}).map(
        lambda b: tokenizer(b["text"], padding="max_length", max_length=8), batched=True
    )
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        num_train_epochs=8,
        seed=0,
        learning_rate=5e-3,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data.remove_columns("text"))
    result = trainer.train()
    logged = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    assert logged[-1] < logged[0] / 2, logged
    assert result.global_step == 32
    predictions = trainer.predict(data.remove_columns("text")).predictions.argmax(-1)
    assert (predictions == [0, 1] * 16).all()


def test_peft_lora_trains_only_adapters_and_merges_exactly():
    import peft

    torch.manual_seed(0)
    base = KilnDecoderForCausalLM(
        KilnDecoderConfig(
            vocab_size=64,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=32,
            bos_token_id=1,
            eos_token_id=1,
        )
    )
    lora = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["qkv", "fc_in"]))
    trainable = [name for name, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    ids = torch.randint(2, 64, (4, 12))
    optimizer = torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=1e-2)
    first = lora(input_ids=ids, labels=ids).loss
    for _ in range(10):
        loss = lora(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert loss.item() < first.item()
    lora.eval()
    with torch.no_grad():
        adapted = lora(input_ids=ids).logits
        merged = lora.merge_and_unload()
        torch.testing.assert_close(merged(input_ids=ids).logits, adapted, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["encoder", "decoder", "encoder-decoder"])
def test_peft_lora_defaults_target_the_fused_attention_projections(kind):
    import peft

    from pretrain.modeling import KilnEncoderDecoderModel, KilnEncoderModel
    from pretrain.modeling.configuration_kiln import LORA_TARGET_MODULES

    decoder_config = KilnDecoderConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=32
    )
    if kind == "encoder":
        model, task = KilnEncoderForSequenceClassification(_encoder_config(num_labels=2)), "SEQ_CLS"
    elif kind == "decoder":
        model, task = KilnDecoderForCausalLM(decoder_config), "CAUSAL_LM"
    else:
        decoder_config.update({"is_decoder": True, "add_cross_attention": True})
        model = KilnEncoderDecoderModel(
            encoder=KilnEncoderModel(_encoder_config()), decoder=KilnDecoderForCausalLM(decoder_config)
        )
        task = "SEQ_2_SEQ_LM"
    lora = peft.get_peft_model(model, peft.LoraConfig(task_type=task, r=2))  # no target_modules
    adapted = {name.rsplit(".", 1)[0] for name, _ in lora.named_modules() if name.endswith(".lora_A")}
    assert {name.rsplit(".", 1)[-1] for name in adapted} == set(LORA_TARGET_MODULES[model.config.model_type])
    expected = sum(name.rsplit(".", 1)[-1] in ("qkv", "q", "kv") for name, _ in model.named_modules())
    assert len(adapted) == expected > 0


def test_text_generation_pipeline_matches_greedy_generate(tokenizer):
    torch.manual_seed(0)
    model = KilnDecoderForCausalLM(
        KilnDecoderConfig(
            vocab_size=64,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=32,
            bos_token_id=2,
            eos_token_id=3,
            pad_token_id=0,
        )
    ).eval()
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    out = generator("the cat sat", max_new_tokens=6, do_sample=False, return_tensors=True)
    ids = tokenizer("the cat sat", return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
    assert out[0]["generated_token_ids"] == expected[0].tolist()
    assert expected.shape[1] > ids.shape[1]  # it generated something

"""A saved Kiln checkpoint carries its code: it loads with trust_remote_code where `pretrain` is absent."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from kiln_testing import WITHOUT_THE_PROJECT

from pretrain.modeling import (
    ENCODER_AUTO_CLASSES,
    KilnDecoderConfig,
    KilnDecoderForCausalLM,
    KilnEncoderConfig,
    KilnEncoderForMaskedLM,
    KilnEncoderForPreTraining,
)

REPO_ROOT = Path(__file__).resolve().parents[1]

# Runs in a fresh interpreter in which the project (`kiln`, `pretrain`, `finetune`) cannot be imported
CHILD = (
    WITHOUT_THE_PROJECT
    + r"""
import torch
import transformers

encoder_dir, decoder_dir, out_file = sys.argv[2:5]
input_ids = (torch.arange(24).view(2, 12) * 7 + 3) % 97
attention_mask = torch.ones_like(input_ids)
attention_mask[1, 9:] = 0
results = {}
with torch.no_grad():
    load = dict(trust_remote_code=True)
    pretraining = transformers.AutoModelForPreTraining.from_pretrained(encoder_dir, **load).eval()
    results["pretraining"] = pretraining(input_ids, attention_mask=attention_mask).prediction_logits
    masked_lm = transformers.AutoModelForMaskedLM.from_pretrained(encoder_dir, **load).eval()
    results["masked_lm"] = masked_lm(input_ids, attention_mask=attention_mask).logits
    classifier = transformers.AutoModelForSequenceClassification.from_pretrained(
        encoder_dir, num_labels=3, **load
    )
    results["classifier_encoder_weight"] = classifier.model.layers[1].attention.qkv.weight
    causal_lm = transformers.AutoModelForCausalLM.from_pretrained(decoder_dir, **load).eval()
    results["causal_lm"] = causal_lm(input_ids, attention_mask=attention_mask).logits
    results["generated"] = causal_lm.generate(input_ids[:1, :5], max_new_tokens=6, do_sample=False)
    heads = [  # the rest of BERT's / GPT-2's head family, through the same remote code
        getattr(transformers, auto_name).from_pretrained(folder, **load)
        for folder, auto_names in (
            (encoder_dir, ("AutoModelForQuestionAnswering", "AutoModelForMultipleChoice",
                           "AutoModelForNextSentencePrediction")),
            (decoder_dir, ("AutoModelForSequenceClassification", "AutoModelForTokenClassification")),
        )
        for auto_name in auto_names
    ]
    results["heads"] = [type(head).__name__ for head in heads]
    results["decoder_classifier"] = heads[3].eval()(input_ids, attention_mask=attention_mask).logits
models = (pretraining, masked_lm, classifier, causal_lm)
results["classes"] = [type(model).__module__ + "." + type(model).__name__ for model in models]
results["imported_pretrain"] = "pretrain" in sys.modules
torch.save(results, out_file)
"""
)


@pytest.mark.slow
def test_checkpoints_load_with_trust_remote_code_without_pretrain(tmp_path):
    torch.manual_seed(0)
    encoder_config = KilnEncoderConfig(
        vocab_size=97,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=16,
        position_embedding_type="sinusoidal",
    )
    decoder_config = KilnDecoderConfig(
        vocab_size=97,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=16,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    encoder = KilnEncoderForPreTraining(encoder_config).eval()
    decoder = KilnDecoderForCausalLM(decoder_config).eval()
    encoder.save_pretrained(tmp_path / "encoder")
    decoder.save_pretrained(tmp_path / "decoder")

    saved = json.loads((tmp_path / "encoder" / "config.json").read_text())["auto_map"]
    assert set(saved) == {"AutoConfig", *ENCODER_AUTO_CLASSES}
    assert saved["AutoModelForMaskedLM"] == "modeling_kiln_encoder.KilnEncoderForMaskedLM"
    for folder, modeling in (
        ("encoder", "modeling_kiln_encoder.py"),
        ("decoder", "modeling_kiln_decoder.py"),
    ):
        code = {path.name: path.read_text() for path in (tmp_path / folder).glob("*.py")}
        assert set(code) == {
            "configuration_kiln.py",
            "kiln_layers.py",
            "kiln_losses.py",
            "kiln_masks.py",
            "kiln_positions.py",
            modeling,
        }
        for text in code.values():  # uploaded files may only import each other relatively
            assert not re.search(r"^\s*(from|import)\s+(pretrain|finetune)\b", text, re.MULTILINE)

    environment = {
        key: value for key, value in os.environ.items() if key != "PYTHONPATH" and not key.startswith("HF_")
    }
    environment.update(HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    out_file = tmp_path / "results.pt"
    subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            str(REPO_ROOT),
            str(tmp_path / "encoder"),
            str(tmp_path / "decoder"),
            str(out_file),
        ],
        cwd=tmp_path,
        env=environment,
        check=True,
        timeout=120,
    )
    results = torch.load(out_file)

    assert results["imported_pretrain"] is False
    for loaded, expected in zip(
        results["classes"],
        [
            "KilnEncoderForPreTraining",
            "KilnEncoderForMaskedLM",
            "KilnEncoderForSequenceClassification",
            "KilnDecoderForCausalLM",
        ],
    ):
        assert loaded.startswith("transformers_modules.") and loaded.endswith(expected), loaded
    input_ids = (torch.arange(24).view(2, 12) * 7 + 3) % 97
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 9:] = 0
    with torch.no_grad():
        torch.testing.assert_close(
            results["pretraining"], encoder(input_ids, attention_mask=attention_mask).prediction_logits
        )
        masked_lm = KilnEncoderForMaskedLM.from_pretrained(tmp_path / "encoder").eval()
        torch.testing.assert_close(
            results["masked_lm"], masked_lm(input_ids, attention_mask=attention_mask).logits
        )
        torch.testing.assert_close(
            results["classifier_encoder_weight"], encoder.model.layers[1].attention.qkv.weight
        )
        torch.testing.assert_close(
            results["causal_lm"], decoder(input_ids, attention_mask=attention_mask).logits
        )
        expected_tokens = decoder.generate(input_ids[:1, :5], max_new_tokens=6, do_sample=False)
    assert torch.equal(results["generated"], expected_tokens)
    assert results["heads"] == [
        "KilnEncoderForQuestionAnswering",
        "KilnEncoderForMultipleChoice",
        "KilnEncoderForNextSentencePrediction",
        "KilnDecoderForSequenceClassification",
        "KilnDecoderForTokenClassification",
    ]
    assert results["decoder_classifier"].shape == (2, 2)  # read at each sequence's last token

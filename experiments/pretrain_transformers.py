"""The issue-12 "what the speed buys" arm: Kiln's pretraining run with transformers' `BertForPreTraining` as the model.

Everything but the model is Kiln's (config, corpus, tokenizer, NSP pairs, MLM masks, loop, schedule, time cap,
evaluation), so the two runs differ only in the model code. The BERT starts from the very weights Kiln would
start from (Kiln's initialisation converted with pretrain.convert.to_transformers), and at the end its weights are
converted back (from_transformers, tested equal in tests/test_convert.py) so `final/` is a Kiln folder the
fine-tuning scripts load like any other.

    accelerate launch experiments/pretrain_transformers.py --config configs/experiments/encoder-30min.yaml \
        --training.output_dir runs/encoder-30min-transformers
"""

from __future__ import annotations

import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kiln.export  # noqa: E402
import pretrain.run  # noqa: E402
from pretrain.convert import from_transformers, to_transformers  # noqa: E402
from pretrain.modeling.modeling_kiln_encoder import KilnEncoderForPreTrainingOutput  # noqa: E402


class BertForPreTrainingInKilnsLoop(torch.nn.Module):
    """transformers' BertForPreTraining, returning the loss parts Kiln's loop normalises (MLM per masked token,
    NSP per pair), computed as BertForPreTraining computes them: cross-entropy over its dense logits."""

    def __init__(self, bert, kiln_config):
        super().__init__()
        self.bert = bert
        self.config = kiln_config  # FLOP count and start-up summary read the Kiln shape; same numbers

    def forward(
        self, input_ids, attention_mask=None, token_type_ids=None, labels=None, next_sentence_label=None
    ):
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        logits = out.prediction_logits
        mlm_loss = nsp_loss = None
        if labels is not None:
            mlm_loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100)
        if next_sentence_label is not None:
            nsp_loss = F.cross_entropy(out.seq_relationship_logits, next_sentence_label.view(-1))
        parts = [part for part in (mlm_loss, nsp_loss) if part is not None]
        return KilnEncoderForPreTrainingOutput(
            loss=sum(parts) if parts else None,
            mlm_loss=mlm_loss,
            nsp_loss=nsp_loss,
            prediction_logits=logits,
            seq_relationship_logits=out.seq_relationship_logits,
        )


_build_model = pretrain.run.build_model
_export_model = kiln.export.export_model


def build_model(config, tokenizer, vocab_size):
    kiln_model = _build_model(config, tokenizer, vocab_size)
    if type(kiln_model).__name__ != "KilnEncoderForPreTraining":
        raise SystemExit("experiments/pretrain_transformers.py compares encoders (model.kind encoder)")
    bert = to_transformers(kiln_model)  # the same initial weights as the Kiln run
    bert.config._attn_implementation = "sdpa"
    return BertForPreTrainingInKilnsLoop(bert, kiln_model.config)


def export_model(accelerator, model, *args, **kwargs):
    bert = accelerator.unwrap_model(model).bert
    return _export_model(accelerator, from_transformers(bert), *args, **kwargs)


pretrain.run.build_model = build_model
kiln.export.export_model = export_model

if __name__ == "__main__":
    pretrain.run.cli()

"""Run one optimizer step of Kiln's Trainer on 8 fixed sequences and save the gradients it stepped with.

Used by tests/test_exact_training.py in-process and under `accelerate launch --num_processes 2`: however the 8
sequences are split (accumulation 4 x batch 2, accumulation 1 x batch 8, 2 processes x batch 4), the step must
use the same gradient, although the sequences hold different numbers of masked / predicted tokens.

    python tests/window_gradients.py encoder|electra|decoder ACCUMULATION PER_DEVICE_BATCH OUT.pt

KIND may also be a comma-separated list (one launch for several kinds, one Trainer after another on the same
process group); OUT then names a folder, and each kind's gradients go to OUT/KIND.pt.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

VOCAB, LENGTH, ROWS = 64, 12, 8


def fixed_examples(kind: str) -> list[dict[str, torch.Tensor]]:
    """8 sequences whose label counts differ a lot (1 to 9 masked tokens; lengths 3 to 12 for the decoder and, for
    ELECTRA, whose discriminator loss averages over the real tokens, 5 to 12)."""
    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(ROWS):
        ids = torch.randint(5, VOCAB, (LENGTH,), generator=g)
        if kind == "electra":
            length = 5 + (i * 3) % (LENGTH - 4)
            mask = (torch.arange(LENGTH) < length).long()
            labels = torch.full((LENGTH,), -100)
            chosen = torch.randperm(length, generator=g)[: 1 + i % min(length, 9)]
            labels[chosen] = ids[chosen]
            masked = (ids * mask).masked_fill(labels != -100, 4)  # [MASK]
            rows.append(
                {
                    "input_ids": masked,
                    "attention_mask": mask,
                    "labels": labels,
                    "sampling_uniforms": torch.rand(LENGTH, generator=g),
                }
            )
        elif kind == "encoder":
            labels = torch.full((LENGTH,), -100)
            chosen = torch.randperm(LENGTH, generator=g)[: 1 + i % 9]
            labels[chosen] = ids[chosen]
            masked = ids.clone()
            masked[chosen] = 4  # [MASK]
            rows.append(
                {
                    "input_ids": masked,
                    "attention_mask": torch.ones(LENGTH, dtype=torch.long),
                    "token_type_ids": torch.zeros(LENGTH, dtype=torch.long),
                    "labels": labels,
                    "next_sentence_label": torch.tensor(i % 2),
                }
            )
        else:
            length = 3 + (i * 5) % (LENGTH - 2)
            mask = (torch.arange(LENGTH) < length).long()
            rows.append(
                {"input_ids": ids * mask, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
            )
    return rows


def stack(features):
    return {key: torch.stack([f[key] for f in features]) for key in features[0]}


def main(kind: str, accumulation: int, batch: int, out: str, end: bool = True) -> None:
    from kiln.config import LoggingConfig, TrainingConfig
    from kiln.run_setup import start_run
    from kiln.trainer import Trainer
    from pretrain.data.collator import CLMCollator, ElectraCollator, MLMCollator
    from pretrain.modeling import (
        KilnDecoderConfig,
        KilnDecoderForCausalLM,
        KilnEncoderConfig,
        KilnEncoderForElectraPreTraining,
        KilnEncoderForPreTraining,
    )

    training = TrainingConfig(
        output_dir=os.path.join(os.path.dirname(out), f"run-{os.path.basename(out)}"),
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=accumulation,
        max_steps=1,
        eval_steps=0,
        save_steps=0,
        max_grad_norm=0.0,
        warmup_steps=0,
        seed=0,
    )
    logging_cfg = LoggingConfig(logging_steps=1, report_to="none")
    accelerator = start_run(training, logging_cfg)
    torch.manual_seed(0)
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=LENGTH,
        pad_token_id=0,
    )
    loss_weights = None
    if kind == "electra":
        config = KilnEncoderConfig(
            **common,
            intermediate_size=64,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            sparse_prediction=True,
            generator_size=0.5,
        )
        model, loss_items = KilnEncoderForElectraPreTraining(config), ElectraCollator.loss_items
        loss_weights = {"rtd_loss": 50.0, "rtd_accuracy": 0.0}
    elif kind == "encoder":
        config = KilnEncoderConfig(
            **common,
            intermediate_size=64,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            chunked_mlm_loss=True,
        )
        model, loss_items = KilnEncoderForPreTraining(config), MLMCollator.loss_items
    else:
        config = KilnDecoderConfig(**common, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model, loss_items = KilnDecoderForCausalLM(config), CLMCollator.loss_items
    examples = fixed_examples(kind)
    direct = {}
    if (
        kind == "electra"
    ):  # the model's own loss on all 8 (MLM + 50 x RTD): what the weighted step must follow
        import copy

        reference = copy.deepcopy(model)
        reference(**stack(examples)).loss.backward()
        direct = {name: param.grad.detach().clone() for name, param in reference.named_parameters()}
    trainer = Trainer(
        accelerator,
        model,
        training=training,
        logging_cfg=logging_cfg,
        train_dataset=lambda epoch: examples,
        collator=stack,
        loss_items=loss_items,
        loss_weights=loss_weights,
    )
    captured = {}
    inner = trainer.optimizer.optimizer

    def record_instead_of_step(*args, **kwargs):
        for name, param in accelerator.unwrap_model(trainer.model).named_parameters():
            captured[name] = param.grad.detach().cpu().clone()

    inner.step = record_instead_of_step
    state = trainer.train()
    if accelerator.is_main_process:
        loss = next(row["train/loss"] for row in state.history if "train/loss" in row)
        torch.save({"grads": captured, "loss": loss, "direct": direct}, out)
    accelerator.wait_for_everyone()
    if end:
        accelerator.end_training()


def main_for_kinds(kinds: list[str], accumulation: int, batch: int, folder: str) -> None:
    """`main` for each kind in turn, in this process: accelerate's singletons are reset between kinds (each
    Trainer starts from a fresh state), the process group is kept and destroyed after the last."""
    from accelerate.state import AcceleratorState, GradientState, PartialState

    os.makedirs(folder, exist_ok=True)
    for index, kind in enumerate(kinds):
        if index:
            AcceleratorState._reset_state(reset_partial_state=True)
            GradientState._reset_state()
            PartialState._reset_state()
        main(kind, accumulation, batch, os.path.join(folder, f"{kind}.pt"), end=index == len(kinds) - 1)


if __name__ == "__main__":
    if "," in sys.argv[1]:
        main_for_kinds(sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    else:
        main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])

"""Cost of one ELECTRA optimizer step against one MLM+SOP step at the 30-minute recipe's shape (issue 26).

    python bench/electra_step.py [--rounds 60]

BERT-Tiny (L2/H128/A2, vocabulary 8,192) on a batch of 32 x 64 tokens with 15% masked: KilnEncoderForPreTraining
with the pretraining fast paths (MLM + SOP) against KilnEncoderForElectraPreTraining (generator 1/4), forward,
backward and fused AdamW, one torch thread, the two alternating every round so that a drift of the machine's
load hits both alike. Prints the median step times (first 10 rounds dropped) and their ratio, which sets
max_steps in configs/experiments/encoder-30min-electra.yaml.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args(argv)
    from pretrain.modeling import (
        KilnEncoderConfig,
        KilnEncoderForElectraPreTraining,
        KilnEncoderForPreTraining,
    )

    torch.set_num_threads(1)
    torch.manual_seed(0)
    shape = dict(
        vocab_size=8192,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=512,
        max_position_embeddings=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        sparse_prediction=True,
        chunked_mlm_loss=True,
    )
    models = {
        "mlm+sop": KilnEncoderForPreTraining(KilnEncoderConfig(**shape)),
        "electra": KilnEncoderForElectraPreTraining(KilnEncoderConfig(**shape, generator_size=0.25)),
    }
    ids = torch.randint(5, 8192, (32, 64))
    selected = torch.rand(ids.shape) < 0.15
    labels = ids.masked_fill(~selected, -100)
    masked = ids.masked_fill(selected, 4)
    segments = torch.zeros_like(ids)
    segments[:, 32:] = 1
    batches = {
        "mlm+sop": dict(
            input_ids=masked,
            token_type_ids=segments,
            labels=labels,
            next_sentence_label=torch.randint(0, 2, (32,)),
        ),
        "electra": dict(input_ids=masked, labels=labels, sampling_uniforms=torch.rand(ids.shape)),
    }
    optimizers = {name: torch.optim.AdamW(model.parameters(), fused=True) for name, model in models.items()}
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            start = time.perf_counter()
            model(**batches[name]).loss.backward()
            optimizers[name].step()
            optimizers[name].zero_grad()
            times[name].append(time.perf_counter() - start)
    median = {name: sorted(values[10:])[len(values[10:]) // 2] for name, values in times.items()}
    result = {f"{name}_step_ms": round(1000 * value, 2) for name, value in median.items()}
    result["ratio"] = round(median["electra"] / median["mlm+sop"], 2)
    result["loadavg"] = open("/proc/loadavg").read().split()[0]
    print(result)
    return result


if __name__ == "__main__":
    main()

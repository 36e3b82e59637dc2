"""Why ELECTRA's discriminator stays at the prior at BERT-Tiny scale (issue 26): a task where context is all there is.

    python bench/electra_plateau.py [--steps 600] [--json bench/results/electra-plateau.json]

Sequences are runs of consecutive token ids (a random start, then +1 per position, wrapping), so a token is only
"wrong" by comparison with its neighbours: its own identity says nothing. 15% of positions are corrupted with a
random id. Three models of the 30-minute recipe's encoder shape (2 layers, hidden 128, 2 heads), trained side by
side with AdamW on the same batches, one torch thread:

- Kiln's `KilnEncoderForReplacedTokenDetection` (ELECTRA's discriminator) and transformers'
  `ElectraForPreTraining`, the same shape and initial weights (converted), on the replaced-token labels: their
  losses are printed side by side, so a plateau is the objective's, not Kiln's code;
- Kiln's `KilnEncoderForMaskedLM` on the same positions masked with [MASK] (the MLM objective), for contrast.

The discriminators' loss is compared with the prior's entropy (the loss of predicting the replaced fraction
everywhere); a control run where the corruption is one fixed token id (detectable from the token alone) shows the
discriminator does learn what its input identifies. Results: docs/electra.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

VOCAB, LOW, HIGH, LENGTH, BATCH, MASK_ID, FIXED_ID = 500, 100, 400, 48, 32, 4, 450


def batch(generator: torch.Generator, fixed: bool):
    start = torch.randint(0, HIGH - LOW, (BATCH, 1), generator=generator)
    ids = (start + torch.arange(LENGTH)) % (HIGH - LOW) + LOW
    chosen = torch.rand(ids.shape, generator=generator) < 0.15
    corrupted = ids.clone()
    if fixed:
        corrupted[chosen] = FIXED_ID
    else:
        corrupted[chosen] = torch.randint(LOW, HIGH, (int(chosen.sum()),), generator=generator)
    masked = ids.clone()
    masked[chosen] = MASK_ID
    mlm_labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    return ids, corrupted, (corrupted != ids).long(), masked, mlm_labels


def entropy(p: float) -> float:
    return -(p * math.log(p) + (1 - p) * math.log(1 - p)) if 0 < p < 1 else 0.0


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from transformers import ElectraForPreTraining

    from pretrain.convert import to_transformers
    from pretrain.modeling import (
        KilnEncoderConfig,
        KilnEncoderForMaskedLM,
        KilnEncoderForReplacedTokenDetection,
    )

    shape = dict(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=512, max_position_embeddings=64, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0)  # fmt: skip
    results = {"steps": args.steps, "lr": args.lr, "shape": "L2/H128/A2", "runs": {}}
    for task in ("context", "fixed-token control"):
        torch.manual_seed(0)
        kiln = KilnEncoderForReplacedTokenDetection(KilnEncoderConfig(**shape))
        hf = to_transformers(kiln, family="electra")
        assert isinstance(hf, ElectraForPreTraining)
        models = {"kiln_rtd": kiln, "transformers_rtd": hf}
        if task == "context":
            models["kiln_mlm"] = KilnEncoderForMaskedLM(KilnEncoderConfig(**shape))
        optimizers = {name: torch.optim.AdamW(m.parameters(), lr=args.lr) for name, m in models.items()}
        generator = torch.Generator().manual_seed(1)
        curves, replaced_fraction = {name: [] for name in models}, []
        for _ in range(args.steps):
            ids, corrupted, replaced, masked, mlm_labels = batch(generator, fixed=task != "context")
            replaced_fraction.append(replaced.float().mean().item())
            for name, model in models.items():
                if name == "kiln_mlm":
                    loss = model(masked, attention_mask=torch.ones_like(ids), labels=mlm_labels).loss
                else:
                    loss = model(corrupted, attention_mask=torch.ones_like(ids), labels=replaced).loss
                optimizers[name].zero_grad()
                loss.backward()
                optimizers[name].step()
                curves[name].append(loss.item())
        window = max(1, args.steps // 10)  # the mean over the last tenth of the steps
        summary = {name: round(sum(c[-window:]) / window, 4) for name, c in curves.items()}
        summary["prior_entropy"] = round(entropy(sum(replaced_fraction) / len(replaced_fraction)), 4)
        summary["mlm_uniform_loss"] = round(math.log(HIGH - LOW), 4)
        summary["kiln_vs_transformers_max_abs_diff"] = max(
            abs(a - b) for a, b in zip(curves["kiln_rtd"], curves["transformers_rtd"])
        )
        results["runs"][task] = summary
        print(task, json.dumps(summary), flush=True)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(results, file, indent=1)
    return results


if __name__ == "__main__":
    main()

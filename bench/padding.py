"""Padding fraction of a pretraining run's batches, exactly as the trainer draws them.

    python bench/padding.py --json bench/results/padding-encoder-tiny.json        # the default run
    python bench/padding.py -- --config configs/pretrain/encoder-small.yaml      # any run: its options after `--`

Builds the run's tokenizer and examples with the run's own functions (`pretrain.run.build_inputs`' steps: the
tokenizer trained on the run's documents, `build_pretraining_data` with the run's seed), then reads the
training epochs the run will go through (`training.max_steps` or `num_train_epochs`) in the trainer's order
(its sampler, batch size, `drop_last`, the collator's `pad_to_multiple_of`) and counts real and padded tokens.
It also counts what the same examples would cost (a) without rounding the width up to `pad_to_multiple_of` and
(b) with unpadding (`unpad_inputs`: every position-wise layer runs on the real tokens only), to say what
unpadding can buy at most: the padded / real token ratio of the position-wise work.

`--time N` then times training steps of the run's own model (`pretrain.run.build_model`: sparse MLM prediction
and chunked loss on, as in the run) on the first N batches of epoch 0, every batch through each variant in
turn (same weights, same batches, dropout on): padded + foreach AdamW (the path before unpadding), unpadded +
fused AdamW, and each change alone; "unpadded" here unpads every padded batch, also those with less padding than
`UNPAD_MIN_PADDING`, below which the model itself stays padded. It first checks that the padded and unpadded models give the same
loss and gradient norm on one batch with dropout off. Real tokens/s = real tokens / median step time.

`--profile N` runs N training steps of the run's own model as the run trains it (padded below the unpadding
threshold, fused AdamW) under torch.profiler, after 3 untimed ones, and reports the self CPU time per op category
and the top ops (bench/throughput.py's categories); it also times the data path of one batch: fetching its rows from the dataset and collating them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    run_argv = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, help="epochs to read (default: as many as the run trains)")
    parser.add_argument("--time", type=int, default=0, metavar="N", help="time steps on the first N batches")
    parser.add_argument(
        "--profile", type=int, default=0, metavar="N", help="profile N steps and the data path"
    )
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    import datasets
    from torch.utils.data import DataLoader

    from kiln.config import build_config
    from kiln.trainer import Trainer
    from pretrain.config import RunConfig
    from pretrain.data import build_pretraining_data, prepare_tokenizer
    from pretrain.data.collator import real_tokens

    datasets.disable_progress_bars()
    os.chdir(REPO)  # the run's relative data paths
    config = build_config(RunConfig, run_argv, prog="bench/padding.py")
    data_cfg, training = config.data, config.training
    with tempfile.TemporaryDirectory(prefix="kiln-bench-padding-") as tmp:
        data_cfg.cache_dir = data_cfg.cache_dir or str(Path(tmp) / "cache")
        tokenizer = prepare_tokenizer(
            config.tokenizer, data_cfg, config.model.kind, str(Path(tmp) / "tokenizer")
        )
        data = build_pretraining_data(
            data_cfg,
            tokenizer,
            config.model.kind,
            config.model.objective,
            seed=training.seed,
            max_position_embeddings=max(data_cfg.max_seq_length, 512),
        )
        batch_size = training.per_device_train_batch_size
        examples = len(data.train_dataset(0))
        batches_per_epoch = examples // batch_size
        epochs = args.epochs or (
            math.ceil(training.max_steps * training.gradient_accumulation_steps / batches_per_epoch)
            if training.max_steps > 0
            else math.ceil(training.num_train_epochs)
        )
        totals = {"batches": 0, "padded": 0, "real": 0, "unrounded": 0}
        trainer_sampler = (
            Trainer._train_sampler
        )  # the trainer's own choice of sampler (random or length-grouped)

        class _Owner:  # what `_train_sampler` reads of the trainer
            def __init__(self):
                self.training = training
                self._lengths_cache = None

            _lengths = Trainer._lengths

        owner = _Owner()
        timed_batches = []
        for epoch in range(epochs):
            dataset = data.train_dataset(epoch)
            generator = torch.Generator().manual_seed(training.seed * 1000 + epoch)
            sampler = trainer_sampler(owner, dataset, generator)
            loader = DataLoader(
                dataset, batch_size=batch_size, sampler=sampler, collate_fn=data.collator, drop_last=True
            )
            for batch in loader:
                if epoch == 0 and len(timed_batches) < max(args.time, args.profile + 3):
                    timed_batches.append(batch)
                lengths = real_tokens(batch).sum(1)
                totals["batches"] += 1
                totals["padded"] += batch["input_ids"].numel()
                totals["real"] += int(lengths.sum())
                totals["unrounded"] += int(lengths.max()) * len(lengths)
    report = {
        "run_options": run_argv,
        "model_kind": config.model.kind,
        "objective": config.model.objective,
        "max_seq_length": data_cfg.max_seq_length,
        "pad_to_multiple_of": data_cfg.pad_to_multiple_of,
        "batch_size": batch_size,
        "group_by_length": training.group_by_length,
        "epochs_read": epochs,
        "examples_per_epoch": examples,
        **totals,
        "padding_fraction": 1 - totals["real"] / totals["padded"],
        "padding_fraction_without_rounding": 1 - totals["real"] / totals["unrounded"],
        "unpadding_upper_bound": totals["padded"] / totals["real"],
    }
    if args.time:
        report["timing"] = time_steps(config, tokenizer, timed_batches[: args.time])
    if args.profile:
        report["profile"] = profile_steps(config, tokenizer, timed_batches[: args.profile + 3])
        report["profile"]["data_path_ms"] = time_data_path(data.train_dataset(0), data.collator, batch_size)
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(report, file, indent=1)
    return report


VARIANTS = {  # name: (unpad_inputs, fused AdamW)
    "padded, foreach AdamW": (False, False),
    "unpadded, foreach AdamW": (True, False),
    "padded, fused AdamW": (False, True),
    "unpadded, fused AdamW": (True, True),
}


def time_steps(config, tokenizer, batches: list[dict]) -> dict:
    import pretrain.modeling.modeling_kiln_encoder as encoder

    # the unpadded variants unpad every padded batch, also below the model's own threshold (the question here is
    # what unpadding does at this run's padding)
    threshold, encoder.UNPAD_MIN_PADDING = encoder.UNPAD_MIN_PADDING, 0.0
    try:
        return _time_variants(config, tokenizer, batches)
    finally:
        encoder.UNPAD_MIN_PADDING = threshold  # --profile after --time profiles the model as the run has it


def _time_variants(config, tokenizer, batches: list[dict]) -> dict:
    import copy
    import statistics
    import time

    from pretrain.data import padded_vocab_size
    from pretrain.data.collator import real_tokens
    from pretrain.run import build_model

    torch.manual_seed(config.training.seed)
    base = build_model(
        config, tokenizer, padded_vocab_size(tokenizer, config.tokenizer.pad_vocab_to_multiple_of)
    )
    check = same_step(base, batches[0])
    models, optimizers = {}, {}
    for name, (unpad, fused) in VARIANTS.items():
        model = copy.deepcopy(base).train()
        model.config.unpad_inputs = unpad
        models[name] = model
        optimizers[name] = adamw(model, config.training, fused)
    times = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    for index, batch in enumerate(batches):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            train_step(models[name], optimizers[name], batch, config.training.max_grad_norm)
            times[name].append(time.perf_counter() - start)
    real = [int(real_tokens(batch).sum()) for batch in batches]
    warm = slice(1, None) if len(batches) > 2 else slice(None)  # the first step of each model warms up
    result = {"batches": len(batches), "check": check, "load_average": os.getloadavg()[0], "variants": {}}
    plain = times["padded, foreach AdamW"]
    for name in VARIANTS:
        median = statistics.median(times[name][warm])
        result["variants"][name] = {
            "median_step_s": median,
            "real_tokens_per_s": statistics.median(real[warm]) / median,
            "speedup": statistics.median([a / b for a, b in zip(plain[warm], times[name][warm])]),
        }
    return result


def profile_steps(config, tokenizer, batches: list[dict]) -> dict:
    """The steps after the first three under torch.profiler, as the run trains (its model, fused AdamW): self CPU
    time per op category and top ops, as bench/throughput.py --profile reports them (`op_profile`)."""
    from torch.profiler import ProfilerActivity, profile

    from pretrain.data import padded_vocab_size
    from pretrain.run import build_model

    sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/throughput.py, also when loaded by path
    from throughput import op_profile

    torch.manual_seed(config.training.seed)
    model = build_model(
        config, tokenizer, padded_vocab_size(tokenizer, config.tokenizer.pad_vocab_to_multiple_of)
    )
    model.train()
    optimizer = adamw(model, config.training, fused=True)
    for batch in batches[:3]:
        train_step(model, optimizer, batch, config.training.max_grad_norm)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in batches[3:]:
            train_step(model, optimizer, batch, config.training.max_grad_norm)
    result = op_profile(prof)
    steps = len(batches) - 3
    return {
        "steps": steps,
        "threads": torch.get_num_threads(),
        "step_ms": 1000 * result["profiled_self_cpu_s"] / steps,
        **result,
    }


def time_data_path(dataset, collator, batch_size: int, repeats: int = 20) -> dict:
    """Median ms to fetch one batch's rows (the DataLoader's `__getitems__`) and to collate them."""
    import statistics
    import time

    indices = list(range(batch_size))
    fetch, collate = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        rows = dataset.__getitems__(indices)
        fetch.append(time.perf_counter() - start)
        for index, row in zip(indices, rows):
            row["example_index"] = index  # as Kiln's trainer adds it (per-example masks)
        start = time.perf_counter()
        collator(rows)
        collate.append(time.perf_counter() - start)
    return {"fetch": 1000 * statistics.median(fetch), "collate": 1000 * statistics.median(collate)}


def adamw(model, training, fused: bool):
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": training.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    options = {"fused": True} if fused else {"foreach": True}
    return torch.optim.AdamW(
        groups,
        lr=training.lr,
        betas=(training.adam_beta1, training.adam_beta2),
        eps=training.adam_epsilon,
        **options,
    )


def train_step(model, optimizer, batch: dict, max_norm: float) -> None:
    loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def same_step(base, batch: dict) -> dict:
    """Loss and gradient norm of the padded and the unpadded model on one batch, dropout off: must agree."""
    import copy

    results = {}
    for unpad in (False, True):
        model = copy.deepcopy(base).train()
        model.config.unpad_inputs = unpad
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
            if hasattr(module, "dropout_p"):
                module.dropout_p = 0.0
        loss = model(**batch).loss
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        results[unpad] = (float(loss.detach()), float(norm))
    (loss_a, norm_a), (loss_b, norm_b) = results[False], results[True]
    if abs(loss_a - loss_b) > 1e-4 * max(1.0, abs(loss_a)) or abs(norm_a - norm_b) > 1e-4 * max(1.0, norm_a):
        raise SystemExit(
            f"unpadded and padded steps differ: loss {loss_a} vs {loss_b}, grad norm {norm_a} vs {norm_b}"
        )
    return {
        "loss_padded": loss_a,
        "loss_unpadded": loss_b,
        "grad_norm_padded": norm_a,
        "grad_norm_unpadded": norm_b,
    }


if __name__ == "__main__":
    main()

"""Tokens/s of the encoder data path (NSP examples + MLM collation) against the training step's tokens/s.

    python bench/data.py --train-json bench/results/l4.json --json bench/results/data.json

Stages, on the shipped corpus (data/pretrain/*.txt) at max_seq_length 128, batch 32, through pretrain.data:
- `create_nsp_examples`: sentence tokenization + NSP pair building (tokenization is cached once per run by
  the real pipeline, so this is the pessimistic per-epoch number);
- `build_pair_instances` + `instance_features`: pair building alone from pre-tokenized sentences (per epoch);
- `MLMCollator`: padding + dynamic masking of batches of 32 examples;
- the loader the trainer runs: `build_pretraining_data(...).train_dataset(epoch)` (datasets map, fresh cache)
  read by a DataLoader with the collator, `num_workers=0`, i.e. in the training process itself.
Tokens are counted as the training step counts them: batch size x padded length. The last line compares each
stage with the training tokens/s of Kiln (and transformers) read from a bench/throughput.py JSON file.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import statistics
import sys
import tempfile
import time

import datasets
import torch
from torch.utils.data import DataLoader

from kiln.config import resolve_path
from pretrain.config import DataConfig
from pretrain.data import (
    MLMCollator,
    build_pair_instances,
    build_pretraining_data,
    create_nsp_examples,
    instance_features,
    load_documents,
    split_documents,
    split_sentences,
    train_tokenizer,
)
from pretrain.data.collator import real_tokens
from pretrain.data.corpus import iter_texts

SEQ_LEN = 128
BATCH_SIZE = 32


def best_of(repeats: int, function):
    """(result, median seconds) of `repeats` calls."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return result, statistics.median(times)


def corpus_documents(pattern: str) -> list[list[str]]:
    documents = []
    for path in sorted(glob.glob(resolve_path(pattern))):
        with open(path, encoding="utf-8") as file:
            for document in split_documents(file.read(), "blank_line"):
                documents.append(split_sentences(document, "rule"))
    return documents


def batches_of(features: list[dict], size: int) -> list[list[dict]]:
    return [features[i : i + size] for i in range(0, len(features) - size + 1, size)]


def collate_all(collator, batches) -> tuple[int, int]:
    """(padded tokens, real tokens) of all batches, collated."""
    padded = real = 0
    for features in batches:
        batch = collator(features)
        padded += batch["input_ids"].numel()
        real += int(real_tokens(batch).sum())
    return padded, real


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-files", default="data/pretrain/*.txt")
    parser.add_argument("--vocab-size", type=int, default=30522, help="WordPiece vocabulary to train")
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions per stage (median)")
    parser.add_argument("--train-json", default="bench/results/l4.json", help="bench/throughput.py output")
    parser.add_argument(
        "--train-tokens-per-s", type=float, help="training tokens/s (instead of --train-json)"
    )
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    datasets.disable_progress_bars()
    threads = torch.get_num_threads()
    start = time.perf_counter()
    data_cfg = DataConfig(data_files=[args.data_files], max_seq_length=SEQ_LEN)
    tokenizer = train_tokenizer(
        iter_texts(load_documents(data_cfg).train), kind="wordpiece", vocab_size=args.vocab_size
    )
    tokenizer_s = time.perf_counter() - start
    documents = corpus_documents(args.data_files)
    print(f"tokenizer: {len(tokenizer)} pieces, trained in {tokenizer_s:.1f}s; {len(documents)} documents")

    stages = {}

    examples, seconds = best_of(
        args.repeats, lambda: create_nsp_examples(documents, tokenizer, SEQ_LEN, seed=0)
    )
    collator = MLMCollator(tokenizer, pad_to_multiple_of=8, seed=0)
    batches = batches_of(examples, BATCH_SIZE)
    (padded, real), collate_s = best_of(args.repeats, lambda: collate_all(collator, batches))
    pad_factor = padded / real  # examples become this many training tokens once padded into batches
    example_tokens = sum(len(example["input_ids"]) for example in examples)
    stages["create_nsp_examples (tokenize + pairs)"] = example_tokens * pad_factor / seconds
    stages["MLMCollator"] = padded / collate_s

    flat = [sentence for document in documents for sentence in document]
    ids = tokenizer(flat, add_special_tokens=False)["input_ids"]
    tokenized, offset = [], 0
    for document in documents:
        tokenized.append(ids[offset : offset + len(document)])
        offset += len(document)

    def pairs_only():
        instances = build_pair_instances(tokenized, SEQ_LEN, rng=random.Random(1))
        return [instance_features(i, tokenizer.cls_token_id, tokenizer.sep_token_id) for i in instances]

    pair_examples, pairs_s = best_of(args.repeats, pairs_only)
    pair_tokens = sum(len(example["input_ids"]) for example in pair_examples)
    stages["build_pair_instances (pairs only)"] = pair_tokens * pad_factor / pairs_s

    with tempfile.TemporaryDirectory() as cache_dir:
        data_cfg.cache_dir = cache_dir
        data_cfg.validation_split_percentage = 0.0
        data = build_pretraining_data(
            data_cfg, tokenizer, "encoder", "mlm+nsp", seed=0, max_position_embeddings=512
        )

        def one_epoch(epoch: int) -> tuple[int, int]:
            dataset = data.train_dataset(epoch)
            loader = DataLoader(
                dataset, batch_size=BATCH_SIZE, shuffle=True, collate_fn=data.collator, drop_last=True
            )
            padded_tokens = real_token_count = 0
            for batch in loader:
                padded_tokens += batch["input_ids"].numel()
                real_token_count += int(real_tokens(batch).sum())
            return padded_tokens, real_token_count

        epoch_times, loader_tokens = [], (0, 0)
        for epoch in range(1, args.repeats + 1):  # a new epoch each time: its pairs are built, not cached
            begin = time.perf_counter()
            loader_tokens = one_epoch(epoch)
            epoch_times.append(time.perf_counter() - begin)
        stages["train_dataset(epoch) + DataLoader + collator"] = loader_tokens[0] / statistics.median(
            epoch_times
        )
    padding_share = 1 - loader_tokens[1] / loader_tokens[0]

    train = {}
    if args.train_tokens_per_s:
        train["kiln"] = args.train_tokens_per_s
    elif os.path.isfile(args.train_json):
        with open(args.train_json) as file:
            result = json.load(file)
        result = result[0] if isinstance(result, list) else result
        train = {
            name: model["tokens_per_s"]
            for name, model in result["models"].items()
            if name in ("kiln", "reference")
        }
    else:
        sys.exit(
            f"{args.train_json} not found: run bench/throughput.py --json first or pass --train-tokens-per-s"
        )

    print(f"\n{'stage':<48} {'tokens/s':>10} " + " ".join(f"{'x ' + n:>12}" for n in train))
    for stage, tokens_per_s in stages.items():
        ratios = " ".join(f"{tokens_per_s / value:>12.1f}" for value in train.values())
        print(f"{stage:<48} {tokens_per_s:>10,.0f} {ratios}")
    print(
        f"{'training step (L4/H256, from ' + os.path.basename(args.train_json) + ')':<48} "
        + " ".join(f"{name}={value:,.0f}" for name, value in train.items())
    )
    print(
        f"\npadding: {100 * padding_share:.1f}% of the tokens in loader batches (pad_to_multiple_of=8); "
        f"{len(examples)} examples per epoch; {threads} torch threads; load average {os.getloadavg()[0]:.2f}"
    )
    if args.json:
        with open(args.json, "w") as file:
            json.dump(
                {
                    "seq_len": SEQ_LEN,
                    "batch_size": BATCH_SIZE,
                    "tokenizer_vocab": len(tokenizer),
                    "examples_per_epoch": len(examples),
                    "padding_share": padding_share,
                    "stages_tokens_per_s": stages,
                    "training_tokens_per_s": train,
                    "load_average": os.getloadavg()[0],
                },
                file,
                indent=1,
            )
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

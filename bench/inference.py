"""Inference speed of Kiln against transformers' BERT and GPT-2, same weights, same inputs, same outputs.

    python bench/inference.py --json bench/results/inference.json                 # BERT-mini / GPT-2 L4 shapes
    python bench/inference.py --shape base --rounds 3 --json bench/results/inference-base.json

Three tasks, each at batch 1 (latency: one input per call, `--latency-inputs` calls per round) and batch 32
(throughput: one call of 32 inputs, `batch_size=32`):
- `pipeline("fill-mask")`: BertForMaskedLM vs KilnEncoderForMaskedLM, an SST-2 dev sentence with one word masked;
- `pipeline("text-classification")`: BertForSequenceClassification vs KilnEncoderForSequenceClassification;
- `generate`: GPT2LMHeadModel vs KilnDecoderForCausalLM, greedy, exactly 128 new tokens (`min_new_tokens`),
  prompts from SST-2 dev sentences (left-padded at batch 32), with the KV cache.

The transformers model is built from a seed and converted with `pretrain.convert.from_transformers`, so both
start from identical weights; the tokenizers (WordPiece and byte-level BPE) are trained on the SST-2 training
sentences with `pretrain.data.tokenizer.train_tokenizer`. Before any timing, both models must give the same
outputs on every timed input: the same top-5 tokens (fill-mask), the same labels (classification), the same
generated token ids (generate), and scores within `--atol`. Then each round runs Kiln and transformers one after
the other, reversing the order every round; the table gives the median time per input and the median over
rounds of the paired time ratio (transformers / Kiln: above 1 means Kiln is faster), which cancels slow drifts
of the machine's load.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # python bench/inference.py: import the repository's packages
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import transformers  # noqa: E402

from bench.machine import cpu_name  # noqa: E402
from pretrain.convert import from_transformers  # noqa: E402

# ../shared/data/sst2, resolved against the repository root
DEFAULT_SST2 = Path(
    os.environ.get("KILN_SST2", Path(__file__).resolve().parents[2] / "shared" / "data" / "sst2")
)

SHAPES = {  # layers, hidden, heads
    "tiny": (2, 64, 2),  # the tests
    "mini": (4, 256, 4),
    "base": (12, 768, 12),
}


# ------------------------------------------------------------------------------------------------- the inputs
def read_sentences(folder: Path, split: str, limit: int | None = None) -> list[str]:
    with open(folder / f"{split}.tsv", newline="") as file:
        rows = list(csv.DictReader(file, delimiter="\t", quoting=csv.QUOTE_NONE))
    sentences = [row["sentence"].strip() for row in rows]
    return sentences[:limit] if limit else sentences


def build_tokenizers(train_sentences: list[str], vocab_size: int):
    from pretrain.data.tokenizer import train_tokenizer

    wordpiece = train_tokenizer(train_sentences, kind="wordpiece", vocab_size=vocab_size)
    bpe = train_tokenizer(train_sentences, kind="bpe", vocab_size=vocab_size)
    bpe.padding_side = "left"  # decoder-only batch generation
    return wordpiece, bpe


def masked_inputs(sentences: list[str], mask_token: str) -> list[str]:
    """Each sentence with its middle word replaced by the mask token."""
    out = []
    for sentence in sentences:
        words = sentence.split()
        words[len(words) // 2] = mask_token
        out.append(" ".join(words))
    return out


# ------------------------------------------------------------------------------------------------- the models
def build_pair(kind: str, shape: tuple[int, int, int], vocab_size: int, seed: int, pad_token_id: int):
    """(transformers model, Kiln model) with identical weights, in eval mode."""
    layers, hidden, heads = shape
    torch.manual_seed(seed)
    if kind == "generate":
        config = transformers.GPT2Config(
            vocab_size=vocab_size,
            n_embd=hidden,
            n_layer=layers,
            n_head=heads,
            n_positions=512,
            pad_token_id=pad_token_id,
            bos_token_id=pad_token_id,
            eos_token_id=pad_token_id,
        )
        reference = transformers.GPT2LMHeadModel(config)
    else:
        config = transformers.BertConfig(
            vocab_size=vocab_size,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=4 * hidden,
            pad_token_id=pad_token_id,
        )
        if kind == "fill-mask":
            reference = transformers.BertForMaskedLM(config)
        else:
            config.num_labels = 2
            config.id2label = {0: "negative", 1: "positive"}
            config.label2id = {"negative": 0, "positive": 1}
            reference = transformers.BertForSequenceClassification(config)
    kiln = from_transformers(reference)
    return reference.eval(), kiln.eval()


class Task:
    """One task at one batch size for one model: `run()` does a round's work and returns its outputs."""

    def __init__(self, kind: str, model, tokenizer, inputs: list[str], batch: int, new_tokens: int):
        self.kind, self.model, self.tokenizer, self.inputs = kind, model, tokenizer, inputs
        self.batch, self.new_tokens = batch, new_tokens
        if kind == "generate":
            self.encoded = [
                tokenizer(inputs[i : i + batch], return_tensors="pt", padding=True)
                for i in range(0, len(inputs), batch)
            ]
        else:
            self.pipe = transformers.pipeline(kind, model=model, tokenizer=tokenizer, device="cpu")
        self.times: list[float] = []

    def run(self):
        with torch.inference_mode():
            if self.kind == "generate":
                return [
                    self.model.generate(
                        **encoded,
                        do_sample=False,
                        max_new_tokens=self.new_tokens,
                        min_new_tokens=self.new_tokens,
                        pad_token_id=self.tokenizer.pad_token_id,
                    )
                    for encoded in self.encoded
                ]
            if self.batch == 1:
                return [self.pipe(text) for text in self.inputs]
            return self.pipe(self.inputs, batch_size=self.batch)

    def timed_run(self):
        start = time.perf_counter()
        outputs = self.run()
        self.times.append((time.perf_counter() - start) / len(self.inputs))
        return outputs


def compare_outputs(kind: str, reference, kiln, atol: float) -> dict:
    """Raise SystemExit unless both models gave the same predictions; return the largest score difference."""
    if kind == "generate":
        for r, k in zip(reference, kiln):
            if not torch.equal(r, k):
                rows = (r != k).any(-1).nonzero().flatten().tolist()
                raise SystemExit(
                    f"generate: different tokens in rows {rows}; the models are not the same function"
                )
        return {"max_score_diff": 0.0, "tokens_compared": sum(r.numel() for r in reference)}
    if kind == "fill-mask":  # one list of top-k candidates per input
        worst = 0.0
        for r, k in zip(reference, kiln):
            if [c["token"] for c in r] != [c["token"] for c in k]:
                raise SystemExit(f"fill-mask: different top tokens {r} vs {k}")
            worst = max(worst, *(abs(a["score"] - b["score"]) for a, b in zip(r, k)))
    else:
        flat_r = [x[0] if isinstance(x, list) else x for x in reference]
        flat_k = [x[0] if isinstance(x, list) else x for x in kiln]
        if [x["label"] for x in flat_r] != [x["label"] for x in flat_k]:
            raise SystemExit("text-classification: different labels; the models are not the same function")
        worst = max(abs(a["score"] - b["score"]) for a, b in zip(flat_r, flat_k))
    if worst > atol:
        raise SystemExit(
            f"{kind}: scores differ by {worst:.2e} > {atol}; the models are not the same function"
        )
    return {"max_score_diff": worst}


# ---------------------------------------------------------------------------------------------------- running
def bench_case(kind, batch, pair, tokenizer, inputs, args) -> dict:
    reference_model, kiln_model = pair
    runners = {
        "reference": Task(kind, reference_model, tokenizer, inputs, batch, args.new_tokens),
        "kiln": Task(kind, kiln_model, tokenizer, inputs, batch, args.new_tokens),
    }
    outputs = {name: runner.run() for name, runner in runners.items()}  # also the warm-up
    check = compare_outputs(kind, outputs["reference"], outputs["kiln"], args.atol)
    label = f"{kind} batch {batch}"
    print(f"[{label}] same outputs ({check})", flush=True)
    order = ["kiln", "reference"]
    load = [os.getloadavg()[0]]
    for index in range(args.rounds):
        for name in order if index % 2 == 0 else order[::-1]:
            runners[name].timed_run()
        load.append(os.getloadavg()[0])
        print(
            f"[{label}] round {index + 1}/{args.rounds}: kiln {runners['kiln'].times[-1] * 1e3:.1f} ms  "
            f"transformers {runners['reference'].times[-1] * 1e3:.1f} ms per input  (load {load[-1]:.2f})",
            flush=True,
        )
    paired = [r / k for r, k in zip(runners["reference"].times, runners["kiln"].times)]
    return {
        "task": kind,
        "batch": batch,
        "inputs_per_round": len(inputs),
        "check": check,
        "kiln_s_per_input": statistics.median(runners["kiln"].times),
        "reference_s_per_input": statistics.median(runners["reference"].times),
        "kiln_times_s": runners["kiln"].times,
        "reference_times_s": runners["reference"].times,
        "speedup": statistics.median(paired),
        "speedup_min": min(paired),
        "speedup_max": max(paired),
        "load_average": load,
    }


def run(args) -> dict:
    torch.set_num_threads(args.threads or torch.get_num_threads())
    train = read_sentences(args.sst2, "train", args.tokenizer_sentences)
    dev = read_sentences(args.sst2, "dev")
    wordpiece, bpe = build_tokenizers(train, args.vocab_size)
    shape = SHAPES[args.shape]
    results = []
    for kind in args.task:
        tokenizer = bpe if kind == "generate" else wordpiece
        pair = build_pair(kind, shape, len(tokenizer), args.seed, tokenizer.pad_token_id)
        for batch in args.batch:
            count = args.latency_inputs if batch == 1 else batch
            sentences = dev[args.offset : args.offset + count]
            if kind == "fill-mask":
                sentences = masked_inputs(sentences, wordpiece.mask_token)
            if kind == "generate":
                sentences = [" ".join(s.split()[: args.prompt_words]) for s in sentences]
            results.append(bench_case(kind, batch, pair, tokenizer, sentences, args))
        del pair
    return {
        "shape": dict(zip(("layers", "hidden", "heads"), shape), name=args.shape),
        "vocab": {"wordpiece": len(wordpiece), "bpe": len(bpe)},
        "new_tokens": args.new_tokens,
        "machine": {
            "cpu": cpu_name(),
            "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "results": results,
    }


def print_table(report: dict) -> None:
    print(f"\n{'task':<22} {'batch':>5} {'Kiln ms/input':>14} {'transformers ms/input':>22} {'speedup':>18}")
    for r in report["results"]:
        print(
            f"{r['task']:<22} {r['batch']:>5} {r['kiln_s_per_input'] * 1e3:>14.2f} "
            f"{r['reference_s_per_input'] * 1e3:>22.2f} "
            f"{r['speedup']:>7.2f} ({r['speedup_min']:.2f}-{r['speedup_max']:.2f})"
        )
    loads = [value for r in report["results"] for value in r["load_average"]]
    machine = report["machine"]
    print(
        f"\n{machine['cpu']}, {machine['threads']} threads, torch {machine['torch']}, transformers "
        f"{machine['transformers']}; shape {report['shape']}; 1-min load average {min(loads):.2f}-{max(loads):.2f}"
    )
    print(
        "speedup: median over rounds of transformers time / Kiln time (min-max over rounds); > 1: Kiln faster"
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", action="append", choices=["fill-mask", "text-classification", "generate"])
    parser.add_argument("--batch", action="append", type=int, help="repeatable; default 1 and 32")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="mini")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--latency-inputs", type=int, default=8, help="inputs per round at batch 1")
    parser.add_argument("--new-tokens", type=int, default=128, help="greedy tokens generated per prompt")
    parser.add_argument(
        "--prompt-words", type=int, default=8, help="words of each dev sentence used as prompt"
    )
    parser.add_argument("--vocab-size", type=int, default=8192, help="of both trained tokenizers")
    parser.add_argument("--tokenizer-sentences", type=int, default=20000, help="SST-2 train sentences")
    parser.add_argument("--offset", type=int, default=0, help="first SST-2 dev sentence used")
    parser.add_argument("--atol", type=float, default=1e-4, help="largest score difference accepted")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--sst2", type=Path, default=DEFAULT_SST2, help="folder with train.tsv and dev.tsv")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args(argv)
    args.task = args.task or ["fill-mask", "text-classification", "generate"]
    args.batch = args.batch or [1, 32]
    transformers.logging.set_verbosity_error()
    report = run(args)
    print_table(report)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as file:
            json.dump(report, file, indent=1)
        print(f"wrote {args.json}")
    return report


if __name__ == "__main__":
    main()

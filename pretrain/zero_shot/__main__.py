"""`python -m pretrain.zero_shot blimp --model FOLDER_OR_HUB_ID [--data DIR] [--pairs N] [--json OUT]`."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

BLIMP_DESCRIPTION = """Score a pretrained model on BLiMP's minimal pairs, zero-shot: a decoder by the summed
log-probability of each sentence (as lm-evaluation-harness scores it), an encoder by its pseudo-log-likelihood
(each token masked in turn); a pair is right when its grammatical sentence scores strictly higher. Prints the
accuracy overall (mean over paradigms), per phenomenon and per paradigm. Guide: docs/zero-shot.md."""


def blimp_parser() -> argparse.ArgumentParser:
    """The command line of `python -m pretrain.zero_shot blimp`."""
    from kiln.cli import add_print_config
    from kiln.option_range import number_argument

    parser = argparse.ArgumentParser(prog="python -m pretrain.zero_shot blimp", description=BLIMP_DESCRIPTION)
    parser.add_argument(
        "--model",
        required=True,
        metavar="MODEL",
        help="a saved model folder (e.g. runs/encoder-tiny/final) or a Hub id; Kiln or transformers",
    )
    parser.add_argument(
        "--data",
        metavar="DIR",
        default=None,
        help="folder of BLiMP's <paradigm>.jsonl files, gzipped or not (default: the Hub dataset "
        "nyu-mll/blimp; the repository ships the first 50 pairs of each paradigm in data/blimp)",
    )
    parser.add_argument(
        "--pairs",
        metavar="N",
        type=number_argument(int, low=1),
        default=None,
        help="the first N pairs of every paradigm (default: all, 1,000 each)",
    )
    parser.add_argument(
        "--paradigms", metavar="NAME", nargs="+", default=None, help="only these paradigms (default: all 67)"
    )
    parser.add_argument(
        "--json",
        metavar="OUT",
        default=None,
        help="also write the accuracies as JSON to OUT (overall under `mean`)",
    )
    parser.add_argument(
        "--kind",
        choices=("encoder", "decoder"),
        default=None,
        help="score as a masked LM (encoder) or causal LM (decoder); default: from the model's config.json",
    )
    parser.add_argument("--revision", metavar="REV", default=None, help="Hub revision of --model")
    parser.add_argument(
        "--from_scratch",
        action="store_true",
        help="random weights with the shape and tokenizer of --model (drawn from --seed): the "
        "baseline that shows what pretraining taught",
    )
    parser.add_argument(
        "--seed", type=number_argument(int, 0, 2**32 - 1), default=0, help="seed of --from_scratch's weights"
    )
    parser.add_argument(
        "--pll",
        choices=("original", "word-l2r"),
        default="original",  # scoring.PLL_METRICS
        help="an encoder's pseudo-log-likelihood: `original` (each token masked alone, Salazar et "
        "al. 2020) or `word-l2r` (with the later tokens of its word, Kauf & Ivanova 2023: no bonus "
        "for words of many tokens)",
    )
    parser.add_argument(
        "--decoder_scoring",
        choices=("causal", "masked"),  # scoring.DECODER_SCORING
        default="causal",
        help="a decoder's score: `causal` (its log-probability, left to right) or `masked` (each token masked "
        "alone and predicted at the position before it, with attention over the whole sentence: for a decoder "
        "pretrained with the clm+mntp objective)",
    )
    parser.add_argument(
        "--batch_tokens",
        metavar="B",
        type=number_argument(int, low=1),
        default=None,
        help="rows x longest length of one batch (default: 16384 for an encoder, whose rows are "
        "each sentence's masked copies; 8192 for a decoder)",
    )
    add_print_config(parser)
    return parser


def blimp(argv: list[str]) -> None:
    from kiln.cli import answer_print_config
    from kiln.errors import ConfigError

    from .blimp import BlimpEvaluation, format_report, read_blimp
    from .models import check_model_source, load_model
    from .scoring import ZeroShotError, max_input_length

    args = blimp_parser().parse_args(argv)
    answer_print_config(args)
    try:
        if args.json:
            check_output_file(args.json, "--json")
        check_model_source(
            args.model, args.revision, hub=False
        )  # a missing folder said before the data is read
        pairs = read_blimp(args.data, args.pairs, args.paradigms)
        say_short_paradigms(pairs, args.pairs)
        model, tokenizer, kind = load_model(
            args.model, args.kind, args.revision, args.from_scratch, args.seed
        )
        evaluation = BlimpEvaluation(
            pairs,
            tokenizer,
            kind,
            args.batch_tokens,
            max_input_length(model),
            args.pll,
            args.decoder_scoring,
        )
    except (ZeroShotError, ConfigError) as err:
        # a refused input, said before any pair is scored: the model (nothing there, no scoring head, refused by
        # the model gate), the data, --json, an option the model cannot take: exit status 2, as argparse's
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    start = time.perf_counter()
    result = evaluation.evaluate(model, progress=True)
    seconds = time.perf_counter() - start
    print(format_report(result))
    print(
        f"\n{kind} {args.model}{' (random weights)' if args.from_scratch else ''}: {len(pairs):,} pairs in {seconds:.0f} s"
    )
    if args.json:
        facts = {
            "model": args.model,
            "kind": kind,
            "from_scratch": args.from_scratch,
            "seconds": round(seconds, 1),
            "pll": args.pll if kind == "encoder" else None,
            "decoder_scoring": args.decoder_scoring if kind == "decoder" else None,
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({**result, **facts}, f, indent=1)
            f.write("\n")


def say_short_paradigms(pairs, asked: int | None) -> None:
    """One line when --pairs asks for more pairs than the paradigms hold (the shipped sample has 50 of each):
    the count scored is then what the data holds, not what was asked."""
    if asked is None:
        return
    counts: dict[str, int] = {}
    for pair in pairs:
        counts[pair.paradigm] = counts.get(pair.paradigm, 0) + 1
    short = {name: count for name, count in counts.items() if count < asked}
    if short:
        most = max(short.values())
        print(
            f"note: --pairs {asked}: {len(short)} of {len(counts)} paradigms hold fewer pairs (at most {most}); "
            f"scoring the {len(pairs):,} pairs there are",
            file=sys.stderr,
        )


def check_output_file(path: str, option: str) -> None:
    """`path` can be written: its folder exists and is writable, and it is no folder itself; checked before the
    evaluation, whose result it would hold. ZeroShotError (one line) when not."""
    from .scoring import ZeroShotError

    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        example = os.path.join(path, "blimp.json")
        raise ZeroShotError(f"{option} {path} is a folder; name a file to write (e.g. {example})")
    if not os.path.isdir(folder):
        raise ZeroShotError(
            f"{option} {path}: its folder {folder} does not exist; create it first or name another file"
        )
    if not os.access(folder, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ZeroShotError(f"{option} {path} cannot be written here (no permission); name another file")


COMMANDS = {"blimp": blimp}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        if argv and argv[0] in ("-h", "--help"):
            print(
                "usage: python -m pretrain.zero_shot blimp --help\n\nZero-shot evaluation of pretrained models. "
                "Commands: blimp (BLiMP's minimal pairs). Guide: docs/zero-shot.md."
            )
            return
        print(
            "error: name a task: python -m pretrain.zero_shot blimp --model FOLDER_OR_HUB_ID (see --help)",
            file=sys.stderr,
        )
        sys.exit(2)  # a usage error, as argparse's
    COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    main()

"""The frequency baselines of BLiMP: each sentence scored by word counts of a corpus, no training.

    python experiments/blimp_frequency.py --corpus "runs/corpus/gutenberg/*.txt" "runs/corpus/wikitext/*.txt" \
        "runs/corpus/tinystories/*.txt" --data ../shared/data/blimp --json runs/blimp-frequency.json

A unigram and a bigram model of the corpus's lower-cased words (add-one smoothing; a sentence's score is the sum
of its words' log-probabilities, the bigram's from a sentence start) score every pair as the trained models are
scored (a tie is wrong). What they get right is what word frequency alone decides: a pair whose ungrammatical
sentence has rarer or more words is right for them, whatever the grammar. Beside the trained models they say how
much of a score is frequency, and why a model's random weights (which score by token counts and lengths too) do
not sit at 50. The counts are a few lines of Kiln's own: an n-gram library (nltk.lm) scores 134,000 sentences
orders of magnitude slower and is no dependency of Kiln; kenlm needs a compiled binary.

Writes the JSON of `python -m pretrain.zero_shot blimp --json` twice, one per model, as OUT with `-unigram` and
`-bigram` before its suffix; experiments/blimp_results.py records them.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import re
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?|[^\sa-z0-9]")
START = "<s>"


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def count_corpus(patterns: list[str]) -> tuple[Counter, Counter]:
    """Unigram and bigram counts over the files' lines (each line a paragraph, each starting a sequence)."""
    unigrams: Counter = Counter()
    bigrams: Counter = Counter()
    files = sorted({path for pattern in patterns for path in glob.glob(pattern)})
    if not files:
        sys.exit(
            f"error: no corpus file matches {' '.join(patterns)}; build it with python experiments/make_corpus.py"
        )
    for path in files:
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                tokens = words(line)
                if tokens:
                    unigrams.update(tokens)
                    unigrams[START] += 1
                    bigrams.update(zip([START, *tokens], tokens))
    return unigrams, bigrams


def scorers(unigrams: Counter, bigrams: Counter):
    total, vocabulary = sum(unigrams.values()), len(unigrams) + 1  # +1: every unseen word

    def unigram(sentence: str) -> float:
        return sum(math.log((unigrams[w] + 1) / (total + vocabulary)) for w in words(sentence))

    def bigram(sentence: str) -> float:
        tokens = words(sentence)
        return sum(
            math.log((bigrams[(a, b)] + 1) / (unigrams[a] + vocabulary))
            for a, b in zip([START, *tokens], tokens)
        )

    return {"unigram": unigram, "bigram": bigram}


def main(argv: list[str] | None = None) -> None:
    sys.path.insert(0, str(REPO))
    from pretrain.zero_shot.blimp import blimp_accuracies, read_blimp

    parser = argparse.ArgumentParser(
        prog="python experiments/blimp_frequency.py", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--corpus", nargs="+", required=True, help="globs of the corpus's text files")
    parser.add_argument("--data", required=True, help="BLiMP's folder of <paradigm>.jsonl files")
    parser.add_argument("--json", required=True, help="OUT: writes OUT-unigram.json and OUT-bigram.json")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    pairs = read_blimp(args.data)
    unigrams, bigrams = count_corpus(args.corpus)
    out = Path(args.json)
    for kind, score in scorers(unigrams, bigrams).items():
        result = blimp_accuracies(pairs, [score(p.good) > score(p.bad) for p in pairs])  # a tie is wrong
        facts = {
            "model": f"{kind} counts of {', '.join(Path(p).parent.name for p in args.corpus)}",
            "kind": kind,
            "from_scratch": False,
            "seconds": round(time.perf_counter() - start, 1),
        }
        target = out.with_name(f"{out.stem}-{kind}{out.suffix}")
        target.write_text(json.dumps({**result, **facts}, indent=1) + "\n", encoding="utf-8")
        print(f"{kind}: BLiMP {100 * result['mean']:.1f} ({result['pairs']:,} pairs) -> {target}")


if __name__ == "__main__":
    main()

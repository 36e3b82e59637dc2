"""Zero-shot evaluation: scoring sentences with a pretrained model, and BLiMP's minimal pairs scored that way.

    python -m pretrain.zero_shot blimp --model runs/encoder-tiny/final --data DIR --pairs 50

`scoring` holds the model side, shared by the command and the in-loop evaluation (`--eval.blimp`, see
pretrain/evaluation.py): a causal LM's summed log-probability of a sentence, and a masked LM's
pseudo-log-likelihood (Salazar et al. 2020). `blimp` reads BLiMP's JSONL files (or the Hub dataset) and reports
accuracies. `models` loads a Kiln or transformers folder or Hub id for scoring.

Why the scoring is written here. lm-evaluation-harness scores decoders (its `hf` model loads a Kiln decoder folder
with `trust_remote_code`; docs/zero-shot.md shows the command), and the decoder score here is the one it computes,
token for token, so that the two agree (tests/test_zero_shot.py runs both); it is kept here too because the
in-loop evaluation must score the model being trained, split over the run's processes, which lm-eval's entry
points (a model to load, their own batching) do not do. lm-eval has no masked-LM scorer. The `minicons` package
has one (`scorer.MaskedLMScorer`, PLL as here), and was considered: it computes the vocabulary logits at every
position of every masked copy of a sentence (a sentence of n tokens: n x n rows through the vocabulary projection,
where one row per copy is read), batches by sentence count, so its batches cannot be planned across processes
for an exact split, and it brings pandas, pillow and wonderwords. Here a Kiln encoder runs its last block and its
vocabulary projection at the masked position of each copy only (`sparse_prediction`), so all 67,000 BLiMP pairs
of a tiny encoder take minutes on one CPU core.
"""

from .blimp import BlimpEvaluation, MinimalPair, blimp_accuracies, format_report, read_blimp
from .scoring import SentenceScorer, ZeroShotError, score_sentences

__all__ = [
    "BlimpEvaluation",
    "MinimalPair",
    "SentenceScorer",
    "ZeroShotError",
    "blimp_accuracies",
    "format_report",
    "read_blimp",
    "score_sentences",
]

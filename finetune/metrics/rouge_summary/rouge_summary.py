"""ROUGE-1/2/L/Lsum F-measures for summarization, computed by Google's rouge_score.

Loaded by path (no Hub needed): `finetune.metrics.load_metric("rouge_summary")`.
"""

import re

from rouge_score import rouge_scorer

from finetune.metrics.base import TEXT_AND_REFERENCES, LocalMetric

_DESCRIPTION = """
Mean (over segments) ROUGE-1, ROUGE-2, ROUGE-L and ROUGE-Lsum F-measure, on rouge_score's 0-1 scale.
rouge_score lowercases and keeps only [a-z0-9] tokens; with `use_stemmer` (default True) it applies the Porter
stemmer. ROUGE-Lsum scores sentence by sentence (summary-level LCS); sentences are split on newlines, which are
added after . ! ? when `split_sentences` is True (default). With several references per segment, the best
scoring reference counts.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of str): generated summaries.
    references (list of str, or list of list of str): reference summaries, one or several per segment.
    use_stemmer (bool): Porter-stem tokens before matching (default True).
    split_sentences (bool): put each sentence on its own line for ROUGE-Lsum (default True).
Returns:
    rouge1, rouge2, rougeL, rougeLsum: mean F-measures, in [0, 1].
Examples:
    >>> metric = evaluate.load("finetune/metrics/rouge_summary")
    >>> metric.compute(predictions=["the cat sat"], references=["the cat sat on the mat"])
    {'rouge1': 0.666..., 'rouge2': 0.571..., 'rougeL': 0.666..., 'rougeLsum': 0.666...}
"""

_CITATION = """
@inproceedings{lin-2004-rouge, title={{ROUGE}: A Package for Automatic Evaluation of Summaries},
author={Lin, Chin-Yew}, booktitle={Text Summarization Branches Out}, year={2004}, pages={74--81}}
"""

_ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def one_sentence_per_line(text):
    return _SENTENCE_END.sub("\n", text.strip())


class RougeSummary(LocalMetric):
    DESCRIPTION, INPUTS, CITATION = _DESCRIPTION, _KWARGS_DESCRIPTION, _CITATION
    FEATURES = TEXT_AND_REFERENCES
    URLS = {"codebase_urls": ["https://github.com/google-research/google-research/tree/master/rouge"]}

    def _compute(self, predictions, references, use_stemmer=True, split_sentences=True):
        if not predictions:
            raise ValueError("ROUGE needs at least one prediction")
        scorer = rouge_scorer.RougeScorer(list(_ROUGE_TYPES), use_stemmer=use_stemmer)
        totals = dict.fromkeys(_ROUGE_TYPES, 0.0)
        for prediction, refs in zip(predictions, references):
            refs = [refs] if isinstance(refs, str) else list(refs)
            if split_sentences:
                prediction = one_sentence_per_line(prediction)
                refs = [one_sentence_per_line(ref) for ref in refs]
            scores = scorer.score_multi(refs, prediction)
            for rouge_type in _ROUGE_TYPES:
                totals[rouge_type] += scores[rouge_type].fmeasure
        return {rouge_type: total / len(predictions) for rouge_type, total in totals.items()}

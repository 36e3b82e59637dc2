"""Corpus BLEU and chrF for translation, computed by sacreBLEU.

Loaded by path (no Hub needed): `finetune.metrics.load_metric("translation")`.
"""

from sacrebleu.metrics import BLEU, CHRF

from finetune.metrics.base import TEXT_AND_REFERENCES, LocalMetric

_DESCRIPTION = """
sacreBLEU corpus BLEU (default 13a tokenization) and chrF (character n-gram F-score; chrF++ with
`chrf_word_order=2`), both on sacreBLEU's 0-100 scale. Hypotheses and references are detokenized strings.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of str): system translations, one per segment.
    references (list of str, or list of list of str): one reference per segment, or several (the number may
        vary per segment).
    tokenize (str): BLEU tokenizer: "13a" (default), "intl", "zh", "ja-mecab", "char", "none", ...
    lowercase (bool): lowercase before scoring (default False).
    chrf_word_order (int): 0 for chrF (default), 2 for chrF++.
Returns:
    bleu: corpus BLEU, 0-100.
    chrf: corpus chrF (or chrF++), 0-100.
    bleu_precisions: the four n-gram precisions, 0-100.
    brevity_penalty, hyp_len, ref_len: BLEU's length statistics.
Examples:
    >>> metric = evaluate.load("finetune/metrics/translation")
    >>> metric.compute(predictions=["the cat sat on the mat"], references=[["the cat sat on the mat"]])
    {'bleu': 100.0, 'chrf': 100.0, ...}
"""

_CITATION = """
@inproceedings{post-2018-call, title={A Call for Clarity in Reporting {BLEU} Scores}, author={Post, Matt},
booktitle={Proceedings of the Third Conference on Machine Translation: Research Papers}, year={2018},
pages={186--191}}
"""


class Translation(LocalMetric):
    DESCRIPTION, INPUTS, CITATION = _DESCRIPTION, _KWARGS_DESCRIPTION, _CITATION
    FEATURES = TEXT_AND_REFERENCES
    URLS = {"codebase_urls": ["https://github.com/mjpost/sacreBLEU"]}

    def _compute(self, predictions, references, tokenize="13a", lowercase=False, chrf_word_order=0):
        if references and isinstance(references[0], str):
            references = [[reference] for reference in references]
        # sacreBLEU wants one stream per reference position; None marks a segment with fewer references
        max_refs = max(len(refs) for refs in references)
        streams = [[refs[i] if i < len(refs) else None for refs in references] for i in range(max_refs)]
        bleu = BLEU(tokenize=tokenize, lowercase=lowercase).corpus_score(predictions, streams)
        chrf = CHRF(word_order=chrf_word_order, lowercase=lowercase).corpus_score(predictions, streams)
        return {
            "bleu": float(bleu.score),
            "chrf": float(chrf.score),
            "bleu_precisions": [float(p) for p in bleu.precisions],
            "brevity_penalty": float(bleu.bp),
            "hyp_len": int(bleu.sys_len),
            "ref_len": int(bleu.ref_len),
        }

"""Pearson and Spearman correlation for regression targets (e.g. STS-B similarity), computed by SciPy.

Loaded by path (no Hub needed): `finetune.metrics.load_metric("regression")`.
"""

from scipy.stats import pearsonr, spearmanr

from finetune.metrics.base import LocalMetric, pairs

_DESCRIPTION = """
Pearson's r (linear correlation) and Spearman's rho (rank correlation) between predicted and reference scores.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of float): predicted scores.
    references (list of float): gold scores.
Returns:
    pearson: Pearson correlation coefficient, in [-1, 1].
    spearmanr: Spearman rank correlation coefficient, in [-1, 1].
    combined_score: the mean of the two (the GLUE STS-B summary number).
Examples:
    >>> metric = evaluate.load("finetune/metrics/regression")
    >>> metric.compute(predictions=[1.0, 2.0, 3.0], references=[1.0, 2.0, 4.0])
    {'pearson': 0.981..., 'spearmanr': 1.0, 'combined_score': 0.990...}
"""

_CITATION = """
@article{2020SciPy-NMeth, title={{SciPy} 1.0: Fundamental Algorithms for Scientific Computing in Python},
author={Virtanen, Pauli and others}, journal={Nature Methods}, volume={17}, pages={261--272}, year={2020}}
"""


class Regression(LocalMetric):
    DESCRIPTION, INPUTS, CITATION = _DESCRIPTION, _KWARGS_DESCRIPTION, _CITATION
    FEATURES = pairs("float64")
    URLS = {"reference_urls": ["https://docs.scipy.org/doc/scipy/reference/stats.html"]}

    def _compute(self, predictions, references):
        if len(predictions) < 2:
            raise ValueError(f"correlation needs at least 2 predictions, got {len(predictions)}")
        pearson = float(pearsonr(references, predictions)[0])
        spearman = float(spearmanr(references, predictions)[0])
        return {"pearson": pearson, "spearmanr": spearman, "combined_score": (pearson + spearman) / 2}

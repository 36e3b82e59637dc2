"""Accuracy, F1 and Matthews correlation for sequence classification, computed by scikit-learn.

Loaded by path (no Hub needed): `evaluate.load("<repo>/finetune/metrics/classification")`,
or `finetune.metrics.load_metric("classification")`.
"""

from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from finetune.metrics.base import LocalMetric, pairs

_DESCRIPTION = """
Accuracy, F1 and Matthews correlation coefficient (MCC) of predicted class ids against reference class ids.
F1 is binary (of class `pos_label`) when every id is 0 or 1 and `average="auto"`, otherwise macro-averaged;
pass `average` ("binary", "macro", "micro", "weighted") to choose.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of int): predicted class ids.
    references (list of int): gold class ids.
    average (str): F1 averaging: "auto" (default: "binary" for ids in {0, 1}, else "macro"), "binary",
        "macro", "micro" or "weighted".
    pos_label (int): the positive class for binary F1 (default 1).
    labels (list of int, optional): every class id of the task, so that macro F1 also counts classes that no
        prediction or reference in this batch uses.
Returns:
    accuracy: fraction of exact matches, in [0, 1].
    f1: F1 score, in [0, 1].
    matthews_correlation: MCC, in [-1, 1].
Examples:
    >>> metric = evaluate.load("finetune/metrics/classification")
    >>> metric.compute(predictions=[0, 1, 1, 0], references=[0, 1, 0, 0])
    {'accuracy': 0.75, 'f1': 0.666..., 'matthews_correlation': 0.577...}
"""

_CITATION = """
@article{scikit-learn, title={Scikit-learn: Machine Learning in {P}ython}, author={Pedregosa, F. and others},
journal={Journal of Machine Learning Research}, volume={12}, pages={2825--2830}, year={2011}}
"""

_AVERAGES = ("auto", "binary", "macro", "micro", "weighted")


class Classification(LocalMetric):
    DESCRIPTION, INPUTS, CITATION = _DESCRIPTION, _KWARGS_DESCRIPTION, _CITATION
    FEATURES = pairs("int64")
    URLS = {"reference_urls": ["https://scikit-learn.org/stable/modules/model_evaluation.html"]}

    def _compute(self, predictions, references, average="auto", pos_label=1, labels=None):
        if average not in _AVERAGES:
            raise ValueError(f"average={average!r} is not supported; use one of {', '.join(_AVERAGES)}")
        if average == "auto":
            ids = set(predictions) | set(references) | set(labels or [])
            average = "binary" if ids <= {0, 1} else "macro"
        f1 = f1_score(
            references,
            predictions,
            average=average,
            pos_label=pos_label,
            labels=None if average == "binary" else labels,
            zero_division=0,
        )
        return {
            "accuracy": float(accuracy_score(references, predictions)),
            "f1": float(f1),
            "matthews_correlation": float(matthews_corrcoef(references, predictions)),
        }

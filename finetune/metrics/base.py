"""What every local metric module shares, written once: the `evaluate.Metric` boilerplate.

A module `finetune/metrics/<name>/<name>.py` keeps evaluate's layout (a module docstring, `_DESCRIPTION`,
`_KWARGS_DESCRIPTION`, `_CITATION`, one Metric class with `_compute`) and declares the rest as class attributes
of a `LocalMetric`: its inputs (`FEATURES`, built with `pairs` or `TEXT_AND_REFERENCES`) and its links (`URLS`).
`LocalMetric` turns them into the `MetricInfo` and the class docstring (what evaluate's template does with
`_info` and `add_start_docstrings` in every module).

`evaluate.load` copies the module file into its cache and imports it from there, so a module reaches this file
by its absolute name (`from finetune.metrics.base import ...`): evaluate checks such an import as a library
dependency, which the installed Kiln packages satisfy. `LocalMetric` is abstract (no `_compute`), so evaluate,
which takes the first concrete Metric class of a module, picks the module's own class, not this one.
"""

from __future__ import annotations

import abc

import datasets
import evaluate


def pairs(value: str, lists: bool = False) -> datasets.Features:
    """One prediction and one reference per example, both of the datasets value type `value` (e.g. "int64"),
    or both lists of such values (`lists`: one per word of a sentence, say)."""
    feature = datasets.Sequence(datasets.Value(value)) if lists else datasets.Value(value)
    return datasets.Features({"predictions": feature, "references": feature})


TEXT_AND_REFERENCES = [
    datasets.Features(
        {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
    ),
    pairs("string"),
]
"""Generated text against one reference string or several (a list of strings) per example."""


class LocalMetric(evaluate.Metric, metaclass=abc.ABCMeta):
    """An `evaluate.Metric` declared by class attributes; a subclass writes only `_compute`."""

    DESCRIPTION: str = ""
    """The module's `_DESCRIPTION`: what it computes."""
    INPUTS: str = ""
    """The module's `_KWARGS_DESCRIPTION`: arguments, returned values, an example."""
    CITATION: str = ""
    """The module's `_CITATION`."""
    FEATURES: datasets.Features | list[datasets.Features] | None = None
    """The input format(s) of `compute`: `pairs(...)`, `TEXT_AND_REFERENCES` or datasets.Features of one's own."""
    URLS: dict[str, list[str]] = {}
    """`reference_urls` and/or `codebase_urls` of the MetricInfo."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
        cls.__doc__ = cls.DESCRIPTION + cls.INPUTS + "\n\n" + (cls.__doc__ or "")

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=self.DESCRIPTION,
            citation=self.CITATION,
            inputs_description=self.INPUTS,
            features=self.FEATURES,
            **self.URLS,
        )

    @abc.abstractmethod
    def _compute(self, predictions, references, **kwargs) -> dict:
        """The scores of `predictions` against `references` (lists in the FEATURES format)."""


__all__ = ["LocalMetric", "TEXT_AND_REFERENCES", "pairs"]

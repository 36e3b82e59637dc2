"""Local `evaluate` metric modules, loaded by path so that no Hub access is needed.

Each folder `finetune/metrics/<name>/` holds `<name>.py` with one `evaluate.Metric` subclass that wraps a
library (scikit-learn, SciPy, seqeval, sacreBLEU, rouge_score); the library computes, the module only adapts
inputs and names the outputs. What the modules share (MetricInfo, docstring, input formats) is written once in
`finetune/metrics/base.py` (`LocalMetric`), which each module imports by its absolute name.
"""

from pathlib import Path

import evaluate

METRICS_DIR = Path(__file__).resolve().parent


def available_metrics() -> list[str]:
    return sorted(path.name for path in METRICS_DIR.iterdir() if (path / f"{path.name}.py").is_file())


def load_metric(name: str, **kwargs) -> evaluate.EvaluationModule:
    """Load the local metric module `name` (e.g. "classification"); kwargs go to `evaluate.load`."""
    if name not in available_metrics():
        raise ValueError(
            f"unknown metric {name!r}; available local metrics: {', '.join(available_metrics())}"
        )
    return evaluate.load(str(METRICS_DIR / name), **kwargs)


__all__ = ["METRICS_DIR", "available_metrics", "load_metric"]

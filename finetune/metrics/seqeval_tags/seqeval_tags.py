"""Entity-level precision/recall/F1 (overall and per entity type) and token accuracy for tagging, computed by
seqeval. Works on tag *names* (e.g. "B-PER"), one list per sentence, one tag per word.

Loaded by path (no Hub needed): `finetune.metrics.load_metric("seqeval_tags")`.
"""

from seqeval.metrics import accuracy_score, classification_report
from seqeval.scheme import BILOU, IOB1, IOB2, IOBES, IOE1, IOE2

from finetune.metrics.base import LocalMetric, pairs

_DESCRIPTION = """
For IOB-style tag sets (every tag is "O" or has a B-/I-/E-/S-/L-/U- prefix): seqeval's entity-level
precision, recall and F1, overall (micro-averaged) and per entity type, plus token accuracy. For other tag sets
(POS tags such as UPOS/XPOS) only token accuracy is returned, since entity spans make no sense there.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of list of str): predicted tags, one list per sentence.
    references (list of list of str): gold tags, same shapes as predictions.
    entities (bool, optional): force entity-level scores on (True) or off (False); by default (None) they are
        computed when the reference tag set looks IOB-style.
    scheme (str, optional): "IOB1", "IOB2", "IOE1", "IOE2", "IOBES" or "BILOU"; with `mode="strict"` spans must
        follow that scheme exactly. Default None: conlleval-compatible lenient decoding.
    mode (str, optional): None (conlleval-compatible, the default) or "strict".
Returns:
    accuracy: token accuracy, in [0, 1].
    precision, recall, f1: overall entity-level scores (IOB tag sets only), in [0, 1].
    <TYPE>_precision, <TYPE>_recall, <TYPE>_f1, <TYPE>_number: the same per entity type, with the number of
        gold entities of that type (IOB tag sets only).
Examples:
    >>> metric = evaluate.load("finetune/metrics/seqeval_tags")
    >>> metric.compute(predictions=[["B-PER", "I-PER", "O"]], references=[["B-PER", "I-PER", "O"]])
    {'accuracy': 1.0, 'precision': 1.0, 'recall': 1.0, 'f1': 1.0, 'PER_precision': 1.0, ...}
"""

_CITATION = """
@misc{seqeval, title={{seqeval}: A Python framework for sequence labeling evaluation},
url={https://github.com/chakki-works/seqeval}, author={Hiroki Nakayama}, year={2018}}
"""

_SCHEMES = {"IOB1": IOB1, "IOB2": IOB2, "IOE1": IOE1, "IOE2": IOE2, "IOBES": IOBES, "BILOU": BILOU}
_PREFIXES = ("B-", "I-", "E-", "S-", "L-", "U-")


def looks_iob(tags):
    return all(tag == "O" or tag.startswith(_PREFIXES) for tag in tags)


class SeqevalTags(LocalMetric):
    DESCRIPTION, INPUTS, CITATION = _DESCRIPTION, _KWARGS_DESCRIPTION, _CITATION
    FEATURES = pairs("string", lists=True)
    URLS = {"codebase_urls": ["https://github.com/chakki-works/seqeval"]}

    def _compute(self, predictions, references, entities=None, scheme=None, mode=None):
        for i, (pred, ref) in enumerate(zip(predictions, references)):
            if len(pred) != len(ref):
                raise ValueError(
                    f"sentence {i} has {len(pred)} predicted tags but {len(ref)} reference tags; "
                    "map predictions back to one tag per word first"
                )
        results = {"accuracy": float(accuracy_score(references, predictions))}
        if entities is None:
            entities = looks_iob(tag for sentence in references for tag in sentence)
        if not entities:
            return results
        if scheme is not None and scheme not in _SCHEMES:
            raise ValueError(f"scheme={scheme!r} is not supported; use one of {', '.join(_SCHEMES)}")
        report = classification_report(
            references,
            predictions,
            output_dict=True,
            zero_division=0,
            mode=mode,
            scheme=_SCHEMES[scheme] if scheme else None,
        )
        overall = report.pop("micro avg")
        report.pop("macro avg", None)
        report.pop("weighted avg", None)
        results["precision"] = float(overall["precision"])
        results["recall"] = float(overall["recall"])
        results["f1"] = float(overall["f1-score"])
        for entity_type, scores in sorted(report.items()):
            results[f"{entity_type}_precision"] = float(scores["precision"])
            results[f"{entity_type}_recall"] = float(scores["recall"])
            results[f"{entity_type}_f1"] = float(scores["f1-score"])
            results[f"{entity_type}_number"] = int(scores["support"])
        return results

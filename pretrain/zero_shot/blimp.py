"""BLiMP (Warstadt et al. 2020): 67 paradigms of minimal pairs, a grammatical and an ungrammatical sentence each.

A model is right on a pair when it scores the grammatical sentence strictly higher (a tie is wrong). Accuracy is
reported per paradigm, per phenomenon (BLiMP's 12 `linguistics_term` values, each the mean of its paradigms) and
overall as the mean over paradigms (the paper's summary; with as many pairs in every paradigm, also the accuracy
over all pairs) and as the mean over the 12 phenomena (`phenomena_mean`, the BabyLM challenge's summary, which
weighs a phenomenon of 2 paradigms as much as one of 7).

The pairs come from a folder in BLiMP's layout, `<paradigm>.jsonl` files (gzipped or not, directly in the folder
or in its `data/`), or from the Hub dataset `nyu-mll/blimp` (one configuration per paradigm) through `datasets`.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .scoring import SentenceScorer, ZeroShotError

HUB_DATASET = "nyu-mll/blimp"

PARADIGMS = (
    "adjunct_island",
    "anaphor_gender_agreement",
    "anaphor_number_agreement",
    "animate_subject_passive",
    "animate_subject_trans",
    "causative",
    "complex_NP_island",
    "coordinate_structure_constraint_complex_left_branch",
    "coordinate_structure_constraint_object_extraction",
    "determiner_noun_agreement_1",
    "determiner_noun_agreement_2",
    "determiner_noun_agreement_irregular_1",
    "determiner_noun_agreement_irregular_2",
    "determiner_noun_agreement_with_adj_2",
    "determiner_noun_agreement_with_adj_irregular_1",
    "determiner_noun_agreement_with_adj_irregular_2",
    "determiner_noun_agreement_with_adjective_1",
    "distractor_agreement_relational_noun",
    "distractor_agreement_relative_clause",
    "drop_argument",
    "ellipsis_n_bar_1",
    "ellipsis_n_bar_2",
    "existential_there_object_raising",
    "existential_there_quantifiers_1",
    "existential_there_quantifiers_2",
    "existential_there_subject_raising",
    "expletive_it_object_raising",
    "inchoative",
    "intransitive",
    "irregular_past_participle_adjectives",
    "irregular_past_participle_verbs",
    "irregular_plural_subject_verb_agreement_1",
    "irregular_plural_subject_verb_agreement_2",
    "left_branch_island_echo_question",
    "left_branch_island_simple_question",
    "matrix_question_npi_licensor_present",
    "npi_present_1",
    "npi_present_2",
    "only_npi_licensor_present",
    "only_npi_scope",
    "passive_1",
    "passive_2",
    "principle_A_c_command",
    "principle_A_case_1",
    "principle_A_case_2",
    "principle_A_domain_1",
    "principle_A_domain_2",
    "principle_A_domain_3",
    "principle_A_reconstruction",
    "regular_plural_subject_verb_agreement_1",
    "regular_plural_subject_verb_agreement_2",
    "sentential_negation_npi_licensor_present",
    "sentential_negation_npi_scope",
    "sentential_subject_island",
    "superlative_quantifiers_1",
    "superlative_quantifiers_2",
    "tough_vs_raising_1",
    "tough_vs_raising_2",
    "transitive",
    "wh_island",
    "wh_questions_object_gap",
    "wh_questions_subject_gap",
    "wh_questions_subject_gap_long_distance",
    "wh_vs_that_no_gap",
    "wh_vs_that_no_gap_long_distance",
    "wh_vs_that_with_gap",
    "wh_vs_that_with_gap_long_distance",
)
"""The 67 paradigms, as BLiMP names its files and the Hub dataset its configurations."""

PAPER_PHENOMENA = {"s-selection": "argument_structure"}
"""BLiMP's files label the two animate_subject paradigms `s-selection`; the paper's tables and its results file
count them under argument_structure, which gives its 12 phenomena."""


@dataclass(frozen=True)
class MinimalPair:
    """One pair of a paradigm; `phenomenon` is one of the paper's 12 (its `linguistics_term`)."""

    paradigm: str
    phenomenon: str
    good: str
    bad: str


def read_blimp(
    data: str | os.PathLike | None, pairs: int | None = None, paradigms: Sequence[str] | None = None
) -> list[MinimalPair]:
    """The first `pairs` pairs (None: all) of each paradigm (None: every paradigm found), from the folder `data`
    or, when `data` is None, from the Hub dataset."""
    if pairs is not None and pairs <= 0:
        raise ZeroShotError(f"the number of pairs per paradigm must be positive, got {pairs}")
    if data is None:
        return _read_hub(pairs, paradigms)
    files = blimp_files(data)
    wanted = list(paradigms) if paradigms else sorted(files)
    missing = [name for name in wanted if name not in files]
    if missing:
        raise ZeroShotError(
            f"BLiMP folder {data} has no {missing[0]}.jsonl(.gz); pick paradigms among {len(files)} "
            f"found there (e.g. {sorted(files)[0]})"
        )
    found: list[MinimalPair] = []
    for name in wanted:
        found += _read_paradigm_file(files[name], name, pairs)
    return found


def blimp_files(data: str | os.PathLike) -> dict[str, Path]:
    """Paradigm -> its file in the folder `data`'s `data/` subfolder when that holds any, else in `data`."""
    folder = Path(data)
    if not folder.is_dir():
        raise ZeroShotError(
            f"BLiMP folder {data} does not exist; point --data at a folder of BLiMP's "
            "<paradigm>.jsonl files (gzipped or not)"
        )
    for place in (
        folder / "data",
        folder,
    ):  # BLiMP's repository keeps them in data/, beside other JSONL files
        files: dict[str, Path] = {}
        for path in sorted(place.glob("*.jsonl*")):
            name = path.name.removesuffix(".gz").removesuffix(".jsonl")
            if path.name in (f"{name}.jsonl", f"{name}.jsonl.gz") and path.is_file():
                files.setdefault(name, path)
        if files:
            return files
    raise ZeroShotError(
        f"BLiMP folder {data} holds no <paradigm>.jsonl(.gz) files (nor does its data/); point --data "
        "at BLiMP's data folder"
    )


def _read_paradigm_file(path: Path, paradigm: str, pairs: int | None) -> list[MinimalPair]:
    opener = gzip.open if path.name.endswith(".gz") else open
    found: list[MinimalPair] = []
    try:
        with opener(path, "rt", encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if pairs is not None and len(found) >= pairs:
                    break
                if line.strip():
                    found.append(_pair(json.loads(line), paradigm, f"{path.name} line {number}"))
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ZeroShotError(
            f"cannot read {path.name}: {str(err).splitlines()[0][:200]}; is it one of BLiMP's JSONL files?"
        ) from None
    if not found:
        raise ZeroShotError(f"{path.name} holds no minimal pairs")
    return found


def _pair(row, paradigm: str, where: str) -> MinimalPair:
    if not isinstance(row, dict):
        raise ZeroShotError(
            f"{where} is not a JSON object; BLiMP's lines hold sentence_good, sentence_bad, ..."
        )
    for key in ("sentence_good", "sentence_bad", "linguistics_term"):
        if not isinstance(row.get(key), str) or not row[key].strip():
            raise ZeroShotError(
                f"{where} has no text in {key}; BLiMP's lines hold sentence_good, sentence_bad and "
                "linguistics_term"
            )
    phenomenon = PAPER_PHENOMENA.get(row["linguistics_term"], row["linguistics_term"])
    return MinimalPair(paradigm, phenomenon, row["sentence_good"], row["sentence_bad"])


def _read_hub(pairs: int | None, paradigms: Sequence[str] | None) -> list[MinimalPair]:
    from datasets import load_dataset

    found: list[MinimalPair] = []
    for name in paradigms or PARADIGMS:
        try:
            rows = load_dataset(HUB_DATASET, name, split="train" if pairs is None else f"train[:{pairs}]")
        except Exception as err:  # offline, not found, no access: the same fix
            message = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
            raise ZeroShotError(
                f"cannot load the Hub dataset {HUB_DATASET} ({name}): {message}; pass --data, a folder "
                "of BLiMP's <paradigm>.jsonl files (gzipped or not)"
            ) from None
        found += [_pair(row, name, f"{HUB_DATASET} {name} row {i}") for i, row in enumerate(rows)]
    return found


def blimp_accuracies(pairs: Sequence[MinimalPair], correct: Sequence[bool]) -> dict:
    """Accuracy per paradigm, per phenomenon (mean of its paradigms) and overall (`mean`: over paradigms)."""
    paradigms: dict[str, dict] = {}
    for pair, right in zip(pairs, correct):
        entry = paradigms.setdefault(pair.paradigm, {"phenomenon": pair.phenomenon, "pairs": 0, "correct": 0})
        entry["pairs"] += 1
        entry["correct"] += int(bool(right))
    for entry in paradigms.values():
        entry["accuracy"] = entry["correct"] / entry["pairs"]
    by_phenomenon: dict[str, list[float]] = {}
    for entry in paradigms.values():
        by_phenomenon.setdefault(entry["phenomenon"], []).append(entry["accuracy"])
    accuracies = [entry["accuracy"] for entry in paradigms.values()]
    phenomena = {name: sum(values) / len(values) for name, values in sorted(by_phenomenon.items())}
    return {
        "mean": sum(accuracies) / len(accuracies) if accuracies else float("nan"),
        "phenomena_mean": sum(phenomena.values()) / len(phenomena) if phenomena else float("nan"),
        "pairs": sum(entry["pairs"] for entry in paradigms.values()),
        "correct": sum(entry["correct"] for entry in paradigms.values()),
        "phenomena": phenomena,
        "paradigms": dict(sorted(paradigms.items())),
    }


class BlimpEvaluation:
    """The pairs, tokenized once for a model's tokenizer; `evaluate(model)` scores them all (on every process of
    `accelerator`, each taking its share of the batches) and returns `blimp_accuracies`'s dict on every process."""

    def __init__(
        self,
        pairs: Sequence[MinimalPair],
        tokenizer,
        kind: str,
        budget: int | None = None,
        max_length: int | None = None,
        pll: str = "original",
        decoder_scoring: str = "causal",
    ):
        if not pairs:
            raise ZeroShotError("no BLiMP pairs to evaluate")
        self.pairs = list(pairs)
        self.scorer = SentenceScorer(tokenizer, kind, budget, max_length, pll, decoder_scoring)
        self.encoded = self.scorer.encode([p.good for p in self.pairs] + [p.bad for p in self.pairs])

    @torch.no_grad()
    def scores(self, model, accelerator=None, progress: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(good, bad) float64 scores of every pair, the same on every process; `progress`: a progress bar."""
        rank, world = (
            (accelerator.process_index, accelerator.num_processes) if accelerator is not None else (0, 1)
        )
        scores = self.scorer.score(model, self.encoded, rank, world, progress=progress and rank == 0)
        if world > 1:  # each sentence was scored by one process: the sum is its score, exactly
            scores = accelerator.reduce(scores.to(accelerator.device), reduction="sum").cpu()
        n = len(self.pairs)
        return scores[:n], scores[n:]

    def evaluate(self, model, accelerator=None, progress: bool = False) -> dict:
        good, bad = self.scores(model, accelerator, progress)
        return blimp_accuracies(self.pairs, (good > bad).tolist())  # a tie is wrong


LM_EVAL_HEADER = """\
# lm-evaluation-harness group: lm-eval's own blimp_<paradigm> tasks, each reading its paradigm from the sample
# shipped in data/blimp (the first 50 pairs of each of the 67) instead of the Hub dataset; its acc is the mean
# over paradigms. From the repository root (guide: docs/zero-shot.md):
#   lm_eval --model hf --model_args pretrained=runs/decoder-tiny/final,trust_remote_code=True \\
#     --include_path configs/lm-eval --tasks kiln_blimp_sample
# Written by `python data/blimp/make_sample.py` (pretrain.zero_shot.blimp.lm_eval_group)."""


def lm_eval_group(files: dict[str, str], group: str, header: str = "") -> str:
    """An lm-evaluation-harness group (YAML) of lm-eval's own `blimp_<paradigm>` tasks, each reading the JSONL file
    `files[paradigm]` instead of the Hub dataset; its `acc` is the mean over the paradigms, as BLiMP reports."""
    lines = [header.rstrip("\n")] if header else []
    lines += [f"group: {group}", "task:"]
    for name, path in sorted(files.items()):
        lines.append(
            f"  - {{task: blimp_{name}, dataset_path: json, dataset_name: null, "
            f"dataset_kwargs: {{data_files: {{train: {path}}}}}}}"
        )
    lines += [
        "aggregate_metric_list:",
        "  - metric: acc",
        "    aggregation: mean",
        "    weight_by_size: false",
        "metadata:",
        "  version: 1.0",
    ]
    return "\n".join(lines) + "\n"


def format_report(result: dict) -> str:
    """Overall, per-phenomenon and per-paradigm accuracy as plain text tables."""
    lines = [
        f"BLiMP: {100 * result['mean']:.1f} (mean over {len(result['paradigms'])} paradigms; "
        f"{result['correct']:,} of {result['pairs']:,} pairs right)",
        f"BLiMP, mean over {len(result['phenomena'])} phenomena (BabyLM's summary): "
        f"{100 * result['phenomena_mean']:.1f}",
        "",
        "phenomenon".ljust(28) + "accuracy",
    ]
    lines += [f"{name:<28}{100 * value:8.1f}" for name, value in result["phenomena"].items()]
    lines += ["", "paradigm".ljust(56) + "pairs  accuracy"]
    lines += [
        f"{name:<56}{entry['pairs']:5d}{100 * entry['accuracy']:10.1f}"
        for name, entry in result["paradigms"].items()
    ]
    return "\n".join(lines)


__all__ = [
    "BlimpEvaluation",
    "HUB_DATASET",
    "LM_EVAL_HEADER",
    "MinimalPair",
    "PARADIGMS",
    "blimp_files",
    "format_report",
    "lm_eval_group",
    "read_blimp",
    "blimp_accuracies",
]

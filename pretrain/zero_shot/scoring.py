"""Sentence scores: a causal LM's summed log-probability, a masked LM's pseudo-log-likelihood.

Both scorers take token ids made once (`SentenceScorer.encode`) and score them in batches planned from the
sentences alone (`plan_batches`): batch b goes to process b % world, every sentence lies whole in one batch, so a
sentence's score is the same number on any number of processes, and summing the processes' score vectors (each
entry non-zero on exactly one of them) reproduces it exactly.

Decoders (`causal_log_likelihoods`): the sentence's tokens after one prefix token, as lm-evaluation-harness's `hf`
model scores a multiple-choice continuation whose context is empty: the continuation is the sentence after the
task's target delimiter (a space), encoded without special tokens; the prefix is the tokenizer's BOS token (its
EOS where it has none), and when the continuation itself starts with that token, its first token is the context
instead. Sequences longer than the model keep their last tokens, as lm-eval truncates.

A decoder pretrained with the hybrid objective (`clm+mntp`, GPT-BERT's) can also be scored as a masked LM
(`masked_next_token_log_likelihoods`, `decoder_scoring="masked"`): each token of the sentence is replaced by the
mask token in its own copy, the copy is read with attention over the whole sentence, and the log-probability of
the original token is read one position earlier, where the objective predicts it; the sum over the copies is the
sentence's pseudo-log-likelihood, after the same prefix token as the causal score.

Encoders (`pseudo_log_likelihoods`): Salazar et al. (2020), "Masked Language Model Scoring": each token of the
sentence (not [CLS]/[SEP]) is replaced by [MASK] in its own copy, and the log-probability the model gives the
original token there is summed over the copies. PLL-word-l2r (Kauf & Ivanova 2023, "A Better Way to Do Masked
Language Model Scoring"; `pll="word-l2r"`) also masks the later tokens of the same word in each copy: a word of
several tokens no longer predicts its own pieces from each other, the bonus that inflates the scores of rare,
many-piece words (larger for small vocabularies). The masking is Kiln's own: lm-eval has no pseudo-log-likelihood
scorer, and the authors' `minicons` scores through transformers' dense heads only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

DECODER_SCORING = ("causal", "masked")
"""How a decoder scores a sentence: its log-probability left to right, or (a `clm+mntp` decoder) the masked
next-token pseudo-log-likelihood."""

PLL_METRICS = ("original", "word-l2r")
"""An encoder's pseudo-log-likelihood: Salazar et al.'s (each token masked alone) or Kauf & Ivanova's
PLL-word-l2r (with the later tokens of its word)."""

TARGET_DELIMITER = " "
"""What lm-eval puts before a multiple-choice continuation (its `target_delimiter`): a decoder scores
`" " + sentence`, as `lm_eval --tasks blimp` does."""


class ZeroShotError(ValueError):
    """A model or data set that cannot be scored: a one-line message naming the problem and the fix."""


@dataclass(frozen=True)
class EncodedSentences:
    """Token ids of the sentences, ready to score: for a decoder, the scored tokens follow `context` (one token);
    for an encoder, `ids` include the special tokens and `scored` marks the positions masked in turn."""

    ids: list[list[int]]
    context: list[list[int]]
    scored: list[list[bool]]
    with_masked: list[list[list[int]]] | None = None
    """Encoder, PLL-word-l2r: per sentence and position, the other positions masked in its copy (the later
    tokens of its word); None: only the position itself."""

    def __len__(self) -> int:
        return len(self.ids)


def plan_batches(costs: Sequence[tuple[int, int]], budget: int) -> list[list[int]]:
    """Sentence indices grouped into batches: sorted by length (longest first, then by index), each batch as many
    whole sentences as keep rows x longest length within `budget` (at least one sentence). `costs`: (rows,
    length) per sentence. Depends on the sentences only, never on the number of processes."""
    order = sorted(range(len(costs)), key=lambda i: (-costs[i][1], i))
    batches: list[list[int]] = []
    current: list[int] = []
    rows = longest = 0
    for index in order:
        n_rows, length = costs[index]
        if current and (rows + n_rows) * max(longest, length) > budget:
            batches.append(current)
            current, rows, longest = [], 0, 0
        current.append(index)
        rows += n_rows
        longest = max(longest, length)
    if current:
        batches.append(current)
    return batches


def _model_device(model) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def causal_log_likelihoods(
    model,
    encoded: EncodedSentences,
    max_length: int,
    budget: int = 8192,
    rank: int = 0,
    world: int = 1,
    progress: bool = False,
) -> torch.Tensor:
    """(N,) float64: log P(sentence tokens | context) of each sentence this process scores (batches b with
    b % world == rank), 0 elsewhere. `max_length`: the model's longest input (longer inputs keep their end)."""
    device = _model_device(model)
    inputs, targets = [], []
    for context, ids in zip(encoded.context, encoded.ids):
        whole = (context + ids)[-(max_length + 1) :]
        inputs.append(whole[:-1])
        targets.append(
            whole[len(whole) - min(len(ids), len(whole) - 1) :]
        )  # the sentence's tokens still in it
    scores = torch.zeros(len(encoded), dtype=torch.float64)
    batches = plan_batches([(1, len(row)) for row in inputs], budget)
    for batch in with_progress(batches[rank::world], [(1, len(row)) for row in inputs], progress):
        length = max(len(inputs[i]) for i in batch)
        input_ids = torch.zeros(len(batch), length, dtype=torch.long)
        attention = torch.zeros(len(batch), length, dtype=torch.long)
        for row, i in enumerate(batch):
            input_ids[row, : len(inputs[i])] = torch.tensor(inputs[i])
            attention[row, : len(inputs[i])] = 1
        logits = model(input_ids=input_ids.to(device), attention_mask=attention.to(device))["logits"]
        log_probs = F.log_softmax(logits.float(), dim=-1).cpu()  # (B, T, V)
        for row, i in enumerate(batch):
            n, start = len(targets[i]), len(inputs[i]) - len(targets[i])
            if n:
                picked = log_probs[row, start : start + n].gather(-1, torch.tensor(targets[i])[:, None])
                scores[i] = picked.double().sum()
    return scores


@torch.no_grad()
def pseudo_log_likelihoods(
    model,
    encoded: EncodedSentences,
    mask_token_id: int,
    budget: int = 16384,
    rank: int = 0,
    world: int = 1,
    progress: bool = False,
) -> torch.Tensor:
    """(N,) float64: the pseudo-log-likelihood of each sentence this process scores (batches b with b % world ==
    rank), 0 elsewhere. A Kiln encoder computes its vocabulary logits at the masked position of each row only
    (`sparse_prediction`); another masked LM (transformers' BertForMaskedLM) gives every position's."""
    device = _model_device(model)
    positions = [[p for p, scored in enumerate(flags) if scored] for flags in encoded.scored]
    scores = torch.zeros(len(encoded), dtype=torch.float64)
    costs = [(len(p), len(ids)) for p, ids in zip(positions, encoded.ids)]
    batches = plan_batches(costs, budget)
    for batch in with_progress(batches[rank::world], costs, progress):
        rows = [(i, p) for i in batch for p in positions[i]]
        if not rows:
            continue
        length = max(len(encoded.ids[i]) for i in batch)
        input_ids = torch.zeros(len(rows), length, dtype=torch.long)
        attention = torch.zeros(len(rows), length, dtype=torch.long)
        labels = torch.full((len(rows), length), -100, dtype=torch.long)
        for row, (i, p) in enumerate(rows):
            ids = encoded.ids[i]
            input_ids[row, : len(ids)] = torch.tensor(ids)
            attention[row, : len(ids)] = 1
            input_ids[row, p] = mask_token_id
            if encoded.with_masked is not None:
                for q in encoded.with_masked[i][p]:
                    input_ids[row, q] = mask_token_id
            labels[row, p] = ids[p]
        logits = _masked_logits(
            model, input_ids.to(device), attention.to(device), labels.to(device)
        )  # (M, V)
        log_probs = F.log_softmax(logits.float(), dim=-1).cpu()
        picked = log_probs.gather(-1, labels[labels != -100][:, None])[:, 0].double()  # row order
        owner = torch.tensor([i for i, _ in rows])
        for i in batch:  # each sentence's rows summed in row order: the same on any number of processes
            scores[i] = picked[owner == i].sum()
    return scores


@torch.no_grad()
def masked_next_token_log_likelihoods(
    model,
    encoded: EncodedSentences,
    mask_token_id: int,
    max_length: int,
    budget: int = 16384,
    rank: int = 0,
    world: int = 1,
    progress: bool = False,
) -> torch.Tensor:
    """(N,) float64: each sentence's masked next-token pseudo-log-likelihood (module docstring) on this process's
    batches (b % world == rank), 0 elsewhere. A copy is the prefix and the sentence (its last `max_length`
    tokens) with one sentence token masked; attention is over the whole copy, given as a (rows, 1, T, T) bool
    mask, so any decoder that takes 4-D masks reads it bidirectionally."""
    device = _model_device(model)
    inputs = [(context + ids)[-max_length:] for context, ids in zip(encoded.context, encoded.ids)]
    firsts = [len(row) - min(len(ids), len(row) - 1) for row, ids in zip(inputs, encoded.ids)]
    scores = torch.zeros(len(encoded), dtype=torch.float64)
    costs = [(len(row) - first, len(row)) for row, first in zip(inputs, firsts)]
    batches = plan_batches(costs, budget)
    for batch in with_progress(batches[rank::world], costs, progress):
        rows = [(i, p) for i in batch for p in range(firsts[i], len(inputs[i]))]
        if not rows:
            continue
        length = max(len(inputs[i]) for i in batch)
        input_ids = torch.zeros(len(rows), length, dtype=torch.long)
        real = torch.zeros(len(rows), length, dtype=torch.bool)
        for row, (i, p) in enumerate(rows):
            input_ids[row, : len(inputs[i])] = torch.tensor(inputs[i])
            real[row, : len(inputs[i])] = True
            input_ids[row, p] = mask_token_id
        first_only = torch.zeros(length, dtype=torch.bool)
        first_only[0] = True
        visible = torch.where(real[:, :, None], real[:, None, :], first_only)  # padding queries: one key
        logits = model(input_ids=input_ids.to(device), attention_mask=visible[:, None].to(device))["logits"]
        before = torch.tensor([p - 1 for _, p in rows])
        targets = torch.tensor([inputs[i][p] for i, p in rows])
        picked = logits[torch.arange(len(rows)), before.to(device)].float().log_softmax(-1).cpu()
        picked = picked.gather(-1, targets[:, None])[:, 0].double()
        owner = torch.tensor([i for i, _ in rows])
        for i in batch:  # each sentence's rows summed in row order: the same on any number of processes
            scores[i] = picked[owner == i].sum()
    return scores


def _masked_logits(model, input_ids, attention_mask, labels) -> torch.Tensor:
    """(M, V) vocabulary logits at the M labelled positions, in the order of `labels.view(-1)`."""
    config = model.config
    sparse = getattr(config, "sparse_prediction", None)
    if sparse is None:  # not a Kiln encoder: every position's logits, then the labelled rows
        outputs = model(input_ids=input_ids, attention_mask=attention_mask)
        logits = outputs["prediction_logits"] if "prediction_logits" in outputs else outputs["logits"]
        return logits[labels != -100]
    config.sparse_prediction = (
        True  # only the labelled rows through the last block and the vocabulary projection
    )
    try:
        outputs = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    finally:
        config.sparse_prediction = sparse
    return outputs["prediction_logits"] if "prediction_logits" in outputs else outputs["logits"]


class SentenceScorer:
    """Scores sentences with a causal LM (kind `decoder`) or a masked LM (kind `encoder`): `encode` once with the
    model's tokenizer, then `score` with the model (the same tokens at every evaluation of a training run)."""

    def __init__(
        self,
        tokenizer,
        kind: str,
        budget: int | None = None,
        max_length: int | None = None,
        pll: str = "original",
        decoder_scoring: str = "causal",
    ):
        if kind not in ("encoder", "decoder"):
            raise ValueError(f"kind must be 'encoder' or 'decoder', got {kind!r}")
        if decoder_scoring not in DECODER_SCORING:
            raise ValueError(
                f"decoder_scoring must be one of {', '.join(DECODER_SCORING)}, got {decoder_scoring!r}"
            )
        if kind == "decoder" and decoder_scoring == "masked" and tokenizer.mask_token_id is None:
            raise ZeroShotError(
                "masked scoring of a decoder needs a mask token in its tokenizer: a decoder pretrained with "
                "--model.objective clm+mntp has one; score this one causally"
            )
        self.decoder_scoring = decoder_scoring
        if pll not in PLL_METRICS:
            raise ValueError(f"pll must be one of {', '.join(PLL_METRICS)}, got {pll!r}")
        if pll == "word-l2r" and not getattr(tokenizer, "is_fast", False):
            raise ZeroShotError("PLL-word-l2r needs a fast tokenizer, which tells each token's word")
        self.pll = pll
        if kind == "encoder" and tokenizer.mask_token_id is None:
            raise ZeroShotError("the tokenizer has no mask token, which pseudo-log-likelihood scoring needs")
        if kind == "decoder" and tokenizer.bos_token_id is None and tokenizer.eos_token_id is None:
            raise ZeroShotError("the tokenizer has neither a BOS nor an EOS token to start a sentence with")
        self.tokenizer, self.kind, self.max_length = tokenizer, kind, max_length
        masked = kind == "encoder" or decoder_scoring == "masked"
        self.budget = budget or (16384 if masked else 8192)
        """Rows x longest length of one batch (a masked LM has one row per token of its sentences)."""
        # `max_length`: the model's longest input; an encoder's sentence keeps its first tokens within it (a
        # decoder's keeps its last, as lm-eval truncates, when scored)

    def encode(self, sentences: Sequence[str]) -> EncodedSentences:
        tokenizer = self.tokenizer
        if self.kind == "decoder":
            prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
            ids, context = [], []
            for sentence in sentences:
                tokens = tokenizer.encode(
                    TARGET_DELIMITER + sentence, add_special_tokens=False, verbose=False
                )
                if (
                    tokens and tokens[0] == prefix
                ):  # lm-eval: the continuation's own first token is the context
                    context.append(tokens[:1])
                    ids.append(tokens[1:])
                else:
                    context.append([prefix])
                    ids.append(tokens)
            return EncodedSentences(ids=ids, context=context, scored=[[True] * len(i) for i in ids])
        special = set(tokenizer.all_special_ids)
        limit = {"truncation": True, "max_length": self.max_length} if self.max_length else {}
        encodings = [tokenizer(sentence, verbose=False, **limit) for sentence in sentences]
        ids = [encoding["input_ids"] for encoding in encodings]
        scored = [[t not in special for t in i] for i in ids]
        with_masked = None
        if self.pll == "word-l2r":  # each position also masks the later tokens of its word
            with_masked = []
            for encoding, flags in zip(encodings, scored):
                words = encoding.word_ids()
                with_masked.append(
                    [
                        [
                            q
                            for q in range(p + 1, len(words))
                            if flags[q] and words[q] is not None and words[q] == words[p]
                        ]
                        for p in range(len(words))
                    ]
                )
        return EncodedSentences(ids=ids, context=[[] for _ in ids], scored=scored, with_masked=with_masked)

    def score(
        self, model, encoded: EncodedSentences, rank: int = 0, world: int = 1, progress: bool = False
    ) -> torch.Tensor:
        """(N,) float64 scores of the sentences of this process's batches (0 for the other processes'); with
        `progress`, a progress bar with its ETA on stderr."""
        if self.kind == "decoder":
            max_length = self.max_length or max_input_length(model)
            if self.decoder_scoring == "masked":
                return masked_next_token_log_likelihoods(
                    model,
                    encoded,
                    self.tokenizer.mask_token_id,
                    max_length,
                    self.budget,
                    rank,
                    world,
                    progress,
                )
            return causal_log_likelihoods(model, encoded, max_length, self.budget, rank, world, progress)
        return pseudo_log_likelihoods(
            model, encoded, self.tokenizer.mask_token_id, self.budget, rank, world, progress
        )


def with_progress(batches: list[list[int]], costs: Sequence[tuple[int, int]], shown: bool):
    """The batches, under a progress bar counted in rows x positions (what a batch costs, so the ETA holds
    although the batches run longest first) when `shown`."""
    if not shown:
        yield from batches
        return
    from tqdm.auto import tqdm

    weights = [sum(costs[i][0] for i in batch) * max(costs[i][1] for i in batch) for batch in batches]
    with tqdm(total=sum(weights), desc="scoring", unit=" tok", unit_scale=True, leave=False) as bar:
        for batch, weight in zip(batches, weights):
            yield batch
            bar.update(weight)


def max_input_length(model) -> int:
    """The longest input `model` takes (its position table)."""
    config = model.config
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 512


def score_sentences(
    model, tokenizer, kind: str, sentences: Sequence[str], pll: str = "original"
) -> list[float]:
    """Each sentence's score (decoder: log-probability; encoder: pseudo-log-likelihood, `pll` as
    `SentenceScorer` takes it), on this process."""
    scorer = SentenceScorer(tokenizer, kind, pll=pll)
    return scorer.score(model, scorer.encode(sentences)).tolist()


__all__ = [
    "EncodedSentences",
    "PLL_METRICS",
    "SentenceScorer",
    "TARGET_DELIMITER",
    "ZeroShotError",
    "DECODER_SCORING",
    "causal_log_likelihoods",
    "masked_next_token_log_likelihoods",
    "max_input_length",
    "plan_batches",
    "pseudo_log_likelihoods",
    "score_sentences",
]

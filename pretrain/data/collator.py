"""Batch collators: dynamic MLM masking for the encoder, padding + labels for the decoder.

Both follow the transformers DataCollator convention: called on a list of feature dicts, they return a dict of
tensors. Masking is vectorised in torch (no Python loop over tokens).

Randomness and exact resume: with `seed=None` the MLM collator draws from the global torch RNG, like
transformers' DataCollatorForLanguageModeling. With a seed, every sequence's masks come from its own
`torch.Generator` seeded by (seed, epoch, example index) when the features carry `example_index` (Kiln's trainer
adds it: the example's position in the epoch's dataset). A sequence's masks then depend neither on which batch,
process or DataLoader worker it lands in nor on how long the other sequences of its batch are: 1 and N processes
train and evaluate on identical masks, and a resumed run masks exactly as an uninterrupted one. Streamed examples
carry a hash of their tokens as their index (pipeline.py). Features without an index (direct calls) fall back to
one generator per batch from (seed, epoch, batch index, process rank); call `set_epoch(epoch)` at the start of each epoch and `set_epoch(epoch, start_batch=n)` after
skipping n batches on resume. With DataLoader workers that batch index is `start_batch + calls_in_this_worker *
num_workers + worker_id`, the order in which a DataLoader hands out batches (non-persistent workers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from .common import DataError


def _as_tensor(values) -> torch.Tensor:
    return values.long() if isinstance(values, torch.Tensor) else torch.as_tensor(values, dtype=torch.long)


def pad_batch(
    features: Sequence[Mapping],
    pad_id: int,
    pad_to_multiple_of: int | None,
    keys: Sequence[str] = ("input_ids",),
) -> dict[str, torch.Tensor]:
    """Right-pad the listed sequence keys to the longest (rounded up to the multiple); adds attention_mask."""
    columns = {key: [_as_tensor(f[key]) for f in features] for key in keys}
    lengths = torch.tensor([len(row) for row in columns["input_ids"]])
    width = int(lengths.max()) if len(lengths) else 0
    if pad_to_multiple_of and pad_to_multiple_of > 1:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    batch = {}
    for key, rows in columns.items():
        fill = pad_id if key == "input_ids" else 0
        batch[key] = torch.full((len(rows), width), fill, dtype=torch.long)
        padded = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=fill)
        batch[key][:, : padded.shape[1]] = padded
    batch["attention_mask"] = (torch.arange(width)[None, :] < lengths[:, None]).long()
    return batch


def _process_rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class _SeededCalls:
    """Per-call generators derived from (seed, epoch, batch index, process rank); see the module docstring."""

    def __init__(self, seed: int | None):
        if seed is not None and seed < 0:
            raise DataError(f"collator seed must be >= 0, got {seed}")
        self.seed = seed
        self.set_epoch(0)

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        # the rank is read here, in the main process: DataLoader workers may not see the process group
        self.epoch, self.start_batch, self.rank, self._calls = (
            int(epoch),
            int(start_batch),
            _process_rank(),
            0,
        )

    def example_generator(self, example_index: int) -> torch.Generator:
        """The generator of one example: (seed, epoch, example index), independent of batch and process."""
        state = np.random.SeedSequence([self.seed, self.epoch, int(example_index)]).generate_state(
            2, dtype=np.uint32
        )
        return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))

    def next_generator(self) -> torch.Generator | None:
        if self.seed is None:
            return None
        info = torch.utils.data.get_worker_info()
        workers, worker_id = (info.num_workers, info.id) if info is not None else (1, 0)
        batch_index = self.start_batch + self._calls * workers + worker_id
        self._calls += 1
        entropy = [self.seed, self.epoch, batch_index, self.rank]
        state = np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint32)
        return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


class MLMCollator:
    """Pads, builds attention_mask and masks tokens dynamically for masked LM.

    Of the non-special, non-pad tokens, each is selected with probability `mlm_probability` (whole words
    together with `whole_word_mask`); selected tokens become [MASK] with probability `mask_replace_prob`, a random
    non-special token with probability `random_replace_prob`, and stay unchanged otherwise. `labels` hold the
    original id at selected positions and -100 elsewhere. `max_predictions_per_seq` caps the selected tokens per
    sequence (a random subset is kept; whole words are kept or dropped together). `token_type_ids` and
    `next_sentence_label` are passed through when present.
    """

    def __init__(
        self,
        tokenizer,
        mlm_probability: float = 0.15,
        mask_replace_prob: float = 0.8,
        random_replace_prob: float = 0.1,
        whole_word_mask: bool = False,
        max_predictions_per_seq: int | None = None,
        pad_to_multiple_of: int | None = 8,
        seed: int | None = None,
    ):
        if not 0 < mlm_probability < 1:
            raise DataError(f"--data.mlm_probability={mlm_probability}: use a value in (0, 1)")
        if mask_replace_prob < 0 or random_replace_prob < 0 or mask_replace_prob + random_replace_prob > 1:
            raise DataError(
                f"--data.mask_replace_prob={mask_replace_prob} + --data.random_replace_prob={random_replace_prob} "
                f"must be non-negative and sum to at most 1"
            )
        if max_predictions_per_seq is not None and max_predictions_per_seq < 1:
            raise DataError(
                f"--data.max_predictions_per_seq={max_predictions_per_seq}: use a positive number or None"
            )
        if tokenizer.mask_token_id is None or tokenizer.pad_token_id is None:
            raise DataError(
                "MLM needs a tokenizer with [MASK] and [PAD] tokens; train one or use a BERT-style tokenizer"
            )
        self.tokenizer = tokenizer
        self.mlm_probability = mlm_probability
        self.mask_replace_prob = mask_replace_prob
        self.random_replace_prob = random_replace_prob
        self.whole_word_mask = whole_word_mask
        self.max_predictions_per_seq = max_predictions_per_seq
        self.pad_to_multiple_of = pad_to_multiple_of
        self.mask_id = tokenizer.mask_token_id
        self.pad_id = tokenizer.pad_token_id
        vocab = len(tokenizer)
        self.is_special = torch.zeros(vocab, dtype=torch.bool)
        self.is_special[[i for i in tokenizer.all_special_ids if i < vocab]] = True
        self.random_ids = torch.nonzero(~self.is_special).squeeze(1)  # random replacements: never special
        self.is_continuation = self._continuation_table(tokenizer) if whole_word_mask else None
        self._rng = _SeededCalls(seed)

    @staticmethod
    def _continuation_table(tokenizer) -> torch.Tensor:
        model = tokenizer.backend_tokenizer.model
        prefix = getattr(model, "continuing_subword_prefix", None)
        if type(model).__name__ != "WordPiece" or not prefix:
            raise DataError(
                "--data.whole_word_mask needs a WordPiece tokenizer (## pieces); turn it off for this tokenizer"
            )
        tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        return torch.tensor([t is not None and t.startswith(prefix) for t in tokens], dtype=torch.bool)

    @property
    def seed(self) -> int | None:
        return self._rng.seed

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Start of an epoch (start_batch: batches already consumed when resuming mid-epoch)."""
        self._rng.set_epoch(epoch, start_batch)

    wants_example_index = True
    """Tells Kiln's trainer to add `example_index` to every feature (see the module docstring)."""

    def __call__(self, features: Sequence[Mapping]) -> dict[str, torch.Tensor]:
        keys = ["input_ids"] + (["token_type_ids"] if "token_type_ids" in features[0] else [])
        batch = pad_batch(features, self.pad_id, self.pad_to_multiple_of, keys)
        if "next_sentence_label" in features[0]:
            batch["next_sentence_label"] = torch.tensor([int(f["next_sentence_label"]) for f in features])
        draws = self._draws(features, batch["attention_mask"])
        batch["input_ids"], batch["labels"] = self.mask_tokens(
            batch["input_ids"], batch["attention_mask"], draws=draws[:4]
        )
        return batch

    draw_rows = 4
    """Uniforms drawn per position: selection, the cap's order, the 80/10/10 choice and the random token."""

    def _draws(self, features: Sequence[Mapping], attention_mask: torch.Tensor) -> torch.Tensor:
        """(draw_rows, B, T) uniforms: per example when the features carry their index (see the module
        docstring), else from the batch's seeded generator (or the global RNG without a seed)."""
        if self.seed is not None and "example_index" in features[0]:
            return self._example_draws([int(f["example_index"]) for f in features], attention_mask)
        return torch.rand((self.draw_rows, *attention_mask.shape), generator=self._rng.next_generator())

    def _example_draws(self, example_indices: list[int], attention_mask: torch.Tensor) -> torch.Tensor:
        """(draw_rows, B, T) uniforms, row b drawn from example b's own generator over its real (unpadded) length."""
        rows = self.draw_rows
        draws = torch.ones((rows, *attention_mask.shape))  # padding: never selected (and never a candidate)
        for row, (index, length) in enumerate(zip(example_indices, attention_mask.sum(1).tolist())):
            draws[:, row, :length] = torch.rand(rows, length, generator=self._rng.example_generator(index))
        return draws

    @staticmethod
    def loss_items(batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """What the pretraining loss parts average over: the MLM loss over masked tokens, NSP/SOP over pairs
        (the trainer normalises by these counts over a whole accumulation window and all processes). Without
        pairs the model is the MLM-only one, whose output has the MLM loss as its `loss`."""
        masked = (batch["labels"] != -100).sum()
        if "next_sentence_label" not in batch:
            return {"loss": masked}
        return {"mlm_loss": masked, "nsp_loss": batch["next_sentence_label"].numel()}

    def mask_tokens(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        generator: torch.Generator | None = None,
        draws: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(masked input_ids, labels) for a padded batch.

        `draws`: (4, B, T) uniforms in [0, 1) for selection, the cap's order, the 80/10/10 choice and the random
        token; drawn here (from `generator`, else the collator's seeded generator, else the global RNG) if not given.
        """
        if draws is None:
            g = generator if generator is not None else self._rng.next_generator()
            draws = torch.rand((4, *input_ids.shape), generator=g)
        select_draw, cap_draw, replace_draw, token_draw = draws
        candidates = attention_mask.bool() & ~self.is_special[input_ids]
        word_start = self._word_starts(input_ids, candidates) if self.whole_word_mask else None
        if word_start is not None:
            select_draw, cap_draw = (
                select_draw.gather(1, word_start),
                cap_draw.gather(1, word_start),
            )  # one per word
        selected = (select_draw < self.mlm_probability) & candidates
        if self.max_predictions_per_seq is not None:
            selected = self._cap(selected, word_start, cap_draw)
        labels = input_ids.masked_fill(~selected, -100)
        to_mask = selected & (replace_draw < self.mask_replace_prob)
        to_random = selected & ~to_mask & (replace_draw < self.mask_replace_prob + self.random_replace_prob)
        pick = (token_draw * len(self.random_ids)).long().clamp_(max=len(self.random_ids) - 1)
        masked = input_ids.masked_fill(to_mask, self.mask_id)
        masked = torch.where(to_random, self.random_ids[pick], masked)
        return masked, labels

    def _word_starts(self, input_ids, candidates) -> torch.Tensor:
        """For each position, the position of its word's first piece (a word: a piece plus the `##` pieces after it)."""
        positions = torch.arange(input_ids.shape[1]).expand_as(input_ids)
        starts = candidates & ~(self.is_continuation[input_ids] & torch.roll(candidates, 1, dims=1))
        starts[:, 0] = candidates[:, 0]
        return torch.where(starts, positions, torch.zeros_like(positions)).cummax(dim=1).values

    def _cap(self, selected, word_start, score):
        """At most max_predictions_per_seq selected tokens per row, kept in random order (`score`). Whole words
        are kept or dropped together, and a word that would overflow the budget is skipped while later, shorter
        words still fit (as Google's create_pretraining_data.py does)."""
        cap = self.max_predictions_per_seq
        over = (selected.sum(1) > cap).nonzero().flatten().tolist()
        if not over:
            return selected
        selected = selected.clone()
        for row in over:
            positions = selected[row].nonzero().flatten()
            groups = word_start[row, positions] if word_start is not None else positions
            order = torch.argsort(score[row, positions], stable=True)
            sizes = torch.bincount(groups, minlength=selected.shape[1])
            budget, kept = cap, []
            for group in dict.fromkeys(groups[order].tolist()):  # each word once, in score order
                size = int(sizes[group])
                if size <= budget:
                    kept.append(group)
                    budget -= size
                    if budget == 0:
                        break
            selected[row, positions] = torch.isin(groups, torch.tensor(kept, dtype=groups.dtype))
        return selected


class ElectraCollator(MLMCollator):
    """The MLM collator for ELECTRA: the same masking, plus `sampling_uniforms` (B, T), the uniforms from which
    the generator's replacements are drawn (`KilnEncoderForElectraPreTraining`). They come from the same
    per-example generators as the masks, so replacements too are the same on any number of processes and
    after a resume."""

    draw_rows = 5

    def __call__(self, features: Sequence[Mapping]) -> dict[str, torch.Tensor]:
        keys = ["input_ids"] + (["token_type_ids"] if "token_type_ids" in features[0] else [])
        batch = pad_batch(features, self.pad_id, self.pad_to_multiple_of, keys)
        draws = self._draws(features, batch["attention_mask"])
        batch["input_ids"], batch["labels"] = self.mask_tokens(
            batch["input_ids"], batch["attention_mask"], draws=draws[:4]
        )
        batch["sampling_uniforms"] = draws[4]
        return batch

    @staticmethod
    def loss_items(batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The generator's MLM loss averages over the masked tokens; the discriminator's loss and its accuracy
        (logged, not trained on) over every non-padding token."""
        real = batch["attention_mask"].sum()
        return {"mlm_loss": (batch["labels"] != -100).sum(), "rtd_loss": real, "rtd_accuracy": real}


class CLMCollator:
    """Pads blocks for causal LM: input_ids, labels (= input_ids, -100 on padding), and either attention_mask or,
    with `document_masking`, the position_ids of packed documents.

    A block packs documents each ended by EOS (pretrain/data/clm.py). With `document_masking`, position ids
    restart at 0 after every EOS, so each document is positioned as if it were alone, and the batch carries no
    padding mask, as transformers' `DataCollatorWithFlattening` sends packed rows: the model (Kiln's, and
    transformers' mask builders) reads restarting position ids as packed documents only without a padding mask,
    and lets a token attend only within its own document. The padding is at each row's end, which no real token
    sees under a causal mask, and its labels are -100. The model shifts labels itself. Stateless; `set_epoch`
    exists so the runner can treat both collators alike.
    """

    def __init__(self, tokenizer, pad_to_multiple_of: int | None = 8, document_masking: bool = False):
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad_id is None:
            raise DataError("the decoder tokenizer needs a pad or eos token")
        if document_masking and tokenizer.eos_token_id is None:
            raise DataError(
                "document masking needs the tokenizer's eos token, which ends every packed document"
            )
        self.pad_id = pad_id
        self.eos_id = tokenizer.eos_token_id
        self.pad_to_multiple_of = pad_to_multiple_of
        self.document_masking = document_masking

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        pass

    @staticmethod
    def loss_items(batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The causal-LM loss averages over the predicted tokens: labels shifted by one, padding excluded."""
        return {"loss": (batch["labels"][:, 1:] != -100).sum()}

    def __call__(self, features: Sequence[Mapping]) -> dict[str, torch.Tensor]:
        batch = pad_batch(features, self.pad_id, self.pad_to_multiple_of)
        batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        if self.document_masking:
            batch["position_ids"] = document_positions(batch["input_ids"], self.eos_id)
            del batch["attention_mask"]  # with a padding mask, position ids would be read as positions only
        return batch


class HybridCollator(MLMCollator):
    """GPT-BERT's hybrid objective (Charpentier & Samuel 2024, "GPT or BERT: why not both?") for the decoder: each
    packed block is, by a draw of its own, a causal row (share `causal_share`: labels are its tokens, attention
    causal) or a masked row (tokens chosen at `mlm_probability` and replaced 80/10/10 as in MLM, attention over the
    whole document, labels only at the chosen tokens). The decoder's loss shifts labels by one, so a masked token
    is predicted at the position before it ("masked next-token prediction"): the same head and the same shift as
    the causal rows, which is what lets one model score sentences both ways.

    Every row's draws come from its example's own generator (seed, epoch, example index: `MLMCollator`), so a
    row's kind and masks are the same on any number of processes and after a resume. The batch carries
    `position_ids` restarting after every EOS (each document positioned alone, as `CLMCollator` with document
    masking) and a (B, 1, T, T) bool `attention_mask`: a token sees its own document only (causal rows: its
    earlier tokens), never padding; a padding query sees the row's first token only, so no row of the softmax is
    empty and `count_real_tokens` reads the real tokens as the keys some query sees. The first token of a block
    has no position before it and is never chosen."""

    draw_rows = 5
    """MLM's four uniforms per position, and a fifth whose first column draws the row's kind."""

    def __init__(self, tokenizer, causal_share: float = 0.0625, document_masking: bool = True, **mlm_options):
        if tokenizer.mask_token_id is None or tokenizer.eos_token_id is None:
            raise DataError(
                "--model.objective clm+mntp needs a tokenizer with a mask token and an eos token; unset "
                "--tokenizer.name_or_path to train one (a decoder's tokenizer trained for clm+mntp has <|mask|>)"
            )
        if not 0 <= causal_share <= 1:
            raise DataError(f"--data.causal_share={causal_share}: use a value in [0, 1]")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        super().__init__(tokenizer, **mlm_options)
        self.causal_share = causal_share
        self.eos_id = tokenizer.eos_token_id
        self.document_masking = document_masking

    def __call__(self, features: Sequence[Mapping]) -> dict[str, torch.Tensor]:
        batch = pad_batch(features, self.pad_id, self.pad_to_multiple_of)
        input_ids, real = batch["input_ids"], batch["attention_mask"].bool()
        draws = self._draws(features, batch["attention_mask"])
        causal_rows = draws[4][:, 0] < self.causal_share  # (B,)
        choosable = real.clone()
        choosable[:, 0] = False  # nothing before it to predict it from
        masked_ids, masked_labels = self.mask_tokens(input_ids, choosable.long(), draws=draws[:4])
        rows = causal_rows[:, None]
        batch["labels"] = torch.where(rows, input_ids.masked_fill(~real, -100), masked_labels)
        batch["input_ids"] = torch.where(rows, input_ids, masked_ids)
        length = input_ids.shape[1]
        if self.document_masking:
            positions = document_positions(
                input_ids, self.eos_id
            )  # from the unmasked ids: EOS is never chosen
            documents = (positions == 0).long().cumsum(-1)  # (B, T)
            batch["position_ids"] = positions
            visible = documents[:, :, None] == documents[:, None, :]  # (B, T, T)
        else:
            visible = torch.ones(len(input_ids), length, length, dtype=torch.bool)
        earlier = torch.ones(length, length, dtype=torch.bool).tril()
        visible = visible & real[:, None, :] & (earlier | ~rows[:, :, None])
        first_only = torch.zeros(length, dtype=torch.bool)
        first_only[0] = True
        visible = torch.where(real[:, :, None], visible, first_only)  # padding queries: the first token only
        batch["attention_mask"] = visible[:, None]  # (B, 1, T, T)
        return batch

    @staticmethod
    def loss_items(batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The loss averages over the predicted tokens: labels shifted by one (a causal row's every next token, a
        masked row's chosen ones)."""
        return {"loss": (batch["labels"][:, 1:] != -100).sum()}


def real_tokens(batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """(B, T) bool: the tokens of a collated batch that are not padding. A packed causal-LM batch carries no
    padding mask (`CLMCollator` with document masking); its padding is where the labels are -100."""
    if "attention_mask" in batch and batch["attention_mask"].dim() == 4:  # query x key (`HybridCollator`)
        return batch["attention_mask"][:, 0].any(-2)
    if "attention_mask" in batch:
        return batch["attention_mask"].bool()
    return batch["labels"] != -100


def document_positions(input_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """(B, T) positions that restart at 0 at the start of each row and after every EOS (each packed document
    counts its own positions; the EOS ends its document)."""
    batch_size, length = input_ids.shape
    starts = torch.ones_like(input_ids, dtype=torch.bool)
    starts[:, 1:] = input_ids[:, :-1] == eos_id
    index = torch.arange(length).expand(batch_size, length)
    start_of_document = torch.where(starts, index, 0).cummax(-1).values
    return index - start_of_document


__all__ = [
    "CLMCollator",
    "ElectraCollator",
    "HybridCollator",
    "MLMCollator",
    "document_positions",
    "pad_batch",
    "real_tokens",
]

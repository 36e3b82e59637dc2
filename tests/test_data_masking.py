"""MLMCollator: masking statistics over >= 10,000 sequences, special tokens, seeds/epochs/resume, whole words, caps."""

import pytest
import torch
from torch.utils.data import DataLoader

from kiln.config import REPO_ROOT
from pretrain.data import CLMCollator, DataError, MLMCollator, train_tokenizer

BOOK = (REPO_ROOT / "data/pretrain/alice_in_wonderland.txt").read_text(encoding="utf-8").split("\n")


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(BOOK, kind="wordpiece", vocab_size=800, model_max_length=128)


def pair_features(tokenizer, count: int, seed: int = 0) -> list[dict]:
    """[CLS] A [SEP] B [SEP] sequences of random lengths over random non-special ids."""
    g = torch.Generator().manual_seed(seed)
    lengths_a = torch.randint(2, 60, (count,), generator=g)
    lengths_b = torch.randint(1, 60, (count,), generator=g)
    ids = torch.randint(5, len(tokenizer), (count, 120), generator=g)  # ids 0-4 are the special tokens
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    features = []
    for i in range(count):
        a, b = ids[i, : lengths_a[i]], ids[i, 60 : 60 + lengths_b[i]]
        input_ids = torch.cat([torch.tensor([cls]), a, torch.tensor([sep]), b, torch.tensor([sep])])
        token_type_ids = torch.cat(
            [torch.zeros(len(a) + 2, dtype=torch.long), torch.ones(len(b) + 1, dtype=torch.long)]
        )
        features.append(
            {"input_ids": input_ids, "token_type_ids": token_type_ids, "next_sentence_label": i % 2}
        )
    return features


def word_features(tokenizer, count: int) -> list[dict]:
    lines = [line for line in BOOK if len(line) > 40]
    texts = [lines[i % len(lines)] for i in range(count)]
    return [{"input_ids": ids} for ids in tokenizer(texts, truncation=True, max_length=64)["input_ids"]]


def collate_all(collator, features, batch_size=500):
    return [collator(features[i : i + batch_size]) for i in range(0, len(features), batch_size)]


def test_masking_statistics_over_12000_sequences(tokenizer):
    features = pair_features(tokenizer, 12_000)
    collator = MLMCollator(tokenizer, seed=1)
    special = torch.tensor(tokenizer.all_special_ids)
    maskable = selected = to_mask = to_random = unchanged = 0
    for batch in collate_all(collator, features):
        ids, labels, attention = batch["input_ids"], batch["labels"], batch["attention_mask"].bool()
        chosen = labels != -100
        original = torch.where(chosen, labels, ids)
        is_special = torch.isin(original, special)
        assert not (chosen & ~attention).any(), "padding was selected"
        assert not (chosen & is_special).any(), "a special token was selected"
        assert (ids[~chosen] == original[~chosen]).all(), "an unselected token changed"
        maskable += int((attention & ~is_special).sum())
        selected += int(chosen.sum())
        to_mask += int((chosen & (ids == tokenizer.mask_token_id)).sum())
        replaced = chosen & (ids != tokenizer.mask_token_id) & (ids != labels)
        assert not torch.isin(ids[replaced], special).any(), "a random replacement was a special token"
        to_random += int(replaced.sum())
        unchanged += int((chosen & (ids == labels)).sum())
    assert maskable > 600_000
    # tolerances: selection +-0.3 pt (std ~0.05 pt here); replacement split +-1 pt (std ~0.2 pt)
    assert abs(selected / maskable - 0.15) < 0.003
    # a random replacement equal to the original (1/795 of them) counts as unchanged
    assert abs(to_mask / selected - 0.80) < 0.01
    assert abs(to_random / selected - 0.10) < 0.01
    assert abs(unchanged / selected - 0.10) < 0.01


def test_batch_is_padded_to_a_multiple_of_8_with_segments_and_labels(tokenizer):
    features = pair_features(tokenizer, 5, seed=3)
    batch = MLMCollator(tokenizer, seed=0)(features)
    longest = max(len(f["input_ids"]) for f in features)
    assert batch["input_ids"].shape[1] == -(-longest // 8) * 8
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels", "next_sentence_label"}
    for row, f in enumerate(features):
        n = len(f["input_ids"])
        assert batch["attention_mask"][row, :n].all() and not batch["attention_mask"][row, n:].any()
        assert (batch["input_ids"][row, n:] == tokenizer.pad_token_id).all()
        assert (batch["labels"][row, n:] == -100).all()
        assert batch["token_type_ids"][row, :n].tolist() == f["token_type_ids"].tolist()
    assert batch["next_sentence_label"].tolist() == [0, 1, 0, 1, 0]


def test_masks_differ_across_batches_and_epochs_and_repeat_for_the_same_position(tokenizer):
    features = pair_features(tokenizer, 64, seed=5)
    collator = MLMCollator(tokenizer, seed=7)
    collator.set_epoch(0)
    first, second = collator(features)["labels"], collator(features)["labels"]
    collator.set_epoch(1)
    other_epoch = collator(features)["labels"]
    collator.set_epoch(0)
    again = collator(features)["labels"]
    assert not torch.equal(first != -100, second != -100)
    assert not torch.equal(first != -100, other_epoch != -100)
    assert torch.equal(first, again)
    different_seed = MLMCollator(tokenizer, seed=8)(features)["labels"]
    assert not torch.equal(first != -100, different_seed != -100)


def test_resume_mid_epoch_reproduces_the_remaining_batches(tokenizer):
    features = pair_features(tokenizer, 64, seed=9)
    batches = [features[i : i + 16] for i in range(0, 64, 16)]
    uninterrupted = MLMCollator(tokenizer, seed=3)
    uninterrupted.set_epoch(2)
    expected = [uninterrupted(b) for b in batches]
    resumed = MLMCollator(tokenizer, seed=3)
    resumed.set_epoch(2, start_batch=2)
    for b, want in zip(batches[2:], expected[2:]):
        got = resumed(b)
        assert all(torch.equal(got[k], want[k]) for k in want)


def test_seeded_collator_leaves_global_rng_alone_and_unseeded_uses_it(tokenizer):
    features = pair_features(tokenizer, 32, seed=11)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    MLMCollator(tokenizer, seed=0)(features)
    assert torch.equal(torch.get_rng_state(), state)
    unseeded = MLMCollator(tokenizer)
    torch.manual_seed(5)
    a = unseeded(features)["labels"]
    torch.manual_seed(5)
    b = unseeded(features)["labels"]
    assert torch.equal(a, b) and not torch.equal(torch.get_rng_state(), state)


def test_dataloader_workers_give_the_same_batches_as_the_main_process(tokenizer):
    features = pair_features(tokenizer, 96, seed=13)
    results = []
    for workers in (0, 2):
        collator = MLMCollator(tokenizer, seed=4)
        collator.set_epoch(1)
        loader = DataLoader(features, batch_size=16, collate_fn=collator, num_workers=workers)
        results.append([batch["input_ids"] for batch in loader])
    assert len(results[0]) == 6 and all(torch.equal(a, b) for a, b in zip(*results))


def test_whole_word_masking_selects_all_pieces_of_a_word(tokenizer):
    features = word_features(tokenizer, 10_000)
    collator = MLMCollator(tokenizer, mlm_probability=0.15, whole_word_mask=True, seed=2)
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    is_piece = torch.tensor([t.startswith("##") for t in tokens])
    words = selected_words = split_words = 0
    for batch in collate_all(collator, features):
        chosen = batch["labels"] != -100
        original = torch.where(chosen, batch["labels"], batch["input_ids"])
        piece = is_piece[original] & batch["attention_mask"].bool()
        # a ## piece must share its selection with the token before it
        split_words += int((piece[:, 1:] & (chosen[:, 1:] != chosen[:, :-1])).sum())
        starts = (
            batch["attention_mask"].bool()
            & ~piece
            & ~torch.isin(original, torch.tensor(tokenizer.all_special_ids))
        )
        words += int(starts.sum())
        selected_words += int((starts & chosen).sum())
    assert split_words == 0
    assert words > 100_000 and abs(selected_words / words - 0.15) < 0.005


@pytest.mark.parametrize("whole_word", [False, True])
def test_max_predictions_per_seq_caps_selected_tokens(tokenizer, whole_word):
    features = word_features(tokenizer, 1000)
    capped = MLMCollator(
        tokenizer, mlm_probability=0.5, whole_word_mask=whole_word, max_predictions_per_seq=5, seed=0
    )
    free = MLMCollator(tokenizer, mlm_probability=0.5, whole_word_mask=whole_word, seed=0)
    capped_batches = collate_all(capped, features)
    counts = torch.cat([(b["labels"] != -100).sum(1) for b in capped_batches])
    free_counts = torch.cat([(b["labels"] != -100).sum(1) for b in collate_all(free, features)])
    assert counts.max() <= 5 and free_counts.max() > 5
    if whole_word:  # words are kept or dropped whole
        is_piece = torch.tensor(
            [t.startswith("##") for t in tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))]
        )
        for b in capped_batches:
            chosen = b["labels"] != -100
            piece = is_piece[torch.where(chosen, b["labels"], b["input_ids"])]
            assert not (piece[:, 1:] & (chosen[:, 1:] != chosen[:, :-1])).any()
    assert (counts >= 3).float().mean() > 0.9  # the cap trims, it does not empty


def test_bad_settings_are_errors(tokenizer):
    with pytest.raises(DataError, match="mlm_probability"):
        MLMCollator(tokenizer, mlm_probability=1.5)
    with pytest.raises(DataError, match="sum to at most 1"):
        MLMCollator(tokenizer, mask_replace_prob=0.8, random_replace_prob=0.3)
    bpe = train_tokenizer(BOOK[:200], kind="bpe", vocab_size=300)
    with pytest.raises(DataError, match="needs a WordPiece tokenizer"):
        MLMCollator(tokenizer=_with_mask(bpe), whole_word_mask=True)


def _with_mask(tokenizer):
    tokenizer.add_special_tokens({"mask_token": "<mask>"})
    return tokenizer


def test_clm_collator_labels_are_inputs_with_padding_ignored(tokenizer):
    batch = CLMCollator(tokenizer)([{"input_ids": [5, 6, 7, 8, 9]}, {"input_ids": [10, 11]}])
    assert batch["input_ids"].shape == (2, 8)
    assert batch["labels"].tolist() == [[5, 6, 7, 8, 9, -100, -100, -100], [10, 11] + [-100] * 6]
    assert batch["attention_mask"].sum(1).tolist() == [5, 2]


def test_masks_depend_on_the_example_not_on_batch_or_process(tokenizer):
    """With example_index (the trainer adds it), a sequence's masks are the same whatever batch it is in, however
    long its batch mates are and whatever the process rank: 1 and N processes see identical masks."""
    features = [{**f, "example_index": 100 + i} for i, f in enumerate(pair_features(tokenizer, 16, seed=3))]
    collator = MLMCollator(tokenizer, seed=7)
    collator.set_epoch(2)
    whole = collator(features)
    halves = [collator(features[8:]), collator(features[:8])]  # other order, other padded widths
    for start, part in ((8, halves[0]), (0, halves[1])):
        for row in range(8):
            length = int(part["attention_mask"][row].sum())
            assert torch.equal(part["labels"][row, :length], whole["labels"][start + row, :length])
            assert torch.equal(part["input_ids"][row, :length], whole["input_ids"][start + row, :length])
    assert "example_index" not in whole
    collator.set_epoch(3)  # another epoch: other masks for the same examples
    assert not torch.equal(collator(features)["labels"], whole["labels"])


def test_whole_word_cap_skips_a_word_that_overflows_and_keeps_later_ones(tokenizer):
    """Budget 3, words in random order of sizes 2, 2, 1: the second word does not fit and is skipped, the third
    still does (Google's create_pretraining_data.py); the first version dropped every word after an overflow."""
    collator = MLMCollator(tokenizer, whole_word_mask=True, max_predictions_per_seq=3, seed=0)
    selected = torch.tensor([[False, True, True, True, True, True, False]])
    word_start = torch.tensor([[0, 1, 1, 3, 3, 5, 6]])  # words at 1-2, 3-4 and 5
    score = torch.tensor([[0.0, 0.1, 0.1, 0.2, 0.2, 0.3, 0.0]])  # kept in this order
    kept = collator._cap(selected, word_start, score)
    assert kept.tolist() == [[False, True, True, False, False, True, False]]
    token_level = MLMCollator(tokenizer, max_predictions_per_seq=3, seed=0)
    assert token_level._cap(selected, None, torch.tensor([[0, 5, 1, 4, 2, 3, 0.0]])).tolist() == [
        [False, False, True, False, True, True, False]
    ]

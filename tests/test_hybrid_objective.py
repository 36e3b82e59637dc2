"""The decoder's hybrid objective (`--model.objective clm+mntp`, GPT-BERT's): the rows' kinds and masks over
thousands of rows, the attention each row gets through Kiln's decoder, the masked scoring against a direct
computation, and a run through the entry point that is scored both ways."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from kiln_testing import DECODER, REPO, run

from kiln.throughput import count_real_tokens
from pretrain.data.collator import CLMCollator, HybridCollator, real_tokens
from pretrain.data.common import DataError
from pretrain.data.tokenizer import MASK, train_tokenizer

TEXTS = [
    "the cat sat on the mat and the dog ran in the park.",
    "once upon a time there was a little girl who liked to sing.",
    "a bird flew over the river while the sun went down.",
] * 100


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXTS, kind="bpe", vocab_size=600, mask_token=True)


def direct_masked_score(model, whole, start, mask_token_id, bidirectional=True):
    """Masked next-token pseudo-log-likelihood computed the long way: one copy of `whole` (1, T) per token from
    `start` on, that token replaced by the mask and predicted one position earlier; attention over the whole
    sentence (a (1, 1, T, T) mask of ones) or, with `bidirectional=False`, the model's own causal attention."""
    length = whole.shape[1]
    everything = (
        {"attention_mask": torch.ones(1, 1, length, length, dtype=torch.bool)} if bidirectional else {}
    )
    total = 0.0
    for p in range(start, length):
        copy = whole.clone()
        copy[0, p] = mask_token_id
        with torch.no_grad():
            logits = model(input_ids=copy, **everything).logits[0, p - 1]
        total += float(logits.double().log_softmax(-1)[whole[0, p]])
    return total


def _blocks(tokenizer, count, seed=0):
    """`count` packed blocks of 2-3 documents each (EOS after every document), some shorter than the others."""
    generator = torch.Generator().manual_seed(seed)
    documents = [tokenizer.encode(text) for text in TEXTS[:3]]
    blocks = []
    for _ in range(count):
        parts = torch.randint(
            0, 3, (int(torch.randint(2, 4, (1,), generator=generator)),), generator=generator
        )
        blocks.append([t for i in parts.tolist() for t in [*documents[i], tokenizer.eos_token_id]])
    return blocks


def _features(blocks, start=0):
    return [{"input_ids": block, "example_index": start + i} for i, block in enumerate(blocks)]


def test_the_tokenizer_trained_for_the_hybrid_has_a_mask_token_and_a_plain_one_has_none(tokenizer):
    assert tokenizer.mask_token == MASK and tokenizer.mask_token_id == 1 and tokenizer.eos_token_id == 0
    assert tokenizer.encode("the cat " + MASK + " on") == [
        *tokenizer.encode("the cat "),
        1,
        *tokenizer.encode(" on"),
    ]  # one token, never split
    plain = train_tokenizer(TEXTS, kind="bpe", vocab_size=600)
    assert plain.mask_token is None
    with pytest.raises(DataError, match="mask token"):
        HybridCollator(plain, seed=0)


def test_row_kinds_and_chosen_tokens_follow_their_rates_over_thousands_of_rows(tokenizer):
    """3,000 rows at causal share 0.25, masking 30%: the causal share, the chosen share of the choosable tokens
    (not the block's first, not EOS), and the 80/10/10 split are within 4 standard errors of their rates."""
    collator = HybridCollator(tokenizer, causal_share=0.25, mlm_probability=0.3, seed=7)
    blocks = _blocks(tokenizer, 3000)
    causal = choosable = chosen = as_mask = kept = 0
    for start in range(0, len(blocks), 100):
        batch = collator(_features(blocks[start : start + 100], start))
        real = real_tokens(batch)
        original = torch.nn.utils.rnn.pad_sequence(
            [torch.tensor(b) for b in blocks[start : start + 100]], batch_first=True
        )
        original = torch.nn.functional.pad(original, (0, real.shape[1] - original.shape[1]))
        rows_causal = (batch["labels"] == original.masked_fill(~real, -100)).all(1) & (
            batch["input_ids"] == original
        ).all(1)
        causal += int(rows_causal.sum())
        masked_rows = ~rows_causal
        candidates = real & (original != tokenizer.eos_token_id)
        candidates[:, 0] = False
        picked = (batch["labels"] != -100) & masked_rows[:, None]
        assert not (picked & ~candidates).any()  # never the first token, EOS or padding
        assert (batch["labels"][picked] == original[picked]).all()
        choosable += int((candidates & masked_rows[:, None]).sum())
        chosen += int(picked.sum())
        as_mask += int((batch["input_ids"][picked] == tokenizer.mask_token_id).sum())
        kept += int((batch["input_ids"][picked] == original[picked]).sum())
        unpicked = masked_rows[:, None] & ~picked
        assert (batch["input_ids"][unpicked] == original[unpicked]).all()

    def close(count, total, rate):
        return abs(count / total - rate) < 4 * math.sqrt(rate * (1 - rate) / total)

    assert close(causal, len(blocks), 0.25), causal
    assert close(chosen, choosable, 0.3), (chosen, choosable)
    assert close(as_mask, chosen, 0.8), (as_mask, chosen)
    # unchanged: the 10% kept plus the random draws that happen to pick the original token
    assert abs(kept / chosen - 0.1) < 4 * math.sqrt(0.09 / chosen) + 1 / len(tokenizer)


def test_attention_masks_keep_documents_apart_and_are_causal_only_in_causal_rows(tokenizer):
    collator = HybridCollator(tokenizer, causal_share=0.5, seed=1)
    blocks = _blocks(tokenizer, 40)
    blocks[3] = blocks[3][:9]  # a short row: padding
    batch = collator(_features(blocks))
    positions = batch["position_ids"]
    documents = (positions == 0).cumsum(-1)
    real = real_tokens(batch)
    assert real.sum(1).tolist() == [len(b) for b in blocks]
    assert count_real_tokens(batch) == sum(len(b) for b in blocks)
    length = real.shape[1]
    tril = torch.ones(length, length, dtype=torch.bool).tril()
    kinds = set()
    for row in range(len(blocks)):
        mask = batch["attention_mask"][row, 0]
        same = (documents[row][:, None] == documents[row][None, :]) & real[row][None, :]
        causal = bool(
            (batch["input_ids"][row] == torch.tensor(blocks[row] + [0] * (length - len(blocks[row])))).all()
        )
        causal = causal and bool(
            (batch["labels"][row, : len(blocks[row])] == torch.tensor(blocks[row])).all()
        )
        kinds.add(causal)
        n = len(blocks[row])
        expected = (same & tril) if causal else same
        assert torch.equal(mask[:n], expected[:n]), row
        if n < length:  # padding queries see the row's first token only
            assert mask[n:, 0].all() and not mask[n:, 1:].any()
    assert kinds == {True, False}
    # a row's kind and masks come from its example alone: the same example in another batch gets the same row
    again = collator(_features(blocks[3:5], start=3))
    for key in ("input_ids", "labels"):
        assert torch.equal(again[key][0, : len(blocks[3])], batch[key][3, : len(blocks[3])])


def test_causal_rows_give_the_causal_collator_s_logits_and_masked_rows_see_the_whole_document(tokenizer):
    """Through Kiln's llama-preset decoder: a causal row's logits equal those of the same block collated for
    plain causal LM; in a masked row a later token changes an earlier position's logits, within its document
    only."""
    from pretrain.modeling import KilnDecoderConfig, KilnDecoderForCausalLM

    torch.manual_seed(0)
    config = KilnDecoderConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, preset="llama"
    )
    model = KilnDecoderForCausalLM(config).eval()
    block = _blocks(tokenizer, 1, seed=3)[0]
    first_end = block.index(tokenizer.eos_token_id)
    every_causal = HybridCollator(tokenizer, causal_share=1.0, seed=0)
    every_masked = HybridCollator(tokenizer, causal_share=0.0, mlm_probability=0.2, seed=0)
    hybrid = every_causal(_features([block]))
    plain = CLMCollator(tokenizer, document_masking=True)([{"input_ids": block}])
    with torch.no_grad():
        n = len(block)  # the padding's outputs differ (they read nothing) and are never scored
        assert torch.allclose(model(**hybrid).logits[:, :n], model(**plain).logits[:, :n], atol=1e-6)
        assert torch.allclose(model(**hybrid).loss, model(**plain).loss, atol=1e-6)
        masked = every_masked(_features([block]))
        changed = dict(masked)
        changed["input_ids"] = masked["input_ids"].clone()
        changed["input_ids"][0, first_end - 1] = tokenizer.encode(" bird")[0]  # late in the first document
        before, after = model(**masked).logits[0], model(**changed).logits[0]
    assert not torch.allclose(before[0], after[0])  # the first token sees a later one
    assert torch.allclose(
        before[first_end + 1 : n], after[first_end + 1 : n], atol=1e-6
    )  # other documents do not


def test_masked_scoring_equals_a_direct_computation_and_splits_across_processes(tokenizer):
    from pretrain.modeling import KilnDecoderConfig, KilnDecoderForCausalLM
    from pretrain.zero_shot.scoring import SentenceScorer, ZeroShotError

    torch.manual_seed(1)
    config = KilnDecoderConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, preset="llama"
    )
    model = KilnDecoderForCausalLM(config).eval()
    sentences = ["the cat sat on the mat.", "a bird flew.", "once upon a time there was a girl who liked it."]
    scorer = SentenceScorer(tokenizer, "decoder", decoder_scoring="masked", budget=64)
    encoded = scorer.encode(sentences)
    scores = scorer.score(model, encoded)
    for i, (context, ids) in enumerate(zip(encoded.context, encoded.ids)):
        whole = torch.tensor([context + ids])
        direct = direct_masked_score(model, whole, len(context), tokenizer.mask_token_id)
        assert math.isclose(float(scores[i]), direct, rel_tol=1e-5), (i, float(scores[i]), direct)
    split = sum(scorer.score(model, encoded, rank, 2) for rank in range(2))
    assert torch.equal(split, scores)  # each sentence whole in one process's batches
    causal = SentenceScorer(tokenizer, "decoder").score(model, encoded)
    assert not torch.allclose(causal, scores)
    plain = train_tokenizer(TEXTS, kind="bpe", vocab_size=600)
    with pytest.raises(ZeroShotError, match="clm\\+mntp"):
        SentenceScorer(plain, "decoder", decoder_scoring="masked")


@pytest.mark.slow
def test_a_hybrid_run_through_the_entry_point_is_scored_both_ways(tmp_path):
    """`pretrain/run.py --model.objective clm+mntp`: the run trains a tokenizer with <|mask|>, evaluates causally
    (eval/loss is the causal LM loss), and its folder scores BLiMP causally and masked from the command line;
    a decoder objective it does not know is a one-line error."""
    out = tmp_path / "hybrid"
    state = run(
        out,
        *DECODER,
        "--model.objective",
        "clm+mntp",
        "--data.causal_share",
        "0.5",
        "--data.max_train_documents",
        "40",
        "--training.max_steps",
        "6",
        "--training.eval_steps",
        "6",
        "--training.max_eval_batches",
        "1",
    )
    assert state.global_step == 6
    saved = json.loads((out / "final" / "tokenizer_config.json").read_text())
    assert saved.get("mask_token") == MASK
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("eval/loss" in row and math.isfinite(row["eval/loss"]) for row in rows)
    results = {}
    for scoring in ("causal", "masked"):
        target = tmp_path / f"blimp-{scoring}.json"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pretrain.zero_shot",
                "blimp",
                "--model",
                str(out / "final"),
                "--data",
                str(REPO / "data/blimp"),
                "--pairs",
                "2",
                "--paradigms",
                "anaphor_gender_agreement",
                "regular_plural_subject_verb_agreement_1",
                "--decoder_scoring",
                scoring,
                "--json",
                str(target),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        results[scoring] = json.loads(target.read_text())
        assert results[scoring]["decoder_scoring"] == scoring and results[scoring]["pairs"] == 4
    refused = subprocess.run(
        [
            sys.executable,
            "pretrain/run.py",
            "--config",
            "configs/pretrain/debug.yaml",
            *DECODER,
            "--model.objective",
            "mlm",
            "--training.output_dir",
            str(tmp_path / "no"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert refused.returncode != 0 and "clm+mntp" in refused.stderr.strip().splitlines()[-1]


def test_the_hybrid_takes_every_masking_option_of_the_data_section(tokenizer):
    """`make_decoder_collators` hands the hybrid's masked rows the same options an encoder's MLM gets: the cap on
    chosen tokens holds per row, and whole-word masking, which needs WordPiece pieces, is refused in one line."""
    from pretrain.config import DataConfig
    from pretrain.data.pipeline import make_decoder_collators

    hybrid, causal = make_decoder_collators(
        DataConfig(causal_share=0.0, mlm_probability=0.5, max_predictions_per_seq=2), tokenizer, 3, "clm+mntp"
    )
    assert isinstance(hybrid, HybridCollator) and isinstance(causal, CLMCollator)
    batch = hybrid(_features(_blocks(tokenizer, 50)))
    chosen = (batch["labels"] != -100).sum(1)
    assert chosen.max() == 2 and (chosen > 0).all()  # half the tokens drawn, two kept per row
    with pytest.raises(DataError, match="WordPiece"):
        make_decoder_collators(DataConfig(whole_word_mask=True), tokenizer, 3, "clm+mntp")
    plain, same = make_decoder_collators(DataConfig(), tokenizer, 3, "clm")
    assert plain is same and isinstance(plain, CLMCollator)


def test_masked_scoring_reads_a_transformers_decoder_bidirectionally(tokenizer):
    """docs/zero-shot.md: the 4-D mask the masked scorer passes is read as given by transformers' own decoders, so
    a LlamaForCausalLM's masked score equals the direct computation with attention over the whole sentence."""
    import transformers

    from pretrain.zero_shot.scoring import SentenceScorer

    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    torch.manual_seed(2)
    model = transformers.LlamaForCausalLM(config).eval()
    scorer = SentenceScorer(tokenizer, "decoder", decoder_scoring="masked")
    encoded = scorer.encode(["the dog ran in the park."])
    score = float(scorer.score(model, encoded)[0])
    whole = torch.tensor([encoded.context[0] + encoded.ids[0]])
    causal = direct_masked_score(model, whole, 1, tokenizer.mask_token_id, bidirectional=False)
    # read causally, position p - 1 never sees the mask at p, so the masked score must differ from this
    assert not math.isclose(score, causal, rel_tol=1e-6)
    bidirectional = direct_masked_score(model, whole, 1, tokenizer.mask_token_id)
    assert math.isclose(score, bidirectional, rel_tol=1e-5)

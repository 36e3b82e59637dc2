"""Tokenizer training, saving/reloading, special tokens, pair template, reuse and vocabulary checks."""

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from kiln.config import REPO_ROOT
from pretrain.config import DataConfig, TokenizerConfig
from pretrain.data import (
    DataError,
    check_tokenizer_fits,
    load_tokenizer,
    padded_vocab_size,
    prepare_tokenizer,
    train_tokenizer,
)
from pretrain.data.tokenizer import check_special_tokens

BOOK = (REPO_ROOT / "data/pretrain/alice_in_wonderland.txt").read_text(encoding="utf-8").split("\n")


@pytest.fixture(scope="module")
def wordpiece():
    return train_tokenizer(BOOK, kind="wordpiece", vocab_size=1000, lowercase=True, model_max_length=64)


@pytest.fixture(scope="module")
def bpe():
    return train_tokenizer(BOOK, kind="bpe", vocab_size=700, model_max_length=64)


def test_wordpiece_vocab_special_tokens_and_pair_template(wordpiece):
    assert len(wordpiece) == 1000
    assert wordpiece.convert_ids_to_tokens(list(range(5))) == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert (wordpiece.pad_token, wordpiece.mask_token, wordpiece.model_max_length) == ("[PAD]", "[MASK]", 64)
    a = wordpiece("Alice was curious", add_special_tokens=False)["input_ids"]
    b = wordpiece("the rabbit ran away", add_special_tokens=False)["input_ids"]
    pair = wordpiece("Alice was curious", "the rabbit ran away")
    assert pair["input_ids"] == [
        wordpiece.cls_token_id,
        *a,
        wordpiece.sep_token_id,
        *b,
        wordpiece.sep_token_id,
    ]
    assert pair["token_type_ids"] == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    single = wordpiece("Alice was curious")
    assert single["input_ids"] == [wordpiece.cls_token_id, *a, wordpiece.sep_token_id]
    assert set(single["token_type_ids"]) == {0}


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_training_is_deterministic(kind):
    first, second = (train_tokenizer(BOOK[:400], kind=kind, vocab_size=500) for _ in range(2))
    assert first.backend_tokenizer.to_str() == second.backend_tokenizer.to_str()


def test_wordpiece_round_trip_lowercases_and_never_needs_unk_for_ascii(wordpiece):
    text = "Alice said: 'Curiouser and curiouser!' Then she ran 42 yards, quickly... Zyx?"
    ids = wordpiece(text, add_special_tokens=False)["input_ids"]
    assert wordpiece.unk_token_id not in ids
    decoded = wordpiece.decode(ids)
    assert "".join(decoded.split()) == "".join(text.lower().split())
    assert decoded.startswith("alice said :")


def test_byte_level_bpe_round_trip_is_exact(bpe):
    assert len(bpe) == 700
    assert bpe.eos_token == bpe.pad_token == bpe.bos_token == "<|endoftext|>" and bpe.eos_token_id == 0
    text = "Alice’s “Curiouser!”  Ünïcödé — 3.14 and 😀\nnew line"
    ids = bpe(text)["input_ids"]
    assert bpe.eos_token_id not in ids  # no special tokens added: the packer places EOS itself
    assert bpe.decode(ids) == text


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_saved_tokenizer_reloads_with_specials_and_template(tmp_path, wordpiece, bpe, kind):
    tokenizer = wordpiece if kind == "wordpiece" else bpe
    tokenizer.save_pretrained(tmp_path)
    for reloaded in (
        AutoTokenizer.from_pretrained(tmp_path),
        PreTrainedTokenizerFast.from_pretrained(tmp_path),
    ):
        assert isinstance(reloaded, PreTrainedTokenizerFast)
        assert reloaded.all_special_tokens == tokenizer.all_special_tokens
        assert reloaded.model_max_length == 64 and len(reloaded) == len(tokenizer)
        assert reloaded("the queen", "the king") == tokenizer("the queen", "the king")


def test_padded_vocab_size(wordpiece):
    assert padded_vocab_size(wordpiece, 64) == 1024
    assert padded_vocab_size(wordpiece, 0) == 1000
    assert padded_vocab_size(wordpiece, 8) == 1000


def test_prepare_tokenizer_trains_saves_reuses_and_loads_given(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(BOOK[i] for i in range(0, 400, 2) if BOOK[i]), encoding="utf-8")
    data = DataConfig(data_files=[str(corpus)], cache_dir=str(tmp_path / "cache"), max_seq_length=96)
    trained = prepare_tokenizer(TokenizerConfig(vocab_size=600), data, "encoder", str(tmp_path / "tok"))
    assert (tmp_path / "tok" / "tokenizer.json").is_file()
    assert len(trained) == 600 and trained.model_max_length == 96 and trained.mask_token == "[MASK]"
    # a resumed run finds the saved tokenizer and does not retrain (vocab_size would differ otherwise)
    again = prepare_tokenizer(TokenizerConfig(vocab_size=900), data, "encoder", str(tmp_path / "tok"))
    assert again.get_vocab() == trained.get_vocab()
    given = prepare_tokenizer(
        TokenizerConfig(name_or_path=str(tmp_path / "tok")), data, "encoder", str(tmp_path / "x")
    )
    assert given.get_vocab() == trained.get_vocab() and not (tmp_path / "x").exists()
    decoder = prepare_tokenizer(TokenizerConfig(vocab_size=600), data, "decoder", str(tmp_path / "bpe"))
    assert type(decoder.backend_tokenizer.model).__name__ == "BPE" and decoder.eos_token == "<|endoftext|>"


def test_vocabulary_and_tokenizer_errors_name_the_fix(wordpiece, bpe):
    check_tokenizer_fits(wordpiece, 1024)
    with pytest.raises(
        DataError, match=r"1000 tokens but the model's vocab_size is 512.*tokenizer.name_or_path"
    ):
        check_tokenizer_fits(wordpiece, 512)
    with pytest.raises(DataError, match="no cls_token, sep_token, mask_token"):
        check_special_tokens(bpe, "encoder")
    with pytest.raises(DataError, match="could not load tokenizer .*unset --tokenizer.name_or_path"):
        load_tokenizer("/no/such/tokenizer/folder")
    with pytest.raises(DataError, match="too small"):
        train_tokenizer(BOOK[:10], kind="bpe", vocab_size=200)


def _tie_heavy_corpus(folder):
    """Every 3-letter word over 16 letters, each exactly twice: nearly every merge candidate ties with others."""
    import itertools
    import random

    words = ["".join(p) for p in itertools.product("abcdefghijklmnop", repeat=3)]
    random.Random(0).shuffle(words)
    folder.mkdir(parents=True, exist_ok=True)
    for part in range(2):
        lines = [" ".join(words[i : i + 50]) for i in range(0, len(words), 50)]
        (folder / f"part{part}.txt").write_text("\n\n".join(lines) + "\n", encoding="utf-8")
    return folder


@pytest.mark.slow
def test_the_same_command_twice_gives_the_same_tokenizer_and_losses(tmp_path):
    """Two fresh processes (Rust hash maps seeded differently in each) train byte-identical WordPiece files
    and then log identical losses; tokenizers alone numbers ## pieces in hash order (tokenizers#1794)."""
    import json
    import os
    import subprocess
    import sys

    from kiln_testing import DEBUG, REPO

    corpus = _tie_heavy_corpus(tmp_path / "corpus")
    outputs = []
    for attempt in range(2):
        out = tmp_path / f"run{attempt}"
        result = subprocess.run(
            [
                sys.executable,
                str(REPO / "pretrain/run.py"),
                "--config",
                DEBUG,
                "--training.output_dir",
                str(out),
                "--data.data_files",
                str(corpus / "*.txt"),
                "--tokenizer.vocab_size",
                "600",
                "--training.max_steps",
                "3",
                "--training.save_steps",
                "0",
                "--training.eval_steps",
                "0",
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        outputs.append(out)
    first, second = ((out / "tokenizer" / "tokenizer.json").read_bytes() for out in outputs)
    assert first == second
    rows = [
        [
            json.loads(line)["train/loss"]
            for line in (out / "metrics.jsonl").read_text().splitlines()
            if "train/loss" in line
        ]
        for out in outputs
    ]
    assert len(rows[0]) == 3 and rows[0] == rows[1]

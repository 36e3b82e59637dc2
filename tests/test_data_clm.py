"""CLM packing: no token lost or repeated, EOS between documents, remainders carried across map batches."""

import random
from itertools import chain

import torch
from datasets import Dataset

from pretrain.config import DataConfig
from pretrain.data import BlockPacker, build_pretraining_data, pack_documents, train_tokenizer

EOS = 0


def random_documents(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [
        [rng.randint(1, 999) for _ in range(rng.choice([0, 1, rng.randint(2, 300)]))] for _ in range(count)
    ]


def test_every_token_appears_once_in_order_with_eos_between_documents():
    documents = random_documents(500)
    blocks = pack_documents(documents, block_size=64, eos_id=EOS)
    assert all(len(b) == 64 for b in blocks[:-1]) and 0 < len(blocks[-1]) <= 64
    assert list(chain(*blocks)) == list(chain(*(doc + [EOS] for doc in documents)))


def test_map_batches_carry_their_remainder_instead_of_dropping_it():
    documents = random_documents(300, seed=1)
    dataset = Dataset.from_dict({"input_ids": documents})
    expected = pack_documents(documents, block_size=50, eos_id=EOS)
    for batch_size in (1, 7, 1000):
        packer = BlockPacker(50, EOS, num_rows=len(dataset))
        packed = dataset.map(packer, batched=True, batch_size=batch_size, with_indices=True)
        assert packed["input_ids"] == expected, batch_size
        assert (
            dataset.map(packer, batched=True, batch_size=batch_size, with_indices=True)["input_ids"]
            == expected
        )


def test_decoder_pipeline_packs_the_whole_training_split(tmp_path):
    rng = random.Random(2)
    words = "the cat dog sun ran sat big small happy tree park ball red".split()
    stories = [
        " ".join(rng.choice(words) for _ in range(rng.randint(5, 80))).capitalize() + "." for _ in range(120)
    ]
    (tmp_path / "stories.txt").write_text("\n\n".join(stories) + "\n", encoding="utf-8")
    cfg = DataConfig(
        data_files=[str(tmp_path / "stories.txt")], cache_dir=str(tmp_path / "cache"), max_seq_length=32
    )
    tokenizer = train_tokenizer(stories, kind="bpe", vocab_size=300)
    data = build_pretraining_data(cfg, tokenizer, "decoder", "clm", seed=0, max_position_embeddings=32)
    train = data.train_dataset(0)
    blocks = [ids.tolist() for ids in train["input_ids"]]
    assert [ids.tolist() for ids in data.train_dataset(1)["input_ids"]] == blocks
    assert all(len(b) == 32 for b in blocks[:-1])
    stream = list(chain(*blocks))
    eos = tokenizer.eos_token_id
    assert stream.count(eos) == data.num_train_documents and stream[-1] == eos
    training_texts = tokenizer.decode(stream).split(tokenizer.eos_token)[:-1]
    eval_texts = tokenizer.decode(list(chain(*data.eval_dataset["input_ids"]))).split(tokenizer.eos_token)[
        :-1
    ]
    assert sorted(training_texts + eval_texts) == sorted(stories)  # every story exactly once, nothing lost
    batch = data.collator([train[i] for i in range(4)])
    assert (
        set(batch)
        == {"input_ids", "labels", "position_ids"}  # packed: no padding mask, as transformers packs
        and (batch["labels"] == batch["input_ids"]).all()
    )
    # document masking, on by default: positions restart after every EOS (each document counted on its own)
    after_eos = torch.nn.functional.pad(batch["input_ids"][:, :-1] == eos, (1, 0), value=True)
    assert (batch["position_ids"][after_eos] == 0).all() and (batch["position_ids"][~after_eos] > 0).all()
    assert int(after_eos[:, 1:].sum()) > 0  # the blocks hold several documents

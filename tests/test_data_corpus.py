"""Corpus reading: sources, document and sentence splitting, validation split, streaming, bad input, shipped data."""

import hashlib
import json
import re
import statistics
from pathlib import Path

import pytest
from datasets import Dataset, DatasetDict, IterableDataset
from datasets.distributed import split_dataset_by_node

from kiln.config import REPO_ROOT
from pretrain.config import DataConfig
from pretrain.data import DataError, corpus, load_documents, split_documents, split_sentences
from pretrain.data.corpus import find_invalid_utf8

DOCS = [
    f"Document {d} starts here. It has a second sentence! Does it end? Yes, with word{d}." for d in range(40)
]


def write_text(tmp_path: Path, name: str, documents: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    return path


def config(tmp_path: Path, files, **overrides) -> DataConfig:
    return DataConfig(data_files=[str(f) for f in files], cache_dir=str(tmp_path / "cache"), **overrides)


def all_texts(splits) -> list[str]:
    texts = (
        list(splits.train["text"]) if isinstance(splits.train, Dataset) else [r["text"] for r in splits.train]
    )
    if splits.validation is not None:
        texts += (
            list(splits.validation["text"])
            if isinstance(splits.validation, Dataset)
            else [r["text"] for r in splits.validation]
        )
    return texts


# ---------------------------------------------------------------------------------------------- splitting


def test_blank_lines_and_wikitext_headings_end_documents():
    text = "\ufeffFirst doc line one.\nline two.\n \t \nSecond doc.\n\n\n = Title = \n \n Para A . \n = = Section = = \n Para B . \n"
    assert split_documents(text, "blank_line") == [
        "First doc line one.\nline two.",
        "Second doc.",
        "Para A .",
        "Para B .",
    ]


def test_heading_mode_groups_a_wikitext_article():
    text = " \n = Lobster = \n \n Lobsters are big . \n \n = = Life = = \n \n They moult . \n = Crab = \n \n Crabs walk . \n"
    assert split_documents(text, "heading") == ["Lobsters are big .\nThey moult .", "Crabs walk ."]


def test_line_file_and_literal_separators():
    text = "a b\n\nc d\ne<|endoftext|>f\n"
    assert split_documents(text, "line") == ["a b", "c d", "e<|endoftext|>f"]
    assert split_documents(text, "file") == [text.strip()]
    assert split_documents(text, "<|endoftext|>") == ["a b\n\nc d\ne", "f"]


def test_sentence_rule_handles_abbreviations_initials_and_quotes():
    text = 'Mr. Bennet met Dr. Watson in St. Paul. H. G. Wells\nwrote it! “Why?” she asked. Then: "Go." He went… Later'
    assert split_sentences(text, "rule") == [
        "Mr. Bennet met Dr. Watson in St. Paul.",
        "H. G. Wells wrote it!",
        "“Why?” she asked.",
        'Then: "Go."',
        "He went…",
        "Later",
    ]
    assert split_sentences("one. two.\nThree\n\n", "line") == ["one. two.", "Three"]


# ---------------------------------------------------------------------------------------------- sources


def test_txt_json_jsonl_csv_parquet_and_globs_give_the_same_documents(tmp_path):
    write_text(tmp_path, "part1.txt", DOCS[:25])
    write_text(tmp_path, "part2.txt", DOCS[25:])
    expected = sorted(DOCS)
    txt = load_documents(config(tmp_path, [tmp_path / "part*.txt"], validation_split_percentage=0))
    assert sorted(txt.train["text"]) == expected and txt.validation is None

    (tmp_path / "docs.jsonl").write_text(
        "".join(json.dumps({"body": d, "id": i}) + "\n" for i, d in enumerate(DOCS))
    )
    (tmp_path / "docs.json").write_text(json.dumps([{"body": d} for d in DOCS]))
    Dataset.from_dict({"body": DOCS}).to_csv(str(tmp_path / "docs.csv"), index=False)
    Dataset.from_dict({"body": DOCS}).to_parquet(str(tmp_path / "docs.parquet"))
    for name in ("docs.jsonl", "docs.json", "docs.csv", "docs.parquet"):
        splits = load_documents(
            config(tmp_path, [tmp_path / name], text_column="body", validation_split_percentage=0)
        )
        assert sorted(splits.train["text"]) == expected, name


def test_hub_dataset_uses_its_validation_split_and_heading_mode_joins_wikitext_rows(monkeypatch):
    rows = [
        " ",
        " = Lobster = ",
        " ",
        " Lobsters are big . They live in the sea . ",
        " ",
        " = = Life = = ",
        " ",
        " They moult . ",
        " ",
        " = Crab = ",
        " ",
        " Crabs walk sideways . ",
        " ",
    ]
    hub = DatasetDict(
        {
            "train": Dataset.from_dict({"text": rows}),
            "validation": Dataset.from_dict({"text": [" = Val = ", " Held out text . "]}),
            "test": Dataset.from_dict({"text": [" Test . "]}),
        }
    )
    calls = []

    def fake_load_dataset(path, streaming=False, **kwargs):
        calls.append((path, kwargs.get("name"), streaming))
        return hub

    monkeypatch.setattr(corpus, "load_dataset", fake_load_dataset)
    cfg = DataConfig(
        dataset_name="wikitext", dataset_config="wikitext-2-raw-v1", document_separator="heading"
    )
    splits = load_documents(cfg)
    assert calls == [("wikitext", "wikitext-2-raw-v1", False)]
    assert list(splits.train["text"]) == [
        "Lobsters are big . They live in the sea .\nThey moult .",
        "Crabs walk sideways .",
    ]
    assert list(splits.validation["text"]) == ["Held out text ."]
    paragraphs = load_documents(DataConfig(dataset_name="wikitext", document_separator="blank_line"))
    assert list(paragraphs.train["text"]) == [
        "Lobsters are big . They live in the sea .",
        "They moult .",
        "Crabs walk sideways .",
    ]
    with pytest.raises(
        DataError, match=r"no split 'training' \(splits: train, validation, test\); set --data.dataset_split"
    ):
        load_documents(DataConfig(dataset_name="wikitext", dataset_split="training"))
    with pytest.raises(
        DataError, match="column 'content' not found in Hub dataset wikitext; columns are: text"
    ):
        load_documents(DataConfig(dataset_name="wikitext", text_column="content"))


def test_validation_split_by_percentage_is_disjoint_deterministic_and_sized(tmp_path):
    write_text(tmp_path, "c.txt", DOCS)
    cfg = config(tmp_path, [tmp_path / "c.txt"], validation_split_percentage=10)
    first, second = load_documents(cfg), load_documents(cfg)
    assert len(first.validation) == 4 and len(first.train) == 36
    assert set(first.train["text"]).isdisjoint(first.validation["text"])
    assert sorted(all_texts(first)) == sorted(DOCS)
    assert list(first.validation["text"]) == list(second.validation["text"])

    write_text(tmp_path, "val.txt", ["Held out. Really held out."])
    given = load_documents(
        config(tmp_path, [tmp_path / "c.txt"], validation_files=[str(tmp_path / "val.txt")])
    )
    assert list(given.validation["text"]) == ["Held out. Really held out."] and len(given.train) == 40


def test_streaming_reads_the_same_documents_and_shards_by_node(tmp_path):
    for i in range(4):
        write_text(tmp_path, f"shard{i}.txt", DOCS[i * 10 : (i + 1) * 10])
    cfg = config(tmp_path, [tmp_path / "shard*.txt"], validation_split_percentage=10, max_eval_documents=100)
    stream = load_documents(cfg, streaming=True)
    assert isinstance(stream.train, IterableDataset)
    assert sorted(all_texts(stream)) == sorted(DOCS)
    ranks = [
        [row["text"] for row in split_dataset_by_node(stream.train, rank=r, world_size=2)] for r in range(2)
    ]
    assert ranks[0] and ranks[1] and set(ranks[0]).isdisjoint(ranks[1])
    assert sorted(ranks[0] + ranks[1]) == sorted(row["text"] for row in stream.train)


# ---------------------------------------------------------------------------------------------- bad input


def test_missing_text_column_lists_the_columns(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"body": "x. Y.", "id": 1}\n')
    with pytest.raises(DataError, match=r"column 'text' not found.*columns are: body, id.*data.text_column"):
        load_documents(config(tmp_path, [tmp_path / "d.jsonl"]))


def test_non_utf8_bytes_name_file_and_line(tmp_path):
    path = tmp_path / "latin.txt"
    path.write_bytes("line one\nline two\ncaf\u00e9 ok\n".encode() + b"na\xefve\n")
    assert find_invalid_utf8(str(path)) == (4, b"\xef")
    with pytest.raises(
        DataError,
        match=r"latin\.txt is UTF-8 with one invalid byte sequence at byte offset 29 "
        r"\(line 4: bytes ef\); do not re-encode",
    ):
        load_documents(config(tmp_path, [path]))
    path.write_bytes(b"line one\nna\xefve\n")  # nothing but ASCII beside it: an 8-bit encoding
    with pytest.raises(
        DataError,
        match=r"latin\.txt, line 2: bytes ef at byte offset 11 are not valid UTF-8.*"
        r"re-encode the file as UTF-8 \(e\.g\. `iconv -f latin1",
    ):
        load_documents(config(tmp_path, [path]))


def test_empty_corpus_and_unmatched_glob_are_one_line_errors(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(DataError, match="corpus is empty"):
        load_documents(config(tmp_path, [tmp_path / "empty.txt"]))
    (tmp_path / "blank.txt").write_text("\n \n\n")
    with pytest.raises(DataError, match="corpus is empty"):
        load_documents(config(tmp_path, [tmp_path / "blank.txt"]))
    with pytest.raises(DataError, match="matches no files"):
        load_documents(config(tmp_path, [tmp_path / "nothing*.txt"]))
    with pytest.raises(DataError, match="supported extensions"):
        (tmp_path / "x.docx").write_text("a")
        load_documents(config(tmp_path, [tmp_path / "x.docx"]))


# ---------------------------------------------------------------------------------------------- shipped data


@pytest.mark.parametrize("folder", ["pretrain", "tinystories"])
def test_shipped_files_match_their_source_note(folder):
    root = REPO_ROOT / "data" / folder
    note = (root / "SOURCE.md").read_text(encoding="utf-8")
    files = sorted(root.glob("*.txt"))
    assert files
    for path in files:
        data = path.read_bytes()
        assert b"\r" not in data and not data.startswith(b"\xef\xbb\xbf")
        data.decode("utf-8")
        assert hashlib.sha256(data).hexdigest() in note, f"{path.name}: sha256 not in SOURCE.md"
    assert sum(p.stat().st_size for p in (REPO_ROOT / "data").rglob("*") if p.is_file()) < 5_000_000


def test_default_corpus_has_documents_fit_for_nsp(tmp_path):
    splits = load_documents(DataConfig(cache_dir=str(tmp_path / "cache")))
    sentences = [len(split_sentences(text)) for text in splits.train["text"]]
    assert len(sentences) >= 100 and len(splits.validation) >= 2
    assert statistics.median(sentences) >= 50 and min(sentences) >= 10
    assert not any(re.search(r"gutenberg", text, flags=re.I) for text in splits.train["text"])

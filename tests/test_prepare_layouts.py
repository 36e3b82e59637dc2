"""`prepare` on the corpus layouts beyond blank-line text: one document per line and per top-level WikiText heading, with
the 1 MB reading chunks shrunk so that chunk cuts fall inside every shard's byte range, and row files (jsonl, csv,
parquet) with a text column. Each prepared folder must hold exactly the documents the in-memory reader finds
(`load_documents`), in order: each shard row carries the crc32 of its document's text.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _paragraphs(count: int) -> list[str]:
    lines = []
    for path in sorted((REPO / "data/pretrain").glob("*.txt")):
        lines += [
            line.strip() for line in path.read_text(encoding="utf-8").splitlines() if len(line.split()) > 3
        ]
    return lines[:count]


def _prepare_and_compare(
    tmp_path: Path,
    data_files: list[str],
    separator: str,
    text_column: str = "text",
    shard_size_mb: float = 0.02,
) -> dict:
    import yaml

    from kiln.config import build_config
    from pretrain.config import RunConfig
    from pretrain.data import load_documents
    from pretrain.data.prepare import prepare
    from pretrain.data.prepared import PreparedCorpus

    config = yaml.safe_load((REPO / "configs/pretrain/debug.yaml").read_text())
    config["data"].update(
        data_files=data_files,
        max_train_documents=None,
        document_separator=separator,
        text_column=text_column,
        validation_split_percentage=0,
        cache_dir=str(tmp_path / "cache"),
    )
    config["tokenizer"].update(input_sentence_size=500)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cfg = build_config(RunConfig, ["--config", str(path)])
    manifest = prepare(cfg, str(tmp_path / "out"), shard_size_mb=shard_size_mb, say=lambda *_: None)
    whole = load_documents(cfg.data).train["text"]
    rows = PreparedCorpus.open(str(tmp_path / "out")).dataset("train")
    assert len(rows) == len(whole) > 50, (len(rows), len(whole))
    assert rows["document_hash"] == [zlib.crc32(text.encode("utf-8")) for text in whole]
    return manifest


@pytest.fixture
def small_chunks(monkeypatch):
    """prepare's text reader with 2 kB chunks instead of 1 MB: every shard's range is read in many chunks."""
    from pretrain.data import prepare as prepare_module

    original = prepare_module.iter_text_chunks

    def chunked(path, start, end, separator, chunk_bytes=2048):
        return original(path, start, end, separator, chunk_bytes)

    monkeypatch.setattr(prepare_module, "iter_text_chunks", chunked)
    return chunked


def test_one_document_per_line_with_chunk_cuts_inside_each_range(tmp_path, small_chunks):
    corpus = tmp_path / "lines.txt"
    corpus.write_text("\n".join(_paragraphs(900)) + "\n", encoding="utf-8")
    manifest = _prepare_and_compare(tmp_path, [str(corpus)], "line")
    pieces = [piece for shard in manifest["shards"]["train"] for piece in shard["pieces"]]
    assert len(pieces) >= 4 and all(
        p["end"] - p["start"] > 2048 for p in pieces[:-1]
    )  # ranges of many chunks


def test_one_document_per_top_level_heading_with_chunk_cuts(tmp_path, small_chunks):
    paragraphs = _paragraphs(600)
    # WikiText's layout: " = Title = " starts an article, " = = Section = = " stays inside it
    sections = [
        f" = Chapter {n} = \n\n"
        + "\n\n".join(paragraphs[n * 6 : (n + 1) * 6])
        + "\n\n = = A section = = \n\n"
        + paragraphs[(n * 6 + 3) % len(paragraphs)]
        for n in range(100)
    ]
    corpus = tmp_path / "book.txt"
    corpus.write_text("\n\n".join(sections) + "\n", encoding="utf-8")
    _prepare_and_compare(tmp_path, [str(corpus)], "heading")


@pytest.mark.parametrize("suffix", ["jsonl", "csv", "parquet"])
def test_row_files_with_a_text_column(tmp_path, suffix):
    import pandas as pd

    rows = pd.DataFrame({"id": range(300), "body": _paragraphs(300)})
    files = []
    for part, frame in enumerate((rows.iloc[:120], rows.iloc[120:])):
        target = tmp_path / f"part{part}.{suffix}"
        if suffix == "jsonl":
            target.write_text(
                "".join(json.dumps(r) + "\n" for r in frame.to_dict("records")), encoding="utf-8"
            )
        elif suffix == "csv":
            frame.to_csv(target, index=False)
        else:
            frame.to_parquet(target)
        files.append(str(target))
    manifest = _prepare_and_compare(tmp_path, files, "blank_line", text_column="body")
    assert [s["name"] for s in manifest["sources"]["train"]] == [Path(f).name for f in files]

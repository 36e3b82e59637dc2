"""Prepare once, train many: `python -m pretrain.data prepare --config X --output DIR`.

Reads the corpus of a run config in bounded chunks, trains the tokenizer on a bounded, seeded sample of lines
(`tokenizer.input_sentence_size`), and writes the tokenized, sentence-split, document-indexed corpus as Arrow
shards with a manifest. Training then memory-maps the folder (`--data.prepared DIR`, see prepared.py).

The folder:
    tokenizer/                    the tokenizer (save_pretrained)
    plan.json                     settings, sources (names, sizes, sha256) and the pieces of each shard
    train-00000.arrow ...         Arrow IPC stream files (`datasets.Dataset.from_file` reads them): one row per
                                  document, `sentence_ids` (list of sentences, each a list of token ids; a decoder
                                  corpus has one "sentence" per document: its whole text) and `document_hash`
                                  (crc32 of the document text, which picks the held-out validation documents
                                  exactly as the in-memory path does)
    train-00000.json ...          one per finished shard: rows, sentences, tokens, bytes, sha256
    manifest.json                 written when every shard is done: plan + shards

How the work is cut: each plain-text file larger than `--shard_size_mb` is split into byte ranges of about that
size, smaller files are grouped until they reach it; each range or group is one shard. A range starts at the first
document boundary at or after its start offset (a blank line for `blank_line`, any line for `line`, a top-level
heading for `heading`) and ends where the next range starts, so no document is cut and the documents of all shards
in order are exactly the documents of the corpus read whole. Inside a range the text is read in chunks of about
1 MB, cut at boundaries the same way: memory stays flat whatever the size of a file. Compressed text and
json/jsonl/csv/parquet files are one piece each (streamed); `file` and literal separators keep a file whole.

Parallel (`--num_proc`: processes over shards), resumable (a shard is written under a temporary name and renamed
when complete, then its .json; a prepare killed at any point and run again keeps the finished shards and redoes
only the rest, byte for byte the same) and splittable across machines (`--shard i/n` prepares the shards whose
number is i modulo n; every machine trains the same tokenizer from the same seeded sample; whichever finishes
last on a shared folder writes manifest.json, and on node-local disks copy the shards together: the loader merges
the per-shard .json files when manifest.json is missing).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import shutil
import signal
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from kiln.public import public_file_names

from .common import DataError
from .corpus import (
    _ANY_HEADING,
    _TOP_HEADING,
    COMPRESSED,
    DOCUMENT_MODES,
    SENTENCE_MODES,
    not_utf8_error,
    resolve_data_files,
    split_documents,
    split_sentences,
)
from .tokenizer import KIND_FOR_MODEL, check_special_tokens, load_tokenizer, train_tokenizer

if TYPE_CHECKING:
    from ..config import RunConfig

logger = logging.getLogger(__name__)

FORMAT = "kiln-prepared-corpus"
VERSION = 1
MANIFEST, PLAN = "manifest.json", "plan.json"
CHUNK_BYTES = 1 << 20  # text per record batch: bounds a worker's memory
SAMPLE_WINDOW_BYTES = 1 << 14  # tokenizer sample: bytes read at each random place
SAMPLE_LINES_PER_WINDOW = 32
SPLITTABLE_MODES = ("blank_line", "line", "heading")


# ----------------------------------------------------------------------------------------------------------
# sources


@dataclass
class Source:
    """One input file. `name` is what the manifest records (never an absolute path); `path` is where it is."""

    name: str
    path: str
    bytes: int
    kind: (
        str  # "text" (plain, seekable), "compressed" (text through a decompressor), "rows" (json/csv/parquet)
    )
    sha256: str = ""

    def record(self) -> dict:
        return {"name": self.name, "bytes": self.bytes, "sha256": self.sha256}


def resolve_sources(cfg_data, option: str = "data.data_files") -> list[Source]:
    patterns = cfg_data.data_files if option == "data.data_files" else cfg_data.validation_files
    builder, files = resolve_data_files(patterns, option)
    if any("://" in f for f in files):
        raise DataError(f"{option}: prepare reads local files; download remote ones first")
    names = _display_names(files)
    sources = []
    for path, name in zip(files, names):
        suffix = Path(path).suffix.lower()
        if builder != "text":
            kind = "rows"
        elif suffix in COMPRESSED:
            if COMPRESSED[suffix] is None:
                raise DataError(f"{path}: prepare cannot stream {suffix} files; decompress it first")
            kind = "compressed"
        else:
            kind = "text"
        sources.append(Source(name, path, os.path.getsize(path), kind))
    return sources


def _display_names(files: list[str]) -> list[str]:
    """What the manifest calls the files: their file names, never where they lie (`kiln.public.public_file_names`:
    a prepared folder, and the fingerprints and model cards made from it, may be published)."""
    return public_file_names(files)


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


# ----------------------------------------------------------------------------------------------------------
# reading text in bounded chunks cut at document boundaries


def _boundary_test(separator: str):
    """A predicate on a raw line (bytes): True when a document boundary may be placed before it. It only has to
    be sound (every line it accepts really separates documents), not complete."""
    if separator == "blank_line":
        return lambda line: not line.strip()
    if separator == "line":
        return lambda line: True
    if separator == "heading":
        return lambda line: (
            line.lstrip().startswith(b"=")
            and bool(_TOP_HEADING.match(line.decode("utf-8", "replace").rstrip("\r\n")))
        )
    return None


def _decode(raw: bytes, path: str) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise not_utf8_error(path) from None
    if "\r" in text:  # universal newlines, as `datasets` reads text files
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def iter_text_chunks(path: str, start: int, end: int, separator: str, chunk_bytes: int = CHUNK_BYTES):
    """Texts of about chunk_bytes from the byte range [start, end) of a plain text file, cut at boundaries.

    The range begins at the first boundary line starting at or after `start` (the file start for 0) and stops
    before the first boundary line starting at or after `end`, so consecutive ranges share no document.
    """
    boundary = _boundary_test(separator)
    with open(path, "rb") as f:
        pos = start
        if start > 0:
            f.seek(start - 1)
            if f.read(1) != b"\n":
                pos += len(f.readline())  # to the next line start
            while True:  # to the next boundary line
                line = f.readline()
                if not line:
                    return
                if boundary(line):
                    break
                pos += len(line)
            if pos >= end:  # the next range's first boundary: nothing starts in this one
                return
            buffer, size = [line], len(line)
            pos += len(line)
        else:
            buffer, size = [], 0
        for line in f:
            if boundary(line):
                if pos >= end:
                    break
                if size >= chunk_bytes:
                    yield _decode(b"".join(buffer), path)
                    buffer, size = [], 0
            buffer.append(line)
            size += len(line)
            pos += len(line)
        if buffer:
            yield _decode(b"".join(buffer), path)


def _iter_compressed_chunks(path: str, separator: str, chunk_bytes: int = CHUNK_BYTES):
    boundary = _boundary_test(separator)
    opener = COMPRESSED[Path(path).suffix.lower()]
    with opener(path, "rb") as f:
        if boundary is None:
            yield _decode(f.read(), path)
            return
        buffer, size = [], 0
        for line in f:
            if size >= chunk_bytes and boundary(line):
                yield _decode(b"".join(buffer), path)
                buffer, size = [], 0
            buffer.append(line)
            size += len(line)
        if buffer:
            yield _decode(b"".join(buffer), path)


def _iter_row_documents(path: str, text_column: str, separator: str) -> Iterator[list[str]]:
    """Documents of a json/csv/parquet file, streamed through `datasets`, per batch of rows."""
    from .corpus import _builder_for, _documents_batch, _load

    builder = _builder_for(path, "data.data_files")
    stream = _load(
        builder,
        True,
        f"{builder} file {path}",
        "Check that the file is well-formed",
        data_files=[path],
        split="train",
    )
    batch: list = []
    for row in stream:
        if text_column not in row:
            raise DataError(
                f"column {text_column!r} not found in {path}; set --data.text_column to one of {list(row)}"
            )
        batch.append(row[text_column])
        if len(batch) == 1000:
            yield _documents_batch({"text": batch}, "text", separator, separator == "heading")["text"]
            batch = []
    if batch:
        yield _documents_batch({"text": batch}, "text", separator, separator == "heading")["text"]


def iter_piece_documents(source: Source, start: int, end: int, separator: str, text_column: str):
    """Lists of documents (strings) of one piece of a source, in order, a chunk at a time."""
    if source.kind == "rows":
        yield from _iter_row_documents(source.path, text_column, separator)
        return
    if source.kind == "compressed":
        chunks = _iter_compressed_chunks(source.path, separator)
    elif _boundary_test(separator) is None:  # `file` or a literal separator: the file is read whole
        with open(source.path, "rb") as f:
            chunks = iter([_decode(f.read(), source.path)])
    else:
        chunks = iter_text_chunks(source.path, start, end, separator)
    for text in chunks:
        yield split_documents(text, separator)


def plan_pieces(sources: list[Source], shard_bytes: int, separator: str) -> list[list[list[int]]]:
    """Shards as lists of pieces [source index, start, end]: large plain text files split into ranges, small
    files grouped until they reach shard_bytes. Depends on the sources and shard_bytes only."""
    splittable = separator in SPLITTABLE_MODES
    shards, group, group_bytes = [], [], 0
    for i, source in enumerate(sources):
        if source.kind == "text" and splittable and source.bytes > shard_bytes:
            if group:
                shards.append(group)
                group, group_bytes = [], 0
            count = math.ceil(source.bytes / shard_bytes)
            cuts = [source.bytes * k // count for k in range(count + 1)]
            shards += [[[i, cuts[k], cuts[k + 1]]] for k in range(count)]
            continue
        group.append([i, 0, source.bytes])
        group_bytes += source.bytes
        if group_bytes >= shard_bytes:
            shards.append(group)
            group, group_bytes = [], 0
    if group:
        shards.append(group)
    return shards


# ----------------------------------------------------------------------------------------------------------
# tokenizing


class TokenEncoder:
    """Token ids of texts (no special tokens), as `tokenizer(texts, add_special_tokens=False)` gives them.

    For a BERT-style WordPiece tokenizer (BertNormalizer, BertPreTokenizer) the ids of a text are the ids of its
    space-separated pieces one after the other: the normaliser works character by character (combining accents
    stay with their letter, which a space never separates), the pre-tokeniser splits at every space, and no added
    token contains a space. So each distinct piece ("Hello," or "“Well") is tokenized once by the Rust tokenizer
    and cached: natural text repeats its pieces, and a dictionary look-up is several times faster than the whole
    Rust pipeline on every sentence. Other tokenizers (byte-level BPE, where a space belongs to the next token)
    tokenize whole texts. tests/test_data_prepare.py checks that both give the same ids.
    """

    CACHE_LIMIT = 500_000  # distinct pieces (a few hundred bytes each, all told): bounds a worker's memory

    def __init__(self, tokenizer):
        from tokenizers import Tokenizer

        # a copy without the truncation and padding a tokenizer.json may carry (the Rust backend applies them to
        # every call), as `tokenizer(texts)` encodes: a document is never cut, nor padded
        self.backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
        self.backend.no_truncation()
        self.backend.no_padding()
        state = json.loads(self.backend.to_str())
        normalizer = state.get("normalizer") or {}
        pre = state.get("pre_tokenizer") or {}
        added = [token["content"] for token in state.get("added_tokens", [])]
        self.piece_cache_usable = (
            normalizer.get("type") == "BertNormalizer"
            and pre.get("type") == "BertPreTokenizer"
            and not any(c.isspace() for token in added for c in token)
        )
        self._reset()

    def _reset(self) -> None:
        # piece -> number; piece number k holds tokens[starts[k] : starts[k] + lengths[k]]
        self.cache: dict[str, int] = {}
        self.tokens = np.zeros(1 << 16, dtype=np.int64)
        self.starts = np.zeros(1 << 12, dtype=np.int64)
        self.lengths = np.zeros(1 << 12, dtype=np.int64)
        self.used = 0

    def _add(self, pieces: list[str]) -> None:
        ids = self._rust(pieces)
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
        first = len(self.cache)
        count = first + len(pieces)
        if count > len(self.starts):
            size = max(count, 2 * len(self.starts))
            self.starts, self.lengths = np.resize(self.starts, size), np.resize(self.lengths, size)
        if self.used + len(flat) > len(self.tokens):
            self.tokens = np.resize(self.tokens, max(self.used + len(flat), 2 * len(self.tokens)))
        self.starts[first:count] = self.used + np.concatenate([[0], np.cumsum(lengths)[:-1]])
        self.lengths[first:count] = lengths
        self.tokens[self.used : self.used + len(flat)] = flat
        self.used += len(flat)
        self.cache.update(zip(pieces, range(first, count)))

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(token ids of all texts one after the other, tokens per text)."""
        if not self.piece_cache_usable:
            ids = self._rust(texts)
            lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
            return np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum())), lengths
        if not texts:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        pieces = " ".join(texts).split(" ")  # the pieces of every text in order
        per_text = np.fromiter((text.count(" ") + 1 for text in texts), dtype=np.int64, count=len(texts))
        distinct = set(pieces)
        new = distinct.difference(self.cache)
        if new:
            if len(self.cache) + len(new) > self.CACHE_LIMIT:
                # full: start again with every piece of this batch (the ones already cached included, since
                # the look-ups below need them all); a batch larger than the limit is cached whole, then dropped
                self._reset()
                new = distinct
            self._add(list(new))
        numbers = np.fromiter(map(self.cache.__getitem__, pieces), dtype=np.int64, count=len(pieces))
        lengths, starts = self.lengths[numbers], self.starts[numbers]
        total = int(lengths.sum())
        # token i of the output is tokens[start of its piece + its position in the piece]
        piece_of_token = np.repeat(np.arange(len(numbers)), lengths)
        first_token = np.cumsum(lengths) - lengths
        flat = self.tokens[starts[piece_of_token] + np.arange(total) - first_token[piece_of_token]]
        piece_ends = np.cumsum(per_text)
        text_token_ends = np.concatenate([[0], np.cumsum(lengths)])[piece_ends]
        return flat, np.diff(np.concatenate([[0], text_token_ends]))

    def encode(self, texts: list[str]) -> list[list[int]]:
        flat, lengths = self.encode_flat(texts)
        ends = np.cumsum(lengths)
        return [flat[end - length : end].tolist() for end, length in zip(ends.tolist(), lengths.tolist())]

    def _rust(self, texts: list[str]) -> list[list[int]]:
        return [encoding.ids for encoding in self.backend.encode_batch_fast(texts, add_special_tokens=False)]


def _token_type(vocab_size: int):
    return (np.uint16, pa.uint16()) if vocab_size <= 1 << 16 else (np.int32, pa.int32())


def shard_schema(vocab_size: int) -> pa.Schema:
    value = _token_type(vocab_size)[1]
    return pa.schema([("sentence_ids", pa.list_(pa.list_(value))), ("document_hash", pa.uint32())])


def documents_record_batch(
    documents: list[str], encoder: TokenEncoder, sentence_split: str | None, vocab_size: int
) -> pa.RecordBatch:
    """One record batch: per document its non-empty sentences' token ids (sentence_split None: the whole
    document as one sentence, for the decoder) and the crc32 of its text."""
    if sentence_split is None:
        per_doc = [[doc] for doc in documents]
    else:
        per_doc = [split_sentences(doc, sentence_split) for doc in documents]
    flat = [s for sentences in per_doc for s in sentences]
    values, lengths = encoder.encode_flat(flat)
    # empty sentences (nothing but characters the tokenizer drops) are left out, as the in-memory path does
    sentences_per_doc = np.fromiter(map(len, per_doc), dtype=np.int64, count=len(per_doc))
    kept = lengths > 0
    doc_of_sentence = np.repeat(np.arange(len(per_doc)), sentences_per_doc)
    kept_per_doc = np.bincount(doc_of_sentence[kept], minlength=len(per_doc))
    sentence_offsets = np.concatenate([[0], np.cumsum(lengths[kept])])
    document_offsets = np.concatenate([[0], np.cumsum(kept_per_doc)])
    dtype, arrow_type = _token_type(vocab_size)
    inner = pa.ListArray.from_arrays(
        pa.array(sentence_offsets.astype(np.int32)), pa.array(values.astype(dtype), arrow_type)
    )
    outer = pa.ListArray.from_arrays(pa.array(document_offsets.astype(np.int32)), inner)
    hashes = pa.array(np.asarray([zlib.crc32(doc.encode("utf-8")) for doc in documents], dtype=np.uint32))
    return pa.RecordBatch.from_arrays([outer, hashes], schema=shard_schema(vocab_size))


# ----------------------------------------------------------------------------------------------------------
# the tokenizer sample


def sample_lines(sources: list[Source], limit: int, seed: int, separator: str, text_column: str) -> list[str]:
    """At most `limit` non-blank lines (0: all), drawn at seeded random places of the corpus.

    Plain text: windows of SAMPLE_WINDOW_BYTES at offsets drawn uniformly over all bytes, SAMPLE_LINES_PER_WINDOW
    whole lines from each; when the windows would cover the corpus anyway, every line is read and a seeded subset
    kept. Compressed and json/csv/parquet files cannot be read at random places: their first lines are used, in
    proportion to their size.
    """
    rng = random.Random(f"tokenizer-sample:{seed}")
    total = sum(s.bytes for s in sources) or 1
    windows = math.ceil(limit / SAMPLE_LINES_PER_WINDOW) if limit > 0 else 0
    if limit <= 0 or windows * SAMPLE_WINDOW_BYTES >= total:
        lines = [line for source in sources for line in _all_lines(source, separator, text_column)]
        if 0 < limit < len(lines):
            keep = sorted(rng.sample(range(len(lines)), limit))
            lines = [lines[i] for i in keep]
        return lines
    lines: list[str] = []
    text_sources = [s for s in sources if s.kind == "text"]
    text_bytes = sum(s.bytes for s in text_sources)
    if text_bytes:
        offsets = sorted(rng.randrange(text_bytes) for _ in range(windows))
        starts = np.cumsum([0] + [s.bytes for s in text_sources])
        for offset in offsets:
            index = int(np.searchsorted(starts, offset, side="right")) - 1
            lines += _window_lines(text_sources[index], offset - int(starts[index]))
    for source in sources:
        if source.kind != "text":
            share = math.ceil(limit * source.bytes / total)
            for n, line in enumerate(_all_lines(source, separator, text_column)):
                if n >= share:
                    break
                lines.append(line)
    return lines[:limit]


def _window_lines(source: Source, offset: int) -> list[str]:
    with open(source.path, "rb") as f:
        f.seek(offset)
        raw = f.read(SAMPLE_WINDOW_BYTES)
    if offset > 0:
        raw = raw[raw.find(b"\n") + 1 :] if b"\n" in raw else b""
    if len(raw) == SAMPLE_WINDOW_BYTES or offset + len(raw) < source.bytes:
        raw = raw[: raw.rfind(b"\n") + 1]  # whole lines only
    text = raw.decode("utf-8", errors="ignore")
    lines = [line.strip() for line in text.split("\n")]
    return [line for line in lines if line and not _ANY_HEADING.match(line)][:SAMPLE_LINES_PER_WINDOW]


def _all_lines(source: Source, separator: str, text_column: str) -> Iterator[str]:
    for documents in iter_piece_documents(source, 0, source.bytes, separator, text_column):
        for doc in documents:
            yield from (line for line in doc.split("\n") if line)


# ----------------------------------------------------------------------------------------------------------
# the folder


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def fingerprint(data) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def tokenizer_fingerprint(tokenizer) -> str:
    return fingerprint([tokenizer.backend_tokenizer.to_str(), tokenizer.all_special_tokens])


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}"


def _settings(cfg: RunConfig, shard_bytes: int) -> dict:
    """What the shards' content depends on (besides the sources and the tokenizer itself)."""
    tok = cfg.tokenizer
    return {
        "model_kind": cfg.model.kind,
        "document_separator": cfg.data.document_separator,
        "sentence_split": cfg.data.sentence_split if cfg.model.kind == "encoder" else "document",
        "text_column": cfg.data.text_column,
        "shard_bytes": shard_bytes,
        "tokenizer": {
            "kind": KIND_FOR_MODEL[cfg.model.kind],
            "name_or_path": bool(tok.name_or_path),  # given (not trained here); its fingerprint names it
            "vocab_size": tok.vocab_size,
            "lowercase": tok.lowercase,
            "min_frequency": tok.min_frequency,
            "input_sentence_size": tok.input_sentence_size,
            "seed": cfg.training.seed,
        },
    }


@dataclass
class _Task:
    split: str
    index: int
    pieces: list[list[int]]


def _run_task(folder: str, task: _Task, sources: list[Source], settings: dict) -> dict:
    """Write one shard (temporary name, renamed when complete) and its .json; returns the .json's content."""
    encoder = _worker_encoder(folder)
    vocab_size = len(_WORKER["tokenizer"])
    name = shard_name(task.split, task.index)
    final = Path(folder) / f"{name}.arrow"
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    split_mode = None if settings["sentence_split"] == "document" else settings["sentence_split"]
    rows = sentences = tokens = text_bytes = 0
    with open(tmp, "wb") as sink:  # open(): the file follows the umask
        writer = pa.ipc.new_stream(sink, shard_schema(vocab_size))
        for source_index, start, end in task.pieces:
            source = sources[source_index]
            for documents in iter_piece_documents(
                source, start, end, settings["document_separator"], settings["text_column"]
            ):
                if not documents:
                    continue
                batch = documents_record_batch(documents, encoder, split_mode, vocab_size)
                writer.write_batch(batch)
                rows += batch.num_rows
                sentences += len(batch.column(0).values)
                tokens += len(batch.column(0).values.values)
                text_bytes += sum(len(d.encode("utf-8")) for d in documents)
        writer.close()
        sink.flush()
        os.fsync(sink.fileno())
    os.replace(tmp, final)
    record = {
        "file": final.name,
        "rows": rows,
        "sentences": sentences,
        "tokens": tokens,
        "document_bytes": text_bytes,
        "bytes": final.stat().st_size,
        "sha256": file_sha256(str(final)),
        "pieces": [{"source": s, "start": a, "end": b} for s, a, b in task.pieces],
    }
    _write_json(final.with_suffix(".json"), record)
    return record


_WORKER: dict = {}


def _worker_encoder(folder: str) -> TokenEncoder:
    if _WORKER.get("folder") != folder:
        tokenizer = load_saved_tokenizer(Path(folder) / "tokenizer")
        _WORKER.update(folder=folder, tokenizer=tokenizer, encoder=TokenEncoder(tokenizer))
    return _WORKER["encoder"]


def _one_thread_worker() -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    # Ctrl-C reaches the whole process group: the main process alone answers it (one line, the workers stopped);
    # the main process ends its workers with SIGTERM, which must end them silently, not through the handler the
    # command installed in the main process before they were forked
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _run_task_star(args):
    return _run_task(*args)


def _done(folder: Path, task: _Task) -> bool:
    name = shard_name(task.split, task.index)
    sidecar, shard = folder / f"{name}.json", folder / f"{name}.arrow"
    if not (sidecar.is_file() and shard.is_file()):
        return False
    try:
        return json.loads(sidecar.read_text())["bytes"] == shard.stat().st_size
    except (ValueError, KeyError):
        return False


def prepare(
    cfg: RunConfig,
    output: str,
    num_proc: int = 1,
    shard: tuple[int, int] = (0, 1),
    shard_size_mb: float = 16,
    say=print,
) -> dict | None:
    """Prepare the corpus of `cfg` into `output`; returns the manifest (None while other --shard parts are
    missing). See the module docstring."""
    data = cfg.data
    kind = cfg.model.kind
    if kind not in KIND_FOR_MODEL:
        raise DataError(f"--model.kind={kind!r}: choose 'encoder' or 'decoder'")
    if data.dataset_name:
        raise DataError(
            "prepare reads local files (--data.data_files); export the Hub dataset to parquet first"
        )
    if not data.document_separator:
        raise DataError(
            f"--data.document_separator is empty: use one of {', '.join(DOCUMENT_MODES)} or a literal string"
        )
    if data.sentence_split not in SENTENCE_MODES:
        raise DataError(
            f"--data.sentence_split={data.sentence_split!r}: choose one of {', '.join(SENTENCE_MODES)}"
        )
    index, count = shard
    if not (count >= 1 and 0 <= index < count):
        raise DataError(f"--shard {index}/{count}: use i/n with 0 <= i < n")
    if num_proc < 1:
        raise DataError(f"--num_proc {num_proc}: use 1 or more processes")
    if cfg.tokenizer.input_sentence_size < 0:
        raise DataError(
            f"--tokenizer.input_sentence_size={cfg.tokenizer.input_sentence_size}: use 0 (all) or more"
        )
    shard_bytes = max(int(shard_size_mb * (1 << 20)), 1)
    clock = _PhaseClock()
    # --num_proc is the number of cores used: also for the tokenizer training's Rust threads (read at their start)
    os.environ.setdefault("RAYON_NUM_THREADS", str(num_proc))
    folder = Path(output)
    folder.mkdir(parents=True, exist_ok=True)

    splits = {"train": resolve_sources(data)}
    if data.validation_files:
        splits["validation"] = resolve_sources(data, "data.validation_files")
    settings = _settings(cfg, shard_bytes)
    previous = json.loads((folder / PLAN).read_text()) if (folder / PLAN).is_file() else None
    if previous is not None and previous.get("settings") != settings:
        field, old, new = _first_difference(previous.get("settings", {}), settings)
        raise DataError(
            f"{output} holds a prepare with {field}={old!r} but this one has {new!r}; use another --output or "
            "delete that folder"
        )
    all_sources = [s for sources in splits.values() for s in sources]

    lock = _lock_part(folder, index, count)
    pool = None
    if num_proc > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # forked before any tokenizer work (a fork executor starts all its workers at the first submit), so the
        # workers start without Rust threads; each uses one core, while this process trains the tokenizer on
        # num_proc threads (the workers hash the files meanwhile). An executor rather than multiprocessing.Pool:
        # a worker killed outright (the out-of-memory killer) breaks it with an error, where a Pool would replace
        # the worker and wait forever for the lost shard
        pool = ProcessPoolExecutor(
            num_proc, mp_context=multiprocessing.get_context("fork"), initializer=_one_thread_worker
        )
    try:
        clock.lap("start")
        hashing = [pool.submit(file_sha256, s.path) for s in all_sources] if pool else None
        tokenizer = _prepare_tokenizer(cfg, splits["train"], folder, num_proc, say, clock)
        hashes = [h.result() for h in hashing] if hashing else [file_sha256(s.path) for s in all_sources]
        clock.lap("hashes")
        for source, digest in zip(all_sources, hashes):
            source.sha256 = digest
        tasks = [
            _Task(split, i, pieces)
            for split, sources in splits.items()
            for i, pieces in enumerate(plan_pieces(sources, shard_bytes, data.document_separator))
        ]
        plan = {
            "format": FORMAT,
            "version": VERSION,
            "settings": settings,
            "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
            "sources": {split: [s.record() for s in sources] for split, sources in splits.items()},
            "shards": {
                split: [shard_name(split, t.index) for t in tasks if t.split == split] for split in splits
            },
        }
        plan["settings_fingerprint"] = fingerprint(
            {k: plan[k] for k in ("settings", "tokenizer_fingerprint", "sources")}
        )
        if previous is not None and previous != plan:
            field, old, new = _first_difference(previous, plan)
            raise DataError(
                f"{output} holds a prepare of other data ({field}: {old!r} there, {new!r} now); use another "
                "--output or delete that folder"
            )
        _write_json(folder / PLAN, plan)
        mine = [t for number, t in enumerate(tasks) if number % count == index]
        todo = [t for t in mine if not _done(folder, t)]
        say(
            f"prepare: {len(tasks)} shards in all, {len(mine)} for this part ({index}/{count}), "
            f"{len(mine) - len(todo)} already done; {num_proc} process(es)"
        )
        _remove_stale_temporaries(folder, todo)
        arguments = [(str(folder), t, splits[t.split], settings) for t in todo]
        results = pool.map(_run_task_star, arguments) if pool else map(_run_task_star, arguments)
        # on a terminal a bar with its ETA (shards are of one size, so their count measures the work); in a log,
        # a line per shard
        bar = _shard_bar(len(todo))
        tokens = 0
        for n, record in enumerate(results, 1):
            tokens += record["tokens"]
            if bar is None:
                say(
                    f"prepare: {record['file']} ({record['rows']:,} documents, {record['tokens']:,} tokens) "
                    f"[{n}/{len(todo)}]"
                )
            else:
                bar.update(1)
                bar.set_postfix_str(f"{tokens:,} tokens", refresh=False)
        if bar is not None:
            bar.close()
        clock.lap("shards")
    except BaseException:
        if (
            pool is not None
        ):  # stop the workers now: an interrupted or failed prepare leaves no process behind
            for process in list((getattr(pool, "_processes", None) or {}).values()):
                process.terminate()
            pool.shutdown(wait=True, cancel_futures=True)
            pool = None
        raise
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
        Path(lock.name).unlink(missing_ok=True)  # no lock file left in the prepared folder
        lock.close()  # closing the descriptor releases the lock
    manifest = write_manifest(folder, say)
    clock.lap("manifest")
    say(f"prepare: seconds per phase: {clock}")
    return manifest


def _shard_bar(total: int):
    """A progress bar over the shards to write, or None where it cannot draw (not a terminal: a pipe, a log file)."""
    import sys

    if not total or not sys.stderr.isatty():
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="prepare", unit="shard", dynamic_ncols=True)


def _lock_part(folder: Path, index: int, count: int):
    """Hold the lock of part index/count of `folder` for this prepare: a second prepare of the same part into the
    same folder is stopped with one line (other --shard parts may run beside it: they write other shards)."""
    import fcntl

    path = folder / f".prepare-{index}-of-{count}.lock"
    handle = open(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (
        BlockingIOError
    ):  # held: as kiln/run_setup.py's output-folder lock tells a held lock from a missing one
        handle.seek(0)
        holder = handle.read().strip() or "?"
        handle.close()
        raise DataError(
            f"another prepare (PID {holder}) is writing part {index}/{count} of {folder}; wait for it to finish "
            "(or stop it), or prepare into another --output"
        ) from None
    except (
        OSError
    ):  # a file system without flock (some network mounts): prepare unguarded, as training runs do
        return handle
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def stopped_message(err: BaseException, folder) -> str | None:
    """The one line a prepare that failed with `err` ends with, for the failures a user can meet (None: another
    failure, a bug to see whole)."""
    import errno
    from concurrent.futures.process import BrokenProcessPool

    resume = "finished shards are kept: run the same command again to continue"
    if isinstance(err, KeyboardInterrupt):
        return f"prepare: interrupted; {resume}"
    if isinstance(err, BrokenProcessPool):
        return (
            f"prepare: a worker process was killed (out of memory? try fewer --num_proc or a smaller "
            f"--shard_size_mb); {resume}"
        )
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"prepare: no space left on the device of {folder} ({err.strerror}); free some space or prepare "
            f"into another --output; {resume}"
        )
    return None


class _PhaseClock:
    """Wall-clock seconds of prepare's phases, for its log (and bench/data_scale.py): what runs serially and
    what in parallel (`start`: from the call to the worker pool started)."""

    def __init__(self):
        self.laps: dict[str, float] = {}
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = self.laps.get(name, 0.0) + now - self.last
        self.last = now

    def __str__(self) -> str:
        return ", ".join(f"{name} {seconds:.2f}" for name, seconds in self.laps.items())


def _remove_stale_temporaries(folder: Path, todo: list[_Task]) -> None:
    """Half-written shards of a killed prepare, among the shards this part is about to write (other --shard
    parts may be writing theirs in the same folder)."""
    for task in todo:
        for stale in folder.glob(f".{shard_name(task.split, task.index)}.arrow.tmp-*"):
            stale.unlink(missing_ok=True)


def _first_difference(old, new, prefix: str = "") -> tuple[str, object, object]:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                return _first_difference(old.get(key), new.get(key), f"{prefix}{key}.")
    return prefix.rstrip(".") or "settings", old, new


def _prepare_tokenizer(cfg: RunConfig, sources: list[Source], folder: Path, num_proc: int, say, clock=None):
    clock = clock or _PhaseClock()
    kind = cfg.model.kind
    target = folder / "tokenizer"
    if (target / "tokenizer.json").is_file():  # a resumed prepare: the plan check compares its fingerprint
        tokenizer = load_saved_tokenizer(target)
    elif cfg.tokenizer.name_or_path:
        tokenizer = load_tokenizer(cfg.tokenizer.name_or_path)
        _save_tokenizer(tokenizer, target)
    else:
        lines = sample_lines(
            sources,
            cfg.tokenizer.input_sentence_size,
            cfg.training.seed,
            cfg.data.document_separator,
            cfg.data.text_column,
        )
        clock.lap("sample")
        if not lines:
            raise DataError(f"the corpus is empty: no text in {', '.join(s.name for s in sources)}; add text")
        say(
            f"prepare: training a {KIND_FOR_MODEL[kind]} tokenizer (vocab {cfg.tokenizer.vocab_size}) on "
            f"{len(lines):,} sampled lines ({sum(map(len, lines)) / 1e6:.1f} MB)"
        )
        tokenizer = train_tokenizer(
            lines,
            kind=KIND_FOR_MODEL[kind],
            vocab_size=cfg.tokenizer.vocab_size,
            lowercase=cfg.tokenizer.lowercase,
            min_frequency=cfg.tokenizer.min_frequency,
            model_max_length=cfg.data.max_seq_length,
            mask_token=kind == "decoder" and cfg.model.objective == "clm+mntp",
        )
        _save_tokenizer(tokenizer, target)
        tokenizer = load_saved_tokenizer(target)
        clock.lap("tokenizer")
    check_special_tokens(tokenizer, kind, cfg.model.objective)
    return tokenizer


def load_saved_tokenizer(folder: Path):
    """The tokenizer prepare saved in `folder`, as load_tokenizer gives it. When its class is the generic fast
    tokenizer (always, for one trained here) it is loaded through that class, as AutoTokenizer would pick it:
    AutoTokenizer imports torch, seconds that prepare and every worker process would spend before any work."""
    config = json.loads((folder / "tokenizer_config.json").read_text())
    if (
        config.get("tokenizer_class") not in ("TokenizersBackend", "PreTrainedTokenizerFast")
        or "auto_map" in config
    ):
        return load_tokenizer(str(folder))
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(folder))


def _save_tokenizer(tokenizer, target: Path) -> None:
    """Saved into a fresh folder beside `target` (a name no one chose: nothing stands in it to write through) and
    renamed into place; never over a link at `target`."""
    import tempfile

    from kiln.safe_write import STAGING_SUFFIX, refuse_link

    refuse_link(target)
    # no leftover cleared by name: other --shard parts may be saving beside this one
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=STAGING_SUFFIX, dir=target.parent))
    try:
        tokenizer.save_pretrained(tmp)
        refuse_link(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        os.rename(tmp, target)  # onto an existing, non-empty folder: refused by the system, not merged
    except OSError:  # another --shard part saved the same tokenizer first
        shutil.rmtree(tmp, ignore_errors=True)


def write_manifest(folder: Path, say=print) -> dict | None:
    """manifest.json from plan.json and every shard's .json, once all are there (None and a note otherwise)."""
    manifest = merged_manifest(folder)
    if isinstance(manifest, list):
        say(
            f"prepare: {len(manifest)} shard(s) still missing (e.g. {manifest[0]}); the other --shard parts write "
            "them, and the last one to finish writes manifest.json"
        )
        return None
    _write_json(folder / MANIFEST, manifest)
    totals = manifest["totals"]
    say(
        f"prepare: wrote {folder / MANIFEST}: {totals['documents']:,} documents, {totals['tokens']:,} tokens in "
        f"{totals['shards']} shards ({totals['bytes'] / 1e6:.1f} MB)"
    )
    return manifest


def merged_manifest(folder: Path) -> dict | list[str]:
    """The manifest of a folder whose shards are all done, or the names of the missing shards."""
    plan = json.loads((folder / PLAN).read_text())
    shards, missing = {}, []
    for split, names in plan["shards"].items():
        shards[split] = []
        for name in names:
            sidecar = folder / f"{name}.json"
            if not sidecar.is_file() or not (folder / f"{name}.arrow").is_file():
                missing.append(name)
                continue
            shards[split].append(json.loads(sidecar.read_text()))
    if missing:
        return missing
    every = [s for records in shards.values() for s in records]
    totals = {
        "shards": len(every),
        "documents": sum(s["rows"] for s in every),
        "sentences": sum(s["sentences"] for s in every),
        "tokens": sum(s["tokens"] for s in every),
        "bytes": sum(s["bytes"] for s in every),
    }
    return {**{k: v for k, v in plan.items() if k != "shards"}, "shards": shards, "totals": totals}


__all__ = [
    "FORMAT",
    "MANIFEST",
    "TokenEncoder",
    "documents_record_batch",
    "iter_text_chunks",
    "merged_manifest",
    "plan_pieces",
    "prepare",
    "sample_lines",
    "stopped_message",
    "tokenizer_fingerprint",
]

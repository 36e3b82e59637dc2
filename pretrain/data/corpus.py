"""Corpus reading: a Hub dataset, local files or the shipped sample, turned into one row per document.

Sources, all through `datasets`:
- `data.dataset_name` (+ `dataset_config`, `dataset_split`, `text_column`): `load_dataset(name, config)`; its
  `validation` split is used when it has one.
- `data.data_files`: txt (also .gz/.bz2/.xz/.zst), json/jsonl, csv, parquet; globs; relative paths are taken from
  the repo root. Text files are read whole (one row per file), so shard corpora larger than memory into files.

Documents (`data.document_separator`), applied to the text of each file (txt) or of each row (other sources):
- `blank_line`: a blank or whitespace-only line ends a document. WikiText headings (` = Title = `,
  ` = = Section = = `) also end one and are dropped.
- `heading`: WikiText articles: a top-level ` = Title = ` line starts a new document; blank lines and
  sub-headings inside an article are dropped. Rows are joined first (per map batch), so Hub datasets with one
  line per row (`wikitext`) work.
- `line`: each non-empty line is a document.
- `file`: each file (or row) is a document.
- any other string is a literal separator, e.g. `<|endoftext|>`.

Sentences (`data.sentence_split`):
- `rule`: a sentence ends at `.`, `!`, `?` or `…` (with any closing quotes or brackets) followed by whitespace and
  an uppercase letter (optionally after an opening quote or bracket), unless a single `.` follows a known
  abbreviation (Mr, Dr, St, Jan, ...) or a single letter (initials, "H. G. Wells"). Newlines count as spaces, so
  hard-wrapped text works; the rule needs cased text (use `line` for lowercased corpora).
- `line`: each non-empty line of a document is a sentence.

Validation documents: `data.validation_files`, else the Hub dataset's `validation` split, else a held-out share
chosen by a hash of the document text (stable across runs and machines; duplicates land on the same side).
In-memory: the round(n * validation_split_percentage / 100) documents with the smallest hashes (at least 2, so
validation NSP pairs can be formed, and at most n - 1).
Streaming: every document whose hash falls below the percentage.
"""

from __future__ import annotations

import bz2
import codecs
import glob
import gzip
import lzma
import os
import re
import shlex
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from kiln.config import resolve_path
from kiln.disk import cache_error_message
from kiln.errors import as_flag

from .common import DataError, num_proc_for

if TYPE_CHECKING:
    from datasets import Dataset, IterableDataset

    from ..config import DataConfig

FILE_BUILDERS = {
    ".txt": "text",
    ".text": "text",
    ".raw": "text",
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".parquet": "parquet",
}
COMPRESSED = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open, ".zst": None}
DOCUMENT_MODES = ("blank_line", "heading", "line", "file")
SENTENCE_MODES = ("rule", "line")
STREAMING_EVAL_DOCUMENTS = 1000  # streaming validation sets are materialised; this many when not capped

_ANY_HEADING = re.compile(r"^\s*=(?: =)* [^=].*?[^=] =(?: =)*\s*$")  # " = Title = ", " = = Section = = "
_TOP_HEADING = re.compile(r"^\s*= [^=].*?[^=] =\s*$")
_OTHER_WHITESPACE = re.compile(
    r"[^\S \n]"
)  # whitespace other than spaces and newlines (tabs, no-break spaces)
_SENTENCE_END = re.compile(r"[.!?…]+[\"'”’)\]]*(?=\s+[\"'“‘(\[]*[A-Z])")
ABBREVIATIONS = frozenset(
    "mr mrs ms messrs dr prof rev hon st mt sr jr capt col gen lt sgt maj gov vs etc no vol fig ch pp ca cf al "
    "jan feb mar apr jun jul aug sep sept oct nov dec".split()
)


# ----------------------------------------------------------------------------------------------------------
# documents and sentences


def split_documents(text: str, separator: str = "blank_line") -> list[str]:
    """Split one file's (or row's) text into documents; see the module docstring for the modes."""
    text = text.lstrip("\ufeff")
    if separator == "file":
        return [text.strip()] if text.strip() else []
    if separator == "line":
        return [line.strip() for line in text.split("\n") if line.strip()]
    if separator not in ("blank_line", "heading"):
        return [doc.strip() for doc in text.split(separator) if doc.strip()]
    documents, current = [], []
    for line in text.split("\n"):
        stripped = line.strip()
        if separator == "heading":
            starts_new = bool(_TOP_HEADING.match(line))
            keep = stripped and not _ANY_HEADING.match(line)
        else:
            starts_new = not stripped or bool(_ANY_HEADING.match(line))
            keep = not starts_new
        if starts_new and current:
            documents.append("\n".join(current))
            current = []
        if keep:
            current.append(stripped)
    if current:
        documents.append("\n".join(current))
    return documents


def split_sentences(text: str, mode: str = "rule") -> list[str]:
    """Split a document into sentences (`rule` or `line`; see the module docstring)."""
    if mode == "line":
        return [line.strip() for line in text.split("\n") if line.strip()]
    if not _OTHER_WHITESPACE.search(text):
        return _split_spaced_sentences(" ".join(text.split()))
    sentences, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        if match.group() == "." and _is_abbreviation(text, match.start()):
            continue
        sentence = " ".join(text[start : match.end()].split())
        if sentence:
            sentences.append(sentence)
        start = match.end()
    tail = " ".join(text[start:].split())
    return sentences + [tail] if tail else sentences


def _split_spaced_sentences(flat: str) -> list[str]:
    """split_sentences' rule on a text whose words are separated by single spaces (the usual case, made so by
    collapsing spaces and newlines): the same sentences, with fewer string operations per sentence."""
    sentences, start = [], 0
    for match in _SENTENCE_END.finditer(flat):
        end = match.end()
        if match.group() == ".":
            period = end - 1
            word = flat[flat.rfind(" ", 0, period) + 1 : period].lstrip("\"'“‘([").lower()
            if len(word) == 1 and word.isalpha() or word in ABBREVIATIONS:
                continue
        sentence = flat[start:end].strip(" ")
        if sentence:
            sentences.append(sentence)
        start = end
    tail = flat[start:].strip(" ")
    return sentences + [tail] if tail else sentences


def _is_abbreviation(text: str, period: int) -> bool:
    word_start = max(text.rfind(" ", 0, period), text.rfind("\n", 0, period)) + 1
    word = text[word_start:period].lstrip("\"'“‘([").lower()
    return len(word) == 1 and word.isalpha() or word in ABBREVIATIONS


def _documents_batch(batch, text_column: str, separator: str, join_rows: bool):
    texts = [t for t in batch[text_column] if t]
    wrong = next((t for t in texts if not isinstance(t, str)), None)
    if wrong is not None:
        raise DataError(
            f"column {text_column!r} holds {type(wrong).__name__} values (e.g. {str(wrong)[:40]!r}), not text; "
            "point --data.text_column at a column of strings"
        )
    if join_rows:
        texts = ["\n".join(texts)]
    return {"text": [doc for text in texts for doc in split_documents(text, separator)]}


# ----------------------------------------------------------------------------------------------------------
# files


def resolve_data_files(patterns: list[str] | str, option: str = "data.data_files") -> tuple[str, list[str]]:
    option = as_flag(option)  # messages name the flag a user types
    """Expand globs (relative paths from the repo root) into a sorted file list; returns (builder, files)."""
    patterns = [patterns] if isinstance(patterns, str) else list(patterns or [])
    if not patterns:
        raise DataError(f"{option} is empty: give local files or globs, or set --data.dataset_name")
    files: list[str] = []
    for pattern in patterns:
        if "://" in pattern:  # remote (hf://, s3://, https://): datasets resolves it
            files.append(pattern)
            continue
        matched = sorted(p for p in glob.glob(resolve_path(pattern), recursive=True) if os.path.isfile(p))
        if not matched:
            raise DataError(
                f"{option}: {pattern!r} matches no files (relative paths start at the repo root); fix the path"
            )
        files += [p for p in matched if p not in files]
    builders = {_builder_for(path, option) for path in files}
    if len(builders) > 1:
        raise DataError(
            f"{option} mixes formats ({', '.join(sorted(builders))}); use one format per file list"
        )
    nonempty = [p for p in files if "://" in p or os.path.getsize(p) > 0]
    if not nonempty:
        raise DataError(
            f"the corpus is empty: every file in {option} ({', '.join(files)}) has 0 bytes; add text"
        )
    return builders.pop(), nonempty


def _builder_for(path: str, option: str) -> str:
    suffixes = [s.lower() for s in Path(path).suffixes]
    if suffixes and suffixes[-1] in COMPRESSED:
        suffixes = suffixes[:-1]
    if not suffixes or suffixes[-1] not in FILE_BUILDERS:
        supported = ", ".join(FILE_BUILDERS)
        raise DataError(
            f"{option}: cannot read {path}: supported extensions are {supported} (optionally .gz/.bz2/.xz)"
        )
    return FILE_BUILDERS[suffixes[-1]]


def _first_invalid_utf8(path: str) -> tuple[int, int, bytes, bytes] | None:
    """(byte offset, line number, the invalid sequence as Python's decoder names it, the whole run of invalid
    bytes there (at most 16)) of the first invalid UTF-8 in a file, or None."""
    opener = COMPRESSED.get(Path(path).suffix.lower(), open)
    if opener is None:  # .zst: no stdlib reader; datasets reports problems itself
        return None
    line, carry, offset = 1, b"", 0  # offset: of data[0] in the file
    with opener(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            data = carry + chunk
            if not data:
                return None
            try:
                data.decode("utf-8")
                good, carry = data, b""
            except UnicodeDecodeError as err:
                if chunk and err.reason == "unexpected end of data":  # a character cut by the chunk boundary
                    good, carry = data[: err.start], data[err.start :]
                else:
                    if chunk and len(data) - err.start < 32:  # room to see the whole run of bad bytes
                        data += f.read(32)
                    where = line + data.count(b"\n", 0, err.start)
                    return offset + err.start, where, data[err.start : err.end], _bad_run(data, err.start)
            line += good.count(b"\n")
            offset += len(good)
            if not chunk:
                return None


def _bad_run(data: bytes, start: int) -> bytes:
    """The run of invalid bytes that begins at `start` (at most 16), up to where a valid character begins."""
    end = start
    while end < len(data) and end - start < 16:
        try:
            data[end : end + 4].decode("utf-8")
            break
        except UnicodeDecodeError as err:
            if err.start > 0:  # a valid character begins here
                break
            end += err.end
    return data[start:end]


def find_invalid_utf8(path: str) -> tuple[int, bytes] | None:
    """(line number, offending bytes) of the first invalid UTF-8 sequence in a file, or None."""
    found = _first_invalid_utf8(path)
    return None if found is None else (found[1], found[2])


# byte-order marks, longest first (the UTF-32 LE mark begins with the UTF-16 LE one)
_BYTE_ORDER_MARKS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF8, "UTF-8"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


def detect_encoding(path: str) -> str:
    """The encoding a file's byte-order mark names (UTF-8, UTF-16 or UTF-32); UTF-8 when it has none. (A UTF-8
    mark is read as UTF-8: split_documents drops it.)"""
    opener = COMPRESSED.get(Path(path).suffix.lower(), open)
    if opener is None:
        return "UTF-8"
    with opener(path, "rb") as f:
        start = f.read(4)
    return next((name for mark, name in _BYTE_ORDER_MARKS if start.startswith(mark)), "UTF-8")


# how much of a file `utf8_damage` reads to tell a damaged UTF-8 file from one in an 8-bit encoding (Latin-1,
# Windows-1252): what it has read by then tells them apart
_DAMAGE_SCAN_BYTES = 64 << 20
_DAMAGE_RUNS = 1000


@dataclass
class Utf8Damage:
    """The invalid UTF-8 in a file: the first run of invalid bytes (its byte offset, line and bytes), how many
    such runs and how many valid non-ASCII characters the part read holds (`complete`: it is the whole file)."""

    offset: int
    line: int
    first: bytes
    runs: int
    non_ascii: int
    complete: bool


def utf8_damage(path: str) -> Utf8Damage | None:
    """What is wrong with a file's UTF-8 (None when it is valid): the first bad run and counts over the file, or
    over its first _DAMAGE_SCAN_BYTES, or until _DAMAGE_RUNS runs were seen."""
    found = _first_invalid_utf8(path)
    if found is None:
        return None
    offset, line, _, first = found
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    runs, non_ascii, read, previous = 0, 0, 0, ""
    with COMPRESSED.get(Path(path).suffix.lower(), open)(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            read += len(chunk)
            text = decoder.decode(chunk, final=not chunk)
            runs += len(re.findall("\ufffd+", text)) - (previous == "\ufffd" and text[:1] == "\ufffd")
            non_ascii += len(text) - len(text.encode("ascii", "ignore")) - text.count("\ufffd")
            previous = text[-1:] or previous
            if not chunk or read > _DAMAGE_SCAN_BYTES or runs >= _DAMAGE_RUNS:
                break
    return Utf8Damage(offset, line, first, max(runs, 1), non_ascii, complete=not chunk)


def not_utf8_error(path: str) -> DataError:
    """The one-line error for a corpus file that is not UTF-8, with the command that fixes it: a UTF-16 or
    UTF-32 file (named by its byte-order mark) needs that source encoding, not latin1, which would turn every
    other byte into a NUL; a UTF-8 file with a few bad bytes (a lone surrogate, a cut character) beside valid
    non-ASCII text is named as such, with the byte offset: re-encoding it from latin1 would garble that text."""
    encoding = detect_encoding(path)
    if encoding != "UTF-8":
        quoted = shlex.quote(path)
        fix = f"re-encode it with `iconv -f {encoding} -t UTF-8 {quoted} > {quoted}.utf8 && mv {quoted}.utf8 {quoted}`"
        if Path(path).suffix.lower() in COMPRESSED:
            fix = (
                f"decompress it, re-encode the text with `iconv -f {encoding} -t UTF-8` and compress it again"
            )
        return DataError(
            f"{path} is {encoding} text (it starts with a {encoding} byte-order mark); Kiln reads UTF-8: {fix}"
        )
    damage = utf8_damage(path)
    if damage is None:
        return DataError(f"{path}: some bytes are not valid UTF-8; re-encode the file as UTF-8")
    if damage.non_ascii:  # valid multi-byte characters beside the bad bytes: the file is UTF-8, damaged
        count = f"{damage.runs}{'' if damage.complete else ' or more'}"
        what = "one invalid byte sequence" if count == "1" else f"{count} invalid byte sequences, the first"
        surrogate = (
            ", an encoded UTF-16 surrogate"
            if damage.first[:1] == b"\xed" and len(damage.first) > 1 and 0xA0 <= damage.first[1] <= 0xBF
            else ""
        )
        quoted = shlex.quote(path)
        fix = f"`iconv -f utf-8 -t utf-8 -c {quoted} > {quoted}.clean` drops only those bytes"
        if Path(path).suffix.lower() in COMPRESSED:
            fix = "`iconv -f utf-8 -t utf-8 -c` on the decompressed text drops only those bytes"
        return DataError(
            f"{path} is UTF-8 with {what} at byte offset {damage.offset} (line {damage.line}: bytes "
            f"{damage.first.hex(' ')}{surrogate}); do not re-encode the file (from latin1 or any other encoding: its "
            f"other non-ASCII text would be garbled): delete or fix those bytes, e.g. {fix}"
        )
    return DataError(
        f"{path}, line {damage.line}: bytes {damage.first.hex(' ')} at byte offset {damage.offset} are not valid "
        f"UTF-8, and the file has no valid non-ASCII UTF-8 text (an 8-bit encoding?); re-encode the file as UTF-8 "
        f"(e.g. `iconv -f latin1 -t utf-8` for Latin-1)"
    )


def check_utf8(files: list[str]) -> None:
    for path in files:
        if "://" in path:
            continue
        if detect_encoding(path) != "UTF-8" or find_invalid_utf8(path) is not None:
            raise not_utf8_error(path)


# ----------------------------------------------------------------------------------------------------------
# loading


@dataclass
class CorpusSplits:
    """Documents (one `text` row each) for training and validation (None: no validation data)."""

    train: Dataset | IterableDataset
    validation: Dataset | IterableDataset | None
    source: str


def load_dataset(*args, **kwargs):
    """`datasets.load_dataset`, imported when first called: `python -m pretrain.data prepare` of text files
    starts without `datasets` (a second of start-up that runs before its workers can share the work)."""
    import datasets

    return datasets.load_dataset(*args, **kwargs)


def _load(builder_or_name: str, streaming: bool, what: str, fix: str, **kwargs):
    try:
        return load_dataset(builder_or_name, streaming=streaming, **kwargs)
    except DataError:
        raise
    except Exception as err:  # datasets raises many types; the first line of its message is what matters
        # a cache that cannot be written is no fault of the data: say which cache and how to move it
        cache_message = (
            cache_error_message(err, kwargs.get("cache_dir")) if isinstance(err, OSError) else None
        )
        if cache_message is not None:
            raise DataError(cache_message) from None
        reason = str(err).strip().split("\n")[0] or type(err).__name__
        raise DataError(f"could not load {what}: {reason}. {fix}") from None


def _load_raw(cfg: DataConfig, streaming: bool):
    """({"train": raw, "validation": raw | None}, text column, rows are whole text files, source description)."""
    cache_dir = resolve_path(cfg.cache_dir) if cfg.cache_dir else None
    if cfg.dataset_name:
        loaded = _load(
            cfg.dataset_name,
            streaming,
            f"Hub dataset {cfg.dataset_name!r} (config {cfg.dataset_config!r})",
            "Check data.dataset_name and data.dataset_config, or use data.data_files for local files",
            name=cfg.dataset_config,
            cache_dir=cache_dir,
        )
        if cfg.dataset_split not in loaded:
            raise DataError(
                f"{cfg.dataset_name} has no split {cfg.dataset_split!r} (splits: {', '.join(loaded)}); set --data.dataset_split"
            )
        splits = {"train": loaded[cfg.dataset_split], "validation": None}
        if not cfg.validation_files and cfg.dataset_split != "validation" and "validation" in loaded:
            splits["validation"] = loaded["validation"]
        source = f"Hub dataset {cfg.dataset_name}"
        if cfg.validation_files:
            builder, files = resolve_data_files(cfg.validation_files, "data.validation_files")
            splits["validation"] = _load_files(builder, {"validation": files}, cfg, streaming, cache_dir)[
                "validation"
            ]
        return splits, cfg.text_column, False, source
    builder, files = resolve_data_files(cfg.data_files)
    data_files = {"train": files}
    if cfg.validation_files:
        val_builder, data_files["validation"] = resolve_data_files(
            cfg.validation_files, "data.validation_files"
        )
        if val_builder != builder:
            raise DataError(
                f"--data.validation_files are {val_builder} but --data.data_files are {builder}; use one format"
            )
    loaded = _load_files(builder, data_files, cfg, streaming, cache_dir)
    text_column = "text" if builder == "text" else cfg.text_column
    source = ", ".join(cfg.data_files)
    return (
        {"train": loaded["train"], "validation": loaded.get("validation")},
        text_column,
        builder == "text",
        source,
    )


def _load_files(builder: str, data_files: dict, cfg: DataConfig, streaming: bool, cache_dir):
    if builder in ("text", "json", "csv"):
        check_utf8([f for files in data_files.values() for f in files])
    kwargs = {}
    if builder == "text":
        kwargs["sample_by"] = "line" if cfg.document_separator == "line" else "document"
    what = f"{builder} files {', '.join(f for files in data_files.values() for f in files)}"
    fix = "Check that the files are well-formed " + (builder.upper() if builder != "text" else "text")
    return _load(builder, streaming, what, fix, data_files=data_files, cache_dir=cache_dir, **kwargs)


def _column_names(ds) -> list[str]:
    if ds.column_names is not None:
        return list(ds.column_names)
    first = next(iter(ds.take(1)), None)
    return list(first) if first else []


def _to_documents(ds, cfg: DataConfig, text_column: str, rows_are_files: bool, source: str):
    columns = _column_names(ds)
    if text_column not in columns:
        raise DataError(
            f"column {text_column!r} not found in {source}; columns are: {', '.join(columns) or '(none)'}. "
            f"Set --data.text_column to one of them"
        )
    join_rows = cfg.document_separator == "heading" and not rows_are_files
    kwargs = dict(
        batched=True,
        fn_kwargs={"text_column": text_column, "separator": cfg.document_separator, "join_rows": join_rows},
        remove_columns=columns,
    )
    from datasets import Dataset

    if isinstance(ds, Dataset):
        kwargs.update(num_proc=num_proc_for(cfg.num_proc, len(ds)), desc="Splitting into documents")
    return ds.map(_documents_batch, **kwargs)


def _hash_fraction_batch(batch):
    return {"_hash": [zlib.crc32(text.encode("utf-8")) / 2**32 for text in batch["text"]]}


def _below_threshold(batch, threshold: float, validation: bool):
    return [(zlib.crc32(text.encode("utf-8")) / 2**32 < threshold) == validation for text in batch["text"]]


def _hold_out(documents, percentage: float):
    """Split documents into (train, validation) by text hash; see the module docstring."""
    from datasets import IterableDataset

    if isinstance(documents, IterableDataset):

        def side(validation: bool):
            kwargs = {"threshold": percentage / 100, "validation": validation}
            return documents.filter(_below_threshold, batched=True, fn_kwargs=kwargs)

        return side(False), side(True)
    count = max(round(len(documents) * percentage / 100), 2 if len(documents) >= 6 else 1)  # 2: one NSP pair
    count = min(count, len(documents) - 1)
    hashes = np.asarray(documents.map(_hash_fraction_batch, batched=True, desc="Hashing documents")["_hash"])
    order = np.argsort(hashes, kind="stable")
    validation_idx = np.sort(order[:count])
    train_mask = np.ones(len(documents), dtype=bool)
    train_mask[validation_idx] = False
    return documents.select(np.flatnonzero(train_mask)), documents.select(validation_idx)


def load_documents(cfg: DataConfig, streaming: bool | None = None) -> CorpusSplits:
    """Read the corpus in `cfg` into training and validation documents (one `text` row per document).

    Raises DataError for missing files, bad columns, invalid UTF-8 and empty corpora.
    """
    streaming = cfg.streaming if streaming is None else streaming
    if not cfg.document_separator:
        raise DataError(
            f"--data.document_separator is empty: use one of {', '.join(DOCUMENT_MODES)} or a literal string"
        )
    if cfg.sentence_split not in SENTENCE_MODES:
        raise DataError(
            f"--data.sentence_split={cfg.sentence_split!r}: choose one of {', '.join(SENTENCE_MODES)}"
        )
    if not 0 <= cfg.validation_split_percentage < 100:
        raise DataError(
            f"--data.validation_split_percentage={cfg.validation_split_percentage}: use a value in [0, 100)"
        )
    raw, text_column, rows_are_files, source = _load_raw(cfg, streaming)
    train = _to_documents(raw["train"], cfg, text_column, rows_are_files, source)
    validation = None
    if raw["validation"] is not None:
        validation = _to_documents(
            raw["validation"], cfg, text_column, rows_are_files, source + " (validation)"
        )
    if _is_empty(train):
        raise DataError(
            f"the corpus is empty: no documents in {source} (only blank lines?); add text or check "
            f"--data.data_files / --data.text_column / --data.document_separator={cfg.document_separator!r}"
        )
    if validation is None and cfg.validation_split_percentage > 0:
        train, validation = _hold_out(train, cfg.validation_split_percentage)
    if cfg.max_train_documents is not None:
        train = _first(train, cfg.max_train_documents)
    eval_cap = cfg.max_eval_documents
    if streaming and eval_cap is None:
        eval_cap = STREAMING_EVAL_DOCUMENTS
    if validation is not None and eval_cap is not None:
        validation = _first(validation, eval_cap)
    return CorpusSplits(train, validation, source)


def _first(ds, n: int):
    from datasets import IterableDataset

    if isinstance(ds, IterableDataset):
        return ds.take(n)
    return ds.select(range(min(n, len(ds))))


def _is_empty(ds) -> bool:
    from datasets import IterableDataset

    if isinstance(ds, IterableDataset):
        return next(iter(ds.take(1)), None) is None
    return len(ds) == 0


def iter_texts(documents, limit: int | None = None, batch_size: int = 1000):
    """Yield lists of document texts (for tokenizer training), at most `limit` texts in all."""
    seen = 0
    for batch in documents.iter(batch_size=batch_size):
        texts = batch["text"]
        if limit is not None:
            texts = texts[: limit - seen]
        seen += len(texts)
        if texts:
            yield texts
        if limit is not None and seen >= limit:
            return


__all__ = [
    "ABBREVIATIONS",
    "CorpusSplits",
    "check_utf8",
    "detect_encoding",
    "find_invalid_utf8",
    "iter_texts",
    "load_documents",
    "not_utf8_error",
    "resolve_data_files",
    "split_documents",
    "split_sentences",
]

"""Training from a prepared folder (`--data.prepared DIR`, written by `python -m pretrain.data prepare`).

    corpus = PreparedCorpus.open("prepared/")       # manifest (or the per-shard .json files merged)
    corpus.check_run(config)                         # one-line DataError when the run disagrees with the manifest
    tokenizer = corpus.load_tokenizer(max_seq_length)
    data = build_prepared_data(corpus, config.data, tokenizer, "encoder", "mlm+nsp", seed, 128)
    corpus.dataset("train")                          # the shards as one `datasets.Dataset` (memory-mapped)

The shards are memory-mapped Arrow files: every process on every node maps the same files. The offset arrays
(8 bytes per sentence, 12 per document) and each epoch's pair plan are written once per node into a cache folder
(PreparedCorpus.cache_folder) and mapped from there, so a process's own memory does not grow with the corpus.
Each epoch's NSP/SOP pairs are planned from sentence
lengths alone, with the same random draws, in the same order, as the in-memory path
(`nsp.build_pair_instances` over pools of DOCUMENT_POOL shuffled documents): a pair is four token offsets into
the mapped shards and a label, and an example is sliced out of the shards when the DataLoader asks for it. So
the examples (and therefore the MLM masks, which depend on the example index) are exactly those of the
in-memory path given the same tokenizer, validation split and settings, without tokenizing again; the decoder's
blocks are likewise cut from the mapped token stream.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import socket
from array import array
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import torch

from kiln.config import resolve_path
from kiln.errors import first_line

from .common import DataError, main_process_first
from .nsp import IS_NEXT, NOT_NEXT, TASKS
from .pipeline import (
    DOCUMENT_POOL,
    EVAL_EPOCH,
    PAIR_TASK,
    PretrainingData,
    make_decoder_collators,
    make_mlm_collator,
    validate_settings,
)
from .prepare import FORMAT, MANIFEST, PLAN, VERSION, merged_manifest, shard_schema, tokenizer_fingerprint
from .tokenizer import check_special_tokens, check_tokenizer_fits, load_tokenizer

if TYPE_CHECKING:
    from ..config import DataConfig, RunConfig


class PreparedCorpus:
    """A prepared folder: its manifest, tokenizer and shards."""

    def __init__(self, folder: Path, manifest: dict):
        self.folder = folder
        self.manifest = manifest

    @classmethod
    def open(cls, folder: str) -> PreparedCorpus:
        path = Path(resolve_path(folder))
        if (path / MANIFEST).is_file():
            manifest = _read_json(
                path / MANIFEST,
                folder,
                "delete it: training then merges the shards' .json "
                "files, or run the same prepare command again",
            )
        elif (path / PLAN).is_file():
            plan = _read_json(path / PLAN, folder, "run the same prepare command again")
            _check_names(
                path,
                folder,
                plan,
                PLAN,
                lambda name: [f"{name}.json", f"{name}.arrow"] if isinstance(name, str) else [None],
            )
            try:
                manifest = merged_manifest(path)
            except ValueError as err:  # a plan.json or a shard's .json cut short
                raise DataError(
                    f"--data.prepared {folder}: {err}; run the same prepare command again"
                ) from None
            if isinstance(manifest, list):
                raise DataError(
                    f"--data.prepared {folder} is incomplete: {len(manifest)} shard(s) missing (e.g. {manifest[0]}); "
                    "finish it with `python -m pretrain.data prepare` (every --shard i/n) or copy the other "
                    "machines' shards into it"
                )
        else:
            raise DataError(
                f"--data.prepared {folder} is not a prepared folder (no {MANIFEST}); make one with "
                "`python -m pretrain.data prepare --config X --output DIR`"
            )
        if not isinstance(manifest, dict):
            raise DataError(f"--data.prepared {folder}: {MANIFEST} does not hold a manifest; prepare again")
        if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
            raise DataError(
                f"--data.prepared {folder} has format {manifest.get('format')} v{manifest.get('version')}, this Kiln "
                f"reads {FORMAT} v{VERSION}; prepare it again"
            )
        _check_records(path, folder, manifest)
        _check_shard_list(path, folder, manifest)
        for records in manifest["shards"].values():
            for record in records:
                shard = path / record["file"]
                if not shard.is_file() or shard.stat().st_size != record["bytes"]:
                    raise DataError(
                        f"--data.prepared {folder}: shard {record['file']} is missing or has another size than its "
                        "manifest says; copy it again or prepare again"
                    )
        return cls(path, manifest)

    def verify(self, accelerator=None) -> None:
        """Check every shard against the sha256 its manifest records (sizes are checked by `open`): a bit flipped
        on a disk or in a copy changes examples silently otherwise. The local main process of each node hashes
        its node's files (threads: hashlib releases the GIL) and every process learns the verdicts, so each copy
        is checked once, on shared and on node-local disks alike; one line names the first damaged shard."""
        problem = None
        if accelerator is None or accelerator.is_local_main_process:
            problem = self._damaged_shard()
        if accelerator is not None and accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            problems = [p for p in gather_object([problem]) if p]
            problem = problems[0] if problems else None
        if problem:
            raise DataError(problem)

    def _damaged_shard(self) -> str | None:
        from concurrent.futures import ThreadPoolExecutor

        from .prepare import file_sha256

        records = [r for records in self.manifest["shards"].values() for r in records]
        with ThreadPoolExecutor(min(len(records), os.cpu_count() or 1) or 1) as pool:
            digests = list(pool.map(lambda r: file_sha256(str(self.folder / r["file"])), records))
        for record, digest in zip(records, digests):
            if digest != record["sha256"]:
                return (
                    f"data.prepared {self.folder}: shard {record['file']} differs from the sha256 its manifest "
                    "records (damaged on disk or in a copy); copy it again or prepare again"
                )
        return None

    @property
    def model_kind(self) -> str:
        return self.manifest["settings"]["model_kind"]

    def shard_paths(self, split: str = "train") -> list[Path]:
        return [self.folder / record["file"] for record in self.manifest["shards"].get(split, [])]

    def dataset(self, split: str = "train"):
        """The shards of `split` as one memory-mapped `datasets.Dataset` (rows: sentence_ids, document_hash)."""
        from datasets import Dataset, concatenate_datasets

        return concatenate_datasets([Dataset.from_file(str(p)) for p in self.shard_paths(split)])

    def cache_folder(self, cache_dir: str | None = None) -> Path:
        """Where training keeps this corpus's offset arrays and pair plans: `data.cache_dir` (default: the
        `datasets` cache), in a folder named after the shards' checksums."""
        if cache_dir:
            root = Path(resolve_path(cache_dir))
        else:
            import datasets.config

            root = Path(datasets.config.HF_DATASETS_CACHE)
        shards = {split: [s["sha256"] for s in records] for split, records in self.manifest["shards"].items()}
        return root / "kiln-prepared" / _digest(FORMAT, VERSION, shards)

    def load_tokenizer(self, model_max_length: int | None = None):
        return load_tokenizer(str(self.folder / "tokenizer"), model_max_length)

    def check_run(self, config: RunConfig) -> None:
        """One-line DataError naming the first setting of the run that disagrees with the manifest.

        Checked: what the shards were cut and tokenized with (model kind, document and sentence splitting, text
        column, the tokenizer's settings, or a given tokenizer's fingerprint). Not checked, because every run
        draws its examples from the shards itself: max_seq_length, the NSP/SOP and masking probabilities, the
        objective, the validation share and the seed.
        """
        settings = self.manifest["settings"]
        where = f"data.prepared {self.folder.name}"
        expected = {
            "model.kind": (settings["model_kind"], config.model.kind),
            "data.document_separator": (settings["document_separator"], config.data.document_separator),
            "data.text_column": (settings["text_column"], config.data.text_column),
        }
        if config.model.kind == "encoder":
            expected["data.sentence_split"] = (settings["sentence_split"], config.data.sentence_split)
        if config.tokenizer.name_or_path:
            given = load_tokenizer(config.tokenizer.name_or_path)
            expected["tokenizer.name_or_path"] = (
                self.manifest["tokenizer_fingerprint"],
                tokenizer_fingerprint(given),
            )
        elif not settings["tokenizer"]["name_or_path"]:
            for key in ("vocab_size", "lowercase", "min_frequency"):
                expected[f"tokenizer.{key}"] = (settings["tokenizer"][key], getattr(config.tokenizer, key))
        for name, (prepared, run) in expected.items():
            if prepared != run:
                what = "a tokenizer with fingerprint" if name == "tokenizer.name_or_path" else f"{name}="
                raise DataError(
                    f"{where} was prepared with {what}{prepared!r} but this run has {run!r}; set {name} to match "
                    "or prepare the corpus again with this run's config"
                )


# ----------------------------------------------------------------------------------------------------------
# the memory-mapped index


def _read_json(path: Path, folder, fix: str) -> dict:
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        raise DataError(
            f"--data.prepared {folder}: {path.name} is not valid JSON (cut short?); {fix}"
        ) from None


def _plain_name_problem(folder: Path, name) -> str | None:
    """Why `name` is not a plain file name inside `folder` (a path of other folders, `..`, an absolute path, a
    symbolic link leading out of it), or None. Checked before any file it names is opened or measured."""
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..")
        or "/" in name
        or "\\" in name
        or "\0" in name
    ):
        return "is not a plain file name in the folder"
    path = folder / name
    if path.is_symlink():
        try:
            inside = path.resolve(strict=True).parent == folder.resolve()
        except (OSError, RuntimeError):  # a dangling link, or a loop of links
            inside = False
        if not inside:
            return "is a symbolic link leading out of the folder"
    return None


def _check_names(path: Path, folder, listing: dict, source: str, files) -> None:
    """Every shard `listing` (a plan.json or manifest.json) names, as the `files(entry)` it stands for, is a plain
    file name inside the folder: a name like `../../x.arrow` or `/etc/passwd` is refused before anything is read."""
    shards = listing.get("shards") if isinstance(listing, dict) else None
    if not isinstance(shards, dict) or not all(isinstance(v, list) for v in shards.values()):
        raise DataError(
            f"--data.prepared {folder}: {source} does not list its shards by split; prepare again"
        )
    for entries in shards.values():
        for entry in entries:
            for name in files(entry):
                problem = _plain_name_problem(path, name)
                if problem:
                    raise DataError(
                        f"--data.prepared {folder}: {source} names the shard {name!r}, which {problem}; a prepared "
                        "folder's shards are files of its own: prepare again"
                    )


_RECORD_FIELDS = {"file": str, "bytes": int, "rows": int, "sha256": str}


def _check_records(path: Path, folder, manifest: dict) -> None:
    """The manifest's shard records: plain file names inside the folder (`_check_names`), sizes and row counts
    as whole numbers, a sha256 as 64 hex digits."""

    def names(record):
        return [record.get("file") if isinstance(record, dict) else None]

    _check_names(path, folder, manifest, MANIFEST, names)
    for records in manifest["shards"].values():
        for record in records:
            for key, kind in _RECORD_FIELDS.items():
                value = record.get(key)
                bad = not isinstance(value, kind) or isinstance(value, bool)
                bad = bad or (kind is int and value < 0)
                bad = bad or (key == "sha256" and (len(value) != 64 or value.strip("0123456789abcdef")))
                if bad:
                    raise DataError(
                        f"--data.prepared {folder}: {MANIFEST}: shard {record['file']} has no valid {key} "
                        f"({value!r}); prepare again"
                    )


def _check_shard_list(path: Path, folder, manifest: dict) -> None:
    """The manifest lists every shard the prepare planned (plan.json) and its totals add up: a shard dropped from
    it by hand would silently change the training or evaluation set."""
    listed = {
        split: [r["file"].rsplit(".", 1)[0] for r in records] for split, records in manifest["shards"].items()
    }
    if (path / PLAN).is_file():
        planned = _read_json(path / PLAN, folder, "run the same prepare command again")["shards"]
        if planned != listed:
            missing = [n for split, names in planned.items() for n in names if n not in listed.get(split, [])]
            raise DataError(
                f"--data.prepared {folder}: {MANIFEST} does not list the shards plan.json planned "
                f"({', '.join(missing[:3]) or 'another list'}{' ...' if len(missing) > 3 else ''}); delete "
                f"{MANIFEST} (training merges the shards' .json files) or prepare again"
            )
    totals = manifest.get("totals", {})
    every = [r for records in manifest["shards"].values() for r in records]
    if totals and (
        totals.get("shards") != len(every) or totals.get("documents") != sum(r["rows"] for r in every)
    ):
        raise DataError(
            f"--data.prepared {folder}: {MANIFEST} lists {len(every)} shards but its totals count "
            f"{totals.get('shards')}: it was edited; prepare again"
        )


_INDEX_ARRAYS = {"doc_sentences": np.int64, "sentence_tokens": np.int64, "document_hash": np.uint32}
_PLAN_ARRAYS = {
    "a_start": np.int64,
    "a_end": np.int64,
    "b_start": np.int64,
    "b_end": np.int64,
    "label": np.int8,
}
_COMPLETE = "arrays.json"


class _ArraySink:
    """Arrays appended one after the other: held in memory, or written to the file `path`."""

    def __init__(self, path: Path | None = None):
        self.parts: list[np.ndarray] = []
        self.file = open(path, "wb") if path is not None else None

    def write(self, values: np.ndarray) -> None:
        if self.file is not None:
            self.file.write(np.ascontiguousarray(values).tobytes())
        else:
            self.parts.append(np.array(values))  # a copy: the caller may reuse its buffer

    def array(self, dtype) -> np.ndarray:
        return np.concatenate(self.parts).astype(dtype, copy=False) if self.parts else np.zeros(0, dtype)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def _cached_arrays(folder: Path, spec: dict, fill) -> tuple[dict[str, np.ndarray], bool]:
    """({name: array}, whether this call wrote them): arrays kept as raw files in `folder`, mapped read-only.
    When `folder` does not hold them yet, `fill(sinks)` writes them into a temporary folder of this process,
    renamed to `folder` when complete: a reader never sees half-written arrays, and when two processes of a
    shared cache write the same arrays the first rename wins."""
    written = False
    if not (folder / _COMPLETE).is_file():
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            tmp = folder.with_name(f".{folder.name}.tmp-{socket.gethostname()}-{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)  # left by a killed process of this name: ours
            tmp.mkdir()
        except OSError as err:
            raise DataError(
                f"cannot write the prepared corpus's offset arrays to {folder.parent} ({err.strerror}); set "
                "--data.cache_dir to a writable folder with free space"
            ) from None
        sinks = {name: _ArraySink(tmp / f"{name}.bin") for name in spec}
        try:
            fill(sinks)
            for sink in sinks.values():
                sink.close()
            (tmp / _COMPLETE).write_text(
                json.dumps({name: np.dtype(dtype).str for name, dtype in spec.items()})
            )
            os.replace(tmp, folder)
            written = True
        except OSError as err:
            if not (folder / _COMPLETE).is_file():
                raise DataError(
                    f"cannot write the prepared corpus's offset arrays to {folder.parent} ({err.strerror or err}); "
                    "set --data.cache_dir to a writable folder with free space"
                ) from None
        finally:
            for sink in sinks.values():
                sink.close()
            shutil.rmtree(tmp, ignore_errors=True)
    arrays = {}
    for name, dtype in spec.items():
        path = folder / f"{name}.bin"
        arrays[name] = np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype)
    return arrays, written


def _digest(*parts) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else json.dumps(part, sort_keys=True).encode())
    return digest.hexdigest()[:24]


class DocumentIndex:
    """Offsets over the mapped shards: document d holds sentences doc_sentences[d]:doc_sentences[d + 1], sentence
    s holds tokens sentence_tokens[s]:sentence_tokens[s + 1] of the global token stream, read from `tokens`
    (one array per record batch, mapped; batch b starts at token batch_tokens[b])."""

    def __init__(self, paths: list[Path], cache: Path | None = None):
        """`cache`: a folder for the offset arrays, written once (here, unless it holds them already) and mapped
        from there, so that the processes of a node share one copy in the page cache; None: held in memory."""
        self.tables = []  # keep the mapped tables alive
        self.cache = cache
        tokens, batch_tokens = [], [0]
        token_base = 0
        batches = []
        for path in paths:
            source = pa.memory_map(str(path))  # left open: the arrays below point into the mapping
            try:
                table = pa.ipc.open_stream(source).read_all()
                if not any(table.schema.equals(shard_schema(v)) for v in (1 << 16, 1 << 17)):
                    shown = ", ".join(f"{field.name}: {field.type}" for field in table.schema)
                    raise pa.ArrowInvalid(f"columns {shown}, not those of a prepared shard")
            except (pa.ArrowException, OSError) as err:
                raise DataError(
                    f"--data.prepared {Path(path).parent}: shard {Path(path).name} cannot be read ({type(err).__name__}: {first_line(err, 120)}); copy "
                    "it again or prepare again"
                ) from None
            self.tables.append((source, table))
            for batch in table.to_batches():
                values = batch.column(0).values.values.to_numpy(zero_copy_only=True)
                tokens.append(values)
                batches.append(batch)
                token_base += len(values)
                batch_tokens.append(token_base)
        self.tokens = tokens
        self.batch_tokens = np.asarray(batch_tokens, dtype=np.int64)
        if cache is None:
            sinks = {name: _ArraySink() for name in _INDEX_ARRAYS}
            self._offsets(batches, sinks)
            arrays = {name: sink.array(_INDEX_ARRAYS[name]) for name, sink in sinks.items()}
        else:
            arrays, _ = _cached_arrays(cache, _INDEX_ARRAYS, lambda sinks: self._offsets(batches, sinks))
        self.doc_sentences = arrays["doc_sentences"]
        self.sentence_tokens = arrays["sentence_tokens"]
        self.document_hash = arrays["document_hash"]

    @staticmethod
    def _offsets(batches, sinks) -> None:
        """The global offset arrays, a record batch at a time (memory: one batch's offsets)."""
        sentence_base = token_base = 0
        sinks["doc_sentences"].write(np.zeros(1, np.int64))
        sinks["sentence_tokens"].write(np.zeros(1, np.int64))
        for batch in batches:
            documents = batch.column(0)
            sentences = documents.values
            doc_offsets = documents.offsets.to_numpy()
            sentence_offsets = sentences.offsets.to_numpy()
            sinks["doc_sentences"].write(doc_offsets[1:].astype(np.int64) + sentence_base)
            sinks["sentence_tokens"].write(sentence_offsets[1:].astype(np.int64) + token_base)
            sinks["document_hash"].write(batch.column(1).to_numpy().astype(np.uint32))
            sentence_base += len(sentence_offsets) - 1
            token_base += len(sentences.values)

    @property
    def num_documents(self) -> int:
        return len(self.doc_sentences) - 1

    def sentence_counts(self) -> np.ndarray:
        return np.diff(self.doc_sentences)

    def slice(self, start: int, end: int) -> np.ndarray:
        """Tokens start:end of the global stream (a range never crosses a record batch: documents do not)."""
        if end <= start:
            return np.zeros(0, dtype=np.int64)
        batch = int(np.searchsorted(self.batch_tokens, start, side="right")) - 1
        base = int(self.batch_tokens[batch])
        return self.tokens[batch][start - base : end - base]

    def gather(self, start: int, end: int) -> np.ndarray:
        """Tokens start:end, across record batches (decoder blocks span documents)."""
        parts = []
        while start < end:
            batch = int(np.searchsorted(self.batch_tokens, start, side="right")) - 1
            stop = min(end, int(self.batch_tokens[batch + 1]))
            parts.append(self.slice(start, stop))
            start = stop
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def split_documents_like_memory(index: DocumentIndex, data_cfg: DataConfig, has_validation_shards: bool):
    """(train, validation) document ids as the in-memory path picks them (corpus.load_documents): the hold-out
    share with the smallest text hashes, then max_train/eval_documents, then documents without tokens dropped."""
    n = index.num_documents
    if has_validation_shards:
        train, validation = np.arange(n), None
    elif data_cfg.validation_split_percentage > 0 and n > 0:
        count = max(round(n * data_cfg.validation_split_percentage / 100), 2 if n >= 6 else 1)
        count = min(count, n - 1)
        order = np.argsort(index.document_hash, kind="stable")
        validation = np.sort(order[:count])
        keep = np.ones(n, dtype=bool)
        keep[validation] = False
        train = np.flatnonzero(keep)
    else:
        train, validation = np.arange(n), None
    if data_cfg.max_train_documents is not None:
        train = train[: data_cfg.max_train_documents]
    if validation is not None and data_cfg.max_eval_documents is not None:
        validation = validation[: data_cfg.max_eval_documents]
    counts = index.sentence_counts()
    train = train[counts[train] > 0]
    if validation is not None:
        validation = validation[counts[validation] > 0]
    return train, validation


# ----------------------------------------------------------------------------------------------------------
# pairs planned from sentence lengths


@dataclass
class PairPlan:
    """Examples as token ranges of the global stream: A = a_start:a_end, B = b_start:b_end (empty for "none")."""

    a_start: np.ndarray
    a_end: np.ndarray
    b_start: np.ndarray
    b_end: np.ndarray
    label: np.ndarray


def plan_pairs(
    index: DocumentIndex,
    documents: np.ndarray,
    max_seq_length: int,
    short_seq_prob: float,
    nsp_probability: float,
    seed: int,
    epoch,
    task: str,
    pool: int,
) -> PairPlan:
    """The epoch's pairs over `documents` (in order) in pools of `pool`, each pool seeded as the in-memory
    path's `datasets.map` batch (pair_examples_batch) is: the same random draws as nsp.build_pair_instances."""
    sinks = {name: _ArraySink() for name in _PLAN_ARRAYS}
    plan_pools(
        index, documents, max_seq_length, short_seq_prob, nsp_probability, seed, epoch, task, pool, sinks
    )
    return PairPlan(*(sinks[name].array(dtype) for name, dtype in _PLAN_ARRAYS.items()))


def plan_pools(
    index: DocumentIndex,
    documents: np.ndarray,
    max_seq_length: int,
    short_seq_prob: float,
    nsp_probability: float,
    seed: int,
    epoch,
    task: str,
    pool: int,
    sinks: dict,
) -> None:
    """plan_pairs, a pool at a time into `sinks` (name -> _ArraySink): memory holds one pool's pairs."""
    if task not in TASKS:
        raise DataError(f"sentence-pair task {task!r} is unknown; use one of {', '.join(TASKS)}")
    max_num_tokens = max_seq_length - (3 if task != "none" else 2)
    if max_num_tokens < 2:
        raise DataError(
            f"--data.max_seq_length={max_seq_length} leaves no room for two segments; use at least 8"
        )
    for first in range(0, len(documents), pool):
        pool_docs = np.asarray(documents[first : first + pool])
        if task == "nsp" and len(pool_docs) < 2:  # a lone document at the end of the data
            continue
        out = [array("q") for _ in range(4)] + [array("b")]
        rng = random.Random(f"{task}:{seed}:{epoch}:{first}")
        starts = index.doc_sentences[pool_docs]
        ends = index.doc_sentences[pool_docs + 1]
        # each document's sentence start offsets, and its end: sentences[d][i] is where its sentence i starts
        sentences = [
            index.sentence_tokens[s0 : s1 + 1].tolist() for s0, s1 in zip(starts.tolist(), ends.tolist())
        ]
        truncated, draws = _plan_pool(
            sentences, max_num_tokens, short_seq_prob, nsp_probability, rng, task, out
        )
        if truncated:
            _truncate_pairs(out[:4], np.frombuffer(truncated, dtype=np.int64), draws, max_num_tokens)
        for name, values in zip(_PLAN_ARRAYS, out):
            sinks[name].write(np.frombuffer(values, dtype=_PLAN_ARRAYS[name]))


def _plan_pool(
    sentences: list[list[int]],
    max_num_tokens: int,
    short_seq_prob: float,
    nsp_probability: float,
    rng: random.Random,
    task: str,
    out,
) -> tuple[array, bytearray]:
    """nsp._PairBuilder.from_document / pair_from_chunk / random_segment on token offsets: every draw from `rng`
    happens in the same order as there, and consumes the same Mersenne Twister words.

    Pairs longer than max_num_tokens are appended untruncated; truncate_seq_pair's draws for them (one random()
    per token removed) are taken here as raw bits, in order, and applied by _truncate_pairs: returned are the
    numbers of those pairs and their bits."""
    a_starts, a_ends, b_starts, b_ends, labels = out
    truncated, draws = array("q"), bytearray()
    n = len(sentences)
    random_, getrandbits = rng.random, rng.getrandbits

    def below(limit: int) -> int:
        # rng.randrange(limit) (randint(a, b) is a + randrange(b - a + 1)), as CPython's Random._randbelow
        # draws it, without randrange's argument handling: getrandbits of limit's bit length until it is < limit
        bits = limit.bit_length()
        value = getrandbits(bits)
        while value >= limit:
            value = getrandbits(bits)
        return value

    for d in range(n):
        positions = sentences[d]
        count = len(positions) - 1
        if random_() < short_seq_prob:
            target = 2 + below(max_num_tokens - 1)
        else:
            target = max_num_tokens
        first = 0
        while first < count:
            # the chunk: sentences first..i, i the first sentence where the chunk reaches the target length, or
            # the document's last (one bisection in place of a step per sentence)
            i = min(bisect_left(positions, positions[first] + target, first + 1), count) - 1
            m = i - first + 1
            unused = 0
            emit = True
            if task == "none":
                a0 = positions[first]
                a1 = min(positions[i + 1], a0 + max_num_tokens)
                b0 = b1 = a1
                label = 0
            else:
                a_end = 1 + below(m - 1) if m >= 2 else 1
                a0, a1 = positions[first], positions[first + a_end]
                if task == "nsp" and random_() < nsp_probability:
                    # random_segment: another document of the pool, from a random sentence
                    pick = below(n - 1)
                    other = sentences[pick if pick < d else pick + 1]
                    last = len(other) - 1
                    k = below(last)
                    b0 = other[k]
                    # sentences k.. until the segment reaches target - len(A), or the document's end
                    b1 = other[min(bisect_left(other, b0 + target - (a1 - a0), k + 1), last)]
                    label, unused = NOT_NEXT, m - a_end
                else:
                    b0, b1, label = a1, positions[i + 1], IS_NEXT
                    if b0 == b1:  # a one-sentence chunk: cut it at a random token
                        if a1 - a0 < 2:
                            emit = False
                        else:
                            cut = 1 + below(a1 - a0 - 1)
                            a1, b0 = a0 + cut, a0 + cut
                    if emit and task == "sop" and random_() < nsp_probability:
                        a0, a1, b0, b1, label = b0, b1, a0, a1, NOT_NEXT
                if emit:
                    excess = (a1 - a0) + (b1 - b0) - max_num_tokens
                    if excess > 0:  # truncate_seq_pair's `excess` random() calls: 2 words each
                        truncated.append(len(labels))
                        draws += getrandbits(64 * excess).to_bytes(8 * excess, "little")
            i -= unused
            if emit:
                a_starts.append(a0)
                a_ends.append(a1)
                b_starts.append(b0)
                b_ends.append(b1)
                labels.append(label)
            if random_() < short_seq_prob:
                target = 2 + below(max_num_tokens - 1)
            else:
                target = max_num_tokens
            first = i + 1
    return truncated, draws


def _truncate_pairs(ranges: list[array], pairs: np.ndarray, draws: bytearray, max_num_tokens: int) -> None:
    """nsp.truncate_seq_pair on the token ranges of `pairs`, in place, from the raw bits of its draws.

    There, each of the `excess` removals takes a token off the longer segment (B when they are equal), at its
    front when rng.random() < 0.5, else at its end. Which segment a removal hits does not depend on the draws:
    the longer one until it is shorter than or equal to the other, then the two alternate. random() is
    ((w1 >> 5) * 2**26 + (w2 >> 6)) / 2**53 of two 32-bit words, so `< 0.5` is w1's top bit being 0; and
    getrandbits(64 * excess) consumes exactly the words of `excess` random() calls, word k in bits 32 k on.
    """
    a0, a1, b0, b1 = (np.frombuffer(r, dtype=np.int64) for r in ranges)  # writable views (released below)
    la, lb = a1[pairs] - a0[pairs], b1[pairs] - b0[pairs]
    excess = la + lb - max_num_tokens
    at_end = (np.frombuffer(draws, dtype="<u4")[0::2] >> 31).astype(bool)  # per draw, pair by pair
    pair_of_draw = np.repeat(np.arange(len(pairs)), excess)
    draw = np.arange(len(at_end)) - np.repeat(
        np.cumsum(excess) - excess, excess
    )  # its number within its pair
    first_is_a = la > lb
    prefix = np.minimum(excess, np.where(first_is_a, la - lb, lb - la + 1))[pair_of_draw]
    hits_first = (draw < prefix) | ((draw - prefix) % 2 == 1)
    hits_a = hits_first == first_is_a[pair_of_draw]
    size = len(pairs)
    a_removed = np.bincount(pair_of_draw[hits_a], minlength=size)
    a_at_end = np.bincount(pair_of_draw[hits_a & at_end], minlength=size)
    b_at_end = np.bincount(pair_of_draw[~hits_a & at_end], minlength=size)
    a0[pairs] += a_removed - a_at_end
    a1[pairs] -= a_at_end
    b0[pairs] += excess - a_removed - b_at_end
    b1[pairs] -= b_at_end
    del a0, a1, b0, b1  # the arrays grow again for the next pool


class PairExamples(torch.utils.data.Dataset):
    """`[CLS] A [SEP] B [SEP]` examples sliced from the mapped shards (rows as the in-memory path's, as tensors)."""

    def __init__(self, index: DocumentIndex, plan: PairPlan, cls_id: int, sep_id: int, task: str):
        self.index, self.plan, self.task = index, plan, task
        self.cls, self.sep = np.array([cls_id]), np.array([sep_id])

    def __len__(self) -> int:
        return len(self.plan.label)

    def lengths(self) -> np.ndarray:
        """Tokens per example, from the plan alone (group_by_length reads no example)."""
        plan = self.plan
        b = plan.b_end - plan.b_start
        return (plan.a_end - plan.a_start) + b + 2 + (b > 0)

    def __getitem__(self, i: int) -> dict:
        plan = self.plan
        a = self.index.slice(int(plan.a_start[i]), int(plan.a_end[i]))
        b = self.index.slice(int(plan.b_start[i]), int(plan.b_end[i]))
        parts = [self.cls, a, self.sep] + ([b, self.sep] if len(b) else [])
        input_ids = torch.from_numpy(np.concatenate(parts).astype(np.int64))
        token_type_ids = torch.zeros(len(input_ids), dtype=torch.long)
        if len(b):
            token_type_ids[len(a) + 2 :] = 1
        row = {"input_ids": input_ids, "token_type_ids": token_type_ids}
        if self.task != "none":
            row["next_sentence_label"] = torch.tensor(int(plan.label[i]))
        return row

    def __getitems__(self, indices: list[int]) -> list[dict]:
        return [self[i] for i in indices]


class BlockExamples(torch.utils.data.Dataset):
    """Decoder blocks: the documents' tokens, each followed by EOS, cut into max_seq_length blocks; the final
    remainder is a shorter last block (clm.BlockPacker's rule for map-style data)."""

    def __init__(self, index: DocumentIndex, documents: np.ndarray, block_size: int, eos_id: int):
        self.index, self.block_size, self.eos_id = index, block_size, eos_id
        first = index.sentence_tokens[index.doc_sentences[documents]]
        last = index.sentence_tokens[index.doc_sentences[documents + 1]]
        self.doc_start, self.doc_end = first, last
        self.stream_end = np.cumsum(last - first + 1)  # +1: the EOS after each document
        total = int(self.stream_end[-1]) if len(documents) else 0
        self.total = total

    def __len__(self) -> int:
        return math.ceil(self.total / self.block_size)

    def lengths(self) -> np.ndarray:
        """Tokens per block: block_size, the last one the remainder."""
        lengths = np.full(len(self), self.block_size, dtype=np.int64)
        if len(lengths):
            lengths[-1] = self.total - (len(lengths) - 1) * self.block_size
        return lengths

    def __getitem__(self, i: int) -> dict:
        start, end = i * self.block_size, min((i + 1) * self.block_size, self.total)
        parts = []
        d = int(np.searchsorted(self.stream_end, start, side="right"))
        position = start
        while position < end:
            doc_stream_start = int(self.stream_end[d - 1]) if d else 0
            offset = position - doc_stream_start
            length = int(self.doc_end[d] - self.doc_start[d])
            take = min(end - position, length + 1 - offset)
            from_doc = min(take, max(length - offset, 0))
            if from_doc:
                begin = int(self.doc_start[d]) + offset
                parts.append(self.index.gather(begin, begin + from_doc).astype(np.int64))
            if take > from_doc:
                parts.append(np.array([self.eos_id], dtype=np.int64))
            position += take
            d += 1
        return {"input_ids": torch.from_numpy(np.concatenate(parts))}

    def __getitems__(self, indices: list[int]) -> list[dict]:
        return [self[i] for i in indices]


# ----------------------------------------------------------------------------------------------------------
# the run's data


def build_prepared_data(
    corpus: PreparedCorpus,
    data_cfg: DataConfig,
    tokenizer,
    model_kind: str,
    objective: str,
    seed: int,
    max_position_embeddings: int,
    accelerator=None,
    vocab_size: int | None = None,
) -> PretrainingData:
    """PretrainingData from a prepared folder: the same examples as build_pretraining_data would give.

    The offset arrays and each epoch's pair plan are written once per node into the corpus's cache folder
    (PreparedCorpus.cache_folder) and memory-mapped by every process: `accelerator` orders the processes as
    `build_pretraining_data` does, so every process must call this and `train_dataset` together.
    """
    validate_settings(data_cfg, model_kind, objective, max_position_embeddings)
    check_special_tokens(tokenizer, model_kind, objective)
    if vocab_size is not None:
        check_tokenizer_fits(tokenizer, vocab_size)
    if corpus.model_kind != model_kind:
        raise DataError(
            f"--data.prepared was prepared for a {corpus.model_kind} but --model.kind is {model_kind}; prepare again"
        )
    cache = corpus.cache_folder(data_cfg.cache_dir)
    with main_process_first(
        accelerator
    ):  # a node's first process writes the offset arrays, the others map them
        train_index = DocumentIndex(corpus.shard_paths("train"), cache / "index-train")
    has_validation = bool(corpus.manifest["shards"].get("validation"))
    train_docs, validation_docs = split_documents_like_memory(train_index, data_cfg, has_validation)
    validation_index = train_index
    if has_validation:
        with main_process_first(accelerator):
            validation_index = DocumentIndex(corpus.shard_paths("validation"), cache / "index-validation")
        validation_docs = np.arange(validation_index.num_documents)
        if data_cfg.max_eval_documents is not None:
            validation_docs = validation_docs[: data_cfg.max_eval_documents]
        validation_docs = validation_docs[validation_index.sentence_counts()[validation_docs] > 0]
    if len(train_docs) == 0:
        raise DataError("no training document has any tokens; check the corpus and --data.text_column")

    if model_kind == "encoder":
        task = PAIR_TASK[objective]
        if task == "nsp" and len(train_docs) < 2:
            raise DataError(
                "NSP needs at least 2 training documents but the corpus has 1: add documents, split them "
                "differently (--data.document_separator=line or heading), or use --model.objective=mlm+sop"
            )
        collator = make_mlm_collator(data_cfg, tokenizer, seed, objective)
        eval_collator = make_mlm_collator(data_cfg, tokenizer, seed + 1, objective)
        settings = (data_cfg.max_seq_length, data_cfg.short_seq_prob, data_cfg.nsp_probability, seed)

        written: list[Path] = []  # the previous epoch's plan, if this process wrote it

        def examples(index, name, documents, epoch, pool):
            # the plan is mapped from the cache: one copy per node whatever the number of processes (the index
            # is part of the name: the validation documents may come from the training shards)
            key = _digest([*settings, task, str(epoch), pool, str(index.cache)], documents.tobytes())
            folder = cache / f"pairs-{name}-{key}"
            with main_process_first(accelerator):
                arrays, wrote = _cached_arrays(
                    folder,
                    _PLAN_ARRAYS,
                    lambda sinks: plan_pools(
                        index, documents, *settings[:3], settings[3], epoch, task, pool, sinks
                    ),
                )
            if epoch != EVAL_EPOCH:
                for old in written:  # a mapping of it (another process) stays valid
                    shutil.rmtree(old, ignore_errors=True)
                written[:] = [folder] if wrote else []
            plan = PairPlan(*(arrays[name] for name in _PLAN_ARRAYS))
            return PairExamples(index, plan, tokenizer.cls_token_id, tokenizer.sep_token_id, task)

        def build_train(epoch: int):
            documents = train_docs
            if len(documents) > DOCUMENT_POOL:  # datasets' Dataset.shuffle(seed) order, as the in-memory path
                shuffle_seed = int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])
                documents = documents[np.random.default_rng(shuffle_seed).permutation(len(documents))]
            batches = math.ceil(len(documents) / DOCUMENT_POOL)
            return examples(train_index, "train", documents, epoch, math.ceil(len(documents) / batches))

        eval_dataset = None
        if validation_docs is not None and len(validation_docs):
            if task == "nsp" and len(validation_docs) < 2:
                raise DataError(
                    f"the validation split has {len(validation_docs)} document(s) but NSP needs 2: raise "
                    "--data.validation_split_percentage, give --data.validation_files, or use --model.objective=mlm+sop"
                )
            eval_dataset = examples(
                validation_index, "eval", validation_docs, EVAL_EPOCH, max(len(validation_docs), 1)
            )
    else:
        collator, eval_collator = make_decoder_collators(data_cfg, tokenizer, seed, objective)
        blocks = BlockExamples(train_index, train_docs, data_cfg.max_seq_length, tokenizer.eos_token_id)

        def build_train(epoch: int):
            return blocks

        eval_dataset = None
        if validation_docs is not None and len(validation_docs):
            eval_dataset = BlockExamples(
                validation_index, validation_docs, data_cfg.max_seq_length, tokenizer.eos_token_id
            )
    if eval_dataset is not None and len(eval_dataset) == 0:
        eval_dataset = None

    return PretrainingData(
        tokenizer=tokenizer,
        eval_dataset=eval_dataset,
        collator=collator,
        eval_collator=eval_collator,
        objective=objective,
        streaming=False,
        num_train_documents=len(train_docs),
        _build_train=build_train,  # every process calls it at once (the plan is written once per node)
    )


__all__ = [
    "BlockExamples",
    "DocumentIndex",
    "PairExamples",
    "PreparedCorpus",
    "build_prepared_data",
    "plan_pairs",
]

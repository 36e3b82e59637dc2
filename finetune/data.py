"""Task data for the fine-tuning scripts: loading (Hub name or local files), validation, label maps, and the
word -> sub-word label alignment used by token classification.

Every loader returns a `DatasetDict` with "train", "validation" and, when given, "test" splits, and renames the
task's columns to fixed names so that the scripts need not know the source layout:

    classification  text, text_pair (sentence pairs only), label
    tagging         tokens, tags            (lists of words and of tag names, one tag per word)
    seq2seq         source, target (+ references when the data has several targets per example)

Labels stay as they are in the data (names, ints or floats): build the maps with `build_label_maps` and turn
names into ids with `encode_labels`. Problems in the data raise `FinetuneDataError` with a one-line message.
"""

import gzip
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import pyarrow.compute
from datasets import ClassLabel, Dataset, DatasetDict, Features, List, Value, load_dataset

from kiln.errors import as_flag

IGNORE_INDEX = -100  # label id that torch's cross-entropy (and so every model head) skips

SPLITS = ("train", "validation", "test")
"""The splits every loader knows; a classification dataset may add further evaluation splits (e.g. MNLI's
validation_mismatched)."""
_SPLIT_ALIASES = {
    "train": "train",
    "validation": "validation",
    "valid": "validation",
    "dev": "validation",
    "val": "validation",
    "test": "test",
}
_DATASETS_BUILDERS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
_CONLLU_TAG_FIELDS = {"upos": 3, "xpos": 4}


class FinetuneDataError(ValueError):
    """The task data cannot be used as given; the message says what is wrong and how to fix it."""


# ----------------------------------------------------------------------------------------------------------
# CoNLL and CoNLL-U readers


def _open_text(path: str | os.PathLike):
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FinetuneDataError(f"file not found: {path}")
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _sentences_to_dataset(sentences: list[tuple[list[str], list[str]]], path) -> Dataset:
    if not sentences:
        raise FinetuneDataError(f"no sentences found in {path}; is it the right file and format?")
    return Dataset.from_dict(
        {"tokens": [tokens for tokens, _ in sentences], "tags": [tags for _, tags in sentences]},
        features=Features({"tokens": List(Value("string")), "tags": List(Value("string"))}),
    )


def read_conll(path: str | os.PathLike, tag_column: int = -1, token_column: int = 0) -> Dataset:
    """Read a CoNLL-style file (one word per line, columns split by tabs or spaces, a blank line between
    sentences, `-DOCSTART-` lines skipped; `.gz` allowed) into a Dataset with `tokens` and `tags` columns.
    `tag_column` picks the tag column (CoNLL-2003: -1 or 3 = NER, 1 = POS, 2 = chunk)."""
    sentences, tokens, tags = [], [], []
    first_width = None  # (line number, column count) of the first word line: every word line has as many
    with _open_text(path) as f:
        for line_number, line in enumerate(f, start=1):
            line = line.rstrip("\r\n")
            if not line.strip():
                if tokens:
                    sentences.append((tokens, tags))
                tokens, tags = [], []
                continue
            columns = line.split("\t") if "\t" in line else line.split()
            if columns[0] == "-DOCSTART-":
                continue
            width = len(columns)
            if not -width <= token_column < width or not -width <= tag_column < width:
                raise FinetuneDataError(
                    f"{path}:{line_number} has {width} columns, but token_column={token_column} and "
                    f"tag_column={tag_column} were asked for; pick columns that exist"
                )
            # a line that lost its tag column would otherwise make its word a tag (tag_column -1 is then the word)
            if token_column % width == tag_column % width:
                raise FinetuneDataError(
                    f"{path}:{line_number} has no tag column (just {line.strip()!r}); "
                    "give every word line its tag, or pick --data.tag_column / --data.token_column"
                )
            if first_width is None:
                first_width = (line_number, width)
            elif width != first_width[1]:
                raise FinetuneDataError(
                    f"{path}:{line_number} has {width} columns where line {first_width[0]} has {first_width[1]}; "
                    "is a column missing or a word split by a space? (separate columns by tabs to keep spaces)"
                )
            tokens.append(columns[token_column])
            tags.append(columns[tag_column])
    if tokens:
        sentences.append((tokens, tags))
    return _sentences_to_dataset(sentences, path)


def read_conllu(path: str | os.PathLike, tag_field: str = "upos") -> Dataset:
    """Read a CoNLL-U file (`.gz` allowed) into a Dataset with `tokens` (FORM) and `tags` (UPOS or XPOS).
    Comment lines, multiword-token ranges (`3-4`) and empty nodes (`8.1`) are skipped, so there is one tag per
    syntactic word."""
    if tag_field not in _CONLLU_TAG_FIELDS:
        raise FinetuneDataError(f"tag_field={tag_field!r} is not a CoNLL-U tag field; use 'upos' or 'xpos'")
    tag_index = _CONLLU_TAG_FIELDS[tag_field]
    sentences, tokens, tags = [], [], []
    with _open_text(path) as f:
        for line_number, line in enumerate(f, start=1):
            line = line.rstrip("\r\n")
            if not line.strip():
                if tokens:
                    sentences.append((tokens, tags))
                tokens, tags = [], []
                continue
            if line.startswith("#"):
                continue
            columns = line.split("\t")
            if len(columns) != 10:
                raise FinetuneDataError(
                    f"{path}:{line_number} has {len(columns)} tab-separated columns, CoNLL-U needs 10; "
                    "is this a CoNLL-U file? (use read_conll for other column formats)"
                )
            word_id = columns[0]
            if "-" in word_id or "." in word_id:
                continue
            tokens.append(columns[1])
            tags.append(columns[tag_index])
    if tokens:
        sentences.append((tokens, tags))
    return _sentences_to_dataset(sentences, path)


# ----------------------------------------------------------------------------------------------------------
# labels


def _is_missing(label) -> bool:
    return label is None or (isinstance(label, float) and math.isnan(label))


def _label_set(labels: Iterable) -> set:
    """The distinct labels of a label column, or of a tags column (lists of tags)."""
    names = set()
    for label in labels:
        if isinstance(label, (list, tuple)):
            names.update(label)
        else:
            names.add(label)
    return names


def is_regression(labels: Iterable) -> bool:
    """True when the labels are numbers and at least one is a float (e.g. STS-B scores): write class ids as
    ints (or names), since a column of 0.0/1.0 reads as regression."""
    labels = [label for label in labels if not _is_missing(label)]
    numbers = all(isinstance(label, (int, float)) and not isinstance(label, bool) for label in labels)
    return bool(labels) and numbers and any(isinstance(label, float) for label in labels)


def build_label_maps(labels: Iterable) -> tuple[dict, dict[int, object]]:
    """Sorted, stable maps between label names and ids: `(label2id, id2label)`. Names may be strings or ints
    (ints stay ints, sorted numerically, so labels 0..n-1 keep their values as ids); nested lists (tag
    sequences) are flattened."""
    names = _label_set(labels)
    if any(_is_missing(name) for name in names):
        raise FinetuneDataError("some labels are empty (None/NaN); fill them in or drop those rows")
    if not names:
        raise FinetuneDataError("no labels given; the label column is empty")
    kinds = {type(name) for name in names}
    if kinds not in ({str}, {int}):
        found = ", ".join(sorted(kind.__name__ for kind in kinds))
        raise FinetuneDataError(
            f"labels must be all strings or all ints, found {found}; fix the label column"
        )
    id2label = dict(enumerate(sorted(names)))
    label2id = {name: i for i, name in id2label.items()}
    return label2id, id2label


def b_to_i_map(label2id: dict) -> dict[int, int]:
    """Ids of `B-X` tags -> ids of their `I-X` tags, for labelling continuation pieces of a word."""
    return {
        label_id: label2id["I-" + name[2:]]
        for name, label_id in label2id.items()
        if isinstance(name, str) and name.startswith("B-") and "I-" + name[2:] in label2id
    }


def collect_labels(dataset: DatasetDict) -> list:
    """Every label (or tag) name used in any split, sorted: the label set to build the maps from."""
    names = set()
    for split in dataset.values():
        column = "tags" if "tags" in split.column_names else "label"
        if column in split.column_names:
            names |= _label_set(split[column])
    return sorted(names)


def encode_labels(dataset: DatasetDict, label2id: dict) -> DatasetDict:
    """Turn label/tag names into ids with `label2id`, in every split that has labels."""
    encoded = DatasetDict()
    for split_name, split in dataset.items():
        column = "tags" if "tags" in split.column_names else "label"
        if column not in split.column_names:
            encoded[split_name] = split
            continue
        _check_known_labels(split[column], label2id, f"the {split_name} split", "the label maps (label2id)")
        features = split.features.copy()
        features[column] = List(Value("int64")) if column == "tags" else Value("int64")
        encoded[split_name] = split.map(
            _encode_batch,
            batched=True,
            features=features,
            fn_kwargs={"column": column, "label2id": label2id},
            desc=f"encoding {split_name} labels",
        )
    return encoded


def _encode_batch(batch: dict, column: str, label2id: dict) -> dict:
    if column == "tags":
        return {column: [[label2id[tag] for tag in tags] for tags in batch[column]]}
    return {column: [label2id[label] for label in batch[column]]}


def _check_known_labels(labels: Iterable, known: Iterable, where: str, known_as: str) -> None:
    unknown = _label_set(labels) - set(known)
    if unknown:
        shown = ", ".join(repr(label) for label in sorted(unknown, key=str)[:10])
        more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        raise FinetuneDataError(
            f"labels in {where} not found in {known_as}: {shown}{more}; fix the labels, or give the full "
            "label set (label_list) when rare labels are missing from training"
        )


# ----------------------------------------------------------------------------------------------------------
# word -> sub-word alignment for token classification


def align_labels_with_tokens(
    word_ids: Sequence[int | None],
    word_labels: Sequence[int],
    label_all_tokens: bool = False,
    b_to_i: dict[int, int] | None = None,
) -> list[int]:
    """One label per sub-word piece: the word's label on its first piece; on the other pieces -100 (ignored by
    the loss) or, with `label_all_tokens`, the word's label again with B-X turned into I-X (`b_to_i`). Special
    tokens (word id None) get -100."""
    b_to_i = b_to_i or {}
    labels = []
    previous_word = None
    for word_id in word_ids:
        if word_id is None:
            labels.append(IGNORE_INDEX)
        elif word_id != previous_word:
            labels.append(word_labels[word_id])
        elif label_all_tokens:
            labels.append(b_to_i.get(word_labels[word_id], word_labels[word_id]))
        else:
            labels.append(IGNORE_INDEX)
        previous_word = word_id
    return labels


def words_with_leading_space(tokenizer):
    """A byte-level BPE tokenizer (a Kiln decoder's, GPT-2's) told to add the prefix space, so that each pre-split
    word is tokenized as it is in running text, after a space (`Ġold`, not `old`), the first word too, as
    transformers' GPT-2 and RoBERTa taggers are; its tokenizer.json keeps the setting, so the token-classification
    pipeline tokenizes a sentence's words the same way. Other tokenizers (WordPiece) are left as they are."""
    from tokenizers import pre_tokenizers

    if not getattr(tokenizer, "is_fast", False):
        return tokenizer
    step = tokenizer.backend_tokenizer.pre_tokenizer
    steps = [step]
    if isinstance(step, pre_tokenizers.Sequence):  # indexable, not iterable
        steps = list(_sequence_steps(step))
    for step in steps:
        if isinstance(step, pre_tokenizers.ByteLevel):
            step.add_prefix_space = True
    return tokenizer


def _sequence_steps(sequence):
    """The pre-tokenizers of a `pre_tokenizers.Sequence`, each the one inside it (changed in place)."""
    i = 0
    while True:
        try:
            yield sequence[i]
        except IndexError:
            return
        i += 1


def tokenize_and_align(
    examples: dict,
    tokenizer,
    label_all_tokens: bool = False,
    max_length: int | None = None,
    b_to_i: dict[int, int] | None = None,
    return_word_ids: bool = False,
) -> dict:
    """For `Dataset.map(batched=True)`: tokenize pre-split `tokens` with a fast tokenizer and align the tag ids
    in `tags` (already ids, see `encode_labels`) to the pieces as `labels`. With `return_word_ids` the piece ->
    word map is kept as `word_ids` (None for special tokens) to map predictions back with
    `words_from_predictions`; drop that column before batching."""
    if not getattr(tokenizer, "is_fast", False):
        raise FinetuneDataError(
            f"{type(tokenizer).__name__} is not a fast tokenizer, and word alignment needs word_ids(); "
            "load one backed by `tokenizers` (a tokenizer.json)"
        )
    encoding = tokenizer(examples["tokens"], is_split_into_words=True, truncation=True, max_length=max_length)
    word_ids = [encoding.word_ids(i) for i in range(len(examples["tokens"]))]
    if "tags" in examples:
        encoding["labels"] = [
            align_labels_with_tokens(ids, tags, label_all_tokens, b_to_i)
            for ids, tags in zip(word_ids, examples["tags"])
        ]
    if return_word_ids:
        encoding["word_ids"] = word_ids
    return encoding


def words_from_predictions(pred_ids: Sequence[int], word_ids: Sequence[int | None]) -> list[int]:
    """Piece-level predictions -> one per word (the first piece's), in word order. Pieces without a word
    (special tokens, padding: None or negative) are skipped; `pred_ids` may be longer than `word_ids`
    (padded batches). Words cut off by truncation get no prediction, so the result can be shorter than the
    sentence: compare it with the same number of gold tags."""
    word_predictions = []
    previous_word = None
    for pred_id, word_id in zip(pred_ids, word_ids):
        if word_id is None or word_id < 0:
            continue
        if word_id != previous_word:
            word_predictions.append(int(pred_id))
        previous_word = word_id
    return word_predictions


# ----------------------------------------------------------------------------------------------------------
# loading


def _read_file(path: str, reader=None, column_names: Sequence[str] | None = None) -> Dataset:
    """One local file -> Dataset: `reader(path)` when given, else the datasets builder for its extension.
    `column_names`: the columns of a csv/tsv file that has no header line (its first line is data)."""
    if not os.path.isfile(path):
        raise FinetuneDataError(f"file not found: {path}")
    if os.path.getsize(path) == 0:
        what = "one JSON object per line" if ".json" in path.lower() else "a header and data rows"
        raise FinetuneDataError(f"{path} is empty (0 bytes): give a file with {what}")
    if reader is not None:
        return reader(path)
    stem = path[: -len(".gz")] if path.endswith(".gz") else path
    extension = os.path.splitext(stem)[1].lower()
    if extension not in _DATASETS_BUILDERS:
        raise FinetuneDataError(
            f"cannot read {path}: use a .csv, .tsv, .json, .jsonl or .parquet file (optionally .gz)"
        )
    options = {"delimiter": "\t", "quoting": 3} if extension == ".tsv" else {}  # GLUE-style tsv: no quoting
    if column_names:
        options["column_names"] = list(column_names)
    try:
        return load_dataset(_DATASETS_BUILDERS[extension], data_files={"train": path}, **options)["train"]
    except ValueError as error:
        if "corresponds to no data" not in str(error):  # what datasets says when a file has no rows
            raise
        raise FinetuneDataError(f"{path} is empty: it has no data rows") from None


def _load_splits(
    dataset_name,
    dataset_config,
    files: dict[str, str | None],
    reader=None,
    hub_splits: dict[str, str] | None = None,
    column_names: dict[str, Sequence[str]] | None = None,
    revision: str | None = None,
    offline_fix: str | None = None,
) -> DatasetDict:
    """Splits by name. `hub_splits`: our split name -> the Hub dataset's (default: the usual aliases, dev ->
    validation, ...); `column_names`: split -> columns of a local file without a header line; `revision`: the
    Hub dataset's branch, tag, commit or `refs/convert/parquet`; `offline_fix`: how to give the data as local
    files instead, named when the Hub dataset cannot be loaded (default: the --data.*_file options)."""
    given_files = {split: path for split, path in files.items() if path}
    if dataset_name and given_files:
        raise FinetuneDataError("give either dataset_name or local files (train_file, ...), not both")
    if dataset_name:
        try:
            raw = load_dataset(dataset_name, dataset_config, **({"revision": revision} if revision else {}))
        except ConnectionError:  # no network or offline, and not in the datasets cache
            raise FinetuneDataError(_unreachable_dataset(dataset_name, dataset_config, offline_fix)) from None
        except RuntimeError as error:  # datasets >= 4 runs no loading scripts
            if "Dataset scripts are no longer supported" not in str(error):
                raise
            raise FinetuneDataError(
                f"{dataset_name}{f' (revision {revision})' if revision else ''} has only a loading script, which "
                "datasets no longer runs: give --data.dataset_revision refs/convert/parquet (the Hub's Parquet "
                "export of it), another Hub dataset with data files, or local files"
            ) from None
        if hub_splits is None:
            hub_splits = {_SPLIT_ALIASES[name]: name for name in raw if name in _SPLIT_ALIASES}
        dataset = DatasetDict({ours: raw[theirs] for ours, theirs in hub_splits.items() if theirs in raw})
    elif given_files:
        column_names = column_names or {}
        dataset = DatasetDict(
            {
                split: _read_file(os.fspath(path), reader, column_names.get(split))
                for split, path in given_files.items()
            }
        )
    else:
        raise FinetuneDataError("no data: give dataset_name (a Hub dataset or local folder) or train_file")
    if "train" not in dataset:
        found = ", ".join(dataset) or "none"
        raise FinetuneDataError(
            f"no train split (found: {found}); give train_file or a dataset with a train split"
        )
    for split_name, split in dataset.items():
        if len(split) == 0:
            raise FinetuneDataError(f"the {split_name} split is empty; check the file or dataset config")
    return dataset


OFFLINE_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "finetune" / "offline"
"""The shipped configs that read local copies of the Hub data sets the other fine-tuning configs name."""


def offline_config_for(dataset_name: str, dataset_config: str | None) -> Path | None:
    """The config in OFFLINE_CONFIGS whose `_base_` loads `dataset_name` (`dataset_config`) from the Hub."""
    import yaml

    from kiln.config import load_yaml

    for path in sorted(OFFLINE_CONFIGS.glob("*.yaml")):
        try:
            base = yaml.safe_load(path.read_text(encoding="utf-8")).get("_base_")
            data = load_yaml(path.parent / base).get("data", {}) if isinstance(base, str) else {}
        except Exception:  # a config that does not read: not the one
            continue
        if data.get("dataset_name") == dataset_name and data.get("dataset_config") == dataset_config:
            return path
    return None


def _unreachable_dataset(dataset_name: str, dataset_config: str | None, offline_fix: str | None) -> str:
    """The one line for a Hub data set that can neither be downloaded nor read from the datasets cache."""
    from datasets import config as datasets_config

    name = f"{dataset_name} ({dataset_config})" if dataset_config else dataset_name
    why = "HF_HUB_OFFLINE is set" if datasets_config.HF_HUB_OFFLINE else "the Hub cannot be reached"
    if offline_fix is None:
        twin = offline_config_for(dataset_name, dataset_config)
        offline_fix = (
            "--data.dataset_name none with --data.train_file, --data.validation_file and --data.test_file"
            + (f" (as --config {twin.relative_to(OFFLINE_CONFIGS.parents[2])} does)" if twin else "")
        )
        if dataset_name == "nyu-mll/glue" and dataset_config:  # the GLUE distribution's files, by task preset
            offline_fix += (
                f", or --data.glue_task {dataset_config} --data.glue_dir DIR (the task's GLUE folder)"
            )
    return (
        f"cannot load the Hub dataset {name}: {why} and the datasets cache does not hold it; run once with the "
        f"network to cache it (HF_HUB_OFFLINE=1 then reads the cache), or read local copies: {offline_fix}"
    )


def _require_columns(
    dataset: DatasetDict, columns: Sequence[str], what: str, option: str, splits=None
) -> None:
    """Every column in `columns` exists in each split (`splits`, default all); else one line naming the setting
    (`option`, e.g. "data.label_column") as its flag and the columns the split has."""
    for split_name in dataset if splits is None else splits:
        if split_name not in dataset:
            continue
        existing = dataset[split_name].column_names
        missing = [column for column in columns if column not in existing]
        if missing:
            raise FinetuneDataError(
                f"{what} column {', '.join(map(repr, missing))} not found in the {split_name} split, whose columns "
                f"are: {', '.join(existing)}; set {as_flag(option)} to one of them"
            )


def _require_text(
    dataset: DatasetDict, columns: Sequence[str], what: str, option: str, lists: bool = False
) -> None:
    """Text columns must hold strings (or, with `lists`, lists of strings): numbers in a jsonl/csv column, say,
    would otherwise fail deep inside the tokenizer."""
    for split_name, split in dataset.items():
        for column in columns:
            feature = split.features.get(column)
            if feature is None:
                continue
            inner = getattr(feature, "feature", None) if lists else None
            dtype = getattr(inner if inner is not None else feature, "dtype", None)
            if dtype in ("string", "large_string"):
                continue
            example = next((row for row in split[column][:100] if row is not None), None)
            raise FinetuneDataError(
                f"{what} column {column!r} of the {split_name} split holds {type(example).__name__} values "
                f"(e.g. {str(example)[:40]!r}), not text; point {option} at a column of strings"
            )


def _require_filled(dataset: DatasetDict, columns: Sequence[str], origins: dict[str, str]) -> None:
    """Text cells must not be empty: an empty csv cell (or a JSON null) is None, which the tokenizer refuses
    with a traceback at the first batch. `origins`: split name -> the file (or dataset) it was read from."""
    for split_name, split in dataset.items():
        for column in columns:
            if column not in split.column_names:
                continue
            cells = split.with_format("arrow")[column]  # null counts without reading the texts into Python
            if not cells.null_count:
                continue
            first = pyarrow.compute.index(cells.is_null(), True).as_py()
            more = cells.null_count - 1
            raise FinetuneDataError(
                f"{origins.get(split_name, f'the {split_name} split')}: text column {column!r} is empty in row "
                f"{first + 1}{f' and {more} more rows' if more else ''} (rows counted from 1, without a header "
                "line); fill in or drop those rows"
            )


def _class_labels_to_names(split: Dataset, column: str) -> Dataset:
    """Hub datasets store labels as ClassLabel ids: use the names instead (-1, "no label", becomes None)."""
    feature = split.features[column]
    inner = feature.feature if isinstance(feature, List) else feature
    if not isinstance(inner, ClassLabel):
        return split
    names = inner.names
    features = split.features.copy()
    if isinstance(feature, List):
        features[column] = List(Value("string"))

        def to_names(batch):
            return {column: [[names[i] for i in ids] for ids in batch[column]]}
    else:
        features[column] = Value("string")

        def to_names(batch):
            return {column: [names[i] if i >= 0 else None for i in batch[column]]}

    return split.map(to_names, batched=True, features=features, desc="label ids to names")


def _name_int_labels(split: Dataset, names: Sequence[str], split_name: str) -> Dataset:
    """Int labels i -> names[i]; a column of anything else is left as it is."""
    dtype = split.features["label"].dtype if isinstance(split.features["label"], Value) else None
    if dtype is None or not dtype.startswith(("int", "uint")):
        return split
    unknown = sorted({label for label in split["label"] if label is not None and not 0 <= label < len(names)})
    if unknown:
        raise FinetuneDataError(
            f"labels {unknown[:10]} in the {split_name} split are not ids of {', '.join(names)} "
            f"(0..{len(names) - 1}); is this the right file?"
        )
    features = split.features.copy()
    features["label"] = Value("string")

    def to_names(batch):
        return {"label": [None if label is None else names[label] for label in batch["label"]]}

    return split.map(to_names, batched=True, features=features, desc="label ids to names")


def _keep_columns(split: Dataset, renames: dict[str, str]) -> Dataset:
    split = split.select_columns([column for column in renames if column in split.column_names])
    return split.rename_columns(
        {old: new for old, new in renames.items() if old != new and old in split.column_names}
    )


def _drop_unlabelled_test(dataset: DatasetDict, column: str) -> None:
    """A test split whose labels are all missing (GLUE test sets: -1) is kept for prediction, without labels;
    partly missing labels anywhere are an error."""
    for split_name, split in list(dataset.items()):
        if column not in split.column_names:
            continue
        missing = sum(_is_missing(label) for label in split[column])
        if missing == len(split) and split_name == "test":
            dataset[split_name] = split.remove_columns(column)
        elif missing:
            raise FinetuneDataError(
                f"{missing} of {len(split)} rows in the {split_name} split have no label; "
                "fill them in or drop those rows"
            )


def _add_validation_split(dataset: DatasetDict, validation_split_percentage: float, seed: int) -> DatasetDict:
    if "validation" in dataset:
        return dataset
    if not 0 < validation_split_percentage < 100:
        raise FinetuneDataError(
            f"there is no validation split and validation_split_percentage={validation_split_percentage} "
            "cannot make one; give validation_file or a percentage between 0 and 100"
        )
    train = dataset["train"]
    n_validation = int(len(train) * validation_split_percentage / 100)
    if n_validation < 1 or n_validation >= len(train):
        raise FinetuneDataError(
            f"{validation_split_percentage}% of {len(train)} training rows leaves no validation or no training "
            "rows; give validation_file or change validation_split_percentage"
        )
    parts = train.train_test_split(test_size=n_validation, seed=seed)
    result = DatasetDict({"train": parts["train"], "validation": parts["test"]})
    result.update({name: split for name, split in dataset.items() if name != "train"})
    return result


def _check_labels(dataset: DatasetDict, column: str, label_list: Sequence | None) -> None:
    """Evaluation labels must be known from training (or from `label_list`, when given)."""
    if label_list is not None:
        for split_name, split in dataset.items():
            if column in split.column_names:
                _check_known_labels(
                    split[column], label_list, f"the {split_name} split", "the given label_list"
                )
        return
    train_labels = _label_set(dataset["train"][column])
    for split_name in dataset:
        if split_name != "train" and column in dataset[split_name].column_names:
            _check_known_labels(dataset[split_name][column], train_labels, f"the {split_name} split", "train")


def load_classification_data(
    dataset_name: str | None = None,
    dataset_config: str | None = None,
    dataset_revision: str | None = None,
    train_file: str | None = None,
    validation_file: str | None = None,
    test_file: str | None = None,
    text_columns: Sequence[str] | str | None = None,
    label_column: str = "label",
    label_list: Sequence | None = None,
    validation_split_percentage: float = 10,
    seed: int = 42,
    extra_files: dict[str, str] | None = None,
    hub_splits: dict[str, str] | None = None,
    column_names: dict[str, Sequence[str]] | None = None,
    int_label_names: Sequence[str] | None = None,
    unlabelled_test: bool = False,
    offline_fix: str | None = None,
) -> DatasetDict:
    """Sentence(-pair) classification data from a Hub dataset (or local folder) or csv/tsv/json/jsonl/parquet
    files, as columns `text` (+ `text_pair`) and `label`. `text_columns`: one column, or two for pairs; by
    default the first of ("sentence1", "sentence2"), ("sentence",), ("text",) present. A test split without
    labels is kept, without a `label` column. Float labels mean regression (see `is_regression`).

    Beyond train/validation/test (used by the GLUE presets, finetune/glue_tasks.py): `extra_files` adds further
    labelled evaluation splits by name (MNLI's mismatched dev set); `hub_splits` maps split names to the Hub
    dataset's; `column_names` names the columns of files without a header line, by split; `int_label_names`
    turns int labels i into int_label_names[i] (files that write 0/1 where the Hub has names);
    `unlabelled_test` drops the test split's labels (placeholders such as GLUE's -1); `offline_fix` names the
    local files to give when the Hub dataset cannot be loaded."""
    files = {"train": train_file, "validation": validation_file, "test": test_file, **(extra_files or {})}
    dataset = _load_splits(
        dataset_name,
        dataset_config,
        files,
        hub_splits=hub_splits,
        column_names=column_names,
        revision=dataset_revision,
        offline_fix=offline_fix,
    )
    columns = dataset["train"].column_names
    if text_columns is None:
        candidates = [("sentence1", "sentence2"), ("sentence",), ("text",)]
        text_columns = next((c for c in candidates if all(name in columns for name in c)), None)
        if text_columns is None:
            raise FinetuneDataError(
                f"cannot guess the text column(s) among: {', '.join(columns)}; set --data.text_columns"
            )
    text_columns = [text_columns] if isinstance(text_columns, str) else list(text_columns)
    if len(text_columns) not in (1, 2):
        raise FinetuneDataError(f"--data.text_columns must name 1 or 2 columns, got {len(text_columns)}")
    _require_columns(dataset, text_columns, "text", "data.text_columns")
    origins = {split: os.fspath(path) for split, path in files.items() if path}
    if dataset_name:
        origins = {split: f"the {split} split of {dataset_name}" for split in dataset}
    _require_filled(dataset, text_columns, origins)
    _require_text(dataset, text_columns, "text", "data.text_columns")
    if unlabelled_test and "test" in dataset and label_column in dataset["test"].column_names:
        dataset["test"] = dataset["test"].remove_columns(label_column)
    _require_columns(
        dataset,
        [label_column],
        "label",
        "data.label_column",
        splits=[name for name in dataset if name != "test"],
    )

    renames = dict(zip(text_columns, ("text", "text_pair")))
    renames[label_column] = "label"
    for split_name, split in dataset.items():
        if label_column in split.column_names:
            split = _class_labels_to_names(split, label_column)
        split = _keep_columns(split, renames)
        if int_label_names and "label" in split.column_names:
            split = _name_int_labels(split, int_label_names, split_name)
        dataset[split_name] = split
    _drop_unlabelled_test(dataset, "label")
    if not is_regression(dataset["train"]["label"]):
        _check_labels(dataset, "label", label_list)
    return _add_validation_split(dataset, validation_split_percentage, seed)


def _tagging_reader(tag_column: int, token_column: int, tag_field: str):
    def read(path: str) -> Dataset:
        stem = path[: -len(".gz")] if path.endswith(".gz") else path
        extension = os.path.splitext(stem)[1].lower()
        if extension == ".conllu":
            return read_conllu(path, tag_field=tag_field)
        if extension in _DATASETS_BUILDERS and extension != ".tsv":
            return _read_file(path)
        return read_conll(path, tag_column=tag_column, token_column=token_column)

    return read


def load_tagging_data(
    dataset_name: str | None = None,
    dataset_config: str | None = None,
    dataset_revision: str | None = None,
    train_file: str | None = None,
    validation_file: str | None = None,
    test_file: str | None = None,
    tokens_column: str = "tokens",
    tags_column: str = "tags",
    tag_column: int = -1,
    token_column: int = 0,
    tag_field: str = "upos",
    label_list: Sequence[str] | None = None,
    validation_split_percentage: float = 10,
    seed: int = 42,
) -> DatasetDict:
    """Token classification data as columns `tokens` and `tags` (tag names). Sources: a Hub dataset (or local
    folder) with lists in `tokens_column` / `tags_column` (ClassLabel ids become names); `.conllu` files
    (`tag_field` "upos" or "xpos"); `.json`/`.jsonl`/`.parquet` files with those list columns; any other file
    is read as CoNLL columns (`token_column`, `tag_column`). `.gz` works for all files."""
    reader = _tagging_reader(tag_column, token_column, tag_field)
    dataset = _load_splits(
        dataset_name,
        dataset_config,
        {"train": train_file, "validation": validation_file, "test": test_file},
        reader=reader,
        revision=dataset_revision,
    )
    _require_columns(dataset, [tokens_column], "tokens", "data.tokens_column")
    _require_columns(dataset, [tags_column], "tags", "data.tags_column", splits=("train", "validation"))
    for split_name, split in dataset.items():
        if tags_column in split.column_names:
            split = _class_labels_to_names(split, tags_column)
        split = _keep_columns(split, {tokens_column: "tokens", tags_column: "tags"})
        if "tags" in split.column_names:
            for row, (tokens, tags) in enumerate(zip(split["tokens"], split["tags"])):
                if len(tokens) != len(tags):
                    raise FinetuneDataError(
                        f"row {row} of the {split_name} split has {len(tokens)} tokens but {len(tags)} tags; "
                        "every word needs exactly one tag"
                    )
        dataset[split_name] = split
    _check_labels(dataset, "tags", label_list)
    return _add_validation_split(dataset, validation_split_percentage, seed)


def _parallel_text_reader(source_lang: str | None, target_lang: str | None):
    """`train.en` -> pairs with `train.de` (the same name with the target language as extension)."""

    def read(path: str) -> Dataset:
        if source_lang and target_lang and path.endswith("." + source_lang):
            target_path = path[: -len(source_lang)] + target_lang
            with _open_text(path) as f:
                sources = f.read().splitlines()
            with _open_text(target_path) as f:
                targets = f.read().splitlines()
            if len(sources) != len(targets):
                raise FinetuneDataError(
                    f"{path} has {len(sources)} lines but {target_path} has {len(targets)}; "
                    "parallel files need one line per sentence pair"
                )
            return Dataset.from_dict({"source": sources, "target": targets})
        return _read_file(path)

    return read


def load_seq2seq_data(
    dataset_name: str | None = None,
    dataset_config: str | None = None,
    dataset_revision: str | None = None,
    train_file: str | None = None,
    validation_file: str | None = None,
    test_file: str | None = None,
    source_column: str = "source",
    target_column: str = "target",
    source_lang: str | None = None,
    target_lang: str | None = None,
    validation_split_percentage: float = 10,
    seed: int = 42,
) -> DatasetDict:
    """Encoder-decoder data as string columns `source` and `target`. Sources: a Hub dataset (or local folder);
    json/jsonl/csv/tsv/parquet files; or, with `source_lang`/`target_lang`, parallel text files named by
    language (`train_file="train.en"` pairs with `train.de`). With languages set, a WMT-style `translation`
    column ({"en": ..., "de": ...}) or columns named by the languages are used. A list-valued source (sentences
    of an abstract, as in SciTLDR) is joined with spaces; a list-valued target gives `target` = its first item
    and `references` = the whole list."""
    reader = _parallel_text_reader(source_lang, target_lang)
    dataset = _load_splits(
        dataset_name,
        dataset_config,
        {"train": train_file, "validation": validation_file, "test": test_file},
        reader=reader,
        revision=dataset_revision,
    )
    columns = dataset["train"].column_names
    if source_lang and target_lang and "translation" in columns:

        def from_translation(batch):
            pairs = batch["translation"]
            return {"source": [p[source_lang] for p in pairs], "target": [p[target_lang] for p in pairs]}

        for split_name, split in dataset.items():
            dataset[split_name] = split.map(from_translation, batched=True, remove_columns=split.column_names)
    elif source_lang and target_lang and source_lang in columns and target_lang in columns:
        source_column, target_column = source_lang, target_lang
    _require_columns(
        dataset, [source_column, target_column], "source/target", "data.source_column / --data.target_column"
    )
    _require_text(
        dataset,
        [source_column, target_column],
        "source/target",
        "data.source_column/target_column",
        lists=True,
    )

    def flatten(batch):
        sources = [" ".join(s) if isinstance(s, list) else s for s in batch["source"]]
        targets = batch["target"]
        out = {"source": sources, "target": [t[0] if isinstance(t, list) and t else t for t in targets]}
        if targets and isinstance(targets[0], list):
            out["references"] = targets
        return out

    for split_name, split in dataset.items():
        split = _keep_columns(split, {source_column: "source", target_column: "target"})
        empty_targets = [row for row, target in enumerate(split["target"]) if not target]
        if empty_targets:
            raise FinetuneDataError(
                f"{len(empty_targets)} rows of the {split_name} split have an empty target "
                f"(first: row {empty_targets[0]}); drop them or fix --data.target_column"
            )
        dataset[split_name] = split.map(flatten, batched=True, desc=f"{split_name} to source/target text")
    return _add_validation_split(dataset, validation_split_percentage, seed)


__all__ = [
    "IGNORE_INDEX",
    "FinetuneDataError",
    "align_labels_with_tokens",
    "b_to_i_map",
    "build_label_maps",
    "collect_labels",
    "encode_labels",
    "is_regression",
    "load_classification_data",
    "load_seq2seq_data",
    "load_tagging_data",
    "read_conll",
    "read_conllu",
    "tokenize_and_align",
    "words_from_predictions",
]

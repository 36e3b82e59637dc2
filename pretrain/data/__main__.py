"""Inspect the data of a run config (a few decoded examples with their masks, and measured statistics), or
prepare its corpus once for many runs.

python -m pretrain.data --config configs/pretrain/encoder-tiny.yaml [--data.key VALUE ...]
                        [--examples 3] [--stat_sequences 10000]
python -m pretrain.data prepare --config X --output DIR [--num_proc N] [--shard i/n] [--shard_size_mb 16]
"""

from __future__ import annotations

import itertools
import os
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from typing import TYPE_CHECKING

from kiln.config import build_config
from kiln.errors import ConfigError

from ..config import RunConfig
from .common import DataError

if TYPE_CHECKING:
    import torch

# torch, datasets and the in-memory pipeline are imported where inspecting needs them: `prepare` starts without
# them (seconds of start-up that run before its worker processes can share the work)

INSPECT_OPTIONS = (
    ("--examples N", "int", "3", "decoded examples to print"),
    ("--stat_sequences N", "int", "10000", "training sequences to measure (several epochs if needed)"),
)
"""The options of `python -m pretrain.data` besides the run config's: (flag, type, default, meaning)."""

PREPARE_OPTIONS = (
    (
        "--output DIR",
        "str",
        "required",
        "the prepared folder; run the same command again to resume a killed prepare",
    ),
    ("--num_proc N", "int", "data.num_proc, else 1", "worker processes"),
    (
        "--shard i/n",
        "str",
        "0/1",
        "prepare only part i of n (0 <= i < n) of the shards, e.g. one part per machine into a shared folder; the "
        "part that finishes last writes manifest.json (on node-local disks, copy the shards into one folder: "
        "training merges their .json files)",
    ),
    (
        "--shard_size_mb M",
        "float",
        "16",
        "text per shard: larger files are split into ranges of this size at document boundaries, smaller ones "
        "grouped",
    ),
)
"""The options of `python -m pretrain.data prepare` besides the run config's: (flag, type, default, meaning)."""


def _option_lines(options) -> str:
    lines = []
    for flag, _type, default, meaning in options:
        text = f"{meaning} (default: {default})" if default != "required" else f"{meaning} (required)"
        wrapped = textwrap.wrap(text, 86)
        lines.append(f"  {flag:<20}  {wrapped[0]}")
        lines += [" " * 24 + line for line in wrapped[1:]]
    return "\n".join(lines)


DESCRIPTION = f"""Inspect the pretraining data of a run config without training: reads the corpus, trains the tokenizer
(into a temporary folder, unless tokenizer.name_or_path is set), builds the examples, prints a few of them
decoded with their masks shown, and measures over many training sequences: the MLM selection rate, the
[MASK]/random/unchanged split, the IsNext share and lengths (encoder), or blocks and EOS counts (decoder).

Extra options of this command:
{_option_lines(INSPECT_OPTIONS)}

Masks are shown as [MASK/orig] (replaced by [MASK]), {{rand/orig}} (replaced by a random token) and <orig>
(selected but left unchanged).

To tokenize a corpus once and train on it many times (any size, memory-flat, parallel, resumable, split across
machines), see `python -m pretrain.data prepare --help`. Guide: docs/data-and-scale.md."""

PREPARE_DESCRIPTION = f"""Prepare once, train many: read the corpus of a run config (data.data_files, any mix of file
sizes, a single huge file included) in bounded chunks, train the tokenizer on a seeded sample of at most
tokenizer.input_sentence_size lines (default 50,000), and write the tokenized, sentence-split, document-indexed
corpus to --output as Arrow shards with tokenizer/ and manifest.json. Then train from it with
`accelerate launch pretrain/run.py --config X --data.prepared DIR` (memory-mapped, nothing tokenized again).

Options of this command (besides --config and the dotted overrides of the run config):
{_option_lines(PREPARE_OPTIONS)}

The settings the shards depend on (model.kind, data.document_separator, data.sentence_split, data.text_column,
the tokenizer section, training.seed for the sample) are recorded in --output's manifest.json; a run whose
settings differ is stopped with one line naming the setting. Of the run config, prepare reads only the options
listed below; a YAML file may hold the others (the run that trains from the folder reads them).
Guide: docs/data-and-scale.md."""


def _pop_int(argv: list[str], flag: str, default: int) -> tuple[int, list[str]]:
    rest, value, i = [], default, 0
    while i < len(argv):
        key, eq, inline = argv[i].partition("=")
        if key == flag:
            raw = inline if eq else (argv[i + 1] if i + 1 < len(argv) else "")
            i += 1 if eq else 2
            try:
                value = int(raw)
            except ValueError:
                raise ConfigError(f"{flag} needs a whole number, got {raw!r}") from None
            continue
        rest.append(argv[i])
        i += 1
    return value, rest


def render_tokens(tokenizer, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> str:
    """Decoded text; with labels (MLM), WordPiece tokens joined into words with each selected position shown."""
    if labels is None:
        return tokenizer.decode(input_ids)
    special = set(tokenizer.all_special_ids)
    words: list[str] = []
    glue_allowed = False
    for token_id, original in zip(input_ids.tolist(), labels.tolist()):
        if token_id == tokenizer.pad_token_id and original == -100:
            break
        token = tokenizer.convert_ids_to_tokens(token_id)
        shown = token
        if original != -100:
            source = tokenizer.convert_ids_to_tokens(original)
            token = source  # word boundaries follow the original text
            bare = source.removeprefix("##")
            if token_id == tokenizer.mask_token_id:
                shown = f"[MASK/{bare}]"
            elif token_id != original:
                shown = f"{{{tokenizer.convert_ids_to_tokens(token_id).removeprefix('##')}/{bare}}}"
            else:
                shown = f"<{bare}>"
        if token.startswith("##") and glue_allowed:
            words[-1] += shown.removeprefix("##")
        else:
            words.append(shown)
        glue_allowed = token_id not in special or original != -100
    return " ".join(words)


def _batches(dataset, collator, batch_size: int = 256) -> Iterator[dict]:
    """Collated batches in dataset order (as a DataLoader without shuffling would give them)."""
    from datasets import IterableDataset

    if isinstance(dataset, IterableDataset):
        examples = iter(dataset)
        while chunk := list(itertools.islice(examples, batch_size)):
            yield collator(chunk)
        return
    for columns in dataset.iter(batch_size=batch_size):
        yield collator([dict(zip(columns, values)) for values in zip(*columns.values())])


def training_batches(data, limit: int) -> Iterator[tuple[int, dict]]:
    """(epoch, collated batch) over consecutive epochs until `limit` sequences were produced."""
    produced = 0
    for epoch in itertools.count():
        data.collator.set_epoch(epoch)
        empty = True
        for batch in _batches(data.train_dataset(epoch), data.collator):
            empty = False
            yield epoch, batch
            produced += len(batch["input_ids"])
            if produced >= limit:
                return
        if empty or epoch >= 1000:
            return


def encoder_statistics(data, limit: int, max_seq_length: int) -> dict[str, float]:
    import torch

    tokenizer = data.tokenizer
    special = torch.zeros(len(tokenizer), dtype=torch.bool)
    special[tokenizer.all_special_ids] = True
    totals = dict.fromkeys(
        [
            "sequences",
            "maskable",
            "selected",
            "masked",
            "random",
            "kept",
            "is_next",
            "full",
            "tokens",
            "positions",
        ],
        0,
    )
    from .collator import real_tokens  # torch: imported once statistics are asked for

    epochs = set()
    for epoch, batch in training_batches(data, limit):
        epochs.add(epoch)
        ids, labels, attention = batch["input_ids"], batch["labels"], real_tokens(batch)
        selected = labels != -100
        original = torch.where(selected, labels, ids)
        totals["sequences"] += len(ids)
        totals["maskable"] += int((attention & ~special[original]).sum())
        totals["selected"] += int(selected.sum())
        totals["masked"] += int((selected & (ids == tokenizer.mask_token_id)).sum())
        totals["kept"] += int((selected & (ids == labels)).sum())
        totals["random"] += int((selected & (ids != labels) & (ids != tokenizer.mask_token_id)).sum())
        lengths = attention.sum(1)
        totals["full"] += int((lengths >= max_seq_length).sum())
        totals["tokens"] += int(lengths.sum())
        totals["positions"] += attention.numel()
        if "next_sentence_label" in batch:
            totals["is_next"] += int((batch["next_sentence_label"] == 0).sum())
    totals["epochs"] = len(epochs)
    return totals


def decoder_statistics(data, limit: int) -> dict[str, float]:
    from .collator import real_tokens  # torch: imported once statistics are asked for

    totals = dict.fromkeys(["sequences", "tokens", "eos", "padding", "positions"], 0)
    epochs = set()
    for epoch, batch in training_batches(data, limit):
        epochs.add(epoch)
        attention = real_tokens(batch)
        totals["sequences"] += len(attention)
        totals["tokens"] += int(attention.sum())
        totals["eos"] += int(((batch["input_ids"] == data.tokenizer.eos_token_id) & attention).sum())
        totals["padding"] += int((~attention).sum())
        totals["positions"] += attention.numel()
    totals["epochs"] = len(epochs)
    return totals


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.2f}%" if whole else "n/a"


def inspect(cfg: RunConfig, examples: int, stat_sequences: int, out=None) -> dict[str, float]:
    from .pipeline import PAIR_TASK, build_pretraining_data
    from .tokenizer import padded_vocab_size, prepare_tokenizer

    out = out or sys.stdout
    kind = cfg.model.kind
    objective = cfg.model.objective if kind == "encoder" else "clm"
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = prepare_tokenizer(cfg.tokenizer, cfg.data, kind, tmp)
        data = build_pretraining_data(
            cfg.data, tokenizer, kind, objective, cfg.training.seed, cfg.model.max_position_embeddings
        )
        train = data.train_dataset(0)
        print(f"corpus: {cfg.data.dataset_name or ', '.join(cfg.data.data_files)}", file=out)
        print(
            f"tokenizer: {len(tokenizer)} tokens ({type(tokenizer.backend_tokenizer.model).__name__}); model vocab_size "
            f"{padded_vocab_size(tokenizer, cfg.tokenizer.pad_vocab_to_multiple_of)} after rounding",
            file=out,
        )
        counts = (
            f"{len(train):,} training examples in epoch 0"
            if not data.streaming
            else "streaming training examples"
        )
        docs = f" from {data.num_train_documents:,} documents" if data.num_train_documents is not None else ""
        eval_count = len(data.eval_dataset) if data.eval_dataset is not None else 0
        print(f"objective {objective}: {counts}{docs}; {eval_count:,} validation examples", file=out)

        data.collator.set_epoch(0)
        first = next(_batches(train, data.collator, batch_size=max(examples, 1)), None)
        for i in range(min(examples, len(first["input_ids"]) if first else 0)):
            head = f"\nexample {i}  length {int(first['attention_mask'][i].sum())}"
            if "next_sentence_label" in first:
                head += "  " + ("IsNext" if int(first["next_sentence_label"][i]) == 0 else "NotNext/swapped")
            print(head, file=out)
            labels = first["labels"][i] if kind == "encoder" else None
            print("  " + render_tokens(tokenizer, first["input_ids"][i], labels), file=out)

        if kind == "encoder":
            stats = encoder_statistics(data, stat_sequences, cfg.data.max_seq_length)
            print(
                f"\nstatistics over {stats['sequences']:,} training sequences ({stats['epochs']} epoch(s)):",
                file=out,
            )
            print(
                f"  selected for MLM: {_pct(stats['selected'], stats['maskable'])} of {stats['maskable']:,} maskable "
                f"tokens (mlm_probability {cfg.data.mlm_probability:.0%})",
                file=out,
            )
            print(
                f"  of the selected: [MASK] {_pct(stats['masked'], stats['selected'])}, random "
                f"{_pct(stats['random'], stats['selected'])}, unchanged {_pct(stats['kept'], stats['selected'])} "
                f"(asked {cfg.data.mask_replace_prob:.0%}/{cfg.data.random_replace_prob:.0%}/"
                f"{1 - cfg.data.mask_replace_prob - cfg.data.random_replace_prob:.0%})",
                file=out,
            )
            if PAIR_TASK[objective] != "none":
                print(
                    f"  IsNext (label 0): {_pct(stats['is_next'], stats['sequences'])} (asked "
                    f"{1 - cfg.data.nsp_probability:.0%})",
                    file=out,
                )
            print(
                f"  full-length sequences: {_pct(stats['full'], stats['sequences'])} (short_seq_prob "
                f"{cfg.data.short_seq_prob:.0%} and document ends make the rest shorter); mean length "
                f"{stats['tokens'] / max(stats['sequences'], 1):.1f}; padding {_pct(stats['positions'] - stats['tokens'], stats['positions'])} of batch positions",
                file=out,
            )
        else:
            stats = decoder_statistics(data, stat_sequences)
            print(
                f"\nstatistics over {stats['sequences']:,} training blocks ({stats['epochs']} epoch(s)):",
                file=out,
            )
            print(
                f"  {stats['tokens']:,} tokens, {stats['eos']:,} EOS (document ends), padding "
                f"{_pct(stats['padding'], stats['positions'])} of batch positions",
                file=out,
            )
    return stats


def _pop_value(argv: list[str], flag: str) -> tuple[str | None, list[str]]:
    rest, value, i = [], None, 0
    while i < len(argv):
        key, eq, inline = argv[i].partition("=")
        if key == flag:
            if not eq and i + 1 >= len(argv):
                raise ConfigError(f"{flag} needs a value")
            value = inline if eq else argv[i + 1]
            i += 1 if eq else 2
            continue
        rest.append(argv[i])
        i += 1
    return value, rest


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM (a job scheduler's stop) ends a prepare as Ctrl-C does: in one line


PREPARE_KEYS = (
    "model.kind",
    "tokenizer.name_or_path",
    "tokenizer.vocab_size",
    "tokenizer.lowercase",
    "tokenizer.min_frequency",
    "tokenizer.input_sentence_size",
    "data.data_files",
    "data.validation_files",
    "data.text_column",
    "data.document_separator",
    "data.sentence_split",
    "data.max_seq_length",
    "data.num_proc",
    "training.seed",
)
"""The run config options `prepare` reads (its --help lists these; an override of another is refused)."""


def prepare_main(argv: list[str]) -> int:
    import signal

    from .prepare import prepare, stopped_message

    output = None
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        output, argv = _pop_value(argv, "--output")
        num_proc, argv = _pop_value(argv, "--num_proc")
        part, argv = _pop_value(argv, "--shard")
        shard_mb, argv = _pop_value(argv, "--shard_size_mb")
        # --help and --print_config answer here, before the checks of the options of this command
        cfg = build_config(
            RunConfig,
            argv,
            prog="python -m pretrain.data prepare",
            description=PREPARE_DESCRIPTION,
            keys=PREPARE_KEYS,
            saves_config=False,
        )
        if not output:
            raise ConfigError("--output DIR is required: the folder to write the prepared corpus to")
        try:
            shard = tuple(int(x) for x in part.split("/")) if part else (0, 1)
            if len(shard) != 2:
                raise ValueError
        except ValueError:
            raise ConfigError(f"--shard {part}: use i/n, e.g. --shard 0/2") from None
        try:
            shard_size_mb = float(shard_mb) if shard_mb else 16.0
            processes = int(num_proc) if num_proc else None
        except ValueError:
            raise ConfigError(f"--num_proc {num_proc} / --shard_size_mb {shard_mb}: give numbers") from None
        os.environ.setdefault(
            "HF_DATASETS_DISABLE_PROGRESS_BARS", "1"
        )  # read when json/csv/parquet need datasets
        prepare(cfg, output, processes or cfg.data.num_proc or 1, shard, shard_size_mb)
    except (DataError, ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, OSError, Exception) as err:
        message = stopped_message(err, output)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 130 if isinstance(err, KeyboardInterrupt) else 2
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "prepare":
        return prepare_main(argv[1:])
    try:
        examples, argv = _pop_int(argv, "--examples", 3)
        stat_sequences, argv = _pop_int(argv, "--stat_sequences", 10_000)
        cfg = build_config(
            RunConfig, argv, prog="python -m pretrain.data", description=DESCRIPTION, saves_config=False
        )
        import datasets

        datasets.disable_progress_bars()
        inspect(cfg, examples, stat_sequences)
    except (DataError, ConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

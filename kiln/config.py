"""Typed run configuration: the engine's sections (training, logging, hub), YAML loading with `_base_`
inheritance, dotted CLI overrides, `--help` and the checks of the shared sections. Each app (pretrain/,
finetune/) adds its own sections. Running a command and its one-line errors: `kiln.cli`, `kiln.errors`.

Every field carries a docstring (the string literal right under it); `--help` prints them.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import os
import sys
import textwrap
import typing
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError
from .option_range import bounded, check_ranges, declared_bounds, numeric_kind, option_range, range_refusal

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class TrainingConfig:
    output_dir: str = "runs/encoder-tiny"
    """Where checkpoints, logs and the final model go."""
    overwrite_output_dir: bool = False
    """Start over in an output_dir that holds a run: removes the files on its record of what Kiln wrote there (.kiln-run.json) that still match it, and nothing else; any other file under a run's names is a refusal naming it."""
    save_on_each_node: bool | None = None
    """Several nodes: every node's local main process writes its own copy of the config, tokenizer and
    checkpoints into output_dir (true: node-local disks) or rank 0 writes them once (false: a folder all nodes
    share). None: detected at start (markers written by each node, see kiln/nodes.py and docs/multi-node.md)."""
    seed: int = bounded(42, 0, 2**32 - 1)  # numpy's seeds (accelerate.set_seed seeds numpy too)
    """Seed for weights, data order and masking."""
    per_device_train_batch_size: int = bounded(32, low=1)
    """Sequences per process per micro-step."""
    per_device_eval_batch_size: int = bounded(64, low=1)
    """Sequences per process per evaluation step."""
    gradient_accumulation_steps: int = bounded(1, low=1)
    """Micro-steps accumulated per optimizer step."""
    total_train_batch_size: int | None = bounded(None, low=1)
    """Sequences per optimizer step over all processes; when set, the per-device batch size is derived from it
    (it must divide evenly by processes x gradient_accumulation_steps)."""
    max_steps: int = bounded(600, low=1, also=((-1, "train by num_train_epochs"),))
    """Optimizer steps to train (-1: use num_train_epochs)."""
    num_train_epochs: float = bounded(1.0, low=0, low_open=True)
    """Epochs to train when max_steps is -1."""
    max_train_time_s: float | None = bounded(None, low=0)
    """Wall-clock budget in seconds; training stops (and saves) when it is spent."""
    lr: float = bounded(1e-3, low=0, low_open=True)  # 0 trains nothing and exports the untrained model
    """Peak learning rate."""
    weight_decay: float = bounded(0.01, low=0)
    """AdamW weight decay (not applied to biases and LayerNorm weights)."""
    adam_beta1: float = bounded(0.9, 0, 1, high_open=True)  # torch.optim.AdamW's range
    """AdamW beta1."""
    adam_beta2: float = bounded(0.98, 0, 1, high_open=True)
    """AdamW beta2."""
    adam_epsilon: float = bounded(1e-6, low=0, low_open=True)  # 0 divides by zero
    """AdamW epsilon."""
    max_grad_norm: float = bounded(1.0, low=0)
    """Clip gradients to this global norm (0 disables)."""
    lr_scheduler_type: str = "linear"
    """transformers.get_scheduler name: linear, cosine, constant, constant_with_warmup, ..."""
    warmup_steps: int = bounded(0, low=0)
    """Warmup steps (takes precedence over warmup_ratio when > 0)."""
    warmup_ratio: float = bounded(0.06, 0, 1)
    """Warmup as a fraction of the total steps."""
    decay_ratio: float = bounded(0.1, 0, 1)
    """`lr_scheduler_type: warmup_stable_decay` only: the share of the total steps spent in the final decay (the learning rate holds after the warmup until then)."""
    decay_type: str = "1-sqrt"
    """`lr_scheduler_type: warmup_stable_decay` only: the shape of the final decay, `linear`, `cosine` or `1-sqrt` (ModernBERT's), as transformers' `get_wsd_schedule` takes it."""
    mixed_precision: str | None = None
    """`no`, `bf16` or `fp16` (through accelerate). None: whatever accelerate was launched with (the accelerate
    config's `mixed_precision` or `accelerate launch --mixed_precision`) when that is not `no`; otherwise a
    pretraining run on a CPU with bf16 units (avx512_bf16, amx_bf16) trains a model of width 256 or more in bf16
    (measured faster there; one start line says so), a resumed run in its own precision, and every other run in
    fp32. A value given here overrides all of that; the run's config.yaml records the precision actually used."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    torch_compile: bool = False
    """Compile the model with torch.compile."""
    eval_steps: int = bounded(200, low=0)
    """Evaluate every N optimizer steps (0: only at the end)."""
    max_eval_batches: int | None = bounded(None, low=1)
    """Evaluate on the first max_eval_batches x per_device_eval_batch_size sequences of the validation split,
    shared by all processes: the same sequences (and numbers) on any number of processes (None: the whole split)."""
    group_by_length: bool = False
    """Batch examples of similar length together (transformers' LengthGroupedSampler: random mega-batches of 50
    batches, sorted by length inside), so little of a batch is padding; the order stays seeded by (seed, epoch)."""
    save_steps: int = bounded(200, low=0)
    """Save a resumable checkpoint every N optimizer steps (0: never)."""
    save_total_limit: int | None = bounded(2, low=0)
    """Keep at most this many checkpoints (oldest removed); None or 0: keep all. The newest is never removed."""
    resume_from_checkpoint: str | None = None
    """`latest`, a checkpoint folder, or `hub:user/name` to continue a run exactly."""
    trust_checkpoint_pickles: bool = False
    """Resume from a checkpoint that holds pickled files (`.pkl`, `.bin`, `.pt`: an earlier Kiln version's, or
    DeepSpeed's), which are loaded by unpickling and can run any code. Only for checkpoints you wrote yourself;
    without it such a checkpoint is refused, and Kiln's own checkpoints (safetensors and JSON) need it not."""
    max_nonfinite_steps: int = bounded(3, low=0)
    """Optimizer steps in a row whose loss or gradient norm is NaN/inf that are skipped (not applied) before the run stops with an error; 0: stop at the first."""
    divergence_factor: float = bounded(10.0, low=0)
    """Stop the run as diverged (exit status 1, no final model) when the training loss stays above
    max(divergence_factor x its lowest value so far, lowest + divergence_factor) for 3 optimizer steps in a row;
    no checkpoint is saved while it is that high. 0: off (a NaN/inf loss still stops the run)."""
    allow_config_change: bool = False
    """Resume even though settings that make resuming inexact (batch size, sequence length, seed, max_steps, ...) differ from the checkpoint's run."""
    metric_for_best_model: str | None = None
    """Eval metric that picks the best model (e.g. `accuracy`, `loss`); the best weights are kept in output_dir/best."""
    greater_is_better: bool = True
    """Whether a larger metric_for_best_model is better."""
    early_stopping_patience: int | None = bounded(None, low=0)
    """Stop after this many evaluations without improvement of metric_for_best_model (None: never)."""


@dataclass
class LoggingConfig:
    report_to: str = "none"
    """Tracker: `wandb`, `tensorboard`, `all` or `none`."""
    logging_steps: int = bounded(10, low=1)
    """Log training metrics every N optimizer steps."""
    project: str = "kiln"
    """Tracker project name."""
    run_name: str | None = None
    """Tracker run name (default: the output_dir's name)."""
    peak_flops: float | None = bounded(None, low=0, low_open=True)
    """Peak FLOP/s of one device for the MFU estimate (None: guessed from the GPU name; unknown on CPU)."""


@dataclass
class HubConfig:
    push_to_hub: bool = False
    """Push the model (and, with strategy `checkpoint`, the resumable state) to the Hugging Face Hub."""
    model_id: str | None = None
    """Hub repository, `user/name`."""
    private: bool = False
    """Create the repository as private."""
    strategy: str = "end"
    """`end` (final model only), `every_save` (model at every checkpoint) or `checkpoint` (also the resumable state)."""
    revision: str | None = None
    """Branch to push to (created when missing; default: main)."""
    license: str | None = None
    """License of the published model, written into the model card's metadata (an SPDX id such as `apache-2.0` or `mit`, or `other`); unset: the card names none and says that none was chosen."""
    dataset_name: str | None = None
    """How the model card names the training corpus (a Hub dataset id goes into its metadata too); default: the names of the data files and folders the run read, without their paths."""
    timeout_s: float = bounded(60.0, low=0, low_open=True)
    """Seconds a Hub request may wait for the server to answer before it counts as failed (then retried)."""
    final_push_timeout_s: float = bounded(1800.0, low=0, low_open=True)
    """Seconds to wait for the final push at the end of training, at most; after that the run fails (exit status 1) with the model saved locally and the `hf upload` command that finishes the push."""
    final_push_stall_s: float = bounded(300.0, low=0, low_open=True)
    """Seconds the final wait goes on without progress (no answer from the Hub, no upload bytes read by it) before it gives up as final_push_timeout_s does; an upload that progresses goes on."""


# ----------------------------------------------------------------------------------------------------------
# field docs, types, parsing


def field_docs(cls: type) -> dict[str, str]:
    """Docstrings written under each dataclass field."""
    return dict(_source_field_docs(cls))


@functools.cache
def _source_field_docs(cls: type) -> dict[str, str]:
    # read once per class: parsing the source takes milliseconds, and every build_config walks all the fields
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = ast.parse(source).body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(getattr(nxt, "value", None), ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Coerce a YAML or CLI value to the annotated type, with an error that names the key."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "~")):
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(value, inner[0], key)
    if origin is list:
        (item_type,) = args
        if isinstance(value, str):
            parsed = yaml.safe_load(value) if value.strip().startswith("[") else value.split(",")
            value = parsed if isinstance(parsed, list) else [parsed]
        if not isinstance(value, (list, tuple)):
            value = [value]
        return [_convert(v, item_type, key) for v in value]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "1", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "no", "0", "off"):
            return False
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if tp in (int, float):
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        try:
            if tp is int:
                if isinstance(value, int) or (
                    isinstance(value, str) and value.strip().lstrip("+-").isdigit()
                ):
                    return int(value)  # exact: through a float, a long integer would change
                as_float = float(value)
                if as_float != int(as_float):
                    raise ValueError
                return int(as_float)
            return float(value)
        except (TypeError, ValueError, OverflowError):  # OverflowError: int(float("inf"))
            raise ConfigError(f"{key}: expected {tp.__name__}, got {value!r}") from None
    if tp is str:
        if isinstance(value, bool):
            # YAML 1.1 reads an unquoted no/yes (off/on, false/true) as a boolean: for a text field such as
            # mixed_precision, whose values include "no", the user meant the word
            return "yes" if value else "no"
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return str(value)
    return value


def _apply(obj: Any, values: dict[str, Any], prefix: str = "") -> None:
    types = _field_types(type(obj))
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if key not in types:
            valid = ", ".join(f"{prefix}{name}" for name in types)
            raise ConfigError(f"unknown config key '{dotted}'. Valid keys here: {valid}")
        tp = types[key]
        if _is_dataclass_type(tp):
            if not isinstance(value, dict):
                raise ConfigError(f"'{dotted}' is a section; give it a mapping of keys, got {value!r}")
            _apply(getattr(obj, key), value, prefix=f"{dotted}.")
        elif numeric_kind(tp) is not None:
            try:
                setattr(obj, key, _convert(value, tp, dotted))
            except ConfigError:  # not a number of its kind ("nan" or 1.5 for an integer): say what is
                bounds = declared_bounds(type(obj), key)
                raise ConfigError(range_refusal(dotted, value, numeric_kind(tp), bounds)) from None
        else:
            setattr(obj, key, _convert(value, tp, dotted))


def load_yaml(path: str | os.PathLike, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a YAML config; `_base_: other.yaml` (or a list of them) is merged underneath, relative to the file.
    (`_chain`: the files whose `_base_` led here, to name a loop instead of recursing forever.)"""
    path = Path(path)
    if path.resolve() in [p.resolve() for p in _chain]:
        loop = " -> ".join(
            p.name for p in (*_chain[[p.resolve() for p in _chain].index(path.resolve()) :], path)
        )
        raise ConfigError(
            f"the _base_ chain of {_chain[0]} loops: {loop}; remove the _base_ entry that leads back"
        )
    if not path.is_file():
        raise ConfigError(
            f"config file not found: {path}. Pick one of the YAML files under configs/ or fix the path."
        )
    try:
        text = path.read_text(encoding="utf-8")
        _refuse_duplicate_keys(yaml.compose(text, Loader=yaml.SafeLoader), path)
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"invalid YAML in {path}: {err}".replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of config sections, got {type(data).__name__}")
    bases = data.pop("_base_", [])
    bases = [bases] if isinstance(bases, str) else bases
    merged: dict[str, Any] = {}
    for base in bases:
        _deep_merge(merged, load_yaml(path.parent / base, (*_chain, path)))
    _deep_merge(merged, data)
    return merged


def _refuse_duplicate_keys(node, path: Path, prefix: str = "") -> None:
    """A key given twice in one mapping of a config file: YAML loaders keep the last silently, so one of the two
    settings the file shows would be ignored."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[tuple[str, str], int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else None
            if key is not None and key != "<<":  # `<<`: a merge key, which may repeat
                line = key_node.start_mark.line + 1
                if (key_node.tag, key) in seen:
                    raise ConfigError(
                        f"{path}, line {line}: key '{prefix}{key}' is given twice (also on line "
                        f"{seen[key_node.tag, key]}), and only the last would count; keep one"
                    )
                seen[key_node.tag, key] = line
            _refuse_duplicate_keys(value_node, path, f"{prefix}{key}." if key is not None else prefix)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_duplicate_keys(item, path, prefix)


def _deep_merge(into: dict, update: dict) -> dict:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value)
        else:
            into[key] = value
    return into


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"'{dotted}': '{part}' is not a section")
    node[parts[-1]] = value


def parse_overrides(argv: list[str], bool_keys: set[str]) -> tuple[str | None, dict[str, Any]]:
    """`--config FILE` and `--section.key value` / `--section.key=value` / `--flag` (booleans)."""
    config_path = None
    overrides: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            raise ConfigError(
                f"unexpected argument {arg!r}; options look like --section.key value (see --help)"
            )
        key, eq, value = arg[2:].partition("=")
        if not eq:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            if key in bool_keys and (nxt is None or nxt.startswith("--")):
                value = "true"
            elif nxt is None or nxt.startswith("--"):
                raise ConfigError(f"--{key} needs a value (e.g. --{key} VALUE or --{key}=VALUE)")
            else:
                value = nxt
                i += 1
        i += 1
        if key == "config":
            config_path = value
            continue
        _set_dotted(overrides, key, yaml.safe_load(value) if value != "" else "")
    return config_path, overrides


def _walk_fields(cls: type, prefix: str = "", defaults: Any = None):
    """(dotted key, type, default, doc) of every leaf field; `defaults` is the instance whose values are
    shown (a nested section's default_factory may differ from its class defaults, as fine-tuning's do)."""
    types = _field_types(cls)
    docs = field_docs(cls)
    defaults = cls() if defaults is None else defaults
    for f in dataclasses.fields(cls):
        tp = types[f.name]
        if _is_dataclass_type(tp):
            yield from _walk_fields(tp, prefix=f"{prefix}{f.name}.", defaults=getattr(defaults, f.name))
        else:
            yield f"{prefix}{f.name}", tp, getattr(defaults, f.name), docs.get(f.name, "")


def _type_name(tp: Any) -> str:
    return str(tp).replace("typing.", "") if not isinstance(tp, type) else tp.__name__


def option_rows(cls: type, defaults: Any = None, keys: Collection[str] | None = None):
    """(dotted key, type name, default, doc) of every option of config class `cls` a command reads (`keys`:
    only these; None: all), with `defaults` (an instance, e.g. after --config) as the defaults shown."""
    for key, tp, default, doc in _walk_fields(cls, defaults=defaults):
        if keys is None or key in keys:
            allowed = option_range(cls, key)  # the declared range, so --help and the reference show it
            yield key, _type_name(tp), default, f"{doc} Range: {allowed}." if allowed else doc


SOURCES_TEXT = "Values come from the dataclass defaults, then the YAML file (--config; `_base_:` inherits), then dotted\ncommand-line overrides."
SAVED_TEXT = "The run saves the resolved config as output_dir/config.yaml."
PRINT_CONFIG_TEXT = "--print_config prints the resolved config as YAML and exits, without running anything."


def format_help(
    cls: type,
    prog: str,
    description: str,
    *,
    defaults: Any = None,
    config_path: str | None = None,
    keys: Collection[str] | None = None,
    saves_config: bool = True,
) -> str:
    """`--help`: the command's description, then every option it reads with its type, default and doc; the
    defaults shown are `defaults` (the resolved config of `--config config_path` and the overrides given)."""
    lines = [
        f"usage: {prog} [--config FILE.yaml] [--section.key VALUE ...] [--print_config]",
        "",
        description.strip(),
        "",
        SOURCES_TEXT + (" " + SAVED_TEXT if saves_config else ""),
        PRINT_CONFIG_TEXT,
        "Every option, for every command: docs/configuration.md.",
    ]
    if config_path is not None:
        lines += [
            "",
            f"The defaults shown below are those of --config {config_path} (and the overrides given).",
        ]
    lines += [
        "",
        "options:",
        "  --config FILE         YAML run config (see configs/)",
        "  --print_config        print the resolved config as YAML and exit",
        "  -h, --help            show this help and exit",
    ]
    section = None
    for key, type_name, default, doc in option_rows(cls, defaults, keys):
        head = key.split(".")[0]
        if head != section:
            section = head
            lines += ["", f"{section}:"]
        how = "; several as a,b or [a, b]" if "list" in type_name else ""
        lines.append(f"  --{key} ({type_name}, default: {default!r}{how})")
        if doc:
            lines += ["      " + line for line in textwrap.wrap(doc, 96)]
    return "\n".join(lines)


def config_yaml(config: Any, keys: Collection[str] | None = None) -> str:
    """The config as YAML, as output_dir/config.yaml holds it (`keys`: only these dotted keys)."""
    tree = dataclasses.asdict(config)
    if keys is not None:
        kept: dict[str, Any] = {}
        for key, value in flatten(tree).items():
            if key in keys:
                _set_dotted(kept, key, value)
        tree = kept
    return yaml.safe_dump(tree, sort_keys=False)


def build_config(
    cls: type,
    argv: list[str] | None = None,
    prog: str = "run.py",
    description: str = "",
    *,
    keys: Collection[str] | None = None,
    saves_config: bool = True,
):
    """Build a config dataclass from defaults, `--config` YAML and dotted CLI overrides. `--help` prints the
    options with the resolved values as defaults and exits; `--print_config` prints the resolved config as YAML
    and exits. `keys`: the dotted options this command reads (its --help lists only these, and an override of
    another is refused); None: all."""
    argv = list(sys.argv[1:] if argv is None else argv)
    wants_help = "-h" in argv or "--help" in argv
    print_config = "--print_config" in argv
    argv = [arg for arg in argv if arg not in ("-h", "--help", "--print_config")]
    bool_keys = {key for key, tp, _, _ in _walk_fields(cls) if tp is bool}
    config_path, overrides = parse_overrides(argv, bool_keys)
    if keys is not None:
        unread = [key for key in flatten(overrides) if key not in keys]
        if unread:
            raise ConfigError(
                f"{prog} does not read --{unread[0]}; it reads: {', '.join('--' + key for key in keys)} "
                "(see --help)"
            )
    config = cls()
    if config_path is not None:
        _apply(config, load_yaml(config_path))
    _apply(config, overrides)
    if not wants_help:  # --help shows the values given, in range or not; anything else runs on them
        check_ranges(config, keys)
    if wants_help:
        print(
            format_help(
                cls,
                prog,
                description,
                defaults=config,
                config_path=config_path,
                keys=keys,
                saves_config=saves_config,
            )
        )
        raise SystemExit(0)
    if print_config:
        print(config_yaml(config, keys), end="")
        raise SystemExit(0)
    return config


def validate_run_sections(config: Any) -> None:
    """Checks of the sections every Kiln entry point shares (training, logging, hub); each script adds its own.
    Every numeric option of the whole config is checked against its declared range first (`check_ranges`, as
    build_config does: a config made in code, not parsed from a command line, is checked here)."""
    check_ranges(config)
    check_training_values(config.training)
    if config.hub.push_to_hub and not config.hub.model_id:
        raise ConfigError("--hub.push_to_hub needs --hub.model_id user/name")
    if config.hub.strategy not in ("end", "every_save", "checkpoint"):
        raise ConfigError(
            f"--hub.strategy must be end, every_save or checkpoint, got {config.hub.strategy!r}"
        )
    if config.logging.report_to not in ("none", "wandb", "tensorboard", "all"):
        raise ConfigError(
            f"--logging.report_to must be wandb, tensorboard, all or none, got {config.logging.report_to!r}"
        )


MIXED_PRECISIONS = ("no", "bf16", "fp16", "fp8")
"""The values of training.mixed_precision (accelerate's)."""


def check_training_values(training: Any) -> None:
    """The training section's checks beyond the declared ranges (`check_ranges`): the output folder, the options
    whose values are names; each a one-line ConfigError naming the fix."""
    out = training.output_dir
    if not str(out).strip():
        raise ConfigError(
            "--training.output_dir is empty; name a folder, e.g. --training.output_dir runs/my-run"
        )
    if os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(
            f"--training.output_dir {out} is a file, not a folder; remove it or pick another output_dir"
        )
    if training.mixed_precision is not None and training.mixed_precision not in MIXED_PRECISIONS:
        raise ConfigError(
            f"--training.mixed_precision {training.mixed_precision!r} is unknown; use one of: {', '.join(MIXED_PRECISIONS)}"
        )
    if training.decay_type not in ("linear", "cosine", "1-sqrt"):
        raise ConfigError(
            f"--training.decay_type {training.decay_type!r} is unknown; use linear, cosine or 1-sqrt"
        )


def config_from_dict(cls: type, values: dict[str, Any]):
    config = cls()
    _apply(config, values)
    return config


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested dict as one level with dotted keys: {"training": {"lr": 1e-3}} -> {"training.lr": 1e-3}."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def save_config(config: Any, path: str | os.PathLike) -> None:
    """Write `config` (a config dataclass) to `path` as YAML: the file a run leaves as output_dir/config.yaml,
    which `--config` reads back. Never written through a link at `path` (`kiln.safe_write`)."""
    from .safe_write import write_file

    write_file(path, yaml.safe_dump(dataclasses.asdict(config), sort_keys=False))


def resolve_path(path: str) -> str:
    """Paths in the shipped configs are relative to the repo root; keep absolute and existing ones as they are."""
    if (
        os.path.isabs(path)
        or os.path.exists(path)
        or any(c in path for c in "*?[")
        and Path(path).parent.exists()
    ):
        return path
    candidate = REPO_ROOT / path
    return str(candidate) if candidate.exists() or any(c in path for c in "*?[") else path


__all__ = [
    "REPO_ROOT",
    "HubConfig",
    "LoggingConfig",
    "TrainingConfig",
    "build_config",
    "config_yaml",
    "config_from_dict",
    "field_docs",
    "flatten",
    "format_help",
    "load_yaml",
    "option_rows",
    "resolve_path",
    "save_config",
]

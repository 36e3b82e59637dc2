"""What a checkpoint holds to continue a run exactly, written and read as plain data.

| file | holds | written by |
|---|---|---|
| `model.safetensors` | the model's weights | the writing process (rank 0, or each node's local main) |
| `optimizer.safetensors` | the optimizer's tensors; its settings (param groups) as JSON in the file's metadata | the same |
| `loop_state.json` | the loop's counters (`TrainState`), the learning-rate schedule, accelerate's step count and the gradient scaler | the same |
| `rng_state_R.safetensors` | process R's random-number states: torch's (CPU, CUDA) as tensors, Python's and NumPy's as JSON | every process |

Nothing in a checkpoint is unpickled: safetensors files hold tensors and a JSON header, the rest is JSON, so a
checkpoint from anyone (a folder, a Hub repo) can hold no code that runs on resume. A file of another format in a
checkpoint (`.pkl`, `.bin`, `.pt`: torch's and accelerate's pickles, as earlier Kiln versions and DeepSpeed wrote)
is refused in one line; `--training.trust_checkpoint_pickles` loads such a checkpoint with accelerate, for one's
own files only. Every file is checked before it is used: a damaged or inconsistent one is a one-line error, never
skipped. loop_state.json's fields are declared once, as a table (`LOOP_STATE`: each field's kind, whether it may
be null or absent, its rules against the run, the relations between fields), checked by one function,
`check_fields`; every tensor, the model's weights and the optimizer's state alike, by `check_tensors`.
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from accelerate import Accelerator, DistributedType

from .checkpoint_format import (  # noqa: F401  (also read from here)
    DATA_SUFFIXES,
    LOOP_STATE_FILE,
    PICKLE_SUFFIXES,
    TRUST_FLAG,
    pickle_files,
    refuse_pickles,
)
from .errors import first_line
from .train_state import TrainState

if TYPE_CHECKING:
    from .resume import ResumePlan

logger = logging.getLogger("kiln")

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
RNG_FILE = "rng_state_{}.safetensors"


class DamagedCheckpoint(ValueError):
    """A checkpoint file that cannot be what Kiln wrote: unreadable, of the wrong shape or inconsistent."""


# ----------------------------------------------------------------------------------------------------------
# save


def _is_fsdp(accelerator: Accelerator) -> bool:
    return accelerator.distributed_type == DistributedType.FSDP


def _full_cpu(tree: dict[str, Any], keep: bool) -> dict[str, Any]:
    """The dict with every sharded tensor (DTensor) gathered whole (a collective: every process calls it, in the
    same order) and every tensor on the CPU where `keep` (the writing process); None elsewhere."""
    from torch.distributed.tensor import DTensor

    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out[key] = _full_cpu(value, keep)
            continue
        if isinstance(value, DTensor):
            value = value.full_tensor()
        if torch.is_tensor(value):
            value = value.detach().to("cpu", copy=True) if keep else None
        out[key] = value
    return out


def _optimizer_state(accelerator: Accelerator, model, optimizer, keep: bool) -> tuple[dict, str]:
    """The optimizer's state dict (tensors on the CPU where `keep`) and how its parameters are named: by index in
    the param groups (`index`, torch's own state dict), or by name (`name`, FSDP's, whose parameters are shards)."""
    if _is_fsdp(accelerator):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        inner = getattr(optimizer, "optimizer", optimizer)
        state = get_optimizer_state_dict(model, inner, options=StateDictOptions(full_state_dict=False))
        return _full_cpu(state, keep), "name"
    state = optimizer.state_dict()
    return {
        "state": _full_cpu({str(k): v for k, v in state["state"].items()}, keep),
        "param_groups": state["param_groups"],
    }, "index"


def _json_value(value: Any, where: str) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(v, where) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v, where) for k, v in value.items()}
    raise TypeError(f"{where}: a {type(value).__name__} cannot be saved as plain data")


def save_training_state(
    accelerator: Accelerator,
    model,
    optimizer,
    scheduler,
    state: TrainState,
    folder: Path,
    writer: bool,
    log_window: dict[str, Any] | None = None,
) -> None:
    """Write the model, optimizer, schedule, counters and this process's random states into `folder`. Every
    process calls it (sharded weights are gathered); `writer` writes all but the random states, which every
    process writes for itself. `log_window`: the logging window's sums so far (`LOG_WINDOW`)."""
    from safetensors.torch import save_file, save_model

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        # DeepSpeed's engine keeps the model and its partitioned optimizer in a format of its own (pickles):
        # written by DeepSpeed, loaded only with --training.trust_checkpoint_pickles
        accelerator.save_state(str(folder))
    elif _is_fsdp(accelerator):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        weights = _full_cpu(
            get_model_state_dict(model, options=StateDictOptions(full_state_dict=False)), writer
        )
        if writer:
            save_file(weights, folder / MODEL_FILE, metadata={"format": "pt"})
    elif writer:
        save_model(
            accelerator.unwrap_model(model),
            str(folder / MODEL_FILE),
            metadata={"format": "pt"},
            force_contiguous=True,
        )
    if accelerator.distributed_type != DistributedType.DEEPSPEED and (writer or _is_fsdp(accelerator)):
        opt_state, keys = _optimizer_state(accelerator, model, optimizer, writer)
        if writer:
            tensors, settings = {}, {}
            for param, values in opt_state["state"].items():
                settings[param] = {}
                for name, value in values.items():
                    if torch.is_tensor(value):
                        tensors[f"{param}/{name}"] = value.contiguous()
                    else:
                        settings[param][name] = _json_value(value, f"optimizer state {param}.{name}")
            header = {
                "keys": keys,
                "param_groups": _json_value(opt_state["param_groups"], "optimizer param groups"),
                "state": settings,
            }
            save_file(tensors, folder / OPTIMIZER_FILE, metadata={"kiln_optimizer": json.dumps(header)})
    if writer:
        loop = {
            "counters": _json_value(state.state_dict(), "counters"),
            "scheduler": _json_value(scheduler.state_dict(), "scheduler"),
            "accelerator_step": accelerator.step,
            "grad_scaler": _json_value(accelerator.scaler.state_dict(), "grad scaler")
            if accelerator.scaler
            else None,
            "log_window": _json_value(log_window, "log window"),
        }
        (folder / LOOP_STATE_FILE).write_text(json.dumps(loop, indent=1))
    _save_random_states(folder / RNG_FILE.format(accelerator.process_index))


def _save_random_states(path: Path) -> None:
    import numpy as np
    from safetensors.torch import save_file

    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    plain = {
        "python": [version, list(internal), gauss],
        "numpy": [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
    }
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for index, cuda_state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda.{index}"] = cuda_state
    save_file(tensors, path, metadata={"kiln_random": json.dumps(plain)})


# ----------------------------------------------------------------------------------------------------------
# load


def _read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import safe_open

    if not path.is_file():
        raise DamagedCheckpoint(f"{path.name} is missing")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})
    except Exception as err:  # safetensors raises its own error types (header, size, dtype)
        raise DamagedCheckpoint(
            f"{path.name} is not a complete safetensors file ({first_line(err)})"
        ) from None


def _json_meta(meta: dict[str, str], key: str, path: Path) -> Any:
    try:
        return json.loads(meta[key])
    except (KeyError, ValueError):
        raise DamagedCheckpoint(f"{path.name} lacks its {key} header") from None


class ModelMismatch(DamagedCheckpoint):
    """model.safetensors holds other weights (names, shapes, dtypes) than this run's model."""


@dataclass(frozen=True)
class Expected:
    """What a run expects of the checkpoint it resumes, beyond each file's own shape.

    `global_step`: the step of the checkpoint's trainer_state.json; `folder_step`: the N of its folder's name
    `step-N` (None: another name, e.g. a Hub download's `last-checkpoint`); `total_steps`: this run's steps;
    `steps_per_epoch`: this run's optimizer steps per epoch (None: a stream); `accumulation`: the micro-batches
    per optimizer step of the run that wrote it; `same_schedule`: the run's settings are the checkpoint's (no
    --training.allow_config_change), so its learning rate and optimizer settings are this run's to the bit."""

    global_step: int
    folder_step: int | None = None
    total_steps: int | None = None
    steps_per_epoch: int | None = None
    accumulation: int = 1
    same_schedule: bool = False

    @property
    def micro_batches(self) -> int:
        """The micro-batches (per process) the run that wrote the checkpoint had taken at its step."""
        return self.global_step * self.accumulation


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) or math.isfinite(value) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _same_shape(saved: Any, live: Any, where: str) -> None:
    """`saved` (from JSON) has the keys and the kinds of values of `live` (the object's own state dict), down to
    every list element; every number is finite."""
    if isinstance(live, dict):
        if not isinstance(saved, dict) or set(saved) != {str(k) for k in live}:
            raise DamagedCheckpoint(f"{where} does not hold the expected fields")
        for key, value in live.items():
            _same_shape(saved[str(key)], value, f"{where}.{key}")
    elif isinstance(live, (list, tuple)):
        if not isinstance(saved, list) or len(saved) != len(live):
            raise DamagedCheckpoint(f"{where} does not hold {len(live)} values")
        for index, (value, live_value) in enumerate(zip(saved, live)):
            _same_shape(value, live_value, f"{where}[{index}]")
    elif isinstance(live, bool):
        if not isinstance(saved, bool):
            raise DamagedCheckpoint(f"{where} is {_shown(saved)}, not true/false")
    elif isinstance(live, int):
        if not isinstance(saved, int) or isinstance(saved, bool):
            raise DamagedCheckpoint(f"{where} is {_shown(saved)}, not a whole number")
    elif isinstance(live, float):
        if not _is_number(saved):
            raise DamagedCheckpoint(f"{where} is {_shown(saved)}, not a finite number")
    elif isinstance(live, str):
        if not isinstance(saved, str):
            raise DamagedCheckpoint(f"{where} is {_shown(saved)}, not a text")
    elif live is None:
        if saved is not None:
            raise DamagedCheckpoint(f"{where} is {_shown(saved)}, not null")


def _as_live_types(saved: Any, live: Any) -> Any:
    """JSON's lists back into the tuples of the live state (e.g. AdamW's betas)."""
    if isinstance(live, tuple) and isinstance(saved, list):
        return tuple(saved)
    return saved


# ----------------------------------------------------------------------------------------------------------
# loop_state.json: its fields declared once (LOOP_STATE), checked by one function (check_fields)


@dataclass(frozen=True)
class Kind:
    """What a field holds, and how a refusal names it: `counters.epoch is -1, not a count`."""

    name: str
    fits: Callable[[Any], bool]


COUNT = Kind("a count", _is_count)
NUMBER = Kind("a finite number", _is_number)
SECONDS = Kind("a finite number of seconds", lambda value: _is_number(value) and value >= 0)
OBJECT = Kind("a JSON object", lambda value: isinstance(value, dict))
ROWS = Kind("a list of logged rows", lambda value: isinstance(value, list))
MICRO_BATCHES = Kind("a count of the checkpoint's micro-batches", _is_count)
STOP_REASONS = ("max_steps", "epochs", "early_stopping", "time_budget", "signal")
STOP_REASON = Kind(f"one of {STOP_REASONS}", lambda value: value in STOP_REASONS)

Rule = Callable[[Any, dict, Expected], str | None]
"""A field's relation to the checkpoint and the run: (its value, the fields beside it, what the run expects) ->
why it does not hold, or None. Checked once the value is of its kind."""

Relation = Callable[[dict, Expected, str], str | None]
"""A relation between the fields of one table: (the fields, what the run expects, where the table is) -> the
refusal, naming the fields, or None. Checked once every field fits."""


@dataclass(frozen=True)
class Field:
    """One field of loop_state.json: its kind (or a table of fields of its own), whether it may be null (not set
    yet) or absent (written only by later Kiln versions), and its rules, checked in order."""

    name: str
    kind: Kind | Table
    null: bool = False
    absent: bool = False
    rules: tuple[Rule, ...] = ()


@dataclass(frozen=True)
class Table:
    """The fields of one JSON object of loop_state.json, and the relations between them."""

    holds: str
    """What the object is, as a refusal of an object without these fields names it."""
    fields: tuple[Field, ...]
    relations: tuple[Relation, ...] = ()


def at_most(limit: str, says: str) -> Rule:
    """The value is no more than the `Expected` field `limit` (None: not known); `says` is the refusal, of
    {value} and {limit}."""

    def rule(value: Any, fields: dict, expected: Expected) -> str | None:
        bound = getattr(expected, limit)
        return None if bound is None or value <= bound else says.format(value=value, limit=bound)

    return rule


def equal_to(limit: str, says: str) -> Rule:
    """The value is the `Expected` field `limit` (None: not known); `says` is the refusal, of {value} and
    {limit}."""

    def rule(value: Any, fields: dict, expected: Expected) -> str | None:
        bound = getattr(expected, limit)
        return None if bound is None or value == bound else says.format(value=value, limit=bound)

    return rule


def both_or_neither(first: str, second: str) -> Relation:
    """Two fields set together: both null or neither."""

    def relation(fields: dict, expected: Expected, where: str) -> str | None:
        if (fields[first] is None) == (fields[second] is None):
            return None
        return f"{where}.{first} and {where}.{second} disagree"

    return relation


def _position_in_epoch(value: int, counters: dict, expected: Expected) -> str | None:
    """batches_in_epoch: the micro-batches (per process) of the epoch already trained on, in optimizer steps of
    the run that wrote it (`accumulation` each): no more than the steps its epochs leave; in the first epoch,
    with the run's own settings (whose first epoch has `steps_per_epoch` steps), exactly the checkpoint's step."""
    step, epoch = expected.global_step, counters["epoch"]
    steps_in_epoch = math.ceil(value / expected.accumulation)
    if steps_in_epoch > step - epoch:  # every earlier epoch took a step at least
        return f"is {value} in epoch {epoch}, more micro-batches than the checkpoint's {step} steps leave"
    exact = epoch == 0 and expected.same_schedule and expected.steps_per_epoch is not None
    if exact and steps_in_epoch != step:
        return f"is {value} in epoch 0, which is not the checkpoint's step {step}"
    return None


def _logged_rows(rows: list, counters: dict, expected: Expected) -> str | None:
    """The logged rows: each a step (from 1 to the checkpoint's, in order) and named numbers (a logged loss may
    have been NaN: the row is a record of it)."""
    previous = 0
    for index, row in enumerate(rows):
        if not isinstance(row, dict) or not _is_count(row.get("step")):
            return f"row {index} has no step"
        if not previous <= row["step"] <= expected.global_step:
            return f"row {index} is at step {row['step']}, out of order or beyond the checkpoint's step"
        previous = row["step"]
        for name, number in row.items():
            if not isinstance(number, (int, float)) or isinstance(number, bool):
                return f"row {index}: {name} is {_shown(number)}, not a number"
    return None


LOG_WINDOW_DTYPES = ("float32", "float64", "bfloat16", "float16")


def _window_steps(window: dict, expected: Expected, where: str) -> str | None:
    if window["steps"] > expected.global_step:
        return f"{where} holds {window['steps']} steps, more than the checkpoint's {expected.global_step}"
    return None


def _loss_parts(window: dict, expected: Expected, where: str) -> str | None:
    """Each loss part's sums, one number per process that wrote them (NaN and inf are sums too: a step skipped
    for a non-finite loss is logged as such in its window), and its dtype; none before the window's first step."""
    sums, dtypes = window["sums"], window["dtypes"]
    if set(sums) != set(dtypes):
        return f"{where}: its sums and their dtypes do not name the same loss parts"
    if bool(sums) != bool(window["steps"]):
        return f"{where}: its sums do not agree with its {window['steps']} steps"
    for name, shares in sums.items():
        if dtypes[name] not in LOG_WINDOW_DTYPES:
            return f"{where}: loss part {name!r} has no known dtype"
        numbers = isinstance(shares, list) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in shares
        )
        if not numbers or not shares:
            return f"{where}: loss part {name!r} does not hold one number per process"
    if len({len(shares) for shares in sums.values()}) > 1:
        return f"{where}: its loss parts hold sums of different numbers of processes"
    return None


_UP_TO_THE_STEP = at_most("global_step", "is {value}, beyond the checkpoint's step {limit}")

COUNTERS = Table(
    "the loop's counters",
    (
        # global_step first: the fields after it are measured against it (the checkpoint's step)
        Field(
            "global_step",
            COUNT,
            rules=(
                equal_to(
                    "global_step", "is {value} but the checkpoint's trainer_state.json says step {limit}"
                ),
                equal_to("folder_step", "is {value} but the checkpoint's folder is named for step {limit}"),
                at_most("total_steps", "is {value}, beyond this run's {limit} steps"),
            ),
        ),
        Field(
            "epoch",
            COUNT,
            rules=(at_most("global_step", "is {value}, more epochs than the checkpoint's {limit} steps"),),
        ),
        Field("batches_in_epoch", COUNT, rules=(_position_in_epoch,)),
        Field("tokens_seen", COUNT),
        Field("train_time_s", SECONDS),
        Field("best_metric", NUMBER, null=True),
        Field("best_step", COUNT, null=True, rules=(_UP_TO_THE_STEP,)),
        Field("evals_without_improvement", COUNT, rules=(_UP_TO_THE_STEP,)),
        Field("history", ROWS, rules=(_logged_rows,)),
        Field("stop_reason", STOP_REASON, null=True),
        Field("lowest_loss", NUMBER, null=True),
        Field("lowest_loss_step", COUNT, null=True, rules=(_UP_TO_THE_STEP,)),
    ),
    relations=(
        both_or_neither("best_metric", "best_step"),
        both_or_neither("lowest_loss", "lowest_loss_step"),
    ),
)
"""`TrainState`, field by field (a field of it missing here is refused by the test suite)."""

LOG_WINDOW = Table(
    "the logging window's fields",
    (
        Field("steps", COUNT),
        Field("tokens", COUNT),
        Field("seconds", SECONDS),
        Field("sums", OBJECT),
        Field("dtypes", OBJECT),
    ),
    relations=(_window_steps, _loss_parts),
)
"""The logging window so far (`kiln.throughput.LogWindow.state`): the optimizer steps since the last logged line,
their real tokens, the seconds they took and each loss part's sums, one per process that wrote them, so a resumed
run logs the same windowed loss as an uninterrupted one."""

LOOP_STATE = Table(
    "the loop state",
    (
        Field("counters", COUNTERS),
        Field("scheduler", OBJECT),  # its fields are this run's scheduler's: _check_schedule
        Field(
            "accelerator_step",
            MICRO_BATCHES,
            rules=(at_most("micro_batches", f"is {{value}}, not {MICRO_BATCHES.name}"),),
        ),
        Field("grad_scaler", OBJECT, null=True),  # its fields are this run's scaler's: _check_grad_scaler
        Field("log_window", LOG_WINDOW, null=True, absent=True),
    ),
)
"""loop_state.json, as `save_training_state` writes it."""


def check_fields(saved: Any, table: Table, expected: Expected, where: str = "") -> None:
    """`saved` holds the fields of `table` and no others (an `absent` one may be missing), each of its kind
    (null where the field may be), its rules holding, then the table's relations: else a `DamagedCheckpoint`
    naming the file and the first field that does not fit. A field that is a table is checked the same way."""
    names = {field.name for field in table.fields}
    required = {field.name for field in table.fields if not field.absent}
    if not isinstance(saved, dict) or not required <= set(saved) <= names:
        raise DamagedCheckpoint(f"{LOOP_STATE_FILE} does not hold {table.holds}")
    for field in table.fields:
        value = saved.get(field.name)
        place = f"{where}.{field.name}" if where else field.name
        if field.name not in saved or value is None and field.null:
            continue
        if isinstance(field.kind, Table):
            check_fields(value, field.kind, expected, place)
            continue
        problem = None if field.kind.fits(value) else f"is {_shown(value)}, not {field.kind.name}"
        for rule in field.rules:
            problem = problem or rule(value, saved, expected)
        if problem:
            raise DamagedCheckpoint(f"{LOOP_STATE_FILE}: {place} {problem}")
    for relation in table.relations:
        problem = relation(saved, expected, where)
        if problem:
            raise DamagedCheckpoint(f"{LOOP_STATE_FILE}: {problem}")


def _check_schedule(saved: Any, scheduler, expected: Expected) -> dict[str, Any]:
    """The learning-rate schedule: the fields of this run's scheduler, every number finite and no rate negative;
    its step no later than the checkpoint's (a step skipped for an overflow does not move it); with the run's
    own settings, the rate the schedule gives at that step."""
    where = f"{LOOP_STATE_FILE}: scheduler"
    live = scheduler.state_dict()
    _same_shape(saved, live, where)
    if "last_epoch" in live:
        if not _is_count(saved["last_epoch"]) or saved["last_epoch"] > expected.global_step:
            raise DamagedCheckpoint(
                f"{where}.last_epoch is {_shown(saved['last_epoch'])}, not a step from 0 to the checkpoint's "
                f"{expected.global_step}"
            )
        if "_step_count" in live and saved["_step_count"] != saved["last_epoch"] + 1:
            raise DamagedCheckpoint(f"{where}._step_count disagrees with its last_epoch")
    for key in ("base_lrs", "_last_lr"):
        for index, rate in enumerate(saved.get(key) or []):
            if rate < 0:
                raise DamagedCheckpoint(f"{where}.{key}[{index}] is {_shown(rate)}, a negative learning rate")
    lambdas = getattr(scheduler, "lr_lambdas", None)
    if expected.same_schedule and lambdas and "_last_lr" in live and "last_epoch" in live:
        for index, (base, live_base, rate, fn) in enumerate(
            zip(saved["base_lrs"], live["base_lrs"], saved["_last_lr"], lambdas, strict=True)
        ):
            if base != live_base:
                raise DamagedCheckpoint(
                    f"{where}.base_lrs[{index}] is {_shown(base)}, this run's is {live_base}"
                )
            should = base * fn(saved["last_epoch"])
            if not math.isclose(rate, should, rel_tol=1e-9, abs_tol=1e-15):
                raise DamagedCheckpoint(
                    f"{where}._last_lr[{index}] is {_shown(rate)}, but the schedule gives {should:.6g} at step "
                    f"{saved['last_epoch']}"
                )
    return saved


def _check_grad_scaler(saved: Any, scaler) -> dict[str, Any] | None:
    """fp16's gradient scaler: its settings are this run's, its scale finite and positive, its count of steps
    since the last overflow below the growth interval. A run without one ignores a saved one."""
    where = f"{LOOP_STATE_FILE}: grad_scaler"
    if scaler is None:
        return None
    live = scaler.state_dict()
    _same_shape(saved, live, where)
    if not live:
        return saved
    for key in ("growth_factor", "backoff_factor", "growth_interval"):
        if saved[key] != live[key]:
            raise DamagedCheckpoint(f"{where}.{key} is {_shown(saved[key])}, this run's is {live[key]}")
    if saved["scale"] <= 0:
        raise DamagedCheckpoint(f"{where}.scale is {_shown(saved['scale'])}, not positive")
    if not 0 <= saved["_growth_tracker"] < live["growth_interval"]:
        raise DamagedCheckpoint(
            f"{where}._growth_tracker is {_shown(saved['_growth_tracker'])}, out of range"
        )
    return saved


def _check_loop_state(folder: Path, scheduler, scaler, expected: Expected) -> dict[str, Any]:
    """loop_state.json: every field of `LOOP_STATE` (`check_fields`), then the schedule and the gradient scaler
    against this run's."""
    try:
        loop = json.loads((folder / LOOP_STATE_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DamagedCheckpoint(f"{LOOP_STATE_FILE} is missing") from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise DamagedCheckpoint(f"{LOOP_STATE_FILE} is unreadable ({type(err).__name__})") from None
    check_fields(loop, LOOP_STATE, expected)
    _check_schedule(loop["scheduler"], scheduler, expected)
    _check_grad_scaler(loop["grad_scaler"], scaler)
    return loop


def load_training_state(
    accelerator: Accelerator,
    model,
    optimizer,
    scheduler,
    state: TrainState,
    folder: Path,
    global_step: int | Expected,
    saved_processes: int | None,
) -> dict[str, Any] | None:
    """Load what `save_training_state` wrote into the run's objects: `check_training_state`, then
    `apply_training_state`. `global_step`: the checkpoint's step, or all the run expects of it (`Expected`).
    Returns the logging window's saved sums (`LOG_WINDOW`), or None."""
    checked = check_training_state(
        accelerator, model, optimizer, scheduler, folder, global_step, saved_processes
    )
    return apply_training_state(checked, accelerator, model, optimizer, scheduler, state)


@dataclass
class CheckedState:
    """A checkpoint's state, read and checked, not yet loaded into the run's objects."""

    folder: Path
    loop: dict[str, Any]
    random_states: Any
    weights: dict[str, torch.Tensor] | None
    optimizer_state: dict[str, Any] | None


def check_training_state(
    accelerator: Accelerator,
    model,
    optimizer,
    scheduler,
    folder: Path,
    expected: int | Expected,
    saved_processes: int | None,
) -> CheckedState:
    """Read and check every file of the checkpoint against the run's objects, changing none of them: the loop
    state (every field of `LOOP_STATE`, `check_fields`), this process's random states, the weights and the
    optimizer state (`check_tensors`: each against the model's tensor or its parameter). A damaged or
    inconsistent file raises `DamagedCheckpoint` naming it and the first field or parameter that does not fit
    (`ModelMismatch` for weights of another model). `saved_processes`: how many processes wrote the checkpoint
    (a process beyond them, in a resume on more processes, keeps its own random states)."""
    folder = Path(folder)
    if not isinstance(expected, Expected):
        expected = Expected(global_step=expected)
    loop = _check_loop_state(folder, scheduler, accelerator.scaler, expected)
    rng_path = folder / RNG_FILE.format(accelerator.process_index)
    random_states = None
    if rng_path.is_file() or saved_processes is None or accelerator.process_index < saved_processes:
        random_states = _read_random_states(rng_path)
    weights = optimizer_state = None
    if accelerator.distributed_type != DistributedType.DEEPSPEED:
        weights = _check_model(accelerator, model, folder)
        optimizer_state = _check_optimizer(accelerator, model, optimizer, folder, loop, expected)
    return CheckedState(folder, loop, random_states, weights, optimizer_state)


def expected_of(
    plan: ResumePlan, training, total_steps: int, steps_per_epoch: int | None, compared: bool
) -> Expected:
    """What a run of `training` settings (`total_steps` steps, `steps_per_epoch` a stream's None) expects of the
    state of the checkpoint `plan` resumes. `compared`: the run's config was compared with the checkpoint's (its
    own settings unless --training.allow_config_change)."""
    from .checkpoint_files import CHECKPOINT_PREFIX

    folder = plan.folder
    digits = folder.name[len(CHECKPOINT_PREFIX) :]
    saved = plan.saved_layout
    accumulation = training.gradient_accumulation_steps
    if saved is not None and saved.gradient_accumulation_steps >= 1:
        accumulation = saved.gradient_accumulation_steps
    return Expected(
        global_step=plan.saved_state["global_step"],
        folder_step=int(digits) if folder.name.startswith(CHECKPOINT_PREFIX) and digits.isdigit() else None,
        total_steps=total_steps,
        steps_per_epoch=steps_per_epoch,
        accumulation=accumulation,
        same_schedule=compared and not training.allow_config_change and plan.saved_config is not None,
    )


def check_on_every_process(
    accelerator: Accelerator,
    model,
    optimizer,
    scheduler,
    plan: ResumePlan,
    expected: Expected,
) -> tuple[CheckedState | None, tuple[str, str] | None]:
    """`check_training_state` of the checkpoint `plan` resumes on every process, and one verdict for all (a
    collective: every process calls it): (the checked state, None), or (None, (kind, why)) where any process
    found a fault: `damaged`, or `unfit` for weights of another model after a deliberate config change (or a
    checkpoint of another engine)."""
    checked, verdict = None, None
    try:
        saved = plan.saved_layout
        checked = check_training_state(
            accelerator,
            model,
            optimizer,
            scheduler,
            plan.folder,
            expected,
            saved.num_processes if saved else None,
        )
    except ModelMismatch as err:  # another model shape: a changed config's doing, or a damaged file
        verdict = ("damaged" if expected.same_schedule else "unfit", str(err))
    except DamagedCheckpoint as err:
        verdict = ("damaged", str(err))
    except (RuntimeError, ValueError, KeyError, TypeError) as err:  # e.g. written under another engine
        verdict = ("unfit", (str(err).strip().splitlines() or [type(err).__name__])[0][:300])
    if accelerator.num_processes > 1:  # every process goes on, falls back or stops alike
        from accelerate.utils import gather_object

        verdict = next((v for v in gather_object([verdict]) if v is not None), None)
    return (checked, None) if verdict is None else (None, verdict)


def apply_training_state(
    checked: CheckedState, accelerator: Accelerator, model, optimizer, scheduler, state: TrainState
) -> dict[str, Any] | None:
    """Load a checked state into the run's objects; returns the logging window's saved sums, or None."""
    loop = checked.loop
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        accelerator.load_state(str(checked.folder))  # DeepSpeed's own files: only reached with the opt-in
    else:
        _load_model(accelerator, model, checked.weights)
        _load_optimizer(accelerator, model, optimizer, checked.optimizer_state)
    scheduler.load_state_dict(loop["scheduler"])
    state.load_state_dict(loop["counters"])
    accelerator.step = loop["accelerator_step"]
    if accelerator.scaler is not None:
        accelerator.scaler.load_state_dict(loop["grad_scaler"])
    if checked.random_states is not None:
        _set_random_states(checked.random_states)
    else:
        logger.info("%s: no random states of process %d", checked.folder.name, accelerator.process_index)
    return loop.get("log_window")


# ----------------------------------------------------------------------------------------------------------
# the weights and the optimizer state, against the model's parameters


def _live_weights(accelerator: Accelerator, model) -> dict[str, torch.Tensor]:
    """The model's state dict as the checkpoint names it (a sharded model's tensors with their whole shapes)."""
    if _is_fsdp(accelerator):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=False))
    return accelerator.unwrap_model(model).state_dict()


def check_tensors(
    saved: dict[str, Any],
    expected: dict[str, torch.Tensor],
    where: str,
    whose: str,
    mismatch: type[DamagedCheckpoint] = DamagedCheckpoint,
) -> None:
    """The one check of a checkpoint's tensors, weights and optimizer state alike: `saved` holds the names of
    `expected` (the run's tensors) and no others, each a tensor of its expected one's shape and dtype (else
    `mismatch`), every floating-point one finite. `where`: the file (and parameter) a refusal names; `whose`:
    how it names the expected tensor ("the model's", "the parameter")."""
    missing, unexpected = sorted(set(expected) - set(saved)), sorted(set(saved) - set(expected))
    if missing or unexpected:
        raise mismatch(
            f"{where} holds other tensors than {whose} (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    for name, live in expected.items():
        tensor = saved[name]
        if not torch.is_tensor(tensor):
            raise DamagedCheckpoint(f"{where}: {name} is not a tensor")
        if tuple(tensor.shape) != tuple(live.shape) or tensor.dtype != live.dtype:
            raise mismatch(
                f"{where}: {name} is {tensor.dtype} {list(tensor.shape)}, {whose} is {live.dtype} "
                f"{list(live.shape)}"
            )
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise DamagedCheckpoint(f"{where}: {name} holds NaN or infinite values")


def _check_model(accelerator: Accelerator, model, folder: Path) -> dict[str, torch.Tensor]:
    """model.safetensors holds every weight of the model (tied weights once), `check_tensors`. Returns them,
    tied names filled in."""
    weights, _ = _read_safetensors(folder / MODEL_FILE)
    live = _live_weights(accelerator, model)
    if _is_fsdp(accelerator):
        names: dict[int, list[str]] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            names.setdefault(id(param), []).append(name)
        tied_groups = list(names.values())
    else:
        # tied weights are saved once (safetensors keeps no two names for one tensor): every other name of the
        # same tensor is filled from the saved one
        by_storage: dict[tuple, list[str]] = {}
        for name, tensor in live.items():
            key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
            by_storage.setdefault(key, []).append(name)
        tied_groups = list(by_storage.values())
    for tied in tied_groups:
        present = [n for n in tied if n in weights]
        for name in tied:
            if present and name not in weights:
                weights[name] = weights[present[0]]
    check_tensors(weights, live, MODEL_FILE, "the model's", mismatch=ModelMismatch)
    return weights


def _live_parameters(
    accelerator: Accelerator, model, optimizer, keys: str
) -> list[list[tuple[Any, str, Any]]]:
    """Per param group of the optimizer, its parameters as (key in the saved state, name, parameter): key the
    index in torch's numbering (`index`) or the parameter's name (`name`, FSDP's)."""
    inner = getattr(optimizer, "optimizer", optimizer)
    names: dict[int, str] = {}
    for name, param in accelerator.unwrap_model(model).named_parameters(remove_duplicate=False):
        names.setdefault(id(param), name)
    groups, index = [], 0
    for group in inner.param_groups:
        rows = []
        for param in group["params"]:
            name = names.get(id(param), f"parameter {index}")
            rows.append((index if keys == "index" else name, name, param))
            index += 1
        groups.append(rows)
    return groups


_ALGORITHM_FLAGS = ("amsgrad", "maximize", "decoupled_weight_decay", "differentiable")
"""Settings of a param group that change what the optimizer computes: the checkpoint's must be this run's."""
_DEVICE_FLAGS = ("foreach", "fused", "capturable")
"""Settings of a param group that choose how it is computed on this machine: this run's are kept."""
_RUN_SETTINGS = ("betas", "eps", "weight_decay", "initial_lr")
"""Settings of a param group from the run's config: this run's, unless --training.allow_config_change."""


def _check_group(saved: Any, live: dict, index: int, where: str, schedule: dict, expected: Expected) -> dict:
    """A parameter group's settings (its fields already this run's, `_check_optimizer`): of the same kinds and
    ranges, the algorithm's this run's, the learning rate the saved schedule's. Returns them as the optimizer
    loads them (this machine's device flags kept)."""
    where = f"{where}: parameter group {index}"
    for key, value in live.items():
        if key == "params" or key in _DEVICE_FLAGS:
            continue
        _same_shape(saved[key], value, f"{where}.{key}")
    for key in _ALGORITHM_FLAGS:
        if key in live and saved[key] != live[key]:
            raise DamagedCheckpoint(
                f"{where}.{key} is {_shown(saved[key])}, this run's is {_shown(live[key])}"
            )
    for key in ("lr", "initial_lr", "weight_decay"):
        if key in live and saved[key] < 0:
            raise DamagedCheckpoint(f"{where}.{key} is {_shown(saved[key])}, negative")
    if "eps" in live and saved["eps"] <= 0:
        raise DamagedCheckpoint(f"{where}.eps is {_shown(saved['eps'])}, not positive")
    if "betas" in live and not all(0 <= beta < 1 for beta in saved["betas"]):
        raise DamagedCheckpoint(f"{where}.betas is {_shown(saved['betas'])}, not two numbers in [0, 1)")
    if expected.same_schedule:
        for key in _RUN_SETTINGS:
            if key in live and _as_live_types(saved[key], live[key]) != live[key]:
                raise DamagedCheckpoint(
                    f"{where}.{key} is {_shown(saved[key])}, this run's is {_shown(live[key])}"
                )
    rates = schedule.get("_last_lr")
    if "lr" in live and rates is not None and index < len(rates) and saved["lr"] != rates[index]:
        raise DamagedCheckpoint(
            f"{where}.lr is {_shown(saved['lr'])} but the saved schedule's rate is {_shown(rates[index])}"
        )
    bases = schedule.get("base_lrs")
    if (
        "initial_lr" in live
        and bases is not None
        and index < len(bases)
        and saved["initial_lr"] != bases[index]
    ):
        raise DamagedCheckpoint(
            f"{where}.initial_lr is {_shown(saved['initial_lr'])} but the saved schedule's is {_shown(bases[index])}"
        )
    group = {key: _as_live_types(saved[key], value) for key, value in live.items() if key != "params"}
    for key in _DEVICE_FLAGS:
        if key in live:
            group[key] = live[key]
    return group


def _state_keys(optimizer, group: dict) -> set[str] | None:
    """The per-parameter state torch's Adam and AdamW keep (None: another optimizer, whose keys are not known)."""
    inner = getattr(optimizer, "optimizer", optimizer)
    if type(inner) not in (torch.optim.Adam, torch.optim.AdamW):
        return None
    return {"step", "exp_avg", "exp_avg_sq"} | ({"max_exp_avg_sq"} if group.get("amsgrad") else set())


def _check_param_state(
    values: dict[str, Any], name: str, param, keys: set[str] | None, where: str, expected: Expected
) -> None:
    """One parameter's optimizer state: the keys its optimizer keeps; its step a whole number from 0 to the
    checkpoint's step; every other tensor the parameter's (`check_tensors`), second moments not negative.
    Another optimizer's plain (non-tensor) values are its own."""
    where = f"{where}: the state of {name}"
    if keys is not None and set(values) != keys:
        raise DamagedCheckpoint(f"{where} holds {sorted(values)}, not {sorted(keys)}")
    tensors = {key: value for key, value in values.items() if keys is not None or torch.is_tensor(value)}
    if "step" in tensors:
        _check_step(tensors.pop("step"), where, expected)
    check_tensors(tensors, dict.fromkeys(tensors, param), where, "the parameter")
    for key, value in tensors.items():
        if key.endswith("_sq") and bool((value < 0).any()):
            raise DamagedCheckpoint(f"{where}: {key} holds negative values")


def _check_step(step: Any, where: str, expected: Expected) -> None:
    """A parameter's optimizer step: one number (torch keeps it as a float or int tensor), a whole one from 0 to
    the checkpoint's step."""
    if not torch.is_tensor(step):
        raise DamagedCheckpoint(f"{where}: step is not a tensor")
    if step.dim() != 0 or not step.is_floating_point() and step.dtype not in (torch.int64, torch.int32):
        raise DamagedCheckpoint(f"{where}: step is a {step.dtype} {list(step.shape)}, not one number")
    value = float(step)
    if not math.isfinite(value) or value != int(value) or not 0 <= value <= expected.global_step:
        raise DamagedCheckpoint(
            f"{where}: step is {value:g}, not a count from 0 to the checkpoint's {expected.global_step}"
        )


def _check_optimizer(
    accelerator: Accelerator, model, optimizer, folder: Path, loop: dict, expected: Expected
) -> dict[str, Any]:
    """optimizer.safetensors against the run's optimizer and model: its parameter groups this run's (the same
    parameters in each, settings of the same kinds and ranges, the learning rate the saved schedule's), and each
    parameter's state (`_check_param_state`) of that parameter. Returns the state dict to load."""
    path = folder / OPTIMIZER_FILE
    tensors, meta = _read_safetensors(path)
    header = _json_meta(meta, "kiln_optimizer", path)
    expected_keys = "name" if _is_fsdp(accelerator) else "index"
    if not isinstance(header, dict) or set(header) != {"keys", "param_groups", "state"}:
        raise DamagedCheckpoint(f"{path.name} lacks the optimizer's settings")
    if header["keys"] != expected_keys:
        if header["keys"] not in ("name", "index"):
            raise DamagedCheckpoint(f"{path.name}: its parameters are keyed by {_shown(header['keys'])}")
        raise RuntimeError(
            f"{path.name} was written {'with' if header['keys'] == 'name' else 'without'} FSDP; resume it under "
            "the engine it was written with"
        )
    inner = getattr(optimizer, "optimizer", optimizer)
    live_groups = inner.state_dict()["param_groups"]
    live_params = _live_parameters(accelerator, model, optimizer, expected_keys)
    groups = header["param_groups"]
    if not isinstance(groups, list) or len(groups) != len(live_groups):
        raise DamagedCheckpoint(f"{path.name}: the optimizer's parameter groups differ from this run's")
    # the layout first (which parameters each group lists), then each parameter's state, then the groups' settings:
    # an optimizer state of another model is named by its first parameter that does not fit
    owner = {}
    for index, (saved, live, params) in enumerate(zip(groups, live_groups, live_params, strict=True)):
        if not isinstance(saved, dict) or set(saved) != set(live):
            raise DamagedCheckpoint(f"{path.name}: parameter group {index} does not hold this run's settings")
        listed = saved["params"]
        kind = int if expected_keys == "index" else str
        if not isinstance(listed, list) or not all(type(key) is kind for key in listed):
            raise DamagedCheckpoint(f"{path.name}: parameter group {index} does not list its parameters")
        keys = [key for key, _, _ in params]
        same = (
            listed == keys
            if expected_keys == "index"
            else len(listed) == len(keys) and set(listed) == set(keys)
        )
        if not same:
            first = next(
                (i for i, (a, b) in enumerate(zip(listed, keys)) if a != b), min(len(listed), len(keys))
            )
            shown = params[first][1] if first < len(params) else f"entry {first}"
            raise DamagedCheckpoint(
                f"{path.name}: parameter group {index} lists {len(listed)} parameters, this run's {len(keys)}; the "
                f"first that differs is {shown}"
            )
        for key, name, param in params:
            owner[str(key)] = (name, param, _state_keys(optimizer, live))
    settings = header["state"]
    if not isinstance(settings, dict) or not all(isinstance(v, dict) for v in settings.values()):
        raise DamagedCheckpoint(f"{path.name}: the optimizer's per-parameter settings are unreadable")
    per_param: dict[str, dict[str, Any]] = {key: {} for key in owner if key in settings}
    for key, values in settings.items():
        if key not in owner:
            raise DamagedCheckpoint(
                f"{path.name}: it holds the state of parameter {_shown(key)}, which this run's "
                "optimizer does not have"
            )
        per_param[key] = dict(values)
    for key, tensor in tensors.items():
        param, _, name = key.rpartition("/")
        if param not in per_param:
            raise DamagedCheckpoint(f"{path.name}: tensor {key} belongs to no parameter")
        per_param[param][name] = tensor
    for key, values in per_param.items():
        name, param, keys = owner[key]
        _check_param_state(values, name, param, keys, path.name, expected)
    checked_groups = []
    for index, (saved, live) in enumerate(zip(groups, live_groups, strict=True)):
        group = _check_group(saved, live, index, path.name, loop["scheduler"], expected)
        group["params"] = saved["params"]
        checked_groups.append(group)
    if expected_keys == "index":
        return {"state": {int(k): v for k, v in per_param.items()}, "param_groups": checked_groups}
    return {"state": per_param, "param_groups": checked_groups}


def _load_model(accelerator: Accelerator, model, weights: dict[str, torch.Tensor]) -> None:
    if _is_fsdp(accelerator):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=True))
        return
    accelerator.unwrap_model(model).load_state_dict(weights, strict=True)


def _load_optimizer(accelerator: Accelerator, model, optimizer, opt_state: dict[str, Any]) -> None:
    if not _is_fsdp(accelerator):
        optimizer.load_state_dict(opt_state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    inner = getattr(optimizer, "optimizer", optimizer)
    set_optimizer_state_dict(model, inner, opt_state, options=StateDictOptions(full_state_dict=True))


def _read_random_states(path: Path) -> tuple[dict[str, torch.Tensor], list, list]:
    """A process's random states: Python's (version 3, 624 32-bit words and a position from 0 to 624, a finite
    Gaussian or null), NumPy's (MT19937: 624 words, position, a 0/1 flag, a finite cached Gaussian), torch's CPU
    generator (bytes of this torch's length) and, where CUDA is used, each device's; nothing else."""
    tensors, meta = _read_safetensors(path)
    plain = _json_meta(meta, "kiln_random", path)

    def words(values, count):
        return (
            isinstance(values, list)
            and len(values) == count
            and all(_is_count(v) and v < 2**32 for v in values)
        )

    try:
        version, internal, gauss = plain["python"]
        name, keys, pos, has_gauss, cached = plain["numpy"]
        ok = (
            set(plain) == {"python", "numpy"}
            and version == 3
            and isinstance(internal, list)
            and len(internal) == 625
            and words(internal[:624], 624)
            and _is_count(internal[624])
            and internal[624] <= 624
            and (gauss is None or _is_number(gauss) and isinstance(gauss, float))
            and name == "MT19937"
            and words(keys, 624)
            and _is_count(pos)
            and pos <= 624
            and has_gauss in (0, 1)
            and not isinstance(has_gauss, bool)
            and _is_number(cached)
        )
    except (KeyError, TypeError, ValueError):
        ok = False
    cpu = tensors.get("torch")
    cuda = {k: v for k, v in tensors.items() if k != "torch"}
    ok = ok and cpu is not None and cpu.dtype == torch.uint8 and cpu.dim() == 1
    ok = ok and cpu.numel() == torch.get_rng_state().numel()
    ok = ok and all(
        k.startswith("cuda.") and k[5:].isdigit() and v.dtype == torch.uint8 and v.dim() == 1
        for k, v in cuda.items()
    )
    if ok and torch.cuda.is_available() and torch.cuda.is_initialized():
        size = torch.cuda.get_rng_state(0).numel()
        ok = all(v.numel() == size for v in cuda.values())
    if not ok:
        raise DamagedCheckpoint(f"{path.name} does not hold the random states of a process")
    return tensors, plain["python"], plain["numpy"]


def _set_random_states(states: tuple[dict[str, torch.Tensor], list, list]) -> None:
    import numpy as np

    tensors, python, numpy_state = states
    version, internal, gauss = python
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = numpy_state
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, float(cached)))
    torch.set_rng_state(tensors["torch"])
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            if f"cuda.{index}" in tensors:
                torch.cuda.set_rng_state(tensors[f"cuda.{index}"], index)


# ----------------------------------------------------------------------------------------------------------
# checkpoints with pickles, for one's own files


def load_pickled_state(accelerator: Accelerator, scheduler, state: TrainState, folder: Path) -> None:
    """A checkpoint in accelerate's own format (scheduler and counters as `custom_checkpoint_N.pkl`, random states
    as `random_states_R.pkl`), loaded by accelerate, which unpickles them: only with the opt-in."""
    import pickle

    accelerator.register_for_checkpointing(scheduler, state)
    try:
        accelerator.load_state(str(folder))
    except (pickle.UnpicklingError, EOFError, OSError) as err:
        names = ", ".join(pickle_files(folder))
        raise DamagedCheckpoint(
            f"one of its pickled files ({names}) is not a plain tensor file ({type(err).__name__})"
        ) from None
    finally:
        del accelerator._custom_objects[-2:]


__all__ = [
    "LOG_WINDOW_DTYPES",
    "LOOP_STATE",
    "LOOP_STATE_FILE",
    "MODEL_FILE",
    "OPTIMIZER_FILE",
    "RNG_FILE",
    "CheckedState",
    "DamagedCheckpoint",
    "Expected",
    "ModelMismatch",
    "apply_training_state",
    "check_fields",
    "check_on_every_process",
    "check_tensors",
    "check_training_state",
    "expected_of",
    "load_pickled_state",
    "load_training_state",
    "pickle_files",
    "refuse_pickles",
    "save_training_state",
]

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
skipped.
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, DistributedType

from .errors import ConfigError, first_line
from .train_state import TrainState

logger = logging.getLogger("kiln")

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
LOOP_STATE_FILE = "loop_state.json"
RNG_FILE = "rng_state_{}.safetensors"
PICKLE_SUFFIXES = (".pkl", ".pickle", ".bin", ".pt", ".pth", ".ckpt", ".distcp", ".metadata")
"""Files in formats that are loaded by unpickling (torch.save, pickle, torch.distributed.checkpoint)."""
DATA_SUFFIXES = (".safetensors", ".json", ".yaml", ".md", ".txt")
"""Files Kiln reads as data (a safetensors file may begin with any byte: its header's length)."""
TRUST_FLAG = "--training.trust_checkpoint_pickles"


class DamagedCheckpoint(ValueError):
    """A checkpoint file that cannot be what Kiln wrote: unreadable, of the wrong shape or inconsistent."""


# ----------------------------------------------------------------------------------------------------------
# which format


def pickle_files(folder: Path) -> list[str]:
    """The files of the checkpoint `folder` (at any depth) in a format that is loaded by unpickling: by name, or,
    for a name of no known format, by content (a pickle's protocol byte, or torch's zip archive)."""
    folder = Path(folder)
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        if path.suffix in PICKLE_SUFFIXES or path.name == ".metadata":
            found.append(path.relative_to(folder).as_posix())
        elif path.suffix not in DATA_SUFFIXES:
            with open(path, "rb") as fh:
                if fh.read(4).startswith((b"\x80", b"PK\x03\x04")):
                    found.append(path.relative_to(folder).as_posix())
    return found


def refuse_pickles(folder: Path, spec: str, trusted: bool) -> bool:
    """Whether the checkpoint is to be loaded with accelerate's pickle-based loader: never without `trusted`,
    where a pickle in the checkpoint is a one-line error naming the opt-in; with it, when the checkpoint is not
    in Kiln's plain-data format (no loop_state.json)."""
    found = pickle_files(folder)
    if not found:
        return False
    if not trusted:
        shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        raise ConfigError(
            f"checkpoint {spec} holds files loaded by unpickling ({shown}), which can run any code; Kiln resumes "
            f"from safetensors and JSON only. For a checkpoint you wrote yourself (an earlier Kiln version, "
            f"DeepSpeed), pass {TRUST_FLAG}"
        )
    return not (Path(folder) / LOOP_STATE_FILE).is_file()


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
    return {"state": _full_cpu({str(k): v for k, v in state["state"].items()}, keep),
            "param_groups": state["param_groups"]}, "index"  # fmt: skip


def _json_value(value: Any, where: str) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(v, where) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v, where) for k, v in value.items()}
    raise TypeError(f"{where}: a {type(value).__name__} cannot be saved as plain data")


def save_training_state(
    accelerator: Accelerator, model, optimizer, scheduler, state: TrainState, folder: Path, writer: bool,
    log_window: dict[str, Any] | None = None,
) -> None:
    """Write the model, optimizer, schedule, counters and this process's random states into `folder`. Every
    process calls it (sharded weights are gathered); `writer` writes all but the random states, which every
    process writes for itself. `log_window`: the logging window's sums so far (`check_log_window`)."""
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
            header = {"keys": keys, "param_groups": _json_value(opt_state["param_groups"], "optimizer param groups"),
                      "state": settings}  # fmt: skip
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


def _same_shape(saved: Any, live: Any, where: str) -> None:
    """`saved` (from JSON) has the keys and the kinds of values of `live` (the object's own state dict)."""
    if isinstance(live, dict):
        if not isinstance(saved, dict) or set(saved) != {str(k) for k in live}:
            raise DamagedCheckpoint(f"{where} does not hold the expected fields")
        for key, value in live.items():
            _same_shape(saved[str(key)], value, f"{where}.{key}")
    elif isinstance(live, (list, tuple)):
        if not isinstance(saved, list) or len(saved) != len(live):
            raise DamagedCheckpoint(f"{where} does not hold {len(live)} values")
    elif isinstance(live, bool):
        if not isinstance(saved, bool):
            raise DamagedCheckpoint(f"{where} is not true/false")
    elif isinstance(live, int):
        if not isinstance(saved, int) or isinstance(saved, bool):
            raise DamagedCheckpoint(f"{where} is not a whole number")
    elif isinstance(live, float):
        if not isinstance(saved, (int, float)) or isinstance(saved, bool):
            raise DamagedCheckpoint(f"{where} is not a number")


def _as_live_types(saved: Any, live: Any) -> Any:
    """JSON's lists back into the tuples of the live state (e.g. AdamW's betas)."""
    if isinstance(live, tuple) and isinstance(saved, list):
        return tuple(saved)
    return saved


def _check_counters(saved: Any, global_step: int) -> dict[str, Any]:
    import dataclasses

    fields = {f.name: f for f in dataclasses.fields(TrainState)}
    if not isinstance(saved, dict) or set(saved) != set(fields):
        raise DamagedCheckpoint(f"{LOOP_STATE_FILE} does not hold the loop's counters")
    whole = ("global_step", "epoch", "batches_in_epoch", "tokens_seen", "evals_without_improvement")
    for name in whole:
        if not isinstance(saved[name], int) or isinstance(saved[name], bool) or saved[name] < 0:
            raise DamagedCheckpoint(f"{LOOP_STATE_FILE}: counters.{name} is not a count")
    if not isinstance(saved["history"], list) or not all(isinstance(row, dict) for row in saved["history"]):
        raise DamagedCheckpoint(f"{LOOP_STATE_FILE}: counters.history is not a list of records")
    if saved["global_step"] != global_step:
        raise DamagedCheckpoint(
            f"{LOOP_STATE_FILE} is at step {saved['global_step']} but the checkpoint's trainer_state.json at "
            f"step {global_step}"
        )
    return saved


LOG_WINDOW_DTYPES = ("float32", "float64", "bfloat16", "float16")


def check_log_window(saved: Any, global_step: int) -> dict[str, Any] | None:
    """The loop state's `log_window`: the optimizer steps since the last logged line, their real tokens, the
    seconds they took and each loss part's sums, one per process that wrote them (`Trainer._log_window_state`),
    so a resumed run logs the same windowed loss as an uninterrupted one. Absent (an earlier Kiln): None."""
    import math

    if saved is None:
        return None
    where = f"{LOOP_STATE_FILE}: log_window"
    if not isinstance(saved, dict) or set(saved) != {"steps", "tokens", "seconds", "sums", "dtypes"}:
        raise DamagedCheckpoint(f"{where} does not hold the logging window's fields")
    for name in ("steps", "tokens"):
        value = saved[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise DamagedCheckpoint(f"{where}.{name} is not a count")
    if saved["steps"] > global_step:
        raise DamagedCheckpoint(f"{where} holds {saved['steps']} steps, more than the checkpoint's {global_step}")
    seconds = saved["seconds"]
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < math.inf:
        raise DamagedCheckpoint(f"{where}.seconds is not a duration")
    sums, dtypes = saved["sums"], saved["dtypes"]
    if not isinstance(sums, dict) or not isinstance(dtypes, dict) or set(sums) != set(dtypes):
        raise DamagedCheckpoint(f"{where}: its sums and their dtypes do not name the same loss parts")
    if bool(sums) != bool(saved["steps"]):
        raise DamagedCheckpoint(f"{where}: its sums do not agree with its {saved['steps']} steps")
    widths = set()
    for name, shares in sums.items():
        if dtypes[name] not in LOG_WINDOW_DTYPES:
            raise DamagedCheckpoint(f"{where}: loss part {name!r} has no known dtype")
        # NaN and inf are sums too: a step skipped for a non-finite loss is logged as such in its window
        if not isinstance(shares, list) or not shares or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in shares
        ):
            raise DamagedCheckpoint(f"{where}: loss part {name!r} does not hold one number per process")
        widths.add(len(shares))
    if len(widths) > 1:
        raise DamagedCheckpoint(f"{where}: its loss parts hold sums of different numbers of processes")
    return saved


def load_training_state(
    accelerator: Accelerator,
    model,
    optimizer,
    scheduler,
    state: TrainState,
    folder: Path,
    global_step: int,
    saved_processes: int | None,
) -> dict[str, Any] | None:
    """Load what `save_training_state` wrote into the run's objects. Everything is read and checked before
    anything is changed where that is possible (the loop state, the random states); a damaged or inconsistent
    file raises `DamagedCheckpoint` naming it. `saved_processes`: how many processes wrote the checkpoint (a
    process beyond them, in a resume on more processes, keeps its own random states). Returns the logging
    window's saved sums (`check_log_window`), or None."""
    folder = Path(folder)
    try:
        loop = json.loads((folder / LOOP_STATE_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DamagedCheckpoint(f"{LOOP_STATE_FILE} is missing") from None
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise DamagedCheckpoint(f"{LOOP_STATE_FILE} is unreadable ({type(err).__name__})") from None
    if not isinstance(loop, dict) or not {"counters", "scheduler", "accelerator_step"} <= set(loop):
        raise DamagedCheckpoint(f"{LOOP_STATE_FILE} does not hold the loop state")
    counters = _check_counters(loop["counters"], global_step)
    log_window = check_log_window(loop.get("log_window"), global_step)
    _same_shape(loop["scheduler"], scheduler.state_dict(), f"{LOOP_STATE_FILE}: scheduler")
    step = loop["accelerator_step"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise DamagedCheckpoint(f"{LOOP_STATE_FILE}: accelerator_step is not a count")
    if accelerator.scaler is not None:
        _same_shape(
            loop.get("grad_scaler"), accelerator.scaler.state_dict(), f"{LOOP_STATE_FILE}: grad_scaler"
        )
    rng_path = folder / RNG_FILE.format(accelerator.process_index)
    random_states = None
    if rng_path.is_file() or saved_processes is None or accelerator.process_index < saved_processes:
        random_states = _read_random_states(rng_path)

    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        accelerator.load_state(str(folder))  # DeepSpeed's own files: only reached with the opt-in
    else:
        _load_model(accelerator, model, folder)
        _load_optimizer(accelerator, model, optimizer, folder)
    scheduler.load_state_dict(loop["scheduler"])
    state.load_state_dict(counters)
    accelerator.step = step
    if accelerator.scaler is not None:
        accelerator.scaler.load_state_dict(loop["grad_scaler"])
    if random_states is not None:
        _set_random_states(random_states)
    else:
        logger.info("%s: no random states of process %d (written on %s processes)", folder.name,
                    accelerator.process_index, saved_processes)  # fmt: skip
    return log_window


def _load_model(accelerator: Accelerator, model, folder: Path) -> None:
    weights, _ = _read_safetensors(folder / MODEL_FILE)
    if _is_fsdp(accelerator):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        # a file written without FSDP keeps one copy of tied weights: the others are the same tensor
        names: dict[int, list[str]] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            names.setdefault(id(param), []).append(name)
        for tied in names.values():
            present = [n for n in tied if n in weights]
            for name in tied:
                if present and name not in weights:
                    weights[name] = weights[present[0]]
        set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=True))
        return
    unwrapped = accelerator.unwrap_model(model)
    live = unwrapped.state_dict()
    # tied weights are saved once (safetensors keeps no two names for one tensor): every other name of the same
    # tensor is filled from the saved one
    by_storage: dict[tuple, list[str]] = {}
    for name, tensor in live.items():
        by_storage.setdefault((tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape)),
                              []).append(name)  # fmt: skip
    for tied in by_storage.values():
        present = [n for n in tied if n in weights]
        for name in tied:
            if present and name not in weights:
                weights[name] = weights[present[0]]
    unexpected, missing = set(weights) - set(live), set(live) - set(weights)
    if unexpected or missing:
        raise RuntimeError(
            f"{MODEL_FILE} holds other weights than the model (missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]})"
        )
    unwrapped.load_state_dict(weights, strict=True)


def _load_optimizer(accelerator: Accelerator, model, optimizer, folder: Path) -> None:
    path = folder / OPTIMIZER_FILE
    tensors, meta = _read_safetensors(path)
    header = _json_meta(meta, "kiln_optimizer", path)
    expected = "name" if _is_fsdp(accelerator) else "index"
    if not isinstance(header, dict) or not {"keys", "param_groups", "state"} <= set(header):
        raise DamagedCheckpoint(f"{path.name} lacks the optimizer's settings")
    if header["keys"] != expected:
        raise RuntimeError(
            f"{path.name} was written {'with' if header['keys'] == 'name' else 'without'} FSDP; resume it under "
            "the engine it was written with"
        )
    inner = getattr(optimizer, "optimizer", optimizer)
    live_groups = inner.state_dict()["param_groups"]
    groups = header["param_groups"]
    if not isinstance(groups, list) or len(groups) != len(live_groups):
        raise DamagedCheckpoint(f"{path.name}: the optimizer's parameter groups differ from this run's")
    for saved, live in zip(groups, live_groups, strict=True):
        if not isinstance(saved, dict) or set(saved) != set(live):
            raise DamagedCheckpoint(f"{path.name}: an optimizer parameter group lacks its settings")
        for key, value in live.items():
            saved[key] = _as_live_types(saved[key], value)
    settings = header["state"]
    if not isinstance(settings, dict) or not all(isinstance(v, dict) for v in settings.values()):
        raise DamagedCheckpoint(f"{path.name}: the optimizer's per-parameter settings are unreadable")
    per_param: dict[str, dict[str, Any]] = {k: dict(v) for k, v in settings.items()}
    for key, tensor in tensors.items():
        param, _, name = key.rpartition("/")
        if param not in per_param:
            raise DamagedCheckpoint(f"{path.name}: tensor {key} belongs to no parameter")
        per_param[param][name] = tensor
    if expected == "index":
        try:
            opt_state = {"state": {int(k): v for k, v in per_param.items()}, "param_groups": groups}
        except ValueError:
            raise DamagedCheckpoint(f"{path.name}: parameters are not numbered") from None
        optimizer.load_state_dict(opt_state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, inner, {"state": per_param, "param_groups": groups},
                             options=StateDictOptions(full_state_dict=True))  # fmt: skip


def _read_random_states(path: Path) -> tuple[dict[str, torch.Tensor], list, list]:
    tensors, meta = _read_safetensors(path)
    plain = _json_meta(meta, "kiln_random", path)
    try:
        version, internal, gauss = plain["python"]
        name, keys, pos, has_gauss, cached = plain["numpy"]
        ok = (
            isinstance(version, int) and isinstance(internal, list) and len(internal) == 625
            and all(isinstance(v, int) for v in internal) and (gauss is None or isinstance(gauss, float))
            and name == "MT19937" and isinstance(keys, list) and len(keys) == 624
            and all(isinstance(k, int) and 0 <= k < 2**32 for k in keys)
            and all(isinstance(v, int) for v in (pos, has_gauss)) and isinstance(cached, (int, float))
        )  # fmt: skip
    except (KeyError, TypeError, ValueError):
        ok = False
    cpu = tensors.get("torch")
    if not ok or cpu is None or cpu.dtype != torch.uint8 or cpu.dim() != 1:
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
    "LOOP_STATE_FILE",
    "MODEL_FILE",
    "OPTIMIZER_FILE",
    "RNG_FILE",
    "DamagedCheckpoint",
    "check_log_window",
    "load_pickled_state",
    "load_training_state",
    "pickle_files",
    "refuse_pickles",
    "save_training_state",
]

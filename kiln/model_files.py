"""A saved model's config.json read as data, never as code; its safetensors headers read without their tensors; its
weight files' faults named in one line.

transformers' Auto classes run the Python files a folder or Hub repo names in its `auto_map` when asked to trust
remote code, and without that flag they may stop and prompt on the terminal. Kiln decides what a checkpoint is by
reading its config.json as plain JSON (a local file, or `hf_hub_download` of that one file), then loads it with
Kiln's own classes; a checkpoint's code runs only when the user passes `--model.trust_remote_code`.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import warnings
from collections.abc import Iterator

from .errors import ConfigError, first_line


def read_model_config(spec: str, revision: str | None = None) -> dict:
    """config.json of the folder or Hub repo `spec`, as a dict. OSError (first line of the cause) when there is
    none, it is not a JSON object, or the Hub cannot be reached."""
    if os.path.isdir(spec):
        path = os.path.join(spec, "config.json")
    else:
        from huggingface_hub import hf_hub_download

        try:
            path = hf_hub_download(spec, "config.json", revision=revision)
        except (
            Exception
        ) as err:  # not found, no access, no network, invalid id: all mean "cannot read it here"
            raise OSError(first_line(err)) from None
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise OSError(f"cannot read {os.path.basename(path)}: {first_line(err)}") from None
    if not isinstance(config, dict):
        raise OSError("config.json does not hold a JSON object")
    return config


def safetensors_header(path: str | os.PathLike) -> dict:
    """The JSON header of a safetensors file (tensor name -> dtype, shape, data offsets; `__metadata__`), read
    without its tensors. OSError naming the fault: unreadable, not a safetensors file, or shorter than its header
    says (truncated)."""
    import struct

    name = os.path.basename(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            if length > min(size - 8, 100 << 20):  # safetensors' own limit on a header: 100 MB
                raise ValueError(f"a header of {length:,} bytes")
            header = json.loads(fh.read(length))
        tensors = {key: entry for key, entry in header.items() if key != "__metadata__"}
        end = max((int(entry["data_offsets"][1]) for entry in tensors.values()), default=0)
        for entry in tensors.values():
            if not all(isinstance(n, int) and n >= 0 for n in entry["shape"]):
                raise ValueError(f"a tensor of shape {entry['shape']!r}")
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, struct.error) as err:
        raise OSError(f"{name} is damaged or truncated (not a safetensors file: {first_line(err)})") from None
    if size < 8 + length + end:
        raise OSError(
            f"{name} is damaged or truncated ({size:,} bytes; its header needs {8 + length + end:,})"
        )
    return header


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
# torch's pickled weight files (`save_pretrained(safe_serialization=False)`, older Hub repos): unpickled only when
# the user opts in (`pickle_weight_shapes`)
PICKLE_WEIGHT_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")


def weight_files(folder: str | os.PathLike) -> list[str] | None:
    """The safetensors files of a saved model folder: [model.safetensors], or the index followed by each shard it
    names; None when the folder holds no safetensors weights. Each is a plain file inside the folder: an index
    naming a shard by a path (`../x.safetensors`, an absolute name), a shard that is not there, or a file that is
    a link leading out of the folder is an OSError (one line), so nothing outside the folder is read as its
    weights. (A Hub download's folder is the exception that proves the rule: its files link into the same
    repository's blobs in the Hugging Face cache.)"""
    return _named_files(folder, *WEIGHT_FILES)


def pickle_weight_files(folder: str | os.PathLike) -> list[str] | None:
    """`weight_files` for torch's pickled weights: [pytorch_model.bin], or its index followed by each shard it
    names; None when the folder holds none. The same checks (plain files inside the folder); nothing is read but
    the index."""
    return _named_files(folder, *PICKLE_WEIGHT_FILES)


def _named_files(folder: str | os.PathLike, single_name: str, index_name: str) -> list[str] | None:
    single, index = os.path.join(folder, single_name), os.path.join(folder, index_name)
    if os.path.lexists(single):
        _inside(folder, single)
        return [single]
    if not os.path.lexists(index):
        return None
    _inside(folder, index)
    try:
        with open(index, encoding="utf-8") as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise OSError(f"{index_name} is damaged ({first_line(err)})") from None
    outside = [shard for shard in shards if not isinstance(shard, str) or os.path.basename(shard) != shard]
    if outside or not shards:
        named = f" ({outside[0]!r})" if outside else ""
        raise OSError(f"{index_name} names shards outside its folder{named}")
    files = [os.path.join(folder, shard) for shard in shards]
    for path in files:
        if not os.path.lexists(path):
            raise OSError(f"{index_name} names {os.path.basename(path)}, which is not in the folder")
        _inside(folder, path)
    return [index, *files]


def _inside(folder: str | os.PathLike, path: str) -> None:
    """`path` (in `folder`) is a plain file whose real path is in the folder, or, for a folder in the Hugging Face
    cache, in the same repository's cache folder; OSError naming it when not."""
    name = os.path.basename(path)
    if not os.path.isfile(path):
        what = "a dangling link" if os.path.islink(path) else "not a plain file"
        raise OSError(f"{name} is {what}")
    real, home = os.path.realpath(path), os.path.realpath(folder)
    if os.path.commonpath([real, home]) == home:
        return
    from huggingface_hub import constants

    cache = os.path.realpath(constants.HF_HUB_CACHE)
    if os.path.commonpath([home, cache]) == cache and home != cache:
        repo = os.path.join(cache, os.path.relpath(home, cache).split(os.sep)[0])  # models--user--name
        if os.path.commonpath([real, repo]) == repo:
            return
    raise OSError(f"{name} is a link leading out of its folder (to {real})")


def weight_shapes(
    folder: str | os.PathLike, revision: str | None = None
) -> dict[str, tuple[int, ...]] | None:
    """Tensor name -> shape of the safetensors weights of a saved model folder (`weight_files`), read from their
    headers: no tensor is loaded, nothing is built. None when the folder holds no safetensors weights; OSError
    (one line) when they cannot be read, or lie outside the folder. A Hub id (`folder` no local folder, at
    `revision`): the headers read by range requests, no weight downloaded; None when the Hub cannot say (no
    safetensors weights, no network: loading the model says why)."""
    if not os.path.isdir(folder):
        from huggingface_hub import get_safetensors_metadata

        try:
            metadata = get_safetensors_metadata(str(folder), revision=revision)
        except Exception:  # not found, no access, no network, not safetensors: the load that follows says why
            return None
        files = metadata.files_metadata.values()
        return {name: tuple(info.shape) for file in files for name, info in file.tensors.items()}
    files = weight_files(folder)
    if files is None:
        return None
    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        if path.endswith(".index.json"):
            continue
        header = safetensors_header(path)
        shapes.update({key: tuple(entry["shape"]) for key, entry in header.items() if key != "__metadata__"})
    return shapes


def pickle_weight_shapes(folder: str | os.PathLike) -> dict[str, tuple[int, ...]] | None:
    """Tensor name -> shape of the pickled weights of a saved model folder (`pickle_weight_files`), for a folder
    whose user opted in to reading pickles: each file loaded by torch's restricted unpickler (`weights_only=True`:
    tensors and plain containers only, no other object built) and memory-mapped, no tensor copied into memory.
    None when the folder holds none; OSError (one line) when a file cannot be read as a dict of tensors (damaged,
    truncated, holding Python objects), or lies outside the folder."""
    import torch

    files = pickle_weight_files(folder)
    if files is None:
        return None
    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        if path.endswith(".index.json"):
            continue
        name = os.path.basename(path)
        try:
            # torch's notes on a pickle's protocol are not said: the one line says what matters
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                state = _load_tensors(torch, path)
        except pickle.UnpicklingError:
            raise OSError(
                f"{name} is not a plain tensor file (it holds Python objects, which are not loaded)"
            ) from None
        except (RuntimeError, EOFError, ValueError) as err:
            raise OSError(f"{name} is damaged or truncated ({first_line(err)})") from None
        if not isinstance(state, dict):
            raise OSError(f"{name} holds a {type(state).__name__}, not a dict of tensors")
        for key, tensor in state.items():
            if not isinstance(key, str) or not isinstance(tensor, torch.Tensor):
                raise OSError(f"{name} holds {key!r}, which is not a named tensor")
            shapes[key] = tuple(tensor.shape)
    return shapes


def _load_tensors(torch, path: str):
    """torch.load with its restricted unpickler, memory-mapped (torch's legacy format, which cannot be, read whole)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as err:
        if "mmap" not in str(err):
            raise
    return torch.load(path, map_location="cpu", weights_only=True)


def hub_pickle_only(spec: str, revision: str | None = None) -> bool:
    """Whether the Hub repo `spec` holds its weights only as torch pickles (pytorch_model.bin or its shards' index)
    and no safetensors weights; False when the Hub cannot say (no network, no access). Offline (HF_HUB_OFFLINE):
    what the Hugging Face cache holds of it."""
    from huggingface_hub import HfApi, try_to_load_from_cache

    def cached(name: str) -> bool:
        return isinstance(try_to_load_from_cache(spec, name, revision=revision), str)

    try:
        if hub_offline():
            return not any(map(cached, WEIGHT_FILES)) and any(map(cached, PICKLE_WEIGHT_FILES))
        api = HfApi()
        exists = [
            api.file_exists(spec, name, revision=revision) for name in WEIGHT_FILES + PICKLE_WEIGHT_FILES
        ]
    except Exception:  # no network, no access, an invalid id: the load that follows says why
        return False
    return not any(exists[:2]) and any(exists[2:])


TRAIN_FIRST = "`kiln-launch pretrain/run.py` leaves runs/encoder-tiny/final"


def looks_local(spec: str) -> bool:
    """Whether a model named on the command line is a path rather than a Hub id (`user/name`, `name`): it starts
    with `.`, `/` or `~`, holds `runs/`, or has more than one `/`."""
    return spec.startswith((".", "/", "~")) or "runs/" in spec or spec.count("/") > 1 or os.path.isabs(spec)


def model_source_problem(spec: str, option: str, revision: str | None = None, hub: bool = True) -> str | None:
    """One line saying why the model folder or Hub id `spec` cannot be read here, found without the network; None
    when it may be. A path (`looks_local`) or a name no Hub id has the form of, with nothing there: no model
    folder. With `hub`, while HF_HUB_OFFLINE is set: a Hub id whose config.json is not in the Hugging Face cache.
    `option`: the command-line option that named `spec`."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if os.path.exists(os.path.expanduser(spec)):
        return None
    try:
        validate_repo_id(spec)
        hub_form = not looks_local(spec)
    except HFValidationError:
        hub_form = False
    if not hub_form:
        return f"no model folder {spec}; train one first ({TRAIN_FIRST}) or give a Hub id (user/name)"
    if hub and hub_offline():
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(spec, "config.json", revision=revision), str):
            return (
                f"{option} {spec} is not in the Hugging Face cache and HF_HUB_OFFLINE is set; unset HF_HUB_OFFLINE "
                f"to download it, or point {option} at a saved model folder"
            )
    return None


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE keeps huggingface_hub off the network."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def carries_code(config: dict) -> bool:
    """Whether the checkpoint names Python files of its own (`auto_map`), which Kiln does not run by default."""
    return bool(config.get("auto_map"))


@contextlib.contextmanager
def weight_file_errors(spec: str, option: str = "") -> Iterator[None]:
    """Loading the weights of the model folder or Hub repo `spec` (transformers' `from_pretrained`): a weight
    file that is damaged, truncated, or a pickle holding more than tensors (which torch's `weights_only` loader
    refuses to run) becomes a one-line ConfigError naming it and the fix, instead of a library traceback.
    `option`: the command-line option that named `spec`, for the message."""
    from safetensors import SafetensorError

    named = f"{option} {spec}" if option else str(spec)
    try:
        yield
    except pickle.UnpicklingError:
        raise ConfigError(
            f"{named}: its pytorch_model.bin is not a plain tensor file (it holds Python objects, which are not "
            "loaded); use a copy saved with save_pretrained (model.safetensors)"
        ) from None
    except SafetensorError as err:
        raise ConfigError(
            f"{named}: its model.safetensors is damaged or truncated ({first_line(err)}); copy or save it again"
        ) from None
    except RuntimeError as err:
        if "PytorchStreamReader" not in str(err):
            raise
        raise ConfigError(
            f"{named}: its pytorch_model.bin is damaged or truncated ({first_line(err)}); copy or save it again"
        ) from None


__all__ = [
    "carries_code",
    "hub_offline",
    "hub_pickle_only",
    "looks_local",
    "model_source_problem",
    "pickle_weight_files",
    "pickle_weight_shapes",
    "read_model_config",
    "safetensors_header",
    "weight_file_errors",
    "weight_files",
    "weight_shapes",
]

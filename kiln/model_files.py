"""A saved model's config.json read as data, never as code; its weight files' faults named in one line.

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
        except Exception as err:  # not found, no access, no network, invalid id: all mean "cannot read it here"
            raise OSError(first_line(err)) from None
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise OSError(f"cannot read {os.path.basename(path)}: {first_line(err)}") from None
    if not isinstance(config, dict):
        raise OSError("config.json does not hold a JSON object")
    return config


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



__all__ = ["carries_code", "read_model_config", "weight_file_errors"]

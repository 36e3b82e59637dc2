"""Hugging Face tokens masked in what Kiln logs, saves or publishes: those in the environment, in the login files
(`hf auth login`), handed to a `HubPusher` (`register_token`), and anything shaped like one.

A module of its own because `kiln.hub` and `kiln.public` both redact and `kiln.hub` imports `kiln.public`: kept in
either, the two would import each other.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_TOKEN_SHAPE = re.compile(
    r"\bhf_[A-Za-z0-9]{20,}\b"
)  # a Hugging Face access token, even one we were never told of
_TOKEN_ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_API_TOKEN")
_registered_tokens: set[str] = set()


def _known_tokens() -> set[str]:
    tokens = set(_registered_tokens)
    tokens.update(os.environ[var].strip() for var in _TOKEN_ENV_VARS if os.environ.get(var))
    # Read the login files directly: `huggingface_hub.get_token()` may refresh an OAuth token online.
    from huggingface_hub import constants  # read at each call: the login files' places may change (tests)

    for path in (constants.HF_TOKEN_PATH, constants.HF_STORED_TOKENS_PATH):
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        if path == constants.HF_TOKEN_PATH:
            tokens.add(text.strip())
        else:
            tokens.update(line.split("=", 1)[1].strip() for line in text.splitlines() if "=" in line)
    return {token for token in tokens if len(token) >= 8}  # a short value would mangle ordinary text


def redact(text: str) -> str:
    """`text` with every Hugging Face token (environment, login, given to a `HubPusher`) replaced by ***."""
    for token in sorted(_known_tokens(), key=len, reverse=True):
        text = text.replace(token, "***")
    return _TOKEN_SHAPE.sub("***", text)


def register_token(token: str) -> None:
    """A token given to Kiln directly (not in the environment or a login file): masked from now on."""
    _registered_tokens.add(token)


__all__ = ["redact", "register_token"]

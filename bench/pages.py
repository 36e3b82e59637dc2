"""The commands a docs page gives: what the recipe timer runs and what the page-order tests run, read one way."""

from __future__ import annotations

import re
from pathlib import Path


def page_blocks(page: Path) -> list[tuple[int, int, list[str]]]:
    """Each bash block of the page: where it starts and ends in the page's text, and its commands, continuation
    lines joined and comments dropped."""
    blocks = []
    for found in re.finditer(r"```bash\n(.*?)```", page.read_text(), flags=re.S):
        commands = []
        for line in re.sub(r"\\\n\s*", " ", found.group(1)).splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(line)
        blocks.append((found.start(), found.end(), commands))
    return blocks


def page_commands(page: Path) -> list[str]:
    """Every command of the page's bash blocks, continuation lines joined and comments dropped."""
    return [command for _, _, commands in page_blocks(page) for command in commands]

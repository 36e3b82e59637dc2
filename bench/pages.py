"""The commands a docs page gives: what the recipe timer runs and what the page-order tests run, read one way."""

from __future__ import annotations

import re
from pathlib import Path


def page_commands(page: Path) -> list[str]:
    """Every command of the page's bash blocks, continuation lines joined and comments dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands

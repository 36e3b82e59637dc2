"""The user-facing text speaks about Kiln and its users, not about how Kiln was built: no issue numbers, working
sessions, who was lent which machine when. The README, the docs site (CHANGELOG.md included), the shipped configs
and the experiment declarations are read; the measurement records (docs/results/runs.jsonl, bench/results/*.json)
keep their machine, load and date and are not scanned here."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from kiln_testing import REPO

# each pattern names a way the making of the project leaks into its pages; upstream references such as
# `transformers#3294` or GLUE's column `#1 String` are not matched
WORKSHOP = {
    "an issue number": r"\bissues? \d+|\(#\d+\)|^#+ .*(?<![\w/])#\d+",
    "a working session": r"(?<![.\w])sessions?\b|\bworking period",
    "a numbered stop": r"\bstop \d+\b",
    "who was lent a machine": r"\b(?:was|were|is|are|be|been|being|got|gets)\s+lent\b|\blent (?:to|again)\b"
    r"|\bgiven a machine\b|\bdevice tool\b|\bno (?:device )?machine (?:was|is) lent",
    "whose test suites ran beside": r"\bother developers\b|\btest suites of other\b|\bother [\w' ]*test suites\b",
}


def user_facing_files():
    files = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").rglob("*.md"))]
    files += sorted((REPO / "configs").rglob("*.yaml")) + sorted((REPO / "experiments").glob("*.yaml"))
    return files + [REPO / "experiments" / "README.md", REPO / "mkdocs.yml"]


def workshop_words(text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in WORKSHOP.items():
            match = re.search(pattern, line, flags=re.I)
            if match:
                found.append(f"{number}: {what}: {match.group(0)!r}")
    return found


def test_user_facing_text_says_nothing_about_how_kiln_was_built():
    files = user_facing_files()
    assert len(files) > 60
    found = [f"{path.relative_to(REPO)}:{hit}" for path in files for hit in workshop_words(path.read_text())]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "line",
    ["# Issue 12 recipe search", "# Issue 26 (item 3): what more compute buys", "measured for issue 14:",
     "(second session, docs/results.md)", "no GPU was lent to the later sessions", "the device tool answered",
     "## Stop 3: the default run", "shared with four other developers running test suites", "## The fix (#31)",
     "while test suites of other sessions ran", "when a GPU is lent again"],
)  # fmt: skip
def test_each_kind_of_workshop_word_is_caught(line):
    assert workshop_words(line), line


@pytest.mark.parametrize(
    "line",
    ["declined upstream in transformers#3294", "| `mrpc` | `#1 String`, `#2 String` |", "(huggingface/tokenizers#1794)",
     "accelerate's grace period", "a lent tokenizer", "stop the run at step 400", "requests.Session"],
)  # fmt: skip
def test_ordinary_words_pass(line):
    assert not workshop_words(line), line


def test_the_documented_login_command_is_the_installed_one():
    """`huggingface-cli` is gone from the huggingface_hub Kiln installs; the pages name `hf auth login`, which runs."""
    stale = [str(path.relative_to(REPO)) for path in user_facing_files() if "huggingface-cli" in path.read_text()]
    assert not stale, stale
    for page in ("README.md", "docs/hub.md"):
        assert "hf auth login" in (REPO / page).read_text(), page
    hf = Path(sys.executable).with_name("hf")
    done = subprocess.run([str(hf), "auth", "login", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "login" in done.stdout.lower(), done.stderr[-2000:]


# a measurement record keeps its machine, load, date and command; who else was working beside it is not a fact
# about the measurement
ANECDOTE = WORKSHOP | {"whose work ran beside": r"\bhelpers?'|\bthe lead\b|\blead's\b"}


def record_strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from record_strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from record_strings(item)


def test_measurement_records_hold_no_anecdotes():
    records = sorted((REPO / "bench/results").glob("*.json")) + sorted((REPO / "docs/results").glob("*.json"))
    lines = [(path, json.loads(path.read_text())) for path in records]
    runs = REPO / "docs/results/runs.jsonl"
    lines += [(runs, json.loads(line)) for line in runs.read_text().splitlines() if line.strip()]
    assert len(lines) > 100
    found = []
    for path, record in lines:
        for text in record_strings(record):
            for what, pattern in ANECDOTE.items():
                match = re.search(pattern, text, flags=re.I)
                if match:
                    found.append(f"{path.relative_to(REPO)}: {what}: {match.group(0)!r} in {text[:80]!r}")
    assert not found, "\n".join(found)

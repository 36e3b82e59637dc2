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
    [
        "# Issue 12 recipe search",
        "# Issue 26 (item 3): what more compute buys",
        "measured for issue 14:",
        "(second session, docs/results.md)",
        "no GPU was lent to the later sessions",
        "the device tool answered",
        "## Stop 3: the default run",
        "shared with four other developers running test suites",
        "## The fix (#31)",
        "while test suites of other sessions ran",
        "when a GPU is lent again",
    ],
)
def test_each_kind_of_workshop_word_is_caught(line):
    assert workshop_words(line), line


@pytest.mark.parametrize(
    "line",
    [
        "declined upstream in transformers#3294",
        "| `mrpc` | `#1 String`, `#2 String` |",
        "(huggingface/tokenizers#1794)",
        "accelerate's grace period",
        "a lent tokenizer",
        "stop the run at step 400",
        "requests.Session",
    ],
)
def test_ordinary_words_pass(line):
    assert not workshop_words(line), line


# what the pages say about a measurement is what was measured, where and how to run it again: not the goals the
# project set itself, the machines it was built on, or the folder beside the repository its data came from. The
# CHANGELOG keeps the history (earlier recipes were judged by their goals) and is not read here.
INTERNAL = {
    "an internal target": r"\btargets?\b[^.;]*\*{0,2}\b(?:met|missed)\b|\(\s*target [\d.,]+|\btarget \d[\d.,]*\s*(?:x|×|s\b|%)"
    r"|\bthe goals? (?:were|was|is|are)\b|\btargets set\b|\*\*(?:met|missed)\b",
    "the machine Kiln was built on": r"\bCI-class\b|\bdevelopment machine\b|\bthe one H100 run\b|\bthis project's\b"
    r"|\b(?:no|lack of) CPU time\b|\bthis 2-core machine\b",
    "a folder beside the repository": r"\.\./shared\b",
    "a number without its record": r"76 → 21 ms|\b17 ms broadcast|broadcasting its files from rank 0 over gloo took"
    r"|\b5-8 s after the signal\b|\b5–8 s after the signal\b",
}


def pages() -> list[Path]:
    """The README and the documentation site's own pages."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def internal_words(text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in INTERNAL.items():
            match = re.search(pattern, line, flags=re.I)
            if match:
                found.append(f"{number}: {what}: {match.group(0)!r}")
    return found


def test_the_pages_say_what_was_measured_not_what_was_aimed_at_or_where():
    files = pages()
    assert len(files) > 25 and all(path.name != "CHANGELOG.md" for path in files)
    found = [f"{path.relative_to(REPO)}:{hit}" for path in files for hit in internal_words(path.read_text())]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        "The CoNLL (≥ +10), UD (≥ 93%) and Multi30k (above scratch) targets are met;",
        "that target is missed",
        "SST-2 ≥ 82 and ≥ +4 (**missed**), Multi30k above scratch (**met**",
        "The goals were SST-2 test ≥ 83.2",
        "(680 to 737 MB; target 1.25x)",
        "19 s on the 1 GB corpus (target 30 s)",
        "at 1 GB (target 1.7x):",
        "yes, by the targets set for them",
        "## Targets: met and missed",
        "Measured on this project's CI-class machine",
        "Measured on the 2-core development machine",
        "the one H100 run (`bench/results/engines-h100.json`)",
        "not varied (no CPU time).",
        "Not run, for lack of CPU time:",
        "## Not measured (no CPU time left)",
        "by default from `../shared/data` beside the repository",
        "optimizer step 76 → 21 ms at 5M parameters",
        "broadcasting its files from rank 0 over gloo took 17 ms",
        "the training process 5-8 s after the signal",
        "5 min 5 s of wall clock on this 2-core machine",
    ],
)
def test_each_kind_of_internal_word_is_caught(line):
    assert internal_words(line), line


@pytest.mark.parametrize(
    "line",
    [
        "| PEFT LoRA with its default targets (only adapters train; merged = adapted) |",
        "### PEFT LoRA: target modules",
        "fills each example to the target length except",
        "source/target jsonl/csv",
        "reads the target sentences",
        "81.46 against 81.35 on dev, below Google's BERT-Tiny (83.2 on test",
        "the shared loop (`kiln/trainer.py`)",
        "the pretraining run's shared corpus",
    ],
)
def test_ordinary_measurement_words_pass(line):
    assert not internal_words(line), line


# the README and the guides speak to someone using Kiln, not to its authors: no test file, CI command or test
# machinery; the results pages (records of how a number was measured), the generated configuration reference and
# the changelog are not read here
AUTHORS_ONLY = {
    "a test file": r"\btests/test_",
    "the CI script": r"\.ci/run\b",
    "the test Hub's server": r"\boffline server\b",
    "the CI command": r"\bthe CI command\b",
}


def guide_pages() -> list[Path]:
    skipped = {"docs/configuration.md", "docs/changelog.md"}
    return [
        path
        for path in pages()
        if str(path.relative_to(REPO)) not in skipped
        and not path.relative_to(REPO).as_posix().startswith("docs/results")
    ]


def authors_words(text: str) -> list[str]:
    return [
        f"{number}: {what}: {match.group(0)!r}"
        for number, line in enumerate(text.splitlines(), 1)
        for what, pattern in AUTHORS_ONLY.items()
        if (match := re.search(pattern, line, flags=re.I))
    ]


def test_the_readme_and_guides_name_no_test_file_ci_command_or_test_server():
    files = guide_pages()
    assert len(files) > 20 and REPO / "README.md" in files and REPO / "docs/results.md" not in files
    found = [f"{path.relative_to(REPO)}:{hit}" for path in files for hit in authors_words(path.read_text())]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        "(tests: `tests/test_faults.py`)",
        "`.ci/run` pins `torch==2.13.0`",
        "against the offline server",
        "# the tests (the CI command; about 20 minutes)",
    ],
)
def test_each_kind_of_authors_word_is_caught(line):
    assert authors_words(line), line


def test_the_documented_login_command_is_the_installed_one():
    """`huggingface-cli` is gone from the huggingface_hub Kiln installs; the pages name `hf auth login`, which runs."""
    stale = [
        str(path.relative_to(REPO)) for path in user_facing_files() if "huggingface-cli" in path.read_text()
    ]
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

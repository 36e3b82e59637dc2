"""No tracked file (code, configs, results, docs) names a folder of the machine it was made on.

A default like an absolute `.../shared/data/sst2` works only where it was written, and a result JSON that records
a temporary folder publishes one machine's layout: defaults are resolved against the repository root
(`../shared/data`), and result writers record repository-relative paths and `$WORK` for their temporary folder.
"""

import re
import subprocess

from kiln_testing import REPO

# an absolute path into one of these folders; the pattern is split so that this file does not match itself.
# The example user (alice's home folder) and an elided home path are illustrations in the docs.
MACHINE_PATH = re.compile(
    "(?<![\\w.$~-])/" + "(?:(?:work|tmp|root)/|" + "home/(?!alice/|\\.\\.\\.)(?=[\\w.-]))"
)
# where no git is at hand (an unpacked source archive): the folders the project's files live in
SOURCE_FOLDERS = [
    ".ci",
    "bench",
    "configs",
    "data",
    "docs",
    "experiments",
    "finetune",
    "kiln",
    "pretrain",
    "tests",
]


def project_files():
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout:
        return [REPO / name for name in listed.stdout.split("\0") if name]
    files = [path for path in REPO.iterdir() if path.is_file()]
    for folder in SOURCE_FOLDERS:
        files += [
            path for path in (REPO / folder).rglob("*") if path.is_file() and "__pycache__" not in path.parts
        ]
    return files


def test_no_tracked_file_holds_an_absolute_machine_path():
    files = project_files()
    assert any(path.name == "finetune.py" and path.parent.name == "bench" for path in files)
    found = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary files (plots, archives) and files deleted in the working tree
        for number, line in enumerate(text.splitlines(), 1):
            if MACHINE_PATH.search(line):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:120]}")
    assert not found, "absolute machine paths (make them relative to the repository):\n" + "\n".join(found)


def test_the_pattern_finds_what_it_should():
    for line in [
        '"/wo' + 'rk/shared/data/sst2"',
        "cd /t" + "mp/kiln-x",
        "File /ro" + "ot/.cache/x",
        "/ho" + "me/u/x",
    ]:
        assert MACHINE_PATH.search(line), line
    examples = ["/ho" + "me/alice/corpus/*.txt", "`/ho" + "me/...` paths", 'private = ["/ho' + 'me/"]']
    for line in [
        "../shared/data/sst2",
        "$WORK/train.tsv",
        "runs/work/x",
        "~/tmp/x",
        "https://x.org/home/y",
        *examples,
    ]:
        assert not MACHINE_PATH.search(line), line

"""The README is a short front door whose links all resolve, and the docs site builds as CI builds it: strictly."""

import re
import shutil
import subprocess
import sys

from kiln_testing import REPO
from markdown.extensions.toc import slugify

README_MAX_LINES = 300
# [text](target) outside code; images too. Web links and mail are not checked here.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def build_site(config, site_dir):
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site_dir)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def heading_anchors(markdown_file):
    """The anchors MkDocs gives a page's headings (Python-Markdown's toc slugify), code blocks left out."""
    text = re.sub(r"```.*?```", "", markdown_file.read_text(), flags=re.S)
    return {slugify(line.lstrip("#").strip(), "-") for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def test_readme_is_a_short_front_door():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move reference text into docs/"
    # the CI command and the install lines stay in it
    text = "\n".join(lines)
    assert "python -m pytest -n 2 -q" in text
    assert 'pip install torch==2.13.0 && pip install -e ".[dev]"' in text


def test_every_relative_link_in_the_readme_resolves():
    text = re.sub(r"```.*?```", "", (REPO / "README.md").read_text(), flags=re.S)
    targets = [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]
    assert targets, "the README links to no page at all"
    broken = []
    for target in targets:
        path, _, anchor = target.partition("#")
        file = REPO / path if path else REPO / "README.md"
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in heading_anchors(file):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, broken


def test_docs_site_builds_strictly(tmp_path):
    result = build_site(REPO / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "results" / "finetune" / "index.html").exists()  # the records stay reachable
    assert (tmp_path / "site" / "throughput.png").exists()


def test_docs_build_fails_on_a_broken_anchor_or_link(tmp_path):
    """The validation settings in mkdocs.yml make strict mode fail on what would otherwise only be logged."""
    for broken in ("[gone](pretraining.md#no-such-section)", "[gone](no-such-page.md)"):
        shutil.copytree(REPO / "docs", tmp_path / "docs", dirs_exist_ok=True)
        shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
        index = tmp_path / "docs" / "index.md"
        index.write_text(index.read_text() + f"\nSee {broken}.\n")
        result = build_site(tmp_path / "mkdocs.yml", tmp_path / "site")
        assert result.returncode != 0, f"strict build passed with {broken}"
        assert broken.split("(")[1].rstrip(")").split("#")[-1] in result.stderr

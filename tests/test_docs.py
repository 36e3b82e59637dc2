"""The README is a short front door whose links all resolve, and the docs site builds as CI builds it: strictly."""

import html as html_lib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kiln_testing import REPO
from markdown.extensions.toc import slugify

README_MAX_LINES = 300
# [text](target) outside code; images too. Web links and mail are not checked here.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def build_site(config, site_dir):
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def heading_anchors(markdown_file):
    """The anchors MkDocs gives a page's headings (Python-Markdown's toc slugify), code blocks left out."""
    text = re.sub(r"```.*?```", "", markdown_file.read_text(), flags=re.S)
    return {
        slugify(line.lstrip("#").strip(), "-") for line in text.splitlines() if re.match(r"#{1,6} ", line)
    }


def test_readme_is_a_short_front_door():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move reference text into docs/"
    # the CI command and the install lines stay in it
    text = "\n".join(lines)
    assert "python -m pytest -n 2 -q" in text
    assert 'pip install -e ".[dev]"' in text  # the one install command (tests/test_page_commands.py)


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


@pytest.mark.slow
def test_docs_build_fails_on_a_broken_anchor_or_link(tmp_path):
    """The validation settings in mkdocs.yml make strict mode fail on what would otherwise only be logged: a broken
    anchor and a broken page link, in one build, are each a WARNING (strict mode fails on any warning)."""
    broken = ("[gone](pretraining.md#no-such-section)", "[gone](no-such-page.md)")
    shutil.copytree(REPO / "docs", tmp_path / "docs", dirs_exist_ok=True)
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copy(REPO / "CHANGELOG.md", tmp_path / "CHANGELOG.md")  # docs/changelog.md includes it
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text() + "".join(f"\nSee {link}.\n" for link in broken))
    result = build_site(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0, f"strict build passed with {broken}"
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING")]
    for link in broken:
        target = link.split("(")[1].rstrip(")")
        assert any(f"link '{target}'" in line for line in warnings), (link, warnings)
        assert target.split("#")[-1] in result.stderr


# ------------------------------------------------------------------------------ the built site, as a reader sees it
SITE_PAGES = [
    "index",
    "performance",
    "results",
    "results/finetune",
    "finetuning",
    "results/compute-curve",
    "installation",
    "troubleshooting",
    "recipes",
    "models",
    "design",
    "getting-started",
    "continue-pretraining",
    "failure-handling",
]
WIDTH = 1280
# after the page's own scripts ran: where each table ends against the content column, and whether the page scrolls
# sideways; written into the DOM, which `chromium --dump-dom` prints
MEASURE = """<script>window.addEventListener("load", () => setTimeout(() => {
  const main = document.querySelector(".md-content__inner") || document.querySelector("[role=main]") || document.body;
  const column = main.getBoundingClientRect().right;
  const hidden = (table) => {  // the widest part of the table a scrolling box around it (or itself) keeps out of view
    let most = 0;
    for (let box = table; box && box !== main.parentElement; box = box.parentElement) {
      if (box === table || getComputedStyle(box).overflowX !== "visible") {
        most = Math.max(most, box.scrollWidth - box.clientWidth);
      }
    }
    return most;
  };
  const tables = [...main.querySelectorAll("table")].map((table) => ({
    right: table.getBoundingClientRect().right, column: column, hidden: hidden(table),
    head: table.rows[0] ? table.rows[0].innerText.slice(0, 80) : ""}));
  // words of inline code (outside tables, whose cells wrap anywhere) split across two lines, e.g. at a hyphen
  const broken = [];
  for (const code of main.querySelectorAll("code")) {
    if (code.closest("pre") || code.closest("table")) continue;
    const text = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    for (let node = text.nextNode(); node; node = text.nextNode()) {
      for (const word of node.data.matchAll(/\\S+/g)) {
        const range = document.createRange();
        range.setStart(node, word.index);
        range.setEnd(node, word.index + word[0].length);
        const lines = new Set([...range.getClientRects()].filter((r) => r.width > 0).map((r) => Math.round(r.top)));
        if (lines.size > 1) broken.push(word[0]);
      }
    }
  }
  // code blocks whose lines run past their box (shown only by scrolling sideways)
  const cut = [...main.querySelectorAll("pre > code")].filter((code) => code.scrollWidth > code.clientWidth + 1)
    .map((code) => code.innerText.slice(0, 80));
  const images = [...main.querySelectorAll("img")].map((image) => ({
    src: image.getAttribute("src"), shown: image.getBoundingClientRect().width, natural: image.naturalWidth}));
  const out = document.createElement("pre");
  out.id = "kiln-measure";
  out.textContent = JSON.stringify({width: window.innerWidth, page: document.documentElement.scrollWidth, tables,
    images, broken, cut});
  document.body.appendChild(out);
}, 300));</script>"""


def chromium():
    """The headless browser (Debian's `chromium`; CI installs it). Missing on a local run: skipped with the reason;
    under CI (`CI=true`): a failure, so a green build means the pages were looked at."""
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if not found:
        message = "no chromium on PATH: `apt-get install -y chromium` (Debian) to screenshot the docs site"
        if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def browse(browser, tmp_path, page_html, *args):
    profile = tmp_path / "chromium-profile"
    return subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--window-size={WIDTH},1600",
            *args,
            page_html.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def measure(browser, tmp_path, site, page, html: Path | None = None):
    """What MEASURE reports of a built page (or of `html`, a variant of it beside it)."""
    html = html or (site / page / "index.html" if page != "index" else site / "index.html")
    text = html.read_text()
    assert "</body>" in text, html
    measured = html.with_name("measured.html")
    measured.write_text(text.replace("</body>", MEASURE + "</body>"))
    done = browse(browser, tmp_path, measured, "--virtual-time-budget=5000", "--dump-dom")
    found = re.search(r'<pre id="kiln-measure">(.*?)</pre>', done.stdout, flags=re.S)
    assert found, f"{page}: no measurement in the dumped DOM\n{done.stderr[-2000:]}"
    return json.loads(html_lib.unescape(found.group(1)))


SMALLEST_FIGURE_PT = 7
"""The smallest text Kiln's figures draw (matplotlib `fontsize=`, in points; test_no_figure_text_is_smaller holds
the plotting code to it)."""
READABLE_PX = 9  # the smallest text a figure may show on a page at a 1280 px window, in CSS pixels


def png_dpi(png: Path) -> float:
    """The resolution a PNG was saved at (its pHYs chunk: pixels per metre); matplotlib writes it from `dpi=`."""
    data = png.read_bytes()
    at = data.find(b"pHYs")
    assert at > 0, f"{png}: no pHYs chunk, so its dpi is unknown"
    per_metre = int.from_bytes(data[at + 4 : at + 8], "big")
    return per_metre * 0.0254


def unreadable_figures(report, page_html: Path) -> list[str]:
    """Figures shown so small that their smallest text falls under READABLE_PX."""
    small = []
    for image in report["images"]:
        png = (page_html.parent / image["src"]).resolve()
        if png.suffix != ".png" or not image["natural"]:
            continue
        text_px = SMALLEST_FIGURE_PT / 72 * png_dpi(png) * image["shown"] / image["natural"]
        if text_px < READABLE_PX:
            small.append(
                f"{image['src']}: shown {image['shown']:.0f} of {image['natural']} px, text {text_px:.1f} px"
            )
    return small


def overflowing(report) -> list[str]:
    wide = (
        [f"page scrolls sideways: {report['page']} px at a {report['width']} px window"]
        if (report["page"] > report["width"])
        else []
    )
    for table in report["tables"]:
        if table["right"] > table["column"] + 1 or table["hidden"] > 1:
            wide.append(
                f"table {table['head']!r}: ends at {table['right']:.0f} px, column at {table['column']:.0f} px, "
                f"{table['hidden']} px behind sideways scrolling"
            )
    wide += [f"inline code split inside a word: {word!r}" for word in report.get("broken", [])]
    wide += [f"code block cut at its right edge: {start!r}" for start in report.get("cut", [])]
    return wide


@pytest.mark.slow
def test_docs_site_builds_strictly_and_key_pages_show_every_table_whole_at_1280_px(tmp_path):
    """The site builds strictly, the records and the changelog in it. The built site at a 1280 px window in
    headless Chromium: no table of the key pages runs past the content column or needs sideways scrolling, no
    word of inline code (an option, a path) is split across two lines, no code block is cut at its right edge, no
    figure is shown so small that its smallest text is under READABLE_PX, and each page screenshots (KILN_DOCS_SCREENSHOTS=folder keeps them). One build serves both (the browser part is skipped
    where chromium is missing, after the build is checked)."""
    site = tmp_path / "site"
    result = build_site(REPO / "mkdocs.yml", site)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (site / "index.html").exists()
    assert (site / "results" / "finetune" / "index.html").exists()  # the records stay reachable
    assert (site / "throughput.png").exists()
    changelog = (site / "changelog" / "index.html").read_text()  # CHANGELOG.md, in the site's nav
    assert "<h1" in changelog and "Changelog" in changelog and "--8&lt;--" not in changelog

    browser = chromium()
    shots = Path(os.environ.get("KILN_DOCS_SCREENSHOTS") or tmp_path / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    problems = {}
    for page in SITE_PAGES:
        report = measure(browser, tmp_path, site, page)
        assert report["width"] == WIDTH, report
        if page in ("performance", "results", "results/finetune"):
            assert len(report["tables"]) >= 1, page
        problems.update({f"{page}: {p}": None for p in overflowing(report)})
        png = shots / f"{page.replace('/', '-')}.png"
        html = site / page / "index.html" if page != "index" else site / "index.html"
        problems.update({f"{page}: {p}": None for p in unreadable_figures(report, html)})
        if page == "recipes":  # without the hook's whole-word spans, its options break at their hyphens
            bare = html.with_name("bare.html")
            bare.write_text(re.sub(r'<span class="kiln-word">(.*?)</span>', r"\1", html.read_text()))
            assert measure(browser, tmp_path, site, page, bare)["broken"], "the split-word check sees nothing"
        if page == "results":  # the BLiMP figures among what is measured
            assert {"blimp-curve.png", "blimp-phenomena.png"} <= {
                Path(i["src"]).name for i in report["images"]
            }
        done = browse(browser, tmp_path, html, f"--screenshot={png}")
        assert png.is_file(), done.stderr[-2000:]
        header = png.read_bytes()[:24]  # PNG signature, then IHDR: width, height
        assert header[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(header[16:20], "big") == WIDTH, page
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_the_width_check_sees_a_table_wider_than_the_page(tmp_path):
    """Under MkDocs' built-in readthedocs theme (a narrow column, cells that do not wrap) the records table hides
    columns behind sideways scrolling: the check above catches a theme that hides them."""
    browser = chromium()
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    shutil.copy(REPO / "CHANGELOG.md", tmp_path / "CHANGELOG.md")
    config = (REPO / "mkdocs.yml").read_text()
    theme = re.search(r"^theme:\n(?:  .*\n)+", config, flags=re.M)
    assert theme, config
    (tmp_path / "mkdocs.yml").write_text(config.replace(theme.group(0), "theme:\n  name: readthedocs\n"))
    site = tmp_path / "site"
    result = build_site(tmp_path / "mkdocs.yml", site)
    assert result.returncode == 0, result.stderr[-3000:]
    assert overflowing(measure(browser, tmp_path, site, "results/finetune"))


def test_every_page_has_a_title_and_an_introduction():
    """Each page of the site opens with its `# title` and a paragraph saying what it holds, not a bare table or code."""
    missing = []
    for page in sorted((REPO / "docs").rglob("*.md")):
        text = page.read_text()
        if page.name == "changelog.md":  # the repository's CHANGELOG.md, included
            assert text.strip() == '--8<-- "CHANGELOG.md"'
            text = (REPO / "CHANGELOG.md").read_text()
        lines = [line for line in text.splitlines() if line.strip()]
        if not lines[0].startswith("# "):
            missing.append(f"{page.relative_to(REPO)}: no title")
        elif re.match(r"(```|\||#|!\[|<|[-*] )", lines[1]):
            missing.append(f"{page.relative_to(REPO)}: no introduction before {lines[1][:40]!r}")
    assert not missing, missing


def test_lists_render_as_lists():
    """Python-Markdown needs a blank line between a paragraph and a list (GitHub does not): a list glued to its
    paragraph shows on the site as one run-on line of dashes."""
    glued = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        lines, code = page.read_text().splitlines(), False
        for number, line in enumerate(lines[1:], 2):
            if line.startswith("```"):
                code = not code
            previous = lines[number - 2]
            if (
                not code
                and re.match(r"([-*]|\d+\.) ", line)
                and previous.strip()
                and not re.match(r"\s*([-*]|\d+\.) |  |\|", previous)
            ):
                glued.append(f"{page.relative_to(REPO)}:{number}")
    assert not glued, glued


def test_single_runs_show_no_spread():
    """A group of one seed has no standard deviation to show: the generated pages print its value alone."""
    for page in ("results/finetune.md", "results/compute-curve.md", "results/sst2-labels.md"):
        text = (REPO / "docs" / page).read_text()
        assert "± 0.00 (n=1" not in text and not re.search(r"± 0\.00 \|", text), page
    curve = (REPO / "docs/results/compute-curve.md").read_text()
    assert "![" in curve and "(compute-curve.png)" in curve  # the page shows its plot


def test_the_installation_page_states_what_pyproject_declares():
    """Python version and extras on docs/installation.md are pyproject.toml's: a dependency added to an extra, or a
    new minimum Python, fails here until the page says so."""
    pyproject = (
        REPO / "pyproject.toml"
    ).read_text()  # read as text: tomllib is Python 3.11+, Kiln supports 3.10
    requires = re.search(r'^requires-python = "([^"]+)"', pyproject, flags=re.M).group(1)
    extras = {
        "(none)": re.findall(r'"([^"]+)"', pyproject.split("\ndependencies = [", 1)[1].split("]", 1)[0])
    }
    section = pyproject.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    # each extra's list to its closing bracket at the end of its line: a requirement's own extras
    # (`mkdocstrings[python]`) hold a `]` too
    extras.update(
        {
            name: re.findall(r'"([^"]+)"', value)
            for name, value in re.findall(r"^(\w+) = \[(.*)\]\s*$", section, flags=re.M)
        }
    )
    assert "dev" in extras, extras
    text = (REPO / "docs/installation.md").read_text()
    assert (
        f"Python {requires.removeprefix('>=')} or newer" in text
        and f'`requires-python = "{requires}"`' in text
    )
    rows = {
        line.split("|")[1].strip(): line.split("|")[2] for line in text.splitlines() if line.startswith("| ")
    }
    for extra, requirements in extras.items():
        named = {name.strip() for name in rows[f"`{extra}`" if extra != "(none)" else extra].split(",")}
        wanted = {re.split(r"[<>=!~\[ ]", requirement)[0] for requirement in requirements}
        assert named == wanted, (extra, sorted(named ^ wanted))


def test_the_navigation_is_grouped_and_the_home_page_opens_with_code():
    """Four sections instead of one flat list (results and benchmark reports in their own), every page in one of
    them, and the home page showing the commands before the table of pages, as transformers' and accelerate's do."""
    text = (REPO / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:") :]
    sections = re.findall(r"^  - ([^:]+):\s*$", nav, flags=re.M)
    assert sections == ["Get started", "Guides", "Reference", "Results"], sections
    assert not re.search(r"^  - [^:]+: \S+\.md$", nav, flags=re.M)  # no page outside a section
    results = nav.split("  - Results:", 1)[1]
    for page in ("results.md", "performance.md", "results/finetune.md"):
        assert f": {page}\n" in results, page
    assert ": recipes.md\n" in nav.split("  - Guides:", 1)[0]
    home = (REPO / "docs/index.md").read_text()
    assert home.index("```bash\n") < home.index("| page |") and "```python\n" in home


def test_no_figure_text_is_smaller_than_the_readability_check_assumes():
    """The plotting code of bench/ and experiments/ draws no text under SMALLEST_FIGURE_PT, which the 1280 px check
    of figures takes as the smallest text in each PNG."""
    sizes = {}
    for source in [*sorted((REPO / "bench").glob("*.py")), *sorted((REPO / "experiments").glob("*.py"))]:
        for size in re.findall(r"fontsize=(\d+(?:\.\d+)?)", source.read_text()):
            sizes.setdefault(source.name, []).append(float(size))
    assert sizes, "no fontsize= found: the check reads the plotting code"
    small = {name: found for name, found in sizes.items() if min(found) < SMALLEST_FIGURE_PT}
    assert not small, small


def test_inline_code_keeps_each_word_whole_outside_tables_and_code_blocks():
    """The site's hook puts each word of inline code that a line could break inside (a hyphen, a slash, a dot) in
    a nowrap span, leaving spaces as break points, escaped text intact, and code blocks and tables as they were."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kiln_docs_hook", REPO / "docs/_hooks/whole_words.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = (
        "<p>Run <code>kiln-launch pretrain/run.py --training.max_steps 20</code> or <code>train</code>; "
        "<code>runs/&lt;run&gt;/final</code></p>"
        "<pre><span></span><code>--keep.as-is</code></pre>"
        "<table><tr><td><code>--in.a-cell</code></td></tr></table>"
    )
    word = '<span class="kiln-word">{}</span>'.format
    assert hook.keep_words_whole(page) == (
        f"<p>Run <code>{word('kiln-launch')} {word('pretrain/run.py')} {word('--training.max_steps')} 20</code> "
        f"or <code>train</code>; <code>{word('runs/&lt;run&gt;/final')}</code></p>"
        "<pre><span></span><code>--keep.as-is</code></pre>"
        "<table><tr><td><code>--in.a-cell</code></td></tr></table>"
    )
    assert hook.on_page_content(page, page=None, config=None, files=None) == hook.keep_words_whole(page)

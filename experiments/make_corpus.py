"""Build the pretraining corpus of the Kiln experiments from its public sources, or from local copies of them.

    python experiments/make_corpus.py [--out runs/corpus]      # downloads the sources (35 MB) into runs/corpus-sources
    python experiments/make_corpus.py --shared FOLDER          # reads local copies laid out as the download is

The sources are the 36 files `experiments/corpus_sources.json` lists, each a git blob of its public GitHub
repository (the books from GITenberg, the TinyStories excerpts, WikiText-2 valid and test, Multi30k's German side),
fetched by blob id through GitHub's API (set GITHUB_TOKEN for more than 60 requests an hour) and checked by its blob
id and the sha256 of its text before anything is built: the same bytes everywhere, so the corpus is the same.
A file already downloaded and unchanged is not fetched again.

Writes plain text files the runner reads with `data.document_separator: blank_line` (one paragraph per line,
a blank line between documents), one folder per source, so a config picks its mix with globs:

  gutenberg/<book>.txt   28 public-domain books; Project Gutenberg header, footer and credit lines removed,
                         hard-wrapped lines joined, split into documents of about 1,500 words at paragraph ends
  wikitext/<split>.txt   WikiText-2 raw valid + test (CC BY-SA); one article per document, headings dropped,
                         the ` @-@ `, ` @,@ `, ` @.@ ` escapes undone
  tinystories/*.txt      the TinyStories training excerpts (CDLA-Sharing-1.0); one story per document
  tinystories-valid/valid.txt  the TinyStories validation excerpt (one paragraph per document), for the decoder
  multi30k-de/train.txt  the German side of Multi30k's training pairs, one sentence per document (research and
                         educational use, so it stays in runs/): the target-side text a decoder for en->de is
                         pretrained on (configs/experiments/decoder-30min-de.yaml); the same sentences the
                         translation model later trains on, so pretraining on them adds compute, not data
  multi30k-de-valid/val.txt    the German side of Multi30k's validation pairs, for that decoder's perplexity

Takes a few seconds after the download; the 30-minute experiment counts it (experiments/recipe.yaml runs it first).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC_WORDS = 1500
SOURCES = REPO / "experiments" / "corpus_sources.json"
GITHUB_API = "https://api.github.com"  # KILN_GITHUB_API replaces it (a mirror; the tests' local server)
TIMEOUT_S = 60  # per request: a stalled connection ends in one line, not a hang


class SourceError(Exception):
    """A source that cannot be downloaded or is not the file the list names: one line, exit status 1."""


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def fetch_sources(folder: Path, say=print, listing: Path = SOURCES) -> Path:
    """Every file of `listing` (corpus_sources.json) under `folder`, downloaded unless there and unchanged, each
    checked by its git blob id and the sha256 of its text; returns `folder`, laid out as the local copies are."""
    import urllib.error
    import urllib.request

    from kiln.safe_write import make_folder, write_file

    api = os.environ.get("KILN_GITHUB_API", GITHUB_API).rstrip("/")
    headers = {"Accept": "application/vnd.github.raw", "User-Agent": "kiln-make-corpus"}
    if os.environ.get("GITHUB_TOKEN"):
        headers["Authorization"] = f"Bearer {os.environ['GITHUB_TOKEN']}"
    entries = json.loads(Path(listing).read_text())["files"]
    fetched = 0
    for number, entry in enumerate(entries, 1):
        target = folder / entry["file"]
        if target.is_file() and not target.is_symlink() and _text_sha256(target) == entry["sha256"]:
            continue
        url = f"{api}/repos/{entry['repo']}/git/blobs/{entry['blob']}"
        try:
            with urllib.request.urlopen(
                urllib.request.Request(url, headers=headers), timeout=TIMEOUT_S
            ) as answer:
                data = answer.read()
        except (urllib.error.URLError, TimeoutError, OSError) as err:
            reason = getattr(err, "reason", None) or err
            raise SourceError(
                f"cannot download {entry['file']} ({entry['repo']} {entry['path']}) from {url}: {reason}; "
                "check the network (GITHUB_TOKEN for GitHub's rate limit), or pass --shared FOLDER with local copies"
            ) from None
        if git_blob_id(data) != entry["blob"]:
            raise SourceError(
                f"{url} answered bytes that are not blob {entry['blob']} ({entry['file']}); nothing was built from "
                "them: try again, or pass --shared FOLDER with local copies"
            )
        text = gzip.decompress(data) if entry.get("gzipped_at_source") else data
        if hashlib.sha256(text).hexdigest() != entry["sha256"]:
            raise SourceError(
                f"{entry['file']}: its text is not the one experiments/corpus_sources.json names"
            )
        make_folder(target.parent)
        write_file(target, gzip.compress(text, mtime=0) if target.suffix == ".gz" else text)
        fetched += 1
        say(f"make_corpus: downloaded {entry['file']} [{number}/{len(entries)}]")
    say(f"make_corpus: {len(entries)} sources in {folder} ({fetched} downloaded, every one checked)")
    return folder


def _text_sha256(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha256(gzip.decompress(data) if path.suffix == ".gz" else data).hexdigest()


def book_paragraphs(raw: str) -> list[str]:
    text = raw.replace("\r\n", "\n").lstrip("\ufeff")
    start = re.search(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$", text, flags=re.M)
    end = re.search(r"^\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG.*$", text, flags=re.M)
    text = text[start.end() if start else 0 : end.start() if end else len(text)]
    credits = ("gutenberg", "produced by", "html version by", "transcriber")
    text = "\n".join(line for line in text.split("\n") if not any(c in line.lower() for c in credits))
    paragraphs = []
    for block in re.split(r"\n\s*\n", text):
        block = re.sub(r"\[Illustration[^\]]*\]", "", block).replace("_", "")
        block = " ".join(block.split())
        if len(block.split()) >= 4:  # headings, chapter numbers, ornaments
            paragraphs.append(block)
    return paragraphs


def chunk(paragraphs: list[str], words: int = DOC_WORDS) -> list[list[str]]:
    documents, current, count = [], [], 0
    for paragraph in paragraphs:
        current.append(paragraph)
        count += len(paragraph.split())
        if count >= words:
            documents.append(current)
            current, count = [], 0
    if current:
        documents.append(current)
    return documents


def write_documents(path: Path, documents: list[list[str]]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join("\n".join(doc) for doc in documents) + "\n", encoding="utf-8")
    return sum(len(p.split()) for doc in documents for p in doc)


_TOP = re.compile(r"^ = [^=].*[^=] = $")
_SUB = re.compile(r"^ (= )+[^=].*[^=] (= )+$")


def wikitext_articles(raw: str) -> list[list[str]]:
    articles, current = [], []
    for line in raw.split("\n"):
        if _TOP.match(line):
            if current:
                articles.append(current)
            current = []
            continue
        if not line.strip() or _SUB.match(line):
            continue
        line = line.replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", ".")
        current.append(" ".join(line.split()))
    if current:
        articles.append(current)
    return articles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--shared",
        default=None,
        help="a folder of local copies of the sources, laid out as corpus_sources.json's `file` names them "
        "(default: download them into --sources)",
    )
    parser.add_argument("--sources", default=str(REPO / "runs" / "corpus-sources"), help="where downloads go")
    parser.add_argument("--out", default=str(REPO / "runs" / "corpus"))
    args = parser.parse_args()
    out = Path(args.out)
    if args.shared is not None:
        shared = Path(args.shared)
        if not shared.is_dir():
            sys.exit(f"error: --shared {shared} is not a folder; leave it out to download the sources")
    else:
        sys.path.insert(0, str(REPO))  # kiln's link-safe writes, from a checkout
        try:
            shared = fetch_sources(Path(args.sources), say=lambda line: print(line, file=sys.stderr))
        except SourceError as err:
            sys.exit(f"error: {err}")

    words = {}
    for path in sorted((shared / "gutenberg").glob("pg*.txt.gz")):
        with gzip.open(path, "rt", encoding="utf-8-sig") as f:
            docs = chunk(book_paragraphs(f.read()))
        name = path.name.removesuffix(".txt.gz")
        words["gutenberg"] = words.get("gutenberg", 0) + write_documents(
            out / "gutenberg" / f"{name}.txt", docs
        )

    for split in ("valid", "test"):
        raw = (shared / "wikitext-2-raw" / f"wiki.{split}.raw").read_text(encoding="utf-8")
        words["wikitext"] = words.get("wikitext", 0) + write_documents(
            out / "wikitext" / f"{split}.txt", wikitext_articles(raw)
        )

    ts = shared / "tinystories"
    with gzip.open(ts / "tinystories_sample3000.json.gz", "rt", encoding="utf-8") as f:
        stories = [
            s if isinstance(s, str) else s.get("text", s.get("story", "")) for s in json.load(f)["texts"]
        ]
    with gzip.open(ts / "tinystoriesV2_gpt4_train_head10k.txt.gz", "rt", encoding="utf-8") as f:
        stories += f.read().split("<|endoftext|>")
    with gzip.open(ts / "tinystories_train_first1000.one_per_line.txt.gz", "rt", encoding="utf-8") as f:
        stories += f.read().split("\n")
    docs = []
    for story in stories:
        paragraphs = [" ".join(p.split()) for p in story.split("\n") if p.strip()]
        if paragraphs:
            docs.append(paragraphs)
    words["tinystories"] = write_documents(out / "tinystories" / "train.txt", docs)
    with gzip.open(ts / "tinystories_valid_head.txt.gz", "rt", encoding="utf-8") as f:
        valid = [[" ".join(p.split())] for p in re.split(r"\n\s*\n", f.read()) if p.strip()]
    words["tinystories-valid"] = write_documents(out / "tinystories-valid" / "valid.txt", valid)
    for split, folder in (("train", "multi30k-de"), ("val", "multi30k-de-valid")):
        lines = (shared / "multi30k" / f"{split}.de").read_text(encoding="utf-8").split("\n")
        sentences = [[" ".join(line.split())] for line in lines if line.strip()]
        words[folder] = write_documents(out / folder / f"{split}.txt", sentences)
    print(json.dumps({"out": str(out), "words": words}))


if __name__ == "__main__":
    main()

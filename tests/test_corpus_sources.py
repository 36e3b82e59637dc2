"""`python experiments/make_corpus.py` rebuilds the experiments' corpus from its public sources (issue: results
reproducible from the repository and the network): each source is a git blob fetched by its id through GitHub's
API and checked by that id and the sha256 of its text before anything is built. Here a local server speaks that
API for a miniature of the sources, so nothing leaves the machine; the shipped list itself is checked for what it
must hold (the project's local copies, where present, are exactly its files)."""

import gzip
import hashlib
import importlib.util
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kiln_testing import REPO


def make_corpus():
    spec = importlib.util.spec_from_file_location("kiln_make_corpus", REPO / "experiments/make_corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


BOOK = (
    "The Project Gutenberg eBook of X\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\n\nIt was a dark\n"
    "and stormy night.\n\nThe end came.\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\n"
)
TEXTS = {  # file (as laid out locally) -> its text; the multi30k file is a .gz blob at its source
    "gutenberg/pg1_x.txt.gz": BOOK,
    "wikitext-2-raw/wiki.valid.raw": " = Title = \n\n A well @-@ known fact . \n\n",
    "wikitext-2-raw/wiki.test.raw": " = Other = \n\n Another fact . \n\n",
    "tinystories/tinystories_sample3000.json.gz": json.dumps({"texts": ["Tom ran.\nHe fell."]}),
    "tinystories/tinystoriesV2_gpt4_train_head10k.txt.gz": "Ann sang.<|endoftext|>Bob hid.",
    "tinystories/tinystories_train_first1000.one_per_line.txt.gz": "Cat sat.\nDog dug.",
    "tinystories/tinystories_valid_head.txt.gz": "Sun rose.\n\nMoon set.",
    "multi30k/train.de": "Ein Hund läuft.\nZwei Katzen.\n",
    "multi30k/val.de": "Ein Mann.\n",
}


class FakeGitHub:
    """GitHub's blob API (GET /repos/OWNER/NAME/git/blobs/SHA, raw) on a loopback port, for the miniature."""

    def __init__(self, blobs: dict[str, bytes]):
        self.blobs, self.requests, self.corrupt, self.stall_s = blobs, [], False, 0.0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                fake.requests.append(self.path)
                time.sleep(fake.stall_s)
                data = fake.blobs.get(self.path.rsplit("/", 1)[-1])
                if data is None or "/git/blobs/" not in self.path:
                    self.send_error(404)
                    return
                data = data[:-1] + b"!" if fake.corrupt else data
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.handle_error = lambda request, address: (
            None
        )  # a client that gave up (the stall): not news
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def github(tmp_path, monkeypatch):
    entries, blobs = [], {}
    for file, text in TEXTS.items():
        raw = text.encode()
        at_source = gzip.compress(raw, mtime=0) if file.startswith("multi30k/") else raw
        blobs[blob_id(at_source)] = at_source
        entries.append(
            {
                "file": file,
                "repo": "someone/source",
                "path": file,
                "blob": blob_id(at_source),
                "sha256": hashlib.sha256(raw).hexdigest(),
                **({"gzipped_at_source": True} if file.startswith("multi30k/") else {}),
            }
        )
    listing = tmp_path / "sources.json"
    listing.write_text(json.dumps({"files": entries}))
    fake = FakeGitHub(blobs)
    monkeypatch.setenv("KILN_GITHUB_API", fake.url)
    yield fake, listing
    fake.server.shutdown()


def test_the_sources_are_fetched_by_blob_checked_and_laid_out_as_local_copies(github, tmp_path):
    fake, listing = github
    module = make_corpus()
    said = []
    folder = module.fetch_sources(tmp_path / "sources", say=said.append, listing=listing)
    for file, text in TEXTS.items():
        data = (folder / file).read_bytes()
        assert (gzip.decompress(data) if file.endswith(".gz") else data) == text.encode(), file
    assert len(fake.requests) == len(TEXTS) and all(
        "/repos/someone/source/git/blobs/" in r for r in fake.requests
    )
    assert said[-1].endswith(f"({len(TEXTS)} downloaded, every one checked)")

    # again: everything is there and unchanged, nothing is fetched; a file changed since is fetched again
    module.fetch_sources(folder, say=said.append, listing=listing)
    assert len(fake.requests) == len(TEXTS)
    (folder / "multi30k/val.de").write_text("Changed.\n")
    module.fetch_sources(folder, say=said.append, listing=listing)
    assert (
        len(fake.requests) == len(TEXTS) + 1
        and (folder / "multi30k/val.de").read_text() == TEXTS["multi30k/val.de"]
    )

    # the corpus built from the download is the one built from local copies of the same files
    local = tmp_path / "local"
    for file, text in TEXTS.items():
        (local / file).parent.mkdir(parents=True, exist_ok=True)
        if file.endswith(".gz"):
            (local / file).write_bytes(gzip.compress(text.encode()))
        else:
            (local / file).write_text(text)
    import subprocess

    built = {}
    for name, shared in (("downloaded", folder), ("local", local)):
        subprocess.run(
            [
                sys.executable,
                str(REPO / "experiments/make_corpus.py"),
                "--shared",
                shared,
                "--out",
                tmp_path / name,
            ],
            check=True,
            capture_output=True,
        )
        built[name] = {
            p.relative_to(tmp_path / name): p.read_bytes() for p in (tmp_path / name).rglob("*.txt")
        }
    assert built["downloaded"] == built["local"] and len(built["local"]) == 7


def test_a_wrong_or_stalled_answer_is_one_line_and_writes_nothing(github, tmp_path, monkeypatch):
    fake, listing = github
    module = make_corpus()
    fake.corrupt = True
    with pytest.raises(
        module.SourceError, match=r"answered bytes that are not blob [0-9a-f]{40} \(gutenberg/pg1_x"
    ):
        module.fetch_sources(tmp_path / "sources", say=lambda line: None, listing=listing)
    assert not (tmp_path / "sources" / "gutenberg" / "pg1_x.txt.gz").exists()

    fake.corrupt, fake.stall_s = False, 3.0
    monkeypatch.setattr(module, "TIMEOUT_S", 0.5)
    started = time.monotonic()
    with pytest.raises(module.SourceError, match=r"cannot download gutenberg/pg1_x.txt.gz .*--shared FOLDER"):
        module.fetch_sources(tmp_path / "sources", say=lambda line: None, listing=listing)
    assert time.monotonic() - started < 3.0


def test_the_shipped_list_names_every_file_the_corpus_reads_and_matches_local_copies():
    """experiments/corpus_sources.json: one entry per file make_corpus reads, each with a blob id and a sha256;
    where this checkout has the project's local copies, each one's text has that sha256 (and, unless gzipped at its
    source, that blob id), so the download and the copies build the same corpus."""
    entries = json.loads((REPO / "experiments/corpus_sources.json").read_text())["files"]
    files = {entry["file"] for entry in entries}
    assert len(files) == len(entries) == 36
    assert {f.split("/")[0] for f in files} == {"gutenberg", "wikitext-2-raw", "tinystories", "multi30k"}
    assert sum(f.startswith("gutenberg/pg") and f.endswith(".txt.gz") for f in files) == 28
    for entry in entries:
        assert len(entry["blob"]) == 40 and len(entry["sha256"]) == 64 and "/" in entry["repo"], entry
    shared = REPO.parent / "shared" / "data"
    if not shared.is_dir():
        return  # a checkout without the project's copies: the list's shape is what can be checked
    for entry in entries:
        data = (shared / entry["file"]).read_bytes()
        text = gzip.decompress(data) if entry["file"].endswith(".gz") else data
        assert hashlib.sha256(text).hexdigest() == entry["sha256"], entry["file"]
        if not entry.get("gzipped_at_source"):
            assert blob_id(text) == entry["blob"], entry["file"]

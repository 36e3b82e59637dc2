"""Rebuild the fine-tuning samples in data/finetune/ from the offline copies of their sources.

    python data/finetune/make_samples.py [--shared ../shared/data] [--out data/finetune]

Deterministic: the same sources give byte-identical files (fixed seed, gzip without timestamp).
See SOURCE.md beside this file for what each sample is and its license.
"""

import argparse
import csv
import gzip
import io
import json
import random
import re
from pathlib import Path

# --- authorship attribution (sentence classification) from public-domain Project Gutenberg books ---------

AUTHORS = {  # label -> two novels each, so the task is the author's style rather than one book's plot
    "Jane Austen": ["pg1342_pride_and_prejudice", "pg158_emma"],
    "Charles Dickens": ["pg98_a_tale_of_two_cities", "pg1400_great_expectations"],
    "Mark Twain": ["pg74_tom_sawyer", "pg76_huckleberry_finn"],
    "H. G. Wells": ["pg35_the_time_machine", "pg36_the_war_of_the_worlds"],
}
SENTENCES_PER_BOOK = {"train": 250, "validation": 38, "test": 38}  # 2,000 / 304 / 304 rows in all
MIN_WORDS, MAX_WORDS = 6, 50
SEED = 0

# the books differ in typesetting (curly vs straight quotes, em dash vs "--", _italics_); normalize it so the
# label cannot be read off the typography
TYPOGRAPHY = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u00a0": " ", "_": ""})
ABBREVIATIONS = ("Mr.", "Mrs.", "Dr.", "St.", "Mme.", "Messrs.", "Col.", "Capt.", "Lt.", "No.")
SENTENCE_BREAK = re.compile(r"(?<=[.!?])(?:[\"')]*)\s+(?=[\"'(]*[A-Z])")


def read_book_body(path: Path) -> str:
    with gzip.open(path, "rt", encoding="utf-8-sig") as f:
        text = f.read()
    start = re.search(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$", text, flags=re.M)
    end = re.search(r"^\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG.*$", text, flags=re.M)
    return text[start.end() if start else 0 : end.start() if end else len(text)]


def paragraph_sentences(paragraph: str) -> list[str]:
    pieces, sentences = SENTENCE_BREAK.split(paragraph), []
    for piece in pieces:
        if sentences and sentences[-1].endswith(ABBREVIATIONS):
            sentences[-1] += " " + piece
        else:
            sentences.append(piece)
    return sentences


def book_sentences(path: Path) -> list[str]:
    text = read_book_body(path).translate(TYPOGRAPHY).replace("\u2014", "--").replace("\u2026", "...")
    sentences = []
    for paragraph in re.split(r"\n\s*\n", text):
        paragraph = " ".join(paragraph.split())
        if not paragraph or paragraph.isupper() or paragraph.startswith(("CHAPTER", "Chapter")):
            continue  # headings and chapter titles
        for sentence in paragraph_sentences(paragraph):
            whole = sentence[-1] in ".!?\"'" and sentence.count('"') % 2 == 0  # not cut inside a quotation
            if whole and MIN_WORDS <= len(sentence.split()) <= MAX_WORDS:
                sentences.append(sentence)
    return list(dict.fromkeys(sentences))  # drop repeats, keep order


def make_authorship(shared: Path, out: Path) -> None:
    rng = random.Random(SEED)
    rows = {split: [] for split in SENTENCES_PER_BOOK}
    for author, books in AUTHORS.items():
        for book in books:
            sentences = book_sentences(shared / "gutenberg" / f"{book}.txt.gz")
            picked = rng.sample(sentences, sum(SENTENCES_PER_BOOK.values()))
            for split, count in SENTENCES_PER_BOOK.items():
                rows[split] += [(sentence, author) for sentence in picked[:count]]
                picked = picked[count:]
    folder = out / "authorship"
    folder.mkdir(parents=True, exist_ok=True)
    for split, split_rows in rows.items():
        rng.shuffle(split_rows)
        with open(folder / f"{split}.csv", "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(["sentence", "label"])
            writer.writerows(split_rows)


# --- UD English-EWT (POS tagging) -----------------------------------------------------------------------

UD_SENTENCES = {"train": 1500, "dev": 300, "test": 300}


def write_gzip(path: Path, text: str) -> None:
    path.write_bytes(gzip.compress(text.encode("utf-8"), 9, mtime=0))


def conllu_blocks(path: Path):
    """Yield each sentence of a CoNLL-U file as its text block (comments, word lines, closing blank line)."""
    opener = gzip.open if path.suffix == ".gz" else open
    block = []
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            block.append(line)
            if not line.strip():
                yield "".join(block)
                block = []


def block_tags(block: str) -> set[str]:
    """UPOS and XPOS tags of the syntactic words in a sentence block."""
    rows = [line.split("\t") for line in block.splitlines() if line and not line.startswith("#")]
    return {tag for row in rows if row[0].isdigit() for tag in (row[3], row[4])}


def make_ud_ewt(shared: Path, out: Path) -> None:
    folder = out / "ud-english-ewt"
    folder.mkdir(parents=True, exist_ok=True)
    source = shared / "ud-english-ewt"
    for split, count in UD_SENTENCES.items():
        name = f"en_ewt-ud-{split}.conllu"
        path = source / name if (source / name).exists() else source / f"{name}.gz"
        blocks = list(conllu_blocks(path))
        sample = blocks[:count]
        if split == "train":
            # rare tags (XPOS "GW") may be missing from the first sentences: add the first later sentence
            # that has each missing tag, so the training sample covers the whole UPOS and XPOS tag sets
            seen = set().union(*map(block_tags, sample))
            for block in blocks[count:]:
                if block_tags(block) - seen:
                    sample.append(block)
                    seen |= block_tags(block)
        write_gzip(folder / f"en_ewt-ud-{split}-sample.conllu.gz", "".join(sample))


# --- SciTLDR-A (summarization) --------------------------------------------------------------------------

SCITLDR_RECORDS = {"train": 400, "dev": 100, "test": 100}


def make_scitldr(shared: Path, out: Path) -> None:
    folder = out / "scitldr"
    folder.mkdir(parents=True, exist_ok=True)
    for split, count in SCITLDR_RECORDS.items():
        lines = io.StringIO()
        with open(shared / "scitldr" / f"{split}.jsonl", encoding="utf-8") as f:
            for line, _ in zip(f, range(count)):
                record = json.loads(line)
                example = {"source": " ".join(record["source"]), "target": record["target"][0]}
                lines.write(json.dumps(example, ensure_ascii=False) + "\n")
        write_gzip(folder / f"{split}.jsonl.gz", lines.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    beside_repository = Path(__file__).resolve().parents[3] / "shared" / "data"  # ../shared/data from the root
    parser.add_argument("--shared", type=Path, default=beside_repository, help="folder of the sources")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent, help="where to write")
    args = parser.parse_args()
    make_authorship(args.shared, args.out)
    make_ud_ewt(args.shared, args.out)
    make_scitldr(args.shared, args.out)


if __name__ == "__main__":
    main()

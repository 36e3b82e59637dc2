"""Rebuild the shipped corpora under data/ from the offline copies in ../shared/data (see each SOURCE.md).

    python data/make_samples.py [/path/to/shared/data]   # default: ../shared/data beside the repository

data/pretrain/*.txt  : public-domain books; one chapter per document (blank line between chapters), one
                       paragraph per line; Project Gutenberg header, footer and every mention of it removed.
data/tinystories/*.txt: TinyStories (CDLA-Sharing-1.0); one story per document (blank line between stories).
"""

import gzip
import hashlib
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parent.parent / "shared" / "data"  # beside the repository

# file stem in gutenberg/ -> (output name, regex matching a chapter heading line)
BOOKS = {
    "pg1342_pride_and_prejudice": ("pride_and_prejudice", r"Chapter \d+"),
    "pg11_alice_in_wonderland": ("alice_in_wonderland", r"CHAPTER [IVXL]+\..*"),
    "pg84_frankenstein": ("frankenstein", r"(Letter|Chapter) \d+"),
    "pg174_picture_of_dorian_gray": ("picture_of_dorian_gray", r"CHAPTER \d+"),
    "pg35_the_time_machine": ("the_time_machine", r"\s*([IVX]+|Epilogue)\s*"),
    "pg46_a_christmas_carol": ("a_christmas_carol", r"STAVE [IVX]+:.*"),
}
MIN_CHAPTER_WORDS = 300  # shorter pieces are tables of contents, title pages, dedications


def book_body(raw: str) -> str:
    text = raw.replace("\r\n", "\n").lstrip("\ufeff")
    start = re.search(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$", text, flags=re.M)
    end = re.search(r"^\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG.*$", text, flags=re.M)
    text = text[start.end() if start else 0 : end.start() if end else len(text)]
    credits = ("gutenberg", "produced by", "html version by")
    return "\n".join(line for line in text.split("\n") if not any(c in line.lower() for c in credits))


def clean_paragraph(paragraph: str) -> str:
    text = " ".join(paragraph.split())
    text = re.sub(r"\[Illustration[^\]]*\]", "", text)
    text = text.replace("_", "")  # _italics_ markers
    return " ".join(text.split())


def is_title(paragraph: str) -> bool:
    return len(paragraph.split()) < 8 and not re.search(r"[.!?]['\"’”]?$", paragraph)


def chapters(body: str, heading: str) -> list[list[str]]:
    pieces = re.split(rf"^(?:{heading})$", body, flags=re.M)
    result = []
    for piece in pieces:
        paragraphs = [clean_paragraph(p) for p in re.split(r"\n\s*\n", piece)]
        paragraphs = [p for p in paragraphs if p and not is_title(p)]
        if sum(len(p.split()) for p in paragraphs) >= MIN_CHAPTER_WORDS:
            result.append(paragraphs)
    return result


def write(path: Path, text: str) -> None:
    path.write_bytes(text.encode("utf-8"))
    print(f"{path.relative_to(HERE)}  {len(text.encode('utf-8')):,} bytes  sha256 {hashlib.sha256(text.encode()).hexdigest()}")


def make_pretrain() -> None:
    for stem, (name, heading) in BOOKS.items():
        raw = gzip.open(SHARED / "gutenberg" / f"{stem}.txt.gz", "rt", encoding="utf-8-sig").read()
        book = chapters(book_body(raw), heading)
        print(f"{name}: {len(book)} chapters, {sum(len(c) for c in book)} paragraphs")
        write(HERE / "pretrain" / f"{name}.txt", "\n\n".join("\n".join(c) for c in book) + "\n")


def make_tinystories(max_bytes: int = 1_000_000) -> None:
    raw = gzip.open(SHARED / "tinystories" / "tinystoriesV2_gpt4_train_head10k.txt.gz", "rt", encoding="utf-8").read()
    stories = [s.strip() for s in raw.split("<|endoftext|>")[:-1]]  # the text after the last marker is cut off
    kept, size = [], 0
    for story in stories:
        lines = [" ".join(line.split()) for line in story.split("\n")]
        story = "\n".join(line for line in lines if line)
        if not story:
            continue
        size += len(story.encode("utf-8")) + 2
        if size > max_bytes:
            break
        kept.append(story)
    print(f"tinystories: {len(kept)} stories")
    write(HERE / "tinystories" / "tinystories_v2_train_head.txt", "\n\n".join(kept) + "\n")


if __name__ == "__main__":
    make_pretrain()
    make_tinystories()

"""A synthetic corpus with a realistic vocabulary, deterministic from a seed, at any size.

    from bench.wide_corpus import write_wide_corpus
    write_wide_corpus(folder, megabytes=1000, layout="files", seed=0)

Real corpora (Wikipedia, web text, books) have a vocabulary whose word frequencies follow Zipf's law, with a long
tail that keeps growing with the corpus: names, numbers, codes, URLs, user names. Copies of a few books have
neither: their distinct words stop at tens of thousands. This corpus has both:

- words drawn from a Zipf distribution (exponent 1.05) over a list of 500,000 pronounceable made-up words (the
  most frequent ones are English function words), in sentences of 4 to 32 words, several sentences per
  one-paragraph document, documents separated by blank lines;
- in every document, one-off tokens as crawled text has them: reference codes (`REF-7QK2-19`), numbers
  (`48,213`, `3.0917`), URLs (`https://w17.example.org/wiki/Tovanel_4821`), user names (`@mirelo_9137`) and
  dates; each carries a running number, so nearly all of them occur once.

About 7 million distinct space-separated pieces at 1 GB (tests/test_data_prepare_scale.py counts them on a small
one). The same seed gives the same bytes whatever the layout: `files` cuts the stream into files of about 2 MB
at document boundaries, `big` writes it into one file.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

MB = 1_000_000
FILE_BYTES = 2 * MB
VOCABULARY = 500_000
ZIPF_EXPONENT = 1.05
FUNCTION_WORDS = (
    "the of and to a in is that it was for on as with he by at his be from this had not are but or have "
    "an they which one you were her all she there would their we him been has when who will more no if out so "
    "said what up its about into than them can only other new some could time these two may then do first any "
    "my now such like our over man me even most made after also did many before must through back years where"
).split()
SYLLABLES = (
    "ka ta na ma ra la sa va lo ne ri mo tu be di fe go hi ju ke li mu no pe qui ro su ti vo we xa yo ze an "
    "el in or un ar en is os ur am em im om um al ol il ul er ir tor ven mar sel dor lin bra cle dri fro gla "
    "pla stra thi wen cha sho"
).split()


def word_list(size: int = VOCABULARY, seed: int = 0) -> list[str]:
    """`size` distinct lowercase words, English function words first, then made-up ones of 1 to 5 syllables."""
    rng = random.Random(f"wide-corpus-words:{seed}")
    words, seen = list(FUNCTION_WORDS), set(FUNCTION_WORDS)
    while len(words) < size:
        word = "".join(rng.choice(SYLLABLES) for _ in range(rng.choice((1, 2, 2, 3, 3, 3, 4, 4, 5))))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


class WideCorpus:
    """Documents (one paragraph each) from a seeded generator; `documents(n)` gives the next n."""

    def __init__(self, seed: int = 0, vocabulary: int = VOCABULARY):
        self.rng = np.random.default_rng(seed)
        self.py = random.Random(f"wide-corpus-tokens:{seed}")
        words = word_list(vocabulary, seed)
        self.plain = np.array(words, dtype=object)
        self.capital = np.array([w.capitalize() for w in words], dtype=object)
        weights = 1.0 / np.arange(1, vocabulary + 1) ** ZIPF_EXPONENT
        self.cumulative = np.cumsum(weights / weights.sum())
        self.serial = 0
        self.name_parts = words[200:5000]

    def _one_off(self) -> str:
        self.serial += 1
        n, py = self.serial, self.py
        kind = py.randrange(6)
        if kind == 0:
            return f"REF-{n:X}{py.choice('ABCDEFGHJKLMNPQRSTUVWXYZ')}-{py.randrange(100):02d}"
        if kind == 1:
            return f"{n * 7919 % 9_999_991:,}"
        if kind == 2:
            return f"{py.randrange(1000)}.{n % 10_000:04d}"
        if kind == 3:
            return (
                f"https://w{py.randrange(100)}.example.org/wiki/{py.choice(self.name_parts).capitalize()}_{n}"
            )
        if kind == 4:
            return f"@{py.choice(self.name_parts)}_{n}"
        return f"{1900 + n % 125}-{1 + n % 12:02d}-{1 + n % 28:02d}"

    def documents(self, count: int) -> list[str]:
        rng = self.rng
        sentences_per_doc = rng.integers(2, 12, size=count)
        sentence_lengths = rng.integers(4, 33, size=int(sentences_per_doc.sum()))
        total = int(sentence_lengths.sum())
        ranks = np.searchsorted(self.cumulative, rng.random(total), side="right").clip(
            max=len(self.plain) - 1
        )
        ends = np.cumsum(sentence_lengths)
        starts = ends - sentence_lengths
        words = self.plain[ranks]
        words[starts] = self.capital[ranks[starts]]
        words[ends - 1] = words[ends - 1] + np.where(rng.random(len(ends)) < 0.9, ".", "?").astype(object)
        doc_ends = ends[np.cumsum(sentences_per_doc) - 1]
        out, first = [], 0
        one_offs = rng.integers(4, 20, size=count)
        for last, extra in zip(doc_ends.tolist(), one_offs.tolist()):
            doc = words[first:last].tolist()
            for _ in range(extra):
                doc.insert(self.py.randrange(1, len(doc) + 1), self._one_off())
            out.append(" ".join(doc))
            first = last
        return out


def write_wide_corpus(folder: Path, megabytes: float, layout: str = "files", seed: int = 0) -> int:
    """Write `megabytes` of the corpus into `folder` (`files`: corpus-00000.txt ... of about 2 MB each, cut at
    document boundaries; `big`: corpus.txt); returns the bytes written (the last document is cut to the size at
    a character boundary)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    limit = int(megabytes * MB)
    corpus = WideCorpus(seed)
    written, number, in_file = 0, 0, 0
    sink = open(folder / ("corpus.txt" if layout == "big" else "corpus-00000.txt"), "wb")
    try:
        while written < limit:
            for document in corpus.documents(200):
                data = (document + "\n\n").encode("utf-8")
                if written + len(data) > limit:
                    data = data[: limit - written].decode("utf-8", "ignore").encode("utf-8")
                if layout != "big" and in_file >= FILE_BYTES:
                    sink.close()
                    number += 1
                    sink = open(folder / f"corpus-{number:05d}.txt", "wb")
                    in_file = 0
                sink.write(data)
                written += len(data)
                in_file += len(data)
                if written >= limit or not data:
                    break
            if not data:
                break
    finally:
        sink.close()
    return written

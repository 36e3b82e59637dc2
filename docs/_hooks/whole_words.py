"""MkDocs hook: inline code outside tables and code blocks breaks between its words only, never inside one.

A browser may end a line after any hyphen, slash or dot, so an option such as `--training.max_steps` or a path
such as `runs/decoder-tiny/final` in running text could be split across two lines (`--training.max_` / `steps`),
and a reader copying it by eye gets it wrong. Each word of such a span is put in a `kiln-word` span, which the
stylesheet keeps on one line; spaces between words stay break points. Tables are left alone: their cells wrap
anywhere by design (docs/stylesheets/wide.css), so that no table runs past the page at 1280 px."""

from __future__ import annotations

import re

LEFT_ALONE = re.compile(r"<pre\b.*?</pre>|<table\b.*?</table>", re.S)
PLAIN_INLINE_CODE = re.compile(r"<code>([^<]*)</code>")  # Markdown's `code`: escaped text, no markup inside
BREAKABLE_WORD = re.compile(r"[^\s]*[^\w\s&;][^\s]*")  # a word with a character a line may break after


def keep_words_whole(html: str) -> str:
    """`html` with each breakable word of inline code (outside <pre> and <table>) in a nowrap span."""
    parts, at = [], 0
    for skipped in LEFT_ALONE.finditer(html):
        parts += [_wrap_words(html[at : skipped.start()]), skipped.group(0)]
        at = skipped.end()
    parts.append(_wrap_words(html[at:]))
    return "".join(parts)


def _wrap_words(html: str) -> str:
    def wrap(code: re.Match) -> str:
        words = BREAKABLE_WORD.sub(
            lambda word: f'<span class="kiln-word">{word.group(0)}</span>', code.group(1)
        )
        return f"<code>{words}</code>"

    return PLAIN_INLINE_CODE.sub(wrap, html)


def on_page_content(html: str, **_) -> str:
    return keep_words_whole(html)

"""Text normalisation shared by all sources.

Kept deliberately light: the goal is natural running text for a language model, so we
only undo markup (reStructuredText, stray XML) and normalise whitespace. Heavier
filtering would make the corpus less like the paper's raw web/paper text.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Iterator

_WS = re.compile(r"[ \t\f\v\u00a0]+")
_MANY_NL = re.compile(r"\n{3,}")
_CTRL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def drop_controls(text: str) -> str:
    """``text`` without the control characters :func:`normalize` drops (tab and newlines stay)."""
    return _CTRL.sub("", text)


# Where an over-long document may be cut, most natural first: a paragraph, a line, a
# sentence, a word. The cut goes after the separator, so a sentence keeps its full stop.
_BREAKS = ("\n\n", "\n", ". ", "? ", "! ", " ")


def pieces(text: str, limit: int) -> Iterator[str]:
    """``text`` in consecutive pieces of at most ``limit`` characters that join back to it.

    Why: one document of tens of megabytes (a dump on one line) would be held, split,
    trained on and encoded whole; pieces bound each of those steps. Each cut is at the last
    paragraph break in the second half of the window, else the last line break, sentence
    end or space there, else at ``limit`` (text without spaces). Searching only the second
    half keeps every piece but the last at least ``limit // 2`` long. Text within the limit
    is yielded as it is."""
    start, end = 0, len(text)
    while end - start > limit:
        stop = start + limit
        cut = stop
        for sep in _BREAKS:
            at = text.rfind(sep, start + limit // 2, stop)
            if at >= 0:
                cut = at + len(sep)
                break
        yield text[start:cut]
        start = cut
    yield text[start:]


def normalize(text: str) -> str:
    """NFC-normalise, drop control characters, collapse runs of spaces and blank lines."""
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = drop_controls(text)
    lines = [_WS.sub(" ", ln).strip() for ln in text.split("\n")]
    return _MANY_NL.sub("\n\n", "\n".join(lines)).strip()


# reStructuredText (the CS stand-in is Django's .txt docs, which are reST).
_RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+<>:._])\1{2,}\s*$")
_RST_ROLE = re.compile(r":[\w:+-]+:`([^`<]*?)(?:\s*<[^`>]*>)?`")
_RST_LINK = re.compile(r"`([^`<]+?)\s*<[^`>]+>`__?")
_RST_LITERAL = re.compile(r"``([^`]+)``")
_RST_REF = re.compile(r"`([^`]+)`_{1,2}")
_RST_DIRECTIVE = re.compile(r"^\s*\.\.\s")


def strip_rst(text: str) -> str:
    """Turn reST into plain prose+code: drop directives/labels/heading rules, unwrap roles."""
    out: list[str] = []
    skipping_directive_options = False
    for line in text.split("\n"):
        if _RST_UNDERLINE.match(line):
            continue
        if _RST_DIRECTIVE.match(line):
            # A directive's own line and its ":option:" lines carry no prose.
            skipping_directive_options = True
            continue
        if skipping_directive_options and line.strip().startswith(":") and line.startswith(" "):
            continue
        skipping_directive_options = False
        out.append(line.rstrip())
    # Roles and links may wrap across lines, so unwrap them on the joined text.
    text = "\n".join(out)
    for pat in (_RST_ROLE, _RST_LINK, _RST_LITERAL, _RST_REF):
        text = pat.sub(r"\1", text)
    return text


def split_rst_sections(text: str, min_chars: int = 400) -> list[str]:
    """Split a reST file at its section headings, merging tiny sections into the next.

    One Django doc file can be 100 kB; splitting into sections gives document sizes
    closer to paper abstracts and enough documents for a fixed-size validation split.
    """
    lines = text.split("\n")
    starts = [0]
    for i in range(1, len(lines)):
        if _RST_UNDERLINE.match(lines[i]) and lines[i - 1].strip() and not _RST_UNDERLINE.match(lines[i - 1]):
            starts.append(i - 1)
    starts = sorted(set(starts))
    sections = ["\n".join(lines[a:b]) for a, b in zip(starts, starts[1:] + [len(lines)])]
    merged: list[str] = []
    buf = ""
    for sec in sections:
        buf = f"{buf}\n{sec}" if buf else sec
        if len(buf) >= min_chars:
            merged.append(buf)
            buf = ""
    if buf:
        if merged:
            merged[-1] += "\n" + buf
        else:
            merged.append(buf)
    return merged

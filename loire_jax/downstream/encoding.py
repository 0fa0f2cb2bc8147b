"""Records → fixed-length token arrays for a head, in the layouts the two model kinds were
pre-trained to read.

- An encoder reads ``[CLS] a [SEP] (b [SEP])`` (BERT's layout): a pair's second segment has
  token type 1 where the model has type rows, and the head pools the [CLS] state.
- A decoder reads ``a <eos> (b <eos>)`` (GPT-2's habit for classification, the EOS joining
  documents in pre-training) and pools the last real token: the only one that has seen the
  whole input under causal attention.
- Extractive QA puts the question first (``[CLS] q [SEP] context [SEP]`` /
  ``q <eos> context <eos>``), so a decoder's context tokens have read the question. The
  context is tokenized word by word (each word with its leading space), so every token maps
  back to a span of the context's characters; "no answer" is the [CLS] position of an
  encoder and the last position of a decoder. A context too long for one sequence is read
  in overlapping windows (``run_qa``'s ``doc_stride``): each window is one row, labelled
  with the answer where it holds the whole answer and with no-answer elsewhere; at
  evaluation the best span over an example's windows competes with its lowest no-answer
  score.

Too-long inputs are truncated longest-first (a pair), and the number truncated is reported. Padding is masked: an encoder never attends to it, and
no head reads it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence

import numpy as np

from loire_jax.data.tokenizers import Tokenizer

_WORD = re.compile(r"\s*\S+")  # a word with the whitespace before it


@dataclasses.dataclass(frozen=True)
class Layout:
    """The ids and conventions of one model kind: ``cls`` None for a decoder."""

    encoder: bool
    sep: int
    pad: int
    cls: int | None = None
    type_rows: int = 0  # the model's token-type rows (a pair's second segment is type 1 if there are 2)

    def __post_init__(self) -> None:
        if self.encoder and self.cls is None:
            raise ValueError("an encoder layout needs a [CLS] id")


@dataclasses.dataclass
class Encoded:
    """One split as arrays. ``inputs``: ``tokens``, ``valid`` (real tokens), ``types``,
    ``pool`` (the position a sequence head reads) and, for QA, ``allowed`` (the positions an
    answer may start or end at, the no-answer one included) and ``null``; multiple choice
    adds a choice axis after the example axis and ``choice_valid``. ``targets``: ``label``,
    or ``start`` and ``end``. ``spans`` (QA): per row, each position's character span in
    the context, (-1, -1) outside it; ``example`` (QA): the record each row (window) reads."""

    inputs: dict[str, np.ndarray]
    targets: dict[str, np.ndarray]
    truncated: int
    spans: list[np.ndarray] | None = None
    example: np.ndarray | None = None

    def __len__(self) -> int:
        return len(next(iter(self.targets.values())))

    @property
    def examples(self) -> int:
        """The records encoded: the rows, except where a QA context takes several windows."""
        return len(self) if self.example is None or not len(self) else int(self.example.max()) + 1


def _pair(layout: Layout, a: list[int], b: list[int] | None, max_len: int) -> tuple[list[int], list[int], bool]:
    """(tokens, types, truncated) of one text or pair, at most ``max_len`` long."""
    specials = (1 if layout.encoder else 0) + (2 if b is not None else 1)
    budget = max_len - specials
    if budget < (2 if b is not None else 1):
        raise ValueError(f"max_len {max_len} leaves no room for the text")
    a, b = list(a), (list(b) if b is not None else None)
    truncated = len(a) + (len(b) if b is not None else 0) > budget
    while len(a) + (len(b) if b is not None else 0) > budget:  # longest first
        if b is not None and len(b) > len(a):
            b.pop()
        else:
            a.pop()
    head = [layout.cls] if layout.encoder else []
    tokens = head + a + [layout.sep]
    types = [0] * len(tokens)
    if b is not None:
        tokens += b + [layout.sep]
        types += [1 if layout.type_rows >= 2 else 0] * (len(b) + 1)
    return tokens, types, truncated


def _pack(rows: Sequence[tuple[list[int], list[int]]], layout: Layout, max_len: int, pooling: str) -> dict[str, np.ndarray]:
    n = len(rows)
    tokens = np.full((n, max_len), layout.pad, np.int32)
    types = np.zeros((n, max_len), np.int32)
    valid = np.zeros((n, max_len), bool)
    pool = np.zeros((n,), np.int32)
    for i, (t, ty) in enumerate(rows):
        tokens[i, :len(t)], types[i, :len(t)], valid[i, :len(t)] = t, ty, True
        pool[i] = 0 if pooling == "first" else len(t) - 1
    return {"tokens": tokens, "types": types, "valid": valid, "pool": pool}


def resolved_pooling(pooling: str, encoder: bool) -> str:
    """``auto`` → ``first`` for an encoder ([CLS]), ``last`` for a decoder. ``first`` on a
    decoder is refused: its first token has seen nothing else."""
    if pooling == "auto":
        return "first" if encoder else "last"
    if pooling == "first" and not encoder:
        raise ValueError("pooling 'first' cannot work on a decoder: under causal attention its first token has "
                         "seen nothing else; use 'last' (or 'auto')")
    return pooling


def encode_classification(records: Sequence[dict[str, Any]], labels: Sequence[str], tokenizer: Tokenizer,
                          layout: Layout, max_len: int, pooling: str) -> Encoded:
    texts = tokenizer.encode_batch([r["text"] for r in records])
    pairs = [r["text_pair"] for r in records]
    pair_ids = dict(zip([i for i, p in enumerate(pairs) if p is not None],
                        tokenizer.encode_batch([p for p in pairs if p is not None])))
    rows, truncated = [], 0
    for i, a in enumerate(texts):
        t, ty, cut = _pair(layout, a, pair_ids.get(i), max_len)
        rows.append((t, ty))
        truncated += cut
    index = {name: k for k, name in enumerate(labels)}
    label = np.array([index[r["label"]] for r in records], np.int32)
    return Encoded(_pack(rows, layout, max_len, resolved_pooling(pooling, layout.encoder)), {"label": label}, truncated)


def encode_multiple_choice(records: Sequence[dict[str, Any]], tokenizer: Tokenizer, layout: Layout, max_len: int,
                           pooling: str) -> Encoded:
    """Each (text, choice) pair as one sequence [example, choice, position]; examples with
    fewer choices than the most are padded with masked choices (``choice_valid``)."""
    width = max(len(r["choices"]) for r in records)
    texts = tokenizer.encode_batch([r["text"] for r in records])
    flat = tokenizer.encode_batch([c for r in records for c in r["choices"]])
    rows, truncated, k = [], 0, 0
    filler = _pair(layout, [layout.sep], [layout.sep], max_len)[:2]
    choice_valid = np.zeros((len(records), width), bool)
    for i, r in enumerate(records):
        for j in range(width):
            if j < len(r["choices"]):
                t, ty, cut = _pair(layout, texts[i], flat[k], max_len)
                rows.append((t, ty))
                truncated += cut
                choice_valid[i, j] = True
                k += 1
            else:
                rows.append(filler)
    packed = _pack(rows, layout, max_len, resolved_pooling(pooling, layout.encoder))
    inputs = {key: v.reshape((len(records), width) + v.shape[1:]) for key, v in packed.items()}
    inputs["choice_valid"] = choice_valid
    return Encoded(inputs, {"label": np.array([r["label"] for r in records], np.int32)}, truncated)


def context_words(context: str) -> list[tuple[int, int, str]]:
    """(start, end, text) of each word with its leading whitespace; start/end exclude it."""
    out = []
    for m in _WORD.finditer(context):
        word = m.group(0)
        start = m.start() + len(word) - len(word.lstrip())
        out.append((start, m.end(), word))
    return out


def windows(length: int, room: int, stride: int) -> list[int]:
    """Start offsets of the windows of ``room`` tokens that cover ``length`` context tokens,
    consecutive ones sharing ``stride`` tokens (one window when it all fits)."""
    if stride >= room:
        raise ValueError(f"doc_stride {stride} must be smaller than the {room} context tokens a window holds")
    starts = [0]
    while starts[-1] + room < length:
        starts.append(starts[-1] + room - stride)
    return starts


def encode_qa(records: Sequence[dict[str, Any]], tokenizer: Tokenizer, layout: Layout, max_len: int,
              doc_stride: int | None = None, max_question: int = 64) -> Encoded:
    """Question and context as one sequence per window of the context, and the answer's
    first and last token in each window (the no-answer position where the window does not
    hold the whole answer, or the example has none). ``truncated`` counts the questions cut
    to ``max_question`` tokens; contexts are never cut."""
    questions = tokenizer.encode_batch([r["question"] for r in records])
    rows: list[tuple[list[int], int, list[tuple[int, int]], int, int, int]] = []
    truncated = 0
    for i, r in enumerate(records):
        words = context_words(r["context"])
        pieces = tokenizer.encode_batch([w for _, _, w in words]) if words else []
        q = questions[i][:max_question]
        truncated += len(questions[i]) > max_question
        head = ([layout.cls] if layout.encoder else []) + q + [layout.sep]
        room = max_len - len(head) - 1
        if room < 1:
            raise ValueError(f"max_len {max_len} leaves no room for a context after a {len(q)}-token question")
        ctx = [tok for piece in pieces for tok in piece]
        ctx_spans = [(s, e) for (s, e, _), piece in zip(words, pieces) for _ in piece]
        answer = None
        if r["answers"]:
            a = r["answers"][0]
            a0, a1 = a["start"], a["start"] + len(a["text"])
            hit = [p for p, (s, e) in enumerate(ctx_spans) if s < a1 and e > a0]
            answer = (hit[0], hit[-1]) if hit else None
        stride = doc_stride if doc_stride is not None else min(max_len // 4, room // 2)
        for w0 in windows(len(ctx), room, stride):
            n = min(room, len(ctx) - w0)
            seq = head + ctx[w0:w0 + n] + [layout.sep]
            null = 0 if layout.encoder else len(seq) - 1
            a_start = a_end = null
            if answer is not None and w0 <= answer[0] and answer[1] < w0 + n:
                a_start, a_end = answer[0] - w0 + len(head), answer[1] - w0 + len(head)
            rows.append((seq, len(head), ctx_spans[w0:w0 + n], null, a_start, a_end, i))
    m = len(rows)
    tokens = np.full((m, max_len), layout.pad, np.int32)
    types = np.zeros((m, max_len), np.int32)
    valid = np.zeros((m, max_len), bool)
    allowed = np.zeros((m, max_len), bool)
    null = np.array([row[3] for row in rows], np.int32)
    type1 = 1 if layout.type_rows >= 2 else 0
    spans = []
    for k, (seq, h, span_list, nul, _, _, _) in enumerate(rows):
        tokens[k, :len(seq)], valid[k, :len(seq)] = seq, True
        types[k, h:len(seq)] = type1
        span = np.full((max_len, 2), -1, np.int64)
        span[h:h + len(span_list)] = span_list
        spans.append(span)
        allowed[k, h:h + len(span_list)] = True
        allowed[k, nul] = True
    inputs = {"tokens": tokens, "types": types, "valid": valid, "allowed": allowed, "null": null}
    targets = {"start": np.array([row[4] for row in rows], np.int32), "end": np.array([row[5] for row in rows], np.int32)}
    return Encoded(inputs, targets, truncated, spans, np.array([row[6] for row in rows], np.int64))


def span_scores(start_logits: np.ndarray, end_logits: np.ndarray, allowed: np.ndarray, null: int,
                max_answer: int = 30) -> tuple[tuple[int, int] | None, float, float]:
    """(the highest-scoring (start, end) with start ≤ end < start + ``max_answer`` over the
    context, or None where there is none; its score; the no-answer score) of one row."""
    positions = np.flatnonzero(allowed)
    positions = positions[positions != null]
    best, best_score = None, -np.inf
    if positions.size:
        s = start_logits[positions][:, None] + end_logits[positions][None, :]
        gap = positions[None, :] - positions[:, None]
        s = np.where((gap >= 0) & (gap < max_answer), s, -np.inf)
        i, j = np.unravel_index(int(np.argmax(s)), s.shape)
        if np.isfinite(s[i, j]):
            best, best_score = (int(positions[i]), int(positions[j])), float(s[i, j])
    return best, best_score, float(start_logits[null] + end_logits[null])


def best_span(start_logits: np.ndarray, end_logits: np.ndarray, allowed: np.ndarray, null: int,
              allow_null: bool, max_answer: int = 30) -> tuple[int, int] | None:
    """One row's answer: its best span, or None (no answer) when ``allow_null`` and the
    no-answer score is higher: the SQuAD 2.0 rule with threshold 0."""
    got = best_answer([span_scores(start_logits, end_logits, allowed, null, max_answer)], allow_null)
    return None if got is None else got[1]


def best_answer(rows: Sequence[tuple[tuple[int, int] | None, float, float]],
                allow_null: bool) -> tuple[int, tuple[int, int]] | None:
    """An example's answer over its windows' ``span_scores``: (window, span) of the
    best-scoring span, or None when there is none, or when ``allow_null`` and the lowest
    no-answer score of the windows beats it (``run_qa``'s rule)."""
    scored = [(score, k, span) for k, (span, score, _) in enumerate(rows) if span is not None]
    top = max(scored, key=lambda t: t[0]) if scored else None
    null = min(n for _, _, n in rows)
    if top is None or (allow_null and null > top[0]):
        return None
    return top[1], top[2]


def qa_answers(records: Sequence[dict[str, Any]], encoded: Encoded, start_logits: np.ndarray,
               end_logits: np.ndarray, allow_null: bool) -> list[str]:
    """Each record's predicted answer text, in the records' order: the best over the
    windows that read it (``best_answer``). Windows are grouped by the record's position
    (``encoded.example``), never by its id, so every record is answered once even where
    ids repeat."""
    rows: list[list[int]] = [[] for _ in records]
    if encoded.example is None or len(encoded.example) != len(start_logits) or \
            len(encoded.example) and not 0 <= int(encoded.example.min()) <= int(encoded.example.max()) < len(records):
        raise ValueError(f"qa_answers: {len(start_logits)} rows of logits for windows of other records")
    for k, i in enumerate(encoded.example):
        rows[int(i)].append(k)
    answers = []
    for r, ks in zip(records, rows):
        if not ks:
            raise ValueError(f"qa_answers: no window reads record {r.get('id')!r}")
        got = best_answer([span_scores(start_logits[k], end_logits[k], encoded.inputs["allowed"][k],
                                       int(encoded.inputs["null"][k])) for k in ks], allow_null)
        answers.append("" if got is None else span_text(r["context"], encoded.spans[ks[got[0]]], got[1]))
    return answers


def span_text(context: str, spans: np.ndarray, span: tuple[int, int] | None) -> str:
    """The context's characters from the first token's word to the last token's word."""
    if span is None:
        return ""
    return context[int(spans[span[0], 0]):int(spans[span[1], 1])].strip()

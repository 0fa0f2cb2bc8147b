"""The score a task gives for nothing: the trivial baseline a fine-tuned score is read against.

A fine-tuned accuracy of 64.85 on BoolQ says nothing when 64.9% of its validation answers
are "false". So every job records, beside its score and from the very validation examples it
scored, the best constant answer in the task's metric:

- classification: the single class that scores best when always predicted (the majority
  class under accuracy);
- multiple choice: the answer position that is most often right ("always choice 2");
- extractive QA: always no answer (SQuAD 2.0's abstention; F1 0 where every question has
  an answer).

and how far a score may sit from it by chance (``noise``): twice the binomial standard error
of the baseline over the ``n`` examples scored, ``2·sqrt(p(1−p)/n)`` (percent; for Matthews'
coefficient, whose constant guess is 0, ``2/sqrt(n)``, its standard error under no
correlation). A score that is not above ``score + noise`` has not shown that the model
learned the task (``loire_jax.analysis.downstream.clears``, which
the reports mark it by).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from loire_jax.config.finetune import FinetuneConfig
from loire_jax.downstream import scoring

__all__ = ["baseline", "noise"]

def baseline(cfg: FinetuneConfig, records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``{"name", "answer", "score", "n", "noise"}`` of the validation ``records`` that were
    scored, in the task's metric (percent, as the job's score)."""
    task, n = cfg.task, len(records)
    if task.kind == "qa":
        golds = [[a["text"] for a in r["answers"]] for r in records]
        score = scoring.squad_scores_in_order([""] * n, golds)["f1"]
        name, answer = "no answer", "always no answer"
    elif task.kind == "multiple_choice":
        gold = np.array([r["label"] for r in records])
        widest = max(len(r["choices"]) for r in records)
        scores = [scoring.accuracy(np.full(n, k), gold) for k in range(widest)]
        k = int(np.argmax(scores))
        name, answer, score = "most often right choice", f"always choice {k + 1}", scores[k]
    else:
        gold = np.array([task.labels.index(r["label"]) for r in records])
        scores = [scoring.classification_score(task.metric, np.full(n, c), gold, task.num_labels)
                  for c in range(task.num_labels)]
        c = int(np.argmax(scores))  # the first best class on a tie: deterministic
        name = "majority class" if task.metric == "accuracy" else "best constant class"
        answer, score = f"always {task.labels[c]!r}", scores[c]
    return {"name": name, "answer": answer, "score": round(float(score), 4), "n": n,
            "noise": round(noise(float(score), n, task.metric), 4)}


def noise(score: float, n: int, metric: str) -> float:
    """Twice the standard error of a baseline scoring ``score`` percent over ``n`` examples."""
    if n <= 0:
        return math.inf
    if metric == "matthews":
        return 200.0 / math.sqrt(n)
    p = min(max(score / 100.0, 0.0), 1.0)
    return 200.0 * math.sqrt(p * (1.0 - p) / n)

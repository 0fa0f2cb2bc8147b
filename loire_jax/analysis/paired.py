"""Paired verdicts: LOIRE against each opponent seed by seed, judged by a paired t interval.

Every system of a suite runs at the same seeds, and at a seed the growth systems share
their stage-1 model and data order, so the runs pair up: comparing the seeds' ranges as if
the runs were independent throws that pairing away (an effect of the same sign at every
seed can read "inconclusive"). Here each claim is judged on the differences
d_s = LOIRE_s - opponent_s at the seeds both have counted runs of:

- the test: Student's paired t interval, mean(d) ± t(1 - a/2, n - 1) · sd(d) / √n, with
  n ≥ ``MIN_SEEDS`` pairs (scipy.stats gives the quantile). With 3 to 5 seeds a rank test
  cannot reach a small level at all (an exact sign or signed-rank test on 3 pairs has no
  p-value below 0.25 two-sided), so the t interval, shown beside the sign count, is the
  usable choice; the sign count shows when it rests on one seed's outlier.
- the words: *no material effect* when the whole interval lies inside the claim's practical
  margin (``Margin``); else *holds* when it lies wholly on LOIRE's better side of zero,
  *reversed* when wholly on its worse side, and *inconclusive* otherwise (or with fewer
  than ``MIN_SEEDS`` pairs). A quantity with no spread over the seeds (analytic FLOPs)
  gives a point, judged the same way.
- many claims at once (``pair_level``): Bonferroni over the family of claims a report
  judges, at a family-wise a = ``ALPHA``: each of the m claims gets a / m, split evenly
  over its k opponents, so each pair's interval is at level 1 - a / (m · k). A claim
  holds only if it holds against every opponent (an intersection-union test, which needs
  no more adjustment), and is reversed if it is reversed against any one of them (the
  split by k covers that union). The chance that a report shows any false "holds" or
  "reversed" is then at most a.

Pure functions of numbers; ``claims`` and ``downstream`` build their verdicts from them.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Mapping, Sequence

from loire_jax.analysis.tables import MIN_SEEDS

ALPHA = 0.05  # family-wise error rate of one report's verdicts
VERDICTS = ("holds", "reversed", "no material effect", "inconclusive")


@dataclasses.dataclass(frozen=True)
class Margin:
    """The largest difference that does not matter in practice, in the metric's units:
    ``absolute`` plus ``relative`` times the opponent's mean magnitude."""

    absolute: float = 0.0
    relative: float = 0.0

    def width(self, theirs: Sequence[float]) -> float:
        """The margin against an opponent whose values are ``theirs``."""
        return self.absolute + self.relative * abs(statistics.fmean(theirs)) if theirs else self.absolute


def seed_of(run: Mapping[str, Any]) -> str:
    """A run's seed, from its name (``<suite>-<system>-s<seed>``, as suites name them)."""
    return str(run["name"]).rsplit("-s", 1)[-1]


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom."""
    from scipy.stats import t  # loaded on first use: a report without verdicts needs no scipy

    return float(t.ppf(p, df))


def pair_level(claims: int, opponents: int, alpha: float = ALPHA) -> float:
    """Each pair's two-sided error rate: ``alpha`` shared by ``claims`` claims (Bonferroni),
    then by the claim's ``opponents``."""
    return alpha / (max(1, claims) * max(1, opponents))


def judge(mine: Mapping[str, float], theirs: Mapping[str, float], *, lower_is_better: bool, margin: Margin,
          level: float) -> dict[str, Any]:
    """One pair's verdict from the values at each seed (seed -> value): the differences
    LOIRE - opponent at the common seeds, their mean, how many favour LOIRE, the
    ``1 - level`` paired t interval and the word (the module's rules)."""
    seeds = sorted(set(mine) & set(theirs), key=lambda s: (len(s), s))
    diffs = [mine[s] - theirs[s] for s in seeds]
    better = sum((d < 0) if lower_is_better else (d > 0) for d in diffs)
    out: dict[str, Any] = {"seeds": seeds, "diffs": diffs, "better": better, "n": len(diffs), "level": level,
                           "margin": margin.width([theirs[s] for s in seeds]), "mean": None, "interval": None}
    if len(diffs) < MIN_SEEDS:
        return {**out, "verdict": "inconclusive"}
    mean = statistics.fmean(diffs)
    half = t_quantile(1 - level / 2, len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    lo, hi = mean - half, mean + half
    good, bad = (hi < 0, lo > 0) if lower_is_better else (lo > 0, hi < 0)
    word = ("no material effect" if -out["margin"] <= lo and hi <= out["margin"] else
            "holds" if good else "reversed" if bad else "inconclusive")
    return {**out, "mean": mean, "interval": (lo, hi), "verdict": word}


def combine(words: Sequence[str]) -> str:
    """A claim's word from its pairs': reversed against any, holds (or no material effect)
    against all, else inconclusive."""
    if not words:
        return "not run"
    if "reversed" in words:
        return "reversed"
    for word in ("holds", "no material effect"):
        if all(w == word for w in words):
            return word
    return "inconclusive"


def pair_text(other: str, pair: Mapping[str, Any], spec: str = ".4g", subject: str = "LOIRE") -> str:
    """The numbers behind one pair: each seed's difference, the mean, the sign count and the
    interval, with its level and the margin. ``subject``: the system the claim is about."""
    if not pair["n"]:
        return f"{subject} - {other}: no seed with a counted run of both"
    per_seed = ", ".join(f"s{s} {d:+{spec}}" for s, d in zip(pair["seeds"], pair["diffs"]))
    text = f"{subject} - {other} per seed {per_seed}"
    if pair["interval"] is None:
        return f"{text}; {pair['n']} paired seeds, fewer than {MIN_SEEDS}"
    lo, hi = pair["interval"]
    return (f"{text}; mean {pair['mean']:+{spec}}, {subject} better at {pair['better']}/{pair['n']}, "
            f"{_percent(1 - pair['level'])} t interval [{lo:+{spec}}, {hi:+{spec}}], margin ±{pair['margin']:{spec}}")


def _percent(p: float) -> str:
    """A confidence level with the digits that tell it from its neighbours (99.58%)."""
    digits = max(0, min(4, math.ceil(-math.log10(max(1 - p, 1e-12))) - 1))
    return f"{100 * p:.{digits}f}%"


def why(verdict: str, pairs: Mapping[str, Mapping[str, Any]], subject: str = "LOIRE",
        subject_seeds: int | None = None) -> str:
    """Why a claim got its word, naming every opponent that decides it: for *inconclusive*,
    each one short of ``MIN_SEEDS`` paired seeds (with how many it has) and each whose
    interval reaches across zero. ``subject``: the system the claim is about;
    ``subject_seeds``, if given, how many seeds it has a value at (too few is said first)."""
    def named(word: str) -> list[str]:
        return [o for o, p in pairs.items() if p["verdict"] == word]

    if verdict == "reversed":
        return f"the paired interval lies on {subject}'s worse side against {', '.join(named('reversed'))}"
    if verdict == "holds":
        return f"the paired interval lies on {subject}'s better side against every opponent"
    if verdict == "no material effect":
        return "the paired interval lies inside the margin against every opponent"
    short = [o for o, p in pairs.items() if p["n"] < MIN_SEEDS]
    open_ = [o for o in named("inconclusive") if o not in short]
    reasons = []
    if subject_seeds is not None and subject_seeds < MIN_SEEDS:
        reasons.append(f"{subject} has {subject_seeds} counted run(s), fewer than {MIN_SEEDS}")
    if short:
        each = ", ".join(f"{o} ({pairs[o]['n']} paired)" for o in short)
        reasons.append(f"fewer than {MIN_SEEDS} paired seeds of {subject} and {'each of ' if len(short) > 1 else ''}"
                       f"{each}, runs that failed the gate not counted")
    if open_:
        reasons.append(f"the paired interval reaches across zero against {', '.join(open_)}")
    return "; ".join(reasons) or "holds against some opponents and shows no material effect against others"

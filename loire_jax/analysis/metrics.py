"""The paper's lifelong-learning metrics (App. D.3, eq. 16), from the perplexity matrix.

PPL_(t),j is the validation perplexity of the model after stage t on seen domain j.
PPL_j,j is the perplexity on domain j when training on it has just finished, i.e. at the
end of the stage that introduced j. Then, at stage t:

    AP  = exp( mean over seen j of log PPL_(t),j )
    AP+ = mean over earlier j (introduced before stage t) of ( PPL_(t),j - PPL_j,j )

AP measures learning of the stream so far; AP+ measures forgetting (negative means the
old domains improved). AP+ is undefined at the first stage. Everything here is pure and
works on plain dicts, so it checks against the paper's own Table 10 -> Table 2 numbers.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from loire_jax.config.stage import seen_domains, stage_number


def average_perplexity(ppls: Sequence[float]) -> float:
    """AP: the geometric mean of the perplexities (eq. 16, left)."""
    if not ppls:
        raise ValueError("AP needs at least one perplexity")
    if any(not p > 0 for p in ppls):
        raise ValueError(f"perplexities must be positive, got {list(ppls)}")
    return math.exp(sum(math.log(p) for p in ppls) / len(ppls))


def average_increased_perplexity(current: Mapping[str, float], learned: Mapping[str, float],
                                 earlier: Sequence[str]) -> float | None:
    """AP+: mean increase of PPL on the ``earlier`` domains since each was learned (eq. 16, right).

    None when there is no earlier domain (the first stage), as the paper's '-' entries.
    """
    if not earlier:
        return None
    missing = [d for d in earlier if d not in current or d not in learned]
    if missing:
        raise ValueError(f"AP+ needs PPL_(t),j and PPL_j,j for every earlier domain; missing {missing}")
    return sum(current[d] - learned[d] for d in earlier) / len(earlier)




def lifelong_metrics(stage_domains: Sequence[Sequence[str]],
                     final: Sequence[Mapping[str, float]]) -> list[dict]:
    """AP and AP+ of every finished stage (Table 2 layout).

    ``stage_domains[t]`` are the domains trained in stage t; ``final[t]`` maps every domain
    seen by then to PPL_(t),j. ``final`` may be shorter than the schedule (a run in progress).
    """
    seen = seen_domains(stage_domains)
    learned: dict[str, float] = {}
    rows = []
    for t, ppl in enumerate(final):
        missing = [d for d in seen[t] if d not in ppl]
        if missing:
            raise ValueError(f"stage {stage_number(t)} has no final perplexity for seen domain(s) {missing}")
        earlier = seen[t - 1] if t else []
        for d in seen[t]:
            if d not in earlier and d not in learned:
                learned[d] = ppl[d]  # PPL_j,j: the stage that introduced j has just finished
        rows.append({"stage": stage_number(t), "domains": seen[t], "AP": average_perplexity([ppl[d] for d in seen[t]]),
                     "AP+": average_increased_perplexity(ppl, learned, earlier)})
    return rows


def preservation(stage_domains: Sequence[Sequence[str]], init: Sequence[Mapping[str, float]],
                 final: Sequence[Mapping[str, float]]) -> list[dict]:
    """Init/Final perplexity per stage (bottom of Table 2): the empirical function-preservation check.

    Init of stage t is the grown model before any training; it is compared with the final
    model of stage t-1 on the domains that model had seen, so both numbers average the same
    domains and the gap is what growth changed. Stage 1 has no predecessor: its Init is the
    freshly initialised model on its own domains.
    """
    seen = seen_domains(stage_domains)
    rows = []
    for t in range(min(len(init), len(seen))):
        on = seen[t - 1] if t else seen[0]
        row = {"stage": stage_number(t), "domains": on, "init": average_perplexity([init[t][d] for d in on]),
               "final": None, "previous_final": None, "delta": None, "max_abs_domain_delta": None}
        if t < len(final):
            row["final"] = average_perplexity([final[t][d] for d in seen[t]])
        if t and t - 1 < len(final):
            row["previous_final"] = average_perplexity([final[t - 1][d] for d in on])
            row["delta"] = row["init"] - row["previous_final"]
            row["max_abs_domain_delta"] = max(abs(init[t][d] - final[t - 1][d]) for d in on)
        rows.append(row)
    return rows

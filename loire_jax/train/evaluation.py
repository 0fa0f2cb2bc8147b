"""Evaluation: validation perplexity of a stage's model on every domain seen so far
(PPL_(t),j of App. D.3), at the stage's start ("init", right after growth), at its end
("final") and, from a hook, mid-stage ("step"). The report reads init and final: init of
stage t+1 against final of stage t is the run's function-preservation check.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import numpy as np

from loire_jax.config.run import RunConfig
from loire_jax.config.schedule import prompt_ids, prompt_position, seen_domains_at
from loire_jax.config.stage import stage_number
from loire_jax.errors import RunError
from loire_jax.parallel.sharding import batch_sharding
from loire_jax.train.loop import StageClock
from loire_jax.train.program import Programs


class Evaluator:
    """Evaluates for one session; its ``clock`` (reset at each stage start) counts the time.

    ``emit`` receives one "eval" record per domain; ``stop_point`` is called after each
    domain (a multi-process run may stop there); ``say`` prints the PPL line."""

    def __init__(self, programs: Programs, emit: Callable[[dict[str, Any]], None],
                 stop_point: Callable[[str], None], say: Callable[..., None]) -> None:
        self.programs, self._emit, self._stop_point, self._say = programs, emit, stop_point, say
        self.run_config = programs.run_config
        self.domain_index = {d.name: i for i, d in enumerate(self.run_config.data.domains)}
        self.clock = StageClock()
        # (stage number, domain) -> final perplexity, this session's and (``remember``) the
        # earlier sessions' records: what ELLE's forgetting-weighted replay reads
        self.finals: dict[tuple[int, str], float] = {}
        self.prompts = prompt_ids(self.run_config)  # ELLE's domain prompts, if the run has them

    def remember(self, records: list[dict[str, Any]]) -> None:
        """The final perplexities earlier sessions logged (JSON floats round-trip exactly, so a
        resumed stage weighs its replay as the uninterrupted run did)."""
        for r in records:
            if r.get("kind") == "eval" and r.get("point") == "final":
                self.finals[int(r["stage"]), str(r["domain"])] = float(r["ppl"])

    def evaluate(self, index: int, params: dict[str, Any], point: str, step: int | None = None) -> dict[str, float]:
        """Perplexity of stage ``index``'s model with ``params`` per seen domain; ``point`` is
        "init", "final" or "step" (with ``step``). Each domain's mean loss is over at most
        ``eval.batches`` batches of its validation split, the same ones every time."""
        from loire_jax.data import eval_iterator

        run, n = self.run_config, stage_number(index)
        out = {}
        with self.clock.evaluating():
            for name in seen_domains_at(run, index):
                it = eval_iterator(run.data, self.domain_index[name], seq_len=run.seq_len, batch_size=run.batch_size,
                                   prompt=self.prompts.get(name), prompt_at=prompt_position(run))
                total, count, window = 0.0, 0.0, 0
                for i, batch in enumerate(it):
                    if run.eval.batches and i >= run.eval.batches:
                        break
                    batch = {key: batch[key] for key in ("tokens", "weights")}
                    if self.programs.models[index].encoder:  # masks keyed by (domain, window): fixed per run
                        rows = len(batch["tokens"])
                        batch["window"] = np.arange(window, window + rows, dtype=np.int32)
                        batch["domain"] = np.full((rows,), self.domain_index[name], np.int32)
                        window += rows
                    args = (params, {key: self._replicated_input(value) for key, value in batch.items()})
                    s, c = self.programs.eval_fn(index, args)(*args)
                    total, count = total + float(s), count + float(c)
                if not count > 0:  # exp(0 / 0) would read as a perfect perplexity of 1.00
                    raise RunError(_nothing_scored(run, self.programs.models[index].encoder, n, point, name))
                mean = total / count
                out[name] = math.exp(mean) if mean < 709.0 else math.inf  # exp overflows a float past ~709
                if point == "final":
                    self.finals[n, name] = out[name]
                self._emit({"kind": "eval", "stage": n, "point": point, "domain": name, "ppl": out[name],
                            "tokens": count, **({"step": step} if step is not None else {})})
                self._stop_point(f"stage {n} {point} evaluation")
        where = f"{point} {step}" if step is not None else point
        self._say(f"  [{where}] stage {n} PPL: " + ", ".join(f"{d} {p:.2f}" for d, p in out.items()))
        return out

    def final_evaluated(self, index: int, records: list[dict[str, Any]]) -> bool:
        """Whether ``records`` (the metrics log) hold stage ``index``'s final evaluation on every
        domain seen by then: a run stopped between its final checkpoint and evaluation has not."""
        n = stage_number(index)
        got = {r.get("domain") for r in records if r.get("kind") == "eval" and r.get("stage") == n
               and r.get("point") == "final"}
        return set(seen_domains_at(self.run_config, index)) <= got

    def _replicated_input(self, host: np.ndarray) -> jax.Array:
        """A batch every process holds whole (evaluation data), as a global array split
        over the batch axes: each process contributes the rows its devices hold."""
        mesh = self.programs.mesh
        return jax.make_array_from_callback(host.shape, batch_sharding(mesh, host.ndim), lambda i: host[i])


def _nothing_scored(run: RunConfig, encoder: bool, n: int, point: str, domain: str) -> str:
    """Why an evaluation scored no token, and what gives it some: an encoder masked none of
    its validation windows' tokens; a decoder's validation split has no target."""
    if encoder:
        cause = (f"none of its validation tokens was masked (mlm.rate={run.mlm.rate:g}, seq_len={run.seq_len}, "
                 f"eval.batches={run.eval.batches}); raise mlm.rate, seq_len or eval.batches")
    else:
        cause = "its validation split has no token to predict; give the domain more validation text"
    return (f"stage {n}'s {point} evaluation of domain {domain!r} scored no token, so it has no perplexity: "
            f"{cause}")

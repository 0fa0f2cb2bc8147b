"""Fig. 4 from the same checkpoint: what the growth step alone does.

The Random and Zero systems each train their own trajectory, so their Init after growth
carries where that trajectory already was. Here each growth stage of a finished LOIRE run
starts from the run's own previous Final checkpoint, grows it three ways, the run's exact
operators and Fig. 4's random and zero new weights (``init``; the layer operator stays
LOIRE's, as in the Random and Zero systems), and evaluates each at once, no training, on
the domains the previous model had seen: Init AP per stage and initialisation, what the
comparison's same-checkpoint row pairs (``analysis.claims``). No training run is needed.

The exact growth repeats the run's own (the same plans and keys), so its Init AP is the
run's recorded Init. The numbers are kept beside the run (``growth_contrast.json``), tied
to the checkpoints they were read from, and recomputed only when those change.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

from loire_jax import paths
from loire_jax.config.run import RunConfig
from loire_jax.config.stage import StageConfig, stage_number

FILE = "growth_contrast.json"
INITS = {"exact": None, "random": "random", "zero": "zero"}  # label -> growth method (None: the run's own)


def with_init(run: RunConfig, index: int, init: str) -> RunConfig:
    """``run`` with stage ``index``'s growth (only) filling its new slots with ``init``, as the
    Random and Zero systems do (not exact; the layer operator stays LOIRE's): every earlier
    stage is the run's own, so stage ``index`` grows from the same previous model."""
    def regrow(stage: StageConfig) -> StageConfig:
        return dataclasses.replace(stage, growth=tuple(
            dataclasses.replace(g, init=init, exact=False) if g.op != "layers" else g for g in stage.growth))
    return run.replace(stages=tuple(regrow(s) if k == index else s for k, s in enumerate(run.stages)))


def _digests(run_dir: paths.Path, n: int) -> list[str]:
    from loire_jax.store.checkpoints import stage_digest

    return [stage_digest(run_dir, stage_number(k)) for k in range(n - 1)]


def growth_contrast(run_dir: paths.PathLike, mesh: Any = None, log: Callable[[str], None] = lambda line: None
                    ) -> dict[str, list[float | None]]:
    """Init AP per stage (None at stage 1) for each of ``INITS``, from the run's previous
    Final checkpoints, kept in ``run_dir/growth_contrast.json`` (reused while the
    checkpoints it was read from are unchanged). ``mesh``: where to evaluate (default:
    the run's)."""
    from loire_jax.config.loader import run_config_from_dict

    run_dir = paths.as_path(run_dir)
    run = run_config_from_dict(json.loads((run_dir / "config.json").read_text()), saved=True)
    digests = _digests(run_dir, len(run.stages))
    kept = run_dir / FILE
    if kept.is_file():
        got = json.loads(kept.read_text())
        if got.get("checkpoints") == digests:
            return got["init_AP"]
    init_ap = measure(run, run_dir, mesh, log)
    paths.write_atomic(kept, json.dumps({"checkpoints": digests, "init_AP": init_ap}, indent=1))
    return init_ap


def measure(run: RunConfig, run_dir: paths.Path, mesh: Any = None, log: Callable[[str], None] = lambda line: None
            ) -> dict[str, list[float | None]]:
    """``growth_contrast``'s numbers, computed: every growth stage, grown each way from the
    previous stage's final parameters with the keys the run grew with, evaluated at once."""
    import jax

    from loire_jax.analysis.metrics import average_perplexity
    from loire_jax.config.mesh import parse_mesh
    from loire_jax.config.schedule import seen_domains_at, stage_vocab
    from loire_jax.errors import RunError
    from loire_jax.parallel.sharding import make_mesh, param_shardings
    from loire_jax.store.checkpoints import restore_params, stage_dir
    from loire_jax.train.evaluation import Evaluator
    from loire_jax.train.program import Programs

    mesh = make_mesh(parse_mesh(run.mesh)) if mesh is None else mesh
    special = _special_tokens(run)
    out: dict[str, list[float | None]] = {label: [None] for label in INITS}
    for index in range(1, len(run.stages)):
        if stage_vocab(run, index) != stage_vocab(run, index - 1):
            raise RunError(f"stage {stage_number(index)} adds tokens (domain prompts): the growth contrast grows "
                           "LOIRE's runs, which add none")
        before = seen_domains_at(run, index - 1)
        key = jax.random.fold_in(jax.random.key(run.seed), 1000 * stage_number(index))  # as the run grew it
        prev = None
        evaluators: dict[str, Evaluator] = {}  # grown model -> its evaluator: one compiled evaluation each
        for label, method in INITS.items():  # the run's own plans, then random and zero slots
            programs = Programs(with_init(run, index, method) if method else run, mesh, lambda r: None,
                                lambda where: None)
            if special is not None:
                programs.set_masking(special)
            if prev is None:
                prev = restore_params(stage_dir(run_dir, stage_number(index - 1)), programs.abstract(index - 1).params)
            model = programs.models[index]
            params = _grown(tuple(programs.plans[index]), prev, key, param_shardings(model, mesh))
            evaluator = evaluators.setdefault(repr(model), Evaluator(programs, lambda r: None, lambda where: None,
                                                               lambda *a, **k: None))
            ppl = evaluator.evaluate(index, params, "init")
            out[label].append(average_perplexity([ppl[d] for d in before]))
            log(f"stage {stage_number(index)} {label}: Init AP {out[label][-1]:.3f}")
    return out


def _grown(plans: tuple, params: Any, key: Any, shardings: Any) -> Any:
    """``params`` grown by ``plans`` (plan i drawing from ``fold_in(key, i)``, as the trainer
    grows them), as one compiled program laid out as ``shardings`` (op by op, each random
    draw compiled on its own, it took several times as long); a method that picks on the
    host (``GrowthMethod.eager``) runs eagerly."""
    import jax

    from loire_jax.config.growth_methods import growth_method
    from loire_jax.growth.transforms import grow_like

    def grow(plans: tuple, params: Any, key: Any) -> Any:
        for i, plan in enumerate(plans):
            params = grow_like(plan, params, jax.random.fold_in(key, i))
        return params

    if any(growth_method(plan.init).eager for plan in plans):
        return jax.device_put(grow(plans, params, key), shardings)
    return jax.jit(grow, static_argnums=0, out_shardings=shardings)(plans, params, key)


def _special_tokens(run: RunConfig) -> Any:
    """An encoder's special tokens (its evaluation masks need them); None for a decoder."""
    if not run.model.encoder:
        return None
    from loire_jax.data import load_tokenizer
    from loire_jax.data.special import special_tokens

    return special_tokens(load_tokenizer(run.data, build=False), run.model.vocab_size)

"""The models a run trains, M1 to Mn: each stage's growth planned from the model before it
(eq. 14), with the vocabulary that its domains' prompts add.

Why here, below both ``config.run`` and ``config.schedule``: the run checks its growth when
built, and the schedule hands the same plans to the trainer. The functions take the run's
parts (M1, the stages, whether domains have prompts), never the run itself, so neither of
those modules is imported and there is no cycle.
"""

from __future__ import annotations

from typing import Sequence

from loire_jax.config.growth_methods import plan_growth
from loire_jax.config.growth_plan import GrowthPlan
from loire_jax.config.model import ModelConfig
from loire_jax.config.stage import StageConfig, model_name, seen_domains
from loire_jax.errors import ConfigError


def stage_vocab_size(model: ModelConfig, stages: Sequence[StageConfig], domain_prompts: bool, k: int) -> int:
    """Stage ``k``'s vocabulary: M1's, plus the prompts of the domains seen by then."""
    if not domain_prompts:
        return model.vocab_size
    return model.vocab_size + len(seen_domains([s.domains for s in stages])[k])


def _with_prompts(model: ModelConfig, stages: Sequence[StageConfig], domain_prompts: bool, k: int,
                  cfg: ModelConfig) -> ModelConfig:
    return cfg.replace(vocab_size=stage_vocab_size(model, stages, True, k)) if domain_prompts else cfg


def plan_lineage(model: ModelConfig, stages: Sequence[StageConfig],
                 domain_prompts: bool) -> list[tuple[GrowthPlan, ...]]:
    """Every stage's growth plans, in order; raises ConfigError naming the stage on bad growth.

    ``last_gate`` follows the gates: growth at a stage start sees every earlier gate ramped
    to 1 (``gate_ramp_steps <= steps``), but a layer copy made earlier in the same stage
    starts at 0, which matters to tied post-norm hidden duplication.
    """
    cfg = model
    plans: list[tuple[GrowthPlan, ...]] = []
    for i, stage in enumerate(stages):
        last_gate = 1.0
        stage_plans = []
        cfg = _with_prompts(model, stages, domain_prompts, i, cfg)  # the new domains' prompts join before the growth
        for j, g in enumerate(stage.growth):
            try:
                plan = plan_growth(cfg, g.op, g.size, init=g.init, exact=g.exact, method=g.method,
                                   positions=g.positions, mode=g.mode, last_gate=last_gate, noise=g.noise,
                                   gate=g.gate)
            except ValueError as err:
                raise ConfigError(f"stages.{model_name(i)} ({stage.name!r}) growth.{j} ({g.op} -> {g.size}): "
                                  f"{err}") from None
            if plan.op == "layers" and plan.gate == "closed" and (
                    plan.mode == "stack" or cfg.layers - 1 in plan.positions):
                last_gate = 0.0  # the new last layer is a fresh copy with alpha = 0
            stage_plans.append(plan)
            cfg = plan.new
        plans.append(tuple(stage_plans))
    return plans


def lineage_models(model: ModelConfig, stages: Sequence[StageConfig], domain_prompts: bool) -> list[ModelConfig]:
    """The model each stage trains: M1, then each stage's growth applied in turn (eq. 14)."""
    cfg = model
    models = []
    for i, plans in enumerate(plan_lineage(model, stages, domain_prompts)):
        cfg = plans[-1].new if plans else _with_prompts(model, stages, domain_prompts, i, cfg)
        models.append(cfg)
    return models

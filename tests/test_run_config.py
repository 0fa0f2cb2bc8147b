"""Run configuration: presets, overrides, round trip, rejection before compute, resume rules."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from loire_jax.config.data import DataConfig, DomainSpec, SourceSpec, TokenizerSpec
from loire_jax.config.loader import apply_overrides, load_run_config, run_config_from_dict
from loire_jax.config.model import ModelConfig
from loire_jax.config.optimizer import OptimizerConfig
from loire_jax.config.run import RunConfig, validate
from loire_jax.config.schedule import replay_domains, seen_domains_at, stage_models, teacher_stages
from loire_jax.config.stage import GrowthSpec, StageConfig, model_name, seen_domains
from loire_jax.errors import ConfigError
from loire_jax.store.resume import history_compatible

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
TINY = CONFIGS / "tiny.yaml"


def tiny(*overrides: str) -> RunConfig:
    return load_run_config(TINY, list(overrides))


def refusal(*overrides: str) -> str:
    """The message ``tiny(*overrides)`` is refused with; every refusal is one line."""
    with pytest.raises(ValueError) as err:
        tiny(*overrides)
    message = str(err.value)
    assert "\n" not in message, message
    return message


def shapes(run: RunConfig) -> list[tuple[int, int, int, int]]:
    return [(m.hidden, m.ffn, m.heads, m.layers) for m in stage_models(run)]


# --------------------------------------------------------------------------- presets
@pytest.mark.parametrize("name", ["tiny", "tiny_gpt2", "gpt_paper", "gpt_1b"])
def test_presets_load_validate_and_round_trip_through_json(name):
    run = load_run_config(CONFIGS / f"{name}.yaml")
    assert run.name == name
    assert [s.domains[0] for s in run.stages] == ["WB", "NEWS", "REV", "BIO", "CS"]
    assert [g.op for s in run.stages for g in s.growth] == ["hidden", "ffn", "heads", "layers"]
    saved = json.loads(json.dumps(run.to_dict()))
    assert run_config_from_dict(saved) == run
    validate(run, {"data": 1, "fsdp": 8, "tensor": 1})


def test_loire_gpt2_starts_from_the_general_runs_model_in_gpt2_layout():
    plm, run = load_run_config(CONFIGS / "tiny_gpt2_general.yaml"), load_run_config(CONFIGS / "tiny_gpt2.yaml")
    assert run.model == plm.model and run.model.activation == "gelu_tanh" and run.model.norm_position == "pre"
    assert run.stages[0].init_from == f"runs/{plm.name}/stage_1" and not any(s.init_from for s in run.stages[1:])
    assert plm.stages[0].domains == ("WB", "NEWS", "REV", "BIO", "CS")  # the general mixture
    assert run.data == plm.data  # one tokenizer for both


def test_a_run_whose_m1_an_override_starts_elsewhere_is_named_for_it_and_a_preset_run_keeps_its_name():
    """``--config tiny_gpt2 stages.M1.init_from=gpt2`` is not the preset's run (M1 from the
    general run's stage 1): its name, and so its default workdir runs/<name>, say where M1
    came from. The presets as written, and a name given on the command line, keep theirs."""
    from loire_jax.store.workdir import default_workdir

    assert load_run_config("tiny_gpt2").name == "tiny_gpt2" and load_run_config("tiny").name == "tiny"
    named = {o: load_run_config("tiny_gpt2", [o]).name for o in (
        "stages.M1.init_from=gpt2", "stages.M1.init_from=openai-community/gpt2@main",
        "stages.M1.init_from=runs/tiny_gpt2_plm/", "stages.M1.init_from=runs/other/stage_1",
        "stages.M1.init_from=runs/tiny_gpt2_general/stage_1", "stages.M1.init_from=''")}
    assert named == {"stages.M1.init_from=gpt2": "tiny_gpt2-from-gpt2",
                     "stages.M1.init_from=openai-community/gpt2@main": "tiny_gpt2-from-gpt2_main",
                     "stages.M1.init_from=runs/tiny_gpt2_plm/": "tiny_gpt2-from-tiny_gpt2_plm",
                     "stages.M1.init_from=runs/other/stage_1": "tiny_gpt2-from-other-stage_1",
                     "stages.M1.init_from=runs/tiny_gpt2_general/stage_1": "tiny_gpt2",  # what the preset says
                     "stages.M1.init_from=''": "tiny_gpt2-from-scratch"}
    assert default_workdir(named["stages.M1.init_from=gpt2"]) == "runs/tiny_gpt2-from-gpt2"
    assert load_run_config("tiny_gpt2", ["stages.M1.init_from=gpt2", "name=mine"]).name == "mine"
    assert load_run_config("mini", ["stages.M1.init_from=runs/plm/stage_1"]).name == "mini-from-plm-stage_1"


def test_only_the_first_stage_may_start_from_a_checkpoint():
    assert "stage 'M3-REV' is not the first stage: only M1 starts from init_from weights" in refusal(
        "stages.M3.init_from=runs/x/stage_1")


def test_gpt_paper_is_table_1_with_app_d1_schedule():
    run = load_run_config(CONFIGS / "gpt_paper.yaml")
    assert shapes(run) == [(384, 1024, 6, 6), (768, 1024, 6, 6), (768, 2048, 6, 6), (768, 2048, 12, 6),
                           (768, 2048, 12, 12)]
    assert run.model.vocab_size == 50257 and run.model.head_dim == 64 and run.optimizer.name == "adam"
    for stage in run.stages[1:]:
        assert (stage.steps, stage.warmup_steps, stage.gate_ramp_steps) == (20000, 5000, 5000)
        assert (stage.beta, stage.beta_steps, stage.teachers) == (0.1, 1000, "all")
    assert run.stages[0].steps == 20000 and not run.stages[0].distills


@pytest.mark.parametrize("name,domains", [("bert_paper", ["WIKI"] * 5), ("bert_paper_5domain",
                                                                          ["WB", "NEWS", "REV", "BIO", "CS"])])
def test_bert_paper_is_table_1s_encoder_schedule(name, domains):
    """LOIRE-Bert (Table 1, App. D.2): a RoBERTa encoder grown (384,1024,6,6) -> (768,2048,12,12),
    20k steps a stage, warmup 5k, gate ramp 5k, beta 0.1 for 1k steps, Adam, BERT's masking;
    on Wikipedia alone or on the five domains. Its vocabulary holds GPT-2's ids and three specials."""
    run = load_run_config(CONFIGS / f"{name}.yaml")
    assert run.model.encoder and run.model.position_offset == 2 and run.model.vocab_size == 50260
    assert shapes(run) == [(384, 1024, 6, 6), (768, 1024, 6, 6), (768, 2048, 6, 6), (768, 2048, 12, 6),
                           (768, 2048, 12, 12)]
    assert [s.domains[0] for s in run.stages] == domains and run.optimizer.name == "adam"
    for stage in run.stages[1:]:
        assert (stage.steps, stage.warmup_steps, stage.gate_ramp_steps) == (20000, 5000, 5000)
        assert (stage.beta, stage.beta_steps, stage.teachers) == (0.1, 1000, "all")
    assert (run.mlm.rate, run.mlm.mask, run.mlm.random) == (0.15, 0.8, 0.1)
    assert run_config_from_dict(json.loads(json.dumps(run.to_dict()))) == run
    validate(run, {"data": 1, "fsdp": 8, "tensor": 1})
    with pytest.raises(ConfigError, match="no room for an encoder's special tokens.*50260"):
        load_run_config(CONFIGS / f"{name}.yaml", ["model.vocab_size=50257"])


def test_bert_tiny_is_tiny_with_an_encoder():
    run, base = load_run_config(CONFIGS / "bert_tiny.yaml"), tiny()
    assert run.model.encoder and run.model.vocab_size == 8194 and shapes(run) == shapes(base)
    assert run.stages == base.stages and run.data == base.data
    with pytest.raises(ConfigError, match="rate must lie in \\(0, 1\\)"):
        load_run_config(CONFIGS / "bert_tiny.yaml", ["mlm.rate=0"])


def test_gpt_1b_is_table_3():
    run = load_run_config(CONFIGS / "gpt_1b.yaml")
    assert shapes(run) == [(1024, 3072, 16, 12), (2048, 3072, 16, 12), (2048, 6144, 16, 12),
                           (2048, 6144, 32, 12), (2048, 6144, 32, 24)]
    assert run.model.head_dim == 64


def test_tiny_doubles_each_dimension_in_turn_and_fits_fsdp_8():
    run = tiny()
    assert shapes(run) == [(64, 256, 4, 2), (128, 256, 4, 2), (128, 512, 4, 2), (128, 512, 8, 2), (128, 512, 8, 4)]
    assert run.mesh_sizes == {"data": 1, "fsdp": 8, "tensor": 1}
    assert run.model.vocab_size == run.data.tokenizer.vocab_size == 8192
    assert teacher_stages(run, 4) == (0, 1, 2, 3) and replay_domains(run, 2) == ("WB", "NEWS")


def test_precision_sets_model_dtypes():
    assert (tiny().model.dtype, tiny().model.param_dtype) == ("float32", "float32")
    bf = tiny("precision=bf16")
    assert (bf.model.dtype, bf.model.param_dtype) == ("bfloat16", "float32")
    with pytest.raises(ValueError, match="set precision instead"):
        tiny("model.dtype=bfloat16")


# --------------------------------------------------------------------------- overrides
def test_overrides_are_typed_dotted_and_indexed():
    run = tiny("optimizer.lr=1e-3", "stages.M3.steps=50", "seed=3", "batch_size=32", "optimizer.clip_norm=null",
               "stages.M2.growth.0.size=256", "stages.M5.domains=[CS, WB]", "model.layers=4",
               "stages.M5.growth.0.size=8")
    assert run.optimizer.lr == 1e-3 and isinstance(run.optimizer.lr, float)
    assert run.stages[2].steps == 50 and run.stages[1].steps == 40
    assert (run.seed, run.batch_size, run.optimizer.clip_norm) == (3, 32, None)
    assert run.stages[4].domains == ("CS", "WB")
    assert shapes(run)[1] == (256, 256, 4, 4) and shapes(run)[-1][3] == 8


def test_overrides_reach_inlined_data_and_stage_defaults():
    run = tiny("data.data_dir=/tmp/elsewhere", "stage_defaults.steps=30")
    assert run.data.data_dir == "/tmp/elsewhere"
    assert [s.steps for s in run.stages] == [30] * 5


@pytest.mark.parametrize("override,needle", [
    ("optimizer.lrr=1", "unknown key 'lrr' in optimizer; valid keys are"),
    ("bogus=1", "unknown key 'bogus' in the top level"),
    ("stages.M6.steps=1", "which has M1..M5"),
    ("stages.M2.stepz=1", "unknown key 'stepz' in stages.M2"),
    ("model.hiden=8", "'hidden'"),
    ("seed", "expected key=value"),
])
def test_bad_override_keys_fail_listing_valid_ones(override, needle):
    assert needle in refusal(override)


def keys(cls: type, *extra: str, drop: tuple[str, ...] = ()) -> list[str]:
    return sorted({f.name for f in dataclasses.fields(cls)} - set(drop) | set(extra))


@pytest.mark.parametrize("override,where,valid", [
    ("bogus=1", "the top level", keys(RunConfig, "stage_defaults", drop=("model_preset",))),
    ("model.hiden=8", "model", keys(ModelConfig, "preset")),
    ("optimizer.lrr=1", "optimizer", keys(OptimizerConfig)),
    ("stage_defaults.stepz=1", "stage_defaults", keys(StageConfig)),
    ("stages.M2.stepz=1", "stages.M2", keys(StageConfig)),
    ("stages.M2.growth.0.sze=3", "stages.M2.growth.0", keys(GrowthSpec)),
    ("data.typo=1", "data", keys(DataConfig)),
    ("data.tokenizer.kindd=gpt2", "data.tokenizer", keys(TokenizerSpec)),
    ("data.domains.2.sourc=x", "data.domains.2", keys(DomainSpec)),
    ("data.domains.0.source.pathz=[a]", "data.domains.0.source", keys(SourceSpec)),
])
def test_an_unknown_override_key_at_any_depth_lists_the_valid_keys(override, where, valid):
    key = override.split("=")[0].rsplit(".", 1)[-1]
    assert f"unknown key {key!r} in {where}; valid keys are {valid}" in refusal(override)


def write_run(tmp_path: Path, text: str, domains: str | None = None) -> Path:
    """tiny.yaml, edited, in tmp_path; its data points at ``domains`` or the shipped default."""
    data = tmp_path / "domains.yaml"
    data.write_text(domains if domains is not None else (CONFIGS / "domains" / "default.yaml").read_text())
    path = tmp_path / "run.yaml"
    path.write_text(text.replace("data: domains/default.yaml", "data: domains.yaml"))
    return path


def test_an_unknown_yaml_key_at_any_depth_lists_the_valid_keys(tmp_path):
    text = TINY.read_text()
    growth = "growth: [{op: hidden, size: 128}]"
    assert growth in text
    with pytest.raises(ValueError) as err:
        load_run_config(write_run(tmp_path, text.replace(growth, "growth: [{op: hidden, sze: 128}]")))
    assert f"unknown key 'sze' in stages.M2.growth.0; valid keys are {keys(GrowthSpec)}" in str(err.value)
    # in the domains YAML the run config names, reported at its place in the run config
    domains = (CONFIGS / "domains" / "default.yaml").read_text().replace("corpus: news}", "corpus: news, pathz: x}")
    with pytest.raises(ValueError) as err:
        load_run_config(write_run(tmp_path, text, domains))
    assert f"unknown key 'pathz' in data.domains.1.source; valid keys are {keys(SourceSpec)}" in str(err.value)
    assert "\n" not in str(err.value)


def test_numbers_are_typed_in_yaml_and_overrides(tmp_path):
    text = TINY.read_text()
    assert "lr: 1.0e-3" in text
    run = load_run_config(write_run(tmp_path, text.replace("lr: 1.0e-3", "lr: 1e-3")))  # a string to YAML 1.1
    assert run.optimizer.lr == 1e-3 and isinstance(run.optimizer.lr, float)
    assert isinstance(tiny("optimizer.lr=1e-3").optimizer.lr, float)
    assert tiny("optimizer.lr=1").optimizer.lr == 1.0 and isinstance(tiny("optimizer.lr=1").optimizer.lr, float)
    assert tiny("mesh=4").mesh == "4"


@pytest.mark.parametrize("override,needle", [
    ("stages.M6.steps=1", "stages.M6 is not a stage of this run, which has M1..M5 (counted from 1, as in the logs)"),
    ("stages.M2.growth.1.size=3", "stages.M2.growth.1 is not an index of stages.M2.growth, which has 1 entry (0)"),
    ("stages.first.steps=1", "stages.first is not a stage of this run, which has M1..M5"),
    ("stages.M0.steps=1", "stages.M0 is not a stage of this run, which has M1..M5"),
    ("stages.M1.growth.0.size=3", "stages.M1.growth is not set, so it has no entry 0"),
])
def test_an_index_out_of_range_names_the_valid_range(override, needle):
    assert needle in refusal(override)


def test_a_stage_is_named_as_the_logs_count_it():
    """``stages.M2`` is stage 2, which the logs call ``stage 2 (M2-NEWS)`` and whose
    checkpoints are in ``stage_2``: counted from 1, through the same ``model_name``."""
    run = tiny("stages.M2.steps=17", "stages.M5.teachers=last")
    assert [s.steps for s in run.stages] == [40, 17, 40, 40, 40]
    assert run.stages[1].name == "M2-NEWS" and model_name(1) == "M2"
    assert [s.teachers for s in run.stages][-2:] == ["all", "last"]


@pytest.mark.parametrize("override,needle", [
    ("stages.1.steps=7", "stages.1 is ambiguous: overrides name a stage as the logs do (this run has M1..M5), not by a "
                         "number, which once counted from 0; write stages.M1 for stage 1 or stages.M2 for stage 2"),
    ("stages.0.steps=7", "write stages.M1 for stage 1"),
    ("stages.5.growth.0.size=8", "write stages.M5 for stage 5"),
    ("stages.9.steps=7", "stages.9 is ambiguous"),
    ("stages.-1.steps=7", "stages.-1 is not a stage of this run, which has M1..M5"),
])
def test_a_stage_by_number_is_refused_not_read_either_way(override, needle):
    """Overrides counted stages from 0 before (stages.1 was M2): a number is refused in one
    line naming both readings, so an old command never silently changes another stage."""
    assert needle in refusal(override)  # one line: refusal checks it


@pytest.mark.parametrize("override,needle", [
    ("stages.M2.steps=abc", "stages.M2.steps: Input should be a valid integer"),
    ("data.domains.0.source.max_documents=many",
     "data.domains.0.source.max_documents: Input should be a valid integer"),
    ("optimizer.clip_norm=[1]", "optimizer.clip_norm: Input should be a valid number"),
    ("stages.M2.growth.0=7", "stages.M2.growth.0: Input should be a dictionary"),
    ("precision=fp8", "precision: Input should be 'float32', 'bf16' or 'float64'"),
])
def test_a_wrong_type_names_the_field_path(override, needle):
    assert needle in refusal(override)


def test_missing_keys_and_default_stage_names():
    raw = tiny().to_dict()
    with pytest.raises(ValueError, match="missing required key 'stages' in the top level"):
        run_config_from_dict({k: v for k, v in raw.items() if k != "stages"})
    unnamed = [{k: v for k, v in s.items() if k != "name"} for s in raw["stages"]]
    assert [s.name for s in run_config_from_dict({**raw, "stages": unnamed}).stages] == ["M1", "M2", "M3", "M4", "M5"]


def test_importing_the_run_config_and_loader_pulls_in_no_data_library():
    heavy = ("grain", "tensorflow_datasets", "tiktoken", "sentencepiece")
    code = ("import sys, loire_jax.config.run, loire_jax.config.loader; "
            f"print([m for m in {heavy!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_stage_domains_teachers_and_replay_follow_one_seen_order():
    run = tiny("stages.M2.domains=[NEWS, WB]", "stages.M3.domains=[REV, BIO]", "stages.M4.teachers=last")
    seen = seen_domains([s.domains for s in run.stages])
    assert [seen_domains_at(run, k) for k in range(5)] == [tuple(d) for d in seen]
    assert seen_domains_at(run, 2) == ("WB", "NEWS", "REV", "BIO")
    assert replay_domains(run, 0) == () and replay_domains(run, 3) == seen_domains_at(run, 2)
    assert teacher_stages(run, 0) == () and teacher_stages(run, 3) == (2,) and teacher_stages(run, 4) == (0, 1, 2, 3)
    with pytest.raises(IndexError, match="outside 0..4"):
        seen_domains_at(run, 5)


def test_apply_overrides_leaves_the_input_alone():
    raw = {"name": "x", "optimizer": {"lr": 1.0}}
    out = apply_overrides(raw, ["optimizer.lr=2", "checkpoint.keep=3"])
    assert raw == {"name": "x", "optimizer": {"lr": 1.0}} and out["optimizer"]["lr"] == 2
    assert out["checkpoint"] == {"keep": 3}


# --------------------------------------------------------------------------- rejection
def test_shrinking_growth_is_rejected_naming_the_stage():
    with pytest.raises(ValueError, match=r"stages\.M3 \('M3-REV'\).*cannot shrink or keep ffn"):
        tiny("stages.M3.growth.0.size=128")


def test_first_stage_cannot_grow_or_distil():
    with pytest.raises(ValueError, match="first stage"):
        tiny("stages.M1.growth=[{op: ffn, size: 512}]")
    with pytest.raises(ValueError, match="first stage"):
        tiny("stages.M1.teachers=all")


@pytest.mark.parametrize("overrides,needle", [
    (["domain_prompts=true"], r"domain_prompts: stage 'M2-NEWS' grows the vocabulary, whose optimizer state does "
     "not grow: set reset_optimizer: true"),
    (["domain_prompts=true", "stage_defaults.reset_optimizer=true", "stages.M3.teachers=all",
      "stages.M3.beta=0.1", "stages.M3.beta_steps=2", "stages.M3.warmup_steps=2"],
     "domain_prompts: stage 'M3-REV' distils, but its teachers' vocabularies lack the later prompts"),
    (["domain_prompts=3"], "domain_prompts: Input should be a valid boolean"),
])
def test_domain_prompts_are_checked_in_one_line(overrides, needle):
    with pytest.raises(ValueError, match=needle) as err:
        tiny(*overrides)
    assert "\n" not in str(err.value)


def bert_tiny(*overrides: str) -> RunConfig:
    return load_run_config(CONFIGS / "bert_tiny.yaml", list(overrides))


@pytest.mark.parametrize("overrides,needle", [
    (["seq_len=1"], "seq_len=1 leaves an encoder no position to mask (position 0 is [CLS]); set it to at least 2"),
    (["model.max_seq_len=1", "seq_len=1"], "model.max_seq_len=1 leaves an encoder no position to mask"),
    (["domain_prompts=true", "seq_len=2"], "seq_len=2 leaves an encoder no position to mask (position 0 is [CLS] "
     "and 1 the domain prompt); set it to at least 3"),
    (["mlm.rate=1e-9"], "mlm.rate=1e-09 masks 1e-06 tokens of a batch on average (rate x 63 maskable positions x "
     "batch_size 16), so steps and evaluations would score no token; raise mlm.rate to at least 0.001"),
    (["mlm.rate=0.00099"], "raise mlm.rate to at least 0.001"),
    (["mlm.rate=0.1", "seq_len=2", "batch_size=8"], "raise mlm.rate to at least 0.13"),
])
def test_an_encoder_that_cannot_mask_a_token_is_refused_before_compute(overrides, needle):
    """Issue 43: a masked-LM loss and perplexity over no masked token read as 0.000 and 1.00."""
    with pytest.raises(ConfigError) as err:
        bert_tiny(*overrides)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_the_masking_bound_is_the_one_the_refusal_quotes():
    assert bert_tiny("mlm.rate=0.001").mlm.rate == 0.001  # 0.001 x 63 x 16 = 1.008 masked tokens a batch
    assert bert_tiny("mlm.rate=0.13", "seq_len=2", "batch_size=8").seq_len == 2  # 1.04 a batch
    assert tiny("seq_len=1").seq_len == 1  # a decoder's window of one token still has a target


LIGO = ["stages.M3.growth.0.init=ligo", "stages.M3.reset_optimizer=true", "stages.M3.teachers=none", "stages.M3.beta=0"]


@pytest.mark.parametrize("overrides,needle", [
    (LIGO, r"init: ligo needs 0 < ligo_steps < steps=40 .*got ligo_steps=0"),
    ([*LIGO, "stages.M3.ligo_steps=40"], r"init: ligo needs 0 < ligo_steps < steps=40"),
    (["stages.M3.ligo_steps=3"], "ligo_steps=3 trains LiGO's operator, but the stage has no growth of init: ligo"),
    ([*LIGO[:1], *LIGO[2:], "stages.M3.ligo_steps=3"],
     r"init: ligo grows no optimizer state \(it materialises new weights after its operator phase\): "
     "set reset_optimizer: true"),
    ([*LIGO[:2], "stages.M3.ligo_steps=3"], "a stage growing by init: ligo trains without teachers or a recovering warmup"),
    ([*LIGO, "stages.M3.ligo_steps=3", "stages.M3.growth.0.noise=-1"], "noise must be a finite number >= 0"),
    ([*LIGO, "stages.M3.ligo_steps=3", "stages.M3.growth.0.positions=[0]"],
     "positions and mode do not apply|positions apply to layer growth only"),
])
def test_ligos_settings_are_checked_in_one_line(overrides, needle):
    with pytest.raises(ValueError, match=needle) as err:
        tiny(*overrides)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("overrides,needle", [
    (["stages.M3.growth.0.init=elle", "stages.M3.growth.0.noise=-0.1", "stages.M3.reset_optimizer=true"],
     r"noise must be a finite number >= 0 \(the std of init: elle's noise\), got -0.1"),
    (["stages.M3.growth.0.noise=0.01"], "noise applies to init: elle or ligo only, not init: loire"),
    (["stages.M3.growth.0.init=elle"], "init: elle grows no optimizer state .*: set reset_optimizer: true"),
    (["stages.M3.growth=[{op: ffn, size: 512, init: elle}, {op: heads, size: 8}]", "stages.M3.reset_optimizer=true"],
     "growth mixes ELLE's expansion"),
    (["stages.M1.recover_steps=2", "stages.M1.recovery=start"],
         "has no earlier domains to recover on: set recover_steps to 0"),
    (["stages.M3.recover_steps=41"], "recover_steps=41 is longer than the stage's steps=40"),
    (["stages.M3.growth.0.init=elle", "stages.M3.growth.0.mode=stack", "stages.M3.reset_optimizer=true"],
     "mode applies to layer growth only|ELLE inserts each layer copy"),
])
def test_elles_settings_are_checked_in_one_line(overrides, needle):
    with pytest.raises(ValueError, match=needle) as err:
        tiny(*overrides)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("overrides,needle", [
    (["stages.M5.growth.0.gate=ajar"], r"gate must be one of \('closed', 'open'\), got 'ajar'"),
    (["stages.M3.growth.0.gate=open"], "gate: open applies to layer growth only .*, not op: ffn"),
    (["stages.M5.growth.0.gate=open", "stages.M5.growth.0.init=elle", "stages.M5.reset_optimizer=true"],
     "init: elle makes no gated layer .*: drop gate"),
])
def test_a_layer_gate_is_checked_in_one_line(overrides, needle):
    with pytest.raises(ValueError, match=needle) as err:
        tiny(*overrides)
    assert "\n" not in str(err.value)


def test_layer_copies_born_open_are_planned_as_not_function_preserving_and_do_not_ramp():
    from loire_jax.config.schedule import growth_plans
    from loire_jax.growth.transforms import ramp_layers

    closed, opened = (growth_plans(tiny("stages.M5.growth.0.mode=stack", *extra))[4]
                      for extra in ([], ["stages.M5.growth.0.gate=open"]))
    assert closed[0].function_preserving and ramp_layers(closed) == (2, 3)
    assert not opened[0].function_preserving and "open" in opened[0].reason and ramp_layers(opened) == ()


def test_mesh_that_does_not_divide_is_rejected_naming_stage_and_dim():
    with pytest.raises(ValueError, match=r"stages\.M1 \('M1-WB'\).*not divisible by mesh axis fsdp=3"):
        tiny("mesh=3")
    run = tiny()
    with pytest.raises(ValueError, match=r"stages\.M1 \('M1-WB'\).*attn/.* not divisible by mesh axis tensor=3"):
        validate(run, "data=1,fsdp=1,tensor=3")
    with pytest.raises(ValueError, match=r"batch_size=16 is not divisible by microbatches x data x fsdp = 1 x 32"):
        validate(run, {"data": 4, "fsdp": 8, "tensor": 1})
    with pytest.raises(ValueError, match=r"batch_size=16 is not divisible by microbatches x data x fsdp = 4 x 8"):
        validate(tiny("microbatches=4"), "8")
    validate(tiny("microbatches=2"), "8")


def test_paper_vocab_is_padded_for_tensor_parallelism():
    """GPT-2's 50,257 is prime: the default padding (to 50,304) lets tensor=2 shard it."""
    run = load_run_config(CONFIGS / "gpt_paper.yaml", ["mesh=data=2,tensor=2"])
    assert (run.model.vocab_size, run.model.padded_vocab) == (50257, 50304)
    with pytest.raises(ValueError, match="set model.pad_vocab_to=128 for tensor=2"):
        load_run_config(CONFIGS / "gpt_paper.yaml", ["mesh=data=2,tensor=2", "model.pad_vocab_to=1"])


def test_unknown_domain_is_rejected():
    with pytest.raises(ValueError, match=r"stages\.M4 \('M4-BIO'\): unknown domain\(s\) \['LAW'\]"):
        tiny("stages.M4.domains=[LAW]")
    with pytest.raises(ValueError, match=r"unknown domain\(s\) \['CS'\]"):
        validate(tiny(), known_domains={"WB", "NEWS", "REV", "BIO"})


@pytest.mark.parametrize("override,needle", [
    ("stages.M2.beta_steps=20", "beta_steps=20 exceeds warmup_steps=12"),
    ("stages.M2.gate_ramp_steps=41", "gate_ramp_steps=41 is longer than the stage's steps=40"),
    ("stages.M2.teachers=none", "needs teachers"),
    ("stages.M2.replay_ratio=1.0", "replay_ratio must be in [0, 1)"),
    ("seq_len=256", "seq_len=256 exceeds model.max_seq_len=128"),
    ("model.vocab_size=4096", "smaller than the trained_bpe tokenizer's 8192"),
    ("optimizer.weight_decay=0.1", "needs name: adamw"),
    ("stages.M2.name=M1-WB", "stage names must be unique"),
    ("mesh=fsdp=x", "bad mesh spec"),
])
def test_inconsistent_fields_are_rejected_with_the_field_named(override, needle):
    assert needle in refusal(override)


def test_dataclasses_validate_when_built():
    with pytest.raises(ValueError, match="op must be one of"):
        GrowthSpec(op="width", size=8)
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        StageConfig(name="s", domains=("WB",), steps=0)
    with pytest.raises(ValueError, match="schedule must be one of"):
        OptimizerConfig(schedule="step")
    assert OptimizerConfig(name="adamw", weight_decay=0.1).weight_decay == 0.1
    assert OptimizerConfig(lr=1e-3).lr == 1e-3


def _data(**fields) -> DataConfig:
    return DataConfig(domains=(DomainSpec("WB", SourceSpec("builtin", corpus="wb")),), **fields)


@pytest.mark.parametrize("build,needle", [
    (lambda: _data(split_seed=True), "split_seed must be"),
    (lambda: _data(validation_docs=True), "validation_docs must be"),
    (lambda: _data(min_doc_chars=True), "min_doc_chars must be"),
    (lambda: _data(recovery_fraction=True), "recovery_fraction must be"),
    (lambda: SourceSpec("builtin", corpus="wb", max_documents=True), "max_documents must be a positive integer"),
    (lambda: TokenizerSpec(vocab_size=True), "vocab_size must be"),
    (lambda: ModelConfig(position="rope", rope_scaling="llama3", rope_original_max_len=True),
     "rope_original_max_len must be"),
])
def test_a_dataclass_built_by_hand_refuses_a_boolean_for_a_number(build, needle):
    """What the loader refuses (tests/test_hostile_inputs.py), the dataclasses refuse too."""
    with pytest.raises(ValueError, match=needle):
        build()


def test_exactness_is_enforced_unless_waived():
    with pytest.raises(ValueError, match="no exact hidden growth"):
        tiny("stages.M2.growth.0.method=paper")
    run = tiny("stages.M2.growth.0.method=paper", "stages.M2.growth.0.exact=false")
    assert shapes(run)[1] == (128, 256, 4, 2)


# --------------------------------------------------------------------------- resume
def test_history_compatible_refuses_changes_to_what_already_ran():
    saved = tiny()
    assert history_compatible(saved, tiny(), 2) is None
    for override, field in [("model.hidden=32", "model.hidden"), ("seed=1", "seed"), ("batch_size=32", "batch_size"),
                            ("stages.M2.steps=70", "stages.M2.steps"), ("optimizer.lr=0.01", "optimizer.lr"),
                            ("data.validation_docs=10", "data.validation_docs"), ("precision=bf16", "precision")]:
        reason = history_compatible(saved, tiny(override), completed_stages=2)
        assert reason is not None and field in reason, (override, reason)
    # the stage in progress is frozen too once it has started
    assert history_compatible(saved, tiny("stages.M3.steps=80"), 2) is None
    assert "stages.M3.steps" in history_compatible(saved, tiny("stages.M3.steps=80"), 2, stage_started=True)


def test_history_compatible_allows_layout_bookkeeping_and_future_stages():
    saved = tiny()
    new = tiny("mesh=4", "checkpoint.keep=5", "eval.batches=2", "data.data_dir=/tmp/x", "stages.M5.steps=100",
               "stages.M4.growth.0.size=16", "stages.M4.beta=0.5")
    assert history_compatible(saved, new, completed_stages=3) is None
    fewer = run_config_from_dict({**saved.to_dict(), "stages": saved.to_dict()["stages"][:2]})
    assert "cannot be removed" in history_compatible(saved, fewer, completed_stages=3)
    assert history_compatible(saved, fewer, completed_stages=2) is None


RELEASE = ROOT / "tests" / "fixtures" / "release-0.1.0" / "run" / "config.json"


def _spelled_out(tmp_path: Path, **document) -> Path:
    """tiny as a user's YAML whose stages spell every field a run saves, as a run's
    ``config.json`` before the ``recovery`` option did (its ``recovery`` left out)."""
    import yaml

    raw = tiny().to_dict()
    for stage in raw["stages"]:
        del stage["recovery"]
    path = tmp_path / "spelled.yaml"
    path.write_text(yaml.safe_dump({**raw, **document}))
    return path


def test_a_users_yaml_that_spells_every_stage_field_gets_its_stage_defaults_and_todays_default(tmp_path):
    """The rule that reads a stage saved before ``recovery`` existed as ``start`` is for
    configs a run saved (``saved=True``: its workdir's config.json, a checkpoint's meta);
    a user's YAML, however fully its stages are spelled, gets its own stage_defaults, the
    command line's, or today's default."""
    assert {s.recovery for s in load_run_config(_spelled_out(tmp_path, stage_defaults={"recovery": "end"})).stages} \
        == {"end"}
    assert {s.recovery for s in load_run_config(_spelled_out(tmp_path)).stages} == {"end"}
    assert {s.recovery for s in load_run_config(_spelled_out(tmp_path), ["stage_defaults.recovery=start"]).stages} \
        == {"start"}
    assert {s.recovery for s in load_run_config(_spelled_out(tmp_path), ["stage_defaults.recovery=end"]).stages} \
        == {"end"}
    raw = yaml_of(_spelled_out(tmp_path))
    assert {s.recovery for s in run_config_from_dict(raw, saved=True).stages} == {"start"}  # a run's saved config


def yaml_of(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())


def test_a_stage_default_that_every_stage_overrides_is_refused_naming_it():
    """``stage_defaults.recovery=end`` over stages that each set ``recovery: start`` would
    change nothing: refused in one line; a default some stage takes, or one every stage
    repeats, is kept."""
    every = [f"stages.M{n}.recovery=start" for n in range(1, 6)]
    message = refusal(*every, "stage_defaults.recovery=end")
    assert message.startswith("stage_defaults.recovery: 'end' applies to no stage, since every stage sets its own "
                              "recovery (M1 'start', M2 'start', M3 'start', M4 'start', M5 'start')"), message
    assert [s.recovery for s in tiny(*every[1:], "stage_defaults.recovery=end").stages] == ["end"] + ["start"] * 4
    assert {s.recovery for s in tiny(*every, "stage_defaults.recovery=start").stages} == {"start"}
    assert "stage_defaults.steps: 7 applies to no stage" in refusal(*[f"stages.M{n}.steps=9" for n in range(1, 6)],
                                                                     "stage_defaults.steps=7")
    # stages replaced on the command line: a YAML default they all set (tiny's steps: 40) was
    # written for the YAML's stages and is dropped; given on the command line, it is refused
    stages = ("stages=[{name: A, domains: [WB], steps: 20, teachers: none, replay_ratio: 0.0, beta: 0.0, "
              "beta_steps: 0, warmup_steps: 0, gate_ramp_steps: 0}, {name: B, domains: [NEWS], steps: 20, "
              "growth: {op: ffn, size: 512}}]")
    assert [(s.steps, s.warmup_steps) for s in tiny(stages).stages] == [(20, 0), (20, 12)]
    assert "stage_defaults.steps: 30 applies to no stage" in refusal("stage_defaults.steps=30", stages)


def test_resuming_a_run_saved_before_the_recovery_option_with_another_recovery_is_refused_naming_it(tmp_path):
    """The release-0.1.0 run ran each stage's recovery window at its start. Resumed from its
    own config.json given as the config (a user's file: today's default, end) or with
    stage_defaults.recovery=end, the resume is refused naming recovery and how to resume;
    with stage_defaults.recovery=start it is the same run."""
    text = RELEASE.read_text().replace("{FIXTURES}", str(tmp_path))
    saved = run_config_from_dict(json.loads(text), saved=True)  # as the trainer reads its checkpoints' meta
    assert {s.recovery for s in saved.stages} == {"start"}
    config = tmp_path / "config.json"
    config.write_text(text)
    for overrides in ([], ["stage_defaults.recovery=end"]):
        reason = history_compatible(saved, load_run_config(config, overrides), 1, stage_started=True)
        assert reason is not None and "stages.M1.recovery: 'start' -> 'end'" in reason, reason
        assert "stages.M2.recovery: 'start' -> 'end'" in reason and "stage_defaults.recovery=start" in reason, reason
        assert "\n" not in reason
    assert history_compatible(saved, load_run_config(config, ["stage_defaults.recovery=start"]), 1,
                              stage_started=True) is None


def test_loss_chunk_is_auto_or_a_positive_integer():
    from loire_jax.model.kernels import loss_chunk_for

    assert tiny().loss_chunk == "auto"
    assert (loss_chunk_for("auto", "cpu"), loss_chunk_for("auto", "gpu")) == (256, 2048)
    assert loss_chunk_for(tiny("loss_chunk=512").loss_chunk, "cpu") == 512
    for bad in ("loss_chunk=0", "loss_chunk=big"):
        with pytest.raises(ValueError, match="loss_chunk must be a positive integer or auto"):
            tiny(bad)

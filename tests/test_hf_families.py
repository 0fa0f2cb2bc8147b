"""Specification: today's Hugging Face families (``loire_jax.interop.families``): Qwen2 and
Qwen2.5, Mistral, Gemma and Phi-3, held to transformers itself.

``tools/make_hf_fixtures.py`` built a tiny random model of each with transformers 5.24 and
torch and saved transformers' float32 logits on fixed tokens beside it; these tests read them
without torch. A family is one row of ``ROWS``: its fixture, its class and what its
``config.json`` must map to. Every test below runs on every row.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict
from hf_fixtures import FIXTURES, copy_fixture, edit_config
from hypothesis import given, settings
from strategies import model_configs

from loire_jax import apply_model, grow
from loire_jax.interop import families, hf
from loire_jax.model.kernels import causal_attention

TOKENS = jnp.asarray(np.load(FIXTURES / "tokens.npy"))
IMPORT_RTOL = 1e-5  # of the largest logit, as tests/test_hf.py (float32 sums ordered differently)
F64_TOL = 1e-9

pytestmark = pytest.mark.usefixtures("highest_precision")
_apply = jax.jit(apply_model, static_argnums=0)


class Row(NamedTuple):
    architecture: str
    config: dict  # ModelConfig fields the import must read
    hf_family: str = ""  # what the import sets: "" where the architecture alone picks the family


ROWS = {
    "qwen2": Row("Qwen2ForCausalLM", dict(qkv_bias=True, use_bias=False, heads=4, kv_heads=2, head_dim=8,
                                          tie_embeddings=False, rope_theta=1e6, norm_eps=1e-6)),
    "qwen2_tied": Row("Qwen2ForCausalLM", dict(qkv_bias=True, kv_heads=2, tie_embeddings=True)),
    "mistral": Row("MistralForCausalLM", dict(sliding_window=4, heads=4, kv_heads=2, head_dim=8, qkv_bias=False)),
    "gemma": Row("GemmaForCausalLM", dict(norm_gain="1+w", embed_scale="sqrt_hidden", activation="geglu_tanh",
                                          heads=4, kv_heads=1, head_dim=16, hidden=32, tie_embeddings=True)),
    "phi3": Row("Phi3ForCausalLM", dict(activation="swiglu", heads=4, kv_heads=2, head_dim=8, sliding_window=0,
                                        tie_embeddings=False), hf_family="phi3"),
}
NAMES = tuple(ROWS)


def _delta(cfg_a, params_a, cfg_b, params_b) -> float:
    a, b = _apply(cfg_a, params_a, TOKENS), _apply(cfg_b, params_b, TOKENS)
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def _same_params(a, b, cfg):
    """Bit for bit, but for the vocabulary padding an export drops."""
    b = flatten_dict(b, sep="/")
    for path, leaf in flatten_dict(a, sep="/").items():
        cut = {"embed/embedding": np.s_[:cfg.vocab_size], "lm_head/kernel": np.s_[:, :cfg.vocab_size]}.get(path, ...)
        np.testing.assert_array_equal(np.asarray(leaf)[cut], np.asarray(b[path])[cut], path)


# --------------------------------------------------------------------------- import
@pytest.mark.parametrize("name", NAMES)
def test_imported_logits_equal_transformers(name):
    cfg, params = hf.load(FIXTURES / name)
    reference = np.load(FIXTURES / name / "logits.npy")
    got = np.asarray(_apply(cfg, params, TOKENS))
    assert got.shape == reference.shape
    assert np.max(np.abs(got - reference)) <= IMPORT_RTOL * np.max(np.abs(reference))


@pytest.mark.parametrize("name", NAMES)
def test_the_config_maps_to_the_family_and_back(name, tmp_path):
    """What the import reads, the family an export of it writes (the same class: a Phi-3 stays a
    Phi-3 though its function is a Llama's), and export then import bit for bit."""
    row = ROWS[name]
    cfg, params = hf.load(FIXTURES / name)
    assert {k: getattr(cfg, k) for k in row.config} == row.config
    assert cfg.hf_family == row.hf_family
    written = hf.config_to_hf(cfg)
    assert written["architectures"] == [row.architecture]
    assert hf.config_from_hf(written) == cfg
    hf.save(cfg, params, tmp_path / "out")
    back_cfg, back = hf.load(tmp_path / "out")
    assert back_cfg == cfg
    _same_params(back, params, cfg)


def test_phi3_stores_q_k_v_and_gate_up_fused_in_transformers_order(tmp_path):
    """qkv_proj's rows are all query heads, then key, then value; gate_up_proj's the gate's, then up's."""
    from safetensors.numpy import load_file

    cfg, params = hf.load(FIXTURES / "phi3")
    stored = load_file(str(FIXTURES / "phi3" / "model.safetensors"))
    qkv = stored["model.layers.1.self_attn.qkv_proj.weight"]  # [(4 + 2 + 2) x 8, 32]
    attn = params["layers"]["attn"]
    np.testing.assert_array_equal(qkv[32:48].T, np.asarray(attn["key"]["kernel"][1]).reshape(32, 16))
    np.testing.assert_array_equal(stored["model.layers.0.mlp.gate_up_proj.weight"][48:].T,
                                  np.asarray(params["layers"]["mlp"]["up"]["kernel"][0]))
    hf.save(cfg, params, tmp_path / "out")
    assert set(load_file(str(tmp_path / "out" / "model.safetensors"))) == set(stored)


@pytest.mark.slow
@pytest.mark.parametrize("name, change", [
    ("mistral", dict(sliding_window=0)),  # the window acts from position 4 on
    ("gemma", dict(norm_gain="w")),  # (1 + w), not w
    ("gemma", dict(embed_scale="none")),  # x sqrt(hidden)
    ("gemma", dict(activation="geglu")),  # the tanh GELU, not the exact one
])
def test_what_makes_each_family_shows_in_its_logits(name, change):
    """The fixtures exercise each family's own features: reading one as the plain variant
    moves the logits far beyond the import bound (so the import test would catch it)."""
    cfg, params = hf.load(FIXTURES / name)
    reference = np.load(FIXTURES / name / "logits.npy")
    assert _delta(cfg, params, cfg.replace(**change), params) > 10 * IMPORT_RTOL * np.max(np.abs(reference))


def test_qwen2s_biases_matter():
    cfg, params = hf.load(FIXTURES / "qwen2")
    unbiased = jax.tree_util.tree_map_with_path(
        lambda p, x: jnp.zeros_like(x) if "bias" in jax.tree_util.keystr(p) else x, params)
    assert _delta(cfg, params, cfg, unbiased) > 1e-3


# --------------------------------------------------------------------------- grow, export, import
def _steps(cfg):
    """Every operator, one after another, GQA's group growth both ways included."""
    group = cfg.heads // cfg.n_kv_heads
    return [("ffn", cfg.ffn + 8, {}), ("hidden", cfg.hidden + 16, {}), ("heads", cfg.heads + group, {"method": "groups"}),
            ("heads", None, {"method": "within"}), ("layers", cfg.layers + 1, {})]


# Fast tier: none (the growth cells of tests/test_growth_exactness.py cover each family's
# constructions on small shapes, in float64 and float32); every fixture in float64, and Gemma's
# (whose float32 logits are the least well conditioned) in float32 too, in the slow tier.
@pytest.mark.slow
@pytest.mark.float64
@pytest.mark.parametrize("dtype,name", [("float64", n) for n in NAMES] + [("float32", "gemma")])
def test_grow_by_every_operator_then_export_and_import_bit_for_bit(name, dtype, tmp_path):
    """Each step keeps transformers' function (float64 <= 1e-9, float32 <= 1e-4 relative); the
    grown model exports and imports bit for bit where its family can express it, and is refused
    in one line naming the nearest growth that can where not (nothing written)."""
    cfg, params = hf.load(FIXTURES / name, dtype=dtype, param_dtype=dtype)
    bound = F64_TOL if dtype == "float64" else 1e-4 * float(jnp.max(jnp.abs(_apply(cfg, params, TOKENS))))
    cur_cfg, cur = cfg, params
    for i, (op, size, kw) in enumerate(_steps(cfg)):
        size = cur_cfg.heads + cur_cfg.n_kv_heads if size is None else size
        cur_cfg, cur = grow(cur_cfg, cur, op, size, jax.random.key(i), **kw)
        assert _delta(cfg, params, cur_cfg, cur) <= bound, (op, kw)
        ramped = {**cur, "gates": jnp.ones_like(cur["gates"])}  # a copied layer once its gate has ramped to 1
        folder = tmp_path / f"{i}"
        try:
            hf.config_to_hf(cur_cfg)
        except hf.HFError as err:
            assert "nearest expressible growth" in str(err) and "\n" not in str(err), err
            with pytest.raises(hf.HFError):
                hf.save(cur_cfg, ramped, folder)
            assert not folder.exists()
            continue
        hf.save(cur_cfg, ramped, folder)
        back_cfg, back = hf.load(folder, dtype=dtype, param_dtype=dtype)
        assert back_cfg == cur_cfg
        _same_params(back, ramped, cur_cfg)
    assert cur_cfg.hf_family == cfg.hf_family and cur_cfg.sliding_window == cfg.sliding_window


# --------------------------------------------------------------------------- what a family cannot express
@pytest.mark.parametrize("name, change, says", [
    ("qwen2", dict(hidden=48), r"Qwen2ForCausalLM needs heads x head_dim = hidden, this model has 4 x 8 != 48 \(its "
                               r"config has no head_dim\); the nearest expressible growth: grow heads to 6 \(6 x 8 = 48\)"),
    ("phi3", dict(hidden=40), r"4 x 8 != 40 .*nearest expressible growth: grow hidden to 48 and heads to 6$"),
    ("phi3", dict(heads=8), r"8 x 8 != 32 .*nearest expressible growth: grow hidden to 64$"),
    ("qwen2", dict(sliding_window=8), r"Qwen2ForCausalLM has no sliding window.*export it as mistral or phi3"),
    ("gemma", dict(sliding_window=8), r"GemmaForCausalLM has no sliding window"),
    ("gemma", dict(norm_gain="w"), r"GemmaForCausalLM needs RMSNorm with norm_gain '1\+w' and embed_scale"),
    ("mistral", dict(qkv_bias=True, hf_family="mistral"), r"MistralForCausalLM, which needs SwiGLU, RoPE and no biases"),
    ("mistral", dict(hf_family="falcon"), r"hf_family 'falcon' is not a family loire_jax writes \(bert "),
    ("phi3", dict(hf_family="bert"), r"bert is a masked-LM encoder family and this model is a decoder"),
    ("qwen2", dict(qkv_bias=False, hf_family="qwen2"), r"Qwen2ForCausalLM has biases on query, key and value"),
])
def test_an_export_the_family_cannot_express_is_refused_in_one_line_before_anything_is_written(name, change, says,
                                                                                               tmp_path):
    cfg, params = hf.load(FIXTURES / name)
    with pytest.raises(hf.HFError, match="^cannot export: .*" + says) as refused:
        hf.save(cfg.replace(**change), params, tmp_path / "out")
    assert "\n" not in str(refused.value)
    assert list(tmp_path.iterdir()) == []


@settings(max_examples=60, deadline=None)
@given(model_configs(kinds=("decoder", "encoder")))
def test_at_most_one_family_claims_an_architecture(cfg):
    """Where ``hf_family`` is empty, an export's family is the one whose ``claims`` holds: every
    decoder or encoder has exactly one, and it is the family an import of it would name."""
    claimants = [f.name for f in families.all_families() if f.claims(cfg)]
    assert len(claimants) == 1, claimants
    assert families.hf_family(cfg, families.by_name(claimants[0])) == ""


# --------------------------------------------------------------------------- refused, not guessed
UNSUPPORTED = {
    "gemma2": (r"logit soft-capping \(attn_logit_softcapping=50.0, final_logit_softcapping=30.0\); alternating "
               r"attention layers \(layer_types: full_attention, sliding_attention\)"),
    "llama_bnb_4bit": r"a quantized checkpoint \(quantization_config: bitsandbytes\)",
    "llama_gptq": r"a quantized checkpoint \(quantization_config: gptq\)",
    "llama_rope_dynamic_v4": r"rope type 'dynamic' \(rope_scaling; only default and llama3\)",
    "llama_rope_yarn": r"rope type 'yarn' \(rope_parameters; only default and llama3\)",
    "mixtral": r"a mixture of experts \(num_local_experts=4, num_experts_per_tok=2\)",
    "phi3_longrope": r"rope type 'longrope'",
    "qwen2_moe": r"a mixture of experts \(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16\)",
}


def test_every_unsupported_case_has_its_config():
    assert sorted(p.name for p in (FIXTURES / "unsupported").iterdir()) == sorted(UNSUPPORTED)


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_an_unsupported_feature_is_refused_in_one_line_naming_it_and_the_families(case):
    """Real config.json files (written by transformers, tools/make_hf_fixtures.py): one line
    naming the feature and every family there is, before any tensor is looked for."""
    from loire_jax.errors import RunError
    from loire_jax.interop import pretrained

    folder = FIXTURES / "unsupported" / case
    with pytest.raises(hf.HFError, match=UNSUPPORTED[case]) as refused:
        hf.load(folder)
    message = str(refused.value)
    assert "\n" not in message and message.endswith("; nothing was loaded")
    assert all(f"{f.name} ({f.architecture})" in message for f in families.all_families())
    cfg, _ = hf.load(FIXTURES / "qwen2")
    with pytest.raises(RunError, match=UNSUPPORTED[case]):  # a run's init_from, before anything is computed
        pretrained.check_architecture(str(folder), cfg)


@pytest.mark.slow
def test_a_run_from_an_unsupported_checkpoint_exits_2_in_one_line_and_writes_nothing(tmp_path):
    import yaml
    from data_helpers import tiny_config_dict
    from runs import cli, one_line_error, tiny_run

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tiny_run(tiny_config_dict(tmp_path / "data"), "x", "1", stages=[
        {"name": "A", "domains": ["SCI"], "steps": 1}])))
    result = cli(path, tmp_path / "w", f"stages.M1.init_from={FIXTURES / 'unsupported' / 'mixtral'}")
    assert "a mixture of experts (num_local_experts=4" in one_line_error(result)
    assert not (tmp_path / "w").exists()


def test_a_config_whose_model_type_is_another_class_is_refused(tmp_path):
    folder = copy_fixture("qwen2", tmp_path)
    edit_config(folder, model_type="qwen3")
    with pytest.raises(hf.HFError, match=r"model_type 'qwen3' is not Qwen2ForCausalLM's \(\['qwen2'\]\)"):
        hf.load(folder)


@pytest.mark.parametrize("fixture, change, says", [
    ("qwen2", dict(use_sliding_window=True), r"use_sliding_window=True is not supported for Qwen2ForCausalLM"),
    ("qwen2", dict(head_dim=16), r"head_dim=16 is not hidden_size / num_attention_heads = 8"),
    ("qwen2", dict(layer_types=["sliding_attention", "sliding_attention"]), r"sliding-window layers are not supported"),
    ("gemma", dict(hidden_activation="gelu"), r"hidden_activation='gelu' is not supported for GemmaForCausalLM"),
    ("gemma", dict(attention_bias=True), r"attention_bias=True is not supported for GemmaForCausalLM"),
    ("mistral", dict(sliding_window=0), r"sliding_window=0 is not a positive number of tokens"),
    ("phi3", dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.75}),
     r"partial_rotary_factor != 1 is not supported"),
])
def test_a_family_field_loire_jax_cannot_honour_is_refused_by_name(fixture, change, says, tmp_path):
    folder = copy_fixture(fixture, tmp_path)
    edit_config(folder, **change)
    with pytest.raises(hf.HFError, match=says):
        hf.load(folder)


def test_a_mistral_without_a_window_and_a_gemma_legacy_gelu_read_as_transformers_reads_them(tmp_path):
    """Mistral 7B v0.2 on: sliding_window null, no window (and a Mistral again on export); a
    missing sliding_window is MistralConfig's 4096. Gemma's legacy hidden_act "gelu" is the tanh form."""
    folder = copy_fixture("mistral", tmp_path)
    edit_config(folder, sliding_window=None)
    cfg, _ = hf.load(folder)
    assert (cfg.sliding_window, cfg.hf_family) == (0, "mistral")
    assert hf.config_to_hf(cfg)["architectures"] == ["MistralForCausalLM"]
    data = json.loads((folder / "config.json").read_text())
    del data["sliding_window"]
    (folder / "config.json").write_text(json.dumps(data))
    assert hf.load(folder)[0].sliding_window == 4096
    gemma = copy_fixture("gemma", tmp_path)
    edit_config(gemma, hidden_act="gelu")
    assert hf.load(gemma)[0].activation == "geglu_tanh"


# --------------------------------------------------------------------------- Mistral's window in the kernels
def test_the_window_is_jaxs_local_window_the_one_cudnn_is_given():
    """The XLA path's band mask equals ``jax.nn.dot_product_attention`` with
    ``local_window_size=(w - 1, 0)`` (its XLA implementation here; on a GPU the same arguments
    go to cuDNN's sliding-window mask), and a window as long as the sequence is no window."""
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 9, 3, 4)) for i in range(3))
    for window in (1, 3, 8):
        theirs = jax.nn.dot_product_attention(q, k, v, is_causal=True, local_window_size=(window - 1, 0),
                                              implementation="xla")
        np.testing.assert_allclose(causal_attention(q, k, v, "xla", window), theirs, atol=2e-6)
    np.testing.assert_allclose(causal_attention(q, k, v, "xla", 9), causal_attention(q, k, v, "xla"), atol=0)
    assert float(jnp.max(jnp.abs(causal_attention(q, k, v, "xla", 3) - causal_attention(q, k, v, "xla")))) > 1e-2


@pytest.mark.slow
def test_splash_attention_honours_the_window():
    """TPU's splash kernel (Pallas interpret mode here) with its LocalMask equals the XLA path."""
    q, k, v = (jax.random.normal(jax.random.key(i), (2, 128, 2, 8)) for i in range(3))
    np.testing.assert_allclose(causal_attention(q, k, v, "splash", 5), causal_attention(q, k, v, "xla", 5), atol=2e-5)


# --------------------------------------------------------------------------- held to transformers itself
def test_transformers_loads_each_grown_export_and_computes_the_same(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed: the export's load by transformers itself "
                                                "is checked where it is (tools/make_hf_fixtures.py --check)")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed: this check runs where it is "
                                       "(tools/make_hf_fixtures.py --check)")
    for name in NAMES:
        cfg, params = hf.load(FIXTURES / name)
        grown_cfg, grown = grow(cfg, params, "ffn", cfg.ffn + 8, jax.random.key(0))
        hf.save(grown_cfg, grown, tmp_path / name)
        model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / name).eval()
        assert type(model).__name__ == ROWS[name].architecture
        with torch.no_grad():
            theirs = model(torch.from_numpy(np.asarray(TOKENS, np.int64))).logits.numpy()
        reference = np.load(FIXTURES / name / "logits.npy")
        assert np.max(np.abs(theirs - reference)) <= IMPORT_RTOL * np.max(np.abs(reference)), name


def test_the_recorded_transformers_check_covers_every_family():
    """``tools/make_hf_fixtures.py --export`` grew every fixture by each operator and exported it;
    ``--check`` loaded each in transformers, whose logits matched loire_jax's (the record)."""
    record = json.loads((FIXTURES / "export_check.json").read_text())
    fixtures = {p.name for p in FIXTURES.iterdir() if (p / "config.json").is_file()}
    assert {r["name"] for r in record["results"]} == fixtures
    assert {r["architecture"] for r in record["results"]} == set(hf.ARCHITECTURES)
    assert all(r["ok"] and r["relative"] <= IMPORT_RTOL for r in record["results"])
    assert record["transformers"].startswith("5.")


# Slow tier: each family's fixture starts a run (M1 from it) that trains a short stage, and the
# run's export is the family again.
@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The trainer tests' small corpus, prepared once, and its tokenizer's identity."""
    from data_helpers import tiny_config_dict
    from runs import run_numerics, tiny_run

    from loire_jax.config.loader import run_config_from_dict
    from loire_jax.data import load_tokenizer

    data = tiny_config_dict(tmp_path_factory.mktemp("families-data") / "data")
    with run_numerics():
        run = run_config_from_dict(tiny_run(data, "x", "1", stages=[{"name": "A", "domains": ["SCI"], "steps": 1}]))
        identity = load_tokenizer(run.data).identity
    return data, identity


STARTS = {**{n: ROWS[n].architecture for n in NAMES if n != "qwen2_tied"}, "llama_gqa": "LlamaForCausalLM"}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(STARTS))
def test_init_from_a_family_checkpoint_trains_a_stage_and_exports_the_family_again(name, corpus, tmp_path):
    """The fixture, its vocabulary widened to the run's tokenizer's 320 ids and saved with that
    tokenizer's identity, is M1's start (``stages.M1.init_from``); the stage trains, and
    ``loire-export-hf`` writes the family's class again."""
    import yaml
    from runs import in_process, records, tiny_run

    from loire_jax.cli import export_hf
    from loire_jax.interop.pretrained import EXECUTION_FIELDS

    data, identity = corpus
    cfg, params = hf.load(FIXTURES / name)
    wide = cfg.replace(vocab_size=identity["vocab_size"])
    rows = jax.random.normal(jax.random.key(0), (wide.padded_vocab - cfg.padded_vocab, cfg.hidden)) * 0.02
    params = {**params, "embed": {"embedding": jnp.concatenate([params["embed"]["embedding"], rows])}}
    if not cfg.tie_embeddings:
        cols = jax.random.normal(jax.random.key(1), (cfg.hidden, wide.padded_vocab - cfg.padded_vocab)) * 0.02
        params["lm_head"] = {"kernel": jnp.concatenate([params["lm_head"]["kernel"], cols], axis=1)}
    hf.save(wide, params, tmp_path / "start", tokenizer=identity)  # the identity alone: no file to copy
    model = {k: v for k, v in wide.to_dict().items() if k not in EXECUTION_FIELDS}
    config = tiny_run(data, name, "1", model=model, stages=[
        {"name": "A", "domains": ["SCI"], "steps": 2, "init_from": str(tmp_path / "start")}])
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    assert in_process(path, tmp_path / "w").complete
    losses = [r["loss"] for r in records(tmp_path / "w", "train")]
    assert len(losses) == 2 and all(np.isfinite(losses))
    assert export_hf.main([str(tmp_path / "w"), str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == [STARTS[name]]
    assert hf.load(tmp_path / "out")[0] == wide


@pytest.mark.slow
def test_a_float64_run_exports_its_weights_as_float64_bit_for_bit(tmp_path):
    """``loire-export-hf`` starts with x64 off, as any fresh process: a float64 run's checkpoint
    is read and written as saved, every tensor float64 with its full mantissa (read as float32,
    its checksums failed and the export called the checkpoint damaged)."""
    import yaml
    from data_helpers import tiny_config_dict
    from runs import cli, run_numerics, tiny_run
    from safetensors.numpy import load_file

    from loire_jax.cli import export_hf

    config = tiny_run(tiny_config_dict(tmp_path / "data"), "f64", "1", precision="float64",
                      stages=[{"name": "A", "domains": ["SCI"], "steps": 2}])
    config["model"]["preset"] = "modern"  # a Llama: a family writes it
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    trained = cli(tmp_path / "run.yaml", tmp_path / "w")
    assert trained.returncode == 0, trained.stderr[-2000:]
    with run_numerics():
        assert export_hf.main([str(tmp_path / "w"), str(tmp_path / "out")]) == 0
    tensors = load_file(tmp_path / "out" / "model.safetensors")
    assert {v.dtype for v in tensors.values()} == {np.dtype("float64")}
    # trained weights use float64's mantissa: a float32 reading on the way would have rounded them
    assert any((v != v.astype(np.float32).astype(np.float64)).any() for v in tensors.values())

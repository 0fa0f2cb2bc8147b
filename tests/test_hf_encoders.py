"""Specification: Hugging Face masked-LM encoders in and out (BertForMaskedLM, RobertaForMaskedLM).

As in tests/test_hf.py, the reference is transformers itself: ``tools/make_hf_fixtures.py``
built ``tests/fixtures/hf/{bert,roberta}`` (a tied BERT; an untied RoBERTa saved in shards)
and saved their logits on a batch with trailing padding (``tokens.npy``, ``mask.npy``). Only
the valid positions are compared: padding's own outputs mean nothing. These tests read the
fixtures without torch; the one that loads exports in transformers skips without it."""

from __future__ import annotations

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict
from hf_fixtures import FIXTURES, copy_fixture, edit_config
from safetensors.numpy import load_file, save_file
from tiers import tiered

from loire_jax import apply_model, grow, init_params, preset
from loire_jax.interop import hf
from loire_jax.parallel.sharding import make_mesh, param_shardings

MODELS = ("bert", "roberta")
F64_TOL = 1e-9
# float32 import, relative to the largest logit: 6.0e-7 (bert) and 5.3e-7 (roberta) measured
# on x86 CPU; the bound is test_hf.py's.
IMPORT_RTOL = 1e-5

pytestmark = pytest.mark.usefixtures("highest_precision")
_apply = jax.jit(apply_model, static_argnums=0)


def _inputs(name):
    return np.load(FIXTURES / name / "tokens.npy"), np.load(FIXTURES / name / "mask.npy")


def _logits(cfg, params, name) -> np.ndarray:
    """[valid tokens, vocab] float64: the logits at the fixture batch's valid positions."""
    tokens, mask = _inputs(name)
    return np.asarray(_apply(cfg, params, jnp.asarray(tokens), jnp.asarray(mask)), np.float64)[mask]


def _delta(a, b) -> float:
    return float(np.max(np.abs(a - b)))


@pytest.mark.parametrize("name", MODELS)
def test_imported_logits_equal_transformers_at_the_valid_positions(name):
    cfg, params = hf.load(FIXTURES / name)
    reference = np.load(FIXTURES / name / "logits.npy")
    _, mask = _inputs(name)
    got = _logits(cfg, params, name)
    assert got.shape == reference[mask].shape
    assert _delta(got, reference[mask]) <= IMPORT_RTOL * np.max(np.abs(reference[mask]))
    # the padding is real: without the attention mask the padded rows' valid logits move
    tokens, _ = _inputs(name)
    unmasked = np.asarray(_apply(cfg, params, jnp.asarray(tokens)))[mask]
    assert _delta(unmasked, reference[mask]) > 1e-2


def test_the_configs_map_to_the_encoders():
    bert, params = hf.load(FIXTURES / "bert")
    assert (bert.kind, bert.norm, bert.norm_position, bert.activation, bert.position, bert.tie_embeddings,
            bert.use_bias) == ("encoder", "layernorm", "post", "gelu", "learned", True, True)
    assert (bert.max_seq_len, bert.position_offset, bert.type_vocab_size, bert.norm_eps) == (32, 0, 2, 1e-12)
    assert params["type_embed"]["embedding"].shape == (2, 32)  # the whole table, though only type 0 is used
    roberta, params = hf.load(FIXTURES / "roberta")
    # 34 stored positions, the first two before RoBERTa's first (padding id 1, + 1)
    assert (roberta.max_seq_len, roberta.position_offset, roberta.position_rows) == (32, 2, 34)
    assert (roberta.type_vocab_size, roberta.norm_eps, roberta.tie_embeddings) == (1, 1e-5, False)
    # the vocabulary is padded with zeros (100 -> 128), the vocabulary bias too
    assert roberta.padded_vocab == 128 and params["mlm"]["bias"].shape == (128,)
    for leaf, cut in ((params["embed"]["embedding"], np.s_[100:]), (params["lm_head"]["kernel"], np.s_[:, 100:]),
                      (params["mlm"]["bias"], np.s_[100:])):
        assert not np.any(np.asarray(leaf)[cut])
    # untied: the output layer's own bias is the one transformers 5 uses, not the head's unused one
    stored = {}
    for file in sorted((FIXTURES / "roberta").glob("*.safetensors")):
        stored.update(load_file(str(file)))
    assert not np.array_equal(stored["lm_head.bias"], stored["lm_head.decoder.bias"])
    np.testing.assert_array_equal(np.asarray(params["mlm"]["bias"][:100]), stored["lm_head.decoder.bias"])


# --------------------------------------------------------------------------- round trips
def _grown(cfg, params):
    """The operators an encoder export can express, one after another: ffn; hidden (duplicated,
    post-norm) with heads to match (BERT ties heads x head_dim to hidden)."""
    key = iter(jax.random.split(jax.random.key(5), 4))
    yield "ffn", grow(cfg, params, "ffn", 2 * cfg.ffn, next(key))
    c, p = grow(cfg, params, "hidden", 2 * cfg.hidden, next(key), method="duplicate")
    yield "hidden+heads", grow(c, p, "heads", 2 * cfg.heads, next(key))


@pytest.mark.float64
@pytest.mark.parametrize("name, dtype", tiered([("bert", "float64"), ("roberta", "float32"), ("roberta", "float64")],
                                                 lambda i, _: i == 0))  # fast: bert in float64
def test_import_grow_export_reimport_keeps_the_function(name, dtype, tmp_path):
    cfg, params = hf.load(FIXTURES / name, dtype=dtype, param_dtype=dtype)
    before = _logits(cfg, params, name)
    bound = F64_TOL if dtype == "float64" else 1e-4 * np.max(np.abs(before))
    for i, (op, (grown_cfg, grown)) in enumerate(_grown(cfg, params)):
        assert _delta(_logits(grown_cfg, grown, name), before) <= bound, op
        hf.save(grown_cfg, grown, tmp_path / f"{i}")
        back_cfg, back = hf.load(tmp_path / f"{i}", dtype=dtype, param_dtype=dtype)
        assert back_cfg == grown_cfg, op
        grown_flat = flatten_dict(grown, sep="/")
        for path, leaf in flatten_dict(back, sep="/").items():  # bit-exact, the padding included (zeros)
            np.testing.assert_array_equal(np.asarray(leaf), np.asarray(grown_flat[path]), f"{op}: {path}")


def test_the_export_writes_what_transformers_reads_for_each_encoder(tmp_path):
    cfg, params = hf.load(FIXTURES / "roberta")
    hf.save(cfg, params, tmp_path / "roberta", max_shard_bytes=40_000)
    written = json.loads((tmp_path / "roberta" / "config.json").read_text())
    assert (written["architectures"], written["pad_token_id"], written["max_position_embeddings"],
            written["type_vocab_size"], written["tie_word_embeddings"]) == (["RobertaForMaskedLM"], 1, 34, 1, False)
    assert len(set(json.loads((tmp_path / "roberta" / hf.INDEX).read_text())["weight_map"].values())) > 1
    # an encoder without token types and with the tanh GELU: BERT, hidden_act gelu_new, one zero type row
    fresh = preset("bert", vocab_size=100, hidden=32, ffn=64, heads=4, head_dim=8, layers=2, max_seq_len=16,
                   type_vocab_size=0, activation="gelu_tanh")
    hf.save(fresh, init_params(fresh, jax.random.key(0)), tmp_path / "bert")
    written = json.loads((tmp_path / "bert" / "config.json").read_text())
    assert (written["architectures"], written["hidden_act"], written["type_vocab_size"]) == \
        (["BertForMaskedLM"], "gelu_new", 1)
    stored = load_file(str(tmp_path / "bert" / "model.safetensors"))
    assert not np.any(stored["bert.embeddings.token_type_embeddings.weight"])
    assert stored["cls.predictions.bias"].shape == (100,)  # padding stripped
    np.testing.assert_array_equal(stored["cls.predictions.bias"], stored["cls.predictions.decoder.bias"])
    back_cfg, _ = hf.load(tmp_path / "bert")
    assert back_cfg == fresh.replace(type_vocab_size=1)


def _ramped(cfg, params):
    """A grown encoder whose new layer's ramp is done: every gate 1 (the function has changed,
    and transformers must compute the changed one)."""
    key = iter(jax.random.split(jax.random.key(7), 4))
    cfg, params = grow(cfg, params, "ffn", 128, next(key))
    cfg, params = grow(cfg, params, "hidden", 2 * cfg.hidden, next(key), method="duplicate")
    cfg, params = grow(cfg, params, "heads", 2 * cfg.heads, next(key))
    cfg, params = grow(cfg, params, "layers", cfg.layers + 1, next(key))
    return cfg, {**params, "gates": jnp.ones_like(params["gates"])}


def test_transformers_loads_a_grown_encoder_and_computes_the_same(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed: the export's load by transformers itself "
                                                "is checked where it is (tools/make_hf_fixtures.py's environment)")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed: this check runs where it is "
                                       "(tools/make_hf_fixtures.py --check)")
    fresh = preset("roberta", vocab_size=100, hidden=32, ffn=64, heads=4, head_dim=8, layers=2, max_seq_len=16,
                   type_vocab_size=0, tie_embeddings=False)
    cases = [(name, *_ramped(*hf.load(FIXTURES / name))) for name in MODELS]
    cases.append(("roberta", fresh, init_params(fresh, jax.random.key(3))))  # no token types: a zero row
    for i, (name, cfg, params) in enumerate(cases):
        hf.save(cfg, params, tmp_path / f"{i}")
        model = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / f"{i}").eval()
        assert type(model).__name__ == hf.config_to_hf(cfg)["architectures"][0]
        tokens, mask = _inputs(name)
        tokens, mask = tokens[:, :cfg.max_seq_len], mask[:, :cfg.max_seq_len]
        with torch.no_grad():
            theirs = model(torch.from_numpy(tokens.astype(np.int64)),
                           attention_mask=torch.from_numpy(mask.astype(np.int64))).logits.numpy()[mask]
        ours = np.asarray(_apply(cfg, params, jnp.asarray(tokens), jnp.asarray(mask)))[mask]
        assert _delta(theirs, ours) <= IMPORT_RTOL * np.max(np.abs(ours)), (i, _delta(theirs, ours))


# --------------------------------------------------------------------------- onto a mesh, and init_from
def test_an_encoder_loads_onto_a_mesh_and_as_a_runs_pretrained_model():
    from loire_jax.errors import RunError
    from loire_jax.interop import pretrained
    from loire_jax.model.params import abstract_params

    mesh = make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    for name in MODELS:
        cfg, whole = hf.load(FIXTURES / name)
        sharded = pretrained.load(str(FIXTURES / name), cfg, abstract_params(cfg), mesh)
        expected = param_shardings(cfg, mesh)
        jax.tree.map(lambda a, s: a.sharding.is_equivalent_to(s, a.ndim) or pytest.fail(str(a.sharding)),
                     sharded, expected)
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), sharded, whole)
    # a device whose vocabulary block is padding only (128..256 of 100 stored entries) reads nothing
    _, padded = hf.load(FIXTURES / "bert", mesh=mesh, pad_vocab_to=256)
    assert padded["mlm"]["bias"].shape == (256,) and not np.any(np.asarray(padded["mlm"]["bias"][100:]))
    gpt2, _ = hf.load(FIXTURES / "gpt2")
    bert, _ = hf.load(FIXTURES / "bert")
    with pytest.raises(RunError, match=r"another architecture than the run's model \(kind: checkpoint 'decoder', "
                                       r"run 'encoder';"):
        pretrained.check_architecture(str(FIXTURES / "gpt2"), bert)
    with pytest.raises(RunError, match=r"\(kind: checkpoint 'encoder', run 'decoder';"):
        pretrained.load(str(FIXTURES / "bert"), gpt2, abstract_params(gpt2), mesh)


# --------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("fixture, change, match", [
    ("bert", {"architectures": ["BertForSequenceClassification"]},
     r"architectures \['BertForSequenceClassification'\] is not supported"),
    ("bert", {"position_embedding_type": "relative_key"},
     r"position_embedding_type='relative_key' is not supported for BertForMaskedLM \(only \['absolute'\]\)"),
    ("bert", {"is_decoder": True}, r"is_decoder=True is not supported for BertForMaskedLM"),
    ("bert", {"hidden_act": "relu"}, r"hidden_act='relu' is not supported"),
    ("roberta", {"hidden_act": "gelu_new"}, r"hidden_act='gelu_new' is not supported for RobertaForMaskedLM"),
    ("bert", {"embedding_size": 16}, r"\['embedding_size'\] are not supported for BertForMaskedLM"),
    ("bert", {"hidden_size": 30}, r"hidden_size=30 is not a multiple of num_attention_heads=4"),
    ("roberta", {"pad_token_id": None}, r"pad_token_id=None: RoBERTa's positions start after the padding id"),
    ("roberta", {"max_position_embeddings": 2}, r"max_position_embeddings=2 leaves no position after the offset 2"),
    ("roberta", {"max_position_embeddings": 40},
     r"'roberta.embeddings.position_embeddings.weight' has shape \[34, 32\], config.json implies \[40, 32\]"),
    ("bert", {"type_vocab_size": 1}, r"token_type_embeddings.weight' has shape \[2, 32\], config.json implies \[1, 32\]"),
    ("bert", {"num_hidden_layers": 3}, r"tensor 'bert.encoder.layer.2.\S+' is missing \(and 15 more\)"),
    ("bert", {"tie_word_embeddings": False}, r"tensor 'cls.predictions.decoder.weight' is missing"),
    ("roberta", {"tie_word_embeddings": True},
     r"'lm_head.decoder.weight' differs from 'roberta.embeddings.word_embeddings.weight' although "
     r"tie_word_embeddings is true"),
    ("bert", {"architectures": ["GPT2LMHeadModel"]},
     r"^\S+/config.json: field\(s\) \['attention_probs_dropout_prob', .*\] are not supported for GPT2LMHeadModel"),
])
def test_an_encoder_checkpoint_that_does_not_match_is_refused_naming_why(fixture, change, match, tmp_path):
    folder = copy_fixture(fixture, tmp_path)
    edit_config(folder, **change)
    with pytest.raises(hf.HFError, match=match) as info:
        hf.load(folder)
    assert "\n" not in str(info.value)


def _edit_tensors(folder, edit):
    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


def test_stored_tensors_are_checked_and_the_unused_ones_of_real_checkpoints_ignored(tmp_path):
    _, reference = hf.load(FIXTURES / "bert")
    # what pretraining checkpoints also hold (pooler, next-sentence head, buffers, a tied copy of
    # the output layer, its bias under both names), the LayerNorms as gamma/beta, and no
    # "bert." prefix: the same model
    folder = copy_fixture("bert", tmp_path)

    def pretraining(t):
        t.update({"bert.pooler.dense.weight": np.ones((32, 32), np.float32),
                  "cls.seq_relationship.bias": np.ones(2, np.float32),
                  "bert.embeddings.position_ids": np.arange(32)[None],
                  "cls.predictions.decoder.weight": t["bert.embeddings.word_embeddings.weight"],
                  "cls.predictions.decoder.bias": t["cls.predictions.bias"]})
        for name in [n for n in t if n.endswith("LayerNorm.weight") or n.endswith("LayerNorm.bias")]:
            t[name.replace(".weight", ".gamma").replace(".bias", ".beta")] = t.pop(name)
        for name in [n for n in t if n.startswith("bert.")]:
            t[name.removeprefix("bert.")] = t.pop(name)
    _edit_tensors(folder, pretraining)
    _, params = hf.load(folder)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, reference)
    # the same tensor under two names; a tied bias that differs from its copy; one missing; one extra
    for edit, match in [
        (lambda t: t.update({"embeddings.LayerNorm.weight": t["embeddings.LayerNorm.gamma"]}),
         r"a tensor is stored under two names"),
        (lambda t: t.update({"cls.predictions.decoder.bias": t["cls.predictions.bias"] + 1}),
         r"'cls.predictions.decoder.bias' differs from 'cls.predictions.bias' although tie_word_embeddings is true"),
        (lambda t: t.pop("encoder.layer.1.output.dense.bias"),
         r"tensor 'bert.encoder.layer.1.output.dense.bias' is missing; refusing to load a partial"),
        (lambda t: t.update({"cls.predictions.transform.extra": np.ones(3, np.float32)}),
         r"tensor\(s\) \['cls.predictions.transform.extra'\] have no place in BertForMaskedLM"),
    ]:
        edited = tmp_path / f"edited-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(FIXTURES / "bert", edited)
        _edit_tensors(edited, pretraining)
        _edit_tensors(edited, edit)
        with pytest.raises(hf.HFError, match=match):
            hf.load(edited)


def test_export_refuses_what_bert_and_roberta_cannot_express_and_writes_nothing(tmp_path):
    cfg, params = hf.load(FIXTURES / "bert")
    heads_cfg, heads = grow(cfg, params, "heads", cfg.heads + 2, jax.random.key(0))
    layered_cfg, layered = grow(cfg, params, "layers", cfg.layers + 1)  # the copy's gate is 0
    roberta, roberta_params = hf.load(FIXTURES / "roberta")
    for i, (c, p, match) in enumerate([
        (heads_cfg, heads, r"BertForMaskedLM and RobertaForMaskedLM need heads x head_dim = hidden, this model has 6 x 8 != 32"),
        (layered_cfg, layered, r"layer gate\(s\) \[2\] are not 1"),
        (cfg.replace(norm_position="pre"), params, r"post-norm LayerNorm \(this one: pre-norm layernorm\)"),
        (roberta.replace(activation="gelu_tanh"), roberta_params, r"RobertaForMaskedLM .* applies the exact GELU"),
    ]):
        with pytest.raises(hf.HFError, match="cannot export: .*" + match):
            hf.save(c, p, tmp_path / f"{i}")
    assert list(tmp_path.iterdir()) == []

"""Specification: Hugging Face checkpoints in and out (GPT-2, Llama with GQA and llama3 rope).

The reference is transformers itself: ``tools/make_hf_fixtures.py`` built the tiny models in
``tests/fixtures/hf`` with transformers and torch and saved their logits on fixed tokens.
These tests read them without torch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict
from hf_fixtures import FIXTURES, copy_fixture, edit_config
from safetensors.numpy import load_file, save_file
from tiers import tiered

from loire_jax import apply_model, grow
from loire_jax.interop import hf, hf_read
from loire_jax.parallel.sharding import make_mesh, param_shardings

MODELS = ("gpt2", "llama_gqa", "llama_tied")
TOKENS = jnp.asarray(np.load(FIXTURES / "tokens.npy"))
F64_TOL = 1e-9
# float32 import: transformers and XLA order their float32 sums differently. Relative to the
# largest logit they agree to 6e-7..9e-7 on these fixtures (measured on x86 CPU); the bound
# leaves room for other CPUs and accelerators at "highest" matmul precision.
IMPORT_RTOL = 1e-5

pytestmark = pytest.mark.usefixtures("highest_precision")
_apply = jax.jit(apply_model, static_argnums=0)


def _delta(cfg_a, params_a, cfg_b, params_b) -> float:
    a, b = _apply(cfg_a, params_a, TOKENS), _apply(cfg_b, params_b, TOKENS)
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


@pytest.mark.parametrize("name", MODELS)
def test_imported_logits_equal_transformers(name):
    cfg, params = hf.load(FIXTURES / name)
    reference = np.load(FIXTURES / name / "logits.npy")
    got = np.asarray(_apply(cfg, params, TOKENS))
    assert got.shape == reference.shape
    assert np.max(np.abs(got - reference)) <= IMPORT_RTOL * np.max(np.abs(reference))


def test_the_configs_map_to_the_architectures():
    gpt2, _ = hf.load(FIXTURES / "gpt2")
    assert (gpt2.norm, gpt2.norm_position, gpt2.activation, gpt2.position, gpt2.tie_embeddings, gpt2.use_bias) \
        == ("layernorm", "pre", "gelu_tanh", "learned", True, True)
    llama, params = hf.load(FIXTURES / "llama_gqa")
    assert (llama.heads, llama.kv_heads, llama.head_dim, llama.gqa, llama.tie_embeddings) == (4, 2, 12, True, False)
    assert (llama.rope_scaling, llama.rope_theta, llama.rope_factor, llama.rope_original_max_len) \
        == ("llama3", 500000.0, 8.0, 16)
    # the vocabulary is padded with zero rows (100 -> 128) on import
    assert llama.padded_vocab == 128 and params["embed"]["embedding"].shape == (128, 32)
    assert not np.any(np.asarray(params["embed"]["embedding"][100:]))
    assert not np.any(np.asarray(params["lm_head"]["kernel"][:, 100:]))


def test_the_llama3_frequencies_matter():
    """The fixture's scaling changes the logits: importing it as plain RoPE would be wrong."""
    cfg, params = hf.load(FIXTURES / "llama_gqa")
    plain = cfg.replace(rope_scaling="none")
    assert _delta(cfg, params, plain, params) > 1e-3


# --------------------------------------------------------------------------- round trips
def _export_and_reload(cfg, params, folder):
    hf.save(cfg, params, folder)
    assert sorted(p.name for p in folder.iterdir()) == [".loire_export", "config.json", "model.safetensors"]
    stored = load_file(str(folder / "model.safetensors"))
    vocab_rows = stored.get("transformer.wte.weight", stored.get("model.embed_tokens.weight"))
    assert vocab_rows.shape[0] == cfg.vocab_size  # padding stripped on export
    back_cfg, back = hf.load(folder, dtype=cfg.dtype, param_dtype=cfg.param_dtype)
    assert back_cfg == cfg
    return back


def _grow_expressible(cfg, params, name):
    """Every operator the target class can express, one after another."""
    key = iter(jax.random.split(jax.random.key(5), 8))
    yield "ffn", grow(cfg, params, "ffn", cfg.ffn + 8, next(key))
    if name == "gpt2":  # GPT-2 ties heads x head_dim to hidden: widen both together
        c, p = grow(cfg, params, "hidden", cfg.hidden + 16, next(key))
        yield "hidden+heads", grow(c, p, "heads", cfg.heads + 2, next(key))
    else:
        c, p = grow(cfg, params, "hidden", cfg.hidden + 16, next(key))
        yield "hidden", (c, p)
        group = c.heads // c.n_kv_heads
        yield "heads (new groups)", grow(c, p, "heads", c.heads + 2 * group, next(key), method="groups")
        if cfg.gqa:
            yield "heads (within groups)", grow(c, p, "heads", c.heads + c.n_kv_heads, next(key), method="within")


# Fast tier: gpt2 in float64; the llamas and float32 in the slow tier.
@pytest.mark.float64
@pytest.mark.parametrize("dtype,name", tiered([(d, m) for d in ("float64", "float32") for m in MODELS],
                                              lambda i, c: c == ("float64", "gpt2")))
def test_import_grow_export_reimport_keeps_the_function(name, dtype, tmp_path):
    cfg, params = hf.load(FIXTURES / name, dtype=dtype, param_dtype=dtype)
    bound = F64_TOL if dtype == "float64" else 1e-4 * float(jnp.max(jnp.abs(_apply(cfg, params, TOKENS))))
    for i, (op, (grown_cfg, grown)) in enumerate(_grow_expressible(cfg, params, name)):
        assert _delta(cfg, params, grown_cfg, grown) <= bound, op
        back = _export_and_reload(grown_cfg, grown, tmp_path / f"{i}")
        assert _delta(cfg, params, grown_cfg, back) <= bound, op
        grown_flat = flatten_dict(grown, sep="/")
        for path, leaf in flatten_dict(back, sep="/").items():  # lossless, but for the dropped vocab padding
            keep = {"embed/embedding": np.s_[:cfg.vocab_size], "lm_head/kernel": np.s_[:, :cfg.vocab_size]}
            cut = keep.get(path, ...)
            np.testing.assert_array_equal(np.asarray(leaf)[cut], np.asarray(grown_flat[path])[cut], path)


def test_transformers_loads_the_export_and_computes_the_same(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed: the export's load by transformers itself "
                                                "is checked where it is (tools/make_hf_fixtures.py's environment)")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed: this check runs where it is "
                                       "(tools/make_hf_fixtures.py --check)")
    for name in MODELS:
        cfg, params = hf.load(FIXTURES / name)
        grown_cfg, grown = grow(cfg, params, "ffn", cfg.ffn + 8, jax.random.key(0))
        if name != "gpt2":
            grown_cfg, grown = grow(grown_cfg, grown, "hidden", cfg.hidden + 16, jax.random.key(1))
        hf.save(grown_cfg, grown, tmp_path / name)
        model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / name).eval()
        with torch.no_grad():
            theirs = model(torch.from_numpy(np.asarray(TOKENS, np.int64))).logits.numpy()
        reference = np.load(FIXTURES / name / "logits.npy")
        assert np.max(np.abs(theirs - reference)) <= IMPORT_RTOL * np.max(np.abs(reference)), name


# --------------------------------------------------------------------------- onto a mesh
def test_a_checkpoint_loads_onto_a_mesh_reading_only_each_devices_blocks(monkeypatch):
    """Every read from a safetensors file (the library's slice object) is recorded: a matrix
    sharded over fsdp=4 must never be read whole, only in blocks of at most a quarter."""
    reads = []
    original = hf_read._Checkpoint.file

    class Slice:
        def __init__(self, name, inner):
            self.name, self.inner = name, inner

        def __getitem__(self, block):
            out = self.inner[block]
            reads.append((self.name, out.size, int(np.prod(self.inner.get_shape()))))
            return out

        def __getattr__(self, attr):
            return getattr(self.inner, attr)

    class File:
        def __init__(self, inner):
            self.inner = inner

        def get_slice(self, name):
            return Slice(name, self.inner.get_slice(name))

    monkeypatch.setattr(hf_read._Checkpoint, "file", lambda self, name: File(original(self, name)))
    mesh = make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    for name in ("gpt2", "llama_gqa"):
        reads.clear()
        cfg, sharded = hf.load(FIXTURES / name, mesh=mesh)
        matrices = [(n, got, whole) for n, got, whole in reads if got and "norm" not in n and "ln_" not in n
                    and not n.endswith("bias")]
        assert matrices and all(got <= whole // 4 for _, got, whole in matrices), matrices[:3]
        expected = param_shardings(cfg, mesh)
        jax.tree.map(lambda a, s: a.sharding.is_equivalent_to(s, a.ndim) or pytest.fail(str(a.sharding)),
                     sharded, expected)
        _, whole = hf.load(FIXTURES / name)
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), sharded, whole)
    # a device whose vocabulary block is padding only (128..256 of 100 stored rows) reads nothing
    cfg, padded = hf.load(FIXTURES / "gpt2", mesh=mesh, pad_vocab_to=256)
    rows = np.asarray(padded["embed"]["embedding"])
    assert rows.shape == (256, 32) and not np.any(rows[100:])


# --------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("fixture, change, match", [
    ("llama_gqa", {"architectures": ["FalconForCausalLM"]},
     r"architectures \['FalconForCausalLM'\] is not supported"),
    ("llama_gqa", {"sliding_window": 4096}, r"\['sliding_window'\] are not supported"),
    ("llama_gqa", {"attention_bias": True}, r"attention_bias=True is not supported"),
    ("llama_gqa", {"hidden_act": "gelu"}, r"hidden_act='gelu' is not supported"),
    ("llama_gqa", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, r"rope type 'yarn'"),
    ("llama_gqa", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 4.0}},
     r"llama3 rope scaling without 'low_freq_factor'"),
    ("llama_gqa", {"num_hidden_layers": 3}, r"tensor 'model.layers.2.\S+' is missing \(and 8 more\)"),
    ("llama_gqa", {"intermediate_size": 40},
     r"tensor 'model.layers.0.mlp.up_proj.weight' has shape \[48, 32\], config.json implies \[40, 32\] \(and 5 more\)"),
    ("llama_gqa", {"num_key_value_heads": 4}, r"k_proj.weight' has shape \[24, 32\], config.json implies \[48, 32\]"),
    ("llama_gqa", {"hidden_size": None}, r"invalid ModelConfig: hidden must be a positive integer"),
    ("gpt2", {"architectures": 5}, r"architectures 5 is not supported"),
    ("gpt2", {"n_head": 0}, r"malformed field \(ZeroDivisionError"),
    ("gpt2", {"layer_norm_epsilon": None}, r"malformed field \(TypeError"),
    ("llama_gqa", {"rope_parameters": [1, 2]}, r"malformed field"),
    ("llama_gqa", {"rope_scaling": {"rope_type": "default"}}, r"rope_parameters and rope_scaling disagree"),
    ("llama_gqa", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 16.5}}, r"16.5 is not a whole number"),
])
def test_a_checkpoint_that_does_not_match_is_refused_naming_why(fixture, change, match, tmp_path):
    """Config fields that are unsupported, malformed or contradicted by the tensors: one
    HFError naming the field or tensor, never a traceback and never a partial load."""
    folder = copy_fixture(fixture, tmp_path)
    edit_config(folder, **change)
    with pytest.raises(hf.HFError, match=match):
        hf.load(folder)


def test_a_missing_or_misshapen_tensor_is_refused_never_zero_filled(tmp_path):
    folder = copy_fixture("gpt2", tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["transformer.h.1.mlp.c_fc.bias"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(hf.HFError, match=r"tensor 'transformer.h.1.mlp.c_fc.bias' is missing.*refusing to load"):
        hf.load(folder)
    tensors["transformer.h.1.mlp.c_fc.bias"] = np.zeros(7, np.float32)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(hf.HFError, match=r"c_fc.bias' has shape \[7\], config.json implies \[128\]"):
        hf.load(folder)
    tensors["transformer.h.1.mlp.c_fc.bias"] = np.zeros(128, np.float32)
    tensors["transformer.h.2.mlp.c_fc.bias"] = np.zeros(128, np.float32)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(hf.HFError, match=r"\['transformer.h.2.mlp.c_fc.bias'\] have no place"):
        hf.load(folder)


def test_gpt2_weights_stored_without_the_transformer_prefix_load_the_same(tmp_path):
    """The original GPT-2 checkpoints name their tensors "h.0.attn.c_attn.weight"."""
    folder = copy_fixture("gpt2", tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    save_file({k.removeprefix("transformer."): v for k, v in tensors.items()}, str(folder / "model.safetensors"))
    cfg, params = hf.load(folder)
    _, reference = hf.load(FIXTURES / "gpt2")
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, reference)


def _tokenizer(folder: Path):
    """A sentencepiece tokenizer trained here, with its own [PAD] (1) and <mask>: what a run
    that uses ``data.tokenizer.kind: sentencepiece`` loads."""
    import io

    import sentencepiece as spm

    from loire_jax.data.tokenizers import from_file

    docs = (Path(__file__).resolve().parent / "data" / "fixtures" / "science.txt").read_text().split("\n\n")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(docs), model_writer=model, model_type="bpe",
                                   vocab_size=96, hard_vocab_limit=False, num_threads=1, minloglevel=2, bos_id=0,
                                   pad_id=1, eos_id=2, unk_id=3, user_defined_symbols=["<mask>"],
                                   character_coverage=0.98)
    (folder / "spm.model").write_bytes(model.getvalue())
    return from_file("sentencepiece", folder / "spm.model")


def test_an_export_that_fails_leaves_nothing_behind(tmp_path):
    cfg, params = hf.load(FIXTURES / "gpt2")
    (tmp_path / "tok").mkdir()
    tokenizer = _tokenizer(tmp_path / "tok")
    (tmp_path / "tok" / "spm.model").unlink()  # its file gone while the export copies it
    with pytest.raises(FileNotFoundError):
        hf.save(cfg, params, tmp_path / "out", tokenizer=tokenizer)
    assert [p.name for p in tmp_path.iterdir()] == ["tok"]


def test_save_writes_the_models_tokenizer_as_the_export_command_does(tmp_path):
    """``save(..., tokenizer=...)`` is the export's one code path (``loire-export-hf`` and
    ``interop.export_stage`` call it): the tokenizer's file beside the weights, its identity,
    its EOS id in config.json, and for a BERT the [PAD] id it trained with; a later run's
    ``init_from`` then proves its tokenizer against the folder."""
    from loire_jax.data.special import special_tokens
    from loire_jax.interop import pretrained

    tokenizer = _tokenizer(tmp_path)
    cfg, params = hf.load(FIXTURES / "gpt2")
    out = hf.save(cfg, params, tmp_path / "gpt2", tokenizer=tokenizer)
    assert (out / "tokenizer.model").read_bytes() == (tmp_path / "spm.model").read_bytes()
    assert json.loads((out / hf.TOKENIZER_IDENTITY).read_text()) == tokenizer.identity
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == tokenizer.eos_id == 2
    pretrained.check_tokenizer(str(out), tokenizer.identity)
    cfg, params = hf.load(FIXTURES / "bert")
    out = hf.save(cfg, params, tmp_path / "bert", tokenizer=tokenizer)
    assert json.loads((out / "config.json").read_text())["pad_token_id"] == special_tokens(tokenizer, 100).pad == 1
    assert (out / "tokenizer.model").is_file()


def test_a_config_without_a_required_field_is_refused_naming_it(tmp_path):
    folder = copy_fixture("gpt2", tmp_path)
    data = json.loads((folder / "config.json").read_text())
    del data["n_layer"]
    (folder / "config.json").write_text(json.dumps(data))
    with pytest.raises(hf.HFError, match="config.json: field 'n_layer' is missing"):
        hf.load(folder)


def test_a_directory_without_a_checkpoint_is_refused(tmp_path):
    with pytest.raises(hf.HFError, match="config.json: missing"):
        hf.load(tmp_path)
    shutil.copy(FIXTURES / "gpt2" / "config.json", tmp_path / "config.json")
    with pytest.raises(hf.HFError, match="no model.safetensors or model.safetensors.index.json"):
        hf.load(tmp_path)
    folder = copy_fixture("llama_gqa", tmp_path)
    (folder / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(hf.HFError, match="model-00002-of-00003.safetensors: missing"):
        hf.load(folder)


def test_export_refuses_what_the_target_class_cannot_express(tmp_path):
    cfg, params = hf.load(FIXTURES / "gpt2")
    layered_cfg, layered = grow(cfg, params, "layers", cfg.layers + 1)  # the copy's gate is 0
    with pytest.raises(hf.HFError, match=r"layer gate\(s\) \[2\] are not 1"):
        hf.save(layered_cfg, layered, tmp_path / "a")
    wide_cfg, wide = grow(cfg, params, "hidden", cfg.hidden + 16, jax.random.key(0))
    with pytest.raises(hf.HFError, match=r"heads x head_dim = hidden.*4 x 8 != 48"):
        hf.save(wide_cfg, wide, tmp_path / "b")
    with pytest.raises(hf.HFError, match=r"post-norm .*--config tiny.* no post-norm GPT class.*train a pre-norm "
                                         r"model: model\.preset=gpt2 \(as --config tiny_gpt2_general or mini\)"):
        hf.save(cfg.replace(norm_position="post"), params, tmp_path / "c")
    with pytest.raises(hf.HFError, match="needs activation gelu_tanh"):
        hf.save(cfg.replace(activation="gelu"), params, tmp_path / "d")
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "mine.txt").write_text("keep")
    with pytest.raises(hf.HFError, match="exists and is not an empty directory"):
        hf.save(cfg, params, tmp_path / "e")
    assert (tmp_path / "e" / "mine.txt").read_text() == "keep"
    assert not any((tmp_path / n).exists() for n in "abcd")


def test_a_large_export_is_sharded_with_an_index_that_loads_back(tmp_path):
    cfg, params = hf.load(FIXTURES / "llama_gqa")
    hf.save(cfg, params, tmp_path / "out", max_shard_bytes=20_000)
    index = json.loads((tmp_path / "out" / hf.INDEX).read_text())
    assert len(set(index["weight_map"].values())) > 2
    back_cfg, back = hf.load(tmp_path / "out")
    assert _delta(cfg, params, back_cfg, back) == 0.0


# --------------------------------------------------------------------------- init_from a Hugging Face directory
def test_init_from_checks_the_tokenizer_it_can_prove_and_refuses_one_it_cannot(tmp_path):
    from loire_jax.data.fetch import sha256_file
    from loire_jax.errors import RunError
    from loire_jax.interop import pretrained

    mine = {"kind": "trained_bpe", "vocab_size": 100, "eos_id": 2, "sha256": "ab" * 32}
    with pytest.raises(RunError, match="no tokenizer to check the run's against"):
        pretrained.check_tokenizer(str(FIXTURES / "gpt2"), mine)
    cfg, params = hf.load(FIXTURES / "gpt2")
    hf.save(cfg, params, tmp_path / "exported", tokenizer=mine)  # the identity alone: a tokenizer whose file is gone
    pretrained.check_tokenizer(str(tmp_path / "exported"), mine)
    with pytest.raises(RunError, match="tokenizer mismatch"):
        pretrained.check_tokenizer(str(tmp_path / "exported"), {**mine, "sha256": "cd" * 32})
    foreign = copy_fixture("gpt2", tmp_path)
    (foreign / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    theirs = {"kind": "tokenizer_json", "vocab_size": 100, "eos_id": 99,
              "sha256": sha256_file(foreign / "tokenizer.json")}
    pretrained.check_tokenizer(str(foreign), theirs)
    with pytest.raises(RunError, match="set data.tokenizer to kind tokenizer_json, path .*tokenizer.json"):
        pretrained.check_tokenizer(str(foreign), mine)


def test_init_from_loads_the_weights_onto_the_mesh_only_for_the_same_architecture():
    from loire_jax.errors import RunError
    from loire_jax.interop import pretrained
    from loire_jax.model.params import abstract_params

    mesh = make_mesh({"data": 1, "fsdp": 4, "tensor": 2})
    cfg, params = hf.load(FIXTURES / "llama_gqa")
    loaded = pretrained.load(str(FIXTURES / "llama_gqa"), cfg, abstract_params(cfg), mesh)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), loaded, params)
    with pytest.raises(RunError, match=r"another architecture than the run's model \(kv_heads: checkpoint 2, run 0\)"):
        pretrained.load(str(FIXTURES / "llama_gqa"), cfg.replace(kv_heads=0), abstract_params(cfg), mesh)
    with pytest.raises(RunError, match="neither a Hugging Face checkpoint directory"):
        pretrained.check_architecture(str(FIXTURES), cfg)

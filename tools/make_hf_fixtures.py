"""Build the Hugging Face fixtures of tests/fixtures/hf with transformers and torch, and hold
an export of loire_jax to transformers' own logits.

Run by hand, where transformers and torch are installed (CPU wheels suffice):

    python tools/make_hf_fixtures.py                 # every fixture, afresh
    python tools/make_hf_fixtures.py bert roberta    # only these (the encoders)
    python tools/make_hf_fixtures.py qwen2 mistral   # only these (a family of its own seed)
    python tools/make_hf_fixtures.py unsupported     # only the config-only refusal cases
    python tools/make_hf_fixtures.py --check OUT     # transformers loads OUT; logits vs OUT/logits.npy

and, in loire_jax's own environment (no torch), the exports that ``--check`` holds to transformers:

    python tools/make_hf_fixtures.py --export OUT    # every fixture grown, exported to OUT/<name>, with its logits

It builds tiny randomly initialised models with transformers itself, saves each as a
checkpoint directory (``config.json`` + safetensors, some sharded with an index), and saves
transformers' float32 logits on fixed tokens next to it. The tests read these without torch:
they are the reference the importer is held to. Every value comes from a fixed seed, so
rerunning it rewrites the same models. The first decoders (gpt2, llama_*) draw from one stream
seeded once, so they are rebuilt together or not at all; every later fixture (the encoders,
qwen2, mistral, gemma, phi3) has its own seed in ``SEEDS``, so it can be rebuilt alone without
touching the others. The encoders have their own inputs (``tokens.npy``, ``mask.npy``: a batch
with trailing padding, whose logits are compared at the valid positions only).
``VERSIONS.json`` names the transformers and torch of the last full build, and of each fixture
built alone since (with its seed, and the attention implementation where it is not the default).

``unsupported/<case>/config.json`` are real config.json files, without weights, of families and
features loire_jax refuses (Gemma 2's soft-capping and local/global layers, rope scalings it
lacks, mixtures of experts, quantized checkpoints): the refusal tests read them.

``--export`` grows each fixture by every operator (ffn, hidden, heads to the fewest its family
can export, then a layer whose gate is set to 1, as after its ramp),
exports it with loire_jax and saves loire_jax's float32 logits (and an encoder's inputs) beside
it; ``--check OUT/*`` then holds each to transformers, and ``--record`` keeps the results
(``tests/fixtures/hf/export_check.json``, read by tests/test_hf_families.py and docs/interop.md).

``--check`` is the other direction: a directory loire_jax exported is loaded by transformers
(refused if any tensor is missing, unexpected or misshapen: transformers would initialise it
at random) and its float32 logits compared with a reference saved by loire_jax (default
``DIR/logits.npy``; the inputs are ``DIR/tokens.npy`` and ``DIR/mask.npy`` when present, else
the fixtures' ``tokens.npy``), to within ``--rtol`` of the largest reference logit.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "hf"
VOCAB = 100  # not a multiple of pad_vocab_to: import must pad and export strip
TOKENS = np.random.default_rng(0).integers(0, VOCAB, (2, 12)).astype(np.int64)
# The encoders' batch: ids from 2 up (neither BERT's padding id 0 nor RoBERTa's 1 inside a
# sequence), lengths 12, 8 and 3, the rest the model's padding id.
ENCODER_LENGTHS = (12, 8, 3)
ENCODER_IDS = np.random.default_rng(1).integers(2, VOCAB, (len(ENCODER_LENGTHS), 12)).astype(np.int64)
ENCODER_MASK = np.arange(12)[None, :] < np.array(ENCODER_LENGTHS)[:, None]
ENCODERS = ("bert", "roberta")
# Fixtures with a seed of their own (the others draw from the shared stream, seeded 0 once).
SEEDS = {"bert": 1, "roberta": 2, "qwen2": 3, "qwen2_tied": 4, "mistral": 5, "gemma": 6, "phi3": 7}
UNSUPPORTED = "unsupported"
RTOL = 1e-5  # as tests/test_hf.py's IMPORT_RTOL: of the largest logit


class Fixture(NamedTuple):
    name: str
    build: Callable  # () -> a transformers model, randomly initialised
    shard: str | None = None  # save_pretrained's max_shard_size, for an index
    attn: str | None = None  # attn_implementation, where not transformers' default


def _models():
    """Every fixture, the shared-stream decoders first (their order fixes their values)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    gpt2 = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                      bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    yield Fixture("gpt2", lambda: GPT2LMHeadModel(gpt2))
    # Grouped-query attention (4 query heads over 2 key/value heads), head_dim not
    # hidden/heads, untied head, Llama 3.1's rope scaling; saved in two shards with an index.
    llama = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=64,
                        rms_norm_eps=1e-5, tie_word_embeddings=False,
                        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 16})
    yield Fixture("llama_gqa", lambda: LlamaForCausalLM(llama), "40KB")
    # Multi-head attention, tied head, plain RoPE.
    tied = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                       tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    yield Fixture("llama_tied", lambda: LlamaForCausalLM(tied))
    yield from _families()
    yield from _encoders()


def _families():
    """Today's decoder families, each with its own seed."""
    from transformers import AutoModelForCausalLM, GemmaConfig, MistralConfig, Phi3Config, Qwen2Config

    def build(config, attn=None):
        return lambda: AutoModelForCausalLM.from_config(config, **({"attn_implementation": attn} if attn else {}))

    common = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "max_position_embeddings": 64}
    # Qwen2: bias on q, k and v only (Qwen2's attention has them always, o_proj never), GQA
    # 4 over 2, Qwen's rope theta; untied, and tied as the small Qwen2.5 checkpoints are.
    for name, tie in (("qwen2", False), ("qwen2_tied", True)):
        qwen = Qwen2Config(**common, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                           rms_norm_eps=1e-6, tie_word_embeddings=tie, bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1,
                           rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
        yield Fixture(name, build(qwen))
    # Mistral: GQA 4 over 2 and a sliding window of 4 on 12 tokens (query i sees keys i-3..i),
    # so the window changes the logits from position 4 on (_check_window proves it at build).
    # Eager attention: the window is an explicit additive mask on the scores.
    mistral = MistralConfig(**common, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=8, sliding_window=4, rms_norm_eps=1e-5, tie_word_embeddings=False,
                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    yield Fixture("mistral", build(mistral, "eager"), attn="eager")
    # Gemma (1): RMSNorm gain (1 + w), embeddings x sqrt(hidden), GeGLU with the tanh GELU, a
    # tied head, head_dim 16 with hidden 32 and 4 heads, one key/value head (as gemma-2b).
    gemma = GemmaConfig(**common, intermediate_size=64, num_attention_heads=4, num_key_value_heads=1,
                        head_dim=16, hidden_act="gelu_pytorch_tanh", rms_norm_eps=1e-6, tie_word_embeddings=True,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    yield Fixture("gemma", build(gemma))
    # Phi-3: fused qkv_proj (q, then k, then v rows) and gate_up_proj (gate rows, then up),
    # GQA 4 over 2 (as Phi-3-medium) so that the split depends on the key/value heads, full
    # rotary, no rope scaling, no window, untied.
    phi3 = Phi3Config(**common, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                      original_max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False,
                      bos_token_id=1, eos_token_id=VOCAB - 1, pad_token_id=VOCAB - 1, sliding_window=None,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0})
    yield Fixture("phi3", build(phi3))


def _encoders():
    from transformers import BertConfig, BertForMaskedLM, RobertaConfig, RobertaForMaskedLM

    # BERT as published: exact GELU, LayerNorm eps 1e-12, two token types, tied head.
    bert = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=32, type_vocab_size=2)
    yield Fixture("bert", lambda: BertForMaskedLM(bert))
    # RoBERTa: positions offset past the padding id 1, one token type, eps 1e-5; here with an
    # untied head (so with the output layer's own bias) and saved in shards with an index.
    roberta = RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=48, max_position_embeddings=34, type_vocab_size=1, layer_norm_eps=1e-5,
                            pad_token_id=1, bos_token_id=0, eos_token_id=2, tie_word_embeddings=False)
    yield Fixture("roberta", lambda: RobertaForMaskedLM(roberta), "40KB")


def _unsupported() -> dict[str, dict]:
    """config.json of each family or feature loire_jax refuses, by case name."""
    import torch
    from transformers import (
        BitsAndBytesConfig,
        Gemma2Config,
        GPTQConfig,
        LlamaConfig,
        MixtralConfig,
        Phi3Config,
        Qwen2MoeConfig,
    )

    small = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "max_position_embeddings": 64}
    cases = {
        # Gemma 2: attention and final logit soft-capping, sliding and full layers alternating
        "gemma2": (Gemma2Config(**small, intermediate_size=64, head_dim=16, sliding_window=4,
                                attn_logit_softcapping=50.0, final_logit_softcapping=30.0, query_pre_attn_scalar=16),
                   "Gemma2ForCausalLM"),
        # rope scalings loire_jax lacks: YaRN (as transformers 5 writes it) and Phi-3's LongRoPE
        "llama_rope_yarn": (LlamaConfig(**small, intermediate_size=48, rope_parameters={
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16}),
            "LlamaForCausalLM"),
        "phi3_longrope": (Phi3Config(**small, intermediate_size=48, original_max_position_embeddings=16,
                                     pad_token_id=VOCAB - 1, eos_token_id=VOCAB - 1, rope_parameters={
                                         "rope_type": "longrope", "rope_theta": 10000.0,
                                         "short_factor": [1.0, 1.0, 1.0, 1.0], "long_factor": [1.0, 2.0, 4.0, 8.0]}),
                          "Phi3ForCausalLM"),
        # mixtures of experts
        "mixtral": (MixtralConfig(**small, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2,
                                  sliding_window=None), "MixtralForCausalLM"),
        "qwen2_moe": (Qwen2MoeConfig(**small, intermediate_size=48, moe_intermediate_size=16,
                                     shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2),
                      "Qwen2MoeForCausalLM"),
    }
    written = {}
    for case, (config, architecture) in cases.items():
        config.architectures = [architecture]
        written[case] = config.to_diff_dict()  # as save_pretrained writes it
    # quantized Llama checkpoints: the block transformers writes into config.json
    llama = LlamaConfig(**small, intermediate_size=48)
    llama.architectures = ["LlamaForCausalLM"]
    for case, quant in (("llama_bnb_4bit", BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)),
                        ("llama_gptq", GPTQConfig(bits=4, group_size=32, desc_act=False))):
        written[case] = {**llama.to_diff_dict(), "quantization_config": quant.to_dict()}
    # Llama with dynamic NTK scaling as transformers 4 wrote it (rope_scaling, "type", rope_theta
    # at the top), the spelling of most checkpoints on the hub: written by hand
    legacy = {k: v for k, v in llama.to_diff_dict().items() if k != "rope_parameters"}
    written["llama_rope_dynamic_v4"] = {**legacy, "rope_theta": 10000.0, "transformers_version": "4.44.2",
                                        "rope_scaling": {"type": "dynamic", "factor": 2.0}}
    return written


def _randomize(model) -> None:
    import torch

    with torch.no_grad():
        for pname, p in model.named_parameters():
            lower = pname.lower()  # BERT's "LayerNorm"
            if pname.endswith("bias") or "ln" in lower or "norm" in lower:
                # nonzero biases and gains (Gemma's (1 + w) ones included: its init is w = 0),
                # so that no mapping error hides behind a 0 or a 1
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "weight" in pname else 0.0))
            else:
                # weights large enough that activations leave GELU's and softmax's near-linear
                # range: an exact GELU in place of GPT-2's tanh form must show in the logits
                p.normal_(0.0, 0.25)


def _logits(name: str, model) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """float32 logits on the fixed inputs, and the inputs to save beside them (encoders)."""
    import torch

    with torch.no_grad():
        if name not in ENCODERS:
            return model(torch.from_numpy(TOKENS)).logits.float().numpy(), {}
        ids = np.where(ENCODER_MASK, ENCODER_IDS, model.config.pad_token_id)
        mask = torch.from_numpy(ENCODER_MASK.astype(np.int64))
        logits = model(torch.from_numpy(ids), attention_mask=mask).logits.float().numpy()
        return logits, {"tokens.npy": ids.astype(np.int32), "mask.npy": ENCODER_MASK}


def _check_window(model, logits: np.ndarray) -> str:
    """The fixture's sliding window must matter: the same weights without it give the same
    logits before position ``window`` and others from it on; sdpa must agree with eager."""
    import torch
    from transformers import AutoModelForCausalLM

    window = model.config.sliding_window
    reference = float(np.max(np.abs(logits)))
    found = {}
    for label, change, attn in (("no window", {"sliding_window": None}, "eager"), ("sdpa", {}, "sdpa")):
        config = type(model.config).from_dict({**model.config.to_dict(), **change})
        other = AutoModelForCausalLM.from_config(config, attn_implementation=attn).eval()
        other.load_state_dict(model.state_dict())
        with torch.no_grad():
            found[label] = np.abs(other(torch.from_numpy(TOKENS)).logits.float().numpy() - logits).max(axis=(0, 2))
    before, after = found["no window"][:window], found["no window"][window:]
    if not after.size or np.any(before) or np.min(after) < 1e-2 * reference or found["sdpa"].max() > RTOL * reference:
        raise SystemExit(f"error: the sliding window does not act as it should: without it the logits move by "
                         f"{found['no window'].tolist()} per position; sdpa vs eager {found['sdpa'].max():.2e}")
    return (f"window {window}: positions 0..{window - 1} equal without it; positions {window}..{len(after) + window - 1}"
            f" move by {after.min():.3g}..{after.max():.3g} (largest logit {reference:.3g}); sdpa agrees to "
            f"{found['sdpa'].max():.2e}")


def _build(fixture: Fixture) -> None:
    import torch

    if fixture.name in SEEDS:
        torch.manual_seed(SEEDS[fixture.name])
    model = fixture.build()
    _randomize(model)
    model.eval()
    logits, inputs = _logits(fixture.name, model)
    # checked before anything is written: a window that does not act is no Mistral fixture
    note = f"; {_check_window(model, logits)}" if getattr(model.config, "sliding_window", None) else ""
    folder = OUT / fixture.name
    if folder.exists():
        shutil.rmtree(folder)
    model.save_pretrained(folder, **({"max_shard_size": fixture.shard} if fixture.shard else {}))
    for file, array in {**inputs, "logits.npy": logits}.items():
        np.save(folder / file, array)
    files = sorted(p.name for p in folder.iterdir())
    print(f"{fixture.name}: {files}, logits {logits.shape}{note}")


def _write_unsupported() -> None:
    root = OUT / UNSUPPORTED
    if root.exists():
        shutil.rmtree(root)
    for case, config in _unsupported().items():
        (root / case).mkdir(parents=True)
        (root / case / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    print(f"{UNSUPPORTED}: {sorted(p.name for p in root.iterdir())}")


def _quiet() -> None:
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()  # the load report too: --check names what it found


def build(names: list[str]) -> int:
    import torch
    import transformers

    _quiet()
    versions = {"transformers": transformers.__version__, "torch": torch.__version__}
    fixtures = list(_models())
    known = {f.name for f in fixtures} | {UNSUPPORTED}
    unknown = sorted(set(names) - known)
    shared = sorted(set(names) - set(SEEDS) - {UNSUPPORTED} - set(unknown))
    if unknown or shared:
        print(f"error: unknown fixture(s) {unknown}; known: {sorted(known)}" if unknown else
              f"error: {shared} draw from the decoders' shared seed: rebuild every fixture (no arguments)",
              file=sys.stderr)
        return 2
    torch.manual_seed(0)
    if not names:
        if OUT.exists():
            shutil.rmtree(OUT)
        OUT.mkdir(parents=True)
        np.save(OUT / "tokens.npy", TOKENS.astype(np.int32))
    record = versions.copy() if not names else json.loads((OUT / "VERSIONS.json").read_text())
    for fixture in fixtures:
        if names and fixture.name not in names:
            continue
        _build(fixture)
        # a fixture built alone names its own versions; one of its own seed says it, and how it attends
        extra = {**({"seed": SEEDS[fixture.name]} if fixture.name in SEEDS and fixture.name not in ENCODERS else {}),
                 **({"attn_implementation": fixture.attn} if fixture.attn else {})}
        if names or extra:
            record[fixture.name] = {**versions, **extra}
    if not names or UNSUPPORTED in names:
        _write_unsupported()
        record[UNSUPPORTED] = versions
    (OUT / "VERSIONS.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0


# --------------------------------------------------------------------------- --check
def _inputs(folder: Path, tokens: Path | None, mask: Path | None) -> tuple[np.ndarray, np.ndarray | None]:
    tokens = tokens or (folder / "tokens.npy" if (folder / "tokens.npy").exists() else OUT / "tokens.npy")
    mask = mask or (folder / "mask.npy" if (folder / "mask.npy").exists() else None)
    ids = np.load(tokens).astype(np.int64)
    valid = None if mask is None else np.load(mask).astype(bool)
    if ids.ndim != 2 or (valid is not None and valid.shape != ids.shape):
        raise ValueError(f"tokens {tokens} must be [batch, seq] (got {list(ids.shape)}), and the mask the same shape")
    return ids, valid


def check_one(folder: Path, reference: Path | None = None, tokens: Path | None = None, mask: Path | None = None,
              rtol: float = RTOL) -> dict:
    """transformers' float32 logits of the checkpoint in ``folder`` against loire_jax's."""
    import torch
    import transformers

    config_file, reference = folder / "config.json", reference or folder / "logits.npy"
    for path in (config_file, reference):
        if not path.is_file():
            raise ValueError(f"{path}: missing (an export of loire_jax and the logits it computed on the inputs)")
    ids, valid = _inputs(folder, tokens, mask)
    architecture = (json.loads(config_file.read_text()).get("architectures") or ["?"])[0]
    auto = transformers.AutoModelForMaskedLM if architecture.endswith("ForMaskedLM") \
        else transformers.AutoModelForCausalLM
    model, info = auto.from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
    built = type(model).__name__
    problems = [f"{k.removesuffix('_keys')} {sorted(map(str, v))[:3]}{' ...' if len(v) > 3 else ''}"
                for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v]
    if built != architecture or problems:
        raise ValueError(f"{folder}: transformers " + (f"built {built} for {architecture}" if built != architecture else
                                                       f"would initialise at random: {'; '.join(problems)}"))
    with torch.no_grad():
        kwargs = {} if valid is None else {"attention_mask": torch.from_numpy(valid.astype(np.int64))}
        theirs = model.eval()(torch.from_numpy(ids), **kwargs).logits.float().numpy()
    ours = np.load(reference).astype(np.float64)
    if ours.shape[:2] != theirs.shape[:2] or ours.shape[2] < theirs.shape[2] or np.any(ours[..., theirs.shape[2]:]):
        raise ValueError(f"{reference}: shape {list(ours.shape)} (nonzero past the vocabulary, or other inputs) "
                         f"against transformers' {list(theirs.shape)}")
    ours = ours[..., :theirs.shape[2]]  # loire_jax's padded vocabulary: its padding columns are zero
    at = (slice(None),) if valid is None else (valid,)
    delta, largest = float(np.max(np.abs(theirs[at] - ours[at]))), float(np.max(np.abs(ours[at])))
    return {"dir": str(folder), "name": folder.name, "architecture": architecture, "max_abs_delta": delta, "largest_logit": largest,
            "relative": delta / largest, "rtol": rtol, "ok": delta <= rtol * largest}


def check(args: argparse.Namespace) -> int:
    import torch
    import transformers

    if len(args.check) > 1 and args.reference:
        print("error: --reference goes with a single --check directory (each other one reads its logits.npy)",
              file=sys.stderr)
        return 2
    _quiet()
    results = []
    for folder in args.check:
        try:
            result = check_one(Path(folder), args.reference, args.tokens, args.mask, args.rtol)
        except (ValueError, OSError, KeyError) as e:
            print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
            return 2
        results.append(result)
        print(f"{'ok' if result['ok'] else 'FAIL'} {folder} ({result['architecture']}): max |delta| "
              f"{result['max_abs_delta']:.3g} = {result['relative']:.2e} of the largest logit (bound {args.rtol:g})")
    if args.record:
        versions = {"transformers": transformers.__version__, "torch": torch.__version__}
        Path(args.record).write_text(json.dumps({**versions, "results": results}, indent=1) + "\n")
    return 0 if all(r["ok"] for r in results) else 1


# --------------------------------------------------------------------------- --export (loire_jax's side)
def _expressible(cfg, heads: int) -> bool:
    """Whether heads growth to ``heads`` is possible and its family can export the result."""
    from loire_jax import plan_growth
    from loire_jax.interop import hf

    try:
        hf.config_to_hf(plan_growth(cfg, "heads", heads).new)
    except ValueError:  # a GrowthError or an HFError
        return False
    return True


def export(out: Path) -> int:
    """Every fixture grown and exported by loire_jax, with the logits it computes, for ``--check``."""
    import jax
    import jax.numpy as jnp

    from loire_jax import apply_model, grow
    from loire_jax.interop import hf

    if out.exists() and any(out.iterdir()):
        print(f"error: {out} exists and is not empty; give a new directory", file=sys.stderr)
        return 2
    names = sorted(p.name for p in OUT.iterdir() if (p / "config.json").is_file() and p.name != UNSUPPORTED)
    for i, name in enumerate(names):
        cfg, params = hf.load(OUT / name)
        key = iter(jax.random.split(jax.random.key(i), 4))
        steps = [("ffn", cfg.ffn + 8), ("hidden", 2 * cfg.hidden)]
        for op, size in steps:
            cfg, params = grow(cfg, params, op, size, next(key))
        heads = next(n for n in range(cfg.heads + 1, 4 * cfg.hidden) if _expressible(cfg, n))
        cfg, params = grow(cfg, params, "heads", heads, next(key))
        steps.append(("heads", heads))
        cfg, params = grow(cfg, params, "layers", cfg.layers + 1, next(key))
        params = {**params, "gates": jnp.ones_like(params["gates"])}  # the copy, once its gate has ramped to 1
        steps.append(("layers", cfg.layers))
        folder = hf.save(cfg, params, out / name)
        inputs = {f: np.load(OUT / name / f) for f in ("tokens.npy", "mask.npy") if (OUT / name / f).exists()}
        tokens = inputs.get("tokens.npy", np.load(OUT / "tokens.npy"))
        mask = inputs.get("mask.npy")
        logits = apply_model(cfg, params, jnp.asarray(tokens, jnp.int32), None if mask is None else jnp.asarray(mask))
        for file, array in {**inputs, "logits.npy": np.asarray(logits, np.float32)}.items():
            np.save(folder / file, array)
        print(f"{name}: grown by {', '.join(f'{op} to {size}' for op, size in steps)}, exported to {folder}")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="fixtures to rebuild (none: all, afresh)")
    parser.add_argument("--check", nargs="+", metavar="DIR", help="exports of loire_jax to load in transformers")
    parser.add_argument("--reference", type=Path, help="loire_jax's logits (default DIR/logits.npy)")
    parser.add_argument("--tokens", type=Path, help="inputs [batch, seq] (default DIR/tokens.npy, else the fixtures')")
    parser.add_argument("--mask", type=Path, help="valid positions, for encoders (default DIR/mask.npy if present)")
    parser.add_argument("--rtol", type=float, default=RTOL, help="bound, of the largest reference logit")
    parser.add_argument("--record", type=Path, help="write the results as JSON here")
    parser.add_argument("--export", type=Path, metavar="OUT", help="(loire_jax's environment) grow and export every "
                                                                   "fixture to OUT/<name> for --check")
    args = parser.parse_args(argv)
    if (args.check or args.export) and args.names:
        parser.error("--check and --export build nothing: give fixture names, --check or --export")
    if args.check and args.export:
        parser.error("--export runs where loire_jax is installed, --check where transformers is: one at a time")
    return check(args) if args.check else export(args.export) if args.export else build(args.names)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

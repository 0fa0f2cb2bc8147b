"""Build the Hugging Face fixtures of tests/fixtures/hf with transformers and torch.

Run once, by hand, where transformers and torch are installed (CPU wheels suffice):

    python tools/make_hf_fixtures.py            # every fixture, afresh
    python tools/make_hf_fixtures.py bert roberta   # only these (the encoders)

It builds tiny randomly initialised models with transformers itself, saves each as a
checkpoint directory (``config.json`` + safetensors, some sharded with an index), and saves
transformers' float32 logits on fixed tokens next to it. The tests read these without torch:
they are the reference the importer is held to. Every value comes from a fixed seed, so
rerunning it rewrites the same models. The decoders (gpt2, llama_*) draw from one stream
seeded once, so they are rebuilt together or not at all; each encoder has its own seed and
its own inputs (``tokens.npy``, ``mask.npy``: a batch with trailing padding, whose logits are
compared at the valid positions only), so it can be rebuilt alone. ``VERSIONS.json`` names
the transformers and torch of the last full build, and of each fixture built alone since.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "hf"
VOCAB = 100  # not a multiple of pad_vocab_to: import must pad and export strip
TOKENS = np.random.default_rng(0).integers(0, VOCAB, (2, 12)).astype(np.int64)
# The encoders' batch: ids from 2 up (neither BERT's padding id 0 nor RoBERTa's 1 inside a
# sequence), lengths 12, 8 and 3, the rest the model's padding id.
ENCODER_LENGTHS = (12, 8, 3)
ENCODER_IDS = np.random.default_rng(1).integers(2, VOCAB, (len(ENCODER_LENGTHS), 12)).astype(np.int64)
ENCODER_MASK = np.arange(12)[None, :] < np.array(ENCODER_LENGTHS)[:, None]
ENCODER_SEEDS = {"bert": 1, "roberta": 2}


def _models():
    """(name, a function that builds the model, max_shard_size or None), decoders first."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    gpt2 = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                      bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    yield "gpt2", lambda: GPT2LMHeadModel(gpt2), None
    # Grouped-query attention (4 query heads over 2 key/value heads), head_dim not
    # hidden/heads, untied head, Llama 3.1's rope scaling; saved in two shards with an index.
    llama = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=64,
                        rms_norm_eps=1e-5, tie_word_embeddings=False,
                        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 16})
    yield "llama_gqa", lambda: LlamaForCausalLM(llama), "40KB"
    # Multi-head attention, tied head, plain RoPE.
    tied = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                       tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    yield "llama_tied", lambda: LlamaForCausalLM(tied), None
    yield from _encoders()


def _encoders():
    from transformers import BertConfig, BertForMaskedLM, RobertaConfig, RobertaForMaskedLM

    # BERT as published: exact GELU, LayerNorm eps 1e-12, two token types, tied head.
    bert = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=32, type_vocab_size=2)
    yield "bert", lambda: BertForMaskedLM(bert), None
    # RoBERTa: positions offset past the padding id 1, one token type, eps 1e-5; here with an
    # untied head (so with the output layer's own bias) and saved in shards with an index.
    roberta = RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=48, max_position_embeddings=34, type_vocab_size=1, layer_norm_eps=1e-5,
                            pad_token_id=1, bos_token_id=0, eos_token_id=2, tie_word_embeddings=False)
    yield "roberta", lambda: RobertaForMaskedLM(roberta), "40KB"


def _randomize(model) -> None:
    import torch

    with torch.no_grad():
        for pname, p in model.named_parameters():
            lower = pname.lower()  # BERT's "LayerNorm"
            if pname.endswith("bias") or "ln" in lower or "norm" in lower:
                # nonzero biases and gains, so that no mapping error hides behind a 0 or a 1
                p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "weight" in pname else 0.0))
            else:
                # weights large enough that activations leave GELU's and softmax's near-linear
                # range: an exact GELU in place of GPT-2's tanh form must show in the logits
                p.normal_(0.0, 0.25)


def _logits(name: str, model, folder: Path) -> np.ndarray:
    import torch

    with torch.no_grad():
        if name not in ENCODER_SEEDS:
            return model(torch.from_numpy(TOKENS)).logits.float().numpy()
        ids = np.where(ENCODER_MASK, ENCODER_IDS, model.config.pad_token_id)
        np.save(folder / "tokens.npy", ids.astype(np.int32))
        np.save(folder / "mask.npy", ENCODER_MASK)
        mask = torch.from_numpy(ENCODER_MASK.astype(np.int64))
        return model(torch.from_numpy(ids), attention_mask=mask).logits.float().numpy()


def main(argv: list[str]) -> int:
    import torch
    import transformers

    versions = {"transformers": transformers.__version__, "torch": torch.__version__}
    models = list(_models())
    unknown = sorted(set(argv) - {name for name, _, _ in models})
    shared = sorted(set(argv) - set(ENCODER_SEEDS) - set(unknown))
    if unknown or shared:
        print(f"unknown fixture(s) {unknown}" if unknown else f"{shared} draw from the decoders' shared seed: "
              "rebuild every fixture (no arguments)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    if not argv:
        if OUT.exists():
            shutil.rmtree(OUT)
        OUT.mkdir(parents=True)
        np.save(OUT / "tokens.npy", TOKENS.astype(np.int32))
    record = {} if not argv else json.loads((OUT / "VERSIONS.json").read_text())
    for name, build, shard in models:
        if argv and name not in argv:
            continue
        if name in ENCODER_SEEDS:
            torch.manual_seed(ENCODER_SEEDS[name])
        model = build()
        _randomize(model)
        model.eval()
        folder = OUT / name
        if folder.exists():
            shutil.rmtree(folder)
        model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
        logits = _logits(name, model, folder)
        np.save(folder / "logits.npy", logits)
        files = sorted(p.name for p in folder.iterdir())
        print(f"{name}: {files}, logits {logits.shape}")
        if argv:
            record[name] = versions
    record = record if argv else versions
    (OUT / "VERSIONS.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

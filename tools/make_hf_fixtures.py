"""Build the Hugging Face fixtures of tests/fixtures/hf with transformers and torch.

Run once, by hand, where transformers and torch are installed (CPU wheels suffice):

    python tools/make_hf_fixtures.py

It builds tiny randomly initialised models with transformers itself, saves each as a
checkpoint directory (``config.json`` + safetensors, one of them sharded with an index),
and saves transformers' float32 logits on fixed tokens next to it. The tests read these
without torch: they are the reference the importer is held to. Every value comes from a
fixed seed, so rerunning it rewrites the same models.
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


def _models():
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    gpt2 = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                      bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    yield "gpt2", GPT2LMHeadModel(gpt2), None
    # Grouped-query attention (4 query heads over 2 key/value heads), head_dim not
    # hidden/heads, untied head, Llama 3.1's rope scaling; saved in two shards with an index.
    llama = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=64,
                        rms_norm_eps=1e-5, tie_word_embeddings=False,
                        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 16})
    yield "llama_gqa", LlamaForCausalLM(llama), "40KB"
    # Multi-head attention, tied head, plain RoPE.
    tied = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                       tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    yield "llama_tied", LlamaForCausalLM(tied), None


def main() -> int:
    import torch

    torch.manual_seed(0)
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    np.save(OUT / "tokens.npy", TOKENS.astype(np.int32))
    for name, model, shard in _models():
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if pname.endswith("bias") or "ln" in pname or "norm" in pname:
                    # nonzero biases and gains, so that no mapping error hides behind a 0 or a 1
                    p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "weight" in pname else 0.0))
                else:
                    # weights large enough that activations leave GELU's and softmax's near-linear
                    # range: an exact GELU in place of GPT-2's tanh form must show in the logits
                    p.normal_(0.0, 0.25)
        model.eval()
        folder = OUT / name
        model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
        with torch.no_grad():
            logits = model(torch.from_numpy(TOKENS)).logits.float().numpy()
        np.save(folder / "logits.npy", logits)
        files = sorted(p.name for p in folder.iterdir())
        print(f"{name}: {files}, logits {logits.shape}")
    import transformers

    (OUT / "VERSIONS.json").write_text(json.dumps({"transformers": transformers.__version__,
                                                    "torch": torch.__version__}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

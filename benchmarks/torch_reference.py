"""The paper's GPT and its LOIRE train step written plainly in PyTorch, for comparison.

Post-norm LayerNorm, exact GELU, learned positions, tied embeddings, biases (the ``paper``
preset); ``scaled_dot_product_attention`` with the causal flag; AdamW (fused on CUDA);
bf16 autocast when the JAX case runs in bf16; teachers run under ``no_grad`` and add
beta x KL(teacher || student) (eq. 15).

Two modes: ``eager`` (the step as written) and ``compile`` (``torch.compile`` of the
forward and loss, students' and teachers' together, so that the backward is compiled too
by AOTAutograd; the fused AdamW update stays as PyTorch runs it). The warm-up steps, where
``torch.compile`` compiles, are timed apart and excluded from tokens/s.

Used by ``benchmarks/bench_step.py --torch/--torch-compile`` and
``benchmarks/accelerator_check.py``, in processes of their own, so that no JAX allocator
shares the GPU with it; on a GPU each case gets one, so that its peak memory is its own.
It needs torch alone (no JAX, no loire_jax): a case names its models by their dimensions.

    python benchmarks/torch_reference.py --cases '[{"student": {...}, "teachers": [], "batch": 8, ...}]'
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from types import SimpleNamespace
from typing import Any

MODES = ("eager", "compile")
DIMS = ("vocab_size", "max_seq_len", "hidden", "ffn", "heads", "head_dim", "layers")


def _model(torch, cfg):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            inner = cfg.heads * cfg.head_dim
            self.qkv = nn.Linear(cfg.hidden, 3 * inner)
            self.out = nn.Linear(inner, cfg.hidden)
            self.up, self.down = nn.Linear(cfg.hidden, cfg.ffn), nn.Linear(cfg.ffn, cfg.hidden)
            self.n1, self.n2 = nn.LayerNorm(cfg.hidden), nn.LayerNorm(cfg.hidden)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, cfg.heads, cfg.head_dim).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)
            h = self.n1(x + self.out(a))
            return self.n2(h + self.down(F.gelu(self.up(h))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
            self.pos = nn.Embedding(cfg.max_seq_len, cfg.hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.layers))

        def forward(self, tokens):
            x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))[None]
            for blk in self.blocks:
                x = blk(x)
            return x @ self.embed.weight.T

    return GPT()


def _loss_fn(torch, model, t_models, device: str, bf16: bool):
    """Cross-entropy plus 0.1 x KL(teacher || student) per teacher: the distillation step's
    objective, as one function so that ``torch.compile`` sees the whole forward."""
    F = torch.nn.functional

    def loss_of(tokens):
        inp, tgt = tokens[:, :-1], tokens[:, 1:]
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            logp = F.log_softmax(model(inp).float(), -1)
            loss = F.nll_loss(logp.flatten(0, 1), tgt.flatten())
            for t in t_models:
                with torch.no_grad():
                    t_logp = F.log_softmax(t(inp).float(), -1)
                loss = loss + 0.1 * F.kl_div(logp, t_logp, log_target=True, reduction="none").sum(-1).mean()
        return loss

    return loss_of


def train_step_rate(student, teachers, case: dict[str, Any], torch, mode: str = "eager",
                    backend: str = "inductor") -> dict[str, Any]:
    """tokens/s (median over ``case['repeats']`` runs of ``case['steps']`` steps) of the
    PyTorch step in ``mode``, the warm-up's seconds (torch.compile's compilation) and, on
    CUDA, the peak memory allocated."""
    if mode not in MODES:
        raise ValueError(f"unknown torch mode {mode!r}; choose from {MODES}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = _model(torch, student).to(device)
    t_models = [_model(torch, t).to(device).eval() for t in teachers]
    bf16 = case["dtype"] == "bfloat16"
    for t in t_models:
        t.requires_grad_(False)
        if bf16:
            t.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, student.vocab_size, (case["batch"], case["seq"] + 1), generator=gen).to(device)
               for _ in range(4)]
    loss_of = _loss_fn(torch, model, t_models, device, bf16)
    if mode == "compile":
        loss_of = torch.compile(loss_of, backend=backend)

    def step(tokens):
        loss = loss_of(tokens)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    t = time.perf_counter()
    for i in range(2):  # torch.compile compiles in the first; the second must neither recompile nor be slow
        step(batches[i]).item()
    sync()
    warmup_s = time.perf_counter() - t
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    rates = []
    for _ in range(case["repeats"]):
        sync()
        t = time.perf_counter()
        for i in range(case["steps"]):
            loss = step(batches[i % 4])
        final = loss.item()
        sync()
        rates.append(case["steps"] * case["batch"] * case["seq"] / (time.perf_counter() - t))
    out = {"tokens_per_s": statistics.median(rates), "tokens_per_s_runs": rates, "warmup_s": warmup_s,
           "loss": final, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    if device == "cuda":
        out["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return out


def _namespace(dims: dict[str, Any]) -> SimpleNamespace:
    missing = [k for k in DIMS if k not in dims]
    if missing:
        raise ValueError(f"a model needs {list(DIMS)}; missing {missing}")
    return SimpleNamespace(**{k: int(dims[k]) for k in DIMS})


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    """One case in this process: a JSON-able record with tokens/s, or ``error`` (one line)
    when torch is missing or the step fails (out of memory, a compiler without a backend)."""
    record = {"mode": case.get("mode", "eager"), "backend": case.get("backend", "inductor")}
    try:
        import torch
    except ImportError as err:
        return dict(record, error=f"torch is not importable ({err}); it is a benchmark option only")
    record["torch_version"] = torch.__version__
    try:
        student = _namespace(case["student"])
        teachers = [_namespace(t) for t in case.get("teachers", [])]
        record.update(train_step_rate(student, teachers, case, torch, record["mode"], record["backend"]))
    except Exception as err:  # noqa: BLE001 - a record, not a crash: the caller's table shows it
        text = str(err).strip().splitlines()
        record["error"] = f"{type(err).__name__}: {text[0][:300] if text else ''}"
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", required=True, help="a JSON list of cases, each: student, teachers (model "
                        "dimensions), batch, seq, dtype, steps, repeats, mode (eager|compile), backend "
                        "(torch.compile's); timed one after another, a RECORD line each")
    args = parser.parse_args(argv)
    for case in json.loads(args.cases):
        print("RECORD " + json.dumps(run_case(case)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

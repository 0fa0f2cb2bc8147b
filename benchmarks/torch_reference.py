"""The paper's GPT and its LOIRE train step written plainly in PyTorch eager, for comparison.

Post-norm LayerNorm, exact GELU, learned positions, tied embeddings, biases (the ``paper``
preset); ``scaled_dot_product_attention`` with the causal flag; AdamW (fused on CUDA);
bf16 autocast when the JAX case runs in bf16; teachers run under ``no_grad`` and add
beta x KL(teacher || student) (eq. 15). Only ``benchmarks/bench_step.py --torch`` uses it.
"""

from __future__ import annotations

import statistics
import time


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


def train_step_rate(student, teachers, case, torch) -> float:
    """Median tokens/s of the PyTorch step, over the same steps and repeats as the JAX case."""
    F = torch.nn.functional
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

    def step(tokens):
        inp, tgt = tokens[:, :-1], tokens[:, 1:]
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            logits = model(inp).float()
            logp = F.log_softmax(logits, -1)
            loss = F.nll_loss(logp.flatten(0, 1), tgt.flatten())
            for t in t_models:
                with torch.no_grad():
                    t_logp = F.log_softmax(t(inp).float(), -1)
                loss = loss + 0.1 * F.kl_div(logp, t_logp, log_target=True, reduction="none").sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    step(batches[0]).item()
    rates = []
    for _ in range(case["repeats"]):
        sync()
        t = time.perf_counter()
        for i in range(case["steps"]):
            loss = step(batches[i % 4])
        loss.item()
        sync()
        rates.append(case["steps"] * case["batch"] * case["seq"] / (time.perf_counter() - t))
    return statistics.median(rates)

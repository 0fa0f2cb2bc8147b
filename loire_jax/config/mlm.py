"""Whether an encoder's windows can mask anything: checked before any compute.

A masked-LM loss and perplexity are over the selected (masked) tokens only. A window whose
positions are all special ([CLS] at 0, ELLE's domain prompt at 1) or a rate that expects
no selection in a whole batch would train on nothing and evaluate to exp(0 / 0) = "1.00":
a perfect score for a model that was never measured. Such configs are refused here.
"""

from __future__ import annotations

import math

__all__ = ["reserved_positions", "mlm_problems"]


def reserved_positions(domain_prompts: bool) -> int:
    """Positions of an encoder's window that are never masked: [CLS], and the domain prompt."""
    return 2 if domain_prompts else 1


def _at_least(x: float) -> str:
    """``x`` rounded up to two significant digits: a bound the message can quote safely."""
    scale = 10.0 ** (math.floor(math.log10(x)) - 1)
    return f"{math.ceil(x / scale - 1e-9) * scale:.2g}"


def mlm_problems(rate: float, *, seq_len: int, max_seq_len: int, batch_size: int,
                 domain_prompts: bool) -> list[str]:
    """What keeps an encoder run from masking a token: a window with no maskable position
    (``seq_len`` or ``model.max_seq_len`` too short), or ``rate`` x maskable positions x
    ``batch_size`` below one expected masked token per batch. Empty when it can mask."""
    reserved = reserved_positions(domain_prompts)
    what = "position 0 is [CLS]" + (" and 1 the domain prompt" if reserved > 1 else "")
    need = reserved + 1
    problems = [f"{name}={value} leaves an encoder no position to mask ({what}); set it to at least {need}"
                for name, value in (("model.max_seq_len", max_seq_len), ("seq_len", seq_len)) if value < need]
    if problems:
        return problems
    maskable = seq_len - reserved  # separators are unmaskable too: the true count can only be lower
    expected = rate * maskable * batch_size
    if expected < 1.0:
        problems.append(f"mlm.rate={rate:g} masks {expected:.2g} tokens of a batch on average (rate x {maskable} "
                        f"maskable positions x batch_size {batch_size}), so steps and evaluations would score no "
                        f"token; raise mlm.rate to at least {_at_least(1.0 / (maskable * batch_size))}, or seq_len "
                        "or batch_size")
    return problems

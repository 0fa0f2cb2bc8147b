"""The ``mlm`` section: an encoder's masking recipe, and whether its windows can mask anything.

Both are checked before any compute.

A masked-LM loss and perplexity are over the selected (masked) tokens only. A window whose
positions are all special ([CLS] at 0, ELLE's domain prompt at 1) or a rate that expects
no selection in a whole batch would train on nothing and evaluate to exp(0 / 0) = "1.00":
a perfect score for a model that was never measured. Such configs are refused here.
"""

from __future__ import annotations

import dataclasses
import math

from loire_jax.config.checks import is_int, is_num
from loire_jax.errors import raise_problems

__all__ = ["MlmConfig", "reserved_positions", "mlm_problems"]


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


@dataclasses.dataclass(frozen=True)
class MlmConfig:
    """Encoders' masked-LM recipe (BERT's): each non-special token is selected with
    probability ``rate``; a selected one becomes [MASK] with probability ``mask``, a random
    token with probability ``random``, and stays itself otherwise (``train.masking``).

    At most ``max_predictions`` tokens of a sequence are selected (BERT's
    ``max_predictions_per_seq``; the ones past it stay unmasked), and the output layer runs
    at those positions only. 0 (the default) sets it six standard deviations above the
    expected count, where truncation practically never happens: 128 of 512 tokens at 15%."""

    rate: float = 0.15
    mask: float = 0.8
    random: float = 0.1
    max_predictions: int = 0  # per sequence; 0: rate x seq_len + 6 sigma

    def predictions(self, seq_len: int) -> int:
        """The masked positions a sequence of ``seq_len`` tokens can hold."""
        if self.max_predictions:
            return min(self.max_predictions, seq_len)
        spread = 6.0 * math.sqrt(seq_len * self.rate * (1.0 - self.rate))
        return max(1, min(seq_len, math.ceil(self.rate * seq_len + spread)))

    def __post_init__(self) -> None:
        problems = []
        if not (is_int(self.max_predictions) and self.max_predictions >= 0):
            problems.append(f"max_predictions must be a non-negative integer (0: automatic), got {self.max_predictions!r}")
        if not (is_num(self.rate) and 0.0 < self.rate < 1.0):
            problems.append(f"rate must lie in (0, 1), got {self.rate!r}")
        shares = [getattr(self, n) for n in ("mask", "random")]
        if not all(is_num(v) and 0.0 <= v <= 1.0 for v in shares) or sum(shares) > 1.0:
            problems.append(f"mask ({self.mask!r}) and random ({self.random!r}) are shares of the selected tokens: "
                            "each in [0, 1], with a sum of at most 1")
        raise_problems(problems, "mlm")

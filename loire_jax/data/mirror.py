"""Keep a host's local data cache and the shared data store (``gs://``, NFS) in step.

ArrayRecord readers and ``np.memmap`` read local files only (ArrayRecord has no Cloud
Storage reader in its open-source build), so the stream is always built and read under
``DataConfig.root``. When ``data_dir`` is a shared store, the process that prepares pushes
what it built there and every other host pulls it before reading. Completion markers travel
last in both directions: whoever trusts a marker finds its files already in place, and a
copy cut short leaves no marker, so the next preparation verifies and rebuilds it.
"""

from __future__ import annotations

from loire_jax import paths
from loire_jax.config.data import DataConfig
from loire_jax.data.errors import DataError

# The markers the cache trusts (storage.MARKER, prepare.TOKENS_META, the summary).
_MARKERS = ("LOIRE_COMPLETE.json", "tokens_meta.json", "summary.json")


def _skip(rel: str) -> bool:
    # raw sources and the hashes of this host's source files: only the host that builds needs them
    return rel.split("/", 1)[0] == "downloads" or rel == "source_hashes.json"


def _last(rel: str) -> bool:
    return rel.rsplit("/", 1)[-1] in _MARKERS


def pull(cfg: DataConfig) -> int:
    """Copy what the store holds and the local cache lacks; returns the number of files."""
    return _sync(cfg, to_store=False)


def push(cfg: DataConfig) -> int:
    """Copy what the local cache built and the store lacks; returns the number of files."""
    return _sync(cfg, to_store=True)


def _sync(cfg: DataConfig, *, to_store: bool) -> int:
    if cfg.store is None:
        return 0
    store = paths.as_path(cfg.store)
    try:
        if to_store:
            store.mkdir(parents=True, exist_ok=True)
            return paths.sync_tree(cfg.root, store, skip=_skip, last=_last)
        return paths.sync_tree(store, cfg.root, skip=_skip, last=_last) if store.is_dir() else 0
    except OSError as err:  # a vanished mount, missing credentials, a full disk: one line
        raise DataError(f"cannot {'write' if to_store else 'read'} the data store {cfg.store}: "
                        f"{err.strerror or err}") from None

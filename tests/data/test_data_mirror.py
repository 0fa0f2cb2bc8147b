
"""Specification: a shared data store (gs://, NFS) is mirrored into each host's local cache.

The host that prepares pushes what it built (markers last, raw downloads never); every
other host pulls it and builds nothing. Tested with a local directory as the store: the
store side goes through the same path layer as gs:// (loire_jax.paths)."""

from __future__ import annotations

import dataclasses

import pytest

from loire_jax.config.loader import data_config_from_dict


def test_one_host_publishes_and_another_reads_it_without_building(tiny_cfg, tmp_path, monkeypatch, capsys):
    from loire_jax import paths
    from loire_jax.data import prepare, storage, tokenizers

    store = tmp_path / "store"
    builder = dataclasses.replace(tiny_cfg, data_dir=str(store), cache_dir=str(tiny_cfg.root))
    assert builder.store == str(store) and builder.root == tiny_cfg.root
    raw = tiny_cfg.root / "downloads" / "mirror-test-source.tar.gz"  # what a registry source leaves
    raw.parent.mkdir(exist_ok=True)
    raw.write_bytes(b"raw")
    order, copy = [], paths.copy_file
    monkeypatch.setattr(paths, "copy_file", lambda src, dst: (order.append(paths.as_path(dst).name), copy(src, dst)))
    try:
        built = prepare(builder, progress=False)
    finally:
        raw.unlink()
    marker = [name in ("LOIRE_COMPLETE.json", "tokens_meta.json", "summary.json") for name in order]
    assert any(marker) and marker == sorted(marker)  # every completion marker after every file it vouches for
    assert (store / "summary.json").exists() and not (store / "downloads").exists()
    markers = sorted(p.name for p in store.rglob("*.json"))
    assert "LOIRE_COMPLETE.json" in markers and "tokens_meta.json" in markers

    def no_building(*args, **kwargs):
        raise AssertionError("a host that pulls must not build")

    monkeypatch.setattr(storage, "write_domain", no_building)
    monkeypatch.setattr(tokenizers, "train_bpe", no_building)
    reader = dataclasses.replace(builder, cache_dir=str(tmp_path / "other_host"))
    assert prepare(reader, progress=True, publish=False) == {**built, "data_dir": str(tmp_path / "other_host")}
    assert "pulled" in capsys.readouterr().err


def test_a_remote_data_dir_gets_a_local_cache_and_a_remote_cache_is_refused():
    from loire_jax.data import ConfigError

    base = {"domains": [{"name": "SCI", "source": {"kind": "builtin", "corpus": "wb"}}]}
    cfg = data_config_from_dict({**base, "data_dir": "gs://bucket/loire"})
    assert cfg.store == "gs://bucket/loire" and "://" not in str(cfg.root) and "mirror" in str(cfg.root)
    other = cfg.with_data_dir("gs://bucket/other")  # another store never shares a derived cache
    assert other.store == "gs://bucket/other" and "mirror" in str(other.root) and other.root != cfg.root
    local = cfg.with_data_dir("/data/loire")
    assert local.store is None and str(local.root) == "/data/loire" and cfg.to_dict()["cache_dir"] == ""
    with pytest.raises(ConfigError, match="cache_dir must be a local path"):
        data_config_from_dict({**base, "cache_dir": "gs://bucket/cache"})

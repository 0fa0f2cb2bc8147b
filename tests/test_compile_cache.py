"""Specification: the CLI's persistent compilation cache is safe to share between processes.

JAX writes cache entries in place and takes its file lock only when the cache has a size
limit. Two runs on one host, or the processes of one multi-process run, compile the same
programs at the same moment; without the lock one of them can load an entry the other is
still writing."""


import jax
import pytest

from loire_jax.cli.devices import CACHE_LIMIT_BYTES, compile_cache  # noqa: E402


@pytest.fixture
def restore_cache_config():
    keys = ("jax_compilation_cache_dir", "jax_compilation_cache_max_size",
            "jax_persistent_cache_min_compile_time_secs", "jax_persistent_cache_min_entry_size_bytes")
    saved = {key: getattr(jax.config, key) for key in keys}
    yield
    for key, value in saved.items():
        jax.config.update(key, value)


@pytest.mark.parametrize("asked, limit", [(-1, CACHE_LIMIT_BYTES), (0, CACHE_LIMIT_BYTES),
                                          (12345678, 12345678)])
def test_the_cache_always_has_a_size_limit_so_jax_locks_its_entries(asked, limit, tmp_path, restore_cache_config):
    jax.config.update("jax_compilation_cache_max_size", asked)  # what $JAX_COMPILATION_CACHE_MAX_SIZE sets
    where = compile_cache(str(tmp_path / "xla"))
    assert where == str(tmp_path / "xla" / f"1proc-{jax.local_device_count()}dev" / "process0")
    assert jax.config.jax_compilation_cache_dir == where
    assert jax.config.jax_compilation_cache_max_size == limit
    from jax._src.lru_cache import LRUCache  # the class JAX stores entries with
    assert LRUCache(where, max_size=jax.config.jax_compilation_cache_max_size).eviction_enabled


def test_off_leaves_the_cache_off(restore_cache_config):
    before = jax.config.jax_compilation_cache_dir
    assert compile_cache("off") is None
    assert jax.config.jax_compilation_cache_dir == before


def test_programs_under_a_tenth_of_a_second_are_not_cached_unless_the_user_says(tmp_path, monkeypatch,
                                                                                restore_cache_config):
    """0.1 s by default; $JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS, which JAX itself reads, wins."""
    monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", raising=False)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)  # JAX's own default
    compile_cache(str(tmp_path / "a"))
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.1
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # as JAX read it at import
    compile_cache(str(tmp_path / "b"))
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0

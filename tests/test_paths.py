"""Specification: one path layer for local disks and object stores (loire_jax.paths), the
workdir lock built on it, and the data store mirrored into each host's local cache.

Real Cloud Storage is not reachable here. The object-store code paths (no append, no
rename, create-if-absent by precondition) run on local paths by making ``is_local`` answer
False, and the gs:// lock runs against a stand-in for google-cloud-storage's client that
enforces the ``ifGenerationMatch=0`` precondition the way the service documents it."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from loire_jax import paths
from loire_jax.store import workdir as rundir


@pytest.fixture
def gs_backend(monkeypatch):
    """gcsfs stands installed (these tests touch no bucket; CI does not install the extra)."""
    paths._check_backend.cache_clear()
    monkeypatch.setattr(paths, "_check_backend", lambda kind: None)


@pytest.fixture
def object_store(monkeypatch):
    """Every path behaves as on an object store: appends and renames are not used."""
    monkeypatch.setattr(paths, "is_local", lambda path: False)


# --------------------------------------------------------------------------- URIs
def test_a_uri_without_its_filesystem_library_is_refused_in_one_line(monkeypatch):
    import fsspec

    def missing(kind):
        raise ImportError("Please install gcsfs to access Google Storage")

    paths._check_backend.cache_clear()
    monkeypatch.setattr(fsspec, "get_filesystem_class", missing)
    with pytest.raises(paths.PathError, match=r"gs:// paths cannot be used here .*pip install 'loire_jax\[gcs\]'"):
        paths.as_path("gs://bucket/run")
    from loire_jax.config.loader import load_data_config
    from loire_jax.data import ConfigError

    with pytest.raises(ConfigError, match="gs:// paths cannot be used here"):  # a config file named by URI too
        load_data_config("gs://bucket/domains.yaml")
    paths._check_backend.cache_clear()


def test_uris_keep_their_scheme_and_local_paths_expand(gs_backend):
    uri = paths.as_path("gs://bucket/runs/a") / "stage_1"
    assert str(uri) == "gs://bucket/runs/a/stage_1" and paths.scheme(uri) == "gs" and not paths.is_local(uri)
    assert str(paths.absolute("gs://bucket/x")) == "gs://bucket/x"  # epath's absolute() would prefix the cwd
    assert str(paths.as_path("~/x")) == str(Path("~/x").expanduser()) and paths.is_local("~/x")


def test_relative_paths_ignore_the_scheme_fsspec_drops_when_it_walks():
    assert paths.relative("bucket/runs/a/stage_1", "gs://bucket/runs/a") == "stage_1"
    assert paths.relative("gs://bucket/runs/a/", "gs://bucket/runs/a") == ""
    assert paths.relative("/data/tokens/x", "/data") == "tokens/x"
    with pytest.raises(ValueError, match="not under"):
        paths.relative("bucket/runs/ab", "gs://bucket/runs/a")


# --------------------------------------------------------------------------- create-if-absent
def test_exactly_one_of_many_racing_writers_creates_the_file(tmp_path):
    target, start = tmp_path / "lock", threading.Barrier(16)

    def race(i: int) -> bool:
        start.wait()
        return paths.create_exclusive(target, f"writer {i}")

    results: list[bool] = [False] * 16
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, race(i))) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(results) == 1 and target.read_text() == f"writer {results.index(True)}"


class _FakeGcs:
    """google.cloud.storage as far as create_exclusive uses it, with the service's rule:
    an upload with if_generation_match=0 fails with PreconditionFailed if the object exists."""

    def __init__(self):
        self.objects: dict[tuple[str, str], str] = {}
        outer = self

        class PreconditionFailed(Exception):
            pass

        class Blob:
            def __init__(self, bucket, name):
                self.key = (bucket, name)

            def upload_from_string(self, text, if_generation_match=None):
                if if_generation_match == 0 and self.key in outer.objects:
                    raise PreconditionFailed("412")
                outer.objects[self.key] = text

        class Client:
            def bucket(self, name):
                return types.SimpleNamespace(blob=lambda blob: Blob(name, blob))

        self.storage = types.SimpleNamespace(Client=Client)
        self.exceptions = types.SimpleNamespace(PreconditionFailed=PreconditionFailed)


def test_gs_create_if_absent_uses_the_generation_precondition(monkeypatch, gs_backend):
    fake = _FakeGcs()
    google = types.ModuleType("google")
    cloud, api_core = types.ModuleType("google.cloud"), types.ModuleType("google.api_core")
    cloud.storage, api_core.exceptions, google.cloud, google.api_core = fake.storage, fake.exceptions, cloud, api_core
    monkeypatch.setitem(sys.modules, "google", google)
    monkeypatch.setitem(sys.modules, "google.cloud", cloud)
    monkeypatch.setitem(sys.modules, "google.api_core", api_core)
    assert paths.create_exclusive("gs://bkt/runs/a/.lock", "first")
    assert not paths.create_exclusive("gs://bkt/runs/a/.lock", "second")
    assert fake.objects == {("bkt", "runs/a/.lock"): "first"}


def test_a_store_without_atomic_create_is_refused_with_what_to_use(monkeypatch):
    monkeypatch.setattr(paths, "_check_backend", lambda kind: None)
    with pytest.raises(paths.PathError, match="s3:// has no create-if-absent.*gs://"):
        paths.create_exclusive("s3://bucket/run/.lock", "x")


# --------------------------------------------------------------------------- writes
def test_an_atomic_write_leaves_the_old_or_the_new_file_and_no_temporaries(tmp_path):
    target = tmp_path / "config.json"
    paths.write_atomic(target, "old")
    paths.write_atomic(target, b"new")
    assert target.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["config.json"]
    plain = tmp_path / "plain.json"
    plain.write_text("x")  # what open() gives under this umask: the same for an atomic write
    assert target.stat().st_mode == plain.stat().st_mode


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="elsewhere the umask is read once")
def test_an_atomic_write_follows_the_umask_of_the_moment_it_writes(tmp_path):
    """The umask is read when a file is written, not when the package was imported (reading
    it at import meant setting it there: a side effect of ``import loire_jax``)."""
    paths.write_atomic(tmp_path / "before", "x")  # whatever was read first is not kept
    old = os.umask(0o077)
    try:
        paths.write_atomic(tmp_path / "private", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "private").stat().st_mode & 0o777 == 0o600


def test_on_an_object_store_the_log_is_rewritten_whole_at_most_every_period(tmp_path, object_store):
    now = [0.0]
    target = tmp_path / "metrics.jsonl"
    target.write_text('{"a": 1}\n{"torn')  # an earlier writer killed mid-line
    log = paths.AppendLog(target, every_s=30, clock=lambda: now[0])
    log.write('{"b": 2}')
    assert target.read_text() == '{"a": 1}\n{"torn'  # nothing appended in place
    now[0] = 31.0
    log.write('{"c": 3}')  # the period has passed: one rewrite with everything
    assert target.read_text() == '{"a": 1}\n{"torn\n{"b": 2}\n{"c": 3}\n'
    log.write('{"d": 4}')
    log.close()
    assert target.read_text().splitlines()[-1] == '{"d": 4}'


def test_a_local_log_appends_each_line_at_once(tmp_path):
    target = tmp_path / "python.log"
    log = paths.AppendLog(target)
    log.write("one")
    assert target.read_text() == "one\n"
    log.close()
    log.flush()  # flushing a closed log (an atexit hook after close) is harmless


# --------------------------------------------------------------------------- tree sync
def test_sync_copies_missing_and_changed_files_markers_last_and_deletes_nothing(tmp_path, monkeypatch):
    src, dst = tmp_path / "src", tmp_path / "dst"
    for rel, text in {"a/data.bin": "0123", "a/LOIRE_COMPLETE.json": "{}", "b.txt": "b", "downloads/raw.tar": "r",
                      ".tok-123/partial.bin": "p", "c.json.tmp": "t"}.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    (dst / "a").mkdir(parents=True)
    (dst / "a" / "data.bin").write_text("01")  # a copy cut short: another size
    (dst / "mine.txt").write_text("kept")
    order = []
    real = paths.copy_file
    monkeypatch.setattr(paths, "copy_file", lambda s, d: (order.append(Path(str(d)).name), real(s, d)))
    n = paths.sync_tree(src, dst, skip=lambda rel: rel.startswith("downloads/"),
                        last=lambda rel: rel.endswith("LOIRE_COMPLETE.json"))
    assert n == 3 and order[-1] == "LOIRE_COMPLETE.json" and set(order) == {"data.bin", "b.txt", "LOIRE_COMPLETE.json"}
    assert (dst / "a" / "data.bin").read_text() == "0123" and (dst / "mine.txt").read_text() == "kept"
    assert not (dst / "downloads").exists() and not (dst / ".tok-123").exists() and not (dst / "c.json.tmp").exists()
    assert paths.sync_tree(src, dst, skip=lambda rel: rel.startswith("downloads/")) == 0  # in step: nothing to do


# --------------------------------------------------------------------------- the lock's lease
def _foreign_lock(workdir: Path, age_s: float) -> None:
    then = time.time() - age_s
    (workdir / rundir.LOCK).write_text(json.dumps({"pid": 1, "host": "tpu-worker-7", "token": "theirs",
                                                   "started": then, "renewed": then}))


@pytest.fixture
def no_job(monkeypatch):
    """This process in no batch job (whatever the machine running the tests is in)."""
    for name in rundir.JOB_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _foreign_job_lock(workdir: Path, job: str | None) -> None:
    now = time.time()
    (workdir / rundir.LOCK).write_text(json.dumps({"pid": 4242, "host": "gpu-node-3", "job": job, "token": "earlier",
                                                   "started": now - 3600, "renewed": now - 2}))


def test_a_requeued_job_takes_its_own_lock_over_at_once_from_any_node(tmp_path, no_job):
    """A job requeued onto a new node after a node loss finds a lock its first attempt left,
    freshly renewed, naming another host: the same scheduler job id takes it at once; a
    different job, or no job, is refused in one line until the lease runs out."""
    _foreign_job_lock(tmp_path, "SLURM 81234")
    no_job.setenv("SLURM_JOB_ID", "81234")
    lock = rundir.WorkdirLock(tmp_path, lease_s=600)
    note = lock.acquire()
    assert "earlier attempt of this job (SLURM 81234: pid 4242 on gpu-node-3)" in note
    holder = json.loads((tmp_path / rundir.LOCK).read_text())
    assert holder["token"] == lock.token and holder["job"] == "SLURM 81234"
    lock.release()
    for job_env in ("81235", None):  # another job; a run outside any job
        _foreign_job_lock(tmp_path, "SLURM 81234")
        if job_env:
            no_job.setenv("SLURM_JOB_ID", job_env)
        else:
            no_job.delenv("SLURM_JOB_ID")
        with pytest.raises(rundir.WorkdirError, match="in use by pid 4242 on host gpu-node-3 .*renewed 2 s ago"):
            rundir.WorkdirLock(tmp_path, lease_s=600).acquire()
        assert json.loads((tmp_path / rundir.LOCK).read_text())["token"] == "earlier"


def test_a_lock_from_a_run_outside_any_job_is_never_taken_by_job_id(tmp_path, no_job):
    """A lock without a job id (an interactive run) is not "this job's", whatever this job is."""
    _foreign_job_lock(tmp_path, None)
    no_job.setenv("PBS_JOBID", "77.server")
    with pytest.raises(rundir.WorkdirError, match="in use by pid 4242"):
        rundir.WorkdirLock(tmp_path, lease_s=600).acquire()
    assert rundir.scheduler_job() == "PBS 77.server"


def test_a_lock_from_another_host_is_respected_until_its_lease_runs_out(tmp_path, no_job):
    _foreign_lock(tmp_path, age_s=5)
    with pytest.raises(rundir.WorkdirError, match="in use by pid 1 on host tpu-worker-7 .*renewed 5 s ago"):
        rundir.WorkdirLock(tmp_path, lease_s=60).acquire()
    _foreign_lock(tmp_path, age_s=120)  # a preempted VM never releases its lock
    lock = rundir.WorkdirLock(tmp_path, lease_s=60)
    note = lock.acquire()
    assert "not renewed for 120 s (lease 60 s)" in note
    assert json.loads((tmp_path / rundir.LOCK).read_text())["token"] == lock.token
    lock.release()
    assert not (tmp_path / rundir.LOCK).exists()


def test_a_held_lock_is_renewed_and_a_broken_one_is_left_to_its_new_owner(tmp_path):
    lock = rundir.WorkdirLock(tmp_path, lease_s=0.4)  # renewed every 0.1 s
    lock.acquire()
    first = json.loads((tmp_path / rundir.LOCK).read_text())["renewed"]
    time.sleep(0.35)
    assert json.loads((tmp_path / rundir.LOCK).read_text())["renewed"] > first
    other = rundir.WorkdirLock(tmp_path, break_lock=True, lease_s=60)
    assert "--break-lock" in other.acquire()
    time.sleep(0.25)  # the first holder's renewer sees the new token and stops
    lock.release()  # and its release leaves the new owner's lock alone
    holder = json.loads((tmp_path / rundir.LOCK).read_text())
    assert holder["token"] == other.token and holder["host"] == socket.gethostname()
    other.release()


def test_fresh_on_an_object_store_empties_only_a_marked_run(tmp_path, object_store):
    run = tmp_path / "run"
    rundir.create(run)
    (run / "stage_1" / "0").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("{}\n")
    rundir.fresh(run)
    assert sorted(p.name for p in run.iterdir()) == [rundir.MARKER]
    (tmp_path / "thesis").mkdir()
    (tmp_path / "thesis" / "ch1.tex").write_text("...")
    with pytest.raises(rundir.WorkdirError, match="not a loire_jax run directory"):
        rundir.fresh(tmp_path / "thesis")
    assert (tmp_path / "thesis" / "ch1.tex").exists()


def test_fresh_on_a_new_workdir_that_the_run_has_just_locked(tmp_path):
    """``--fresh`` with a new --workdir: the preflight takes the lock, then empties the run."""
    lock = rundir.WorkdirLock(tmp_path / "new", break_lock=False)
    (tmp_path / "new").mkdir()
    lock.acquire()
    rundir.fresh(tmp_path / "new", own=lock)  # its own lock does not hold --fresh back
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == [rundir.LOCK]
    lock.release()

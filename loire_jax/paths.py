"""One path abstraction for every file a run reads or writes: a local disk or an object store.

TPU VMs share no disk, so a multi-host run keeps its workdir, checkpoints and data on
Cloud Storage. Every file operation of the project goes through ``etils.epath`` paths
(``gs://``, ``s3://`` and local paths alike), and the three things an object store does
differently from a POSIX disk are handled here, once:

- **no append**: :class:`AppendLog` rewrites the whole object when it flushes;
- **no atomic rename**: a single object write is already all-or-nothing, so
  :func:`write_atomic` writes it directly there (and via a rename on a local disk);
- **no O_EXCL**: :func:`create_exclusive` uses Cloud Storage's create-if-absent
  precondition (``ifGenerationMatch=0``) for ``gs://`` and ``O_CREAT|O_EXCL`` locally; other
  schemes have no atomic create that loire_jax relies on, and are refused for the lock.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
import time
from typing import IO, Callable, Iterator, Union

from etils import epath

from loire_jax.errors import LoireError

Path = epath.Path
PathLike = Union[str, os.PathLike]

# Names that are another writer's unfinished work, never copied between stores.
_PARTIAL = (".tmp", ".partial")


class PathError(LoireError, OSError):
    """A storage operation this path's filesystem cannot do; the message says what to use."""


def _umask() -> int:
    """The process's umask, read when a file needs it, never at import. Linux shows it in
    /proc/self/status; elsewhere the only way to read it is to set it and set it back, done
    once (a library must not do that merely by being imported)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return _umask_by_setting()


@functools.cache
def _umask_by_setting() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The permissions a plain ``open`` gives a new file (0o666 less the umask): for files a
    library wrote owner-only (``mkstemp``, safetensors' ``save_file``), so that every file
    a command writes has the same."""
    return 0o666 & ~_umask()


def as_path(path: PathLike) -> epath.Path:
    """An ``epath.Path`` for a local path (``~`` expanded) or a ``scheme://`` URI; a URI
    whose filesystem library is missing is refused here, in one line."""
    text = os.fspath(path)
    if "://" in text:
        _check_backend(text.split("://", 1)[0])
        return epath.Path(text)
    return epath.Path(os.path.expanduser(text))


@functools.lru_cache(maxsize=None)
def _check_backend(kind: str) -> None:
    import fsspec

    try:
        fsspec.get_filesystem_class(kind)
    except (ImportError, ValueError) as err:
        hint = "pip install 'loire_jax[gcs]'" if kind == "gs" else "install its fsspec filesystem"
        raise PathError(f"{kind}:// paths cannot be used here ({err}); {hint}") from None


def absolute(path: PathLike) -> epath.Path:
    """The absolute form of a local path; a URI as it is (``epath``'s ``absolute()`` would
    prefix the working directory to ``gs://...``)."""
    path = as_path(path)
    return path.absolute() if is_local(path) else path


def scheme(path: PathLike) -> str | None:
    """``"gs"`` for ``gs://bucket/x``; None for a local path."""
    text = os.fspath(path)
    return text.split("://", 1)[0] if "://" in text else None


def is_local(path: PathLike) -> bool:
    """Whether the path is on a POSIX filesystem (append, rename and O_EXCL work)."""
    return scheme(path) is None


# ---------------------------------------------------------------------- files a user names
def file_problem(path: PathLike, what: str) -> str | None:
    """Why ``path`` cannot be read as the ``what`` file a user named (a run config, a suite,
    a data or task file), in words naming it, or None if it is a file: a directory is said
    to be one, not reported as missing."""
    path = as_path(path)
    if path.is_file():
        return None
    if path.is_dir():
        return f"{what} {path} is a directory, not a file; give the path of a file"
    return f"{what} file not found: {path}"


def read_user_text(path: PathLike, what: str, error: type[Exception] = PathError) -> str:
    """The text of the ``what`` file a user named, decoded as UTF-8 (a byte-order mark
    dropped), or ``error`` in one line naming the file: missing, a directory, not UTF-8, or
    unreadable. Every reader of a user's config, suite or task file comes here, so each of
    these faults reads alike wherever the file is named."""
    try:
        path = as_path(path)
        problem = file_problem(path, what)
    except PathError as err:
        raise error(str(err)) from None
    if problem:
        raise error(problem)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise error(f"cannot read {what} file {path}: {err.strerror or err}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise error(f"{what} file {path} is not UTF-8 text ({err.reason} at byte {err.start}); "
                    "save it as UTF-8") from None


def write_atomic(path: PathLike, data: str | bytes) -> None:
    """Write the whole file so that a reader sees the old content or the new, never a part.

    Locally: a temporary file in the same directory, then ``os.replace``. On an object store
    one object write is already atomic (the object appears when the upload completes).
    """
    path = as_path(path)
    if not is_local(path):
        (path.write_bytes if isinstance(data, bytes) else path.write_text)(data)
        return
    with _replacing(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)


@contextlib.contextmanager
def _replacing(path: epath.Path, mode: str) -> Iterator[IO]:
    """A file object for a temporary next to local ``path`` that replaces it on success and
    is removed on failure. The file gets the permissions a plain ``open`` would give
    (``mkstemp`` makes it owner-only)."""
    fd, tmp = tempfile.mkstemp(dir=os.fspath(path.parent), prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, mode) as f:
            yield f
        os.replace(tmp, os.fspath(path))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def create_exclusive(path: PathLike, text: str) -> bool:
    """Create ``path`` holding ``text`` only if nothing is there; False if something was.

    Two writers racing for the same name: exactly one gets True. This is what the workdir
    lock is built on.
    """
    path = as_path(path)
    kind = scheme(path)
    if kind is None:
        try:
            fd = os.open(os.fspath(path), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return True
    if kind == "gs":
        return _gcs_create_if_absent(os.fspath(path), text)
    raise PathError(f"{kind}:// has no create-if-absent operation that loire_jax uses, so the workdir cannot be "
                    "locked there; use a local, NFS or gs:// workdir")


def _gcs_create_if_absent(uri: str, text: str) -> bool:
    """Cloud Storage's precondition ``ifGenerationMatch=0``: the upload succeeds only if no
    live object has this name, decided by the service, so it is atomic across hosts."""
    try:
        from google.api_core import exceptions as gexc
        from google.cloud import storage
    except ImportError:
        raise PathError("a gs:// workdir needs google-cloud-storage: pip install 'loire_jax[gcs]'") from None
    bucket, _, name = uri[len("gs://"):].partition("/")
    blob = storage.Client().bucket(bucket).blob(name)
    try:
        blob.upload_from_string(text, if_generation_match=0)
    except gexc.PreconditionFailed:
        return False
    return True


class AppendLog:
    """A text file that grows by lines (metrics, logs), on any filesystem.

    Locally each line is appended and flushed at once. An object store cannot append, so
    the lines are kept and the whole object is rewritten at most every ``every_s`` seconds
    and on :meth:`flush`/:meth:`close`. What a kill loses there is at most the last
    ``every_s`` seconds of lines; a resumed run writes them again from its checkpoint.
    """

    def __init__(self, path: PathLike, *, every_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.path, self.every_s, self._clock = as_path(path), every_s, clock
        self._local = is_local(self.path)
        if self._local:
            self._file = open(os.fspath(self.path), "a")
        else:
            self._text = self.path.read_text() if self.path.exists() else ""
            if self._text and not self._text.endswith("\n"):
                self._text += "\n"  # a torn last line stays its own line
            self._dirty, self._last = False, self._clock()

    def write(self, line: str) -> None:
        """Add one line (the newline is added here)."""
        if self._local:
            self._file.write(line + "\n")
            self._file.flush()
            return
        self._text += line + "\n"
        self._dirty = True
        if self._clock() - self._last >= self.every_s:
            self.flush()

    def flush(self) -> None:
        if self._local:
            if not self._file.closed:
                self._file.flush()
        elif self._dirty:
            self.path.write_text(self._text)
            self._dirty, self._last = False, self._clock()

    def close(self) -> None:
        if self._local:
            self._file.close()
        else:
            self.flush()


def size(path: PathLike) -> int:
    return int(as_path(path).stat().length)


def files(root: PathLike) -> Iterator[tuple[str, epath.Path]]:
    """Every finished file under ``root`` as (posix path relative to root, path), sorted;
    another writer's temporaries (dot-names, ``*.tmp``) are skipped."""
    root = as_path(root)
    if not root.is_dir():
        return
    found = []
    for folder, _, names in root.walk():
        rel_folder = relative(folder, root)
        if any(part.startswith(".") for part in rel_folder.split("/") if part):
            continue
        for name in names:
            if name.startswith(".") or name.endswith(_PARTIAL):
                continue
            rel = f"{rel_folder}/{name}" if rel_folder else name
            found.append((rel, root / rel))
    yield from sorted(found)


def relative(path: PathLike, root: PathLike) -> str:
    """``path`` relative to ``root`` as a posix string. fsspec's walk yields folders without
    their ``gs://`` prefix, so both are compared without it."""
    def bare(p: PathLike) -> str:
        text = os.fspath(p)
        return (text.split("://", 1)[1] if "://" in text else text).rstrip("/")

    inner, outer = bare(path), bare(root)
    if inner != outer and not inner.startswith(outer + "/"):
        raise ValueError(f"{path} is not under {root}")
    return inner[len(outer):].strip("/")


def copy_file(src: PathLike, dst: PathLike) -> None:
    """Copy one file between any two filesystems; the destination appears complete or not at all."""
    src, dst = as_path(src), as_path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with src.open("rb") as fin, (_replacing(dst, "wb") if is_local(dst) else dst.open("wb")) as fout:
        shutil.copyfileobj(fin, fout, 1 << 22)


def sync_tree(src: PathLike, dst: PathLike, *, skip: Callable[[str], bool] = lambda rel: False,
              last: Callable[[str], bool] = lambda rel: False) -> int:
    """Copy every file of ``src`` that ``dst`` lacks or holds at another size; returns how many.

    Files for which ``last`` is true (completion markers) are copied after all others, so a
    reader that trusts a marker never finds its files missing. Nothing in ``dst`` is deleted.
    """
    dst = as_path(dst)
    todo = [(rel, p) for rel, p in files(src) if not skip(rel)]
    todo.sort(key=lambda item: (last(item[0]), item[0]))
    copied = 0
    for rel, p in todo:
        target = dst / rel
        if target.exists() and size(target) == size(p):
            continue
        copy_file(p, target)
        copied += 1
    return copied


"""The artifact cache: one root holding every built artifact, keyed by config hash.

Layout: ``<root>/<kind>/<name>-<hash>/`` where ``hash`` is a SHA-256 of the canonical
JSON of the config that made the artifact. A finished artifact holds ``artifact.json``
(that config; not ``config.json``, which model directories use) and a ``.complete`` marker; anything without the marker is an interrupted build and
is never reused as finished (builders may resume from its partial content).

Sharing a machine and a cache:

* **One builder per artifact.** :func:`building` holds a file lock beside the artifact
  (``<root>/<kind>/.<name>-<hash>.lock``, an OS-level ``flock``: released by the kernel
  when its process dies, so a killed build never blocks the next one). The first process
  builds; the others wait on the lock, then find the finished artifact and reuse it.
* **The marker promises what is there.** :func:`mark_complete` records every file with
  its size and a SHA-256 of the whole file (hashed right after the builder wrote it);
  :func:`verify` / :func:`is_complete` check it, so a deleted, truncated or overwritten
  file behind a marker reads as corrupt (with a warning naming the folder and the file)
  and is rebuilt rather than loaded. Opening is cheap: each entry also keeps the file's
  ``mtime_ns``, and a file whose size and mtime are unchanged is not rehashed (a changed
  mtime is rehashed; ``full=True`` or ``LIT_DOMINO_VERIFY=full`` rehashes everything).
  Model directories given by path are checked against the marker of the artifact holding
  them (:func:`check_directory`). Older markers still open: format 2 (SHA-256 of files up
  to 64 KiB only) is verified as far as it goes, and its missing hashes are computed on
  the first open and recorded (trust on first use: no wholesale rebuild); format 1
  (``ok``, no file list) is trusted as before.
* **No stub folders.** Artifacts without resume state are built in :func:`staging`
  (a temporary directory beside them, renamed into place when finished); a failed build
  inside :func:`building` removes what it left unless that is resume state (checkpoints,
  finished shards).
* **Builds leave the caller's randomness alone.** :func:`building` runs its block in
  :func:`isolated_rng`, so a cold cache (the artifact is built) and a warm one (it is read)
  leave Python's, NumPy's and torch's global random states the same.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from filelock import FileLock, Timeout

# Keys, the NaN screen and the randomness guard live apart; their names stay importable from here.
from lit_domino.runtime.keys import config_hash, to_jsonable  # noqa: F401
from lit_domino.runtime.numerics import first_nonfinite  # noqa: F401
from lit_domino.runtime.rng import isolated_rng

CACHE_ENV = "LIT_DOMINO_CACHE"
"""Environment variable that overrides the cache root (default ``./artifacts``)."""

_COMPLETE = ".complete"
ARTIFACT_CONFIG = "artifact.json"
"""The config that built an artifact (model directories keep their own ``config.json``)."""

MARKER_FORMAT = 3
"""``.complete`` markers of this format are JSON listing every file with size, SHA-256 and mtime; format 2
hashed only files up to 64 KiB, format 1 was ``ok``."""
VERIFY_ENV = "LIT_DOMINO_VERIFY"
"""``full``: every open rehashes every file (default: only files whose size or mtime changed)."""
RACY_NS = 2_000_000_000
"""A file modified less than this long before it was hashed gets no mtime in its entry (it is rehashed at
the next open): file-system clocks are coarse (ms on ext4, 1-2 s elsewhere), so a second write in the same
tick would keep the mtime the hash was taken at ("racy" entries, as git calls them)."""
TRANSIENT = ("ckpt", "checkpoints")
"""Top-level entries not recorded in a marker: resume state, deleted once an artifact is finished (the target
build's ``ckpt/``, a drafter training's ``checkpoints/``)."""
RESUME_STATE = ("ckpt/*.ckpt", "checkpoints/*.ckpt", "checkpoints/mlflow_run_id", "*/.complete")
"""What a failed build keeps (patterns inside the artifact): checkpoints, the MLflow run a rerun continues
(even one interrupted before its first checkpoint) and finished shards."""

log = logging.getLogger(__name__)
T = TypeVar("T")


class CorruptArtifact(RuntimeError):
    """A cached artifact that cannot be read back; the message names the folder to delete."""

    def __init__(self, path: Path, reason: str):
        self.path = Path(path)
        super().__init__(f"the cached artifact {self.path} is corrupt ({reason}); delete that folder "
                         f"(rm -r '{self.path}') and rerun to rebuild it")


def cache_root() -> Path:
    """The cache root: ``$LIT_DOMINO_CACHE`` if set, else ``./artifacts`` (relative to the cwd)."""
    return Path(os.environ.get(CACHE_ENV, "artifacts")).expanduser().resolve()


def artifact_dir(kind: str, config: Any, name: str | None = None, root: Path | None = None) -> Path:
    """The directory of the artifact ``kind`` built from ``config`` (not created)."""
    tag = f"{name}-{config_hash(config)}" if name else config_hash(config)
    return (root or cache_root()) / kind / tag


# --------------------------------------------------------------------------- markers and integrity


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a whole file, read in chunks (a multi-GB shard is never held in memory)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _entry(st: os.stat_result, seen_ns: int, sha256: str) -> dict[str, Any]:
    """A marker entry from the file's stat taken at ``seen_ns``, before it was hashed; the mtime only
    when the file had not been written within :data:`RACY_NS` of that moment."""
    entry: dict[str, Any] = {"size": st.st_size, "sha256": sha256}
    if seen_ns - st.st_mtime_ns > RACY_NS:
        entry["mtime_ns"] = st.st_mtime_ns
    return entry


def _stat(f: Path) -> tuple[os.stat_result, int]:
    # before hashing: a write during the hash changes the mtime (unless racy), so the next open rehashes
    return f.stat(), time.time_ns()


def _hashed_entry(f: Path) -> dict[str, Any]:
    st, seen = _stat(f)
    return _entry(st, seen, file_sha256(f))


def _inventory(path: Path, exclude: tuple[str, ...], known: dict[str, dict]) -> dict[str, dict]:
    files = {}
    for f in sorted(path.rglob("*")):
        rel = f.relative_to(path)
        if rel.parts[0] in exclude or rel.parts[0].startswith(_COMPLETE) or not f.is_file():
            continue
        files[rel.as_posix()] = known.get(rel.as_posix()) or _hashed_entry(f)
    return files


def _parse_marker(text: str) -> dict:
    try:
        data = json.loads(text)
    except ValueError:
        return {}  # format 1 ("ok"): no file list, trusted as before
    return data if isinstance(data, dict) else {}


def _read_marker(path: Path) -> dict | None:
    """The marker's promise: None without a marker, ``{}`` for an old ``ok`` marker (trusted)."""
    try:
        return _parse_marker((Path(path) / _COMPLETE).read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None


def _write_bytes_hashed(path: Path, data: bytes) -> dict[str, Any]:
    """Write a file the suite produces and its marker entry, hashed from the bytes written (no re-read)."""
    _write_atomic(path, data)
    return _entry(*_stat(path), hashlib.sha256(data).hexdigest())


def mark_complete(path: Path, config: Any, *, exclude: tuple[str, ...] = TRANSIENT) -> None:
    """Write the artifact's config next to it and mark it finished (last step of a build).

    The marker lists every file under ``path`` (except the top-level entries in ``exclude``:
    resume state that is deleted afterwards) with its size, mtime and a SHA-256 of the whole
    file; :func:`verify` checks that promise.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config_text = json.dumps(to_jsonable(config), indent=2, sort_keys=True)
    known = {ARTIFACT_CONFIG: _write_bytes_hashed(path / ARTIFACT_CONFIG, config_text.encode())}
    marker = {"format": MARKER_FORMAT, "files": _inventory(path, tuple(exclude), known)}
    write_text_atomic(path / _COMPLETE, json.dumps(marker, indent=1, sort_keys=True))  # whole or not at all


def _verify_full() -> bool:
    return os.environ.get(VERIFY_ENV, "").strip().lower() == "full"


def verify(path: Path, *, full: bool | None = None, under: str | Path | None = None) -> list[str]:
    """What is wrong with the finished artifact ``path`` (empty: intact, or an old marker without a file list).

    Checks the files the marker promises: present, the recorded size, the recorded SHA-256.
    A file whose size and mtime equal its entry's is taken as hashed already; any other is
    rehashed (``full``, default ``$LIT_DOMINO_VERIFY == "full"``: every file is). ``under``:
    only the files below that folder of the artifact (a model directory inside it).
    Files added after the marker (caches written by readers) are not a problem.

    What a successful check learns is written back to the marker (the new mtime of a file
    touched or copied with its content intact; the hash a format-2 marker lacked), so the
    next open is cheap again; that write is skipped while another process holds the build
    lock (it may be rebuilding the artifact) and where the cache is read-only.
    """
    path = Path(path)
    try:
        text = (path / _COMPLETE).read_text()
    except (FileNotFoundError, NotADirectoryError):
        return [f"no {_COMPLETE} marker"]
    files = _parse_marker(text).get("files") or {}
    full = _verify_full() if full is None else full
    under = None if under is None else Path(under).as_posix()
    prefix = None if under in (None, ".") else under.rstrip("/") + "/"
    problems, learned = [], {}
    for rel, entry in files.items():
        if prefix is not None and not rel.startswith(prefix):
            continue
        f = path / rel
        try:
            st, seen = _stat(f)
        except OSError:
            problems.append(f"{rel} is missing")
            continue
        if st.st_size != entry.get("size", st.st_size):
            problems.append(f"{rel} has {st.st_size} bytes, the marker promises {entry['size']}")
            continue
        recorded = entry.get("sha256")
        if recorded and not full and entry.get("mtime_ns") == st.st_mtime_ns:
            continue  # unchanged since it was hashed
        try:
            actual = file_sha256(f)
        except OSError as err:
            problems.append(f"{rel} cannot be read ({err})")
            continue
        if recorded and actual != recorded:
            problems.append(f"{rel} changed (its SHA-256 is not the one recorded when the artifact was finished)")
            continue
        new = _entry(st, seen, actual)  # recorded is None: a format-2 marker's large file (trust on first use)
        if new != entry:
            learned[rel] = new
    if learned and not problems:
        _record(path, text, learned)
    return problems


_HELD: set[Path] = set()
"""Artifacts whose build lock this process holds (inside :func:`building`): it may update their markers."""


def _record(path: Path, seen: str, learned: dict[str, dict]) -> None:
    """Merge re-verified entries into the marker read as ``seen``, unless it changed meanwhile."""
    lock = None
    try:
        if path.resolve() not in _HELD:
            lock = build_lock(path)
            lock.acquire(timeout=0)  # never wait: a builder holding it may be replacing the artifact
    except (Timeout, OSError):  # being rebuilt, or a read-only cache
        return
    try:
        marker_file = path / _COMPLETE
        if marker_file.read_text() != seen:
            return  # rebuilt or updated by another process meanwhile
        marker = _parse_marker(seen)
        marker["files"].update(learned)
        if all("sha256" in e for e in marker["files"].values()):
            marker["format"] = MARKER_FORMAT
        write_text_atomic(marker_file, json.dumps(marker, indent=1, sort_keys=True))
    except OSError as err:  # a read-only cache: verified all the same, rehashed next time
        log.debug("could not update the marker of %s: %s", path, err)
    finally:
        if lock is not None:
            lock.release()


def _summary(problems: list[str]) -> str:
    return "; ".join(problems[:3]) + (f"; {len(problems) - 3} more" if len(problems) > 3 else "")


def is_complete(path: Path, *, warn: bool = True, full: bool | None = None) -> bool:
    """True when ``path`` holds a finished, intact artifact (:func:`verify`; ``full`` rehashes every file).

    A marker whose files are missing, truncated or changed reads as not complete, with a
    one-line warning naming the folder and the files (``warn``): the caller rebuilds it
    (builders overwrite it).
    """
    path = Path(path)
    if not (path / _COMPLETE).is_file():
        return False
    problems = verify(path, full=full)
    if problems and warn:
        log.warning("cached artifact %s is corrupt (%s); it will be rebuilt", path, _summary(problems))
    return not problems


def enclosing_artifact(directory: str | Path) -> Path | None:
    """The cache artifact holding ``directory``: the nearest of it and its parents with a marker (None: none)."""
    d = Path(directory).expanduser().resolve()
    return next((p for p in (d, *d.parents) if (p / _COMPLETE).is_file()), None)


def check_directory(directory: str | Path, *, full: bool | None = None) -> tuple[Path | None, list[str]]:
    """Verify a model directory given by path against the marker of the artifact holding it.

    Returns that artifact (None when the directory is in no artifact: nothing recorded to check)
    and the problems of the files below ``directory`` (paths relative to the artifact)."""
    root = enclosing_artifact(directory)
    if root is None:
        return None, []
    rel = Path(directory).expanduser().resolve().relative_to(root)
    return root, verify(root, full=full, under=rel)


def invalidate(path: Path) -> None:
    """Remove the marker of ``path`` (a corrupt artifact): it reads as an interrupted build from then on."""
    with contextlib.suppress(FileNotFoundError):
        (Path(path) / _COMPLETE).unlink()


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename: a reader never sees half a file."""
    return _write_atomic(Path(path), text.encode())


def _write_atomic(path: Path, data: bytes) -> Path:
    # a unique temporary name: two processes writing one file at once both succeed (the last rename wins)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as with open()
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def write_metadata(path: Path, name: str, text: str) -> None:
    """Rewrite a small file of a finished artifact (``report.json``, a run id) and update its marker entry.

    Files rewritten behind the marker's back read as corrupt; this keeps the promise true.
    """
    path = Path(path)
    marker = _read_marker(path)
    entry = _write_bytes_hashed(path / name, text.encode())
    if marker and "files" in marker:
        marker["files"][Path(name).as_posix()] = entry
        write_text_atomic(path / _COMPLETE, json.dumps(marker, indent=1, sort_keys=True))


def clear(path: Path) -> None:
    """Remove a (possibly partial) artifact."""
    shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------- locks and builds


def lock_path(path: Path) -> Path:
    """The lock file of the artifact ``path``: beside it (``.<name>.lock``), so clearing the artifact keeps it."""
    path = Path(path)
    return path.parent / f".{path.name}.lock"


def build_lock(path: Path, timeout: float = -1):
    """A ``filelock.FileLock`` on the artifact ``path`` (not acquired; ``timeout`` -1 waits forever).

    An OS-level lock (``flock``): the kernel releases it when the holding process exits or
    is killed, so a stale lock never blocks a later build.
    """

    lp = lock_path(path)
    lp.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(lp), timeout=timeout)


def _has_resume_state(path: Path, keep: tuple[str, ...]) -> bool:
    return any(next(path.glob(pattern), None) is not None for pattern in keep)


def _remove_stale_staging(path: Path) -> None:
    for tmp in path.parent.glob(f".{path.name}.tmp-*"):
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def building(path: Path, *, timeout: float | None = None, keep: tuple[str, ...] = RESUME_STATE,
             isolate_rng: bool = True) -> Iterator[Path]:
    """Hold the build lock of the artifact ``path`` for the block: build once, the others wait and reuse.

    Use it around "reuse if complete, else build"; re-check :func:`is_complete` inside the
    block, since another process may have finished the artifact while this one waited::

        with cache.building(path):
            if cache.is_complete(path):
                return load(path)
            build(path)          # ends with cache.mark_complete(path, config)

    ``timeout``: seconds to wait for another builder (None: as long as it takes; then
    ``TimeoutError``). On an exception inside the block, an unfinished ``path`` is removed
    unless it holds resume state (``keep``: glob patterns inside it), so failed builds leave
    no stub folders. With ``isolate_rng`` the block runs in :func:`isolated_rng`.
    Not reentrant for one ``path`` within a process (nest different artifacts freely).
    """

    path = Path(path)
    lock = build_lock(path)
    try:
        # a reader recording a verified file holds the lock for milliseconds: no warning for that
        lock.acquire(timeout=min(_READER_GRACE_S, timeout) if timeout is not None else _READER_GRACE_S)
    except Timeout:
        log.warning("waiting for another process to finish building %s", path)
        try:
            lock.acquire(timeout=-1 if timeout is None else timeout)
        except Timeout:
            raise TimeoutError(f"{path} is still being built by another process after {timeout} s "
                               f"(lock {lock_path(path)})") from None
    held = path.resolve()
    _HELD.add(held)
    try:
        _remove_stale_staging(path)  # leftovers of killed builds: nobody else builds path now
        rng = isolated_rng() if isolate_rng else contextlib.nullcontext()
        try:
            with rng:
                yield path
        except BaseException:
            if path.is_dir() and not (path / _COMPLETE).is_file() and not _has_resume_state(path, keep):
                shutil.rmtree(path, ignore_errors=True)
            raise
    finally:
        _HELD.discard(held)
        lock.release()


_READER_GRACE_S = 0.5


@contextlib.contextmanager
def staging(path: Path) -> Iterator[Path]:
    """Build the directory ``path`` in a fresh temporary directory beside it, renamed to ``path`` at the end.

    Readers see the old ``path`` (removed just before the rename) or the new one, never a
    half-written one; a failure removes the temporary directory. Call it while holding
    :func:`building` of ``path`` (or of the artifact that contains it).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def reuse_or_build(path: Path, load: Callable[[Path], T], build: Callable[[Path], Any], **building_kwargs) -> T:
    """``load(path)`` of the cached artifact, else ``build(path)`` (which ends with :func:`mark_complete`)
    under the build lock, then ``load(path)``.

    A corrupt cached artifact (:func:`verify` fails, or ``load`` raises) is rebuilt with a
    warning naming the folder; one that cannot be read even after a fresh build raises
    :class:`CorruptArtifact`, naming the folder to delete.
    """
    path = Path(path)

    def try_load():
        try:
            return True, load(path)
        except Exception as err:  # noqa: BLE001 (a library's error for unreadable files)
            log.warning("cached artifact %s could not be read (%s: %s); rebuilding it", path,
                        type(err).__name__, str(err).splitlines()[0] if str(err) else "")
            return False, None

    if is_complete(path):
        ok, value = try_load()
        if ok:
            return value
    with building(path, **building_kwargs):
        if is_complete(path, warn=False):
            ok, value = try_load()
            if ok:
                return value
        invalidate(path)
        build(path)
        if not is_complete(path, warn=False):
            raise CorruptArtifact(path, "its build finished without a valid .complete marker")
        try:
            return load(path)
        except Exception as err:  # noqa: BLE001
            raise CorruptArtifact(path, f"freshly built, still unreadable: {type(err).__name__}: {err}") from err

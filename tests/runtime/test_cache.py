"""lit_domino.runtime.cache: build locks across processes, markers that promise their files, no stub folders."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import lit_domino
from lit_domino.runtime import cache

ROOT = Path(lit_domino.__file__).resolve().parent.parent  # the checkout under test


def _python(code: str) -> subprocess.Popen:
    """A child interpreter running ``code`` (only the stdlib, filelock and lit_domino.runtime.cache: fast)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, seconds: float = 20.0) -> None:
    deadline = time.time() + seconds
    while not path.exists():
        if time.time() > deadline:
            raise TimeoutError(f"{path} did not appear within {seconds} s")
        time.sleep(0.02)


def _artifact(path: Path, config=None) -> Path:
    (path / "data").mkdir(parents=True)
    (path / "data" / "shard.arrow").write_bytes(b"x" * 100_000)  # large (format 2 hashed only files <= 64 KiB)
    (path / "report.json").write_text('{"a": 1}')
    (path / "ckpt").mkdir()
    (path / "ckpt" / "last.ckpt").write_bytes(b"resume state")
    cache.mark_complete(path, config or {"k": 1})
    return path


# --------------------------------------------------------------------------- integrity


def test_marker_records_files_and_sizes(tmp_path):
    path = _artifact(tmp_path / "a")
    marker = json.loads((path / ".complete").read_text())
    assert marker["format"] == 3
    assert marker["files"]["data/shard.arrow"]["size"] == 100_000  # every file: size and a whole-file SHA-256
    assert marker["files"]["data/shard.arrow"]["sha256"] == hashlib.sha256(b"x" * 100_000).hexdigest()
    assert marker["files"]["report.json"]["size"] == 8 and "sha256" in marker["files"]["report.json"]
    assert "artifact.json" in marker["files"] and not any(f.startswith("ckpt") for f in marker["files"])
    assert cache.verify(path) == [] and cache.is_complete(path)
    (path / "ckpt" / "last.ckpt").unlink()  # resume state is deleted after a build: not promised
    (path / "reader-cache.arrow").write_bytes(b"added later")  # extra files are no problem
    assert cache.is_complete(path)


@pytest.mark.parametrize("damage, problem", [
    (lambda p: (p / "data" / "shard.arrow").unlink(), "data/shard.arrow is missing"),
    (lambda p: (p / "data" / "shard.arrow").write_bytes(b"x" * 10), "has 10 bytes"),
    (lambda p: (p / "report.json").write_text('{"a": 2}'), "report.json changed"),
])
def test_damaged_artifact_is_not_complete_and_named(tmp_path, caplog, damage, problem):
    path = _artifact(tmp_path / "a")
    damage(path)
    assert any(problem in p for p in cache.verify(path))
    with caplog.at_level(logging.WARNING, logger="lit_domino.runtime.cache"):
        assert not cache.is_complete(path)
    assert str(path) in caplog.text and problem in caplog.text


def test_old_markers_are_trusted(tmp_path):
    path = tmp_path / "old"
    path.mkdir()
    (path / ".complete").write_text("ok\n")  # what earlier versions wrote
    assert cache.verify(path) == [] and cache.is_complete(path)
    assert not cache.is_complete(tmp_path / "nothing")


def test_write_metadata_keeps_the_promise(tmp_path):
    path = _artifact(tmp_path / "a")
    cache.write_metadata(path, "report.json", '{"a": 1, "run_id": "new"}')
    assert cache.is_complete(path) and "new" in (path / "report.json").read_text()


def _age(path: Path, seconds: float = 60.0) -> None:
    """Make every file of ``path`` look written ``seconds`` ago (past the racy window)."""
    old = time.time_ns() - int(seconds * 1e9)
    for f in path.rglob("*"):
        if f.is_file():
            os.utime(f, ns=(old, old))


def _overwrite(f: Path, offset: int, data: bytes, keep_mtime: bool = False) -> None:
    """A same-size corruption: ``data`` written over the bytes at ``offset``."""
    st = f.stat()
    with open(f, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)
    if keep_mtime:
        os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size


@pytest.mark.parametrize("aged", [False, True], ids=["just-written", "old"])
def test_same_size_overwrite_of_a_large_file_is_corrupt(tmp_path, caplog, aged):
    # issue 34 item 3: format 2 hashed files up to 64 KiB only, so this read as complete
    path = _artifact(tmp_path / "a")
    if aged:
        _age(path)
        assert cache.is_complete(path)  # records the mtimes: the shortcut applies from now on
        assert "mtime_ns" in json.loads((path / ".complete").read_text())["files"]["data/shard.arrow"]
    _overwrite(path / "data" / "shard.arrow", 50_000, b"\xff" * 4096)
    with caplog.at_level(logging.WARNING, logger="lit_domino.runtime.cache"):
        assert not cache.is_complete(path)
    line = caplog.text.strip()
    assert "\n" not in line and str(path) in line and "data/shard.arrow changed" in line


def _count_hashes(monkeypatch) -> list[str]:
    hashed = []
    real = cache.file_sha256
    monkeypatch.setattr(cache, "file_sha256", lambda f: hashed.append(Path(f).name) or real(f))
    return hashed


def test_unchanged_files_are_not_rehashed_changed_mtimes_are(tmp_path, monkeypatch):
    path = _artifact(tmp_path / "a")
    hashed = _count_hashes(monkeypatch)
    assert cache.verify(path) == [] and sorted(hashed) == ["artifact.json", "report.json", "shard.arrow"]
    hashed.clear()  # just written: no mtime recorded yet (racy), so that open rehashed; now they are old
    _age(path)
    assert cache.verify(path) == [] and len(hashed) == 3  # new mtimes: rehashed once, recorded
    hashed.clear()
    assert cache.verify(path) == [] and hashed == []  # size and mtime unchanged: nothing rehashed
    os.utime(path / "report.json", ns=(1, 10**18))  # touched (copied, restored): content the same
    assert cache.verify(path) == [] and hashed == ["report.json"]
    hashed.clear()
    assert cache.verify(path) == [] and hashed == []
    assert cache.verify(path, full=True) == [] and len(hashed) == 3  # the full check rehashes everything
    hashed.clear()
    monkeypatch.setenv(cache.VERIFY_ENV, "full")
    assert cache.is_complete(path) and len(hashed) == 3


def test_full_verify_finds_a_change_that_kept_its_mtime(tmp_path):
    path = _artifact(tmp_path / "a")
    _age(path)
    assert cache.is_complete(path)
    _overwrite(path / "data" / "shard.arrow", 0, b"y" * 4096, keep_mtime=True)
    assert cache.verify(path) == []  # the cheap check trusts an unchanged (size, mtime)
    assert any("data/shard.arrow changed" in p for p in cache.verify(path, full=True))


def _old_marker(path: Path) -> None:
    """Rewrite ``path``'s marker as format 2 wrote it: sizes, SHA-256s of files up to 64 KiB only."""
    files = {}
    for f in sorted(path.rglob("*")):
        rel = f.relative_to(path)
        if rel.parts[0] in cache.TRANSIENT or rel.name == ".complete" or not f.is_file():
            continue
        size = f.stat().st_size
        files[rel.as_posix()] = {"size": size, **({"sha256": cache.file_sha256(f)} if size <= 1 << 16 else {})}
    (path / ".complete").write_text(json.dumps({"format": 2, "files": files}, indent=1, sort_keys=True))


def test_old_markers_open_and_are_upgraded(tmp_path):
    path = _artifact(tmp_path / "a")
    _old_marker(path)
    _age(path)
    assert cache.is_complete(path)  # yesterday's cache is reused, not rebuilt
    marker = json.loads((path / ".complete").read_text())
    assert marker["format"] == 3 and all({"sha256", "mtime_ns"} <= set(e) for e in marker["files"].values())
    _overwrite(path / "data" / "shard.arrow", 10, b"z" * 4096)  # from now on guarded like a new artifact
    assert not cache.is_complete(path, warn=False)
    # what a format-2 marker did promise is still checked before it is upgraded
    other = _artifact(tmp_path / "b")
    _old_marker(other)
    (other / "report.json").write_text('{"a": 2}')
    assert any("report.json changed" in p for p in cache.verify(other))
    assert json.loads((other / ".complete").read_text())["format"] == 2  # a corrupt artifact is not upgraded


def test_marker_is_not_rewritten_while_another_holds_the_build_lock(tmp_path):
    path = _artifact(tmp_path / "a")
    _old_marker(path)
    before = (path / ".complete").read_text()
    lock = cache.build_lock(path)  # as another process rebuilding it would hold it
    lock.acquire()
    try:
        assert cache.is_complete(path)
        assert (path / ".complete").read_text() == before  # verified, not recorded: it may be being replaced
    finally:
        lock.release()
    assert cache.is_complete(path) and json.loads((path / ".complete").read_text())["format"] == 3
    os.utime(path / "report.json", ns=(1, 10**18))
    with cache.building(path):  # the builder itself records (it holds the lock)
        assert cache.is_complete(path)
        assert json.loads((path / ".complete").read_text())["files"]["report.json"]["mtime_ns"] == 10**18


def test_read_only_cache_still_verifies(tmp_path, monkeypatch):
    path = _artifact(tmp_path / "k" / "a")
    _old_marker(path)
    before = (path / ".complete").read_text()

    def read_only(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cache, "build_lock", read_only)  # no lock file can be created
    assert cache.is_complete(path) and (path / ".complete").read_text() == before
    monkeypatch.undo()
    monkeypatch.setattr(cache, "_write_atomic", read_only)  # the lock works, the marker cannot be written
    assert cache.is_complete(path) and (path / ".complete").read_text() == before


_OPENER = """
    import sys, time
    from pathlib import Path
    from lit_domino.runtime import cache
    path, go = Path(sys.argv[1]), Path(sys.argv[2])
    while not go.exists():
        time.sleep(0.005)
    print(all(cache.is_complete(path) for _ in range(20)))
"""


@pytest.mark.slow
def test_two_processes_open_one_old_artifact_at_once(tmp_path):
    path, go = tmp_path / "kind" / "a-1", tmp_path / "go"
    (path / "data").mkdir(parents=True)
    (path / "data" / "shard.arrow").write_bytes(os.urandom(8 << 20))  # hashing takes a while: they overlap
    cache.mark_complete(path, {})
    _old_marker(path)
    _age(path)
    code = f"import sys; sys.argv[1:] = [{str(path)!r}, {str(go)!r}]\n" + textwrap.dedent(_OPENER)
    procs = [_python(code) for _ in range(2)]
    go.write_text("go")
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0] and [o.strip() for o, _ in outs] == ["True", "True"], outs
    assert json.loads((path / ".complete").read_text())["format"] == 3 and cache.verify(path, full=True) == []
    assert not list(path.glob(".complete*.tmp"))


def test_check_directory_finds_the_enclosing_artifact(tmp_path):
    path = tmp_path / "a"
    (path / "drafter").mkdir(parents=True)
    (path / "drafter" / "model.safetensors").write_bytes(b"w" * 70_000)
    _artifact(path)
    assert cache.check_directory(path / "drafter") == (path.resolve(), [])
    (path / "report.json").write_text('{"a": 9}')  # outside the drafter directory: not its problem
    assert cache.check_directory(path / "drafter")[1] == []
    _overwrite(path / "drafter" / "model.safetensors", 4096, b"\0" * 4096)
    root, problems = cache.check_directory(path / "drafter")
    assert root == path.resolve() and problems == [
        "drafter/model.safetensors changed (its SHA-256 is not the one recorded when the artifact was finished)"]
    assert [p.split()[0] for p in cache.check_directory(path)[1]] == [  # the artifact itself: every file
        "drafter/model.safetensors", "report.json"]
    assert cache.check_directory(tmp_path) == (None, [])  # in no artifact: nothing recorded to check


def test_reuse_or_build_rebuilds_unreadable_then_names_the_folder(tmp_path, caplog):
    path = tmp_path / "kind" / "x-123"
    builds = []

    def build(p):
        builds.append(1)
        p.mkdir(parents=True, exist_ok=True)
        (p / "value.txt").write_text("42")
        cache.mark_complete(p, {})

    assert cache.reuse_or_build(path, lambda p: (p / "value.txt").read_text(), build) == "42"
    assert cache.reuse_or_build(path, lambda p: (p / "value.txt").read_text(), build) == "42" and len(builds) == 1

    def unreadable(p):
        raise OSError("Expected to be able to read 1000 bytes")

    with caplog.at_level(logging.WARNING, logger="lit_domino.runtime.cache"):
        with pytest.raises(cache.CorruptArtifact) as info:
            cache.reuse_or_build(path, unreadable, build)
    assert len(builds) == 2  # rebuilt once, with a warning naming the folder
    assert str(path) in caplog.text
    assert str(path) in str(info.value) and "delete" in str(info.value)


# --------------------------------------------------------------------------- builds: no stubs, RNG left alone


def test_failed_build_leaves_no_stub_but_keeps_resume_state(tmp_path):
    stub, resumable = tmp_path / "k" / "stub", tmp_path / "k" / "resumable"
    with pytest.raises(RuntimeError):
        with cache.building(stub):
            stub.mkdir(parents=True)
            (stub / "half-written.bin").write_bytes(b"...")
            raise RuntimeError("boom")
    assert not stub.exists()
    with pytest.raises(KeyboardInterrupt):
        with cache.building(resumable):
            (resumable / "ckpt").mkdir(parents=True)
            (resumable / "ckpt" / "last.ckpt").write_bytes(b"state")
            raise KeyboardInterrupt
    assert (resumable / "ckpt" / "last.ckpt").exists()


def test_staging_is_atomic(tmp_path):
    path = tmp_path / "k" / "a"
    with pytest.raises(RuntimeError):
        with cache.staging(path) as tmp:
            (tmp / "f").write_text("partial")
            raise RuntimeError("killed")
    assert not path.exists() and list(path.parent.iterdir()) == []
    with cache.staging(path) as tmp:
        (tmp / "f").write_text("whole")
        assert not path.exists()
    assert (path / "f").read_text() == "whole" and [p.name for p in path.parent.iterdir()] == ["a"]


def test_building_leaves_the_callers_random_state_alone(tmp_path):
    import random

    import numpy as np

    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    states = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    with cache.building(tmp_path / "a"):
        torch.manual_seed(0)  # a builder seeding its own work, as a target build does
        torch.rand(10), random.random(), np.random.rand()
    assert torch.equal(torch.get_rng_state(), states[0]) and random.getstate() == states[1]
    assert (np.random.get_state()[1] == states[2]).all()


# --------------------------------------------------------------------------- locks across processes

_BUILDER = """
    import sys, time
    from pathlib import Path
    from lit_domino.runtime import cache
    path, log = Path(sys.argv[1]), Path(sys.argv[2])
    with cache.building(path):
        if cache.is_complete(path):
            print("reused")
        else:
            with open(log, "a") as f:
                f.write("built\\n")
            time.sleep(1.0)  # long enough for the other builder to arrive while this one builds
            path.mkdir(parents=True)
            (path / "value").write_text("v")
            cache.mark_complete(path, {})
            print("built")
"""


@pytest.mark.slow  # two Python processes
def test_concurrent_builders_build_once(tmp_path):
    path, log = tmp_path / "kind" / "a-1", tmp_path / "builds.log"
    code = f"import sys; sys.argv[1:] = [{str(path)!r}, {str(log)!r}]\n" + textwrap.dedent(_BUILDER)
    procs = [_python(code) for _ in range(2)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert sorted(o.strip() for o, _ in outs) == ["built", "reused"]
    assert log.read_text() == "built\n" and cache.is_complete(path)


@pytest.mark.slow  # a child process, killed
def test_lock_of_a_killed_process_is_released(tmp_path):
    path = tmp_path / "kind" / "a-1"
    held = tmp_path / "held"
    child = _python(f"""
        import time
        from pathlib import Path
        from lit_domino.runtime import cache
        lock = cache.build_lock(Path({str(path)!r}))
        lock.acquire()
        Path({str(held)!r}).write_text("yes")
        time.sleep(120)
    """)
    try:
        _wait_for(held)
        with pytest.raises(TimeoutError, match="still being built"):
            with cache.building(path, timeout=0.3):
                pass
        child.send_signal(signal.SIGKILL)  # no cleanup code runs: only the kernel releases the lock
        child.wait(timeout=20)
        t0 = time.time()
        with cache.building(path, timeout=10):
            assert time.time() - t0 < 5
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=20)


def test_first_nonfinite_names_the_tensor_and_ignores_overflowing_sums():
    ok = torch.full((4096,), 60000.0, dtype=torch.float16)  # finite, but its fp16 sum overflows
    assert not ok.sum().isfinite() and cache.first_nonfinite([("ok", ok)]) is None
    w = torch.randn(8, 8)
    tied = w  # a tied tensor (embedding and LM head) is checked once
    bad = torch.randn(3, 3, dtype=torch.bfloat16)
    bad[1, 2], bad[0, 0] = float("nan"), float("-inf")
    named = [("ids", torch.arange(3)), ("w", w), ("tied", tied), ("bad", bad), ("later", torch.tensor([float("inf")]))]
    assert cache.first_nonfinite(named) == ("bad", 2)
    assert cache.first_nonfinite([("empty", torch.zeros(0))]) is None

"""lit_domino.cache: build locks across processes, markers that promise their files, no stub folders."""

from __future__ import annotations

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
from lit_domino import cache

ROOT = Path(lit_domino.__file__).resolve().parent.parent  # the checkout under test


def _python(code: str) -> subprocess.Popen:
    """A child interpreter running ``code`` (only the stdlib, filelock and lit_domino.cache: fast)."""
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
    (path / "data" / "shard.arrow").write_bytes(b"x" * 100_000)  # large: size only
    (path / "report.json").write_text('{"a": 1}')  # small: size and checksum
    (path / "ckpt").mkdir()
    (path / "ckpt" / "last.ckpt").write_bytes(b"resume state")
    cache.mark_complete(path, config or {"k": 1})
    return path


# --------------------------------------------------------------------------- integrity


def test_marker_records_files_and_sizes(tmp_path):
    path = _artifact(tmp_path / "a")
    marker = json.loads((path / ".complete").read_text())
    assert marker["files"]["data/shard.arrow"] == {"size": 100_000}
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
    with caplog.at_level(logging.WARNING, logger="lit_domino.cache"):
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

    with caplog.at_level(logging.WARNING, logger="lit_domino.cache"):
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
    from lit_domino import cache
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


def test_concurrent_builders_build_once(tmp_path):
    path, log = tmp_path / "kind" / "a-1", tmp_path / "builds.log"
    code = f"import sys; sys.argv[1:] = [{str(path)!r}, {str(log)!r}]\n" + textwrap.dedent(_BUILDER)
    procs = [_python(code) for _ in range(2)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert sorted(o.strip() for o, _ in outs) == ["built", "reused"]
    assert log.read_text() == "built\n" and cache.is_complete(path)


def test_lock_of_a_killed_process_is_released(tmp_path):
    path = tmp_path / "kind" / "a-1"
    held = tmp_path / "held"
    child = _python(f"""
        import time
        from pathlib import Path
        from lit_domino import cache
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

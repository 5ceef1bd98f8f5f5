"""No corrupt file is loaded (issue 34, item 3): drafters and targets in the cache or given by path.

A same-size overwrite inside a drafter's ``model.safetensors`` (what format-2 markers, which hashed only
files up to 64 KiB, let through) makes its cache artifact incomplete (rebuilt) and ``load_drafter`` refuse,
naming the file; weights holding NaN in a valid file (re-saved, so every hash matches) are refused,
naming the tensor and the file.
"""

from __future__ import annotations

import json
import logging
import shutil
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from lit_domino.runtime import cache
from lit_domino.models import DrafterLoadError, drafter_config, build_drafter
from lit_domino.interop import load_drafter
from lit_domino.models.base import WEIGHTS_NAME
from lit_domino.target.load import TargetError, load_target
from lit_domino.testing import random_target


@pytest.fixture(scope="module")
def target():
    return random_target(vocab_size=256, hidden_size=64, num_layers=4, seed=0)


def _save_drafter(path, target, seed=0):
    """A random domino drafter saved as a trained one is: ``<artifact>/drafter`` + report + marker."""
    torch.manual_seed(seed)
    build_drafter(drafter_config("domino", target)).save_pretrained(path / "drafter")
    (path / "report.json").write_text(json.dumps({"seed": seed}))
    cache.mark_complete(path, {"variant": "domino", "seed": seed})


def _data_offset(f) -> int:
    """Where a safetensors file's tensor bytes begin (after its 8-byte length and JSON header)."""
    with open(f, "rb") as fh:
        return 8 + struct.unpack("<Q", fh.read(8))[0]


def _overwrite_4k(f) -> None:
    """4 KiB of 0xFF (float32 NaN) written over the tensor bytes: the file keeps its size."""
    size = f.stat().st_size
    offset = _data_offset(f) + 1024
    assert size > max(offset + 4096, 1 << 16)  # beyond the old 64 KiB rule
    with open(f, "r+b") as fh:
        fh.seek(offset)
        fh.write(b"\xff" * 4096)
    assert f.stat().st_size == size


def test_overwritten_drafter_in_the_cache_is_rebuilt_and_refused_by_path(tmp_path, target, caplog):
    path = tmp_path / "drafters" / "domino-0123"
    builds = []

    def build(p):
        builds.append(1)
        _save_drafter(p, target)

    def load(p):
        return load_drafter(p / "drafter")

    first = cache.reuse_or_build(path, load, build)
    weights = path / "drafter" / WEIGHTS_NAME
    _overwrite_4k(weights)
    with pytest.raises(DrafterLoadError) as info:  # by path: refused, naming the folder and the file
        load_drafter(path / "drafter")
    msg = str(info.value)
    assert "\n" not in msg and str(path / "drafter") in msg and "drafter/model.safetensors changed" in msg
    with caplog.at_level(logging.WARNING, logger="lit_domino.runtime.cache"):
        assert not cache.is_complete(path)  # the cache: incomplete, one line naming the folder and the file
    assert str(path) in caplog.text and "drafter/model.safetensors changed" in caplog.text
    again = cache.reuse_or_build(path, load, build)  # rebuilt, then loaded
    assert len(builds) == 2 and cache.is_complete(path)
    for (name, a), b in zip(first.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_nan_in_a_valid_file_is_refused_naming_the_tensor(tmp_path, target):
    path = tmp_path / "drafters" / "domino-4567"
    _save_drafter(path, target)
    weights = path / "drafter" / WEIGHTS_NAME
    tensors = load_file(weights)
    name = sorted(tensors)[len(tensors) // 2]
    tensors[name].view(-1)[3] = float("nan")
    save_file(tensors, weights, metadata={"kind": "domino", "format": "lit_domino"})
    cache.mark_complete(path, {"variant": "domino", "seed": 0})  # re-marked: every hash matches
    assert cache.is_complete(path)
    with pytest.raises(DrafterLoadError, match="non-finite") as info:
        load_drafter(path / "drafter")
    assert f"tensor {name!r} has 1 NaN/inf" in str(info.value) and str(weights) in str(info.value)
    plain = tmp_path / "copied"  # a drafter directory outside any cache artifact: still refused
    shutil.copytree(path / "drafter", plain)
    with pytest.raises(DrafterLoadError, match=f"tensor '{name}' has 1 NaN/inf"):
        load_drafter(plain)


def test_a_drafter_directory_outside_the_cache_still_loads(tmp_path, target):
    build_drafter(drafter_config("domino", target)).save_pretrained(tmp_path / "d")
    assert cache.check_directory(tmp_path / "d") == (None, [])
    load_drafter(tmp_path / "d", target=target)


def _target_artifact(src, path):
    shutil.copytree(src, path)
    cache.mark_complete(path, {"target": "test"})  # as build_tiny_target marks the embedded target
    return path


def test_a_corrupt_target_artifact_is_refused_naming_the_file(tiny_target_dir, tmp_path):
    path = _target_artifact(tiny_target_dir, tmp_path / "target" / "t-1")
    load_target(path)  # intact: loads
    _overwrite_4k(path / "model.safetensors")
    copy = tmp_path / "target" / "t-2"  # load_target memoises per path: a fresh path reads the files again
    shutil.copytree(path, copy)
    with pytest.raises(TargetError) as info:
        load_target(copy)
    assert str(copy) in str(info.value) and "model.safetensors changed" in str(info.value)


def test_a_target_with_a_nan_is_refused_naming_tensor_and_file(tiny_target_dir, tmp_path):
    path = tmp_path / "t"
    shutil.copytree(tiny_target_dir, path)
    weights = path / "model.safetensors"
    tensors = load_file(weights)
    name = next(n for n in sorted(tensors) if "layers.2." in n and tensors[n].dim() == 2)
    tensors[name][0, 0] = float("inf")
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(TargetError) as info:
        load_target(path)
    assert f"tensor {name!r} has 1 NaN/inf" in str(info.value) and str(weights) in str(info.value)

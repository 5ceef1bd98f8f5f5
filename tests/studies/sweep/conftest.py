"""Sweep tests: ``sweep_fakes`` (the fast stand-in evaluator and settings) is importable by name, here and
in the worker processes the CLI spawns (``--evaluator sweep_fakes:fake_evaluator``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@pytest.fixture
def importable_tests(monkeypatch):
    """Spawned workers import ``sweep_fakes:fake_evaluator`` (and the worktree's lit_domino)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]))

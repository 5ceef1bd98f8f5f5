"""A block run without touching the caller's global random state (the cache's builders run in it)."""

from __future__ import annotations

import contextlib
import os
import random
import sys
from typing import Iterator


@contextlib.contextmanager
def isolated_rng(seed: int | None = None) -> Iterator[None]:
    """Run a block without touching the caller's global random state.

    Python's ``random``, NumPy's and torch's global generators (CPU, and CUDA when
    initialised), and Lightning's ``PL_GLOBAL_SEED``/``PL_SEED_WORKERS`` variables, are
    saved and restored; with ``seed`` they are all seeded inside (as ``seed_everything``
    would). Builders use it so that results never depend on whether the cache was warm.
    Modules not imported yet cannot be disturbed and are left alone.
    """
    if seed is not None:  # seeding: every generator is captured (and restored) first
        import numpy  # noqa: F401
        import torch  # noqa: F401
    env = {k: os.environ.get(k) for k in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS")}
    py_state = random.getstate()
    np = sys.modules.get("numpy")
    np_state = np.random.get_state() if np is not None else None
    torch = sys.modules.get("torch")
    stack = contextlib.ExitStack()
    if torch is not None:
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        stack.enter_context(torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if cuda else []))
    try:
        with stack:
            if seed is not None:
                random.seed(seed)
                np.random.seed(seed % 2**32)
                torch.manual_seed(seed)
            yield
    finally:
        random.setstate(py_state)
        if np_state is not None:
            np.random.set_state(np_state)
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

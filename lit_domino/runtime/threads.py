"""torch's intra-op thread count for a block of code, the CPUs this process may use and its C++ compiler."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator


@contextlib.contextmanager
def pinned_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` torch intra-op threads, restoring the previous count after (None: leave as is)."""
    if n is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def cpp_compiler() -> str | None:
    """The C++ compiler inductor would use on a CPU: ``$CXX``, else g++, c++ or clang++ on the PATH (None)."""
    names = [os.environ["CXX"]] if os.environ.get("CXX") else ["g++", "c++", "clang++"]
    return next((path for name in names if (path := shutil.which(name))), None)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask; os.cpu_count() where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@contextlib.contextmanager
def bounded_threads(threads: int | None):
    """torch's intra-op threads for the block: ``threads``, or at most the usable CPUs; restored after."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive integer or None, got {threads!r}")
    import torch

    before = torch.get_num_threads()
    wanted = threads if threads is not None else min(before, usable_cpus())
    if wanted != before:
        torch.set_num_threads(wanted)
    try:
        yield
    finally:
        if wanted != before:
            torch.set_num_threads(before)

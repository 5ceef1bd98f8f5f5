"""torch's intra-op thread count for a block of code."""

from __future__ import annotations

import contextlib
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

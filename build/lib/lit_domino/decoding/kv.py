"""The target's KV cache: the one place that rolls it back after a verification.

transformers 5.x changed ``DynamicCache.crop(n)``: it now takes a *negative count of
tokens to remove* (``crop(-4)``) and rejects a positive absolute length. A negative
count also worked in 4.x (it meant "remove abs(n) tokens"), so :func:`crop_cache`
always passes one and stays correct on both.
"""

from __future__ import annotations

import torch


def cache_length(cache) -> int:
    """Number of positions held by ``cache`` (0 for ``None``)."""
    return 0 if cache is None else int(cache.get_seq_length())


def crop_cache(cache, length: int, current: int | None = None) -> None:
    """Keep the first ``length`` positions of ``cache`` in place (drop positions ``>= length``).

    Speculative rollback: after verifying ``[anchor, d_1..d_m]`` at positions
    ``start..start+m`` and accepting ``acc`` drafts, the cache must end at
    ``start + acc + 1`` (anchor + accepted drafts; the bonus token has no KV yet). ``current``: the cache's
    length when the caller tracks it (a ``StaticCache`` keeps its length on the device; reading it synchronises).
    """
    current = cache_length(cache) if current is None else int(current)
    length = int(length)
    if not 0 <= length <= current:
        raise ValueError(f"cannot crop a KV cache of {current} positions to {length}: need 0 <= length <= {current}")
    if length < current:
        cache.crop(length - current)  # negative: the number of trailing positions to remove


def compact_cache(cache, sources: list[int], first: int) -> None:
    """Move the K/V of slots ``sources`` (increasing) to ``first, first+1, ..`` in every layer (tree rounds: the
    accepted path's nodes to the front of the window, before :func:`crop_cache`); nothing to move when they are
    there already (a chain's accepted prefix). A ``DynamicCache`` and a ``StaticCache`` alike."""
    if all(s == first + i for i, s in enumerate(sources)):
        return
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"cannot compact a {type(cache).__name__}: it has no per-layer keys/values")
    dev = layers[0].keys.device
    src = torch.tensor(sources, dtype=torch.long, device=dev)
    dst = torch.arange(first, first + len(sources), device=dev)
    for layer in layers:
        for buf in (layer.keys, layer.values):
            buf.index_copy_(2, dst, buf.index_select(2, src))

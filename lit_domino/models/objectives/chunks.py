"""The lean (chunked) evaluation of a loss: the LM head on the labelled rows only, ``chunk_size`` rows at a time,
each chunk's ``[n, V]`` logits recomputed in the backward pass (``torch.utils.checkpoint``), so the full
``[positions, V]`` logits of a batch never exist at once.

:func:`chunked_ce` sums weighted cross-entropies, :func:`chunked_row_sums` weighted per-row terms, and
:func:`chunked_rows` returns the per-row terms themselves (``[N]`` vectors, still in the graph) for losses that
combine rows across a block (the objectives of :mod:`lit_domino.models.objectives.registry`).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from lit_domino.models.objectives.weights import IGNORE_INDEX

DEFAULT_CHUNK_SIZE = 1024
"""Default rows per LM-head chunk of the lean losses (:attr:`LossSettings.chunk_size`)."""


def check_chunk_size(chunk_size) -> int | None:
    """``None`` (one chunk) or a positive integer."""
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"loss chunk_size must be a positive integer (labelled rows per LM-head chunk) or None "
                         f"(one chunk: full logits, as before), got {chunk_size!r}")
    return chunk_size


LogitsFn = Callable[..., Sequence[torch.Tensor]]
"""``logits_fn(*row_chunks) -> (logits [n, V], ...)``: one or more logits per chunk of rows."""


def chunked_ce(
    logits_fn: LogitsFn,
    inputs: Sequence[torch.Tensor],
    labels: torch.Tensor,
    weights: torch.Tensor,
    chunk_size: int | None,
    argmax: int | None = None,
) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """``Σ_i w_i·CE(logits_j[i], y_i)`` for each logits ``j`` that ``logits_fn`` returns, chunk by chunk.

    Args:
        logits_fn: maps a chunk of each input (rows ``i..i+n``) to one or more logits ``[n, V]``
            (e.g. ``lm_head(h)``, or Domino's base and final logits at once).
        inputs: tensors ``[N, ...]`` whose rows are the labelled positions (hidden states, not logits).
        labels: ``[N]`` the label of each row (all real labels).
        weights: ``[N]`` each row's weight in the sum.
        chunk_size: rows per chunk; ``None`` = all rows in one chunk.
        argmax: index of the logits whose per-row argmax to return (validation picks); None = none.

    Returns:
        ``([sum_j], argmax [N] or None)``, each sum float32. With a ``chunk_size``, each chunk runs
        under ``torch.utils.checkpoint``: its logits are freed after the forward and recomputed in the
        backward pass, so only one chunk's ``[n, V]`` logits are alive at a time (None: one chunk, kept). With no rows the sums
        are 0, still attached to the graph (every parameter of ``logits_fn`` gets a zero gradient).
    """
    N = labels.shape[0]
    step = N if chunk_size is None else int(chunk_size)
    chunks = range(0, max(N, 1), max(step, 1))

    def body(y, w, *xs):
        outs = logits_fn(*xs)
        sums = tuple((F.cross_entropy(lg.float(), y, reduction="none") * w).sum() for lg in outs)
        return sums if argmax is None else (*sums, outs[argmax].argmax(-1))

    # recompute whenever chunking is asked for: even a single chunk's logits would otherwise stay alive until
    # the backward pass, next to every other loss term's (EAGLE-3's 7 steps, Domino's stages)
    recompute = chunk_size is not None and torch.is_grad_enabled()
    totals, picks = None, []
    for start in chunks:
        sl = slice(start, start + step)
        args = (labels[sl], weights[sl].float(), *(x[sl] for x in inputs))
        out = checkpoint(body, *args, use_reentrant=False) if recompute else body(*args)
        if argmax is not None:
            picks.append(out[-1])
            out = out[:-1]
        totals = list(out) if totals is None else [t + o for t, o in zip(totals, out)]
    return totals, (torch.cat(picks) if argmax is not None else None)


def chunked_row_sums(row_fn: Callable[..., Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
                     weights: torch.Tensor, chunk_size: int | None) -> list[torch.Tensor]:
    """``Σ_i w_i·t_j(i)`` for each per-row term ``t_j`` [n] that ``row_fn(*row_chunks)`` returns, chunk by chunk
    (:func:`chunked_ce`'s recomputation: with a ``chunk_size`` each chunk runs under ``torch.utils.checkpoint``,
    so only one chunk's ``[n, V]`` logits are alive). With no rows the sums are 0, still attached to the graph."""
    N = weights.shape[0]
    step = N if chunk_size is None else int(chunk_size)
    recompute = chunk_size is not None and torch.is_grad_enabled()

    def body(w, *xs):
        return tuple((t.float() * w).sum() for t in row_fn(*xs))

    totals = None
    for start in range(0, max(N, 1), max(step, 1)):
        sl = slice(start, start + step)
        args = (weights[sl].float(), *(x[sl] for x in inputs))
        out = checkpoint(body, *args, use_reentrant=False) if recompute else body(*args)
        totals = list(out) if totals is None else [t + o for t, o in zip(totals, out)]
    return totals


def chunked_rows(row_fn: Callable[..., Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
                 chunk_size: int | None) -> list[torch.Tensor]:
    """The per-row terms ``t_j`` ``[N]`` that ``row_fn(*row_chunks)`` returns (each ``[n]``), chunk by chunk and
    concatenated: :func:`chunked_row_sums` without the sum (with a ``chunk_size`` each chunk runs under
    ``torch.utils.checkpoint``, so only one chunk's ``[n, V]`` logits are alive; the ``[N]`` terms keep their
    graph). With no rows each term is an empty ``[0]`` tensor, still attached to the graph."""
    N = inputs[0].shape[0]
    step = N if chunk_size is None else int(chunk_size)
    recompute = chunk_size is not None and torch.is_grad_enabled()
    parts: list[list[torch.Tensor]] | None = None
    for start in range(0, max(N, 1), max(step, 1)):
        args = [x[start: start + step] for x in inputs]
        out = checkpoint(row_fn, *args, use_reentrant=False) if recompute else row_fn(*args)
        parts = [[t] for t in out] if parts is None else [p + [t] for p, t in zip(parts, out)]
    return [torch.cat(p) if len(p) > 1 else p[0] for p in parts]


def label_rows(labels: torch.Tensor, weights: torch.Tensor | None = None):
    """The labelled positions of ``labels`` ``[..., B]``: ``(keep [..., B] bool, labels [N], weights [N])``,
    the weights being the position weights ``[B]`` of each kept row (ones when None)."""
    keep = labels != IGNORE_INDEX
    w = torch.ones(labels.shape[-1], device=labels.device) if weights is None else weights.to(labels.device)
    return keep, labels[keep], w.float().expand(labels.shape)[keep]

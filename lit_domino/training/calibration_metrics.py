"""Scores of a confidence against binary events: ROC AUC, expected calibration error and its sampling floor."""

from __future__ import annotations

import torch


def ece(p: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None = None, bins: int = 10) -> float:
    """Expected calibration error: Σ_bins (weight share) · |mean p - mean y| over equal-width bins of p."""
    p, y = p.double().reshape(-1), y.double().reshape(-1)
    w = torch.ones_like(p) if w is None else w.double().reshape(-1)
    total = float(w.sum())
    if total <= 0:
        return float("nan")
    idx = (p * bins).long().clamp(0, bins - 1)
    err = 0.0
    for b in range(bins):
        m = (idx == b) & (w > 0)
        if m.any():
            wb = w[m]
            err += float(wb.sum()) / total * abs(float((p[m] * wb).sum() / wb.sum() - (y[m] * wb).sum() / wb.sum()))
    return err


def auc(score: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None = None) -> float:
    """ROC AUC of ``score`` for the binary ``y`` (rows with weight 0 left out; ties count one half)."""
    score, y = score.double().reshape(-1), y.reshape(-1) > 0.5
    if w is not None:
        keep = w.reshape(-1) > 0
        score, y = score[keep], y[keep]
    pos, neg = score[y], score[~y]
    if pos.numel() == 0 or neg.numel() == 0:
        return float("nan")
    order = torch.cat([pos, neg]).argsort()
    ranks = torch.empty(order.numel(), dtype=torch.double)
    ranks[order] = torch.arange(1, order.numel() + 1, dtype=torch.double)
    s = torch.cat([pos, neg])
    for v in s.unique():  # average ranks of ties
        m = s == v
        if int(m.sum()) > 1:
            ranks[m] = ranks[m].mean()
    return float((ranks[: pos.numel()].sum() - pos.numel() * (pos.numel() + 1) / 2) / (pos.numel() * neg.numel()))


def ece_floor(p: torch.Tensor, w: torch.Tensor | None = None, draws: int = 100, bins: int = 10, seed: int = 0) -> float:
    """The ECE a perfectly calibrated predictor scores by sampling alone on these rows: the mean :func:`ece` of
    ``p`` against labels drawn from Bernoulli(p) (``draws`` seeded draws). With 100-500 rows it is 2-8 %, so an
    ECE within it is calibrated as far as the test split can tell."""
    p = p.double().reshape(-1)
    w = torch.ones_like(p) if w is None else w.double().reshape(-1)
    if float(w.sum()) <= 0:
        return float("nan")
    keep = w > 0
    p, w = p[keep], w[keep]
    gen = torch.Generator().manual_seed(seed)
    return sum(ece(p, (torch.rand(p.shape, generator=gen, dtype=torch.float64) < p).double(), w, bins)
               for _ in range(draws)) / draws

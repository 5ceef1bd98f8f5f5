"""Scores of a confidence against binary events: ROC AUC, expected calibration error and its sampling floor."""

from __future__ import annotations

import math

import torch
from torchmetrics.functional.classification import binary_calibration_error


def ece(p: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None = None, bins: int = 10) -> float:
    """Expected calibration error: Σ_bins (row share) · |mean p - mean y| over ``bins`` equal-width bins of p
    (torchmetrics' ``binary_calibration_error``, l1), on the rows whose weight ``w`` is 1.

    torchmetrics takes no sample weights, so ``w`` is a 0/1 mask (the suite's only weights here: the rounds that
    reached a position, ``Π_{i<j} y_i`` of hard labels); a fractional weight is refused rather than binned as 1.
    ``y`` may be soft (c* in [0, 1]): the bins' means are taken as they are."""
    p, y = p.double().reshape(-1), y.double().reshape(-1)
    if w is not None:
        w = w.double().reshape(-1)
        if not bool(((w == 0) | (w == 1)).all()):
            raise ValueError("ece: row weights must be 0 or 1 (torchmetrics' calibration error has no sample weights)")
        p, y = p[w > 0], y[w > 0]
    if p.numel() == 0:
        return float("nan")
    # torchmetrics gives p == 1 a bin of its own (bucketize against the upper edge); the last bin here is [0.9, 1]
    p = p.clamp(max=math.nextafter(1.0, 0.0))
    return float(binary_calibration_error(p, y, n_bins=bins, norm="l1", validate_args=False))


def auc(score: torch.Tensor, y: torch.Tensor, w: torch.Tensor | None = None) -> float:
    """ROC AUC of ``score`` for the binary ``y`` (rows with weight 0 left out; ties count one half): the rank-sum
    (Mann-Whitney) form in float64.

    Not torchmetrics' ``binary_auroc``: it divides its integer TP/FP counts in float32 (its AUC agrees only to about
    1e-7, and the studies log AUC to MLflow in full), and it passes raw logits through a sigmoid, which ties logits
    beyond about 37 in float64."""
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
    ``p`` against labels drawn from Bernoulli(p) (``draws`` seeded draws): an ECE within it is calibrated as far as
    the test split can tell (on a few hundred rows it is several percent)."""
    p = p.double().reshape(-1)
    w = torch.ones_like(p) if w is None else w.double().reshape(-1)
    if float(w.sum()) <= 0:
        return float("nan")
    keep = w > 0
    p, w = p[keep], w[keep]
    gen = torch.Generator().manual_seed(seed)
    return sum(ece(p, (torch.rand(p.shape, generator=gen, dtype=torch.float64) < p).double(), w, bins)
               for _ in range(draws)) / draws

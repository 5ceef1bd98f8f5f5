"""Calibrating acceptance predictors (:mod:`lit_domino.training.acceptance`, step 3): per round position a
temperature and an offset fitted sequentially on held-out rounds, the survival maps and the stage maps (isotonic)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from lit_domino.decoding.acceptance import Calibration


def prefix_weights(y: torch.Tensor) -> torch.Tensor:
    """[n, P] labels -> weights ``Π_{i<j} y_i`` (1 at j = 1): the rounds that reached position j."""
    return torch.cat([torch.ones_like(y[:, :1]), torch.cumprod(y, 1)[:, :-1]], 1)


def _fit_temperature(z: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> float:
    """The τ > 0 minimising the w-weighted BCE of sigmoid(z / τ) against y (a log-spaced grid, then refined)."""
    if float(w.sum()) <= 0:
        return 1.0

    def nll(taus):
        zz = z[None] / taus[:, None]
        return (F.binary_cross_entropy_with_logits(zz, y[None].expand_as(zz), reduction="none") * w).sum(1)

    grid = torch.logspace(-2, 2, 161, dtype=torch.float64)
    best = int(nll(grid).argmin())
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    fine = torch.linspace(float(lo), float(hi), 101, dtype=torch.float64)
    return float(fine[int(nll(fine).argmin())])


MIN_CALIBRATION_WEIGHT = 20.0
"""Rounds (summed weights) a position needs for a temperature of its own; fewer reuse the previous position's."""


def _fit_platt(z: torch.Tensor, y: torch.Tensor, w: torch.Tensor, tau0: float) -> tuple[float, float]:
    """(τ, b) minimising the w-weighted BCE of sigmoid(z / τ + b) (L-BFGS from τ0, b = 0)."""
    log_a = torch.tensor(-math.log(tau0), dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_a, b], lr=0.5, max_iter=100, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = (F.binary_cross_entropy_with_logits(z * log_a.exp() + b, y, reduction="none") * w).sum() / w.sum()
        loss.backward()
        return loss

    opt.step(closure)
    tau, off = math.exp(-log_a.item()), b.item()
    if not (math.isfinite(tau) and tau > 0 and math.isfinite(off)):
        return tau0, 0.0
    return tau, off


def fit_calibration(z: torch.Tensor, y: torch.Tensor, label: str, offsets: bool = True,
                    stage_tokens: int | None = None, survival_fit: bool = False) -> Calibration:
    """Per position temperatures from held-out raw logits z [n, P] and labels y [n, P] (see the module docs);
    a position that fewer than :data:`MIN_CALIBRATION_WEIGHT` rounds reached keeps the previous one's τ. With
    ``survival_fit``, the per-position survival maps (:func:`fit_survival`); with ``stage_tokens`` K (the rounds'
    stages of K drafts), also the stage-level map and yields (:func:`fit_stages`) on the survival."""
    z, y = z.double(), y.double()
    w = prefix_weights(y)
    taus, offs, means = [], [], []
    for j in range(z.shape[1]):
        enough = float(w[:, j].sum()) >= MIN_CALIBRATION_WEIGHT or not taus
        if enough:
            tau, off = _fit_temperature(z[:, j], y[:, j], w[:, j]), 0.0
            if offsets and float(w[:, j].sum()) > 0:
                tau, off = _fit_platt(z[:, j], y[:, j], w[:, j], tau)
        else:
            tau, off = taus[-1], offs[-1]
        c = torch.sigmoid(z[:, j] / tau + off)
        taus.append(tau), offs.append(off)
        means.append(float((c * w[:, j]).sum() / w[:, j].sum()) if float(w[:, j].sum()) > 0 else float(c.mean()))
    cal = Calibration(taus, means, label, offs if offsets else None)
    if survival_fit:
        cal.survival_maps = fit_survival(calibrated(z, cal), y)
        Calibration.__post_init__(cal)  # check the maps
    if stage_tokens is not None:
        whole, gain = fit_stages(survival_of(z, cal), y, stage_tokens)
        if whole is not None:
            cal.stage_whole, cal.stage_gain, cal.stage_tokens = whole, gain, int(stage_tokens)
            Calibration.__post_init__(cal)  # check the stage fields
    return cal


MIN_STAGE_ROUNDS = 20
"""Held-out rounds per bin of the stage maps' isotonic fit (:func:`isotonic`); fewer than two bins' worth, or no
round accepted whole, and the gates fall back to S and the mean confidences."""


def fit_survival(c: torch.Tensor, y: torch.Tensor) -> list[list[list[float]]]:
    """Per round position j, the isotonic map (:func:`isotonic`, every round, bins of :data:`MIN_STAGE_ROUNDS`) of
    the product R_j = c_1 ··· c_j of calibrated confidences c [n, P] to the survival Π_{i<=j} y_i of labels
    y [n, P]; a position without two bins' worth of rounds keeps the previous map (the first: the identity)."""
    R, alive = torch.cumprod(c.double(), 1), torch.cumprod(y.double(), 1)
    maps = []
    for j in range(R.shape[1]):
        knots = isotonic(R[:, j], alive[:, j])
        maps.append(knots if knots is not None else (maps[-1] if maps else [[0.0, 1.0], [0.0, 1.0]]))
    return maps


def survival_of(z: torch.Tensor, cal: Calibration | None) -> torch.Tensor:
    """The survival S [n, P] a gate reads for raw logits z [n, P]: the product of the calibrated c_j through the
    calibration's survival maps (:meth:`~lit_domino.decoding.acceptance.Calibration.survival`)."""
    R = torch.cumprod(calibrated(z, cal), 1)
    return R if cal is None else cal.survival(R)


def stage_events(S: torch.Tensor, y: torch.Tensor, K: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The survival S [n, P] (:func:`survival_of`) and labels y [n, P] of rounds of K-draft stages -> (S,
    alive [n, P] = Π_{i<=j} y_i, the stage boundaries j = sK - 1 (0-based) at which a gate decides)."""
    return S.double(), torch.cumprod(y.double(), 1), [s * K - 1 for s in range(1, y.shape[1] // K)]


def isotonic(x: torch.Tensor, y: torch.Tensor, min_count: int = MIN_STAGE_ROUNDS) -> list[list[float]] | None:
    """The non-decreasing map of ``x`` that fits ``y`` best in squares: the rows sorted by x, pooled into bins of
    ``min_count`` (the last takes the rest), then adjacent bins pooled while their means decrease (PAV); knots
    ``[[mean x ..], [mean y ..]]`` per block (blocks of equal mean x merged). None with fewer than two bins."""
    order = torch.argsort(x)
    x, y = x[order].tolist(), y[order].tolist()
    n = len(x) // min_count
    if n < 2:
        return None
    cuts = [i * min_count for i in range(n)] + [len(x)]
    blocks = []  # [sum x, sum y, count]
    for lo, hi in zip(cuts, cuts[1:]):
        blocks.append([sum(x[lo:hi]), sum(y[lo:hi]), hi - lo])
        while len(blocks) > 1 and (blocks[-2][1] / blocks[-2][2] >= blocks[-1][1] / blocks[-1][2]
                                   or blocks[-2][0] / blocks[-2][2] >= blocks[-1][0] / blocks[-1][2]):
            sx, sy, m = blocks.pop()
            blocks[-1] = [blocks[-1][0] + sx, blocks[-1][1] + sy, blocks[-1][2] + m]
    return [[b[0] / b[2] for b in blocks], [b[1] / b[2] for b in blocks]]


def fit_stages(S: torch.Tensor, y: torch.Tensor, K: int) -> tuple[list[list[float]] | None, list[list[float]] | None]:
    """The stage maps from the survival S [n, P] (:func:`survival_of`) and labels y [n, P] of rounds of K-draft
    stages, every stage boundary's rows pooled: ``whole``, P(alive at the boundary | S), and ``gain``, the drafts of
    the next stage accepted (0 when the round is dead at the boundary) given S, both isotonic in S
    (:func:`isotonic`); hard and soft labels alike. (None, None) with too few rounds or none accepted whole."""
    S, alive, bounds = stage_events(S, y, K)
    if not bounds:
        return None, None
    s = torch.cat([S[:, b] for b in bounds])
    whole = torch.cat([alive[:, b] for b in bounds])
    gain = torch.cat([alive[:, b + 1: b + 1 + K].sum(1) for b in bounds])
    if float(whole.sum()) <= 0:
        return None, None
    return isotonic(s, whole), isotonic(s, gain)


def calibrated(z: torch.Tensor, cal: Calibration | None) -> torch.Tensor:
    if cal is None:
        return torch.sigmoid(z.double())
    return torch.sigmoid(cal.apply(z.double()))

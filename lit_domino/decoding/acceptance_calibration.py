"""The calibration of an acceptance predictor (:mod:`lit_domino.decoding.acceptance`): how its raw logits z_j become
the probabilities a gate decides on, and the stage-level quantities DLoop's gates read.

Per round position j (stages concatenated), a temperature τ_j and an offset b_j (Platt; none for a
temperatures-only calibration), so that ``c_j = sigmoid(z_j / τ_j + b_j)`` is the acceptance probability of
position j *given* that 1..j-1 were accepted; fitted sequentially on held-out rounds (position j on the rounds that
survived to j; :mod:`lit_domino.training.calibration`). The survival S_j, the probability that the first j drafts
survive, is the product ``c_1 ··· c_j`` read through a per-position isotonic map fitted on the same rounds
(:attr:`Calibration.survival_maps`: the c_j's errors add up along a round). ``mean_confidence[j]`` (the mean
calibrated c_j on the held-out rounds that reached j) is the cost gate's forecast of a stage not drafted yet.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import torch


def _monotone_knots(knots) -> bool:
    """Whether ``knots`` is a map :func:`_interp` reads: ``[[x ..], [y ..]]`` of equal, non-zero length, finite,
    both non-decreasing."""
    return (len(knots) == 2 and len(knots[0]) == len(knots[1]) and bool(knots[0])
            and all(math.isfinite(v) for v in (*knots[0], *knots[1]))
            and list(knots[0]) == sorted(knots[0]) and list(knots[1]) == sorted(knots[1]))


def _interp(x: float, knots: list[list[float]]) -> float:
    """A map given by knots ``[[x ..], [y ..]]`` at ``x``: linear between them, flat beyond them."""
    xs, ys = knots
    if x <= xs[0]:
        return ys[0]
    j = bisect.bisect_right(xs, x)
    if j >= len(xs):
        return ys[-1]
    span = xs[j] - xs[j - 1]
    return ys[j] if span <= 0 else ys[j - 1] + (ys[j] - ys[j - 1]) * (x - xs[j - 1]) / span


@dataclass
class Calibration:
    """Per round position temperatures and the held-out mean calibrated confidence (see the module docstring), and
    the stage-level quantities DLoop's gates decide on (:meth:`whole_stage`, :meth:`next_gain`)."""

    temperatures: list[float]
    """τ_j for round positions j = 1, 2, ... (stages concatenated); later positions reuse the last one."""
    mean_confidence: list[float]
    """Mean calibrated c_j on the held-out rounds that reached j (the cost gate's forecast of a stage when
    :attr:`stage_gain` is not known)."""
    label: str = "hard"
    """What the survival was fitted to: ``hard`` acceptance events (T = 0) or ``soft`` c* (T > 0)."""
    offsets: list[float] | None = None
    """Per position offsets b_j (``c_j = sigmoid(z_j / τ_j + b_j)``, Platt scaling); None: temperature scaling only.
    A head trained on every position of a round learns one bias for all of them, and a temperature alone cannot
    move a position's mean (on the smoke backbone it left position 1's calibration error worse; docs/results.md)."""
    stage_whole: list[list[float]] | None = None
    """``[[S_1 .. S_n], [P_1 .. P_n]]``: the probability that every draft of the round so far is accepted, as a
    non-decreasing map of the product S of their calibrated c_j at a stage boundary (isotonic regression on the
    held-out rounds, linear between its knots, flat beyond them); None: S itself. Each c_j is calibrated on the
    rounds that reached j, but their product is not where a gate decides: on the default DSpark drafter, held-out
    rounds a Platt map of S gave middling probabilities were accepted whole far less often (docs/results.md; the
    rounds' S is bimodal, and a logistic curve fitted mostly to the many hopeless rounds misses the few between)."""
    stage_gain: list[list[float]] | None = None
    """``[[S_1 .. S_n], [G_1 .. G_n]]``: the drafts another stage of :attr:`stage_tokens` is expected to have
    accepted given the round's S at a stage boundary (0 when a draft so far fails), fitted alike; None: S times the
    product of the mean confidences (optimistic: on the default drafters a whole stage's next stage yielded fewer
    drafts where S was middling than where it was high; docs/results.md)."""
    stage_tokens: int | None = None
    """The drafts of a stage the stage maps were fitted on (a shorter stage's gain is scaled down)."""
    survival_maps: list[list[list[float]]] | None = None
    """Per round position j, ``[[R ..], [S ..]]``: the probability that drafts 1..j all survive as a non-decreasing
    map of the product R_j = c_1 ··· c_j of the calibrated confidences (isotonic regression on every held-out round,
    linear between its knots, flat beyond them; later positions use the last map), the survival kept
    non-increasing along the round (:meth:`survivals`); None: S_j = R_j. Each c_j is calibrated on the rounds that
    reached j, yet their product need not be: on the default DSpark drafter's own head the c_j's errors add up
    along a round (the held-out survival's ECE exceeds the c_j's; docs/results.md). The stage maps are fitted on
    this S."""

    def __post_init__(self):
        if not self.temperatures or any(not (math.isfinite(t) and t > 0) for t in self.temperatures):
            raise ValueError(f"calibration temperatures must be finite and > 0, got {self.temperatures}")
        if len(self.mean_confidence) != len(self.temperatures):
            raise ValueError("calibration: one mean confidence per temperature")
        if self.offsets is not None and (len(self.offsets) != len(self.temperatures)
                                         or not all(math.isfinite(b) for b in self.offsets)):
            raise ValueError("calibration: one finite offset per temperature")
        for name in ("stage_whole", "stage_gain"):
            knots = getattr(self, name)
            if knots is not None and not _monotone_knots(knots):
                raise ValueError(f"calibration: {name} must be [[S ..], [value ..]], both non-decreasing and finite, "
                                 f"got {knots}")
        if self.survival_maps is not None:
            if not self.survival_maps:
                raise ValueError("calibration: survival_maps must hold one map per position, got none")
            for j, knots in enumerate(self.survival_maps):
                if not _monotone_knots(knots):
                    raise ValueError(f"calibration: survival_maps[{j}] must be [[R ..], [S ..]], both non-decreasing "
                                     f"and finite, got {knots}")
        if (self.stage_whole is not None or self.stage_gain is not None) and not self.stage_tokens:
            raise ValueError("calibration: stage maps need stage_tokens (the drafts of the stages they were fitted on)")
        self._vectors: dict[str, torch.Tensor] = {}

    def apply(self, z: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Calibrated logits of raw logits z [..., n] at round positions start+1 .. start+n."""
        n = z.shape[-1]
        out = z / self.at(self.temperatures, start, n).to(z.device, z.dtype)
        if self.offsets is not None:
            out = out + self.at(self.offsets, start, n).to(z.device, z.dtype)
        return out

    def at(self, values: list[float], start: int, n: int) -> torch.Tensor:
        """``values`` at round positions start+1 .. start+n (0-based offsets start..; the last one repeats), from a
        float32 vector built once per list (a gate asks at every stage)."""
        key = next((k for k in ("temperatures", "offsets", "mean_confidence") if values is getattr(self, k)), None)
        vec = self._vectors.get(key) if key else None
        if vec is None or vec.numel() < start + n:
            length = max(start + n, len(values), 64)
            vec = torch.tensor([values[min(i, len(values) - 1)] for i in range(length)], dtype=torch.float32)
            if key:
                self._vectors[key] = vec
        return vec[start: start + n]

    def survivals(self, products: list[float], start: int = 0, before: float = 1.0) -> list[float]:
        """The survival S_j at round positions start+1 .. start+n from the products R_j of the calibrated c_j there
        (:attr:`survival_maps`), non-increasing from ``before`` (the survival at position ``start``)."""
        maps = self.survival_maps
        if maps is None:
            return list(products)
        out, last = [], len(maps) - 1
        for j, r in enumerate(products):
            before = min(before, _interp(r, maps[min(start + j, last)]))
            out.append(before)
        return out

    def survival(self, products: torch.Tensor) -> torch.Tensor:
        """:meth:`survivals` of whole rounds: products R [n, P] (round positions 1..P) -> S [n, P]."""
        if self.survival_maps is None:
            return products
        return torch.tensor([self.survivals(row) for row in products.tolist()], dtype=products.dtype).reshape(
            products.shape)

    def whole_stage(self, survival: float) -> float:
        """The probability that every draft of the round so far is accepted, from their survival S
        (:meth:`survivals`; :attr:`stage_whole`, ``survival`` itself without it)."""
        if self.stage_whole is None:
            return min(max(survival, 0.0), 1.0)
        return _interp(survival, self.stage_whole)

    def next_gain(self, survival: float, drafted: int, room: int) -> float:
        """The drafts another stage of ``room`` drafts, after ``drafted`` drafts whose survival product is ``survival``,
        is expected to have accepted (:attr:`stage_gain`, scaled down by the mean confidences' shape for a stage
        shorter than the fitted one; without it: survival times the product of the mean confidences)."""
        if self.stage_gain is not None and room >= self.stage_tokens:
            return _interp(survival, self.stage_gain)
        forecast = float(torch.cumprod(self.at(self.mean_confidence, drafted, room), 0).sum())
        if self.stage_gain is None:
            return survival * forecast
        whole = float(torch.cumprod(self.at(self.mean_confidence, drafted, self.stage_tokens), 0).sum())
        return _interp(survival, self.stage_gain) * forecast / whole if whole > 0 else 0.0

    def best_gain(self, drafted: int, room: int) -> float:
        """The most :meth:`next_gain` can be for any survival (at survival 1: the maps are non-decreasing)."""
        return self.next_gain(1.0, drafted, room)

    def to_dict(self) -> dict:
        """The fields (what a saved predictor's JSON holds)."""
        return {k: getattr(self, k) for k in ("temperatures", "mean_confidence", "label", "offsets", "stage_whole",
                                              "stage_gain", "stage_tokens", "survival_maps")}


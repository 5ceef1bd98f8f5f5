"""Domino's base-anchored curriculum: the weight λ_t of the base-logit loss, per optimizer step *(paper)*."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

LambdaKind = Literal["linear", "cosine", "step", "constant", "none"]


@dataclass(frozen=True)
class LambdaSchedule:
    """The weight λ_t of the base-logit loss in Domino's curriculum, per optimizer step.

    ``value(t, total)`` for optimizer step ``t`` of ``total`` (``T``), with the
    horizon ``H = T·ratio``:

    * ``linear``: ``max(0, λ0·(1 − t/H))`` — the paper's 1 → 0 for λ0 = 1, ratio = 1
      (the public code's general form).
    * ``cosine``: ``λ0·½(1 + cos(π·t/H))`` for ``t < H``, then 0.
    * ``step``: ``λ0·0.5^⌊t/(H·step_every)⌋`` for ``t < H``, then 0 — λ0 halves
      every ``step_every`` of the horizon (default a quarter: λ0, λ0/2, λ0/4, λ0/8, 0).
    * ``constant``: ``λ0`` throughout.
    * ``none``: 0 throughout (no base term: loss = CE of the final logits).

    Args:
        kind: one of the above.
        start: λ0, in [0, 1] (the two CE terms are a convex combination).
        ratio: horizon as a fraction of training, > 0 (ratio > 1 never reaches 0).
        step_every: for ``step`` only, the fraction of the horizon between halvings, in (0, 1].
    """

    kind: LambdaKind = "linear"
    start: float = 1.0
    ratio: float = 1.0
    step_every: float = 0.25

    def __post_init__(self):
        kinds = ("linear", "cosine", "step", "constant", "none")
        if self.kind not in kinds:
            raise ValueError(f"unknown λ schedule kind {self.kind!r}; choose one of {kinds}")
        if not 0.0 <= float(self.start) <= 1.0:
            raise ValueError(f"λ schedule start must be in [0, 1], got {self.start}")
        if not float(self.ratio) > 0:
            raise ValueError(f"λ schedule ratio must be > 0, got {self.ratio}")
        if not 0.0 < float(self.step_every) <= 1.0:
            raise ValueError(f"λ schedule step_every must be in (0, 1], got {self.step_every}")

    def value(self, step: int, total_steps: int) -> float:
        """λ at optimizer step ``step`` (0-based) of ``total_steps``."""
        if self.kind == "none":
            return 0.0
        if self.kind == "constant":
            return float(self.start)
        if total_steps is None or not math.isfinite(total_steps) or total_steps <= 0:
            raise ValueError(f"λ schedule {self.kind!r} needs a positive finite number of steps, got {total_steps}")
        t = max(0, int(step))
        horizon = float(total_steps) * float(self.ratio)
        frac = t / horizon
        if self.kind == "linear":
            return max(0.0, float(self.start) * (1.0 - frac))
        if frac >= 1.0:
            return 0.0
        if self.kind == "cosine":
            return float(self.start) * 0.5 * (1.0 + math.cos(math.pi * frac))
        # step
        return float(self.start) * 0.5 ** math.floor(frac / float(self.step_every))

    __call__ = value

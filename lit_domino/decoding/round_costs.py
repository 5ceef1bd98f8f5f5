"""What a decode's rounds really cost: the measured cost models, corrected by the rounds the decode's clock has timed.

The cost-aware rules (a tree's node budget, CaDDTree's ``E(n) / (C_draft + C_v(n))``; DLoop's ``cost`` gate) price
a round before drafting it, with models timed outside any decode: the verify-cost curve C_v(n) on a fresh cache at
one context length with a causal mask (:func:`~lit_domino.decoding.cost.measure_verify_cost`), the gate's
:class:`~lit_domino.decoding.cost_model.CostModel`. Inside a decode a round costs what those models leave out: a
tree's 4-D mask, a cache at another length, the session's extend after the verify, the rollback and the walk, a
machine whose load moved since. A rule that prices a round below its cost grows trees and opens stages that do not
pay (the tree study of 2026-12-06 measured in-decode verifies above the curve; docs/results.md).

:class:`RoundCosts` keeps, per decode, what the clock (:meth:`lit_domino.decoding.round.Clock.round`) timed against
what the model predicted for the same round, part by part:

* verify: the ratio observed / modelled at the round's width (a scale on the curve: a load or a mask moves every
  width alike, the curve keeps its shape);
* draft: the ratio observed / modelled for the round's drafting (the model: the proposer's own timer of its
  drafting, a tree's; or the cost model's stage times, the gate's), the clock's phase adding the session's extend;
* other: the round's rollback and bookkeeping, in seconds (no model has it).

Each is the median of the last :attr:`RoundCosts.WINDOW` rounds (one load spike moves no price), and a part not yet
observed is priced as modelled. Prices change a round's drafting only, never what the target accepts, so decoding
stays exact; like any timing they make a cost-aware decode's rounds depend on the machine's speed.
"""

from __future__ import annotations

import statistics
from collections import deque


class RoundCosts:
    """Observed corrections to a round's modelled cost, for one decode (see the module docstring)."""

    WINDOW = 16
    """Rounds each median reads: long enough that one slow round (a load spike) moves no price, short enough to
    follow a decode whose rounds change (a longer context, a machine that got busy)."""

    def __init__(self):
        self.verify_ratio: deque[float] = deque(maxlen=self.WINDOW)
        """Observed / modelled seconds of the last rounds' verify forwards."""
        self.draft_ratio: deque[float] = deque(maxlen=self.WINDOW)
        """Observed / modelled seconds of the last rounds' drafting."""
        self.other: deque[float] = deque(maxlen=self.WINDOW)
        """Observed seconds of the last rounds' rollback and bookkeeping."""
        self.verify_scale = 1.0
        """Observed / modelled verify seconds: the median of :attr:`verify_ratio` (1 before any round)."""
        self.draft_scale = 1.0
        """Observed / modelled drafting seconds: the median of :attr:`draft_ratio` (1 before any round)."""
        self.other_s = 0.0
        """Seconds of a round's rollback and bookkeeping: the median of :attr:`other` (0 before any round)."""

    def add(self, spent: dict | None, verify_s: float, draft_s: float) -> None:
        """One round: ``spent`` the clock's seconds per phase (None: not known yet, nothing recorded), ``verify_s``
        and ``draft_s`` what the model predicted for this round's verify and drafting (a part modelled at 0 is
        not recorded). The medians are taken here, once a round: a gate prices several stages a round."""
        if not spent:
            return
        if verify_s > 0 and "verify" in spent:
            self.verify_ratio.append(spent["verify"] / verify_s)
            self.verify_scale = statistics.median(self.verify_ratio)
        if draft_s > 0 and "draft" in spent:
            self.draft_ratio.append(spent["draft"] / draft_s)
            self.draft_scale = statistics.median(self.draft_ratio)
        self.other.append(spent.get("other", 0.0))
        self.other_s = statistics.median(self.other)

    def round_s(self, draft_s: float, verify_s: float, other_s: float = 0.0) -> float:
        """A round's price from its modelled drafting, verify and other seconds (the last replaced by the observed
        once a round is)."""
        return draft_s * self.draft_scale + verify_s * self.verify_scale + (self.other_s if self.other else other_s)

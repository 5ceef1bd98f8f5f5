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
observed is priced as modelled.

A tree's rule also reads the draft's gains (each node's path probability under the draft), and those overstate
what the target accepts, most for the small gains a tree's last nodes have (docs/results.md, 2026-12-07
(evening)): :meth:`RoundCosts.add_gains` keeps, per size class of gain, the nodes the target accepted against the
gains the draft gave them, over the decode so far, and the rule counts each gain times its class's ratio.

Prices and ratios change a round's drafting only, never what the target accepts, so decoding stays exact; like any
timing they make a cost-aware decode's rounds depend on the machine's speed.
"""

from __future__ import annotations

import statistics
from collections import deque

from lit_domino.decoding.cost import gain_class


class RoundCosts:
    """Observed corrections to a round's modelled cost, for one decode (see the module docstring)."""

    GAIN_CLASSES = 8
    """Size classes of gains the calibration keeps apart: [1/2, 1], [1/4, 1/2), .., below 1/128."""

    WINDOW = 16
    """Rounds each median reads: long enough that one slow round (a load spike) moves no price, short enough to
    follow a decode whose rounds change (a longer context, a machine that got busy)."""

    GAIN_MEMORY = 1024.0
    """Summed gains :attr:`gain_ratios` counts before it halves its counts: the last few hundred rounds weigh most,
    so the ratios follow a drafter onto other prompts (a tree's observations outlive a decode:
    :func:`lit_domino.decoding.tree.observed`)."""

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
        self.tokens: deque[tuple[int, float]] = deque(maxlen=self.WINDOW)
        """The last rounds' (tokens committed, seconds spent)."""
        self.tokens_per_s = 0.0
        """The decode's throughput over the last rounds, tokens committed per second of their phases (0 before any
        round): what a tree's rule charges a second of verify at (:attr:`~lit_domino.decoding.cost.VerifyCost.rate`)."""
        self.gain_sums = [0.0] * self.GAIN_CLASSES
        """Per class of gain (:meth:`add_gains`): the gains the draft gave the decode's tree nodes so far."""
        self.gain_hits = [0] * self.GAIN_CLASSES
        """Per class of gain: how many of those nodes the target accepted."""
        self._ratios: tuple[float, ...] | None = (1.0,) * self.GAIN_CLASSES  # :attr:`gain_ratios`; None: refit

    def add(self, spent: dict | None, verify_s: float, draft_s: float, tokens: int = 0) -> None:
        """One round: ``spent`` the clock's seconds per phase (None: not known yet, nothing recorded), ``verify_s``
        and ``draft_s`` what the model predicted for this round's verify and drafting (a part modelled at 0 is
        not recorded), ``tokens`` the tokens it committed (0: not counted in :attr:`tokens_per_s`). The medians
        are taken here, once a round: a gate prices several stages a round."""
        if not spent:
            return
        if tokens > 0:
            self.tokens.append((tokens, sum(spent.values())))
            self.tokens_per_s = sum(t for t, _ in self.tokens) / sum(x for _, x in self.tokens)
        if verify_s > 0 and "verify" in spent:
            self.verify_ratio.append(spent["verify"] / verify_s)
            self.verify_scale = statistics.median(self.verify_ratio)
        if draft_s > 0 and "draft" in spent:
            self.draft_ratio.append(spent["draft"] / draft_s)
            self.draft_scale = statistics.median(self.draft_ratio)
        self.other.append(spent.get("other", 0.0))
        self.other_s = statistics.median(self.other)

    def add_gains(self, gains: list[float], path: list[int]) -> None:
        """A tree round's nodes: ``gains[i]`` node i+1's gain (its path probability under the draft), ``path`` the
        nodes the walk accepted. :attr:`gain_ratios` then reads, per class b (gains in [2^-(b+1), 2^-b), the smaller
        ones in the last), (accepted + 1) / (summed gains + 1) (one pseudo-node accepted as expected: a class
        seen little keeps ~1, and none reaches 0), made non-increasing in b by pooling adjacent violators (the
        isotonic fit weighted by the gains: a smaller class never counts more than a larger, so larger gains
        stay larger)."""
        accepted, classes = set(path), len(self.gain_sums)
        for i, g in enumerate(gains, 1):
            b = gain_class(g, classes)
            self.gain_sums[b] += g
            self.gain_hits[b] += i in accepted
        if sum(self.gain_sums) > self.GAIN_MEMORY:
            self.gain_sums[:] = [x / 2 for x in self.gain_sums]
            self.gain_hits[:] = [x / 2 for x in self.gain_hits]
        self._ratios = None

    @property
    def gain_ratios(self) -> tuple[float, ...]:
        """Per class of gain: accepted over expected, smoothed and non-increasing (:meth:`add_gains`), refitted
        when read after new rounds."""
        if self._ratios is not None:
            return self._ratios
        blocks: list[list[float]] = []  # [accepted + 1, gains + 1, classes] per run of pooled classes
        for h, g in zip(self.gain_hits, self.gain_sums):
            blocks.append([h + 1.0, g + 1.0, 1])
            # pool adjacent violators: a smaller class above a larger one is pooled with it (its ratio the pool's
            # accepted over expected); a running minimum instead let one class with no hits in a handful of nodes
            # cap every smaller class at its ratio
            while len(blocks) > 1 and blocks[-1][0] / blocks[-1][1] > blocks[-2][0] / blocks[-2][1]:
                hits, gains, n = blocks.pop()
                blocks[-1] = [blocks[-1][0] + hits, blocks[-1][1] + gains, blocks[-1][2] + n]
        self._ratios = tuple(h / g for h, g, n in blocks for _ in range(n))
        return self._ratios

    def round_s(self, draft_s: float, verify_s: float, other_s: float = 0.0) -> float:
        """A round's price from its modelled drafting, verify and other seconds (the last replaced by the observed
        once a round is)."""
        return draft_s * self.draft_scale + verify_s * self.verify_scale + (self.other_s if self.other else other_s)

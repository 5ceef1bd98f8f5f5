"""How an acceptance predictor is built (:class:`AcceptanceSettings`): its settings, checked once, and part of its
artifact's key (:mod:`lit_domino.training.acceptance` builds it; its round collection reads them too)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from lit_domino.decoding.acceptance import INPUTS, LABELS

ANCHORS = ("decode", "even")
"""Where :func:`collect_rounds` starts its rounds (:attr:`AcceptanceSettings.anchors`)."""
HEAD_ROWS = ("reached", "all")
"""Which rows of the collected rounds the add-on head trains on (:attr:`AcceptanceSettings.head_rows`)."""


@dataclass(frozen=True)
class AcceptanceSettings:
    """How a predictor is built (its artifact's key, with the drafter's and the target's)."""

    label: str | None = None
    """Training label: ``soft`` c* = 1 - TV(q, p) (the acceptance probability when sampling) or ``hard`` (the
    draft's pick is the target's: acceptance at T = 0). None: ``hard`` for greedy collection (``temperature`` 0),
    else ``soft``. At T = 0 the soft label (taken at T = 1) predicts greedy acceptance far worse than the hard one
    (docs/results.md)."""
    calibration_label: str | None = None
    """What the calibration makes the survival match: ``hard`` acceptance events (decoding at T = 0) or ``soft``
    c* (sampling at the collection's temperature). None: as ``label``'s default."""
    inputs: str = "hidden"
    """What the add-on head reads besides H_j (:data:`~lit_domino.decoding.acceptance.INPUTS`): ``hidden`` the
    previous token's embedding, ``gru`` Domino's GRU state (a drafter without a causal state is refused),
    ``hidden+gru`` both."""
    own_head: bool = True
    """A drafter with a confidence head of its own (DSpark) uses it (only calibrated); False trains the add-on
    head on it too (for comparison)."""
    head_rows: str = "reached"
    """The rows the add-on head trains on: ``reached``, each round's positions whose drafts before them were accepted
    (weights ``Π_{i<j} y_i`` of the calibration label, the rows the calibration fits and a gate decides on: c_j is
    the acceptance probability *given* 1..j-1 accepted), or ``all`` (every position of every round, the default
    before 2026-12-04 night: most rows lie after a rejection, where H_j and the target both read a wrong prefix;
    ``reached`` scores a higher test AUC and a lower survival ECE: docs/results.md)."""
    offsets: bool = True
    """Calibrate with per-position offsets too (Platt scaling, :class:`Calibration`'s ``offsets``: the head reads
    no position, and a temperature cannot move a position's mean); False: the temperatures alone (DSpark's, the
    default before 2026-12-04 night). Offsets lower the survival ECE of the add-on heads (docs/results.md)."""
    stage_fit: bool = True
    """Also fit the stage-level maps DLoop's gates decide on (:attr:`~lit_domino.decoding.acceptance.Calibration.
    stage_whole`, P(every draft so far accepted | S) at stage boundaries, and :attr:`~lit_domino.decoding.acceptance.
    Calibration.stage_gain`, the drafts a further stage is expected to add given S) on the calibration split; needs
    ``stages`` >= 2. False: the gates read S and the mean confidences (before 2026-12-05: the cost gate then opened
    second stages that did not pay)."""
    survival_fit: bool = True
    """Also fit the per-position survival maps (:attr:`~lit_domino.decoding.acceptance.Calibration.survival_maps`:
    S_j as an isotonic map of the product of the calibrated c_1..c_j) on the calibration split, before the stage
    maps, which are then fitted on that S. False: S_j is the product (before 2026-12-05 noon; its errors add up, so
    the survival's ECE exceeds the c_j's)."""
    steps: int = 300
    """Full-batch Adam steps of the add-on head."""
    lr: float = 0.05
    """Adam learning rate of the head."""
    stages: int = 2
    """Stages drafted per collected round (positions 1..stages·K are calibrated; DLoop's later stages included)."""
    anchors_per_sequence: int = 8
    """Rounds collected per sequence (spread evenly over its generated part, or over its decode's rounds)."""
    anchors: str = "decode"
    """Where the collected rounds start: ``decode``, at the round starts of the drafter's own plain speculative decode
    of the sequence (each round starts after the previous one's accepted drafts and bonus; acceptance read off the
    target's greedy continuation), ``anchors_per_sequence`` of them evenly spaced; ``even``, at evenly spaced
    positions (before 2026-12-05). A decode's rounds start right after a rejection more often than an even anchor
    does: an even-anchor calibration overstates P(whole | S) on the decode's rounds, and a gate that read it opened
    stages that did not pay."""
    max_new_tokens: int = 96
    """Tokens of the target's own continuation of each prompt."""
    temperature: float = 0.0
    """Drafting temperature of the collected rounds (0: greedy picks; the soft label uses T = 1 then)."""
    pool_size: int | None = None
    """The drafter's decode candidate pool (Domino), as it decodes."""
    seed: int = 0

    def __post_init__(self):
        auto = "hard" if self.temperature <= 0 else "soft"
        for name in ("label", "calibration_label"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, auto)
        if self.anchors not in ANCHORS:
            raise ValueError(f"anchors must be one of {ANCHORS}, got {self.anchors!r}")
        if self.head_rows not in HEAD_ROWS:
            raise ValueError(f"head_rows must be one of {HEAD_ROWS}, got {self.head_rows!r}")
        if self.inputs not in INPUTS:
            raise ValueError(f"inputs must be one of {INPUTS}, got {self.inputs!r}")
        for name in ("label", "calibration_label"):
            if getattr(self, name) not in LABELS:
                raise ValueError(f"{name} must be one of {LABELS}, got {getattr(self, name)!r}")
        for name in ("steps", "stages", "anchors_per_sequence", "max_new_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be > 0, got {self.lr!r}")

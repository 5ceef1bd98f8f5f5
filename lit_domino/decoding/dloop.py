"""DLoop: the confidence-gated drafting loop (draft more stages before one verification).

After each drafting stage a gate decides whether to draft another stage anchored at the previous stage's
last draft token (at most ``max_stages`` stages); then everything drafted is verified in ONE target forward.
Verification is unchanged, so decoding stays lossless whatever the gate: every decision depends only on the
drafter's side of the round, and each decision about position j uses only the tokens before j (DSpark's
paper, appendix A: a draft dropped *because of its own value* would bias the proposal away from q).

The papers' gates (:data:`GATES`); each confidence is a log-probability of the drafter's own K tokens
``log q(d_1) .. log q(d_K)``, so it is never positive:

* ``sum`` (the papers' reference): ``sum_k log q(d_k) >= g``;
* ``mean``: the per-token mean ``(1/K) sum_k log q(d_k) >= g``;
* ``scaled``: the papers' g quoted for their 15-token stages (B = 16) rescaled to this stage's
  length: ``sum_k log q(d_k) >= g * K / 15``;
* ``last``: the stage's last token only, ``log q(d_K) >= g`` (the token the next stage is anchored at).

The acceptance-predictor gates (:data:`PROBABILITY_GATES`; :mod:`lit_domino.decoding.acceptance` gives the
calibrated confidence c_j of each drafted position, the product of c_1..c_j the round's survival S_j, the
probability that the first j drafts are all accepted):

* ``conf``: draft another stage while the probability that all m drafts so far survive is >= p (``threshold``
  p in (0, 1]): S_m mapped by the calibration's stage map (:meth:`~lit_domino.decoding.acceptance.Calibration.
  whole_stage`; S_m itself for an uncalibrated predictor);
* ``cost``: draft another stage only when the expected tokens per second rise, from that probability, the drafts
  another stage is expected to have accepted (measured on held-out rounds) and a cost model measured on this
  machine (:mod:`lit_domino.decoding.cost_model`); no threshold.

``truncate`` p (any gate, also ``max_stages = 1``, DSpark's gate): end a stage at the first position j whose
survival S_j < p (drafts 1..j-1 kept; the first stage keeps at least one) and end the round there. c_j reads
the block's hidden state at j and the token before j, never d_j itself, so the cut is decided by the tokens
before it. The round logic lives in :mod:`lit_domino.decoding.gates`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only the annotations: parsing a spec (bench.py --dloop) must not import torch
    import torch

GATES = ("sum", "mean", "scaled", "last")
"""The papers' log-probability gates (threshold g <= 0)."""
PROBABILITY_GATES = ("conf", "cost")
"""The acceptance-predictor gates (a calibrated survival probability; need an acceptance predictor)."""
ALL_GATES = GATES + PROBABILITY_GATES
REFERENCE_STAGE_TOKENS = 15
"""The stage length the papers' thresholds were quoted for (B = 16): the ``scaled`` gate's reference."""
DEFAULT_THRESHOLDS = {"sum": -0.5, "mean": -0.5, "scaled": -0.5, "last": -0.5, "conf": 0.5, "cost": None}
"""``threshold=None`` means the gate's default: the papers' g = -0.5 for the log gates, p = 0.5 for ``conf``;
the ``cost`` gate has none."""


def _probability(name: str, p) -> None:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or math.isnan(p) or not 0.0 < p <= 1.0:
        raise ValueError(f"DLoopConfig.{name} is a survival probability and must be in (0, 1], got {p!r}")


@dataclass(frozen=True)
class DLoopConfig:
    """The loop's gate. Fields:

    ``threshold``: the log gates' g in ``[-inf, 0]`` (papers: -0.5, -0.75 for ``gate="sum"``); the ``conf``
    gate's survival probability p in (0, 1]; None for ``cost`` (None elsewhere: :data:`DEFAULT_THRESHOLDS`).
    ``max_stages``: the stage cap N >= 1 (1 = plain speculative decoding, round for round, unless truncating).
    ``gate``: one of :data:`ALL_GATES`.
    ``truncate``: None, or p in (0, 1]: end a stage at the first position whose calibrated survival < p.
    ``cost_model``: the ``cost`` gate's cost model: None = the cached one for this target, drafter, dtype and
    device, measured (and cached, printed) when there is none; ``"cached"`` = the cache only (an error when
    none was measured); else the path of a cost-model JSON (an error when it was measured elsewhere).

    ``threshold = -inf`` always drafts ``max_stages`` stages.
    """

    threshold: float | None = None
    max_stages: int = 3
    gate: str = "sum"
    truncate: float | None = None
    cost_model: str | None = None

    def __post_init__(self):
        if self.gate not in ALL_GATES:
            raise ValueError(f"DLoopConfig.gate must be one of {ALL_GATES}, got {self.gate!r}")
        if self.threshold is None:
            object.__setattr__(self, "threshold", DEFAULT_THRESHOLDS[self.gate])
        g = self.threshold
        if self.gate == "cost":
            if g is not None:
                raise ValueError(f"the cost gate takes no threshold (it drafts another stage when the expected "
                                 f"tokens per second rise), got threshold={g!r}")
        elif self.gate == "conf":
            _probability("threshold", g)
        else:
            if isinstance(g, bool) or not isinstance(g, (int, float)) or math.isnan(g):
                raise ValueError(f"DLoopConfig.threshold must be a number in [-inf, 0], got {g!r}")
            if g > 0:
                raise ValueError(
                    f"DLoopConfig.threshold={g} is positive: the {self.gate!r} gate's confidence is a log-probability, "
                    "which is never positive, so the loop could never run. Use a value in [-inf, 0] "
                    "(papers: -0.5, -0.75), or the conf gate for a probability (conf@p).")
        if self.truncate is not None:
            _probability("truncate", self.truncate)
        n = self.max_stages
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"DLoopConfig.max_stages must be an integer >= 1 (1 = no loop), got {n!r}")
        if self.cost_model is not None and (not isinstance(self.cost_model, str) or not self.cost_model.strip()):
            raise ValueError(f"DLoopConfig.cost_model must be None, 'cached' or a path, got {self.cost_model!r}")

    @property
    def needs_predictor(self) -> bool:
        """Whether the gate reads the drafter's acceptance predictor (``conf``, ``cost``, truncation)."""
        return self.gate in PROBABILITY_GATES or self.truncate is not None

    def confidence(self, logprobs: torch.Tensor) -> float:
        """The log gate's confidence of one stage from its ``[K]`` draft log-probabilities, on the threshold's scale
        (``scaled`` returns ``sum * 15 / K``, so that it compares with g like the papers' sum at K = 15)."""
        if self.gate not in GATES:
            raise ValueError(f"the {self.gate!r} gate's confidence is the acceptance predictor's survival "
                             "(lit_domino.decoding.gates), not a log-probability")
        lp = logprobs.reshape(-1)
        if self.gate == "last":
            return float(lp[-1])
        total = float(lp.sum())
        k = lp.numel()
        return {"sum": total, "mean": total / k, "scaled": total * REFERENCE_STAGE_TOKENS / k}[self.gate]

    def should_continue(self, stages_done: int, confidence: float) -> bool:
        """Draft another stage? ``confidence`` is the last stage's :meth:`confidence` (log gates) or the round's
        survival so far (``conf``)."""
        if self.gate == "cost":
            raise ValueError("the cost gate decides from a cost model (lit_domino.decoding.gates.RoundPolicy)")
        return stages_done < self.max_stages and confidence >= self.threshold

    @classmethod
    def parse(cls, spec: str | None) -> DLoopConfig | None:
        """``"off"``/``None`` → None; ``"-0.5:3"`` → threshold -0.5, 3 stages (the ``sum`` gate); ``"-0.5"`` →
        default stages; ``"mean@-0.1:3"`` → the ``mean`` gate (any of :data:`GATES` before ``@``);
        ``"conf@0.6:3"`` → the ``conf`` gate at p = 0.6; ``"cost:4"`` / ``"cost"`` → the ``cost`` gate;
        a ``+trunc@P`` suffix adds stage truncation at P (``"conf@0.6:3+trunc@0.3"``); ``"trunc@0.3"`` alone
        is truncation without a loop (one stage)."""
        if spec is None or str(spec).strip().lower() in ("", "off", "none", "false"):
            return None
        text = str(spec).strip()
        try:
            main, plus, suffix = text.partition("+")
            truncate = None
            if plus:
                name, at, p = suffix.partition("@")
                if name.strip() != "trunc" or not at:
                    raise ValueError(f"unknown suffix {suffix!r}")
                truncate = float(p)
            gate, at, rest = main.partition("@")
            if gate.strip() == "trunc" and at and not plus:  # truncation alone: DSpark's gate, no loop
                return cls(max_stages=1, truncate=float(rest))
            if not at:
                head, _, n = main.partition(":")
                if head.strip() == "cost":
                    return cls(gate="cost", max_stages=int(n) if n else cls.max_stages, truncate=truncate)
                gate, rest = "sum", main
            g, _, n = rest.partition(":")
            return cls(threshold=float(g), max_stages=int(n) if n else cls.max_stages, gate=gate.strip(),
                       truncate=truncate)
        except ValueError as err:
            if "DLoopConfig" in str(err) or "cost gate" in str(err):
                raise
            raise ValueError(f"cannot parse DLoop spec {spec!r}: expected 'off', '[GATE@]THRESHOLD[:MAX_STAGES]' "
                             "(e.g. '-0.5:3', 'mean@-0.1:3', 'conf@0.6:3'), 'cost[:MAX_STAGES]' or 'trunc@P', "
                             "optionally followed by '+trunc@P'") from err

    def label(self) -> str:
        if self.gate == "cost":
            core = f"cost:{self.max_stages}"
        else:
            core = f"{self.threshold:g}:{self.max_stages}"
            core = core if self.gate == "sum" else f"{self.gate}@{core}"
        if self.truncate is None:
            return core
        if self.max_stages == 1 and self.gate == "sum" and self.threshold == DEFAULT_THRESHOLDS["sum"]:
            return f"trunc@{self.truncate:g}"
        return f"{core}+trunc@{self.truncate:g}"


def dloop_label(dloop: DLoopConfig | None) -> str:
    return "off" if dloop is None else dloop.label()


# --------------------------------------------------------------------------- the DLoop study's grid (torch-free checks)


def parse_list(text, cast=float) -> list:
    """``"-0.25,-0.5"`` → ``[-0.25, -0.5]`` (lists pass through)."""
    if text is None:
        return None
    if isinstance(text, (list, tuple)):
        return [cast(x) for x in text]
    try:
        return [cast(x) for x in str(text).split(",") if x.strip()]
    except ValueError as err:
        raise ValueError(f"cannot parse {text!r} as a comma-separated list of {cast.__name__}s") from err


def check_grid(thresholds: list[float], stages: list[int]) -> None:
    """Every threshold must be a valid DLoop gate (g <= 0) and every cap N >= 1 (``DLoopConfig``'s rules)."""
    if not thresholds or not stages:
        raise ValueError("the grid needs at least one threshold and one stage count")
    for g in thresholds:
        DLoopConfig(threshold=g, max_stages=2)  # raises for g > 0 / NaN with the reason
    for n in stages:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"stage counts N must be integers >= 1 (1 = no loop), got {n!r}")


def check_table_gate(threshold: float | None, max_stages: int, gate: str = "sum", truncate: float | None = None) -> None:
    """The DLoop table's gate: a valid gate (``DLoopConfig``'s rules) with a loop (N >= 2)."""
    DLoopConfig(threshold=threshold, max_stages=max_stages, gate=gate, truncate=truncate)
    if max_stages < 2:
        raise ValueError("the DLoop table's gate needs max_stages >= 2 (1 is no loop)")

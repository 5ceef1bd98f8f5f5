"""DLoop: the confidence-gated drafting loop (draft more stages before one verification).

After each drafting stage the engine computes the stage's confidence from the log-probabilities
``log q(d_1) .. log q(d_K)`` the drafter gave its own K tokens. While the confidence is ``>= threshold``
and fewer than ``max_stages`` stages were drafted, it drafts another stage anchored at the previous
stage's last draft token; then everything drafted is verified in ONE target forward. Verification is
unchanged, so decoding stays lossless whatever the gate.

Gates (``DLoopConfig.gate``); each confidence is a log-probability, so it is never positive:

* ``sum`` (the papers' reference): ``sum_k log q(d_k) >= g``;
* ``mean``: the per-token mean ``(1/K) sum_k log q(d_k) >= g``;
* ``scaled``: the papers' g quoted for their 15-token stages (B = 16) rescaled to this stage's
  length: ``sum_k log q(d_k) >= g * K / 15``;
* ``last``: the stage's last token only, ``log q(d_K) >= g`` (the token the next stage is anchored at).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only the annotations: parsing a spec (bench.py --dloop) must not import torch
    import torch

GATES = ("sum", "mean", "scaled", "last")
REFERENCE_STAGE_TOKENS = 15
"""The stage length the papers' thresholds were quoted for (B = 16): the ``scaled`` gate's reference."""


@dataclass(frozen=True)
class DLoopConfig:
    """``threshold`` g in ``[-inf, 0]`` (papers: -0.5, -0.75 for ``gate="sum"``), the stage cap ``max_stages``
    N >= 1, and ``gate``, the confidence the threshold applies to (one of :data:`GATES`).

    ``threshold = -inf`` always drafts ``max_stages`` stages; ``max_stages = 1`` is plain
    speculative decoding (identical round for round).
    """

    threshold: float = -0.5
    max_stages: int = 3
    gate: str = "sum"

    def __post_init__(self):
        g = self.threshold
        if isinstance(g, bool) or not isinstance(g, (int, float)) or math.isnan(g):
            raise ValueError(f"DLoopConfig.threshold must be a number in [-inf, 0], got {g!r}")
        if self.gate not in GATES:
            raise ValueError(f"DLoopConfig.gate must be one of {GATES}, got {self.gate!r}")
        if g > 0:
            raise ValueError(
                f"DLoopConfig.threshold={g} is positive: the {self.gate!r} gate's confidence is a log-probability, "
                "which is never positive, so the loop could never run. Use a value in [-inf, 0] "
                "(papers: -0.5, -0.75)."
            )
        n = self.max_stages
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"DLoopConfig.max_stages must be an integer >= 1 (1 = no loop), got {n!r}")

    def confidence(self, logprobs: torch.Tensor) -> float:
        """The gate's confidence of one stage from its ``[K]`` draft log-probabilities, on the threshold's scale
        (``scaled`` returns ``sum * 15 / K``, so that it compares with g like the papers' sum at K = 15)."""
        lp = logprobs.reshape(-1)
        if self.gate == "last":
            return float(lp[-1])
        total = float(lp.sum())
        k = lp.numel()
        return {"sum": total, "mean": total / k, "scaled": total * REFERENCE_STAGE_TOKENS / k}[self.gate]

    def should_continue(self, stages_done: int, confidence: float) -> bool:
        """Draft another stage? ``confidence`` is the last stage's :meth:`confidence`."""
        return stages_done < self.max_stages and confidence >= self.threshold

    @classmethod
    def parse(cls, spec: str | None) -> DLoopConfig | None:
        """``"off"``/``None`` → None; ``"-0.5:3"`` → threshold -0.5, 3 stages (the ``sum`` gate); ``"-0.5"`` →
        default stages; ``"mean@-0.1:3"`` → the ``mean`` gate (any of :data:`GATES` before ``@``)."""
        if spec is None or str(spec).strip().lower() in ("", "off", "none", "false"):
            return None
        text = str(spec).strip()
        gate, at, rest = text.partition("@")
        if not at:
            gate, rest = "sum", text
        g, _, n = rest.partition(":")
        try:
            return cls(threshold=float(g), max_stages=int(n) if n else cls.max_stages, gate=gate.strip())
        except ValueError as err:
            if "DLoopConfig" in str(err):
                raise
            raise ValueError(f"cannot parse DLoop spec {spec!r}: expected 'off' or '[GATE@]THRESHOLD[:MAX_STAGES]', "
                             "e.g. '-0.5:3' or 'mean@-0.1:3'") from err

    def label(self) -> str:
        core = f"{self.threshold:g}:{self.max_stages}"
        return core if self.gate == "sum" else f"{self.gate}@{core}"


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


def check_table_gate(threshold: float, max_stages: int) -> None:
    """The DLoop table's gate: a valid gate with a loop (N >= 2)."""
    check_grid([threshold], [max_stages])
    if max_stages < 2:
        raise ValueError("the DLoop table's gate needs max_stages >= 2 (1 is no loop)")

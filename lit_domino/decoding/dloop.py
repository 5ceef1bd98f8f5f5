"""DLoop: the confidence-gated drafting loop (draft more stages before one verification).

After each drafting stage the engine computes the stage's confidence
``c = sum_k log q(d_k)`` (the log-probability the drafter gave its own block). While
``c >= threshold`` and fewer than ``max_stages`` stages were drafted, it drafts another
stage anchored at the previous stage's last draft token; then everything drafted is
verified in ONE target forward. Verification is unchanged, so decoding stays lossless.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class DLoopConfig:
    """``threshold`` g in ``[-inf, 0]`` (papers: -0.5, -0.75) and the stage cap ``max_stages`` N >= 1.

    ``threshold = -inf`` always drafts ``max_stages`` stages; ``max_stages = 1`` is plain
    speculative decoding (identical round for round).
    """

    threshold: float = -0.5
    max_stages: int = 3

    def __post_init__(self):
        g = self.threshold
        if isinstance(g, bool) or not isinstance(g, (int, float)) or math.isnan(g):
            raise ValueError(f"DLoopConfig.threshold must be a number in [-inf, 0], got {g!r}")
        if g > 0:
            raise ValueError(
                f"DLoopConfig.threshold={g} is positive: a stage's confidence is a sum of log-probs, which is "
                "never positive, so the loop could never run. Use a value in [-inf, 0] (papers: -0.5, -0.75)."
            )
        n = self.max_stages
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"DLoopConfig.max_stages must be an integer >= 1 (1 = no loop), got {n!r}")

    def should_continue(self, stages_done: int, confidence: float) -> bool:
        """Draft another stage? ``confidence`` is the last stage's sum of draft log-probs."""
        return stages_done < self.max_stages and confidence >= self.threshold

    @classmethod
    def parse(cls, spec: str | None) -> DLoopConfig | None:
        """``"off"``/``None`` → None; ``"-0.5:3"`` → threshold -0.5, 3 stages; ``"-0.5"`` → default stages."""
        if spec is None or str(spec).strip().lower() in ("", "off", "none", "false"):
            return None
        text = str(spec).strip()
        g, _, n = text.partition(":")
        try:
            return cls(threshold=float(g), max_stages=int(n) if n else cls.max_stages)
        except ValueError as err:
            if "DLoopConfig" in str(err):
                raise
            raise ValueError(f"cannot parse DLoop spec {spec!r}: expected 'off' or 'THRESHOLD[:MAX_STAGES]', "
                             "e.g. '-0.5:3'") from err

    def label(self) -> str:
        return f"{self.threshold:g}:{self.max_stages}"


def dloop_label(dloop: DLoopConfig | None) -> str:
    return "off" if dloop is None else dloop.label()

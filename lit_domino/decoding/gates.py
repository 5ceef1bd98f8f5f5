"""One round's drafting under a DLoop gate: how many stages, and where a stage ends.

:class:`RoundPolicy` drafts the stages of one round for the engine (:func:`round_policy` builds it, with every
check, before decoding). Without DLoop it drafts one stage, exactly as plain speculative decoding. The papers'
log gates compare the last stage's confidence with g; the predictor gates read the calibrated acceptance
probabilities c_j of :mod:`lit_domino.decoding.acceptance`, whose running product S_j is the round's survival:

* ``conf``: another stage while S_m >= p;
* ``cost``: another stage while it raises the expected tokens per second
  ``(1 + Σ_j S_j) / round_time(stages, m + 1)``, the next stage's survivals forecast as
  ``S_m · Π mean_confidence`` (:class:`~lit_domino.decoding.cost_model.CostModel`);
* ``truncate`` p: keep a stage's drafts while S_j >= p (the first stage keeps at least one), then end the round.

Each decision reads the drafter's side of the round only (its drafts and hidden states, never the target's),
and a cut at position j reads c_1..c_j, which see the tokens before j only: the verify step's rejection
sampling keeps its exact output distribution whatever the policy drafts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lit_domino.decoding.acceptance import AcceptancePredictor, require_predictor
from lit_domino.decoding.cost_model import CostModel, resolve
from lit_domino.decoding.dloop import DLoopConfig
from lit_domino.models.sessions import StageDraft


def truncated(stage: StageDraft, n: int) -> StageDraft:
    """The stage's first ``n`` drafts (tokens, log q, q and logits cut alike)."""
    cut = (lambda t: None if t is None else t[:n])
    logprobs = stage._logprobs if isinstance(stage, StageDraft) else getattr(stage, "logprobs", None)
    return StageDraft(stage.tokens[:n], cut(logprobs), cut(stage.probs), cut(getattr(stage, "logits", None)))


@dataclass
class RoundPolicy:
    """Drafts one round's stages (see the module docstring); stateless between rounds."""

    dloop: DLoopConfig | None
    drafter: object = None
    predictor: AcceptancePredictor | None = None
    cost: CostModel | None = None
    _opens: dict = field(default_factory=dict, repr=False)
    """:meth:`_may_open`'s answers by (first stage's drafts, room after it)."""

    def draft(self, session, anchor: torch.Tensor, room, temperature: float, generator) -> list[StageDraft]:
        """The round's stages; ``room(m)`` = drafts the next stage may add after m drafts (0: none)."""
        if room(0) <= 0:
            return []
        dl = self.dloop
        stages = [session.draft(anchor, room(0), temperature, generator)]
        if dl is None:
            return stages
        k0 = stages[0].tokens.numel()
        if dl.gate == "cost" and dl.truncate is None and not self._may_open(k0, room(k0)):
            return stages  # the cost gate cannot open this round whatever the predictor says: plain, at its cost
        survival, expected, m, stage_anchor = 1.0, 1.0, 0, anchor
        while True:
            st = stages[-1]
            k = st.tokens.numel()
            if self.predictor is not None:
                c = self.predictor.confidences(self.drafter, session.stages[-1].hidden, stage_anchor, st.tokens, m)
                S = survival * torch.cumprod(c, 0)  # [k] the round's survival at each of the stage's positions
                if dl.truncate is not None:
                    keep = int((S >= dl.truncate).sum())  # S is non-increasing: the positions before the cut
                    if len(stages) == 1:
                        keep = max(keep, 1)
                    if keep < k:
                        if keep:
                            stages[-1] = truncated(st, keep)
                        else:
                            stages.pop()
                        return stages
                survival = float(S[-1])
                expected += float(S.sum())
            m += k
            if len(stages) >= dl.max_stages or room(m) <= 0 or not self._another(st, len(stages), survival,
                                                                                  expected, m, room(m)):
                return stages
            stage_anchor = st.tokens[-1:]
            stages.append(session.draft(stage_anchor, room(m), temperature, generator))

    def _may_open(self, k: int, room: int) -> bool:
        """Whether the ``cost`` gate can open after a first stage of ``k`` drafts for any survival. With
        S = S_k <= 1, E = 1 + Σ_j S_j >= 1 + k·S and the forecast F = S·A, another stage pays iff
        F / R_2 > E / R_1, i.e. S·A·R_1 > E·(R_2 - R_1); linear in S, that fails for every S in [0, 1] exactly
        when A·R_1 <= (1 + k)·(R_2 - R_1) (S = 1; S = 0 never opens). Checked once per (k, room), so a cost gate
        that never pays costs no predictor call (measured before: ~0.1 ms a round, 2-7 % on the default target)."""
        if room <= 0:
            return False
        key = (k, room)
        if key not in self._opens:
            cal = self.predictor.calibration
            A = float(torch.cumprod(cal.at(cal.mean_confidence, k, room), 0).sum())
            r1, r2 = self.cost.round_time(1, k + 1), self.cost.round_time(2, k + room + 1)
            self._opens[key] = A * r1 > (1 + k) * (r2 - r1)
        return self._opens[key]

    def _another(self, st: StageDraft, done: int, survival: float, expected: float, m: int, room: int) -> bool:
        dl = self.dloop
        if dl.gate == "conf":
            return dl.should_continue(done, survival)
        if dl.gate == "cost":
            cal = self.predictor.calibration
            forecast = survival * torch.cumprod(cal.at(cal.mean_confidence, m, room), 0)
            now = expected / self.cost.round_time(done, m + 1)
            more = (expected + float(forecast.sum())) / self.cost.round_time(done + 1, m + room + 1)
            return more > now
        return dl.should_continue(done, dl.confidence(st.logprobs))


def round_policy(dloop: DLoopConfig | None, target, drafter, block_size: int) -> RoundPolicy:
    """The policy of ``dloop`` for ``drafter`` on ``target``: the acceptance predictor a predictor gate needs
    (:class:`~lit_domino.decoding.acceptance.NoAcceptancePredictor` when the drafter has none) and the cost gate's
    cost model (:func:`~lit_domino.decoding.cost_model.resolve`: cached, or measured here), before decoding."""
    if dloop is None or drafter is None or not dloop.needs_predictor:
        return RoundPolicy(dloop, drafter)
    why = f"the DLoop gate {dloop.label()!r}"
    predictor = require_predictor(drafter, why, calibrated=dloop.gate == "cost")
    cost = None
    if dloop.gate == "cost":
        cost = resolve(target, drafter, block_size, dloop.cost_model, max_stages=max(dloop.max_stages, 2))
    return RoundPolicy(dloop, drafter, predictor, cost)

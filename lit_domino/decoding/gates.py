"""One round's drafting under a DLoop gate: how many stages, and where a stage ends.

:class:`RoundPolicy` drafts the stages of one DLoop round for the chain proposer (:func:`round_policy` builds it,
with every check, before decoding); a round without DLoop drafts one stage and never touches a gate. Each gate is
an object with its own named state and one decision, "draft another stage?" (:class:`LogGate`, :class:`ConfGate`,
:class:`CostGate`); truncation (:class:`Truncation`) decides where a stage ends. The papers'
log gates compare the last stage's confidence with g; the predictor gates read the calibrated acceptance
probabilities c_j of :mod:`lit_domino.decoding.acceptance`, whose running product, through the calibration's
survival maps, is the round's survival S_j, and the calibration's stage-level maps of it
(:class:`~lit_domino.decoding.acceptance.Calibration`: P(whole | S), the probability that every draft so far is
accepted, and G(S), the drafts another stage is expected to have accepted, both measured on held-out rounds; what a
stage boundary decides on):

* ``conf``: another stage while P(whole | S_m) >= p;
* ``cost``: another stage when what it is expected to add beats what its time would yield elsewhere:
  ``G(S_m) > ρ · (round_time(stages + 1, ..) - round_time(stages, ..))``, round_time the
  :class:`~lit_domino.decoding.cost_model.CostModel` measured on this machine (the predictor's own cost included)
  priced by what the sequence's rounds cost against it (:mod:`lit_domino.decoding.round_costs`), and ρ the
  sequence's tokens per second so far (committed tokens over its rounds' time as the decode's clock timed them, a
  plain round's modelled expectation as the prior). That is the
  rule that maximises tokens per second over the whole sequence (renewal-reward: an option pays when its marginal
  rate beats the long-run rate); raising *this round's* rate instead opened a stage whenever the round looked poor,
  which on the default drafters drafted many more stages than needed for no more accepted tokens. G is scaled
  by how the sequence's first stages have survived against P(whole | S) so far (``(hits + 1) / (Σ P + 1)``): the
  calibration pools the domains, and on the default drafters math and chat stages survived less often than it
  predicts. The gate prices its own read too: a read and the arithmetic on it are a measurable share of a round in
  the default preset's decodes (docs/results.md), paid even where no stage opens. A read earns what the stage it
  opens is modelled to add (``gain / ρ - extra time``, seconds; nothing when it opens none), and once a
  sequence's reads, after the first :attr:`CostGate.READ_GRACE`, have earned less than they cost (the cost
  model's ``read_s`` each), the gate reads only every :attr:`CostGate.PROBE_EVERY`-th round until one pays
  again: where the drafter's stages are rarely accepted whole (the default backbone on math opened no stage in
  282 rounds) the round is then plain;
* ``truncate`` p: keep a stage's drafts while S_j >= p (the first stage keeps at least one), then end the round.

Whatever the gate, no stage is drafted that could not emit a token: none after a stage that drafted an EOS (an
accepted EOS ends the sequence), and none once the round's drafts and its bonus cover the tokens still wanted (the
engine's ``room``). On the default preset's chat prompts 36 of 67 DSpark first stages drafted an EOS.

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
from lit_domino.decoding.round_costs import RoundCosts
from lit_domino.models.sessions import StageDraft


def truncated(stage: StageDraft, n: int) -> StageDraft:
    """The stage's first ``n`` drafts (tokens, log q, q and logits cut alike)."""
    cut = (lambda t: None if t is None else t[:n])
    logprobs = stage._logprobs if isinstance(stage, StageDraft) else getattr(stage, "logprobs", None)
    return StageDraft(stage.tokens[:n], cut(logprobs), cut(stage.probs), cut(getattr(stage, "logits", None)))


class Gate:
    """A DLoop gate: one decision, "draft another stage?", after each stage of a round. Its state is its own; the
    engine calls :meth:`begin` before a sequence and :meth:`observe` after each round."""

    def begin(self) -> None:
        """A new sequence."""

    def observe(self, accepted: int, stages: int, verified: int, spent: dict | None = None) -> None:
        """A round accepted ``accepted`` drafts (and emitted a bonus) from ``stages`` stages and a forward of
        ``verified`` tokens; ``spent``: its seconds per phase as the decode's clock timed them (None: unknown)."""

    def worth_reading(self, k: int, room: int) -> bool:
        """Whether this round's stages are read at all after a first stage of ``k`` drafts (False: the round is
        plain, one stage)."""
        return True

    def read(self, survival: float, k: int, first: bool) -> None:
        """The predictor was read (and the stage not truncated): a stage of ``k`` drafts (``first``: the round's
        first), the round's survival ``survival`` after it."""

    def another(self, stage: StageDraft, done: int, survival: float, m: int, room: int) -> bool:
        """Draft another stage of ``room`` drafts after ``done`` stages of ``m`` drafts, the last one ``stage``,
        whose survival is ``survival`` (the predictor gates)?"""
        raise NotImplementedError


@dataclass
class LogGate(Gate):
    """The papers' gates (``sum``, ``mean``, ``scaled``, ``last``): another stage while the last stage's confidence
    from its draft log-probabilities is >= g (:meth:`DLoopConfig.confidence`). No state."""

    dloop: DLoopConfig

    def another(self, stage, done, survival, m, room) -> bool:
        return self.dloop.should_continue(done, self.dloop.confidence(stage.logprobs))


def whole(predictor: AcceptancePredictor, survival: float) -> float:
    """P(every draft so far is accepted | their survival product): the calibration's stage map (S itself for an
    uncalibrated predictor)."""
    cal = predictor.calibration
    return survival if cal is None else cal.whole_stage(survival)


@dataclass
class ConfGate(Gate):
    """``conf`` p: another stage while P(whole | S_m) >= p. No state."""

    dloop: DLoopConfig
    predictor: AcceptancePredictor

    def another(self, stage, done, survival, m, room) -> bool:
        return self.dloop.should_continue(done, whole(self.predictor, survival))


@dataclass
class CostGate(Gate):
    """``cost``: another stage when what it is expected to add beats what its time would yield at the sequence's
    rate ρ (the module docstring). Its state: ρ's tokens and seconds, the trust record of the sequence's first
    stages, its reads' account, and what the sequence's rounds cost against the model (:attr:`costs`)."""

    dloop: DLoopConfig
    predictor: AcceptancePredictor
    cost: CostModel
    tokens: float = 0.0
    """ρ's numerator: tokens committed in the sequence (a plain round's prior included)."""
    seconds: float = 0.0
    """ρ's denominator: the seconds of the sequence's rounds as the clock timed them (modelled where it has not,
    and for the prior)."""
    predicted: float = 0.0
    """Σ P(whole | S) over the sequence's read first stages."""
    hits: float = 0.0
    """How many of those first stages the target accepted whole."""
    first: tuple | None = None
    """This round's first stage as the gate read it: (P(whole | S), its drafts); None when it was not read."""
    earned: float = 0.0
    """Modelled seconds the sequence's reads have earned (:meth:`reads_pay`)."""
    reads: int = 0
    """Reads of the predictor in the sequence."""
    since: int = 0
    """Rounds since the last read."""
    costs: RoundCosts = field(default_factory=RoundCosts)
    """What the sequence's rounds cost against :attr:`cost`'s model (:mod:`lit_domino.decoding.round_costs`): a
    round is priced by them (:meth:`round_time`)."""
    _gains: dict = field(default_factory=dict, repr=False)
    """:meth:`may_open`'s best case G(1) by (first stage's drafts, room after it)."""

    PRIOR_ROUNDS = 4
    """Plain rounds of the calibration's expected length that ρ starts from (and is pulled towards early on)."""
    READ_GRACE = 4
    """Reads of a sequence the gate makes before its reads must have earned what they cost."""
    PROBE_EVERY = 8
    """While its reads have not paid, the gate reads every this many rounds (a sequence's text can change: a prose
    answer that reaches a code block), the others plain."""

    def begin(self) -> None:
        """ρ restarts from the prior (a plain round's expected tokens over its modelled time)."""
        cal, K = self.predictor.calibration, self.cost.key.get("block_size", 0) - 1
        K = K if K > 0 else len(cal.mean_confidence)
        expected = 1.0 + float(torch.cumprod(cal.at(cal.mean_confidence, 0, K), 0).sum())
        self.tokens, self.seconds = self.PRIOR_ROUNDS * expected, self.PRIOR_ROUNDS * self.round_time(1, K + 1)
        self.predicted = self.hits = self.earned = 0.0
        self.first, self.reads, self.since, self.costs = None, 0, 0, RoundCosts()

    def observe(self, accepted: int, stages: int, verified: int, spent: dict | None = None) -> None:
        self.tokens += accepted + 1
        self.seconds += sum(spent.get(k, 0.0) for k in ("draft", "verify", "other")) if spent else \
            self.round_time(stages, verified)
        self.costs.add(spent, self.cost.verify(verified), self.cost.draft(stages))
        if self.first is not None:
            p, k = self.first
            self.predicted += p
            self.hits += float(accepted >= k)
            self.first = None

    @property
    def rate(self) -> float:
        """ρ: tokens per second of the sequence so far."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def trust(self) -> float:
        """How the sequence's first stages have survived against P(whole | S): (accepted whole + 1) / (Σ P + 1)."""
        return (self.hits + 1.0) / (self.predicted + 1.0)

    def worth_reading(self, k: int, room: int) -> bool:
        return self.may_open(k, room) and self.reads_pay()

    def read(self, survival: float, k: int, first: bool) -> None:
        self.reads += 1
        if first:
            self.first = (whole(self.predictor, survival), k)

    def may_open(self, k: int, room: int) -> bool:
        """Whether the gate can open after a first stage of ``k`` drafts for any survival: at best (the maps are
        non-decreasing: S = 1, scaled by a trust of at most ``room`` drafts) another stage adds G(1) drafts for its
        seconds, so when that is <= ρ · seconds no survival opens it and the round skips the predictor (a measurable
        share of a round on the default target; docs/results.md). G(1) is computed once per (k, room); ρ, the
        trust and the prices are the sequence's current ones."""
        if room <= 0:
            return False
        key = (k, room)
        if key not in self._gains:
            self._gains[key] = self.predictor.calibration.best_gain(k, room)
        return min(self._gains[key] * self.trust, room) > self.rate * self.extra_time(1, k, room)

    def reads_pay(self) -> bool:
        """Whether the gate reads the predictor this round: while its reads in the sequence, after the first
        :attr:`READ_GRACE`, have earned at least what they cost (the module docstring), else every
        :attr:`PROBE_EVERY`-th round. Decided on past rounds only."""
        if self.earned >= self.cost.read_s * (self.reads + 1 - self.READ_GRACE) or self.since + 1 >= self.PROBE_EVERY:
            self.since = 0
            return True
        self.since += 1
        return False

    def round_time(self, stages: int, verified: int) -> float:
        """Seconds of a round of ``stages`` stages and a verify of ``verified`` tokens: the model's
        (:meth:`CostModel.round_time`) priced by what the sequence's rounds cost (:attr:`costs`)."""
        return self.costs.round_s(self.cost.draft(stages), self.cost.verify(verified), self.cost.other_s)

    def extra_time(self, done: int, m: int, room: int) -> float:
        """Seconds (priced as :meth:`round_time`) another stage of ``room`` drafts adds to a round of ``done`` stages
        and ``m`` drafts."""
        return self.round_time(done + 1, m + room + 1) - self.round_time(done, m + 1)

    def another(self, stage, done, survival, m, room) -> bool:
        # the stage's expected drafts against what its time yields at the sequence's rate
        gain = min(self.predictor.calibration.next_gain(survival, m, room) * self.trust, room)
        rate, seconds = self.rate, self.extra_time(done, m, room)
        if gain <= rate * seconds:
            return False
        self.earned += gain / rate - seconds if rate > 0 else 0.0  # what the read earned: modelled seconds
        return True


@dataclass(frozen=True)
class Truncation:
    """``truncate`` p: keep a stage's drafts while the round's survival S_j >= p (the first stage keeps at least
    one), then end the round."""

    threshold: float

    def keep(self, survivals: list[float], first: bool) -> int:
        """Drafts the stage keeps (S is non-increasing: the positions before the cut)."""
        keep = sum(x >= self.threshold for x in survivals)
        return max(keep, 1) if first else keep


@dataclass
class RoundPolicy:
    """Drafts one DLoop round's stages (see the module docstring) under its :attr:`gate` and :attr:`truncation`; the
    survival a predictor gate reads is computed here, once per stage, for both."""

    dloop: DLoopConfig
    drafter: object = None
    predictor: AcceptancePredictor | None = None
    cost: CostModel | None = None
    eos: frozenset = frozenset()
    """The target's EOS ids: no stage is drafted after one that drafted an EOS (whatever the gate says)."""
    gate: Gate | None = None
    """The gate of ``dloop`` (built from it when None)."""
    truncation: Truncation | None = None
    """``dloop.truncate``'s cut (built from it)."""
    _read: object = field(default=None, repr=False)
    """The predictor's :meth:`~lit_domino.decoding.acceptance.AcceptancePredictor.survival_reader`, built at the
    first read of a decode (a policy lives for one ``generate`` call, while the drafter's weights stand still)."""

    def __post_init__(self):
        if self.gate is None:
            dl = self.dloop
            self.gate = (CostGate(dl, self.predictor, self.cost) if dl.gate == "cost" else
                         ConfGate(dl, self.predictor) if dl.gate == "conf" else LogGate(dl))
        if self.truncation is None and self.dloop.truncate is not None:
            self.truncation = Truncation(self.dloop.truncate)

    def begin(self) -> None:
        """A new sequence (the gate's state restarts)."""
        self.gate.begin()

    def observe(self, accepted: int, stages: int, verified: int, spent: dict | None = None) -> None:
        """The round's outcome, for the gate (:meth:`Gate.observe`)."""
        self.gate.observe(accepted, stages, verified, spent)

    def draft(self, session, anchor: torch.Tensor, room, temperature: float, generator) -> list[StageDraft]:
        """The round's stages; ``room(m)`` = drafts the next stage may add after m drafts (0: none)."""
        if room(0) <= 0:
            return []
        dl, gate, cut = self.dloop, self.gate, self.truncation
        stages = [session.draft(anchor, room(0), temperature, generator)]
        k0 = stages[0].tokens.numel()
        if cut is None and not gate.worth_reading(k0, room(k0)):
            return stages  # e.g. the cost gate cannot open this round, or its reads have not paid: plain
        product, survival, m, stage_anchor = 1.0, 1.0, 0, anchor
        while True:
            st = stages[-1]
            k = st.tokens.numel()
            if self.predictor is not None:
                if self._read is None:
                    self._read = self.predictor.survival_reader(self.drafter)
                R = self._read(session.stages[-1].hidden, stage_anchor, st.tokens, m, product)  # Π c at each position
                cal, product = self.predictor.calibration, R[-1]
                S = R if cal is None else cal.survivals(R, m, survival)  # the round's survival at each position
                if cut is not None:
                    keep = cut.keep(S, first=len(stages) == 1)
                    if keep < k:
                        if keep:
                            stages[-1] = truncated(st, keep)
                        else:
                            stages.pop()
                        return stages
                survival = S[-1]
                gate.read(survival, k, first=len(stages) == 1)
            m += k
            if len(stages) >= dl.max_stages or room(m) <= 0 or not gate.another(st, len(stages), survival, m,
                                                                                  room(m)):
                return stages
            if self.eos and not self.eos.isdisjoint(st.tokens.reshape(-1).tolist()):
                return stages  # nothing after a drafted EOS is ever emitted: accepted, it ends the sequence
            stage_anchor = st.tokens[-1:]
            stages.append(session.draft(stage_anchor, room(m), temperature, generator))


def round_policy(dloop: DLoopConfig | None, target, drafter, block_size: int,
                 predictor: AcceptancePredictor | None = None) -> RoundPolicy | None:
    """The policy of ``dloop`` for ``drafter`` on ``target`` (None without DLoop: a plain round has no gate): the
    acceptance predictor a predictor gate reads (``predictor``, else the drafter's own head's,
    :func:`~lit_domino.decoding.acceptance.require_predictor`; when there is none,
    :class:`~lit_domino.decoding.acceptance.NoAcceptancePredictor`) and the cost gate's cost model
    (:func:`~lit_domino.decoding.cost_model.resolve`: cached, or measured here with that predictor's read), before
    decoding. A gate that reads no predictor ignores ``predictor``."""
    if dloop is None or drafter is None:
        return None
    eos = frozenset(int(t) for t in (getattr(target, "eos_token_ids", None) or ()))
    if not dloop.needs_predictor:
        return RoundPolicy(dloop, drafter, eos=eos)
    why = f"the DLoop gate {dloop.label()!r}"
    predictor = require_predictor(drafter, predictor, why, calibrated=dloop.gate == "cost")
    cost = None
    if dloop.gate == "cost":
        cost = resolve(target, drafter, block_size, dloop.cost_model, max_stages=max(dloop.max_stages, 2),
                       predictor=predictor)
    return RoundPolicy(dloop, drafter, predictor, cost, eos)

"""Tree verification for block drafters: build a draft tree, verify it in one target forward, walk it, compact.

One round, with the committed sequence ending in the anchor x at position ``start`` (as in the chain engine):

1. build: a tree of n nodes below the anchor (node 0), each a drafted token at depth 1..K (position
   ``start + depth``), siblings distinct. Builders (:data:`BUILDERS`):

   * ``chain``: the drafter's own chain (its ``draft``), the tree with one node per depth; with budget B - 1 it is
     today's chain round, token for token;
   * ``ddtree``: best-first over the cumulative log-probability of the drafter's per-position marginals (the
     chain's logits: a backbone's are unconditioned, a head's follow its greedy picks), top-k per depth: the
     n most likely prefixes (DDTree);
   * ``path``: path-conditioned expansion, depth by depth over the whole frontier in one batch: each node's
     children come from the head run on that node's own path (Domino: one GRU state per node, DARTree; DSpark:
     the Markov head on each node's token, PCTree; DFlash 2: the selector's transition from each node's
     token over its position's candidates); each depth keeps the n best of parent × top-k candidates by
     cumulative log-probability, and the n best of all of them are the tree: the exact best-first tree under
     the path-conditioned scores. A child's log-probability is normalised over its parent's candidates, as the
     chain's q: with a candidate pool (``pool_size``, Domino and DSpark) the top-P tokens of its position's base
     logits, DFlash 2's selector's c, else the vocabulary (:class:`PathHead`);
   * ``eagle``: EAGLE-2's dynamic tree for the EAGLE-3 drafter: each depth expands the top-k nodes of the frontier
     by cumulative log-probability (one batched drafter step over them, a tree mask over the drafter's own
     context: each node sees the committed steps and its ancestors), then all candidates are reranked by
     cumulative log-probability and the best n kept (parents before children). ``path`` on EAGLE-3 is the same
     expansion with a frontier of n, the exact best-first tree.

   ``draw="sample"`` (T > 0) draws each node's children from the drafter's q = softmax(logits / T) without
   replacement instead of taking its top-k; the tree's shape is then chosen on the rank-ordered probabilities of
   q (what the top-k children would score), never on a drawn token's own score, so that whether a child is in
   the tree does not depend on which token it drew: what the multi-draft rule needs.

2. verify: ONE target forward over ``[x, nodes]`` with a 4-D additive mask (each node sees the committed
   context, its ancestors and itself) and positions ``start + depth``.
3. walk from the root: at T = 0 follow the target's argmax while it is a child; at T > 0 the target samples a
   token at every node and the walk follows the sample while it is a child. The first miss is the bonus. Every
   committed token is the target's own pick or sample given its committed prefix, and the tree does not depend
   on the target's draws, so the output is exactly the target's at any temperature.
   ``acceptance="multidraft"`` (SpecTr / Sequoia, without replacement): at a node with target p and draft q, its
   children x_1, x_2, .. (in draw order) are tried in turn: x accepted with probability min(1, p(x) / q(x)),
   else p <- norm(max(p - q, 0)) and q <- q without x, renormalised; no child accepted: the bonus is drawn from
   the residual p. Exact when the children were drawn from q without replacement (``draw="sample"``).
4. compact: the accepted nodes' K/V move to slots ``start+1 .. start+acc`` (:func:`lit_domino.decoding.kv.
   compact_cache`), the cache is cropped to ``start+acc+1``, and the drafter's session is cropped to ``start`` and
   extended with the anchor and the accepted path with their target features.

``budget`` caps n (nodes beyond the anchor); ``cost`` (:class:`lit_domino.decoding.cost.VerifyCost`) makes it
cost-aware: each round verifies the best-first prefix CaDDTree's rule picks of the tree it grew. The rule prices a
round by what the earlier rounds cost (:class:`~lit_domino.decoding.round_costs.RoundCosts`): the curve scaled by
the verifies observed against it, plus the rounds' observed rollback and the session's extend, beside this
round's own drafting time; it counts the draft's gains as calibrated by what the target accepted of nodes of
their size; and once a throughput λ (tokens per second of the recent rounds) is known it verifies the n that
maximises ``E(n) - λ C(n)`` rather than the round's own ``E(n) / C(n)``. A round grows its tree to what the rule
chose in the recent rounds, with room to spare (:meth:`TreeProposer.grown`), not to the budget: growing nodes the
rule then cuts costs drafting time (a path tree's head runs over every frontier node) and buys nothing. The
rounds observed are those of every decode so far of the same drafter, target and setting (:func:`observed`).
"""

from __future__ import annotations

import math
import statistics
import time
import weakref
from collections import deque
from dataclasses import dataclass, field, replace

import torch

from lit_domino.decoding.round import Proposal, Verdict
from lit_domino.decoding.round_costs import RoundCosts
# The tree's settings, builders and walks live in their own modules; their names stay importable from here.
from lit_domino.decoding.tree_build import (PathHead, best_first, build_dloop_tree, build_tree,  # noqa: F401
                                            tree_from_stage)
from lit_domino.decoding.tree_config import (ACCEPTANCE, BUILDERS, DRAWS, SUPPORTED_ATTENTION, DraftTree,  # noqa: F401
                                             TreeConfig, TreeError, check_tree)
from lit_domino.decoding.tree_walk import chain_first, tree_inputs, walk, walk_multidraft  # noqa: F401


@dataclass
class Observed:
    """What a cost-aware tree's rounds observed, kept across the decodes of one drafter, target and setting
    (:func:`observed`): a decode's rounds alone are too few to calibrate its gains by size class (a chat turn is a
    decode of 10-50 rounds), and a decode starting afresh drafted its first rounds on the draft's raw gains, its
    first trees grown to the chain's size."""

    costs: RoundCosts = field(default_factory=RoundCosts)
    """The round costs and gain counts (:class:`~lit_domino.decoding.round_costs.RoundCosts`)."""
    choices: deque = field(default_factory=lambda: deque(maxlen=TreeProposer.CHOICES))
    """The rule's recent choices (:meth:`TreeProposer.grown`)."""


_OBSERVED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # drafter -> target model -> {setting: Observed}


def observed(drafter, target, cfg: TreeConfig, temperature: float, dloop=None) -> Observed:
    """The observations a cost-aware tree of ``cfg`` on ``drafter`` and ``target`` at ``temperature`` (and DLoop
    setting) reads and adds to, kept for the process while the drafter and the target live, as the verify-cost
    curve is kept per target (:func:`~lit_domino.decoding.cost.measure_verify_cost`). They choose how many nodes a
    round verifies, never what the target accepts: decoding stays exact."""
    per_target = _OBSERVED.setdefault(drafter, weakref.WeakKeyDictionary()).setdefault(target.model, {})
    return per_target.setdefault((cfg, float(temperature), repr(dloop)), Observed())


def forget_observed() -> None:
    """Drop every drafter's observations (:func:`observed`): the next cost-aware decodes start afresh."""
    _OBSERVED.clear()


class TreeProposer:
    """Tree rounds for one sequence (``generate(..., tree=cfg)``; :func:`lit_domino.decoding.round.decode` runs
    them): each round's tree (:func:`build_tree`, DLoop: :func:`build_dloop_tree`) with its main chain first, its
    verify inputs (:func:`tree_inputs`) and its walk; the result gains ``accepted_ranks`` (the sibling rank of
    every accepted node)."""

    def __init__(self, cfg: TreeConfig, block_size: int, runner, limit: int | None, dtype: torch.dtype,
                 temperature: float, generator, dloop=None, memory: Observed | None = None):
        self.cfg, self.block_size, self.runner, self.limit, self.dtype = cfg, block_size, runner, limit, dtype
        self.temperature, self.generator, self.dloop = temperature, generator, dloop
        self.memory = memory  # a cost-aware tree's observations from earlier decodes (None: this decode's alone)
        self.spent = 0.0  # this round's own drafting seconds
        self.begin()

    NO_PRICE = (1.0, 0.0, (1.0,) * RoundCosts.GAIN_CLASSES, 0.0)
    """:meth:`_priced`'s price before any round: the measured curve as it is."""
    REPRICE = 4
    """Rounds between two pricings (:meth:`_priced`): the prices are medians over many rounds and move slowly, while
    building a priced config (two validated frozen dataclasses) every round was most of the rule's own cost
    (docs/results.md, 2026-12-07 (night))."""
    CHOICES = 8
    """Recent rounds whose choices :meth:`grown` reads."""
    ROOM = 1.25
    """How far past the recent rounds' median choice a cost-aware tree grows: near its choice the rule's rate is
    flat, so a node or two short of it costs little, while every node grown and cut costs drafting."""

    def begin(self) -> None:
        self.draft_s = None  # the proposer's own drafting time per round (an average), the cost rule's C_draft
        memory = self.memory or Observed()
        self.costs = memory.costs
        self.priced, self.price = self.cfg, self.NO_PRICE  # the config priced as in :meth:`_priced`, and its price
        # rounds observed, and how many had been when the config was last priced (the first round prices what
        # earlier decodes observed)
        self.rounds, self.priced_at = 0, -self.REPRICE
        self.choices = memory.choices  # the rule's recent choices (:meth:`grown`)
        self.growth = 0  # the nodes this round's tree is grown to (:meth:`grown`)

    def grown(self) -> int:
        """The nodes a cost-aware round grows its tree to: ``ROOM`` x the median of the rule's last ``CHOICES``
        choices, a choice that took the whole grown tree counted as twice it (the rule may have wanted more:
        the size doubles while most rounds take all), at most the budget; before any round, the chain's block
        (``block_size - 1``). Starting at the budget instead verified 64-node trees in every decode's first
        rounds, chosen on gains not calibrated yet."""
        chosen = statistics.median(self.choices) if self.choices else (self.block_size - 1) / self.ROOM
        return max(1, min(self.cfg.budget, math.ceil(self.ROOM * chosen)))

    def _priced(self) -> TreeConfig:
        """The config with the curve priced by the rounds so far: C_v(n) x the observed verify scale, plus what a
        round costs beyond its drafting and verify (the rollback, the session's extend: the clock's draft phase
        over the proposer's own drafting), the draft's gains calibrated by what the target accepted of them
        (:attr:`RoundCosts.gain_ratios`), and the decode's throughput λ (:attr:`RoundCosts.tokens_per_s`).
        Rounded (the scale and λ to two digits, the seconds to 10 µs, the ratios to 0.05) so a new curve is built
        only when the prices move; priced again every :attr:`REPRICE` rounds."""
        curve, costs = self.cfg.cost, self.costs
        if curve is None or self.rounds - self.priced_at < self.REPRICE:
            return self.priced
        self.priced_at = self.rounds
        scale = float(f"{costs.verify_scale:.2g}")  # relative: a curve in other units than seconds keeps a scale
        fixed = round(costs.other_s + max(costs.draft_scale - 1.0, 0.0) * (self.draft_s or 0.0), 5)
        ratios = tuple(max(round(r * 20) / 20, 0.05) for r in costs.gain_ratios)  # still non-increasing
        rate = float(f"{costs.tokens_per_s:.2g}")
        if (scale, fixed, ratios, rate) != self.price:
            self.price = (scale, fixed, ratios, rate)
            self.priced = replace(self.cfg, cost=replace(
                curve, scale=curve.scale * scale, extra_s=curve.extra_s * scale + fixed, rate=rate,
                gain_ratios=() if set(ratios) == {1.0} else ratios))
        return self.priced

    def draft(self, session, anchor: torch.Tensor, start: int, wanted: int) -> Proposal:
        cfg, dloop, capacity = self._priced(), self.dloop, self.runner.capacity
        room = capacity - 1 - start if self.limit is None else min(capacity, self.limit) - 1 - start
        # deeper nodes than the tokens still wanted (less the bonus) could never be emitted
        depth = min(self.block_size - 1, room, wanted - 1)
        self.growth = nodes = min(self.grown() if cfg.cost is not None else cfg.budget, room)
        t0 = time.perf_counter()
        if depth <= 0:
            tree = DraftTree()
        elif dloop is None or dloop.max_stages == 1:  # one stage: plain rounds, as in the chain engine
            tree = build_tree(cfg, session, anchor, depth, nodes, self.temperature, self.generator, self.draft_s, t0)
        else:  # the chain engine's DLoop stages (full stages: no cap by the tokens wanted), the last one a tree
            tree = build_dloop_tree(cfg, dloop, session, anchor, lambda m: min(self.block_size - 1, room - m),
                                    lambda m: min(cfg.budget, room - m), self.temperature, self.generator,
                                    self.draft_s, t0)
        tree = chain_first(tree)
        self.spent = spent = time.perf_counter() - t0
        self.draft_s = spent if self.draft_s is None else 0.8 * self.draft_s + 0.2 * spent
        kv_len = capacity if self.runner.static else start + len(tree) + 1
        ids, pos, mask = tree_inputs(tree, anchor, start, kv_len, self.dtype)
        return Proposal(ids, {"position_ids": pos, "attention_mask": mask}, tree)

    def accept(self, prop: Proposal, logits: torch.Tensor, temperature: float, generator) -> Verdict:
        walker = walk_multidraft if self.cfg.acceptance == "multidraft" else walk
        path, committed = walker(prop.drafts, logits, temperature, generator)
        return Verdict(len(path), committed, path)

    def observe(self, res, prop: Proposal, v: Verdict, spent: dict | None = None) -> None:
        tree = prop.drafts
        if self.cfg.cost is not None:  # what the round cost against the curve and the proposer's own timer
            self.rounds += 1
            self.costs.add(spent, self.cfg.cost.seconds_at(len(tree)), self.spent, len(v.committed))
            if tree.gains is not None:
                self.costs.add_gains(tree.gains, v.path)
                self.choices.append(len(tree) if len(tree) < self.growth else 2 * len(tree))
        res.accepted_ranks.extend(tree.ranks[i - 1] for i in v.path)
        res.stages_per_round.append(tree.stages if len(tree) else 0)
        res.drafted_per_round.append(len(tree))

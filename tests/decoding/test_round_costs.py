"""Rounds priced by what the decode's clock timed: the corrections (RoundCosts), the clock's per-round seconds, and a
cost-aware tree's curve priced by its rounds."""

from __future__ import annotations

import time

import pytest
import torch

from lit_domino.decoding import generate
from lit_domino.decoding import round_costs
from lit_domino.decoding.cost import VerifyCost
from lit_domino.decoding.round import Clock, Proposal, Verdict
from lit_domino.decoding.round_costs import RoundCosts
from lit_domino.decoding.tree import TreeProposer
from lit_domino.decoding.tree_config import DraftTree, TreeConfig
from lit_domino.models import build_drafter, drafter_config
from lit_domino.testing import lively_target


def test_prices_are_the_medians_of_the_observed_against_the_modelled():
    costs = RoundCosts()
    assert (costs.verify_scale, costs.draft_scale, costs.other_s) == (1.0, 1.0, 0.0)  # nothing observed: the model
    assert costs.round_s(2.0, 3.0, 0.5) == 5.5
    for verify in (1.2, 1.3, 1.25, 9.0):  # one load spike among four rounds moves no median past its neighbours
        costs.add({"draft": 2.0, "verify": verify, "other": 0.1}, verify_s=1.0, draft_s=4.0)
    assert costs.verify_scale == pytest.approx((1.25 + 1.3) / 2)
    assert costs.draft_scale == 0.5 and costs.other_s == pytest.approx(0.1)
    assert costs.round_s(2.0, 3.0, 0.5) == pytest.approx(2.0 * 0.5 + 3.0 * 1.275 + 0.1)  # the observed other
    costs.add(None, 1.0, 1.0)  # a round not timed yet (CUDA): nothing recorded
    assert len(costs.verify_ratio) == 4
    for _ in range(RoundCosts.WINDOW):  # the window follows a machine that got slower
        costs.add({"draft": 8.0, "verify": 2.0, "other": 0.2}, verify_s=1.0, draft_s=4.0)
    assert (costs.verify_scale, costs.draft_scale, costs.other_s) == (2.0, 2.0, 0.2)


def test_the_clock_hands_out_each_rounds_seconds_once():
    clock = Clock(torch.device("cpu"))
    time.sleep(0.002)
    clock.lap("draft")
    time.sleep(0.004)
    clock.lap("verify")
    first = clock.round()
    assert set(first) == {"draft", "verify"} and min(first.values()) > 0
    clock.lap("other")
    second = clock.round()
    assert set(second) == {"other"} and clock.round() == {}
    totals = clock.totals()  # the totals are every lap's, handed out or not
    assert totals["draft"] == first["draft"] and totals["other"] == second["other"]


def test_a_cost_aware_tree_prices_its_curve_by_its_rounds():
    curve = VerifyCost((1, 8, 64), (1e-3, 2e-3, 8e-3))
    proposer = TreeProposer(TreeConfig("ddtree", budget=64, cost=curve), 8, None, None, torch.float32, 0.0, None)
    proposer.begin()
    assert proposer._priced().cost is curve  # no round yet: the measured curve
    tree = DraftTree([1] * 8, list(range(8)), list(range(1, 9)), [0] * 8)
    proposer.draft_s = proposer.spent = 1e-3  # the proposer's own timer of its drafting
    for _ in range(3):  # verifies at 1.5x the curve, the clock's draft phase 0.5 ms over the proposer's own drafting
        proposer.observe(_Result(), Proposal(torch.zeros(9, dtype=torch.long), drafts=tree), Verdict(0, [1], []),
                         {"draft": 1.5e-3, "verify": 3e-3, "other": 2e-4})
    priced = proposer._priced().cost
    fixed = 2e-4 + 0.5 * 1e-3  # the rollback, and the extend beyond the proposer's drafting
    assert priced.seconds == pytest.approx(tuple(1.5 * s + fixed for s in curve.seconds))
    assert proposer._priced().cost is priced  # prices that did not move build no new curve
    plain = TreeProposer(TreeConfig("ddtree", budget=16), 8, None, None, torch.float32, 0.0, None)
    plain.observe(_Result(), Proposal(torch.zeros(9, dtype=torch.long), drafts=tree), Verdict(0, [1], []), {"verify": 1.0})
    assert plain._priced() is plain.cfg and not plain.costs.verify_ratio  # a fixed budget prices nothing


def test_a_cost_aware_decode_prices_every_round_it_timed(monkeypatch):
    """Inside ``generate`` every round of a cost-aware tree reaches its prices with the clock's seconds of it."""
    target = lively_target(64, max_positions=64)
    torch.manual_seed(0)
    drafter = build_drafter(drafter_config("backbone", target, block_size=4, num_layers=1), target)
    seen, real = [], round_costs.RoundCosts.add
    monkeypatch.setattr(round_costs.RoundCosts, "add", lambda self, spent, *a: seen.append(spent) or real(self, spent, *a))
    res = generate(target, drafter, torch.tensor([[3, 4, 5]]), max_new_tokens=12,
                   tree=TreeConfig("ddtree", budget=8, cost=VerifyCost((1, 8), (1e-3, 2e-3))))
    assert len(seen) == res.num_target_forwards - 1  # one per round (the prefill's forward is none)
    assert all(set(s) == {"draft", "verify", "other"} and min(s.values()) > 0 for s in seen), seen[:2]


class _Result:
    def __init__(self):
        self.accepted_ranks, self.stages_per_round, self.drafted_per_round = [], [], []

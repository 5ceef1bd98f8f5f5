"""Rounds priced by what the decode's clock timed: the corrections (RoundCosts), the clock's per-round seconds, and a
cost-aware tree's curve priced by its rounds."""

from __future__ import annotations

import gc
import time
import weakref

import pytest
import torch

from lit_domino.decoding import generate
from lit_domino.decoding import round_costs
from lit_domino.decoding import tree as tree_mod
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


def test_the_throughput_is_the_recent_rounds_tokens_over_their_seconds():
    costs = RoundCosts()
    assert costs.tokens_per_s == 0.0  # before any round: the rule reads its round rate instead
    costs.add({"draft": 1.0, "verify": 2.0, "other": 1.0}, 1.0, 1.0, tokens=2)
    costs.add({"draft": 1.0, "verify": 1.0}, 1.0, 1.0, tokens=6)
    costs.add({"draft": 5.0}, 1.0, 1.0)  # tokens not counted: no throughput sample
    assert costs.tokens_per_s == 8 / 6  # summed, not a mean of ratios: (2 + 6) / (4 + 2)
    for _ in range(RoundCosts.WINDOW):
        costs.add({"verify": 1.0}, 1.0, 1.0, tokens=3)
    assert costs.tokens_per_s == 3.0  # the window's rounds only


def test_gains_are_calibrated_by_what_the_target_accepted_of_their_size():
    costs = RoundCosts()
    assert costs.gain_ratios == (1.0,) * RoundCosts.GAIN_CLASSES  # nothing seen: the draft's own gains
    for _ in range(40):  # 40 rounds of two nodes: one of gain 0.8 (class 0) always accepted, one of 0.03 (class 5) never
        costs.add_gains([0.8, 0.03], [1])
    r = costs.gain_ratios
    assert r[0] == pytest.approx(41 / 33) and r[1:5] == (1.0,) * 4  # (accepted + 1) / (gains + 1); unseen: 1
    # class 5 alone, 1 / 2.2, is below the unseen classes 6 and 7 (1 each): the three pooled, (0 + 3) / (1.2 + 3)
    assert r[5:] == pytest.approx((3 / 4.2,) * 3)
    overconfident = RoundCosts()
    for _ in range(50):  # a smaller class accepted more than its gains say (class 1), a still smaller one never
        overconfident.add_gains([0.3, 0.02, 0.02], [1])
    ro = overconfident.gain_ratios
    assert list(ro) == sorted(ro, reverse=True) and ro[-1] > 0
    assert ro[:2] == pytest.approx((52 / 17,) * 2)  # class 1's 51 / 16 above class 0's 1: pooled
    assert ro[5] == pytest.approx(3 / 5) and ro[2:5] == (1.0,) * 3  # class 5's 1 / 3 pooled with 6 and 7
    edges = RoundCosts()  # classes are [2^-(b+1), 2^-b): 1/2 in class 0, 1/4 in class 1; 0 and tiny gains in the last
    edges.add_gains([2.0, 1.0, 0.5, 0.25, 0.0, 1e-12], [])
    assert edges.gain_sums[0] == 3.5 and edges.gain_sums[1] == 0.25 and edges.gain_sums[-1] == pytest.approx(1e-12)


def test_a_cost_aware_tree_grows_to_what_its_rule_chose_lately():
    curve = VerifyCost((1, 64), (1e-3, 2e-3))
    proposer = TreeProposer(TreeConfig("path", budget=64, cost=curve), 8, None, None, torch.float32, 0.0, None)
    assert proposer.grown() == 7  # before any round: the chain's block
    def round_of(n):  # a round that verified n nodes out of a tree grown to proposer.growth
        tree = DraftTree([1] * n, list(range(n)), list(range(1, n + 1)), [0] * n, gains=[0.5] * n)
        proposer.observe(_Result(), Proposal(torch.zeros(n + 1, dtype=torch.long), drafts=tree), Verdict(1, [1, 1], [1]),
                         {"draft": 1e-3, "verify": 1e-3, "other": 1e-4})
    proposer.growth = 7
    round_of(7)  # the rule took the whole tree: counted as 14, grown to 1.25 x 14
    assert proposer.grown() == 18
    proposer.growth = 18
    for n in (10, 12, 12, 9):
        round_of(n)
    assert proposer.grown() == 15  # 1.25 x the median of 14, 10, 12, 12, 9
    for _ in range(TreeProposer.CHOICES):
        proposer.growth = 64
        round_of(64)
    assert proposer.grown() == 64  # the budget caps it
    fixed = TreeProposer(TreeConfig("path", budget=32), 8, None, None, torch.float32, 0.0, None)
    assert fixed.grown() == 7 and not fixed.choices  # a fixed budget never reads it (draft grows to the budget)


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
    def rounds(n):  # verifies at 1.5x the curve, the clock's draft phase 0.5 ms over the proposer's own drafting
        for _ in range(n):
            proposer.observe(_Result(), Proposal(torch.zeros(9, dtype=torch.long), drafts=tree), Verdict(0, [1], []),
                             {"draft": 1.5e-3, "verify": 3e-3, "other": 2e-4})
    rounds(TreeProposer.REPRICE - 1)
    assert proposer._priced().cost is curve  # priced every REPRICE rounds
    rounds(1)
    priced = proposer._priced().cost
    fixed = 2e-4 + 0.5 * 1e-3  # the rollback, and the extend beyond the proposer's drafting
    assert priced.seconds == curve.seconds  # the measured times kept, priced by scale and extra seconds
    assert [priced.seconds_at(n) for n in (1, 8, 30, 64)] == pytest.approx(
        [1.5 * curve.seconds_at(n) + fixed for n in (1, 8, 30, 64)])
    assert priced.rate == 210.0  # a token per 4.7 ms round: 212.8 tokens/s, to two digits
    rounds(TreeProposer.REPRICE)
    assert proposer._priced().cost is priced  # prices that did not move build no new curve
    ranked = DraftTree([1] * 3, [0, 1, 0], [1, 2, 1], [0, 0, 1], gains=[0.9, 0.6, 0.03])
    for _ in range(30):  # nodes of small gain never accepted: the rule counts them less
        proposer.observe(_Result(), Proposal(torch.zeros(4, dtype=torch.long), drafts=ranked),
                         Verdict(2, [1, 1, 1], [1, 2]), {"draft": 1.5e-3, "verify": 3e-3, "other": 2e-4})
    ratios = proposer._priced().cost.gain_ratios
    # class 5: 1 / (0.03 x 30 + 1), pooled with the unseen 6 and 7: 3 / 3.9 = 0.77, to 0.05
    assert ratios[0] >= 1.0 and ratios[5:] == (0.75,) * 3 and ratios == proposer.price[2]
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


def test_a_cost_aware_tree_starts_each_decode_from_what_the_earlier_ones_observed(monkeypatch):
    """The observations outlive a decode (:func:`tree.observed`): kept per drafter, target, setting and temperature,
    the next decode's first round priced by them, dropped with the drafter."""
    target = lively_target(64, max_positions=64)
    torch.manual_seed(0)
    drafter = build_drafter(drafter_config("backbone", target, block_size=4, num_layers=1), target)
    cfg = TreeConfig("ddtree", budget=8, cost=VerifyCost((1, 8), (1e-3, 2e-3)))
    memory = tree_mod.observed(drafter, target, cfg, 0.0)
    assert memory is tree_mod.observed(drafter, target, cfg, 0.0)
    others = [tree_mod.observed(drafter, target, TreeConfig("ddtree", budget=16, cost=cfg.cost), 0.0),
              tree_mod.observed(drafter, target, cfg, 0.7), tree_mod.observed(drafter, lively_target(64), cfg, 0.0)]
    assert all(o is not memory for o in others) and len({id(o) for o in others}) == 3
    first = generate(target, drafter, torch.tensor([[3, 4, 5]]), max_new_tokens=12, tree=cfg)
    rounds = len(memory.costs.other)
    assert rounds == first.num_target_forwards - 1 and memory.choices  # the decode's rounds, kept
    priced = []
    real = TreeProposer._priced
    def spy(self):
        out = real(self)
        priced.append(out.cost.rate)
        return out
    monkeypatch.setattr(TreeProposer, "_priced", spy)
    second = generate(target, drafter, torch.tensor([[3, 4, 5]]), max_new_tokens=12, tree=cfg)
    assert second.tokens == first.tokens  # prices choose the nodes, never the tokens
    assert priced[0] > 0  # the second decode's first round priced at the first decode's throughput
    assert len(memory.costs.other) == min(rounds + second.num_target_forwards - 1, RoundCosts.WINDOW)
    ref = weakref.ref(drafter)
    del drafter
    gc.collect()
    assert ref() is None and not any(True for _ in tree_mod._OBSERVED.items())  # gone with its drafter
    fresh = TreeProposer(cfg, 4, None, None, torch.float32, 0.0, None)
    assert fresh.costs is not memory.costs and not fresh.choices  # no memory given: this decode's alone


def test_the_gain_counts_halve_past_their_memory():
    costs = RoundCosts()
    rounds = int(RoundCosts.GAIN_MEMORY / 0.8) + 2  # gains summing past the memory: every count halved once
    for _ in range(rounds):
        costs.add_gains([0.8], [1])
    assert RoundCosts.GAIN_MEMORY / 2 < sum(costs.gain_sums) <= RoundCosts.GAIN_MEMORY
    assert rounds / 2 < costs.gain_hits[0] < rounds / 2 + 2
    assert costs.gain_ratios[0] == pytest.approx((costs.gain_hits[0] + 1) / (costs.gain_sums[0] + 1))


class _Result:
    def __init__(self):
        self.accepted_ranks, self.stages_per_round, self.drafted_per_round = [], [], []

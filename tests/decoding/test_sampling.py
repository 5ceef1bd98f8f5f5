"""Verification rules, and T > 0 decoding: speculative sampling draws from the target's distribution."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from lit_domino.decoding import DLoopConfig, generate
from lit_domino.decoding.sampling import pick, residual, verify_greedy, verify_sampling
from lit_domino.testing import chi2_critical, chi_square, chi_square_target, dof_after_pooling, exact_joint

V = 8  # tiny vocabulary: the joint of two tokens has 64 cells


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: threads only contend


def test_verify_greedy_counts_the_matching_prefix_and_takes_the_bonus():
    logits = torch.full((5, 10), -1.0)
    for k, t in enumerate([3, 4, 5, 6, 7]):
        logits[k, t] = 1.0  # target picks 3 4 5 6 | 7
    assert verify_greedy(torch.tensor([3, 4, 5, 6]), logits) == (4, 7)
    assert verify_greedy(torch.tensor([3, 4, 9, 6]), logits) == (2, 5)
    assert verify_greedy(torch.tensor([0, 4, 5, 6]), logits) == (0, 3)


def test_residual_distribution():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.5, 0.3])
    torch.testing.assert_close(residual(p, q), torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(residual(p, p), p)  # no mass left: fall back to p


def test_verify_sampling_single_position_matches_p():
    """One draft position, exact: P(commit = j) = q(j) min(1, p/q) + P(reject) r(j) = p(j)."""
    g = torch.Generator().manual_seed(0)
    p_logits = torch.tensor([[2.0, 0.0, -1.0, 0.5], [0.0, 0.0, 0.0, 0.0]])
    q = torch.tensor([[0.1, 0.6, 0.2, 0.1]])
    n, counts = 4000, torch.zeros(4)
    drafts = torch.multinomial(q[0], n, replacement=True, generator=g)
    for d in drafts:
        acc, bonus = verify_sampling(d.view(1), q, p_logits, 1.0, g)
        counts[d if acc == 1 else bonus] += 1
    p = torch.softmax(p_logits[0], -1)
    assert chi_square(counts, p * n) < chi2_critical(3)


def test_pick_greedy_and_sampled():
    logits = torch.tensor([[0.0, 3.0, 1.0]])
    assert pick(logits, 0.0).tolist() == [1]
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([pick(logits, 1.0, g) for _ in range(3000)]).flatten()
    counts = torch.bincount(draws, minlength=3).float()
    assert chi_square(counts, torch.softmax(logits[0], -1) * 3000) < chi2_critical(2)


# --------------------------------------------------------------------------- chi-square helpers


# --------------------------------------------------------------------------- a tiny target and a q != p drafter


@pytest.fixture(scope="module")
def tiny():
    return chi_square_target(V)


class QSession:
    """Drafts from a fixed, position-dependent q_k (independent of p), returning q as ``probs``."""

    def __init__(self, drafter):
        self.d, self.n = drafter, 0

    def extend(self, tokens, features):
        pass

    def crop(self, length):
        self.n = 0

    def draft(self, anchor, num_tokens, temperature, generator):
        q = self.d.q[self.n: self.n + num_tokens]
        self.n += num_tokens
        toks = torch.multinomial(q, 1, generator=generator).view(-1)
        return SimpleNamespace(tokens=toks, probs=q, logprobs=q.gather(1, toks.view(-1, 1)).log().view(-1))


class QDrafter:
    def __init__(self, target, block_size):
        self.config = SimpleNamespace(block_size=block_size, feature_layers=[])
        g = torch.Generator().manual_seed(7)
        self.q = torch.softmax(torch.randn(8, V, generator=g) * 1.5, -1)

    def bind_target(self, target):
        pass

    def new_session(self):
        return QSession(self)


def q_joint(drafter):
    """What always accepting the drafts would give for (x_1, x_2) (for the power check)."""
    return drafter.q[0].double()[:, None] * drafter.q[1].double()[None, :]


@pytest.mark.parametrize("block_size,dloop,temperature,static_cache", [
    (3, None, 1.0, False),                                # one stage of 2 drafts (x1, x2 drafted)
    (2, None, 1.0, False),                                # one draft + the bonus (x2 is the bonus)
    (2, DLoopConfig(threshold=float("-inf"), max_stages=2), 0.7, False),  # two 1-token stages, one verification
    (None, None, 1.0, False),                             # plain AR sampling (the baseline)
    # the static-cache (GPU) path draws the same tokens as the dynamic one for every seed
    # (test_engine.py::test_static_cache_path_gives_identical_tokens_and_rounds), so it needs no chi-square of its own
    (2, DLoopConfig(threshold=-1.5, max_stages=2, gate="last"), 1.0, False),  # a gate that opens sometimes
])
def test_sampling_is_distributed_as_the_target(tiny, block_size, dloop, temperature, static_cache):
    """(x1, x2), or with DLoop (x2, x3): the first round's second stage drafts x2 (no stage is drafted that could
    not emit, so 3 tokens after the prefill's leave it room: stage 1 drafts x1, stage 2 x2, x3 is the bonus)."""
    prompt = [3, 5, 2, 6]
    at = 2 if dloop else 1
    exact = exact_joint(tiny, prompt, temperature, at=at)
    assert exact.max() > 0.05 and exact.max() < 0.9  # non-trivial target distribution
    drafter = QDrafter(tiny, block_size) if block_size else None
    n = 2000
    counts = torch.zeros(V, V)
    accepted = []
    for seed in range(n):
        res = generate(tiny, drafter, torch.tensor([prompt]), max_new_tokens=at + 2, temperature=temperature,
                       block_size=block_size, dloop=dloop, seed=seed, static_cache=static_cache)
        counts[res.tokens[at], res.tokens[at + 1]] += 1
        accepted += res.accepted_per_round[:1]
    expected = exact * n
    stat = chi_square(counts, expected)
    assert stat < chi2_critical(dof_after_pooling(expected)), stat
    if drafter is not None:
        assert {0, 1} <= set(accepted)  # rejections, partial and full acceptances all happened
        if dloop:
            assert 2 in accepted  # both stages' drafts accepted in one verification
        else:
            wrong = q_joint(drafter) * n  # power: the draft's own distribution is clearly rejected
            assert chi_square(counts, wrong) > 5 * chi2_critical(dof_after_pooling(wrong))


def test_same_seed_same_sample(tiny):
    drafter = QDrafter(tiny, 3)
    a = generate(tiny, drafter, torch.tensor([[1, 2, 3]]), max_new_tokens=8, temperature=1.0, seed=11)
    b = generate(tiny, drafter, torch.tensor([[1, 2, 3]]), max_new_tokens=8, temperature=1.0, seed=11)
    assert a.tokens == b.tokens


def test_pairs_cover_many_cells(tiny):
    """Guard for the chi-square test: the tiny target's (x1, x2) distribution is spread over cells."""
    exact = exact_joint(tiny, [3, 5, 2, 6], 1.0)
    assert sum(1 for i, j in itertools.product(range(V), range(V)) if exact[i, j] * 2000 >= 5) >= 8


def test_exact_joint_later_pairs_marginalise_the_tokens_before(tiny):
    """P(x_2, x_3) from the batched enumeration equals the sum over x_0, x_1 of the chain rule, one forward per
    sequence; at = 1 is the (x_1, x_2) law."""
    prompt = [3, 5, 2, 6]

    def p(seq):
        with torch.no_grad():
            return torch.softmax(tiny.model(input_ids=torch.tensor([seq])).logits[0, -1].double(), -1)

    brute = torch.zeros(V, V, dtype=torch.double)
    for x0, p0 in enumerate(p(prompt)):
        for x1, p1 in enumerate(p(prompt + [x0])):
            for x2, p2 in enumerate(p(prompt + [x0, x1])):
                brute[x2] += p0 * p1 * p2 * p(prompt + [x0, x1, x2])
    later = exact_joint(tiny, prompt, at=2)
    torch.testing.assert_close(later, brute, atol=1e-7, rtol=0)
    assert float(later.sum()) == pytest.approx(1.0) and not torch.allclose(later, exact_joint(tiny, prompt))

"""Position weights, λ schedules and the block losses match their formulas."""

import math

import pytest
import torch
import torch.nn.functional as F

from lit_domino.models.objectives import (IGNORE_INDEX, LambdaSchedule, curriculum_loss, default_gamma,
    position_weights, ttt_loss, weighted_block_ce)


def test_position_weights_formula():
    w = position_weights(16, 7.0)
    assert w.shape == (16,) and w[0] == 0
    for k in range(1, 16):
        assert float(w[k]) == pytest.approx(math.exp(-(k - 1) / 7.0))
    assert float(position_weights(4, 2.0)[3]) == pytest.approx(math.exp(-1.0))


def test_default_gamma_papers_and_other_block_sizes():
    assert default_gamma(16) == 7 and default_gamma(8) == 4
    assert default_gamma(4) == pytest.approx(2.5) and default_gamma(32) == pytest.approx(13)
    assert torch.equal(position_weights(16), position_weights(16, 7.0))
    assert torch.equal(position_weights(8), position_weights(8, 4.0))


@pytest.mark.parametrize("gamma", [0.0, -1.0, float("nan")])
def test_bad_gamma(gamma):
    with pytest.raises(ValueError, match="gamma"):
        position_weights(8, gamma)


@pytest.mark.parametrize("block_size", [1, 0, -3])
def test_bad_block_size(block_size):
    with pytest.raises(ValueError, match="block_size"):
        position_weights(block_size)


def test_weighted_block_ce_matches_manual():
    torch.manual_seed(0)
    b, A, B, V = 2, 3, 4, 11
    logits = torch.randn(b, A, B, V)
    labels = torch.randint(0, V, (b, A, B))
    labels[..., 0] = IGNORE_INDEX
    labels[0, 1, 2:] = IGNORE_INDEX
    w = position_weights(B, 2.0)
    num = den = 0.0
    for i in range(b):
        for a in range(A):
            for k in range(B):
                if labels[i, a, k] != IGNORE_INDEX:
                    ce = F.cross_entropy(logits[i, a, k][None], labels[i, a, k][None])
                    num, den = num + w[k] * ce, den + w[k]
    assert float(weighted_block_ce(logits, labels, w)) == pytest.approx(float(num / den), rel=1e-5)
    # no labels at all: a zero that still backpropagates
    empty = torch.full_like(labels, IGNORE_INDEX)
    logits.requires_grad_(True)
    loss = weighted_block_ce(logits, empty, w)
    loss.backward()
    assert float(loss) == 0.0 and torch.equal(logits.grad, torch.zeros_like(logits))


def test_lambda_schedules():
    T = 100
    lin = LambdaSchedule("linear")
    assert [lin(t, T) for t in (0, 25, 50, 100, 150)] == pytest.approx([1.0, 0.75, 0.5, 0.0, 0.0])
    half = LambdaSchedule("linear", start=0.8, ratio=0.5)
    assert [half(t, T) for t in (0, 25, 49, 50, 80)] == pytest.approx([0.8, 0.4, 0.8 * (1 - 49 / 50), 0.0, 0.0])
    cos = LambdaSchedule("cosine")
    for t in (0, 10, 50, 90, 100, 120):
        expect = 0.5 * (1 + math.cos(math.pi * t / T)) if t < T else 0.0
        assert cos(t, T) == pytest.approx(expect, abs=1e-12)
    step = LambdaSchedule("step")
    assert [step(t, T) for t in (0, 24, 25, 50, 75, 99, 100)] == pytest.approx([1, 1, 0.5, 0.25, 0.125, 0.125, 0])
    assert LambdaSchedule("step", step_every=0.5)(60, T) == 0.5
    assert LambdaSchedule("constant", start=0.3)(77, T) == 0.3
    assert LambdaSchedule("none")(0, T) == 0.0


@pytest.mark.parametrize("kwargs", [dict(kind="exp"), dict(start=1.5), dict(ratio=0), dict(step_every=0)])
def test_bad_schedules(kwargs):
    with pytest.raises(ValueError):
        LambdaSchedule(**kwargs)


def test_curriculum_loss_mixes_terms():
    torch.manual_seed(0)
    base, final = torch.randn(2, 2, 4, 7), torch.randn(2, 2, 4, 7)
    labels = torch.randint(0, 7, (2, 2, 4))
    labels[..., 0] = IGNORE_INDEX
    w = position_weights(4)
    lb, lf = weighted_block_ce(base, labels, w), weighted_block_ce(final, labels, w)
    for lam in (0.0, 0.3, 1.0):
        loss, b_, f_ = curriculum_loss(base, final, labels, w, lam)
        assert float(loss) == pytest.approx(float(lam * lb + (1 - lam) * lf), rel=1e-6)
        assert float(b_) == pytest.approx(float(lb)) and float(f_) == pytest.approx(float(lf))


def test_ttt_loss():
    torch.manual_seed(0)
    logits = [torch.randn(2, 5, 7) for _ in range(3)]
    labels = [torch.randint(0, 7, (2, 5)) for _ in range(3)]
    labels[2][:] = IGNORE_INDEX
    total, steps = ttt_loss(logits, labels, 0.8)
    ref = [F.cross_entropy(l.flatten(0, 1), y.flatten()) for l, y in zip(logits[:2], labels[:2])]
    assert float(total) == pytest.approx(float(ref[0] + 0.8 * ref[1]), rel=1e-6) and float(steps[2]) == 0.0

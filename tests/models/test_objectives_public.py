"""Each objective equals its public implementation on random tensors, loss and gradient, for every variant the
public code has (vLLM's ``speculators`` 0.9.0, SGLang's ``specforge`` 0.2.0: ``requirements-peers.txt``), and a
direct per-block loop over the paper's formula where no public code exists (accept-until-fail, the
acceptance-weighted Rényi-½ loss, the expected-τ surrogate).

The suite normalises by the position-weight sum of the labelled positions; speculators' ``loss_function``
divides by their count (+1e-5) and SpecForge's D-PACE by its batch size: each comparison states the factor."""

import types
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from speculators.losses import eager
from speculators.losses.utils import dflash_loss_decay, dpace_loss_decay, loss_function
from specforge.core.lk_loss import compute_acceptance_rate, compute_lk_loss

from lit_domino.models.objectives import build_objective, position_weights
from lit_domino.models.objectives.blocks import block_objective

A, B, V = 6, 5, 40
TOL = dict(rtol=1e-5, atol=1e-6)  # float32, the same sums in another order
GAMMA = 2.5


@pytest.fixture(scope="module")
def tensors():
    """Blocks [A, B] of logits, target logits and labels (-100 at k = 0 and at a hole mid-block), the last block
    with disjoint q and p (α = 0 exactly: the LK variants' edge), some greedy picks right (for accept-until-fail)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(A, B, V, generator=g) * 2
    target = torch.randn(A, B, V, generator=g) * 2
    labels = torch.randint(0, V, (A, B), generator=g)
    labels[:, 0] = -100
    labels[1, 2] = -100
    labels[2, 1:3] = logits[2, 1:3].argmax(-1)  # right picks, then whatever
    labels[3, 1:] = logits[3, 1:].argmax(-1)  # a block drafted right to the end
    logits[-1], target[-1] = -300.0, -300.0  # disjoint point masses: α underflows to exactly 0
    logits[-1, :, 0], target[-1, :, 1] = 300.0, 300.0
    return logits, target, labels


def _ours(spec, logits, target, labels, weights):
    """(loss, d loss / d logits) through the objective's row statistics and block reduction (the models' path)."""
    objective = build_objective(spec)
    x = logits.clone().requires_grad_()
    keep = labels != -100
    stats = objective.row_stats(x[keep], labels[keep], target[keep] if objective.needs_target else None)
    loss, _ = block_objective(objective, stats, keep, weights)
    (grad,) = torch.autograd.grad(loss, x)
    return loss.detach(), grad


def _theirs(fn, logits):
    x = logits.clone().requires_grad_()
    loss = fn(x)
    (grad,) = torch.autograd.grad(loss, x)
    return loss.detach(), grad


def _close(ours, theirs, scale=1.0):
    torch.testing.assert_close(ours[0] * scale, theirs[0], **TOL)
    torch.testing.assert_close(ours[1] * scale, theirs[1], **TOL)
    assert theirs[1].abs().sum() > 0


def _flat(x):
    return x.reshape(1, A * B, *x.shape[2:])


def _speculators(loss_fn, decay_fn, tensors, labels=None):
    """speculators.losses.utils.loss_function on the blocks laid end to end ([1, A·B], its shape)."""
    logits, target, lab = tensors
    mask = _flat((lab if labels is None else labels) != -100).float()
    pos = (torch.arange(A * B) % B)[None]
    return _theirs(lambda x: loss_function(_flat(x), _flat(target), mask, pos, loss_fn=loss_fn, decay_fn=decay_fn),
                   logits)


def _to_count(valid, weights):
    """ours (÷ Σ w·v) -> speculators' (÷ (Σ v + 1e-5))."""
    return float((weights * valid).sum() / (valid.sum() + 1e-5))


@pytest.mark.parametrize("spec,fn", [
    ("kl", eager.kl_div_loss),
    ({"name": "kl", "temperature": 2.0}, "scaled"),
    ("tv", eager.tv_loss),
    ({"name": "tv", "temperature": 0.5}, "scaled"),
    ("lk_alpha", eager.neg_log_acceptance_loss),
    ("lk_lambda", eager.lk_hybrid_loss),
    ({"name": "lk_lambda", "eta": 1.5}, partial(eager.lk_hybrid_loss, eta=1.5)),
], ids=lambda v: str(v) if not callable(v) else "")
def test_speculators_distribution_losses(tensors, spec, fn):
    """kl_div_loss, tv_loss, neg_log_acceptance_loss (α floored at 1e-5: the disjoint block), lk_hybrid_loss
    (λ per position, η = 3 or as set), under its dflash_loss_decay position weights; a temperature T is the
    public loss of logits / T."""
    logits, target, labels = tensors
    temperature = build_objective(spec).temperature
    if fn == "scaled":
        base = {"kl": eager.kl_div_loss, "tv": eager.tv_loss}[spec["name"]]
        fn = lambda q, p: base(q / temperature, p / temperature)  # noqa: E731
    weights = position_weights(B, GAMMA)
    theirs = _speculators(fn, partial(dflash_loss_decay, gamma=GAMMA), tensors)
    _close(_ours(spec, logits, target, labels, weights), theirs, _to_count(labels != -100, weights))


@pytest.mark.parametrize("alpha", [0.5, 0.2])
def test_speculators_dpace_on_the_targets_argmax(tensors, alpha):
    """dpace_loss_decay over eager.ce_loss (the label is argmax p), divided by the label count."""
    logits, target, labels = tensors
    valid = labels != -100
    decay = partial(dpace_loss_decay, loss_mask=_flat(valid).float(), block_size=B, dpace_alpha=alpha)
    theirs = _speculators(eager.ce_loss, decay, tensors)
    ours = _ours({"name": "dpace", "label": "target", "dpace_alpha": alpha}, logits, target, labels, torch.ones(B))
    _close(ours, theirs, float(valid.sum() / (valid.sum() + 1e-5)))


def _specforge_dflash(loss_type, tensors, alpha=0.5):
    """SpecForge's OnlineDFlashModel._dflash_objective_chunk_terms (its DFlash / D-PACE objective) on our logits:
    the LM head the identity, the labels the dataset tokens, the weight mask our valid positions."""
    from specforge.algorithms.common.dflash_family_model import OnlineDFlashModel

    logits, target, labels = tensors
    valid = labels != -100
    model = types.SimpleNamespace(lm_head=torch.nn.Identity(), loss_type=loss_type, dpace_alpha=alpha, block_size=B,
                                  loss_decay_gamma=GAMMA)
    model._dpace_weight = types.MethodType(OnlineDFlashModel._dpace_weight, model)
    ids = torch.where(valid, labels, torch.zeros_like(labels))[None]

    def numerator_over_denominator(x):
        num, den, _, _ = OnlineDFlashModel._dflash_objective_chunk_terms(model, x[None], ids, valid[None].float())
        return num / den if loss_type == "dflash" else num  # D-PACE: SpecForge divides by the batch size

    return _theirs(numerator_over_denominator, logits)


def test_specforge_position_weighted_ce(tensors):
    """SpecForge's loss_type dflash (exp(−(k−1)/γ) weights, ÷ their sum) is the suite's CE, as is."""
    logits, target, labels = tensors
    _close(_ours("ce", logits, target, labels, position_weights(B, GAMMA)), _specforge_dflash("dflash", tensors))


@pytest.mark.parametrize("weight,loss_type", [("dpace", "dpace"), ("cumulative", "dpace-cumulative-confidence-only"),
                                              ("continuation", "dpace-continuation-value-only")])
@pytest.mark.parametrize("alpha", [0.5, 0.0])
def test_specforge_dpace_on_the_dataset_token(tensors, weight, loss_type, alpha):
    """_dpace_weight's three loss types (the paper's and its two ablations) on the dataset token; SpecForge's sum
    is ours times the label count."""
    logits, target, labels = tensors
    ours = _ours({"name": "dpace", "weight": weight, "dpace_alpha": alpha}, logits, target, labels, torch.ones(B))
    _close(ours, _specforge_dflash(loss_type, tensors, alpha), float((labels != -100).sum()))


def _specforge_lk(lk_type, tensors, kl_scale=1.0, kl_decay=1.0):
    """compute_acceptance_rate (masked means of α and log α) + compute_lk_loss; its KL term the masked mean of
    speculators' kl_div_loss (SpecForge's own is a Triton kernel: the soft-label CE, KL plus a constant)."""
    logits, target, labels = tensors
    mask = _flat(labels != -100)

    def loss(x):
        acc, log_acc = compute_acceptance_rate(logits=_flat(x), target_probs=torch.softmax(_flat(target), -1),
                                               position_mask=mask[..., None])
        kl = (eager.kl_div_loss(_flat(x), _flat(target)) * mask).sum() / mask.sum()
        return compute_lk_loss(kl_loss=kl, acceptance_rate=acc, log_acceptance_rate=log_acc, lk_loss_type=lk_type,
                               kl_scale=kl_scale, kl_decay=kl_decay)

    return _theirs(loss, logits)


def test_specforge_lk_alpha(tensors):
    """α averaged in log space over the labelled positions, log α counted 0 where α = 0 (the disjoint block).
    There SpecForge's gradient is NaN (``torch.where`` over ``log 0``); ours is 0 (the term is the constant 0)."""
    logits, target, labels = tensors
    ours = _ours({"name": "lk_alpha", "variant": "specforge"}, logits, target, labels, torch.ones(B))
    theirs = _specforge_lk("alpha", tensors)
    assert theirs[1][-1].isnan().all() and not ours[1][-1].any()
    _close((ours[0], ours[1][:-1]), (theirs[0], theirs[1][:-1]))
    floored = _ours("lk_alpha", logits, target, labels, torch.ones(B))[0]
    assert floored > ours[0] + 1.0  # the variants differ exactly there: −log 1e-5 per disjoint position


@pytest.mark.parametrize("kl_scale,eta", [(1.0, None), (0.7, 2.0)])
def test_specforge_lk_lambda(tensors, kl_scale, eta):
    """One λ = s·exp(−η·sg(ᾱ)) from the batch's mean α (η = 1 by default, SpecForge's kl_decay)."""
    logits, target, labels = tensors
    spec = {"name": "lk_lambda", "variant": "specforge", "kl_scale": kl_scale, "eta": eta}
    ours = _ours(spec, logits, target, labels, torch.ones(B))
    _close(ours, _specforge_lk("lambda", tensors, kl_scale, 1.0 if eta is None else eta))


# --------------------------------------------------------------------------- no public code: direct loops


def _loop_loss(tensors, per_block):
    """Σ over blocks of ``per_block(q_logits [B, V], p_logits [B, V], labels [B])`` -> (num, den), divided."""
    logits, target, labels = tensors

    def loss(x):
        num = den = 0.0
        for a in range(x.shape[0]):
            n, d = per_block(x[a], target[a], labels[a])
            num, den = num + n, den + d
        return num / den

    return _theirs(loss, logits)


@pytest.mark.parametrize("decay", [True, False])
def test_accept_until_fail_equals_its_formula(tensors, decay):
    """CE at each position up to and including the first wrong greedy pick (a position without a label passes),
    position-weighted, ÷ the plain CE's weight sum."""
    logits, target, labels = tensors
    w = position_weights(B, GAMMA) if decay else torch.ones(B)

    def block(q, p, y):
        num, den, reached = 0.0, 0.0, True
        for k in range(B):
            if y[k] == -100:
                continue
            num = num + (w[k] * F.cross_entropy(q[k], y[k]) if reached else 0.0)
            den = den + w[k]
            reached = reached and bool(q[k].argmax() == y[k])
        return num, den

    ours = _ours({"name": "accept_until_fail", "position_decay": decay}, logits, target, labels,
                 position_weights(B, GAMMA))
    _close(ours, _loop_loss(tensors, block))


@pytest.mark.parametrize("rho", [0.5, 0.25])
def test_renyi_half_equals_its_formula(tensors, rho):
    """D_½(p ‖ q) = −2 log Σ sqrt(p q) under W_k = Σ_{j≥k} v_j Π_{i≤j} (ρ + (1−ρ)·sg α_i), ÷ the label count."""
    logits, target, labels = tensors

    def block(q, p, y):
        pq = torch.softmax(q, -1) * torch.softmax(p, -1)
        alpha = torch.minimum(torch.softmax(q, -1), torch.softmax(p, -1)).sum(-1).detach()
        valid = [bool(y[k] != -100) for k in range(B)]
        prefix, run = [], 1.0
        for k in range(B):
            run = run * (rho + (1 - rho) * alpha[k]) if valid[k] else run
            prefix.append(run)
        num = 0.0
        for k in range(B):
            if valid[k]:
                weight = sum(prefix[j] for j in range(k, B) if valid[j])
                num = num + weight * -2.0 * torch.log(torch.sqrt(pq[k]).sum())
        return num, float(sum(valid))

    finite = tuple(t[:-1] for t in tensors)  # the disjoint block's D_½ is infinite by definition
    _close(_ours({"name": "renyi", "rho": rho}, *finite, torch.ones(B)), _loop_loss(finite, block))


@pytest.mark.parametrize("form", ["neg", "log"])
def test_expected_tau_equals_its_formula(tensors, form):
    """E[τ] = 1 + Σ_j v_j Π_{i≤j} α_i per block (a position without a label: α = 1), −mean (or −mean log) over
    the blocks, differentiated through every α."""
    logits, target, labels = tensors

    def block(q, p, y):
        alpha = torch.minimum(torch.softmax(q, -1), torch.softmax(p, -1)).sum(-1)
        tau, run = 1.0, 1.0
        for k in range(B):
            if y[k] != -100:
                run = run * alpha[k]
                tau = tau + run
        return -(tau if form == "neg" else torch.log(tau)), 1.0

    ours = _ours({"name": "expected_tau", "form": form}, logits, target, labels, torch.ones(B))
    _close(ours, _loop_loss(tensors, block))
    tau = -ours[0] if form == "neg" else torch.exp(-ours[0])
    assert 1.0 < float(tau) < B  # the fully right block and the disjoint one (τ = 1) bracket the mean

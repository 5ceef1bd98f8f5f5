"""Eagle3Drafter: training-time test == what the session computes, labels, loss."""

import pytest
import torch

from lit_domino.models import build_drafter, drafter_config
from lit_domino.testing import random_target

STEPS = 4


@pytest.fixture(scope="module")
def target():
    return random_target(vocab_size=256, hidden_size=64, num_layers=4, seed=0)


@pytest.fixture(scope="module")
def drafter(target):
    torch.manual_seed(2)
    cfg = drafter_config("eagle3", target, ttt_steps=STEPS)
    assert cfg.feature_layers == [1, 2, 3]  # EAGLE-3 rule on 4 layers: three distinct layers (eagle3_layer_ids)
    return build_drafter(cfg, target).eval()


def _batch(T=20, b=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 250, (b, T), generator=g), torch.randn(b, T, 3 * 64, generator=g)


def test_labels_alignment(drafter):
    ids, feats = _batch(T=10, b=2)
    loss_mask = torch.ones_like(ids)
    loss_mask[:, :5] = 0
    with torch.no_grad():
        out = drafter.forward_train(ids, feats, loss_mask)
    assert len(out.logits) == STEPS and out.logits[0].shape == (2, 10, 256)
    for s in range(STEPS):
        for t in range(10):
            ok = t + 1 < 10 and t + 1 >= 5 and t - s >= 1
            assert out.labels[s][0, t].item() == (ids[0, t + 1].item() if ok else -100), (s, t)
    assert all(torch.isfinite(x).all() for x in out.logits)


def test_session_equals_training_time_test(drafter):
    ids, feats = _batch(T=24)
    a = 11
    s = drafter.new_session()
    s.extend(ids[0, :6], feats[0, :6])
    s.extend(ids[0, 6:a], feats[0, 6:a])
    d = s.draft(ids[0, a], STEPS)
    forced = ids.clone()
    forced[0, a + 1: a + STEPS] = d.tokens[: STEPS - 1]  # the chain's own tokens
    with torch.no_grad():
        out = drafter.forward_train(forced, feats)
    for j in range(STEPS):  # session step j at position a + j == TTT step j at a + j
        torch.testing.assert_close(d.logits[j], out.logits[j][0, a + j], atol=1e-5, rtol=1e-5)
    # step 0 everywhere equals a fresh session's first draft
    for a2 in (1, 5, 17):
        s2 = drafter.new_session()
        s2.extend(forced[0, :a2], feats[0, :a2])
        torch.testing.assert_close(s2.draft(forced[0, a2], 1).logits[0], out.logits[0][0, a2], atol=1e-5, rtol=1e-5)


def test_dloop_continues_chain_and_crop(drafter):
    ids, feats = _batch(T=24)
    s = drafter.new_session()
    s.extend(ids[0, :12], feats[0, :12])
    one = s.draft(ids[0, 12], 5)
    s.crop(12)
    first = s.draft(ids[0, 12], 2)
    second = s.draft(first.tokens[-1], 3)
    assert torch.cat([first.tokens, second.tokens]).tolist() == one.tokens.tolist()
    torch.testing.assert_close(torch.cat([first.logits, second.logits]), one.logits, atol=1e-5, rtol=1e-5)
    # commit 3 more tokens, crop back, re-extend: same as a fresh session
    s.crop(12)
    s.extend(ids[0, 12:15], feats[0, 12:15])
    s.crop(13)
    fresh = drafter.new_session()
    fresh.extend(ids[0, :13], feats[0, :13])
    torch.testing.assert_close(s.draft(ids[0, 13], 3).logits, fresh.draft(ids[0, 13], 3).logits, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="at least one committed"):
        drafter.new_session().draft(3, 2)


def test_eagle_loss_weights_and_backward(drafter, target):
    d = build_drafter(drafter.config, target).train()
    d.load_state_dict(drafter.state_dict())
    ids, feats = _batch(T=12, b=2)
    out = d.forward_train(ids, feats, torch.ones_like(ids), torch.ones_like(ids))
    total, steps, _ = d.train_loss(out, 0.8)
    torch.testing.assert_close(total, sum(0.8 ** s * l for s, l in enumerate(steps)))
    full = d.forward_train(ids, feats, torch.ones_like(ids), torch.ones_like(ids), with_logits=True)
    for s, (logits, labels) in enumerate(zip(full.logits, full.labels)):  # the head at labels only = the full CE
        keep = labels != -100
        ce = torch.nn.functional.cross_entropy(logits[keep], labels[keep])
        torch.testing.assert_close(steps[s], ce, atol=1e-5, rtol=1e-5)
    total.backward()
    assert d.fc.weight.grad.abs().sum() > 0 and d.self_attn.q_proj.weight.grad.abs().sum() > 0
    assert d.self_attn.q_proj.weight.shape == (4 * 16, 2 * 64)  # q/k/v take 2d


@pytest.mark.parametrize("T, s", [(9, 1), (9, 3), (5, 6)])  # (5, 6): some chain keys lie before every query
def test_chain_attention_equals_sdpa_under_the_dense_ttt_mask(T, s):
    import torch.nn.functional as F

    from lit_domino.models.eagle import ChainAttention, ttt_mask

    g = torch.Generator().manual_seed(s)
    q = torch.randn(2, 4, T, 8, generator=g, requires_grad=True)
    k = torch.randn(2, 2, (s + 1) * T, 8, generator=g, requires_grad=True)
    v = torch.randn(2, 2, (s + 1) * T, 8, generator=g, requires_grad=True)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=ttt_mask(T, s), enable_gqa=True)
    out = ChainAttention(T, s)(q, k, v)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)

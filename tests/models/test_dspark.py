"""DSpark: config errors, the target's distribution from the features, the lean loss equal to the full-logits
one (losses and gradients, every head type), the objective's maths, and the decode rollout equal to teacher
forcing when it picks the true tokens."""

import pytest
import torch

from lit_domino.models import DSparkConfig, build_drafter, drafter_config
from lit_domino.models.base import DrafterMismatchError
from lit_domino.models.dspark import HEAD_TYPES
from lit_domino.models.objectives import IGNORE_INDEX, LossSettings, distill_terms, position_weights
from lit_domino.testing import random_target

B = 6
TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def target():
    return random_target(vocab_size=256, hidden_size=64, num_layers=4, seed=0)


def _drafter(target, head_type="vanilla", seed=1, sample_from_anchor=False, **head):
    torch.manual_seed(seed)
    d = build_drafter(drafter_config("dspark", target, block_size=B, sample_from_anchor=sample_from_anchor,
                                     head=dict(rank=16, head_type=head_type, **head)), target).train()
    torch.nn.init.normal_(d.head.w2.weight, std=0.3)  # a visible bias
    return d


def _batch(target, b=2, T=40, seed=0):
    """Token ids, and features computed by the target itself (so the last slice is its real distribution)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 250, (b, T), generator=g)
    feats = target.forward_features(ids, drafter_config("dspark", target).feature_layers)
    loss_mask = torch.ones(b, T, dtype=torch.long)
    loss_mask[:, :8] = 0
    attn = torch.ones(b, T, dtype=torch.long)
    attn[-1, T - 6:] = 0  # a padded row
    loss_mask[-1, T - 6:] = 0
    anchors = torch.tensor([[8, 12, 20, 30, 35], [9, 14, 22, 0, 0]])[:b]
    return ids, feats, anchors, anchors > 0, loss_mask, attn


def test_config_refuses_bad_heads(target):
    with pytest.raises(ValueError, match="rank must be a positive integer"):
        drafter_config("dspark", target, head=dict(rank=0))
    with pytest.raises(ValueError, match="rank must be a positive integer"):
        drafter_config("dspark", target, head=dict(rank=-3))
    with pytest.raises(ValueError, match="head.head_type: unknown DSpark head type 'lstm'"):
        drafter_config("dspark", target, head=dict(head_type="lstm"))
    with pytest.raises(ValueError, match="at least 2"):
        drafter_config("dspark", target, feature_layers=[3])


def test_feature_rule_ends_with_the_last_layer_and_binding_checks_it(target):
    cfg = drafter_config("dspark", target)
    assert cfg.feature_layers[-1] == target.num_layers - 1 and cfg.num_features == len(cfg.feature_layers) - 1
    bad = drafter_config("dspark", target, feature_layers=[1, 2])
    with pytest.raises(DrafterMismatchError, match="last decoder layer"):
        build_drafter(bad, target)


def test_target_hidden_gives_the_targets_logits(target):
    """``lm_head(target_hidden[k])`` is the target's own distribution at a+k-1 (what predicts x_{a+k})."""
    d = _drafter(target)
    ids, feats, anchors, am, lm, attn = _batch(target)
    out = d.forward_train(ids, feats, anchors, am, lm, attn)
    with torch.no_grad():
        logits = target.model(input_ids=ids).logits  # [b, T, V]
    a, k = int(anchors[0, 1]), 3
    torch.testing.assert_close(d.compute_logits(out.target_hidden[0, 1, k]), logits[0, a + k - 1], rtol=1e-4,
                               atol=1e-4)


@pytest.mark.parametrize("head_type,anchor", [(h, False) for h in HEAD_TYPES] + [("rnn", True)])
@pytest.mark.parametrize("chunk", [None, 5])
def test_lean_loss_equals_full_logits_loss(target, head_type, anchor, chunk):
    d = _drafter(target, head_type, sample_from_anchor=anchor)
    batch = _batch(target)
    settings = LossSettings(position_weights(B, 4.0), chunk_size=chunk)
    results = []
    for with_logits in (True, False):
        d.zero_grad()
        out = d.forward_train(*batch, with_logits=with_logits)
        loss, logs = d.block_loss(out, settings)
        loss.backward()
        results.append((loss.detach(), logs, {n: p.grad.clone() for n, p in d.named_parameters() if p.grad is not None}))
    (l_full, logs_full, g_full), (l_lean, logs_lean, g_lean) = results
    torch.testing.assert_close(l_lean, l_full, **TOL)
    for key in logs_full:
        torch.testing.assert_close(logs_lean[key], logs_full[key], **TOL)
    assert set(g_lean) == set(g_full) and "head.w1.weight" in g_full and "confidence.weight" in g_full
    for name in g_full:
        torch.testing.assert_close(g_lean[name], g_full[name], rtol=1e-4, atol=1e-6, msg=name)


def test_objective_is_deepspecs(target):
    """loss = 0.1·CE + 0.9·TV + 1.0·BCE(conf, 1 − TV), each Σ w·term / Σ w over the labels, by hand."""
    d = _drafter(target, "gated")
    out = d.forward_train(*_batch(target))
    w = position_weights(B, 4.0)
    loss, logs = d.block_loss(out, LossSettings(w, chunk_size=None))
    keep = out.labels != IGNORE_INDEX
    q = torch.softmax(out.final_logits[keep], -1)
    p = torch.softmax(d.compute_logits(out.target_hidden[keep]), -1)
    tv = 0.5 * (q - p).abs().sum(-1)
    ce = torch.nn.functional.cross_entropy(out.final_logits[keep], out.labels[keep], reduction="none")
    bce = torch.nn.functional.binary_cross_entropy_with_logits(out.confidence[keep], 1 - tv, reduction="none")
    wk = w.expand_as(out.labels)[keep]
    ref = [(t * wk).sum() / wk.sum() for t in (ce, tv, bce)]
    torch.testing.assert_close(loss, 0.1 * ref[0] + 0.9 * ref[1] + 1.0 * ref[2], **TOL)
    torch.testing.assert_close(logs["accept_rate"], 1 - ref[1], **TOL)
    # no confidence head: the BCE term vanishes; the TV term is the acceptance rate's complement
    ce_t, tv_t, bce_t = distill_terms(out.final_logits[keep], d.compute_logits(out.target_hidden[keep]),
                                      out.labels[keep])
    assert float(bce_t.abs().sum()) == 0.0
    torch.testing.assert_close(tv_t, 1 - torch.minimum(q, p).sum(-1), **TOL)


def test_without_confidence_head(target):
    d = _drafter(target, confidence=False)
    assert d.confidence is None
    out = d.forward_train(*_batch(target), with_logits=False)
    loss, logs = d.block_loss(out, LossSettings(position_weights(B, 4.0)))
    assert out.confidence is None and float(logs["loss_conf"]) == 0.0 and torch.isfinite(loss)


@pytest.mark.parametrize("head_type,anchor", [(h, False) for h in HEAD_TYPES] + [(h, True) for h in HEAD_TYPES])
def test_decode_rollout_equals_teacher_forcing_on_the_true_tokens(target, head_type, anchor):
    """The session's head (``MarkovHead.draft``) fed its own picks gives the teacher-forced corrected logits
    whenever the picks are the true tokens: check on the greedy picks themselves as the block's tokens."""
    d = _drafter(target, head_type, sample_from_anchor=anchor).eval()
    torch.nn.init.normal_(d.head.w2.weight, std=2.0)
    ids, feats, *_ = _batch(target, b=1)
    a = 20
    with torch.no_grad():
        hidden = d.forward_train(ids, feats, torch.tensor([[a]]), torch.tensor([[True]]), with_logits=True).hidden
        H = hidden[0, 0]  # [B, d]
        tokens, _, logits, _ = d.head.draft(H, d.compute_logits(H[1:]), ids[0, a:a + 1], anchor_slot=not anchor)
        seq = ids.clone()
        seq[0, a + 1: a + B] = tokens  # the block's true tokens are now the picks
        out = d.forward_train(seq, feats, torch.tensor([[a]]), torch.tensor([[True]]), with_logits=True)
    torch.testing.assert_close(logits, out.final_logits[0, 0, 1:], **TOL)
    assert torch.equal(tokens, out.final_logits[0, 0, 1:].argmax(-1))


def test_fresh_drafter_equals_its_backbone(target):
    torch.manual_seed(0)
    d = build_drafter(drafter_config("dspark", target, block_size=B), target)
    out = d.forward_train(*_batch(target))
    torch.testing.assert_close(out.final_logits, out.logits)
    assert isinstance(d.config, DSparkConfig)


def test_sample_from_anchor_maps_deepspecs_slots_onto_the_suites_labels(target):
    """DeepSpec's block of B-1 slots ``[x_a, MASK × (B-2)]`` at ``a .. a+B-2``, slot j predicting ``x_{a+j+1}``
    from ``x_{a+j}``: the suite's index k = j+1 holds slot j (its label ``x_{a+k}``), index 0 predicts nothing."""
    d = _drafter(target, "vanilla", sample_from_anchor=True).eval()
    ids, feats, *_ = _batch(target, b=1)
    a = 20
    with torch.no_grad():
        out = d.forward_train(ids, feats, torch.tensor([[a]]), torch.tensor([[True]]), with_logits=True)
        slots = torch.full((B - 1,), d.config.mask_token_id)
        slots[0] = ids[0, a]
        ctx = d.fuse(feats[:, :a])
        H = d.block_hidden(d.embed_tokens(slots)[None], torch.arange(a, a + B - 1), ctx, torch.arange(a))[0]
        prev = ids[0, a:a + B - 1]  # slot j's previous token x_{a+j}
        want = d.compute_logits(H) + d.head.w2(d.head.w1(prev))
    assert out.labels[0, 0].tolist() == [-100] + ids[0, a + 1:a + B].tolist()
    torch.testing.assert_close(out.final_logits[0, 0, 1:], want, **TOL)
    assert float(out.hidden[0, 0, 0].abs().sum()) == 0.0  # index 0: no query row of its own


def test_sample_from_anchor_must_be_a_bool(target):
    with pytest.raises(ValueError, match="sample_from_anchor must be true or false"):
        drafter_config("dspark", target, sample_from_anchor="yes")


@pytest.mark.parametrize("head_type", HEAD_TYPES)
def test_pool_is_the_exact_head_on_each_positions_pool(target, head_type):
    """``pool_size`` P: a pool of the whole vocabulary is the exact head; on P < V every corrected logit equals the
    teacher-forced exact head's on the position's top-P base logits (the pool's own picks as the block's tokens)
    and is -inf elsewhere, and the pick is the pool's argmax."""
    d = _drafter(target, head_type).eval()
    torch.nn.init.normal_(d.head.w2.weight, std=2.0)
    ids, feats, *_ = _batch(target, b=1)
    a, P = 20, 5
    with torch.no_grad():
        H = d.forward_train(ids, feats, torch.tensor([[a]]), torch.tensor([[True]])).hidden[0, 0]
        base = d.compute_logits(H[1:])
        exact = d.head.draft(H, base, ids[0, a:a + 1])
        whole = d.head.draft(H, base, ids[0, a:a + 1], pool_size=target.vocab_size)
        tokens, picks, logits, pool = d.head.draft(H, base, ids[0, a:a + 1], pool_size=P)
        seq = ids.clone()
        seq[0, a + 1: a + B] = tokens
        forced = d.forward_train(seq, feats, torch.tensor([[a]]), torch.tensor([[True]])).final_logits[0, 0, 1:]
    assert torch.equal(whole[0], exact[0]) and torch.equal(whole[2], exact[2]) and whole[3] is None
    assert torch.equal(pool, base.topk(P, -1).indices)
    torch.testing.assert_close(logits, forced.gather(-1, pool), **TOL)
    assert torch.equal(tokens, pool.gather(-1, logits.argmax(-1, keepdim=True))[:, 0])
    assert torch.equal(picks, logits.argmax(-1))

"""DFlash 2: config errors, the grouped dynamic convolution (identity at init, causal inside a block), the lean
loss equal to the full-logits one (losses and gradients), the objective's maths by hand, and the selector's
decode chain equal to teacher forcing when its picks are the block's tokens."""

import pytest
import torch

from lit_domino.models import DFlash2Config, build_drafter, drafter_config
from lit_domino.models.base import DrafterMismatchError
from lit_domino.models.dflash2 import GroupedDynamicConv, training_candidates
from lit_domino.models.objectives import IGNORE_INDEX, LossSettings, position_weights
from lit_domino.testing import lively_dflash2_, random_target

B = 6
TOL = dict(rtol=1e-5, atol=1e-6)
HEAD = dict(rank=16, top_k=8, conv_kernel_size=2, conv_group_size=16)


@pytest.fixture(scope="module")
def target():
    return random_target(vocab_size=256, hidden_size=64, num_layers=4, seed=0)


def _drafter(target, seed=1, **head):
    torch.manual_seed(seed)
    d = build_drafter(drafter_config("dflash2", target, block_size=B, num_layers=2, head={**HEAD, **head}), target)
    return lively_dflash2_(d).train()


def _batch(target, b=2, T=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 250, (b, T), generator=g)
    feats = target.forward_features(ids, drafter_config("dflash2", target).feature_layers)
    loss_mask = torch.ones(b, T, dtype=torch.long)
    loss_mask[:, :8] = 0
    attn = torch.ones(b, T, dtype=torch.long)
    attn[-1, T - 6:] = 0
    loss_mask[-1, T - 6:] = 0
    anchors = torch.tensor([[8, 12, 20, 30, 35], [9, 14, 22, 0, 0]])[:b]
    return ids, feats, anchors, anchors > 0, loss_mask, attn


def test_config_refuses_bad_heads(target):
    with pytest.raises(ValueError, match="rank must be a positive integer"):
        drafter_config("dflash2", target, head=dict(rank=0))
    with pytest.raises(ValueError, match="rank must be a positive integer"):
        drafter_config("dflash2", target, head=dict(rank=-2))
    with pytest.raises(ValueError, match=r"top_k .* 1\.\.256 \(the vocabulary size\), got 257"):
        drafter_config("dflash2", target, head=dict(top_k=257))
    with pytest.raises(ValueError, match="conv_group_size must be a positive divisor of hidden_size"):
        drafter_config("dflash2", target, head=dict(conv_group_size=12))
    with pytest.raises(ValueError, match="conv_kernel_size must be an integer in 1..6"):
        drafter_config("dflash2", target, block_size=6, head=dict(conv_kernel_size=7))
    with pytest.raises(ValueError, match="at least 2"):
        drafter_config("dflash2", target, feature_layers=[3])
    with pytest.raises(DrafterMismatchError, match="last decoder layer"):
        build_drafter(drafter_config("dflash2", target, feature_layers=[1, 2]), target)


def test_convolution_is_identity_at_init_and_causal_within_blocks():
    conv = GroupedDynamicConv(32, block_size=4, kernel_size=3, group_size=8)
    y = torch.randn(2, 12, 32)
    out, delta = conv.prepare(y)
    torch.testing.assert_close(out, y)
    torch.testing.assert_close(conv.finish(y, delta), y)
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    out = conv.prepare(y)[0]
    # changing row 5 (block 1, position 1) moves rows 5, 6, 7 (taps 0..2 of that block) only
    y2 = y.clone()
    y2[:, 5] += 1.0
    moved = (conv.prepare(y2)[0] - out).abs().sum(-1).gt(0)[0]
    assert moved.nonzero().flatten().tolist() == [5, 6, 7]
    # by hand at row 6 (block position 2): Σ_τ y[6-τ] ⊙ (β[0, τ] + δ[6, τ] per group)
    d = conv.kernel_projection(y).view(2, 12, 2, 3, 4)[..., 0, :, :]
    ref = sum(y[:, 6 - t] * (conv.base_kernel[0, t] + d[:, 6, t].repeat_interleave(8, -1)) for t in range(3))
    torch.testing.assert_close(out[:, 6], ref, **TOL)


def test_fresh_drafter_is_a_dflash_backbone(target):
    """Identity convolutions: a fresh DFlash 2's unary logits are those of the backbone with its weights."""
    torch.manual_seed(0)
    d = build_drafter(drafter_config("dflash2", target, block_size=B, head=HEAD), target)
    bb = build_drafter(drafter_config("backbone", target, block_size=B,
                                      feature_layers=d.config.feature_layers[:-1]), target)
    state = {k: v for k, v in d.state_dict().items() if "conv" not in k and not k.startswith("selector")}
    bb.load_state_dict(state)
    batch = _batch(target)
    nd = d.config.num_features * target.hidden_size
    out = d.forward_train(*batch)
    ref = bb.forward_train(batch[0], batch[1][..., :nd], *batch[2:])
    torch.testing.assert_close(out.logits, ref.logits, **TOL)
    assert isinstance(d.config, DFlash2Config)


@pytest.mark.parametrize("chunk", [None, 5])
def test_lean_loss_equals_full_logits_loss(target, chunk):
    d = _drafter(target)
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
    assert set(g_lean) == set(g_full)
    assert {"selector.successor_codebook", "layers.0.attention_conv.kernel_projection.weight",
            "layers.1.mlp_conv.base_kernel"} <= set(g_full)
    for name in g_full:  # atol relative to the gradient's scale: threaded matmuls sum in another order on each path
        scale = float(g_full[name].abs().max())
        torch.testing.assert_close(g_lean[name], g_full[name], rtol=1e-4, atol=1e-4 * scale + 1e-8,
                                   msg=lambda m: f"{name}: {m}")
    # validation picks: the selector's teacher-forced choice on both paths
    out_full = d.forward_train(*batch, with_logits=True)
    out_lean = d.forward_train(*batch, with_logits=False)
    keep = out_full.labels != IGNORE_INDEX
    assert torch.equal(d.block_preds(out_lean, chunk)[keep], d.block_preds(out_full)[keep])


def test_objective_by_hand(target):
    """loss = Σ w·KL(p ‖ q_unary) / Σ w + α·Σ w·CE_c(selector scores, target argmax's slot) / Σ w."""
    d = _drafter(target)
    out = d.forward_train(*_batch(target))
    w = position_weights(B, 4.0)
    loss, logs = d.block_loss(out, LossSettings(w, chunk_size=None, selector_weight=0.5))
    keep = out.labels != IGNORE_INDEX
    U, H, prev = out.logits[keep], out.hidden[keep], out.head_state[keep]
    P = d.compute_logits(out.target_hidden[keep])
    kl = torch.nn.functional.kl_div(torch.log_softmax(U, -1), torch.softmax(P, -1), reduction="none").sum(-1)
    top = U.topk(8, -1).indices
    tgt = P.argmax(-1)
    sel = []
    for i in range(U.shape[0]):
        cand = top[i].clone()
        if tgt[i] not in cand:
            cand[-1] = tgt[i]
        ctx = d.selector.predecessor_codebook[prev[i]] * d.selector.hidden_projection(H[i])
        s = U[i, cand] + (ctx * d.selector.successor_codebook[cand]).sum(-1)
        sel.append(torch.nn.functional.cross_entropy(s[None], (cand == tgt[i]).nonzero()[0]))
    sel = torch.stack(sel)
    wk = w.expand_as(out.labels)[keep]
    ref = (kl * wk).sum() / wk.sum() + 0.5 * (sel * wk).sum() / wk.sum()
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    held = (top == tgt[:, None]).any(-1).float()
    torch.testing.assert_close(logs["candidate_recall"], (held * wk).sum() / wk.sum())


def test_training_candidates_inject_a_missing_target():
    cand = torch.tensor([[3, 1, 4], [5, 9, 2]])
    out, slot, held = training_candidates(cand, torch.tensor([1, 7]))
    assert out.tolist() == [[3, 1, 4], [5, 9, 7]] and slot.tolist() == [1, 2] and held.tolist() == [True, False]


def test_decode_chain_equals_teacher_forcing_on_its_picks(target):
    """The selector's chain fed its own picks gives the teacher-forced scores when the picks are the block's
    tokens (the greedy picks put back into the sequence)."""
    d = _drafter(target).eval()
    ids, feats, *_ = _batch(target, b=1)
    a, one, yes = 20, torch.tensor([[20]]), torch.tensor([[True]])
    with torch.no_grad():
        H = d.forward_train(ids, feats, one, yes).hidden[0, 0]  # [B, d]
        tokens, picks, cand, scores = d.selector.draft(H[1:], d.compute_logits(H[1:]), ids[0, a:a + 1])
        seq = ids.clone()
        seq[0, a + 1: a + B] = tokens
        out = d.forward_train(seq, feats, one, yes)
    dense = out.final_logits[0, 0, 1:]
    torch.testing.assert_close(dense.gather(-1, cand), scores, **TOL)
    assert torch.equal(tokens, dense.argmax(-1)) and torch.equal(cand.gather(-1, picks[:, None])[:, 0], tokens)
    # the chain really reads its predecessor: the unary argmax alone differs somewhere
    assert not torch.equal(tokens, d.compute_logits(H[1:]).argmax(-1))


def test_sliding_layers_config_errors(target):
    with pytest.raises(ValueError, match="sliding_layers must be distinct draft layer ids in 0..1"):
        drafter_config("dflash2", target, num_layers=2, sliding_layers=[2])
    with pytest.raises(ValueError, match="sliding_window must be None"):
        drafter_config("dflash2", target, sliding_layers=[0], sliding_window=0)


@pytest.mark.parametrize("non_causal", [True, False])
@pytest.mark.parametrize("static", [False, True])
def test_windowed_layers_decode_as_they_train(target, non_causal, static):
    """A session's block (dynamic or static cache) equals the training forward's at the same anchor with windowed
    layers (W = 3: the block sees 3 context positions), and the window changes it."""
    torch.manual_seed(1)
    cfg = drafter_config("dflash2", target, block_size=B, num_layers=2, head=HEAD, sliding_layers=[1],
                         sliding_window=3, sliding_non_causal=non_causal)
    d = lively_dflash2_(build_drafter(cfg, target)).eval()
    ids, feats, *_ = _batch(target, b=1)
    a = 20
    with torch.no_grad():
        trained = d.forward_train(ids, feats, torch.tensor([[a]]), torch.tensor([[True]])).hidden[0, 0]
        s = d.new_session(**({"static_capacity": 64} if static else {}))
        s.extend(ids[0, :a], feats[0, :a])
        s.draft(ids[0, a], B - 1)
        torch.testing.assert_close(s.stages[-1].hidden, trained, rtol=1e-4, atol=1e-5)
        full = build_drafter(cfg.replace(sliding_layers=[]), target).eval()
        full.load_state_dict(d.state_dict())
        assert not torch.allclose(full.forward_train(ids, feats, torch.tensor([[a]]), torch.tensor([[True]])).hidden,
                                  trained[None, None], atol=1e-3)


def test_windowed_flex_mask_equals_the_dense_one(target):
    torch.manual_seed(1)
    cfg = drafter_config("dflash2", target, block_size=B, num_layers=2, head=HEAD, sliding_layers=[0, 1],
                         sliding_window=4, sliding_non_causal=False)
    d = lively_dflash2_(build_drafter(cfg, target)).eval()
    batch = _batch(target)
    with torch.no_grad():
        dense = d.forward_train(*batch).hidden
        d.train_options.attention = "flex"
        flex = d.forward_train(*batch).hidden
    torch.testing.assert_close(flex, dense, rtol=1e-4, atol=1e-5)

"""ParallelDrafter: training mask, labels, and training == inference (session)."""

import pytest
import torch

from lit_domino.models import ParallelDrafter, build_drafter, drafter_config
from lit_domino.testing import random_target

B = 5


@pytest.fixture(scope="module")
def target():
    return random_target(vocab_size=256, hidden_size=64, num_layers=2, seed=0)


@pytest.fixture(scope="module")
def drafter(target):
    torch.manual_seed(1)
    cfg = drafter_config("backbone", target, num_layers=2, block_size=B, feature_layers=[0, 1])
    return build_drafter(cfg, target).eval()


def _batch(drafter, T=24, b=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 250, (b, T), generator=g)
    feats = torch.randn(b, T, drafter.config.num_features * drafter.config.hidden_size, generator=g)
    return ids, feats


def test_shapes_labels_and_block_tokens(drafter):
    ids, feats = _batch(drafter, T=12)
    loss_mask = torch.ones_like(ids)
    loss_mask[:, :4] = 0
    anchors = torch.tensor([[2, 9, 0], [5, 0, 0]])
    am = torch.tensor([[True, True, False], [True, False, False]])
    with torch.no_grad():
        out = drafter.forward_train(ids, feats, anchors, am, loss_mask)
    assert out.hidden.shape == (2, 3, B, 64) and out.logits.shape == (2, 3, B, 256)
    # anchor 2: positions 2..6; k=0 never a label; position 3 has loss_mask 0
    assert out.labels[0, 0].tolist() == [-100, -100, ids[0, 4].item(), ids[0, 5].item(), ids[0, 6].item()]
    # anchor 9 in T=12: positions 12, 13 are beyond the sequence
    assert out.labels[0, 1].tolist() == [-100, ids[0, 10].item(), ids[0, 11].item(), -100, -100]
    assert out.block_tokens[0, 1].tolist() == ids[0, 9:12].tolist() + [0, 0]
    assert (out.labels[0, 2] == -100).all() and (out.labels[1, 1:] == -100).all()
    assert torch.isfinite(out.hidden).all()  # masked-out anchors still attend to their own block


def test_training_mask_perturbations(drafter):
    ids, feats = _batch(drafter, T=24, b=1)
    anchors, am = torch.tensor([[6, 14]]), torch.ones(1, 2, dtype=torch.bool)

    def hidden(i, f):
        with torch.no_grad():
            return drafter.forward_train(i, f, anchors, am).hidden[0]

    ref = hidden(ids, feats)
    # features at positions >= a (a = 14 for block 1) do not change block 1
    f2 = feats.clone()
    f2[:, 14:] += 3.0
    torch.testing.assert_close(hidden(ids, f2)[1], ref[1], atol=0, rtol=0)
    # features at positions >= 6 DO change block 1 (positions 6..13 are its context) but not block 0
    f3 = feats.clone()
    f3[:, 6:14] += 3.0
    h3 = hidden(ids, f3)
    torch.testing.assert_close(h3[0], ref[0], atol=0, rtol=0)
    assert (h3[1] - ref[1]).abs().max() > 1e-3
    # a feature at a position < a changes the block
    f4 = feats.clone()
    f4[:, 3] += 3.0
    assert (hidden(ids, f4)[0] - ref[0]).abs().max() > 1e-3
    # another block's tokens (block 0's anchor token x_6) do not change block 1; block 1's own anchor token does
    i2 = ids.clone()
    i2[0, 6] = (i2[0, 6] + 1) % 250
    h5 = hidden(i2, feats)
    torch.testing.assert_close(h5[1], ref[1], atol=0, rtol=0)
    assert (h5[0] - ref[0]).abs().max() > 1e-4
    # tokens after the anchor (the labels) never enter
    i3 = ids.clone()
    i3[0, 15:] = 7
    torch.testing.assert_close(hidden(i3, feats), ref, atol=0, rtol=0)


def test_session_block_equals_training_forward(drafter):
    ids, feats = _batch(drafter, T=30, b=1)
    anchors = torch.tensor([[7, 12, 20]])
    with torch.no_grad():
        out = drafter.forward_train(ids, feats, anchors, torch.ones(1, 3, dtype=torch.bool))
    s = drafter.new_session()
    s.extend(ids[0, :4], feats[0, :4])  # context arrives in chunks
    s.extend(ids[0, 4:7], feats[0, 4:7])
    for j, a in enumerate([7, 12, 20]):
        s.crop(s.length)
        s.extend(ids[0, s.length:a], feats[0, s.length:a])
        assert s.length == a
        d = s.draft(ids[0, a], B - 1)
        assert all(len(c) == a for c in s.caches)  # only context K/V are cached, never the block
        torch.testing.assert_close(d.logits, out.logits[0, j, 1:], atol=1e-5, rtol=1e-5)
        assert d.tokens.tolist() == d.logits.argmax(-1).tolist()
        torch.testing.assert_close(d.logprobs, torch.log_softmax(d.logits, -1).gather(-1, d.tokens[:, None])[:, 0])
    # cropping back below what is cached recomputes correctly
    s.crop(12)
    d = s.draft(ids[0, 12], B - 1)
    torch.testing.assert_close(d.logits, out.logits[0, 1, 1:], atol=1e-5, rtol=1e-5)


def test_sampling_distributions_and_generator(drafter):
    ids, feats = _batch(drafter, T=10, b=1)
    draws = []
    for _ in range(2):
        s = drafter.new_session()
        s.extend(ids[0, :9], feats[0, :9])
        draws.append(s.draft(ids[0, 9], B - 1, temperature=0.7, generator=torch.Generator().manual_seed(3)))
    d = draws[0]
    assert d.probs.shape == (B - 1, 256)
    torch.testing.assert_close(d.probs, torch.softmax(d.logits / 0.7, -1))
    torch.testing.assert_close(d.logprobs, d.probs.gather(-1, d.tokens[:, None])[:, 0].log())
    assert d.tokens.tolist() == draws[1].tokens.tolist()


def test_dloop_stage_two_uses_stage_one_hidden(drafter):
    ids, feats = _batch(drafter, T=12, b=1)

    def run(perturb=None):
        s = drafter.new_session()
        s.extend(ids[0, :10], feats[0, :10])
        d1 = s.draft(ids[0, 10], B - 1)
        if perturb is not None:
            s.stages[-1].hidden[perturb] += 1.0
        d2 = s.draft(d1.tokens[-1], B - 1)
        return s, d1, d2

    s, d1, d2 = run()
    # stage 2 = a block at 10 + 4 whose context is [fused target features 0..9, stage-1 hidden 1..4]
    with torch.no_grad():
        ctx = torch.cat([drafter.fuse(feats[0, :10]), s.stages[0].hidden[1:]])[None]
        blk = torch.full((1, B), drafter.config.mask_token_id)
        blk[0, 0] = d1.tokens[-1]
        h = drafter.block_hidden(drafter.embed_tokens(blk), torch.arange(14, 14 + B), ctx, torch.arange(14))
        torch.testing.assert_close(d2.logits, drafter.compute_logits(h[0, 1:]), atol=1e-5, rtol=1e-5)
    # perturbing a stand-in (the hidden that predicted x_12, context at 11) changes stage 2, nothing of stage 1
    _, p1, p2 = run(perturb=2)
    torch.testing.assert_close(p1.logits, d1.logits, atol=0, rtol=0)
    assert (p2.logits - d2.logits).abs().max() > 1e-4
    # H_0 of stage 1 (the anchor's own hidden) stands in for nothing
    _, _, q2 = run(perturb=0)
    torch.testing.assert_close(q2.logits, d2.logits, atol=0, rtol=0)
    # crop drops the speculative stages: drafting again at 10 reproduces stage 1
    s.crop(10)
    torch.testing.assert_close(s.draft(ids[0, 10], B - 1).logits, d1.logits, atol=1e-6, rtol=1e-6)


def scripted_rounds(session, ids, feats):
    """Prompt longer than a block, rounds that commit 1..B tokens, a DLoop stage, a crop below the cached
    context, a short stage: each draft's logits."""
    out = []
    session.extend(ids[0, :9], feats[0, :9])
    for end in (10, 15, 17):
        out.append(session.draft(ids[0, session.length], B - 1).logits)
        session.crop(session.length)
        session.extend(ids[0, session.length:end], feats[0, session.length:end])
    d1 = session.draft(ids[0, 17], B - 1)
    out += [d1.logits, session.draft(d1.tokens[-1], B - 1).logits]  # DLoop: stage 2 on stage 1's hidden
    session.crop(12)
    session.extend(ids[0, 12:14], feats[0, 12:14])
    out.append(session.draft(ids[0, 14], 2).logits)
    return out


def test_static_session_drafts_what_the_dynamic_one_does(drafter):
    """The fixed-shape path (static K/V buffers, context padded to a block, slots past the block masked; what
    ``compile`` compiles) gives the growable-cache session's logits round after round."""
    ids, feats = _batch(drafter, T=30, b=1)
    want = scripted_rounds(drafter.new_session(), ids, feats)
    got = scripted_rounds(drafter.new_session(static_capacity=64), ids, feats)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    # padding rows sit past the block (an index_copy_ with repeated slots has no defined winner on a GPU)
    s = drafter.new_session(static_capacity=64)
    for cache in s.caches:
        cache._k.zero_()
    ctx = torch.ones(1, B, drafter.config.num_features * drafter.config.hidden_size)
    with torch.no_grad():
        drafter.block_step(torch.tensor([3]), torch.tensor([10, 8, 2, B]), ctx, s.caches, B, False)  # 2 rows at 8, 9
    written = s.caches[0]._k[0, 0].abs().sum(-1).nonzero().flatten().tolist()
    assert written == list(range(8, 18))  # context 8, 9; the block 10..14; its 3 padding rows at 15, 16, 17
    s = drafter.new_session(static_capacity=20)
    s.extend(ids[0, :14], feats[0, :14])
    with pytest.raises(ValueError, match="static draft cache holds 20 positions; a block ending at 19 needs 24"):
        s.draft(ids[0, 14], B - 1)
    with pytest.raises(ValueError, match="compile=True needs static_capacity"):
        drafter.new_session(compile=True)
    older, newer = drafter.new_session(static_capacity=64), drafter.new_session(static_capacity=64)
    for session in (older, newer):
        session.extend(ids[0, :4], feats[0, :4])
    newer.draft(ids[0, 4], B - 1)
    with pytest.raises(RuntimeError, match="a newer static session of this drafter now owns"):
        older.draft(ids[0, 4], B - 1)


def test_dloop_anchor_and_position_limit_errors(drafter):
    ids, feats = _batch(drafter, T=12, b=1)
    s = drafter.new_session()
    s.extend(ids[0, :10], feats[0, :10])
    d1 = s.draft(ids[0, 10], B - 1)
    with pytest.raises(ValueError, match="previous stage"):
        s.draft((int(d1.tokens[-1]) + 1) % 256, B - 1)
    with pytest.raises(ValueError, match="crop"):
        s.crop(11)
    s.crop(10)
    limit = drafter.config.max_position_embeddings
    with pytest.raises(ValueError, match="max_position_embeddings"):
        s.draft(ids[0, 10], limit)
    with pytest.raises(ValueError, match="features must be"):
        s.extend(ids[0, :2], feats[0, :3])


def test_gradients_reach_drafter_not_target(target, drafter):
    ids, feats = _batch(drafter, T=16, b=1)
    d = ParallelDrafter(drafter.config).bind_target(target).train()
    out = d.forward_train(ids, feats, torch.tensor([[3, 8]]), torch.ones(1, 2, dtype=torch.bool))
    out.logits.logsumexp(-1).mean().backward()
    assert d.fc.weight.grad.abs().sum() > 0 and d.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    assert target.embed.weight.grad is None
    assert not any(k.startswith(("embed", "lm_head")) for k in d.state_dict())
    assert d.num_parameters() == sum(p.numel() for p in d.parameters())


def test_a_deep_copy_gets_its_own_static_buffers(drafter):
    import copy

    from lit_domino.models.parallel_session import static_state

    s = drafter.new_session(static_capacity=32)
    twin = copy.deepcopy(drafter)
    t = twin.new_session(static_capacity=32)
    assert all(a._k is not b._k for a, b in zip(s.caches, t.caches))
    assert static_state(drafter)["owner"] is s and static_state(twin)["owner"] is t

"""The lean training step equals the full-logits one: losses and gradients (fp32, tight tolerance) of the
chunked, label-only losses of every method; flex block masks == dense masks; layer checkpointing; target
features without the LM head."""

import pytest
import torch

from lit_domino.models import build_drafter, drafter_config
from lit_domino.models.eagle import ttt_flex_mask, ttt_mask
from lit_domino.models.backbone import block_attention_mask, block_flex_mask
from lit_domino.models.loop import loop_forward
from lit_domino.models.objectives import IGNORE_INDEX, LossSettings, chunked_ce, position_weights, ttt_loss
from lit_domino.testing import random_target

B = 6
TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def target():
    return random_target(vocab_size=256, hidden_size=64, num_layers=4, seed=0)


def _drafter(target, kind, seed=1, **kw):
    torch.manual_seed(seed)
    d = build_drafter(drafter_config(kind, target, **kw), target).train()
    if kind == "domino":
        torch.nn.init.normal_(d.head.up.weight, std=0.3)  # a visible correction
    return d


def _batch(b=2, T=40, A=5, width=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 250, (b, T), generator=g)
    feats = torch.randn(b, T, width, generator=g)
    loss_mask = torch.ones(b, T, dtype=torch.long)
    loss_mask[:, :8] = 0  # a prompt
    attn = torch.ones(b, T, dtype=torch.long)
    attn[1, T - 6:] = 0  # a padded row
    loss_mask[1, T - 6:] = 0
    anchors = torch.randint(8, T - 2, (b, A), generator=g)
    anchors[0, -1] = T - 3  # a block running past the end
    anchor_mask = torch.ones(b, A, dtype=torch.bool)
    anchor_mask[1, 0] = False
    return ids, feats, loss_mask, attn, anchors, anchor_mask


def _grads(d):
    return {n: (p.grad.clone() if p.grad is not None else None) for n, p in d.named_parameters()}


def _run(d, fn):
    d.zero_grad(set_to_none=True)
    loss, parts = fn()
    loss.backward()
    return loss.detach(), {k: v.detach() for k, v in parts.items()}, _grads(d)


def _assert_same(ref, lean, every_grad=False):
    torch.testing.assert_close(lean[0], ref[0], **TOL)
    for k in ref[1]:
        torch.testing.assert_close(lean[1][k], ref[1][k], **TOL)
    for name, g in ref[2].items():
        if every_grad:
            assert g is not None and lean[2][name] is not None, f"{name} has no gradient"
        if g is None:
            assert lean[2][name] is None or not lean[2][name].any(), name
        else:
            torch.testing.assert_close(lean[2][name], g, **TOL, msg=lambda m: f"{name}: {m}")


def _parallel_step(d, batch, chunk, causal="teacher_forced", lam=0.0):
    ids, feats, lm, am, anchors, amask = batch
    settings = LossSettings(position_weights(B), lam=lam, chunk_size=chunk)
    d.train_options.chunk_size = chunk
    out = d.forward_train(ids, feats, anchors, amask, lm, am, causal, with_logits=chunk is None)
    assert (out.logits is None) == (chunk is not None)
    return d.block_loss(out, settings)


@pytest.mark.parametrize("chunk", [7, 1000])
def test_backbone_lean_equals_full(target, chunk):
    d = _drafter(target, "backbone", block_size=B, num_layers=2)
    batch = _batch()
    ref = _run(d, lambda: _parallel_step(d, batch, None))
    _assert_same(ref, _run(d, lambda: _parallel_step(d, batch, chunk)), every_grad=True)


@pytest.mark.parametrize("causal", ["teacher_forced", "training_time_test"])
@pytest.mark.parametrize("lam", [0.0, 0.5, 1.0])
def test_domino_lean_equals_full(target, causal, lam):
    d = _drafter(target, "domino", block_size=B, head=dict(rank=16, gru_hidden=32))
    batch = _batch()
    ref = _run(d, lambda: _parallel_step(d, batch, None, causal, lam))
    lean = _run(d, lambda: _parallel_step(d, batch, 7, causal, lam))
    _assert_same(ref, lean)
    if lam > 0:  # the backbone's base term in the loss
        assert lean[2]["layers.0.self_attn.q_proj.weight"].abs().sum() > 0
    if lam == 1.0:  # every parameter gets a gradient (zero for the head), which DDP needs
        for g in (ref[2], lean[2]):
            assert all(v is not None for v in g.values())
            assert not g["head.up.weight"].any() and not g["head.gru.weight_hh_l0"].any()
    else:
        assert lean[2]["head.up.weight"].abs().sum() > 0


def test_domino_lean_preds_equal_full(target):
    d = _drafter(target, "domino", block_size=B, head=dict(rank=16, gru_hidden=32)).eval()
    ids, feats, lm, am, anchors, amask = _batch()
    with torch.no_grad():
        full = d.forward_train(ids, feats, anchors, amask, lm, am)
        lean = d.forward_train(ids, feats, anchors, amask, lm, am, with_logits=False)
        ref, got = d.block_preds(full), d.block_preds(lean, chunk_size=5)
    valid = full.labels != IGNORE_INDEX
    assert torch.equal(got[valid], ref[valid]) and not got[~valid].any()
    assert torch.equal(ref, full.final_logits.argmax(-1))


def test_loop_stages_lean_equal_full(target):
    d = _drafter(target, "domino", block_size=B, head=dict(rank=16, gru_hidden=32))
    ids, feats, lm, am, anchors, amask = _batch(T=48)
    anchors = anchors.clamp(max=30)
    settings = lambda chunk: LossSettings(position_weights(B), lam=0.5, chunk_size=chunk)  # noqa: E731

    def step(chunk):
        outs = loop_forward(d, ids, feats, anchors, amask, 2, lm, am, with_logits=chunk is None)
        losses = [d.block_loss(o, settings(chunk))[0] for o in outs]
        return losses[0] + losses[1], {"stage2": losses[1]}

    _assert_same(_run(d, lambda: step(None)), _run(d, lambda: step(5)))


def test_eagle_lean_equals_full(target):
    d = _drafter(target, "eagle3", ttt_steps=3)
    ids, feats, lm, am, _, _ = _batch(width=3 * 64)

    def full():  # the full logits of every position of every step, then the TTT loss
        out = d.forward_train(ids, feats, lm, am, with_logits=True)
        loss, per_step = ttt_loss(out.logits, out.labels, 0.8)
        return loss, {f"s{i}": v for i, v in enumerate(per_step)}

    def lean(chunk):
        out = d.forward_train(ids, feats, lm, am, with_logits=False)
        loss, per_step, _ = d.train_loss(out, 0.8, chunk_size=chunk)
        return loss, {f"s{i}": v for i, v in enumerate(per_step)}

    ref = _run(d, full)
    _assert_same(ref, _run(d, lambda: lean(5)), every_grad=True)
    _assert_same(ref, _run(d, lambda: lean(None)))


def test_eagle_loop_stage_lean_equals_full(target):
    d = _drafter(target, "eagle3", ttt_steps=3, block_size=4)
    ids, feats, lm, am, anchors, amask = _batch(width=3 * 64)
    anchors = anchors.clamp(max=25)
    settings = lambda chunk: LossSettings(position_weights(4), chunk_size=chunk)  # noqa: E731

    def step(chunk):
        outs = loop_forward(d, ids, feats, anchors, amask, 2, lm, am, with_logits=chunk is None)
        return sum(d.block_loss(o, settings(chunk))[0] for o in outs), {}

    _assert_same(_run(d, lambda: step(None)), _run(d, lambda: step(3)))


def test_small_lm_lean_equals_full(target):
    d = _drafter(target, "small_lm")
    ids, _, lm, am, _, _ = _batch()

    def step(chunk):
        out = d.forward_train(ids, lm, am, with_logits=chunk is None)
        return d.train_loss(out, chunk), {}

    ref = _run(d, lambda: step(None))
    _assert_same(ref, _run(d, lambda: step(6)), every_grad=True)
    with torch.no_grad():
        full = d.forward_train(ids, lm, am)
        lean = d.forward_train(ids, lm, am, with_logits=False)
        keep = full.labels != IGNORE_INDEX
        assert torch.equal(d.next_token_preds(lean, 6)[keep], full.logits.argmax(-1)[keep])


def test_chunked_ce_without_rows_is_zero_and_attached():
    w = torch.randn(8, 4, requires_grad=True)
    x = torch.randn(0, 4)
    (total,), _ = chunked_ce(lambda h: (h @ w.T,), [x], torch.zeros(0, dtype=torch.long), torch.zeros(0), 3)
    total.backward()
    assert total.item() == 0.0 and w.grad is not None and not w.grad.any()


@pytest.mark.parametrize("kind", ["backbone", "domino"])
def test_layer_checkpointing_equal(target, kind):
    extra = dict(head=dict(rank=16, gru_hidden=32)) if kind == "domino" else {}
    d = _drafter(target, kind, block_size=B, num_layers=2, **extra)
    batch = _batch()
    ref = _run(d, lambda: _parallel_step(d, batch, 7, lam=0.5))
    d.train_options.checkpoint_layers = True
    _assert_same(ref, _run(d, lambda: _parallel_step(d, batch, 7, lam=0.5)), every_grad=True)


def test_eagle_checkpointing_equal(target):
    d = _drafter(target, "eagle3", ttt_steps=3)
    ids, feats, lm, am, _, _ = _batch(width=3 * 64)

    def step():
        return d.train_loss(d.forward_train(ids, feats, lm, am, with_logits=False), 0.8, chunk_size=5)[0], {}

    ref = _run(d, step)
    d.train_options.checkpoint_layers = True
    _assert_same(ref, _run(d, step), every_grad=True)


def test_small_lm_checkpointing_equal(target):
    d = _drafter(target, "small_lm")
    ids, _, lm, am, _, _ = _batch()

    def step():
        return d.train_loss(d.forward_train(ids, lm, am, with_logits=False), 6), {}

    ref = _run(d, step)
    d.train_options.checkpoint_layers = True
    _assert_same(ref, _run(d, step), every_grad=True)
    assert d.lm.is_activation_checkpointing


# --------------------------------------------------------------------------- flex attention (CPU: forward only)


def test_flex_masks_equal_dense_masks():
    T, A, Bk = 20, 3, 4
    anchors = torch.tensor([[5, 0, 17]])
    amask = torch.tensor([[True, False, True]])
    dense = block_attention_mask(anchors, amask, T, Bk)[0, 0]
    flex = block_flex_mask(anchors, amask, T, Bk)
    q = torch.arange(A * Bk)[:, None]
    kv = torch.arange(T + A * Bk)[None, :]
    got = flex.mask_mod(torch.zeros((), dtype=torch.long), torch.zeros((), dtype=torch.long), q, kv)
    assert torch.equal(got, dense)
    for s in range(3):
        m = ttt_flex_mask(7, s)
        q, kv = torch.arange(7)[:, None], torch.arange((s + 1) * 7)[None, :]
        assert torch.equal(m.mask_mod(0, 0, q, kv), ttt_mask(7, s)[0, 0])


@pytest.mark.parametrize("kind", ["backbone", "eagle3"])
def test_flex_forward_equals_dense(target, kind):
    extra = dict(ttt_steps=3) if kind == "eagle3" else dict(block_size=B, num_layers=2)
    d = _drafter(target, kind, **extra).eval()
    ids, feats, lm, am, anchors, amask = _batch(width=(3 if kind == "eagle3" else 1) * 64)
    feats = feats if kind == "eagle3" else feats[..., : d.config.num_features * 64]

    def fwd():
        with torch.no_grad():
            if kind == "eagle3":
                return torch.stack(d.forward_train(ids, feats, lm, am, with_logits=False).hidden)
            return d.forward_train(ids, feats, anchors, amask, lm, am, with_logits=False).hidden

    d.train_options.attention = "dense"
    dense = fwd()
    d.train_options.attention = "flex"
    torch.testing.assert_close(fwd(), dense, rtol=1e-5, atol=1e-5)


def test_flex_training_on_cpu_is_a_clear_error(target):
    d = _drafter(target, "backbone", block_size=B)
    d.train_options.attention = "flex"
    ids, feats, lm, am, anchors, amask = _batch()
    with pytest.raises(ValueError, match="flex cannot train on CPU"):
        d.forward_train(ids, feats, anchors, amask, lm, am, with_logits=False)
    d.train_options.attention = "auto"  # auto = dense on CPU
    d.forward_train(ids, feats, anchors, amask, lm, am, with_logits=False)


# --------------------------------------------------------------------------- target features


def test_target_features_skip_the_lm_head(target):
    ids = torch.randint(0, 250, (2, 12))
    calls = []
    hook = target.lm_head.register_forward_hook(lambda m, i, o: calls.append(o.shape))
    try:
        feats = target.forward_features(ids, [0, 2])
    finally:
        hook.remove()
    assert calls == []
    with torch.no_grad():
        ref = target.model(input_ids=ids, output_hidden_states=True).hidden_states
    torch.testing.assert_close(feats, torch.cat([ref[1], ref[3]], dim=-1), rtol=0, atol=0)


def test_compute_settings_are_not_in_a_drafters_cache_key():
    from lit_domino.training.experiment import training_key

    cfg = {"data": {"target": "embedded:smoke"}, "seed_everything": 0, "trainer": {},
           "model": {"class_path": "x", "init_args": {"lr": 1e-3, "loss_chunk_size": 1024, "attention": "auto",
                                                      "activation_checkpointing": False}}}
    other = {**cfg, "model": {"class_path": "x", "init_args": {"lr": 1e-3, "loss_chunk_size": None,
                                                               "attention": "dense", "activation_checkpointing": True}}}
    assert training_key(cfg) == training_key(other)
    assert training_key(cfg) != training_key({**cfg, "model": {"class_path": "x", "init_args": {"lr": 2e-3}}})

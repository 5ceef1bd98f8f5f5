"""Every objective on every drafter that selects one: the lean path (LM head on the labelled rows only, chunk by
chunk, recomputed in the backward pass) equals the full-logits path in loss, logs and every gradient; the plain
``ce`` objective *is* the backbone's, Domino's and EAGLE-3's own loss, bit for bit; EAGLE-3's chains are the
TTT steps as its decode reads them."""

import pytest
import torch

from lit_domino.models import build_drafter, drafter_config
from lit_domino.models.distill import block_starts, block_target_hidden
from lit_domino.models.objectives import LossSettings, build_objective, objective_names, position_weights
from lit_domino.models.objectives.blocks import chain_valid
from lit_domino.testing import random_target

B, V, D = 6, 96, 32
TOL = dict(rtol=1e-5, atol=1e-6)  # float32 sums in another order (chunks vs one pass)
VARIANTS = [{"name": "lk_lambda", "variant": "specforge"}, {"name": "lk_alpha", "variant": "specforge"},
            {"name": "dpace", "label": "target", "weight": "continuation"},
            {"name": "accept_until_fail", "position_decay": False},
            {"name": "expected_tau", "form": "log", "temperature": 2.0}]
"""Settings other than the defaults: on the backbone only (the code that differs is the objective's, not the
drafter's)."""

def _id(spec):
    return build_objective(spec).describe()


@pytest.fixture(scope="module")
def target():
    return random_target(vocab_size=V, hidden_size=D, num_layers=4, seed=0)


@pytest.fixture(scope="module")
def drafters(target):
    out = {}
    for kind, kw in [("backbone", {}), ("domino", {"head": {"rank": 8, "gru_hidden": 16}}), ("dspark", {}),
                     ("dflash2", {"head": {"top_k": 8}}), ("eagle3", {"ttt_steps": 3})]:
        torch.manual_seed(1)
        d = build_drafter(drafter_config(kind, target, block_size=B, **kw), target).train()
        with torch.no_grad():  # trained-looking: the heads change the logits, the picks are sometimes right
            for name, p in d.named_parameters():
                if p.dim() >= 2 and not name.startswith("fc"):
                    p.add_(torch.randn_like(p) * 0.2)
        out[kind] = d
    return out


def _batch(width, b=2, T=28, A=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V - 4, (b, T), generator=g)
    ids[:, 1::3] = ids[:, 0:-1:3]  # some repeats: greedy picks sometimes right
    feats = torch.randn(b, T, width, generator=g)
    lm = torch.ones(b, T, dtype=torch.long)
    lm[:, :5] = 0
    lm[1, 14] = 0  # a hole inside a block: a position without a label mid-block
    am = torch.ones(b, T, dtype=torch.long)
    am[1, T - 4:] = 0
    lm[1, T - 4:] = 0
    anchors = torch.randint(5, T - 3, (b, A), generator=g)
    anchors[0, -1] = T - 3  # a block running past the end
    amask = torch.ones(b, A, dtype=torch.bool)
    amask[1, 0] = False
    last = torch.randn(b, T, D, generator=g)  # the target's last hidden states (p) for the backbone and Domino
    return dict(input_ids=ids, features=feats, loss_mask=lm, attention_mask=am, anchors=anchors, anchor_mask=amask,
                last=last)


def _step(d, batch, objective, chunk, lam=0.0):
    d.zero_grad(set_to_none=True)
    d.train_options.chunk_size = chunk
    if d.config.kind == "eagle3":
        out = d.forward_train(batch["input_ids"], batch["features"], batch["loss_mask"], batch["attention_mask"],
                              with_logits=False)
        loss, _, _ = d.train_loss(out, 0.8, chunk_size=chunk, objective=objective)
        parts = {}
    else:
        out = d.forward_train(batch["input_ids"], batch["features"], batch["anchors"], batch["anchor_mask"],
                              batch["loss_mask"], batch["attention_mask"], with_logits=chunk is None)
        if getattr(out, "target_hidden", None) is None:  # what the module attaches (lit/objective.py)
            starts = block_starts(batch["anchors"], batch["anchor_mask"], batch["input_ids"].shape[1])
            out.target_hidden = block_target_hidden(batch["last"], starts, B)
        settings = LossSettings(position_weights(B), lam=lam, chunk_size=chunk, objective=objective)
        loss, parts = d.block_loss(out, settings)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in d.named_parameters() if p.grad is not None}
    return loss.detach(), {k: v.detach() for k, v in parts.items()}, grads


def _assert_same(full, lean):
    torch.testing.assert_close(lean[0], full[0], **TOL)
    assert lean[1].keys() == full[1].keys()
    for k in full[1]:
        torch.testing.assert_close(lean[1][k], full[1][k], **TOL, msg=lambda m: f"{k}: {m}")
    assert lean[2].keys() == full[2].keys() and full[2]
    for name, g in full[2].items():
        torch.testing.assert_close(lean[2][name], g, **TOL, msg=lambda m: f"{name}: {m}")


CASES = ([(kind, lam, name) for kind, lam in [("backbone", 0.0), ("domino", 0.4), ("dspark", 0.0), ("dflash2", 0.0),
                                             ("eagle3", 0.0)] for name in objective_names()
          if kind != "eagle3" or not build_objective(name).needs_target]  # EAGLE-3: refused (test_objectives_config)
         + [("backbone", 0.0, spec) for spec in VARIANTS] + [("domino", 0.0, "kl")])


@pytest.mark.parametrize("kind,lam,spec", CASES, ids=[f"{k}-{lam}-{_id(spec)}" for k, lam, spec in CASES])
def test_the_lean_path_equals_the_full_logits_path(drafters, kind, lam, spec):
    objective = build_objective(spec)
    d = drafters[kind]
    batch = _batch(len(d.config.feature_layers) * D)
    full = _step(d, batch, objective, None, lam)
    lean = _step(d, batch, objective, 5, lam)  # several chunks, a short last one
    _assert_same(full, lean)
    assert torch.isfinite(full[0])


@pytest.mark.parametrize("kind,lam", [("backbone", 0.0), ("domino", 0.0), ("domino", 0.4), ("eagle3", 0.0)])
@pytest.mark.parametrize("chunk", [None, 5])
def test_ce_is_the_methods_own_loss_bit_for_bit(drafters, kind, lam, chunk):
    d = drafters[kind]
    batch = _batch(len(d.config.feature_layers) * D)
    own = _step(d, batch, None, chunk, lam)
    ce = _step(d, batch, build_objective("ce"), chunk, lam)
    assert torch.equal(own[0], ce[0]) and own[1].keys() == ce[1].keys()
    assert all(torch.equal(own[2][n], ce[2][n]) for n in own[2])


def test_an_objective_without_p_trains_the_backbone_without_target_hidden(drafters):
    """Only an objective that needs p asks for the target's hidden states: CE-family ones run without them,
    and one that needs them says what is missing."""
    d = drafters["backbone"]
    batch = _batch(len(d.config.feature_layers) * D)
    out = d.forward_train(batch["input_ids"], batch["features"], batch["anchors"], batch["anchor_mask"],
                          batch["loss_mask"], batch["attention_mask"], with_logits=False)
    settings = LossSettings(position_weights(B), chunk_size=5, objective=build_objective("accept_until_fail"))
    assert torch.isfinite(d.block_loss(out, settings)[0])
    with pytest.raises(ValueError, match="'kl' needs the target's distribution p.*'dspark'"):
        d.block_loss(out, LossSettings(position_weights(B), chunk_size=5, objective=build_objective("kl")))


def test_eagle_chains_are_the_decode_layout(drafters):
    """chain_valid puts TTT step s at position m+s into chain m, slot s+1: the layout of the module's metrics
    (lit.eagle.chain_view), which is what a decode from m drafts."""
    from lit_domino.lit.eagle import chain_view

    d = drafters["eagle3"]
    batch = _batch(len(d.config.feature_layers) * D)
    out = d.forward_train(batch["input_ids"], batch["features"], batch["loss_mask"], batch["attention_mask"],
                          with_logits=False)
    _, labels = chain_view([torch.zeros_like(label) for label in out.labels], out.labels)
    assert torch.equal(chain_valid(out.labels), labels != -100)

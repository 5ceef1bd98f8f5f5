"""Fixtures of the interop tests: a lively random target (its greedy continuations vary) and trained-looking
drafters (random weights, Domino's W_up non-zero so the head changes the logits)."""

from __future__ import annotations

import pytest
import torch

from lit_domino.models import build_drafter, drafter_config
from lit_domino.testing import lively_target


@pytest.fixture(scope="module")
def target():
    return lively_target(vocab_size=128, hidden_size=32, num_layers=4, seed=0)


def lively(drafter, seed: int = 0, std: float = 0.3):
    """Redraw every matrix with a larger std (the default init drafts near-constant tokens)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    return drafter.eval()


@pytest.fixture(scope="module")
def backbone(target):
    return lively(build_drafter(drafter_config("backbone", target, block_size=8), target))


@pytest.fixture(scope="module")
def domino(target):
    return lively(build_drafter(drafter_config("domino", target, block_size=8, head={"rank": 8, "gru_hidden": 16}),
                                target), seed=1)


@pytest.fixture(scope="module")
def eagle(target):
    return lively(build_drafter(drafter_config("eagle3", target, block_size=6, feature_layers=[0, 1, 2]), target), seed=2)


def context(target, drafter, T: int = 12, seed: int = 0):
    """A random prompt [T] and its raw target features [T, n*d] for ``drafter``'s feature layers."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, target.vocab_size - 1, (T,), generator=g)
    feats = target.forward_features(ids[None], drafter.config.feature_layers)[0]
    return ids, feats


def fit(drafter, target, sequences: list[list[int]], steps: int = 120, lr: float = 3e-2, seed: int = 0):
    """A few hundred optimiser steps on target-greedy sequences, so the drafter accepts some drafts (a random
    drafter accepts none, which would make every τ equal to 1)."""
    from lit_domino.models.objectives import LossSettings, position_weights

    ids = torch.tensor(sequences)
    feats = target.forward_features(ids, drafter.config.feature_layers)
    T, B = ids.shape[1], drafter.config.block_size
    anchors = torch.arange(0, T - 1)[None].expand(ids.shape[0], -1)
    mask = torch.ones_like(anchors, dtype=torch.bool)
    settings = LossSettings(position_weights=position_weights(B), lam=0.0)
    opt = torch.optim.Adam(drafter.parameters(), lr=lr)
    torch.manual_seed(seed)
    drafter.train()
    for _ in range(steps):
        out = drafter.forward_train(ids, feats, anchors, mask)
        loss, _ = drafter.block_loss(out, settings)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return drafter.eval()

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

"""docs/ARCHITECTURE.md's "Adding a drafter method", followed from the recipe alone: a minimal method (a config, a
session and a registered drafter, its capabilities declared) decodes losslessly, and what it does not declare is
refused naming the capability and its kind."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from torch import nn

from lit_domino.decoding import DLoopConfig, TreeConfig, generate
from lit_domino.decoding.acceptance import NoAcceptancePredictor
from lit_domino.models import registry
from lit_domino.models.base import Drafter, DrafterConfig
from lit_domino.models.capabilities import Capabilities, capabilities_of
from lit_domino.models.sessions import ChainSession, Stage, StageDraft, draft_chain
from lit_domino.testing import lively_target

KIND = "bigram_recipe_test"


@dataclass
class BigramConfig(DrafterConfig):
    """A bigram drafter's config: the shared fields only; it reads no target features."""

    feature_rule: ClassVar[str | None] = None


class BigramSession(ChainSession):
    """Drafts token by token from the previous token alone (no cache to crop, no features kept)."""

    def _drop_stages(self) -> None:
        self.stages = []

    def _crop_to(self, length: int) -> None:
        pass  # a bigram keeps no state beyond the committed ids

    @torch.no_grad()
    def draft(self, anchor_token, num_tokens: int, temperature: float = 0.0, generator=None) -> StageDraft:
        start = self.stages[-1].start + self.stages[-1].tokens.numel() if self.stages else self._len
        anchor = self._check_draft(anchor_token, num_tokens, start)
        out = draft_chain(lambda prev: self.drafter.table(anchor if prev is None else prev), num_tokens,
                          temperature, generator)
        self.stages.append(Stage(start, out.tokens))
        return out


class BigramDrafter(Drafter):
    """Next-token logits from a table indexed by the previous token."""

    config_class = BigramConfig
    session_class = BigramSession

    def __init__(self, config: BigramConfig):
        super().__init__(config)
        self.table = nn.Embedding(config.vocab_size, config.vocab_size)


@pytest.fixture(scope="module")
def method():
    """The method registered for this module's tests (and unregistered after: other tests list the kinds)."""
    cls = registry.register(KIND)(BigramDrafter)
    yield cls
    registry.unregister(KIND)


@pytest.fixture(scope="module")
def target():
    return lively_target(128, max_positions=96)


def bigram_of(target, sequences: list[list[int]] = (), block_size: int = 5) -> BigramDrafter:
    """The drafter with random logits, sharpened towards each successor seen in ``sequences`` (the target's own
    greedy continuations): drafts that the target often, but not always, accepts."""
    torch.manual_seed(0)
    drafter = BigramDrafter(BigramConfig.from_target(target, block_size=block_size))
    with torch.no_grad():
        for seq in sequences:
            for a, b in zip(seq, seq[1:]):
                drafter.table.weight[a, b] += 10.0
    return drafter


def prompts(n: int = 3) -> list[list[int]]:
    g = torch.Generator().manual_seed(4)
    return [torch.randint(3, 120, (6,), generator=g).tolist() for _ in range(n)]


@pytest.mark.parametrize("dloop", [None, DLoopConfig(-2.0, 3)], ids=["plain", "dloop"])
def test_a_method_built_from_the_recipe_decodes_losslessly(method, target, dloop):
    plain = {tuple(p): generate(target, None, torch.tensor([p]), max_new_tokens=20) for p in prompts()}
    drafter = bigram_of(target, [list(p) + r.tokens for p, r in plain.items()])
    for p in prompts():
        spec = generate(target, drafter, torch.tensor([p]), max_new_tokens=20, dloop=dloop)
        assert spec.tokens == plain[tuple(p)].tokens
        assert spec.tau > 1.0  # drafts were accepted: the walk along the chain was exercised
    assert capabilities_of(drafter) == Capabilities(kind=KIND)  # it declared nothing beyond chain drafting


def test_what_the_method_does_not_declare_is_refused_naming_it(method, target):
    drafter, ids = bigram_of(target), torch.tensor([prompts(1)[0]])
    from lit_domino.decoding.tree import TreeError

    with pytest.raises(TreeError, match=f"a {KIND} drafter .*has no tree builder"):
        generate(target, drafter, ids, max_new_tokens=4, tree=TreeConfig("ddtree"))
    with pytest.raises(ValueError, match=f"'pool' capability.*this {KIND} drafter"):
        generate(target, drafter, ids, max_new_tokens=4, pool_size=8)
    with pytest.raises(NoAcceptancePredictor, match=f"this {KIND} drafter has no confidence head"):
        generate(target, drafter, ids, max_new_tokens=4, dloop=DLoopConfig(gate="conf", threshold=0.5))

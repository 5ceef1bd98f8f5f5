"""Domino at λ = 1 (the linear curriculum's step 0): every drafter parameter gets a gradient, so plain DDP
(``find_unused_parameters=False``) can reduce them; the head's is exactly zero, the maths unchanged."""

from __future__ import annotations

import pytest
import torch

from lit_domino.lit import DominoModule
from lit_domino.models import DominoHeadConfig
from lit_domino.models.objectives import LambdaSchedule, curriculum_loss
from lit_domino.testing import random_target

pytestmark = pytest.mark.usefixtures("one_thread")


def _batch(target, layers, n=2, T=20, prompt=5, A=3):
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, target.vocab_size, (n, T), generator=g)
    attention_mask = torch.ones(n, T, dtype=torch.long)
    loss_mask = (torch.arange(T)[None] >= prompt).long().expand(n, T).clone()
    anchors = torch.tensor([[5, 9, 13]]).expand(n, A).clone()
    with torch.no_grad():
        features = target.forward_features(input_ids, layers, attention_mask)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask, "features": features,
            "anchors": anchors, "anchor_mask": torch.ones(n, A, dtype=torch.bool)}


@pytest.mark.parametrize("causal", ["teacher_forced", "training_time_test"])
def test_lambda_one_gives_every_parameter_a_gradient(causal):
    target = random_target(vocab_size=48, hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1,
                           intermediate_size=32, max_positions=64, seed=0)
    module = DominoModule(target=target, head=DominoHeadConfig(rank=4, gru_hidden=8), num_layers=1, block_size=4,
                          causal_inputs=causal, curriculum=LambdaSchedule("constant", start=1.0))
    drafter = module.build_drafter([0, 1])
    out = module.forward_step(_batch(target, [0, 1]), "train")
    assert out.logs["lambda"] == 1.0
    assert float(out.loss) == pytest.approx(float(out.logs["loss_base"]))  # λ = 1: the base term only
    out.loss.backward()
    missing = [n for n, p in drafter.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"parameters without a gradient at λ = 1 (DDP would fail): {missing}"
    head = {n for n, _ in drafter.named_parameters() if n.startswith("head.")}
    assert head, "the Domino head has parameters"
    for n, p in drafter.named_parameters():
        if n in head:
            assert torch.count_nonzero(p.grad) == 0, f"{n}: the final term has weight 0 at λ = 1"
    assert any(torch.count_nonzero(p.grad) > 0 for n, p in drafter.named_parameters() if n not in head)


def test_curriculum_loss_at_lambda_one_keeps_the_final_graph():
    base = torch.randn(2, 3, 4, 7, requires_grad=True)
    final = torch.randn(2, 3, 4, 7, requires_grad=True)
    labels = torch.randint(0, 7, (2, 3, 4))
    labels[..., 0] = -100
    w = torch.tensor([0.0, 1.0, 0.5, 0.25])
    loss, loss_base, _ = curriculum_loss(base, final, labels, w, 1.0)
    loss.backward()
    assert torch.equal(loss, loss_base)
    assert final.grad is not None and torch.count_nonzero(final.grad) == 0
    assert torch.count_nonzero(base.grad) > 0

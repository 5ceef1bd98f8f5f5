"""Per-position accuracy, tau_sim and prefix acceptance."""

import pytest
import torch

from lit_domino.lit.metrics import PositionAccuracy, PrefixAcceptance, tau_sim
from lit_domino.models.objectives import IGNORE_INDEX

X = IGNORE_INDEX


def test_position_accuracy_counts_per_position():
    m = PositionAccuracy(4)
    labels = torch.tensor([[X, 5, 6, 7], [X, 5, 6, X]])
    preds = torch.tensor([[0, 5, 1, 7], [0, 5, 6, 3]])
    m.update(preds, labels)
    m.update(torch.nn.functional.one_hot(preds, 10).float(), labels)  # logits work too
    assert m.compute().tolist() == pytest.approx([1.0, 0.5, 1.0])


def test_tau_sim_formula():
    assert tau_sim([1.0, 1.0, 1.0]) == 4.0
    assert tau_sim([0.0, 1.0]) == 1.0
    assert tau_sim(torch.tensor([0.5, 0.5])) == pytest.approx(1 + 0.5 + 0.25)


def test_prefix_acceptance():
    m = PrefixAcceptance(4)
    labels = torch.tensor([[X, 1, 2, 3], [X, 1, 2, 3], [X, 1, X, X], [X, X, X, X]])
    preds = torch.tensor([[0, 1, 2, 3], [0, 1, 9, 3], [0, 1, 0, 0], [0, 0, 0, 0]])
    m.update(preds, labels)
    # runs 3, 1, 1 over three blocks (the last has no label at position 1)
    assert float(m.compute()) == pytest.approx(1 + 5 / 3)
    assert m.rates().tolist() == pytest.approx([1.0, 0.5, 1.0])


def test_metric_shape_errors():
    with pytest.raises(ValueError, match="block_size"):
        PositionAccuracy(1)
    with pytest.raises(ValueError):
        PositionAccuracy(4).update(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long))

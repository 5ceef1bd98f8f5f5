"""DLoopConfig validation, parsing and the gate."""

from __future__ import annotations

import math

import pytest

from lit_domino.decoding.dloop import DLoopConfig, dloop_label


def test_defaults_and_gate():
    cfg = DLoopConfig()
    assert (cfg.threshold, cfg.max_stages) == (-0.5, 3)
    assert cfg.should_continue(1, -0.2) and cfg.should_continue(2, -0.5)
    assert not cfg.should_continue(1, -0.51) and not cfg.should_continue(3, 0.0)
    assert DLoopConfig(float("-inf"), 2).should_continue(1, -1e9)
    assert not DLoopConfig(0.0, 1).should_continue(1, 0.0)  # one stage = plain speculative decoding


@pytest.mark.parametrize("kwargs,match", [
    (dict(threshold=0.1), "never positive"),
    (dict(threshold=math.inf), "never positive"),
    (dict(threshold=math.nan), "threshold"),
    (dict(threshold="x"), "threshold"),
    (dict(max_stages=0), "max_stages"),
    (dict(max_stages=2.5), "max_stages"),
])
def test_invalid_configs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DLoopConfig(**kwargs)


def test_parse_and_label():
    assert DLoopConfig.parse("off") is None and DLoopConfig.parse(None) is None
    assert DLoopConfig.parse("-0.5:3") == DLoopConfig(-0.5, 3)
    assert DLoopConfig.parse("-0.75") == DLoopConfig(-0.75, 3)
    assert dloop_label(DLoopConfig.parse("-0.75:2")) == "-0.75:2" and dloop_label(None) == "off"
    with pytest.raises(ValueError, match="never positive"):
        DLoopConfig.parse("0.5:2")
    with pytest.raises(ValueError, match="cannot parse"):
        DLoopConfig.parse("abc")


def test_gates_compute_their_confidence():
    import torch

    lp = torch.tensor([-0.1, -0.2, -0.3])
    assert DLoopConfig(gate="sum").confidence(lp) == pytest.approx(-0.6)
    assert DLoopConfig(gate="mean").confidence(lp) == pytest.approx(-0.2)
    assert DLoopConfig(gate="scaled").confidence(lp) == pytest.approx(-0.6 * 15 / 3)
    assert DLoopConfig(gate="last").confidence(lp) == pytest.approx(-0.3)
    # the same stage opens the mean gate at -0.25 but not the papers' sum gate
    assert DLoopConfig(-0.25, 3, "mean").should_continue(1, DLoopConfig(gate="mean").confidence(lp))
    assert not DLoopConfig(-0.25, 3, "sum").should_continue(1, DLoopConfig(gate="sum").confidence(lp))


@pytest.mark.parametrize("gate", ["sum", "mean", "scaled", "last"])
def test_a_gate_that_can_never_open_is_refused(gate):
    with pytest.raises(ValueError, match="never positive"):
        DLoopConfig(threshold=0.3, gate=gate)


def test_gate_parse_label_and_unknown_gate():
    assert DLoopConfig.parse("mean@-0.1:2") == DLoopConfig(-0.1, 2, "mean")
    assert DLoopConfig.parse("last@-1") == DLoopConfig(-1.0, 3, "last")
    assert DLoopConfig(-0.1, 2, "mean").label() == "mean@-0.1:2" and DLoopConfig(-0.5, 3).label() == "-0.5:3"
    with pytest.raises(ValueError, match="gate must be one of"):
        DLoopConfig.parse("median@-0.1:2")
    with pytest.raises(ValueError, match="never positive"):
        DLoopConfig.parse("last@0.2:2")

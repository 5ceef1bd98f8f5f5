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

"""The decode steps' compilation (lit_domino.models.sessions): a compiled bound method serves its own object only."""

from __future__ import annotations

import pytest
import torch

from lit_domino.decoding.engine import cpp_compiler
from lit_domino.models.sessions import compile_decode_step, own_code


class Scaled(torch.nn.Module):
    """A step whose traced graph bakes in a plain attribute (as a drafter's ``anchor_predicts`` or layer count)."""

    def __init__(self, times: int):
        super().__init__()
        self.times = times
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        for _ in range(self.times):
            x = self.proj(x)
        return x


def test_own_code_is_the_same_method_with_its_own_code():
    m = Scaled(2)
    step = own_code(m.forward)
    assert step.__self__ is m and step.__func__.__code__ is not Scaled.forward.__code__
    x = torch.randn(3, 4)
    torch.testing.assert_close(step(x), m(x), rtol=0, atol=0)
    assert own_code(torch.sin) is torch.sin  # not a bound method: unchanged


@pytest.mark.slow  # two inductor compiles
@pytest.mark.skipif(cpp_compiler() is None, reason="torch.compile on a CPU needs a C++ compiler")
def test_two_objects_of_one_class_never_replay_each_others_graphs():
    """The module guards are off (compile_decode_step): without a code object per object, the second module's
    call matched the first one's graph (same class, same input shapes) and ran its two layers instead of three."""
    torch.manual_seed(0)
    first, second = Scaled(2), Scaled(3)
    x = torch.randn(3, 4)
    with torch.no_grad():
        for m in (first, second):
            torch.testing.assert_close(compile_decode_step(m.forward, "cpu")(x), m(x), rtol=1e-5, atol=1e-6)

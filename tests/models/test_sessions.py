"""The decode steps' compilation (lit_domino.models.sessions): a compiled bound method serves its own object only."""

from __future__ import annotations

import pytest
import torch

from lit_domino.decoding.engine import cpp_compiler
from lit_domino.models.sessions import compile_decode_step, greedy_ids, own_code


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


def test_greedy_ids_pick_what_torch_argmax_picks():
    """The decode's greedy picks (NumPy's argmax on a CPU) equal torch's argmax index for index: the first of tied
    maxima, a NaN as the maximum, any stride and rank, ids of torch's dtype and shape."""
    g = torch.Generator().manual_seed(0)
    ties = torch.zeros(3, 6)
    ties[0, [2, 4]] = 1.0  # tied maxima: the first
    ties[1, [1, 3]] = float("nan")  # NaN beats every number: the first NaN
    ties[2] = -float("inf")
    cases = [torch.randn(4096, generator=g), torch.randn(8, 4096, generator=g), torch.randn(1, 8, 4096, generator=g),
             torch.randn(4096, 8, generator=g).t(), torch.randn(8, 8192, generator=g)[:, ::2], ties,
             torch.randn(8, 64, generator=g).half()]  # not float32: torch's own argmax
    for logits in cases:
        with torch.inference_mode():
            ids = greedy_ids(logits)
        expected = logits.argmax(-1)
        assert ids.dtype == expected.dtype and ids.shape == expected.shape
        assert torch.equal(ids, expected)

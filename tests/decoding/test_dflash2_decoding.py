"""DFlash 2 decodes losslessly through its selector: token identity with the target's greedy decode at T = 0
(the static-cache block forward, DLoop stages, forced acceptances, a shorter block) and the target's distribution
at T > 0 (chi-square on (x1, x2) with q the selector's softmax over its candidates, 0 elsewhere)."""

import pytest
import torch

from lit_domino.decoding import DLoopConfig, generate
from lit_domino.decoding.engine import cpp_compiler
from lit_domino.models.parallel_session import static_state
from lit_domino.models import build_drafter, drafter_config
from lit_domino.testing import (OracleMix, chi_square_target, exact_joint, hf_greedy, hf_greedy_and_reference,
                                lively_dflash2_, lively_target, passes_chi_square, sampled_pairs)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target():
    return lively_target(128, seed=0)


def _drafter(target, block_size=8, windows=None, **head):
    torch.manual_seed(0)
    cfg = drafter_config("dflash2", target, block_size=block_size, num_layers=1,
                         head=dict(rank=16, top_k=8, conv_group_size=8, **head), **(windows or {}))
    return lively_dflash2_(build_drafter(cfg, target), std=0.5, selector_std=2.0, seed=3)


@pytest.mark.parametrize("windows", [None, dict(sliding_layers=[0], sliding_window=3, sliding_non_causal=False)])
def test_dflash2_is_lossless_greedy(target, windows):
    d = _drafter(target, windows=windows)
    for i, p in enumerate([[5, 6, 7, 8], [9, 3, 4], [17, 2, 40, 41, 42]]):
        expected, ref = hf_greedy_and_reference(target, p, 20, 16)
        for opts in ({}, {"static_cache": True}, {"dloop": DLoopConfig(-4.0, 3)}, {"block_size": 4}):
            assert generate(target, d, torch.tensor([p]), max_new_tokens=20, **opts).tokens == expected, (i, opts)
        mixed = OracleMix(d, ref, seed=i)
        assert generate(target, mixed, torch.tensor([p]), max_new_tokens=20).tokens == expected


@pytest.mark.slow
def test_dflash2_sampling_is_distributed_as_the_target():
    target = chi_square_target()
    torch.manual_seed(0)
    d = lively_dflash2_(build_drafter(drafter_config("dflash2", target, block_size=3, num_layers=1,
                                            head=dict(rank=4, top_k=4, conv_group_size=4)), target),
                        std=1.0, selector_std=2.0, seed=3)
    prompt = [3, 5, 2, 6]
    counts, accepted = sampled_pairs(target, d, prompt, 2000, temperature=1.0)
    assert {0, 1} <= accepted  # rejections and acceptances both seen
    ok, stat = passes_chi_square(counts, exact_joint(target, prompt))
    assert ok, stat


def test_dflash2_sampling_q_is_the_selectors_softmax_over_its_candidates(target):
    """The stage's q is softmax(scores / T) on the unary top-k (0 elsewhere), the scores each token was sampled
    from; the drafted tokens are candidates and their log q is read on that pool."""
    d = _drafter(target)
    s = d.new_session()
    ids = torch.tensor([5, 6, 7, 8])
    s.extend(ids, target.forward_features(ids[None], d.config.feature_layers)[0])
    stage = s.draft(9, 7, temperature=0.7, generator=torch.Generator().manual_seed(1))
    finite = torch.isfinite(stage.logits)
    assert finite.sum(-1).tolist() == [8] * 7 and bool((stage.probs[~finite] == 0).all())
    torch.testing.assert_close(stage.probs, torch.softmax(stage.logits.float() / 0.7, -1))
    torch.testing.assert_close(stage.logprobs, stage.probs.log().gather(-1, stage.tokens[:, None])[:, 0])
    assert bool(finite.gather(-1, stage.tokens[:, None]).all())


# one xdist worker compiles every compiled-decode test (this group): dynamo keeps the target forward's graphs
# per process, and the tests of lively_target(128, seed=0) verify at the same widths
@pytest.mark.xdist_group("compiled-decode")
@pytest.mark.slow  # inductor compiles the target's verify widths and the drafter's block forward
@pytest.mark.skipif(cpp_compiler() is None, reason="torch.compile on a CPU needs a C++ compiler")
def test_compiled_dflash2_decodes_what_the_eager_one_does(target):
    """``compile=True``: the fixed-shape block forward (convolutions, windowed mask) compiled; greedy output is
    the target's, sampled output (same seed) the eager path's."""
    d = _drafter(target, block_size=4, windows=dict(sliding_layers=[0], sliding_window=3))
    p = [5, 6, 7, 8]
    assert generate(target, d, torch.tensor([p]), max_new_tokens=12, compile=True).tokens == hf_greedy(target, p, 12)
    eager, compiled = (generate(target, d, torch.tensor([p]), max_new_tokens=12, temperature=0.8, seed=1, compile=c)
                       for c in (False, True))
    assert eager.tokens == compiled.tokens and eager.accepted_per_round == compiled.accepted_per_round
    assert "compiled" in static_state(d)

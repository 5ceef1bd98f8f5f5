"""DSpark decodes losslessly: token identity with the target's greedy decode at T = 0 (every head type, both
anchor conventions, the static-cache block forward, DLoop stages, forced acceptances; the compiled path) and the
target's distribution at T > 0 (chi-square on (x1, x2) with the Markov head's q)."""

import pytest
import torch

from lit_domino.decoding import DLoopConfig, generate
from lit_domino.decoding.engine import cpp_compiler
from lit_domino.models.parallel_session import static_state
from lit_domino.models import build_drafter, drafter_config
from lit_domino.models.dspark import HEAD_TYPES
from lit_domino.testing import (OracleMix, chi_square_target, exact_joint, hf_greedy, hf_greedy_and_reference,
                                lively_target, passes_chi_square, sampled_pairs)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target():
    return lively_target(128, seed=0)


def _drafter(target, head_type, block_size=8, scale=1.0, **kw):
    torch.manual_seed(0)
    d = build_drafter(drafter_config("dspark", target, block_size=block_size, num_layers=1,
                                     head=dict(rank=16, head_type=head_type), **kw), target)
    with torch.no_grad():
        torch.nn.init.normal_(d.head.w2.weight, std=scale)  # a bias that changes the picks
    return d


@pytest.mark.parametrize("sample_from_anchor", [False, True])
@pytest.mark.parametrize("head_type", HEAD_TYPES)
def test_dspark_is_lossless_greedy(target, head_type, sample_from_anchor):
    d = _drafter(target, head_type, sample_from_anchor=sample_from_anchor)
    for i, p in enumerate([[5, 6, 7, 8], [9, 3, 4], [17, 2, 40, 41, 42]]):
        expected, ref = hf_greedy_and_reference(target, p, 20, 16)
        for opts in ({}, {"static_cache": True}, {"dloop": DLoopConfig(-4.0, 3)}, {"block_size": 4}, {"pool_size": 8}):
            assert generate(target, d, torch.tensor([p]), max_new_tokens=20, **opts).tokens == expected, (i, opts)
        mixed = OracleMix(d, ref, seed=i)
        assert generate(target, mixed, torch.tensor([p]), max_new_tokens=20).tokens == expected


@pytest.mark.parametrize("head_type,sample_from_anchor,pool_size", [("vanilla", False, None), ("rnn", False, None),
                                                                    ("rnn", True, None), ("gated", False, 3)])
def test_dspark_sampling_is_distributed_as_the_target(head_type, sample_from_anchor, pool_size):
    target = chi_square_target()
    torch.manual_seed(0)
    d = build_drafter(drafter_config("dspark", target, block_size=3, num_layers=1, sample_from_anchor=sample_from_anchor,
                                     head=dict(rank=4, head_type=head_type)), target)
    with torch.no_grad():  # a confident, sequence-dependent draft: q far from p, so rejections matter
        torch.nn.init.normal_(d.head.w1.weight, std=1.0)
        torch.nn.init.normal_(d.head.w2.weight, std=3.0)
    prompt = [3, 5, 2, 6]
    counts, accepted = sampled_pairs(target, d, prompt, 2000, temperature=1.0, pool_size=pool_size)
    assert {0, 1} <= accepted
    ok, stat = passes_chi_square(counts, exact_joint(target, prompt))
    assert ok, stat


def _stage(d, target, temperature=0.0, **options):
    s = d.new_session(**options)
    ids = torch.tensor([5, 6, 7, 8])
    s.extend(ids, target.forward_features(ids[None], d.config.feature_layers)[0])
    return s.draft(9, 7, temperature=temperature, generator=torch.Generator().manual_seed(1))


def test_dspark_pool_q_lives_on_the_pool(target):
    """At T > 0 with a pool, q is the softmax over each position's pool and 0 elsewhere (the pool's exactness on
    the logits: tests/models/test_dspark.py)."""
    d = _drafter(target, "gated", scale=0.3)
    full = _stage(d, target)
    assert torch.equal(full.tokens, _stage(d, target, pool_size=target.vocab_size).tokens)
    sampled = _stage(d, target, temperature=1.3, pool_size=5)
    assert ((sampled.probs > 0) == torch.isfinite(sampled.logits)).all() and (sampled.probs > 0).sum(-1).eq(5).all()
    torch.testing.assert_close(sampled.probs.sum(-1), torch.ones(7))
    torch.testing.assert_close(sampled.logprobs, sampled.probs.log().gather(-1, sampled.tokens[:, None])[:, 0])


def test_dspark_sampling_q_is_the_heads_corrected_softmax(target):
    """The stage's q is softmax(corrected logits / T) of the very logits each token was sampled from."""
    d = _drafter(target, "gated", scale=2.0)
    s = d.new_session()
    ids = torch.tensor([5, 6, 7, 8])
    layers = d.config.feature_layers
    s.extend(ids, target.forward_features(ids[None], layers)[0])
    stage = s.draft(9, 7, temperature=0.7, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(stage.probs, torch.softmax(stage.logits.float() / 0.7, -1))
    torch.testing.assert_close(stage.logprobs, stage.probs.log().gather(-1, stage.tokens[:, None])[:, 0])


# one xdist worker compiles every compiled-decode test (this group): dynamo keeps the target forward's graphs
# per process, and the tests of lively_target(128, seed=0) verify at the same widths
@pytest.mark.xdist_group("compiled-decode")
@pytest.mark.slow  # inductor compiles the target's verify widths, the block forward and the head loop: ~1 min
@pytest.mark.skipif(cpp_compiler() is None, reason="torch.compile on a CPU needs a C++ compiler")
def test_compiled_dspark_decodes_what_the_eager_one_does(target):
    """``compile=True``: the fixed-shape block forward and the Markov head's loop (``markov_block``) compiled;
    greedy output is the target's, sampled output (same seed) the eager path's, DLoop included."""
    for head_type, anchor in (("rnn", False), ("gated", True)):
        d = _drafter(target, head_type, block_size=4, sample_from_anchor=anchor)
        for i, p in enumerate([[5, 6, 7, 8], [9, 3, 4]]):
            dloop = DLoopConfig(-6.0, 2) if i else None
            assert generate(target, d, torch.tensor([p]), max_new_tokens=16, dloop=dloop,
                            compile=True).tokens == hf_greedy(target, p, 16), (head_type, i)
            eager, compiled = (generate(target, d, torch.tensor([p]), max_new_tokens=16, temperature=0.8, seed=i,
                                        dloop=dloop, compile=c) for c in (False, True))
            assert eager.tokens == compiled.tokens and eager.accepted_per_round == compiled.accepted_per_round
        assert "compiled" in static_state(d)
    from lit_domino.models import dspark
    assert dspark._COMPILED_MARKOV_BLOCK  # the head's compiled loop was made (and ran: the sessions call it)


def test_compile_hands_the_session_the_compiled_head_loop(target, monkeypatch):
    """``compile=True`` drafts through ``compiled_markov_block`` (``torch.compile`` stubbed by a recording
    wrapper, the block forward left eager): the same tokens as the eager session, every block through it."""
    from lit_domino.models import dspark, parallel_session

    calls = []

    def recording(device):
        def loop(*args):
            calls.append(args[0].shape[0])  # H's rows: K + 1
            return dspark.markov_block(*args)
        return loop

    monkeypatch.setattr(dspark, "compiled_markov_block", recording)
    monkeypatch.setattr(parallel_session, "compiled_block_step", lambda drafter: drafter.block_step)
    d = _drafter(target, "rnn", scale=2.0)
    ids = torch.tensor([5, 6, 7, 8])
    feats = target.forward_features(ids[None], d.config.feature_layers)[0]
    stages = []
    for options in ({"static_capacity": 64, "compile": True}, {}):
        s = d.new_session(**options)
        s.extend(ids, feats)
        first = s.draft(9, 7)
        stages.append((first.tokens, s.draft(first.tokens[-1], 7).tokens))  # a DLoop stage too
    assert calls == [8, 8]  # both stages of the compiled session, none of the eager one
    assert all(torch.equal(a, b) for a, b in zip(*stages))

"""Lossless decoding with the real drafters (random init) of every kind, through their real sessions."""

from __future__ import annotations

import pytest
import torch

from lit_domino.decoding import DLoopConfig, generate
from lit_domino.decoding.dloop import GATES
from lit_domino.decoding.engine import cpp_compiler
from lit_domino.models.parallel_session import static_state
from lit_domino.models import build_drafter, drafter_config, kinds
from lit_domino.testing import (OracleMix, chi_square_target, compiled_graph_count, exact_joint, hf_greedy,
                                hf_greedy_and_reference, lively_target, passes_chi_square, random_target, sampled_pairs)

KINDS = kinds()

VOCAB = 128
SMALL = dict(num_layers=1, head=dict(rank=16, gru_hidden=32))


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: threads only contend


def make_target(lively: bool, seed: int = 0):
    """``lively``: larger layer weights so greedy continuations vary (default init repeats the last token)."""
    if lively:
        return lively_target(VOCAB, seed=seed)
    target = random_target(vocab_size=VOCAB, hidden_size=32, num_layers=4, num_heads=4, num_kv_heads=2,
                           intermediate_size=64, max_positions=256, seed=seed)
    target.model.generation_config.eos_token_id = None
    return target


@pytest.fixture(scope="module")
def targets():
    return {"lively": make_target(True), "plain": make_target(False)}


@pytest.fixture(scope="module")
def greedy_references(targets):
    """``(which, prompt, n)`` -> Hugging Face's greedy ``n`` tokens and an OracleMix reference 3 stages of 15 longer,
    made once per target and prompt: the decode paths of one kind share their prompts."""
    made = {}

    def get(which, prompt, n):
        if (which, tuple(prompt), n) not in made:
            made[which, tuple(prompt), n] = hf_greedy_and_reference(targets[which], prompt, n, 3 * 15 + 1)
        return made[which, tuple(prompt), n]

    return get


def drafter_of(target, kind, block_size=8, seed=0):
    torch.manual_seed(seed)
    overrides = dict(SMALL) if kind == "domino" else dict(num_layers=1)
    return build_drafter(drafter_config(kind, target, block_size=block_size, **overrides), target)


def prompts(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB - 1, (int(torch.randint(3, 9, (), generator=g)),), generator=g).tolist()
            for _ in range(n)]


DECODE_PATHS = [(kind, {}) for kind in KINDS] + [("domino", {"pool_size": 4}), ("backbone", {"static_cache": True}),
                                                  ("domino", {"static_cache": True, "pool_size": 4})]
"""Every drafter kind with its default decoding, plus each decoding option's path (Domino's candidate pool; the
parallel drafters' fixed-shape block forward over static caches, the path ``compile`` compiles)."""


@pytest.mark.parametrize("kind,options", DECODE_PATHS, ids=lambda v: "-".join(f"{k}{x}" for k, x in v.items())
                         if isinstance(v, dict) else v)
def test_real_drafter_is_lossless_greedy(targets, greedy_references, kind, options):
    n = 20
    ps = prompts(20, seed=KINDS.index(kind))
    accepted = []
    for which, target in targets.items():
        drafter = drafter_of(target, kind, block_size=16)
        for i, p in enumerate(ps[:6] if which == "plain" else ps):
            expected, ref = greedy_references(which, p, n)
            block_size = (2, 4, 8, 16)[i % 4]
            gate = GATES[(i // 2) % len(GATES)]  # every gate (sum = the papers') on its share of the prompts
            dloop = DLoopConfig(threshold=-4.0 if i % 3 else float("-inf"), max_stages=3, gate=gate) if i % 2 else None
            res = generate(target, drafter, torch.tensor([p]), max_new_tokens=n, block_size=block_size, dloop=dloop,
                           **options)
            assert res.tokens == expected, (kind, which, i, block_size, dloop)
            accepted += res.accepted_per_round
            # with forced acceptances through the real session
            mixed = OracleMix(drafter, ref, seed=i)
            res = generate(target, mixed, torch.tensor([p]), max_new_tokens=n, block_size=block_size, dloop=dloop,
                           **options)
            assert res.tokens == expected, ("oracle-mix", kind, which, i, block_size, dloop)
            accepted += res.accepted_per_round
    assert 0 in accepted and max(accepted) >= 3


@pytest.mark.parametrize("kind", ["backbone", "domino", "eagle3", "small_lm"])
def test_real_drafter_sampling_runs_and_is_reproducible(targets, kind):
    target = targets["lively"]
    drafter = drafter_of(target, kind, block_size=4)
    p = torch.tensor([prompts(1, seed=99)[0]])
    a = generate(target, drafter, p, max_new_tokens=12, temperature=0.8, seed=5, dloop=DLoopConfig(-6.0, 2))
    b = generate(target, drafter, p, max_new_tokens=12, temperature=0.8, seed=5, dloop=DLoopConfig(-6.0, 2))
    assert a.tokens == b.tokens and len(a.tokens) == 12


# one xdist worker compiles every compiled-decode test (this group): dynamo keeps the target forward's graphs
# per process, and the tests of lively_target(128, seed=0) verify at the same widths
@pytest.mark.xdist_group("compiled-decode")
@pytest.mark.slow  # inductor compiles the target's verify widths and each drafter's block forward: ~1-2 min
@pytest.mark.skipif(cpp_compiler() is None, reason="torch.compile on a CPU needs a C++ compiler")
def test_compiled_parallel_drafters_decode_what_the_eager_ones_do(targets):
    """``compile=True`` on a CPU compiles the target's forward and the parallel drafters' fixed-shape block
    forward: greedy output is the target's, sampled output (same seed) the eager path's, DLoop included."""
    target = targets["lively"]
    for kind in ("backbone", "domino"):
        drafter = drafter_of(target, kind, block_size=4)
        for i, p in enumerate(prompts(2, seed=7)):
            dloop = DLoopConfig(-6.0, 2) if i else None
            assert generate(target, drafter, torch.tensor([p]), max_new_tokens=16, dloop=dloop,
                            compile=True).tokens == hf_greedy(target, p, 16), (kind, i)
            eager, compiled = (generate(target, drafter, torch.tensor([p]), max_new_tokens=16, temperature=0.8,
                                        seed=i, dloop=dloop, compile=c) for c in (False, True))
            assert eager.tokens == compiled.tokens and eager.accepted_per_round == compiled.accepted_per_round
        assert "compiled" in static_state(drafter)  # the drafter's compiled block forward ran
        # one graph whatever a stage's length (these decodes' last stages drafted 1, 2 and 3 tokens) and whether it
        # fuses context (a first stage) or not (DLoop's second): the backbone's one; Domino's greedy exact-head
        # rollout inside its step is a second (sampled stages pick outside it)
        assert compiled_graphs(drafter) == {"backbone": 1, "domino": 2}[kind]


def compiled_graphs(drafter) -> int:
    """The graphs dynamo compiled for ``drafter``'s block step."""
    (step,) = static_state(drafter)["compiled"].values()
    return compiled_graph_count(step)


def test_mismatched_real_drafter_is_rejected(targets):
    drafter = drafter_of(targets["lively"], "backbone")
    other = random_target(vocab_size=VOCAB + 8, hidden_size=32, num_layers=4, num_heads=4, num_kv_heads=2,
                          intermediate_size=64)
    with pytest.raises(ValueError, match="does not match"):
        generate(other, drafter, torch.tensor([[5, 6, 7]]), max_new_tokens=4)


@pytest.mark.parametrize("pool_size", [None, 3])
def test_real_domino_sampling_is_distributed_as_the_target(pool_size):
    """T > 0 with a real session's q (Domino: sequential picks inside the block): chi-square on (x1, x2);
    ``pool_size`` 3 of V = 8: q lives on the top-3 base candidates (zero elsewhere), the output still p."""
    target = chi_square_target()
    torch.manual_seed(0)
    cfg = drafter_config("domino", target, block_size=3, num_layers=1, head=dict(rank=8, gru_hidden=8))
    drafter = build_drafter(cfg, target)
    with torch.no_grad():  # a confident, wrong-ish draft: q far from p, so rejections matter
        drafter.head.up.weight.mul_(50.0)
    prompt = [3, 5, 2, 6]
    counts, accepted = sampled_pairs(target, drafter, prompt, 2000, temperature=1.0, pool_size=pool_size)
    assert {0, 1} <= accepted
    ok, stat = passes_chi_square(counts, exact_joint(target, prompt))
    assert ok, stat


def test_drafter_position_limit_is_checked_before_decoding(targets):
    target = targets["lively"]
    cfg = drafter_config("backbone", target, block_size=4, max_position_embeddings=32, num_layers=1)
    drafter = build_drafter(cfg, target)
    with pytest.raises(ValueError, match="drafter's max_positions 32"):
        generate(target, drafter, torch.tensor([[5, 6, 7]]), max_new_tokens=30)
    # the whole context (3 + 29 = 32) decodes: the last rounds draft less, the output is the target's
    prompt = torch.tensor([[5, 6, 7]])
    assert generate(target, drafter, prompt, max_new_tokens=29).tokens == generate(target, None, prompt,
                                                                                   max_new_tokens=29).tokens

"""The q-aware multi-draft walk (``TreeConfig(acceptance="multidraft", draw="sample")``, SpecTr / Sequoia without
replacement): the walk's law on synthetic two-level trees (exact with drawn children, biased with top-k ones: why
draw="top" is refused), chi-square through ``generate`` for every builder, token identity at T = 0, more accepted
tokens than the plain walk on one fixed tree, the spec format, and the refused requests."""

from __future__ import annotations

import pytest
import torch

import lit_domino.decoding.engine as engine
import lit_domino.decoding.tree as tree_mod
from lit_domino.decoding import DLoopConfig, TreeConfig, VerifyCost, generate
from lit_domino.decoding.tree import DraftTree, TreeError, walk, walk_multidraft
from lit_domino.decoding.tree_build import _draws
from lit_domino.models import build_drafter, drafter_config
from lit_domino.testing import (chi_square_target, exact_joint, lively_target, passes_chi_square,
                                sampled_pairs)
from tests.decoding.test_tree import drafter_of, greedy, prompt_of
from tests.decoding.test_tree_eagle import eagle_chi_target

pytestmark = pytest.mark.usefixtures("one_thread")


def two_level(p1, p2, q1, q2, k: int, generator, drawn: bool = True) -> tuple[DraftTree, torch.Tensor]:
    """A tree of k children below the root and k below each of them: drawn from q without replacement (or the
    top-k of q), with q rows and target logits from the tables p1 [V], p2 [V, V] (p2[x] = p(. | x))."""
    V = p1.numel()

    def kids(q):
        return _draws(q.log()[None], k, generator)[0].tolist() if drawn else q.topk(k).indices.tolist()

    tokens, parents, depths, ranks, rows, qs = [], [], [], [], [p1], [q1]
    for r, x in enumerate(kids(q1)):
        tokens.append(x), parents.append(0), depths.append(1), ranks.append(r)
        rows.append(p2[x]), qs.append(q2[x])
    for c in range(1, k + 1):
        x = tokens[c - 1]
        for r, y in enumerate(kids(q2[x])):
            tokens.append(y), parents.append(c), depths.append(2), ranks.append(r)
            rows.append(torch.full((V,), 1.0 / V)), qs.append(torch.zeros(V))
    tree = DraftTree(tokens, parents, depths, ranks, q=torch.stack(qs))
    return tree, torch.stack(rows).log()


def tables(V: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    sharp = lambda *shape: torch.softmax(2.0 * torch.randn(*shape, generator=g), -1)  # noqa: E731
    return sharp(V), sharp(V, V), sharp(V), sharp(V, V)


def walk_law(p1, p2, q1, q2, k, n, drawn=True, seed=0):
    """Counts of the first two tokens over n trees and walks (T = 1), and the mean accepted length."""
    V = p1.numel()
    g = torch.Generator().manual_seed(seed)
    counts, acc = torch.zeros(V, V, dtype=torch.double), 0
    for _ in range(n):
        tree, logits = two_level(p1, p2, q1, q2, k, g, drawn)
        path, committed = walk_multidraft(tree, logits, 1.0, g)
        if len(committed) == 1:  # the bonus at the root: x2 is the next round's, a plain sample of p(. | x1)
            committed.append(int(torch.multinomial(p2[committed[0]], 1, generator=g)))
        counts[committed[0], committed[1]] += 1
        acc += len(path)
    return counts, acc / n


def test_multidraft_walk_has_the_target_law_on_drawn_trees():
    """Drawn children (without replacement, tried in draw order, the residual after each rejection): the first
    two tokens are distributed as p(x1) p(x2 | x1), through accepted children, rejected ones and the bonus."""
    p1, p2, q1, q2 = tables(5, 0)
    counts, acc = walk_law(p1, p2, q1, q2, k=2, n=6000)
    ok, stat = passes_chi_square(counts, p1[:, None] * p2)
    assert ok, stat
    assert 0.1 < acc < 1.9  # children accepted and rejected


def test_multidraft_on_top_k_children_is_biased():
    """The same rule on deterministic top-k children misses the law by far: why draw='top' is refused."""
    p1, p2, q1, q2 = tables(5, 0)
    counts, _ = walk_law(p1, p2, q1, q2, k=2, n=6000, drawn=False)
    ok, stat = passes_chi_square(counts, p1[:, None] * p2)
    assert not ok and stat > 100, stat
    with pytest.raises(TreeError, match="needs draw='sample'.*exact only if the children were drawn from q"):
        TreeConfig("eagle", acceptance="multidraft")


def test_multidraft_walk_accepts_more_than_the_plain_walk_on_one_tree(monkeypatch):
    """One fixed drawn tree per drafter (the first round of a real decode at T = 1), walked 600 times by each
    rule: the q-aware walk accepts more tokens per round (the plain walk needs the target's sample itself to be
    a child)."""
    target = lively_target(128, max_positions=96)
    torch.manual_seed(0)
    eagle = build_drafter(drafter_config("eagle3", target, block_size=6, num_layers=1), target)
    for name, drafter, tree in (("eagle3", eagle, TreeConfig("eagle", budget=16, top_k=4, draw="sample")),
                                ("domino", drafter_of(target, "domino"),
                                 TreeConfig("path", budget=16, top_k=4, draw="sample")),
                                ("backbone", drafter_of(target, "backbone"),
                                 TreeConfig("ddtree", budget=16, top_k=4, draw="sample"))):
        seen = []
        real = tree_mod.walk

        def capture(t, logits, temperature, generator):
            seen.append((t, logits.clone()))
            return real(t, logits, temperature, generator)

        monkeypatch.setattr(tree_mod, "walk", capture)
        generate(target, drafter, torch.tensor([prompt_of(3)]), max_new_tokens=10, temperature=1.0, seed=0,
                 tree=tree)
        monkeypatch.setattr(tree_mod, "walk", real)
        fixed, logits = seen[0]
        assert fixed.q is not None and len(fixed) == 16
        g = torch.Generator().manual_seed(1)
        plain = sum(len(walk(fixed, logits, 1.0, g)[0]) for _ in range(600)) / 600
        multi = sum(len(walk_multidraft(fixed, logits, 1.0, g)[0]) for _ in range(600)) / 600
        assert multi > plain + 0.05, (name, plain, multi)


@pytest.mark.parametrize("kind,builder", [("domino", "chain"), ("backbone", "ddtree"), ("domino", "path"),
                                          ("dspark", "path")])
def test_multidraft_is_greedy_decoding_at_t0(kind, builder):
    target = lively_target(128, max_positions=96)
    drafter = drafter_of(target, kind)
    prompt = prompt_of(5)
    res = generate(target, drafter, torch.tensor([prompt]), max_new_tokens=20,
                   tree=TreeConfig(builder, budget=10, top_k=3, acceptance="multidraft", draw="sample"))
    assert res.tokens == greedy(target, prompt, 20)


@pytest.mark.slow
def test_multidraft_sampling_is_distributed_as_the_target():
    """T > 0 through ``generate``: chi-square on (x1, x2) for the sampled chain (speculative sampling), the drawn
    DDTree on a backbone, the drawn path tree on Domino (over the vocabulary and over a candidate pool of half
    of it: q is the pool's, 0 outside) and on DSpark over a pool (its Markov head's pooled path head), and the
    drawn EAGLE tree on EAGLE-3."""
    prompt = [3, 5, 2, 6]
    small, deep = chi_square_target(), eagle_chi_target()
    laws = {id(small): exact_joint(small, prompt), id(deep): exact_joint(deep, prompt)}
    for kind, builder, pool in (("backbone", "chain", None), ("backbone", "ddtree", None), ("domino", "path", None),
                                ("domino", "path", 4), ("dspark", "path", 4), ("eagle3", "eagle", None)):
        target = deep if kind == "eagle3" else small
        law = laws[id(target)]
        torch.manual_seed(0)
        over = dict(head=dict(rank=8, gru_hidden=8)) if kind == "domino" else {}
        drafter = build_drafter(drafter_config(kind, target, block_size=3, num_layers=1, **over), target)
        tree = TreeConfig(builder, budget=8, top_k=3, acceptance="multidraft", draw="sample")
        counts, accepted = sampled_pairs(target, drafter, prompt, 1200, temperature=1.0, tree=tree, pool_size=pool)
        assert max(accepted) >= 1
        ok, stat = passes_chi_square(counts, law)
        assert ok, (kind, builder, pool, stat)


def test_spec_format_round_trips_and_bad_specs_are_refused():
    for cfg in (TreeConfig("chain", budget=5), TreeConfig("ddtree", budget=32, top_k=4),
                TreeConfig("eagle", budget=24, top_k=6, draw="sample"),
                TreeConfig("path", budget=16, top_k=2, draw="sample", acceptance="multidraft")):
        assert TreeConfig.parse(cfg.label()) == cfg
    assert TreeConfig.parse("eagle:32k4").label() == "eagle:32k4"
    assert TreeConfig.parse("chain") == TreeConfig("chain")
    assert TreeConfig.parse("ddtree:64").top_k == TreeConfig().top_k
    for bad, match in (("beam:4", "builder must be one of"), ("ddtree:x4", "expected builder"),
                       ("ddtree:32k4+cost", "unknown flag \\+cost"), ("eagle:0", "budget must be")):
        with pytest.raises(TreeError, match=match):
            TreeConfig.parse(bad)


def test_bad_multidraft_requests_fail_before_decoding(monkeypatch):
    target = lively_target(128, max_positions=96)
    prompt = torch.tensor([prompt_of(1)])
    calls = []
    monkeypatch.setattr(engine, "decode", lambda *a, **k: calls.append(1))
    for acceptance, draw in (("greedy", "sample"), ("sample", "random")):
        with pytest.raises(TreeError, match="acceptance must be one of|draw must be one of"):
            TreeConfig("ddtree", acceptance=acceptance, draw=draw)
    flat = VerifyCost((1, 64), (1.0, 1.0))
    with pytest.raises(TreeError, match="cost with acceptance='multidraft' works with builder='ddtree' only"):
        TreeConfig("path", cost=flat, acceptance="multidraft", draw="sample")
    TreeConfig("ddtree", cost=flat, acceptance="multidraft", draw="sample")  # DDTree's shape ignores the draws
    domino = drafter_of(target, "domino")
    with pytest.raises(TreeError, match="'multidraft' with DLoop is not supported"):
        generate(target, domino, prompt, max_new_tokens=4, dloop=DLoopConfig(float("-inf"), 2),
                 tree=TreeConfig("path", acceptance="multidraft", draw="sample"))
    assert not calls

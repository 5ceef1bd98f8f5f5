"""EAGLE-2's dynamic draft tree on the EAGLE-3 drafter (``TreeConfig("eagle")``): lossless at T = 0 (planted
branches through every rank, both caches, the end of the context) and at T > 0 (chi-square), the tree is EAGLE-2's
(each expanded node's children are the top-k of the drafter's step on that node's own path, at most k expanded
per depth, the best candidates kept), and the requests a drafter cannot serve are refused before decoding."""

from __future__ import annotations

import pytest
import torch

import lit_domino.decoding.engine as engine
import lit_domino.decoding.tree as tree_mod
from lit_domino.decoding import DLoopConfig, TreeConfig, generate
from lit_domino.decoding.tree import TreeError
from lit_domino.models import build_drafter, drafter_config
from lit_domino.testing import exact_joint, lively_target, passes_chi_square, random_target, sampled_pairs
from tests.decoding.test_tree import greedy, oracle_trees, prompt_of

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 128


@pytest.fixture(scope="module")
def target():
    return lively_target(VOCAB, max_positions=96)


def eagle_of(target, block_size=6, seed=0):
    torch.manual_seed(seed)
    drafter = build_drafter(drafter_config("eagle3", target, block_size=block_size, num_layers=1), target)
    with torch.no_grad():  # sharper, path-dependent steps: the branches differ from one another
        for p in drafter.self_attn.parameters():
            p.mul_(3.0)
    return drafter


def session_and_features(drafter, prompt: list[int], seed: int | None = None):
    """A session over ``prompt`` with random target features (seeded when ``seed`` is given), and the features."""
    if seed is not None:
        torch.manual_seed(seed)
    feats = torch.randn(len(prompt), drafter.config.num_features * 32)
    session = drafter.new_session()
    session.extend(torch.tensor(prompt), feats)
    return session, feats


def session_with(drafter, prompt: list[int]):
    return session_and_features(drafter, prompt)[0]


def path_of(tree, u: int) -> list[int]:
    out = []
    while u:
        out.append(tree.tokens[u - 1])
        u = tree.parents[u - 1]
    return out[::-1]


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize("builder", ["eagle", "path", "chain"])
def test_eagle_trees_are_lossless_greedy(target, monkeypatch, builder, static):
    """Token identity with greedy decoding, branches of every rank accepted (the target's continuation planted
    on a random branch), in the middle and at the very end of the context (smaller last trees)."""
    drafter = eagle_of(target)
    ranks, accepted = set(), set()
    for seed, (length, n) in enumerate([(6, 30), (40, 96 - 40)]):
        prompt = prompt_of(seed, length)
        ref = greedy(target, prompt, n)
        oracle_trees(monkeypatch, prompt + ref, seed=seed)
        res = generate(target, drafter, torch.tensor([prompt]), max_new_tokens=n, static_cache=static,
                       tree=TreeConfig(builder, budget=16 if builder != "chain" else 5, top_k=3))
        assert res.tokens == ref, (builder, seed)
        ranks.update(res.accepted_ranks), accepted.update(res.accepted_per_round)
    assert max(accepted) >= 3
    if builder != "chain":
        assert {0, 1} <= ranks


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_eagle_chain_tree_with_dloop_is_lossless(target, monkeypatch, static):
    """DLoop on EAGLE-3 with the chain tree: its chain stages while the gate is open, the last one the tree."""
    drafter = eagle_of(target)
    prompt = prompt_of(2, 10)
    ref = greedy(target, prompt, 40)
    oracle_trees(monkeypatch, prompt + ref, seed=2)
    res = generate(target, drafter, torch.tensor([prompt]), max_new_tokens=40, static_cache=static,
                   dloop=DLoopConfig(float("-inf"), 3), tree=TreeConfig("chain", budget=5))
    assert res.tokens == ref and max(res.drafted_per_round) > 5 and max(res.accepted_per_round) >= 3


def test_real_eagle_trees_without_planting(target):
    """The real builders alone at T = 0, a sampled decode reproducible per seed (the plain walk and the drawn
    multi-draft one), and the eagle chain through the tree path equal to the chain engine."""
    drafter = eagle_of(target)
    prompt = prompt_of(7)
    ref = greedy(target, prompt, 20)
    chain = generate(target, drafter, torch.tensor([prompt]), max_new_tokens=20)
    via = generate(target, drafter, torch.tensor([prompt]), max_new_tokens=20, tree=TreeConfig("chain", budget=5))
    assert via.tokens == chain.tokens == ref and via.accepted_per_round == chain.accepted_per_round
    for tree in (TreeConfig("eagle", budget=12, top_k=3), TreeConfig("path", budget=12, top_k=3),
                 TreeConfig("eagle", budget=12, top_k=3, draw="sample", acceptance="multidraft")):
        assert generate(target, drafter, torch.tensor([prompt]), max_new_tokens=20, tree=tree).tokens == ref
        a, b = (generate(target, drafter, torch.tensor([prompt]), max_new_tokens=12, tree=tree, temperature=0.8,
                         seed=3).tokens for _ in range(2))
        assert a == b


def reference_logits(drafter, prompt, feats, anchor: int, path: list[int]) -> torch.Tensor:
    """The drafter's logits after ``anchor`` + ``path`` as a plain chain (one step at a time, no tree mask)."""
    session = drafter.new_session()
    session.extend(torch.tensor(prompt), feats)
    h, start = session._root_step(torch.tensor([anchor]), len(path) + 1)
    for i, tok in enumerate(path):
        h = drafter.step(drafter.embed_tokens(torch.tensor([[tok]])), h, torch.tensor([start + i + 1]), None,
                         session.cache)
    return drafter.compute_logits(h[0, -1])


def test_eagle_tree_is_eagle2(target):
    """Each expanded node's children are the top-k of the drafter's own step on that node's path (the batched
    tree-masked step equals the plain chain), at most k nodes are expanded per depth (EAGLE-2's frontier), the
    kept nodes are the best candidates by cumulative log-probability, parents before children; top_k = 1 is the
    session's own greedy chain; and ``path`` (the frontier of n) is at least as likely in total."""
    drafter = eagle_of(target, block_size=6)
    prompt, anchor = prompt_of(4, 9), 11
    with torch.inference_mode():
        s, feats = session_and_features(drafter, prompt, seed=1)
        tree = tree_mod.build_tree(TreeConfig("eagle", budget=14, top_k=3), s, torch.tensor([anchor]), 5, 14, 0.0,
                                   None)
        assert s.stages  # the tree's steps are speculative: dropped by the next crop
        s.crop(9)
        assert len(s.cache) == 8
        path_tree = tree_mod.build_tree(TreeConfig("path", budget=14, top_k=3), s, torch.tensor([anchor]), 5, 14,
                                        0.0, None)
        s.crop(9)
        chain = s.draft(torch.tensor([anchor]), 5).tokens.tolist()
        s.crop(9)
        one = tree_mod.build_tree(TreeConfig("eagle", budget=5, top_k=1), s, torch.tensor([anchor]), 5, 5, 0.0, None)
        assert one.tokens == chain and one.parents == list(range(5))
        scores, dropped = {}, []
        for u in range(len(tree) + 1):
            logq = torch.log_softmax(reference_logits(drafter, prompt, feats, anchor, path_of(tree, u)).float(), -1)
            kids = [i + 1 for i, p in enumerate(tree.parents) if p == u]
            if kids:  # an expanded node: its other top-k children were candidates, reranked out
                top = logq.topk(3)
                assert {tree.tokens[c - 1] for c in kids} <= set(top.indices.tolist()), u
                for c in kids:
                    assert tree.ranks[c - 1] == top.indices.tolist().index(tree.tokens[c - 1])
                dropped += [scores.get(u, 0.0) + float(v) for v, t in zip(top.values, top.indices)
                            if int(t) not in {tree.tokens[c - 1] for c in kids}]
            for c in kids:
                scores[c] = scores.get(u, 0.0) + float(logq[tree.tokens[c - 1]])
    assert all(p < i + 1 for i, p in enumerate(tree.parents))
    per_depth = {}
    for i, p in enumerate(tree.parents):
        per_depth.setdefault(tree.depths[i] - 1, set()).add(p)
    assert all(len(parents) <= 3 for parents in per_depth.values())  # frontier of k
    assert max(tree.depths) >= 3 and max(tree.ranks) >= 1 and len(tree) == 14
    assert dropped and min(scores.values()) >= max(dropped) - 1e-5  # the best candidates kept
    assert len(path_tree) == 14 and max(path_tree.depths) >= 2


def test_eagle_path_tree_is_the_best_first_tree(target):
    """``path`` on EAGLE-3: the 10 best of every path of top-3 children, 3 deep, each scored by the plain chain."""
    drafter = eagle_of(target, block_size=4)
    prompt, anchor = prompt_of(5, 7), 13
    with torch.inference_mode():
        s, feats = session_and_features(drafter, prompt, seed=2)
        tree = tree_mod.build_tree(TreeConfig("path", budget=10, top_k=3), s, torch.tensor([anchor]), 3, 10, 0.0,
                                   None)
        scores = {}

        def expand(path, score):
            if len(path) == 3:
                return
            logq = torch.log_softmax(reference_logits(drafter, prompt, feats, anchor, list(path)).float(), -1)
            v, ids = logq.topk(3)
            for r in range(3):
                scores[path + (int(ids[r]),)] = score + float(v[r])
                expand(path + (int(ids[r]),), score + float(v[r]))

        expand((), 0.0)
    paths = [tuple(path_of(tree, i + 1)) for i in range(len(tree))]
    assert sorted((scores[p] for p in paths), reverse=True) == pytest.approx(sorted(scores.values(),
                                                                                    reverse=True)[:10], abs=1e-4)


def eagle_chi_target():
    """:func:`chi_square_target`'s recipe (V = 8, sharpened, no EOS) with the 3 decoder layers EAGLE-3 reads."""
    target = random_target(vocab_size=8, hidden_size=16, num_layers=3, num_heads=2, num_kv_heads=1,
                           intermediate_size=32, max_positions=64, seed=3)
    with torch.no_grad():
        target.model.model.norm.weight.mul_(6.0)
    target.model.generation_config.eos_token_id = None
    return target


@pytest.mark.slow
def test_eagle_tree_sampling_is_distributed_as_the_target():
    """T > 0, the plain walk over EAGLE-2's tree (top-k children) and over a drawn path tree: chi-square on
    (x1, x2)."""
    target = eagle_chi_target()
    prompt = [3, 5, 2, 6]
    law = exact_joint(target, prompt)
    torch.manual_seed(0)
    drafter = build_drafter(drafter_config("eagle3", target, block_size=3, num_layers=1), target)
    for tree in (TreeConfig("eagle", budget=8, top_k=3), TreeConfig("path", budget=8, top_k=3, draw="sample")):
        counts, accepted = sampled_pairs(target, drafter, prompt, 1200, temperature=1.0, tree=tree)
        assert max(accepted) >= 1
        ok, stat = passes_chi_square(counts, law)
        assert ok, (tree.label(), stat)


def test_bad_eagle_requests_fail_before_decoding(target, monkeypatch):
    prompt = torch.tensor([prompt_of(1)])
    calls = []
    monkeypatch.setattr(engine, "decode", lambda *a, **k: calls.append(1))
    eagle = eagle_of(target)
    torch.manual_seed(0)
    domino = build_drafter(drafter_config("domino", target, block_size=6, num_layers=1), target)
    with pytest.raises(TreeError, match="'eagle' tree builder is EAGLE-2's tree over an EAGLE-3 drafter"):
        generate(target, domino, prompt, max_new_tokens=4, tree=TreeConfig("eagle"))
    with pytest.raises(TreeError, match="'ddtree' tree builder needs a parallel block.*use builder='eagle'"):
        generate(target, eagle, prompt, max_new_tokens=4, tree=TreeConfig("ddtree"))
    for builder in ("eagle", "path"):
        with pytest.raises(TreeError, match=f"DLoop with the '{builder}' tree on a eagle3 drafter"):
            generate(target, eagle, prompt, max_new_tokens=4, tree=TreeConfig(builder),
                     dloop=DLoopConfig(float("-inf"), 2))
    assert not calls
    torch.manual_seed(0)
    small = build_drafter(drafter_config("small_lm", target, block_size=4, num_layers=1), target)
    with pytest.raises(TreeError, match="drafts token by token"):
        generate(target, small, prompt, max_new_tokens=4, tree=TreeConfig("eagle"))

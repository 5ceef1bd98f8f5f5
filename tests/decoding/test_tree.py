"""Tree rounds (``generate(..., tree=TreeConfig(...))``): lossless at T = 0 and T > 0 for every builder and
parallel drafter, the chain through the tree path equal to the chain engine, the builders' maths, KV compaction,
the cost rule, and the requests refused before decoding."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
import torch
from transformers import DynamicCache, StaticCache

import lit_domino.decoding.engine as engine
import lit_domino.decoding.tree as tree_mod
import lit_domino.decoding.tree_build as tree_build
from lit_domino.decoding import DLoopConfig, TreeConfig, VerifyCost, generate, measure_verify_cost
from lit_domino.decoding.cost import gain_class
from lit_domino.decoding.kv import compact_cache
from lit_domino.decoding.tree import DraftTree, TreeError, best_first
from lit_domino.models import build_drafter, drafter_config
from lit_domino.testing import (OracleMix, chi_square_target, exact_joint, lively_target, passes_chi_square,
                                sampled_pairs)

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 128
PARALLEL = ("backbone", "domino", "dspark", "dflash2")
BUILDS = [(k, b) for k in PARALLEL for b in ("chain", "ddtree", "path") if not (k == "backbone" and b == "path")]


@pytest.fixture(scope="module")
def target():
    return lively_target(VOCAB, max_positions=96)


def drafter_of(target, kind, block_size=6, seed=0, **extra):
    torch.manual_seed(seed)
    over = dict(num_layers=1, head=dict(rank=16, gru_hidden=32)) if kind == "domino" else dict(num_layers=1)
    if kind == "dspark":
        over["head"] = dict(rank=16, head_type="rnn")
    over.update(extra)
    drafter = build_drafter(drafter_config(kind, target, block_size=block_size, **over), target)
    with torch.no_grad():  # a head that matters: the path builder's branches differ from the marginals'
        for name, p in drafter.named_parameters():
            if (name.startswith("head.") and any(w in name for w in ("up.", "w1.", "w2.", "joint."))
                    or name.startswith("selector.")):  # DFlash 2's transition codebooks
                p.normal_(0, 0.5)
    return drafter


def greedy(target, prompt, n):
    return generate(target, None, torch.tensor([prompt]), max_new_tokens=n).tokens


def oracle_trees(monkeypatch, reference: list[int], seed: int = 0, p: float = 0.75):
    """Real trees with the target's greedy continuation planted on a random branch: from the root, a random
    child (any rank) takes the reference token (swapped with a sibling holding it), then one of its children,
    and so on with probability ``p``; so the walk accepts paths through every rank and depth, and compaction moves
    nodes that are not a prefix of the forward's order."""
    rng = torch.Generator().manual_seed(seed)

    def plant(tree, start):
        u, d = 0, 1
        while start + d < len(reference):
            kids = [i for i, par in enumerate(tree.parents) if par == u]
            if not kids or (d > 1 and torch.rand((), generator=rng) > p):
                break
            pick = kids[int(torch.randint(len(kids), (), generator=rng))]
            want = reference[start + d]
            for i in kids:  # siblings stay distinct
                if tree.tokens[i] == want:
                    tree.tokens[i] = tree.tokens[pick]
            tree.tokens[pick] = want
            u, d = pick + 1, d + 1
        return tree

    def planted(real, at):  # ``at``: where the session is among the builder's arguments
        return lambda *a, **k: plant(real(*a, **k), a[at].length)

    monkeypatch.setattr(tree_mod, "build_tree", planted(tree_mod.build_tree, 1))
    monkeypatch.setattr(tree_mod, "build_dloop_tree", planted(tree_mod.build_dloop_tree, 2))  # DLoop's rounds


def prompt_of(seed, length=6):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB - 1, (length,), generator=g).tolist()


@pytest.mark.parametrize("static,dloop", [(False, None), (True, None), (False, DLoopConfig(float("-inf"), 3)),
                                          (True, DLoopConfig(float("-inf"), 2))], ids=["dynamic", "static",
                                                                                       "dloop", "static-dloop"])
@pytest.mark.parametrize("kind,builder", BUILDS)
def test_tree_rounds_are_lossless_greedy(target, monkeypatch, kind, builder, static, dloop):
    """Token identity with the target's greedy decoding, with branches through every rank accepted, in the
    middle and at the end of the context (the last rounds verify smaller trees), both caches, DLoop off and on
    (chain stages while the gate is open, the last stage a tree)."""
    drafter = drafter_of(target, kind)
    ranks, accepted = set(), set()
    for seed, (length, n) in enumerate([(6, 30), (40, 96 - 40)]):  # the second fills the context exactly
        prompt = prompt_of(seed, length)
        ref = greedy(target, prompt, n)
        # the planting's draws differ per drafter (a fixed seed left DFlash 2's DLoop trees without a rank-1 path)
        oracle_trees(monkeypatch, prompt + ref, seed=seed + 2 * PARALLEL.index(kind))
        res = generate(target, drafter, torch.tensor([prompt]), max_new_tokens=n, static_cache=static, dloop=dloop,
                       tree=TreeConfig(builder, budget=24 if builder != "chain" else 5, top_k=2))
        if dloop is not None:
            assert max(res.drafted_per_round) > (24 if builder != "chain" else 5)  # chain stages + the tree
        assert res.tokens == ref, (kind, builder, seed)
        ranks.update(res.accepted_ranks), accepted.update(res.accepted_per_round)
    assert max(accepted) >= 3
    if builder != "chain":
        assert {0, 1} <= ranks  # accepted siblings of both ranks: compaction moved nodes


@pytest.mark.parametrize("kind", PARALLEL)
def test_real_trees_without_planting_are_lossless(target, kind):
    """The real builders alone (random drafters rarely match: mostly one-token rounds) at T = 0, and a sampled
    decode that is reproducible."""
    drafter = drafter_of(target, kind)
    prompt = prompt_of(7)
    ref = greedy(target, prompt, 20)
    for builder in drafter.tree_builders:
        tree = TreeConfig(builder, budget=10, top_k=4)
        assert generate(target, drafter, torch.tensor([prompt]), max_new_tokens=20, tree=tree).tokens == ref
        a, b = (generate(target, drafter, torch.tensor([prompt]), max_new_tokens=12, tree=tree, temperature=0.8,
                         seed=3).tokens for _ in range(2))
        assert a == b


@pytest.mark.parametrize("dloop", [None, DLoopConfig(-22.15, 3)], ids=["chain", "dloop"])  # gate: open half the time
def test_the_chain_through_the_tree_path_is_the_chain_engine(target, dloop):
    """builder='chain' with budget B - 1: the tokens, the rounds and τ of the chain engine (with DLoop: its
    stages, the same gate), with real acceptances of every length (an oracle mix of a real Domino session), both
    caches."""
    drafter = drafter_of(target, "domino", block_size=6)
    seen = set()
    for seed in range(3):
        prompt = prompt_of(20 + seed)
        ref = greedy(target, prompt, 60)
        for static in (False, True):
            mix = OracleMix(drafter, prompt + ref, seed=seed, p=0.8)
            chain = generate(target, mix, torch.tensor([prompt]), max_new_tokens=40, static_cache=static,
                             dloop=dloop)
            mix = OracleMix(drafter, prompt + ref, seed=seed, p=0.8)
            mix.tree_builders, mix.kind = ("chain",), "domino"
            via = generate(target, mix, torch.tensor([prompt]), max_new_tokens=40, static_cache=static,
                           dloop=dloop, tree=TreeConfig("chain", budget=5))
            assert via.stages_per_round == chain.stages_per_round
            seen.update(chain.stages_per_round)
            assert via.tokens == chain.tokens == ref[:40]
            assert via.accepted_per_round == chain.accepted_per_round and via.tau == chain.tau
            assert max(chain.accepted_per_round) >= 3
    assert dloop is None or len(seen) >= 2  # the gate both opened and closed


@pytest.mark.parametrize("kind,extra,pool", [("domino", {}, None), ("domino", {}, 16), ("dspark", {}, None),
                                             ("dspark", {}, 16), ("dspark", {"sample_from_anchor": True}, 16),
                                             ("dflash2", {}, None)])
def test_path_tree_of_one_child_per_node_is_the_heads_own_chain(target, kind, extra, pool):
    """top_k = 1: the path builder expands one node per depth, each from its parent's head state: the session's
    own greedy draft, token for token (the per-node recurrence is the head's; DSpark's rnn state in both anchor
    conventions; DFlash 2's selector from each node's token; with a candidate pool, the chain's pool)."""
    drafter = drafter_of(target, kind, block_size=8, **extra)
    session = drafter.new_session(**({} if pool is None else {"pool_size": pool}))
    prompt = torch.tensor(prompt_of(3, 9))
    feats = torch.randn(9, drafter.config.num_features * drafter.config.hidden_size)
    if kind == "dspark":
        feats = torch.cat([feats, torch.randn(9, drafter.config.hidden_size)], -1)
    session.extend(prompt, feats)
    anchor = torch.tensor([11])
    with torch.inference_mode():
        chain = session.draft(anchor, 7).tokens.tolist()
        session.crop(9)
        tree = tree_mod.build_tree(TreeConfig("path", budget=7, top_k=1), session, anchor, 7, 7, 0.0, None)
    assert tree.tokens == chain and tree.parents == list(range(7)) and tree.ranks == [0] * 7


def test_domino_path_head_conditions_each_node_on_its_own_path(target):
    """A branch's logits are the Domino head's rollout fed that branch's tokens (DominoHead.rollout, the
    training-time form): every node of a path tree, at every depth."""
    drafter = drafter_of(target, "domino", block_size=5)
    session = drafter.new_session()
    session.extend(torch.tensor(prompt_of(4, 7)), torch.randn(7, drafter.config.num_features * 32))
    anchor = torch.tensor([9])
    with torch.inference_mode():
        tree = tree_mod.build_tree(TreeConfig("path", budget=12, top_k=3), session, anchor, 4, 12, 0.0, None)
        hidden = session.stages[-1].hidden
        head = drafter.head
        H = hidden[1:][None]
        base = drafter.compute_logits(H)
        for i in range(len(tree)):
            if not any(p == i + 1 for p in tree.parents):
                continue  # a leaf: its children's logits were never needed
            path, u = [], i + 1
            while u:
                path.append(tree.tokens[u - 1]), (u := tree.parents[u - 1])
            path.reverse()
            step = head.rollout(H, base, drafter.embed_tokens(anchor), drafter.embed_tokens)
            logits = step(None)
            for tok in path:
                logits = step(torch.tensor([tok]))
            kids = sorted((tree.tokens[j] for j, p in enumerate(tree.parents) if p == i + 1))
            top = logits[0].topk(3).indices.tolist()
            assert set(kids) <= set(top), (i, kids, top)
    assert max(tree.depths) >= 2 and max(tree.ranks) > 0


def test_best_first_is_the_n_most_likely_prefixes():
    """DDTree's heap against brute force: the n prefixes of highest cumulative log-probability, parents first."""
    g = torch.Generator().manual_seed(0)
    for K, k, n in [(3, 3, 7), (4, 2, 9), (5, 4, 30)]:
        values = torch.log_softmax(torch.randn(K, 8, generator=g), -1).topk(k).values.tolist()
        got = best_first(values, n)
        prefixes = [ranks for d in range(1, K + 1) for ranks in itertools.product(range(k), repeat=d)]
        scores = sorted((sum(values[j][r] for j, r in enumerate(p)) for p in prefixes), reverse=True)
        assert [s for *_, s in got] == pytest.approx(scores[:n])
        assert all(par < i + 1 for i, (_, par, _, _) in enumerate(got))
    assert [(d, p, r) for d, p, r, _ in best_first([[-0.1], [-0.2], [-0.3]], 5)] == [(0, 0, 0), (1, 1, 0), (2, 2, 0)]


def test_chain_first_puts_the_main_chain_first():
    """The anchor's rank-0 child, its rank-0 child, .. become nodes 1..L, the others follow in their order, with
    their parents, depths, ranks and q rows; a tree whose main chain is first already is returned as it is."""
    q = torch.arange(7.0)[:, None].expand(7, 3)
    tree = DraftTree(tokens=[5, 6, 7, 8, 9, 10], parents=[0, 0, 2, 1, 2, 3], depths=[1, 1, 2, 2, 2, 3],
                     ranks=[1, 0, 0, 0, 1, 0], stages=2, q=q)
    out = tree_mod.chain_first(tree)
    assert out.tokens == [6, 7, 10, 5, 8, 9] and out.parents == [0, 1, 2, 0, 4, 1]
    assert out.depths == [1, 2, 3, 1, 2, 2] and out.ranks == [0, 0, 0, 1, 0, 1] and out.stages == 2
    assert out.q[:, 0].tolist() == [0, 2, 3, 6, 1, 4, 5]
    assert tree_mod.chain_first(out) is out


def test_a_chain_verifies_as_the_chain_engine():
    """A tree that is a chain has no 4-D mask and no positions: the target's own causal forward."""
    ids, pos, mask = tree_mod.tree_inputs(DraftTree([5, 6, 7], [0, 1, 2], [1, 2, 3], [0, 0, 0]), torch.tensor([4]),
                                          start=3, kv_len=10, dtype=torch.float32)
    assert ids.tolist() == [4, 5, 6, 7] and pos is None and mask is None


def test_tree_mask_sees_the_context_the_ancestors_and_itself():
    tree = DraftTree(tokens=[5, 6, 7, 8], parents=[0, 0, 1, 3], depths=[1, 1, 2, 3], ranks=[0, 1, 0, 0])
    ids, pos, mask = tree_mod.tree_inputs(tree, torch.tensor([4]), start=3, kv_len=10, dtype=torch.float32)
    assert ids.tolist() == [4, 5, 6, 7, 8] and pos.tolist() == [[3, 4, 4, 5, 6]]
    seen = (mask[0, 0] == 0).int().tolist()
    assert seen == [[1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
                    [1, 1, 1, 1, 1, 0, 0, 0, 0, 0],
                    [1, 1, 1, 1, 0, 1, 0, 0, 0, 0],
                    [1, 1, 1, 1, 1, 0, 1, 0, 0, 0],
                    [1, 1, 1, 1, 1, 0, 1, 1, 0, 0]]


@pytest.mark.parametrize("static", [False, True])
def test_compact_cache_moves_the_accepted_slots_forward(target, static):
    model = target.model
    cache = StaticCache(config=model.config, max_cache_len=16) if static else DynamicCache(config=model.config)
    model(input_ids=torch.arange(3, 13)[None], cache=cache, use_cache=True)
    before = [layer.keys[:, :, :10].clone() for layer in cache.layers]
    compact_cache(cache, [5, 7, 9], 4)
    for layer, old in zip(cache.layers, before):
        assert torch.equal(layer.keys[:, :, 4:7], old[:, :, [5, 7, 9]])
        assert torch.equal(layer.keys[:, :, :4], old[:, :, :4])


@pytest.mark.slow
def test_tree_sampling_is_distributed_as_the_target():
    """T > 0: the target samples at every node and the walk follows its sample: chi-square on (x1, x2) for
    DDTree on a backbone, the path tree on a Domino drafter (trees covering most of V = 8) and DFlash 2's selector
    path tree, and on (x3, x4) for DLoop's chain stage + a DSpark path tree (the tree stage drafts x3 onwards where
    the chain stage of K = 2 left room)."""
    target = chi_square_target()
    prompt = [3, 5, 2, 6]
    for kind, builder, dloop in (("backbone", "ddtree", None), ("domino", "path", None),
                                 ("dspark", "path", DLoopConfig(float("-inf"), 2)), ("dflash2", "path", None)):
        torch.manual_seed(0)
        over = {"domino": dict(head=dict(rank=8, gru_hidden=8)), "dflash2": dict(head=dict(top_k=6))}.get(kind, {})
        drafter = build_drafter(drafter_config(kind, target, block_size=3, num_layers=1, **over), target)
        at = 3 if dloop else 1
        counts, accepted = sampled_pairs(target, drafter, prompt, 1200, at=at, temperature=1.0, dloop=dloop,
                                         tree=TreeConfig(builder, budget=12, top_k=4))
        assert {0, 1, 2} & accepted and max(accepted) >= (3 if dloop else 1)  # with DLoop: a tree node accepted
        ok, stat = passes_chi_square(counts, exact_joint(target, prompt, at=at))
        assert ok, (kind, builder, stat)


def test_cost_rule_grows_while_throughput_rises():
    flat = VerifyCost((1, 64), (1.0, 1.0))
    steep = VerifyCost((1, 2, 4), (1.0, 2.0, 4.0))
    gains = [0.9, 0.5, 0.3, 0.1, 0.05]
    assert flat.best_nodes(gains, cap=4) == 4  # free nodes: grow to the cap
    assert steep.best_nodes(gains, cap=5) == 1  # doubling the cost for +0.5 tokens does not pay
    assert VerifyCost((1, 8), (1.0, 1.4)).best_nodes(gains, cap=5, draft_s=1.0) == 4  # rates .95 1.17 1.28 1.29 1.28
    # gains below 1/4 counted at 40 % (what a target accepted of them): rates .95 1.17 1.24 1.21 1.17, one node fewer
    assert VerifyCost((1, 8), (1.0, 1.4), gain_ratios=(1.0, 1.0, 0.4)).best_nodes(gains, cap=5, draft_s=1.0) == 3
    assert steep.seconds_at(3) == pytest.approx(3.0) and steep.seconds_at(8) == pytest.approx(8.0)
    priced = VerifyCost((1, 2, 4), (1.0, 2.0, 4.0), scale=1.5, extra_s=0.25)  # a decode's prices on the measured curve
    assert [priced.seconds_at(n) for n in (0, 3, 8)] == [1.75, 4.75, 12.25]
    for bad in (dict(widths=(4, 2), seconds=(1.0, 2.0)), dict(gain_ratios=(0.5, 1.0)), dict(gain_ratios=(1.0, 0.0)),
                dict(scale=0.0), dict(extra_s=-1.0)):
        with pytest.raises(ValueError):
            VerifyCost(**{"widths": (1,), "seconds": (1.0,), **bad})


def test_gain_classes_halve_from_one():
    assert [gain_class(g, 8) for g in (1.5, 1.0, 0.5, 0.4999, 0.25, 2.0 ** -7, 2.0 ** -7.5, 1e-300, 0.0)] == \
        [0, 0, 0, 1, 1, 6, 7, 7, 7]
    assert gain_class(0.3, 1) == 0 and gain_class(0.3, 0) == 0


def random_curve(rng) -> VerifyCost:
    """A random verify curve: 1-4 widths in 0..80, increasing times (in arbitrary units), half the time priced
    (a scale and extra seconds) with gains calibrated by random non-increasing ratios per size class."""
    widths = sorted(int(w) for w in rng.choice(np.arange(0, 80), size=int(rng.integers(1, 5)), replace=False))
    seconds = tuple(float(x) for x in np.cumsum(rng.uniform(0.01, 1.0, len(widths))))
    if rng.uniform() < 0.5:
        return VerifyCost(tuple(widths), seconds)
    ratios = tuple(sorted(rng.uniform(0.2, 1.5, int(rng.integers(1, 9))).tolist(), reverse=True))
    return VerifyCost(tuple(widths), seconds, scale=float(rng.uniform(0.5, 2.0)), extra_s=float(rng.uniform(0, 0.5)),
                      gain_ratios=ratios, rate=float(rng.choice([0.0, rng.uniform(0.1, 3.0)])))


def test_best_rate_is_the_rules_choice_and_its_rate():
    steep = VerifyCost((1, 2), (1.0, 10.0))
    assert steep.best_rate([0.9, 0.5], 4) == (1, pytest.approx(1.9)) and steep.best_rate([], 4)[0] == 0
    rng = np.random.default_rng(3)
    for _ in range(300):  # the rule read as written: each gain times its class's ratio, E(n) / (C_draft + C_v(n))
        curve, draft = random_curve(rng), float(rng.uniform(0.0, 2.0))  # or E(n) - λ (C_draft + C_v(n))
        gains = sorted(rng.uniform(0, 1, int(rng.integers(0, 40))) ** 3, reverse=True)
        cap = int(rng.integers(1, 50))
        r, lam = curve.gain_ratios, curve.rate
        counted = [g * r[gain_class(g, len(r))] if r else g for g in gains]
        ns = range(1, min(cap, len(gains)) + 1)
        rates = [(1 + sum(counted[:n])) / (draft + curve.seconds_at(n)) for n in ns]
        values = [(1 + sum(counted[:n])) - lam * (draft + curve.seconds_at(n)) for n in ns] if lam else rates
        n, rate = curve.best_rate(list(gains), cap, draft)
        if not rates:
            assert n == 0
            continue
        # sums in another order differ by rounding only (float64, at most 40 terms of at most 1.5)
        assert n == 1 + int(np.argmax(values)) or values[n - 1] == pytest.approx(max(values), rel=1e-12, abs=1e-12)
        assert rate == pytest.approx(rates[n - 1], rel=1e-12)


def test_a_known_throughput_gives_nodes_to_the_rounds_that_earn_them():
    """Priced at the decode's throughput λ, a node is verified while its gain beats λ times its verify seconds: a
    round of high gains verifies more nodes than one of low gains, where the round-rate rule does the opposite."""
    curve = VerifyCost((1, 16), (1.0, 2.5))  # 0.1 s per node
    high, low = [0.95, 0.9, 0.85, 0.8, 0.75, 0.2, 0.18, 0.16], [0.3, 0.2, 0.18, 0.16, 0.14, 0.12, 0.1, 0.08]
    by_ratio = [curve.best_nodes(g, 8, draft_s=1.0) for g in (high, low)]
    by_rate = [replace(curve, rate=1.2).best_nodes(g, 8, draft_s=1.0) for g in (high, low)]
    assert by_ratio == [5, 7]  # the round's own rate: the high round stops where its rate x 0.1 s beats a gain
    assert by_rate == [8, 5]  # λ = 1.2 tokens/s: a node pays while its gain > 0.12, in every round


def token_paths(tree) -> set[tuple[int, ...]]:
    """Each node of ``tree`` as its tokens from the anchor (parents come before children)."""
    paths = [()]
    for tok, parent in zip(tree.tokens, tree.parents):
        paths.append(paths[parent] + (tok,))
    return set(paths[1:])


@pytest.mark.parametrize("kind", ["domino", "dspark"])
def test_cost_aware_path_tree_is_the_rules_prefix_of_the_budget_tree(target, monkeypatch, kind):
    """A cost-aware path tree is grown as the fixed-budget one and cut to the rule's choice: its nodes are the
    rule's number of the budget tree's nodes, each with the same path of tokens (random curves and draft costs)."""
    drafter = drafter_of(target, kind, block_size=8)
    rng = np.random.default_rng(1)
    anchor = torch.tensor([13])
    chosen, real = [], tree_build._cap
    monkeypatch.setattr(tree_build, "_cap", lambda *a: chosen.append(real(*a)) or chosen[-1])
    cut_any = False
    for seed in range(12):
        curve, draft, pool = random_curve(rng), float(rng.uniform(0.0, 3.0)), [None, 16][seed % 2]
        with torch.inference_mode():
            cut = tree_mod.build_tree(TreeConfig("path", budget=40, top_k=3, cost=curve),
                                      session_of(drafter, kind, pool, seed), anchor, 7, 40, 0.0, None, draft)
            n = chosen[-1]
            full = tree_mod.build_tree(TreeConfig("path", budget=40, top_k=3), session_of(drafter, kind, pool, seed),
                                       anchor, 7, 40, 0.0, None, draft)
        assert len(cut) == n and token_paths(cut) <= token_paths(full), seed
        cut_any |= n < len(full)
    assert cut_any  # the rule cut some trees


def test_cost_aware_trees_are_lossless_and_verify_fewer_nodes(target, monkeypatch):
    curve = measure_verify_cost(target, widths=(1, 4, 16), context=16, repeats=1, verbose=False)
    assert list(curve.seconds) == sorted(curve.seconds) and curve is measure_verify_cost(
        target, widths=(1, 4, 16), context=16, repeats=1)
    drafter = drafter_of(target, "domino")
    prompt = prompt_of(11)
    ref = greedy(target, prompt, 24)
    steep = VerifyCost((1, 2), (1e-3, 1e-2))  # nodes beyond the first cost 9 ms each: never worth it
    for builder in ("ddtree", "path", "chain"):
        res = generate(target, drafter, torch.tensor([prompt]), max_new_tokens=24,
                       tree=TreeConfig(builder, budget=16, cost=steep))
        assert res.tokens == ref and set(res.drafted_per_round[:-1]) == {1}  # the last: 1 token left, no draft
        full = generate(target, drafter, torch.tensor([prompt]), max_new_tokens=24,
                        tree=TreeConfig(builder, budget=16, cost=VerifyCost((1, 64), (1.0, 1.0))))
        assert full.tokens == ref and max(full.drafted_per_round) == (16 if builder != "chain" else 5)


def test_bad_tree_requests_fail_before_decoding(target, monkeypatch):
    prompt = torch.tensor([prompt_of(1)])
    backbone, domino = drafter_of(target, "backbone"), drafter_of(target, "domino")
    calls = []
    monkeypatch.setattr(engine, "decode", lambda *a, **k: calls.append(1))
    for budget in (0, -3, 2.5, True):
        with pytest.raises(TreeError, match="budget must be an integer >= 1"):
            TreeConfig("ddtree", budget=budget)
    with pytest.raises(TreeError, match="builder must be one of"):
        TreeConfig("beam")
    with pytest.raises(TreeError, match="above what the context leaves"):
        generate(target, domino, torch.tensor([prompt_of(1, 80)]), max_new_tokens=4, tree=TreeConfig(budget=20))
    with pytest.raises(TreeError, match="'path' tree builder needs a causal head"):
        generate(target, backbone, prompt, max_new_tokens=4, tree=TreeConfig("path"))
    torch.manual_seed(0)  # EAGLE-3 builds its own trees (tests/decoding/test_tree_eagle.py)
    ar = build_drafter(drafter_config("small_lm", target, block_size=4, num_layers=1), target)
    with pytest.raises(TreeError, match="drafts token by token"):
        generate(target, ar, prompt, max_new_tokens=4, tree=TreeConfig("chain"))
    with pytest.raises(TreeError, match="needs a drafter"):
        generate(target, None, prompt, max_new_tokens=4, tree=TreeConfig())
    with pytest.raises(TreeError, match="must be a TreeConfig"):
        generate(target, domino, prompt, max_new_tokens=4, tree="ddtree")
    monkeypatch.setattr(target.model.config, "_attn_implementation", "flash_attention_2")
    with pytest.raises(TreeError, match="4-D attention mask"):
        generate(target, domino, prompt, max_new_tokens=4, tree=TreeConfig())
    assert not calls


def session_of(drafter, kind, pool=None, seed=5, length=7):
    """A session over a random prompt with random target features (DSpark's with its distribution layer)."""
    session = drafter.new_session(**({} if pool is None else {"pool_size": pool}))
    width = drafter.config.num_features * 32 + (32 if kind == "dspark" else 0)
    g = torch.Generator().manual_seed(seed)
    session.extend(torch.tensor(prompt_of(seed, length)), torch.randn(length, width, generator=g))
    return session


@pytest.mark.parametrize("kind,pool", [("domino", None), ("domino", 24), ("dspark", None), ("dspark", 24),
                                       ("dflash2", None)])
def test_path_tree_is_the_best_first_tree_of_the_conditioned_scores(target, kind, pool):
    """Brute force: every path of top-3 children, 3 deep, scored by the head run on that path alone (the softmax
    of its logits over the candidates: a pool's, DFlash 2's selector's, else the vocabulary); the builder's 12
    nodes are the 12 best, each with its own cumulative score."""
    drafter = drafter_of(target, kind, block_size=4)
    session = session_of(drafter, kind, pool)
    anchor = torch.tensor([13])
    with torch.inference_mode():
        tree = tree_mod.build_tree(TreeConfig("path", budget=12, top_k=3), session, anchor, 3, 12, 0.0, None)
        head = session.path_head(session.stages[-1].hidden, anchor)
        scores = {}

        def expand(state, d, path, score):
            if d == 3:
                return
            logits, cand, inherited = head.step(d, state)
            v, col = torch.log_softmax(logits.float(), -1)[0].topk(3)
            ids = col if cand is None else cand[0, col]
            for r in range(3):
                tok = ids[r : r + 1]
                scores[path + (int(tok),)] = score + float(v[r])
                expand(head.child(inherited, torch.zeros(1, dtype=torch.long), tok), d + 1, path + (int(tok),),
                       score + float(v[r]))

        expand(head.start(), 0, (), 0.0)
    paths = []
    for i in range(len(tree)):
        path, u = [], i + 1
        while u:
            path.append(tree.tokens[u - 1]), (u := tree.parents[u - 1])
        paths.append(tuple(reversed(path)))
    best = sorted(scores.values(), reverse=True)[:12]
    assert sorted((scores[p] for p in paths), reverse=True) == pytest.approx(best, abs=1e-5)
    assert len(set(paths)) == 12


@pytest.mark.parametrize("kind", ["domino", "dspark"])
def test_pooled_path_heads_are_the_full_heads_on_the_pool(target, kind):
    """A candidate pool P (the chain's, ``pool_size``): the pooled head's logits at depth i are the full head's on
    the top-P tokens of block position i's base logits (the same state, the correction on the pool only), so with
    P = V the tree is the unpooled one, node for node; with P < V every child is in its position's pool, and a
    drawn tree's q rows are the softmax over the pool at T, 0 outside it."""
    drafter = drafter_of(target, kind, block_size=6)
    anchor = torch.tensor([13])
    cfg = TreeConfig("path", budget=20, top_k=3)
    with torch.inference_mode():
        full = session_of(drafter, kind)
        tree = tree_mod.build_tree(cfg, full, anchor, 5, 20, 0.0, None)
        hidden = full.stages[-1].hidden
        whole = full.path_head(hidden, anchor)
        base = drafter.compute_logits(hidden[1:])  # [K, V]
        same = tree_mod.build_tree(cfg, session_of(drafter, kind, pool=VOCAB), anchor, 5, 20, 0.0, None)
        assert (same.tokens, same.parents, same.ranks) == (tree.tokens, tree.parents, tree.ranks)
        P = 8
        pooled = session_of(drafter, kind, pool=P)
        small = tree_mod.build_tree(cfg, pooled, anchor, 5, 20, 0.0, None)
        pools = base.topk(P, -1).indices.tolist()
        assert all(t in pools[d - 1] for t, d in zip(small.tokens, small.depths))
        assert small.tokens != tree.tokens  # the pool changed what is drafted here
        head = pooled.path_head(hidden, anchor)
        states, wstates = head.start(), whole.start()
        for d in range(3):  # along the full head's greedy path
            logits, cand, inherited = head.step(d, states)
            wlogits, wcand, winherited = whole.step(d, wstates)
            assert wcand is None and cand[0].tolist() == pools[d]
            assert torch.allclose(logits, wlogits[:, cand[0]], atol=1e-5)
            tok = wlogits.argmax(-1)
            states = head.child(inherited, torch.zeros(1, dtype=torch.long), tok)
            wstates = whole.child(winherited, torch.zeros(1, dtype=torch.long), tok)
        g = torch.Generator().manual_seed(0)
        drawn = tree_mod.build_tree(TreeConfig("path", budget=20, top_k=3, draw="sample"),
                                    session_of(drafter, kind, pool=P), anchor, 5, 20, 0.7, g)
    assert drawn.q.shape == (len(drawn) + 1, VOCAB)
    for u in {0, *drawn.parents}:  # the nodes with children (a leaf's row is never read)
        row = drawn.q[u]
        d = 0 if u == 0 else drawn.depths[u - 1]
        assert set(row.nonzero()[:, 0].tolist()) <= set(pools[d]) and float(row.sum()) == pytest.approx(1.0)
        kids = [drawn.tokens[i] for i, par in enumerate(drawn.parents) if par == u]
        assert all(row[t] > 0 for t in kids)


@pytest.mark.parametrize("kind", ["domino", "dspark"])
def test_pooled_path_trees_are_lossless_greedy(target, monkeypatch, kind):
    """A pooled path tree (``pool_size`` P < V) with the target's continuation planted on a random branch, and
    the real pooled trees alone, plain, cost-aware and as DLoop's last stage: the target's greedy output."""
    drafter = drafter_of(target, kind)
    prompt = prompt_of(4)
    ref = greedy(target, prompt, 30)
    curve = VerifyCost((1, 4, 16), (1e-3, 1.2e-3, 2e-3))
    for tree, dloop in ((TreeConfig("path", budget=16, top_k=3), None),
                        (TreeConfig("path", budget=24, top_k=3, cost=curve), None),
                        (TreeConfig("path", budget=16, top_k=3), DLoopConfig(float("-inf"), 2))):
        res = generate(target, drafter, torch.tensor([prompt]), max_new_tokens=30, pool_size=12, tree=tree,
                       dloop=dloop)
        assert res.tokens == ref
    oracle_trees(monkeypatch, prompt + ref, seed=1)
    res = generate(target, drafter, torch.tensor([prompt]), max_new_tokens=30, pool_size=12,
                   tree=TreeConfig("path", budget=16, top_k=3))
    assert res.tokens == ref and max(res.accepted_per_round) >= 3 and {0, 1} <= set(res.accepted_ranks)

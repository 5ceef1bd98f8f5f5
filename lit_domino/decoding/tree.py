"""Tree verification for block drafters: build a draft tree, verify it in one target forward, walk it, compact.

One round, with the committed sequence ending in the anchor x at position ``start`` (as in the chain engine):

1. build: a tree of n nodes below the anchor (node 0), each a drafted token at depth 1..K (position
   ``start + depth``), siblings distinct. Builders (:data:`BUILDERS`):

   * ``chain``: the drafter's own chain (its ``draft``), the tree with one node per depth; with budget B - 1 it is
     today's chain round, token for token;
   * ``ddtree``: best-first over the cumulative log-probability of the drafter's per-position marginals (the
     chain's logits: a backbone's are unconditioned, a head's follow its greedy picks), top-k per depth: the
     n most likely prefixes (DDTree);
   * ``path``: path-conditioned expansion, depth by depth over the whole frontier in one batch: each node's
     children come from the head run on that node's own path (Domino: one GRU state per node, DARTree; DSpark:
     the Markov head on each node's token, PCTree); each depth keeps the n best of parent × top-k candidates by
     cumulative log-probability, and the n best of all of them are the tree: the exact best-first tree under
     the path-conditioned scores.

2. verify: ONE target forward over ``[x, nodes]`` with a 4-D additive mask (each node sees the committed
   context, its ancestors and itself) and positions ``start + depth``.
3. walk from the root: at T = 0 follow the target's argmax while it is a child; at T > 0 the target samples a
   token at every node and the walk follows the sample while it is a child. The first miss is the bonus. Every
   committed token is the target's own pick or sample given its committed prefix, and the tree does not depend
   on the target's draws, so the output is exactly the target's at any temperature.
4. compact: the accepted nodes' K/V move to slots ``start+1 .. start+acc`` (:func:`lit_domino.decoding.kv.
   compact_cache`), the cache is cropped to ``start+acc+1``, and the drafter's session is cropped to ``start`` and
   extended with the anchor and the accepted path with their target features.

``budget`` caps n (nodes beyond the anchor); ``cost`` (:class:`lit_domino.decoding.cost.VerifyCost`) makes it
cost-aware: each round verifies the best-first prefix CaDDTree's rule picks.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from lit_domino.decoding.cost import VerifyCost
from lit_domino.decoding.kv import compact_cache
from lit_domino.runtime.command import UsageError

BUILDERS = ("chain", "ddtree", "path")
SUPPORTED_ATTENTION = ("sdpa", "eager")
"""Target attention implementations that take a 4-D additive mask as it is (flash-attention has no such mask)."""


class TreeError(UsageError):
    """A tree request this target or drafter cannot serve (raised before any decoding)."""


@dataclass(frozen=True)
class TreeConfig:
    """How each round's draft tree is built (``generate(..., tree=TreeConfig(...))``)."""

    builder: str = "ddtree"
    """One of :data:`BUILDERS`: ``chain`` (the drafter's chain as a tree), ``ddtree`` (best-first over the
    per-position marginals), ``path`` (path-conditioned expansion by the drafter's causal head)."""
    budget: int = 32
    """n, the most tree nodes verified per round beyond the anchor (>= 1); the tree's depth is at most
    block_size - 1. Near the end of the context a round verifies fewer."""
    top_k: int = 4
    """Children considered per node (the ranks per depth of ``ddtree``; per frontier node for ``path``); 1 makes
    every builder a chain."""
    cost: VerifyCost | None = None
    """A measured verify-cost curve (:func:`lit_domino.decoding.cost.measure_verify_cost`): grow each round's tree
    while the expected accepted tokens per second rise (CaDDTree), ``budget`` as the cap. None: always ``budget``."""

    def __post_init__(self):
        if self.builder not in BUILDERS:
            raise TreeError(f"TreeConfig.builder must be one of {BUILDERS}, got {self.builder!r}")
        for name in ("budget", "top_k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise TreeError(f"TreeConfig.{name} must be an integer >= 1, got {v!r}")
            object.__setattr__(self, name, int(v))
        if self.cost is not None and not isinstance(self.cost, VerifyCost):
            raise TreeError(f"TreeConfig.cost must be a VerifyCost or None, got {type(self.cost).__name__}")

    def label(self) -> str:
        core = f"{self.builder}:{self.budget}" + (f"k{self.top_k}" if self.builder != "chain" else "")
        return core + ("+cost" if self.cost is not None else "")


@dataclass
class DraftTree:
    """A round's tree: node i+1 (node 0 is the anchor) in lists on the host, parents before children."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    """Parent node of each node (0 = the anchor)."""
    depths: list[int] = field(default_factory=list)
    """1 .. K; the node's position is ``start + depth``."""
    ranks: list[int] = field(default_factory=list)
    """Each node's rank among its parent's candidates (0 = the drafter's top pick there)."""
    stages: int = 1
    """Drafting stages the tree came from (DLoop: its chain stages and the last stage's tree)."""

    def __len__(self) -> int:
        return len(self.tokens)


def check_tree(tree, target, drafter, *, compile: bool, longest_prompt: int, limit: int | None) -> None:
    """Everything a tree request needs, checked before decoding (:class:`TreeError` with the reason)."""
    if not isinstance(tree, TreeConfig):
        raise TreeError(f"tree must be a TreeConfig or None, got {type(tree).__name__}")
    if drafter is None:
        raise TreeError("tree verification needs a drafter (drafter=None is plain autoregressive decoding)")
    kind = getattr(drafter, "kind", type(drafter).__name__)
    builders = getattr(drafter, "tree_builders", ())
    if not builders:
        raise TreeError(f"a {kind} drafter drafts token by token and has no tree builder here; tree verification "
                        f"needs a parallel drafter (backbone, domino, dspark)")
    if tree.builder not in builders:
        raise TreeError(f"the {tree.builder!r} tree builder needs a causal head a {kind} drafter lacks "
                        f"(this drafter builds: {', '.join(builders)}); use domino or dspark, or builder='ddtree'")
    if compile:
        raise TreeError("compile=True has one graph per verify width; tree rounds vary it: decode trees eagerly")
    impl = getattr(target.model.config, "_attn_implementation", None) or "eager"
    if impl not in SUPPORTED_ATTENTION:
        raise TreeError(f"tree verification passes a 4-D attention mask, which the target's {impl!r} attention "
                        f"does not take; load the target with attn_implementation='sdpa' or 'eager'")
    if limit is not None and tree.budget > limit - 1 - longest_prompt:
        raise TreeError(f"tree budget {tree.budget} is above what the context leaves: a prompt of "
                        f"{longest_prompt} tokens in a context of {limit} positions leaves room for "
                        f"{max(limit - 1 - longest_prompt, 0)} tree nodes")


# --------------------------------------------------------------------------- builders


def best_first(values: list[list[float]], n: int) -> list[tuple[int, int, int, float]]:
    """DDTree's best-first heap: ``values[d][r]`` the log-probability of rank r at depth d+1 (decreasing in r,
    -inf entries skipped) → up to n nodes ``(depth index d, parent node, rank r, cumulative log-prob)`` in pop
    order (node i+1 is the i-th; parents come first). Each pop adds a node, then pushes its next sibling and
    its first child: the n most likely prefixes under the per-position marginals."""
    K = len(values)
    out: list[tuple[int, int, int, float]] = []
    if not K or not values[0] or not math.isfinite(values[0][0]):
        return out
    heap = [(-values[0][0], 0, 0, 0, 0.0)]  # (-score, depth, rank, parent node, parent score)
    while heap and len(out) < n:
        neg, d, r, parent, base = heapq.heappop(heap)
        out.append((d, parent, r, -neg))
        node = len(out)
        if r + 1 < len(values[d]) and math.isfinite(values[d][r + 1]):
            heapq.heappush(heap, (-(base + values[d][r + 1]), d, r + 1, parent, base))
        if d + 1 < K and math.isfinite(values[d + 1][0]):
            heapq.heappush(heap, (-(-neg + values[d + 1][0]), d + 1, 0, node, -neg))
    return out


def _topk_host(logits: torch.Tensor, k: int) -> tuple[list[list[float]], list[list[int]]]:
    """log-softmax top-k per row of ``logits`` [K, V] → (values, ids) as host lists (one copy)."""
    v, ids = torch.log_softmax(logits.float(), -1).topk(min(k, logits.shape[-1]), -1)
    both = torch.cat([v, ids.float()], -1).tolist() if v.shape[-1] else [[] for _ in range(v.shape[0])]
    kk = v.shape[-1]
    return [row[:kk] for row in both], [[int(x) for x in row[kk:]] for row in both]


def _cap(cfg: TreeConfig, gains: list[float], nodes: int, draft_s: float | None) -> int:
    """Nodes to verify: ``nodes`` (the budget left this round), or CaDDTree's choice under it."""
    if cfg.cost is None:
        return nodes
    return cfg.cost.best_nodes(gains, nodes, draft_s)


def build_tree(cfg: TreeConfig, session, anchor: torch.Tensor, depth: int, nodes: int, temperature: float,
               generator, draft_s: float | None = None) -> DraftTree:
    """A tree of at most ``nodes`` nodes and ``depth`` levels below ``anchor`` [1] (see the module docstring)."""
    if cfg.builder == "chain":
        return tree_from_stage(cfg, session, session.draft(anchor, depth, temperature, generator), anchor, nodes,
                               draft_s)
    if cfg.builder == "ddtree":  # the marginals (a head's: along its greedy picks)
        return tree_from_stage(cfg, session, session.draft(anchor, depth, 0.0, None), anchor, nodes, draft_s)
    hidden, anchor = session.draft_hidden(anchor, depth)
    return _path_tree(cfg, session, hidden, anchor, nodes, draft_s)


def tree_from_stage(cfg: TreeConfig, session, st, anchor: torch.Tensor, nodes: int, draft_s=None) -> DraftTree:
    """The tree of an already drafted stage ``st`` (anchored at ``anchor``; the session's newest stage): its
    chain, its marginals' best-first tree, or the path tree over its block (DLoop's last stage)."""
    if cfg.builder == "chain":
        toks = st.tokens.tolist()
        if cfg.cost is not None:
            gains = torch.cumsum(st.logprobs.float(), 0).exp().tolist()
            nodes = _cap(cfg, gains, nodes, draft_s)
        toks = toks[:nodes]
        return DraftTree(toks, list(range(len(toks))), list(range(1, len(toks) + 1)), [0] * len(toks))
    if cfg.builder == "ddtree":
        values, ids = _topk_host(st.logits, cfg.top_k)
        order = best_first(values, nodes)
        order = order[: _cap(cfg, [math.exp(s) for *_, s in order], nodes, draft_s)]
        return DraftTree([ids[d][r] for d, _, r, _ in order], [p for _, p, _, _ in order],
                         [d + 1 for d, *_ in order], [r for _, _, r, _ in order])
    return _path_tree(cfg, session, session.stages[-1].hidden, anchor.reshape(1), nodes, draft_s)


def build_dloop_tree(cfg: TreeConfig, dloop, session, anchor: torch.Tensor, room, nodes, temperature: float,
                     generator, draft_s: float | None = None) -> DraftTree:
    """DLoop with a tree: stages drafted as chains while the gate is open (the chain engine's loop), the last
    one turned into a tree (:func:`tree_from_stage`) hanging below the earlier stages' chain. ``room(m)``: the
    drafts a stage may add after m; ``nodes(m)``: the last stage's tree budget after a chain of m."""
    stages = [session.draft(anchor, room(0), temperature, generator)]
    while room(m := sum(st.tokens.numel() for st in stages)) > 0 and \
            dloop.should_continue(len(stages), dloop.confidence(stages[-1].logprobs)):
        stages.append(session.draft(stages[-1].tokens[-1:], room(m), temperature, generator))
    prefix = torch.cat([st.tokens.reshape(-1) for st in stages[:-1]]).tolist() if len(stages) > 1 else []
    last_anchor = stages[-2].tokens[-1:] if len(stages) > 1 else anchor
    m0 = len(prefix)
    sub = tree_from_stage(cfg, session, stages[-1], last_anchor, nodes(m0), draft_s)
    return DraftTree(prefix + sub.tokens, list(range(m0)) + [p + m0 for p in sub.parents],
                     list(range(1, m0 + 1)) + [d + m0 for d in sub.depths], [0] * m0 + sub.ranks, len(stages))


@torch.no_grad()
def _path_tree(cfg: TreeConfig, session, hidden: torch.Tensor, anchor: torch.Tensor, nodes: int, draft_s) -> DraftTree:
    """Best-first under the path-conditioned scores, expanded depth by depth: each depth keeps the ``nodes`` best
    of (frontier node × its top-k children) by cumulative log-probability, all on the device; then the ``nodes``
    best of everything expanded are the tree. That is the exact best-first tree (a child never outscores its
    parent, so the best n nodes at a depth all hang below the best n of the depth above)."""
    depth, dev, k = hidden.shape[0] - 1, hidden.device, cfg.top_k
    head = session.path_head(hidden, anchor)
    states, score = head.start(), torch.zeros(1, device=dev)
    frontier = torch.zeros(1, dtype=torch.long, device=dev)  # candidate ids (0 = the anchor)
    cols, next_id = [], 1
    for d in range(depth):
        logits, inherited = head.step(d, states)  # [F, V]
        v, ids = torch.log_softmax(logits.float(), -1).topk(k, -1)  # [F, k]
        cand = (score[:, None] + v).reshape(-1)
        score, j = cand.topk(min(nodes, cand.numel()))  # the depth's best, best first
        rows, tok = j // k, ids.reshape(-1).index_select(0, j)
        q = j.numel()
        cols.append(torch.stack([score, frontier.index_select(0, rows).float(), tok.float(), (j % k).float(),
                                 torch.full((q,), float(d + 1), device=dev)]))
        frontier = torch.arange(next_id, next_id + q, device=dev)
        next_id += q
        states = head.child(inherited, rows, tok)
    if not cols:
        return DraftTree()
    scores, parents, tokens, ranks, depths = torch.cat(cols, 1).tolist()  # one host copy ([5, M], M <= n·K)
    best = sorted(range(len(scores)), key=lambda i: (-scores[i], depths[i]))[:nodes]
    best = best[: _cap(cfg, [math.exp(scores[i]) for i in best], nodes, draft_s)]
    best.sort()  # candidate ids grow with depth: parents first
    new_id = {0: 0, **{i + 1: n + 1 for n, i in enumerate(best)}}
    return DraftTree([int(tokens[i]) for i in best], [new_id[int(parents[i])] for i in best],
                     [int(depths[i]) for i in best], [int(ranks[i]) for i in best])


# --------------------------------------------------------------------------- verify, walk


def tree_inputs(tree: DraftTree, anchor: torch.Tensor, start: int, kv_len: int, dtype: torch.dtype):
    """The verify forward's ``(ids [n+1], position_ids [1, n+1], mask [1, 1, n+1, kv_len])``: node i sees the
    committed slots ``0 .. start-1``, its ancestors (the anchor included) and itself; additive (0 / dtype min)."""
    n, dev = len(tree), anchor.device
    parents = np.asarray([0] + tree.parents, dtype=np.int64)
    anc = np.eye(n + 1, dtype=bool)
    idx = np.arange(n + 1)
    cur = idx.copy()
    for _ in range(max(tree.depths, default=0)):
        cur = parents[cur]
        anc[idx, cur] = True
    mask = torch.full((n + 1, kv_len), torch.finfo(dtype).min, dtype=dtype)
    mask[:, :start] = 0
    mask[:, start: start + n + 1].masked_fill_(torch.from_numpy(anc), 0)
    ids = torch.cat([anchor.reshape(1), torch.tensor(tree.tokens, dtype=torch.long, device=dev)])
    pos = torch.tensor([[start] + [start + d for d in tree.depths]], dtype=torch.long, device=dev)
    return ids, pos, mask[None, None].to(dev)


def walk(tree: DraftTree, logits: torch.Tensor, temperature: float, generator) -> tuple[list[int], list[int]]:
    """The accepted path from the root → (accepted node ids 1..n in order, committed tokens = their tokens + the
    bonus). ``logits [n+1, V]``: row u is the target's next-token distribution after node u. T = 0: the target's
    argmax; T > 0: one sample per node (all drawn at once; only the visited ones are used)."""
    from lit_domino.decoding.sampling import pick

    picks = pick(logits, temperature, generator).tolist()  # [n+1] one host copy
    kids = {(p, t): i + 1 for i, (p, t) in enumerate(zip(tree.parents, tree.tokens))}
    path, u = [], 0
    while (u, picks[u]) in kids:
        u = kids[(u, picks[u])]
        path.append(u)
    return path, [tree.tokens[i - 1] for i in path] + [picks[u]]


# --------------------------------------------------------------------------- the loop


def tree_speculative(target, drafter, prompt, max_new_tokens, temperature, block_size, cfg: TreeConfig, generator,
                     options, runner, capacity: int, dloop=None):
    """Tree rounds for one prompt (``generate(..., tree=cfg)``); the result has the chain engine's fields plus
    ``accepted_ranks`` (the sibling rank of every accepted node)."""
    from lit_domino.decoding.engine import (GenerationResult, _charge, _Clock, _close_round, _commit, _pick_first,
                                            context_limit)
    from lit_domino.decoding.engine import feature_layers
    from lit_domino.target.load import select_features

    eos, layers = set(target.eos_token_ids), feature_layers(drafter)
    clock = _Clock(prompt.device)
    anchor, feats = _pick_first(runner.prefill(prompt, layers is not None), temperature, generator, layers)
    session = drafter.new_session(**options)
    session.extend(prompt, feats)
    clock.lap("prefill")
    res = GenerationResult(tokens=[], num_target_forwards=1)
    start = prompt.shape[0]
    done = _commit(res, [int(anchor)], eos, max_new_tokens)
    limit = context_limit(target, drafter)
    dtype = target.model.dtype
    draft_s = None  # the measured draft time per round (an average), the cost rule's C_draft
    while not done:
        room = capacity - 1 - start if limit is None else min(capacity, limit) - 1 - start
        wanted = max_new_tokens - len(res.tokens) - 1  # deeper nodes could never be emitted
        depth, nodes = min(block_size - 1, room, wanted), min(cfg.budget, room)
        t0 = time.perf_counter()
        if depth <= 0:
            tree = DraftTree()
        elif dloop is None or dloop.max_stages == 1:  # one stage: plain rounds, as in the chain engine
            tree = build_tree(cfg, session, anchor, depth, nodes, temperature, generator, draft_s)
        else:  # the chain engine's DLoop stages (full stages: no cap by the tokens wanted), the last one a tree
            tree = build_dloop_tree(cfg, dloop, session, anchor, lambda m: min(block_size - 1, room - m),
                                    lambda m: min(cfg.budget, room - m), temperature, generator, draft_s)
        clock.lap("draft")
        spent = time.perf_counter() - t0
        draft_s = spent if draft_s is None else 0.8 * draft_s + 0.2 * spent
        kv_len = runner.capacity if runner.static else start + len(tree) + 1
        ids, pos, mask = tree_inputs(tree, anchor, start, kv_len, dtype)
        out = runner.forward(ids, layers is not None, position_ids=pos, attention_mask=mask)
        clock.lap("verify")
        path, committed = walk(tree, out.logits[0], temperature, generator)
        acc = len(path)
        compact_cache(runner.cache, [start + i for i in path], start + 1)
        runner.crop(start + acc + 1)
        clock.lap("other")
        session.crop(start)
        feats = None
        if layers is not None:  # the features of the anchor and the accepted path
            keep = torch.tensor([0] + path, device=prompt.device)
            feats = select_features(out.hidden_states, layers)[0].index_select(0, keep)
        session.extend(torch.tensor([int(anchor)] + committed[:-1], device=prompt.device), feats)
        clock.lap("draft")
        res.accepted_ranks.extend(tree.ranks[i - 1] for i in path)
        res.stages_per_round.append(tree.stages if len(tree) else 0)
        res.drafted_per_round.append(len(tree))
        start += acc + 1
        anchor, done = _close_round(res, committed, eos, max_new_tokens, prompt.device)
        clock.lap("other")
    _charge(res, clock)
    return res.finish()

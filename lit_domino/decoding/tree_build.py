"""Tree builders: the draft tree of a round, grown best-first from a drafter's block (``ddtree``), by its causal
path head over the frontier (``path``), by EAGLE-3's own steps (``eagle``), or stage by stage under DLoop; a
cost-aware tree verifies the best-first prefix CaDDTree's rule picks (:mod:`lit_domino.decoding.tree`)."""

from __future__ import annotations

import bisect
import heapq
import math
import time
from typing import Protocol

import torch

from lit_domino.decoding.tree_config import DraftTree, TreeConfig
from lit_domino.models.capabilities import capabilities_of


class PathHead(Protocol):
    """A drafter's head over a tree's frontier, what :func:`_path_tree` expands (the path heads of Domino, DSpark
    and DFlash 2, ``session.path_head``; EAGLE-3's ``session.tree_head``): every frontier node of a depth in one
    batch, each node's children drafted from its own path."""

    vocab_size: int
    """V: a drawn tree's ``DraftTree.q`` rows are over the vocabulary."""

    def start(self):
        """The root's state (the anchor's)."""

    def step(self, i: int, states) -> tuple[torch.Tensor, torch.Tensor | None, object]:
        """The frontier at depth i (its states, F nodes) → (its children's logits over their candidates [F, C],
        the candidates' token ids [1, C] (shared by the frontier) or [F, C], or None when C = V and a column is
        its token id; what the children inherit). The tree scores a child by the softmax of these logits over
        the candidates: with a candidate pool, the pool's q, as the chain's."""

    def child(self, inherited, rows: torch.Tensor, tokens: torch.Tensor):
        """The states of the next frontier: the children of frontier rows ``rows`` [F'] holding ``tokens`` [F']."""


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


def _draws(logq: torch.Tensor, k: int, generator) -> torch.Tensor:
    """k draws without replacement from each row of exp(``logq``) [F, V], in draw order → ids [F, k]: the top-k
    of logq + Gumbel noise (Gumbel-top-k: the same law as drawing one at a time and renormalising)."""
    u = torch.rand(logq.shape, generator=generator, device=logq.device).clamp_min_(torch.finfo(torch.float32).tiny)
    noise = u.log_().neg_().log_()  # -Gumbel = log Exp(1) (exponential_ measured slower than rand + 2 logs)
    return (logq - noise).topk(min(k, logq.shape[-1]), -1).indices


def _drawn(cfg: TreeConfig, temperature: float) -> bool:
    """Whether this round's children are drawn from q (``draw="sample"`` at T > 0) rather than its top-k."""
    from lit_domino.models.sessions import is_greedy

    return cfg.draw == "sample" and not is_greedy(temperature)


def _cap(cfg: TreeConfig, gains: list[float], nodes: int, draft_s: float | None) -> int:
    """Nodes to verify: ``nodes`` (the budget left this round), or CaDDTree's choice under it."""
    if cfg.cost is None:
        return nodes
    return cfg.cost.best_nodes(gains, nodes, draft_s)


def _gains(cfg: TreeConfig, gains: list[float]) -> list[float] | None:
    """:attr:`DraftTree.gains` of a tree whose nodes have ``gains``: kept where a cost rule chose the tree."""
    return None if cfg.cost is None else gains


def build_tree(cfg: TreeConfig, session, anchor: torch.Tensor, depth: int, nodes: int, temperature: float,
               generator, draft_s: float | None = None, started: float | None = None) -> DraftTree:
    """A tree of at most ``nodes`` nodes and ``depth`` levels below ``anchor`` [1] (see the module docstring)."""
    if cfg.builder == "chain":
        return tree_from_stage(cfg, session, session.draft(anchor, depth, temperature, generator), anchor, nodes,
                               draft_s, temperature, generator)
    if cfg.builder == "ddtree":  # the marginals (a head's: along its greedy picks)
        return tree_from_stage(cfg, session, session.draft(anchor, depth, 0.0, None), anchor, nodes, draft_s,
                               temperature, generator)
    if capabilities_of(session.drafter).tree_head:  # EAGLE-3: its own steps over the tree (eagle: EAGLE-2's frontier of k)
        head = session.tree_head(anchor, depth)
        width = cfg.top_k if cfg.builder == "eagle" and not _drawn(cfg, temperature) else nodes
        return _path_tree(cfg, head, depth, nodes, width, draft_s, temperature, generator, started)
    hidden, anchor = session.draft_hidden(anchor, depth)
    return _path_tree(cfg, session.path_head(hidden, anchor), hidden.shape[0] - 1, nodes, nodes, draft_s,
                      temperature, generator, started)


def tree_from_stage(cfg: TreeConfig, session, st, anchor: torch.Tensor, nodes: int, draft_s=None,
                    temperature: float = 0.0, generator=None, started: float | None = None) -> DraftTree:
    """The tree of an already drafted stage ``st`` (anchored at ``anchor``; the session's newest stage): its
    chain, its marginals' best-first tree, or the path tree over its block (DLoop's last stage)."""
    if cfg.builder == "chain":
        toks = st.tokens.tolist()
        if cfg.cost is not None:
            gains = torch.cumsum(st.logprobs.float(), 0).exp().tolist()
            nodes = _cap(cfg, gains, nodes, draft_s)
        toks = toks[:nodes]
        q = None
        if st.probs is not None:  # node u's child was drawn from the chain's row u
            q = torch.cat([st.probs[: len(toks)].float(), st.probs.new_zeros(1, st.probs.shape[-1]).float()])
        return DraftTree(toks, list(range(len(toks))), list(range(1, len(toks) + 1)), [0] * len(toks), q=q,
                         gains=gains[: len(toks)] if cfg.cost is not None else None)
    if cfg.builder == "ddtree":
        if not _drawn(cfg, temperature):
            values, ids = _topk_host(st.logits, cfg.top_k)
            order = best_first(values, nodes)
            gains = [math.exp(s) for *_, s in order]
            order = order[: _cap(cfg, gains, nodes, draft_s)]
            return DraftTree([ids[d][r] for d, _, r, _ in order], [p for _, p, _, _ in order],
                             [d + 1 for d, *_ in order], [r for _, _, r, _ in order],
                             gains=_gains(cfg, gains[: len(order)]))
        # drawn: the same best-first shape on the rank-ordered marginals at T (independent of the draws), each
        # node's children drawn without replacement from its depth's marginal
        logq = torch.log_softmax(st.logits.float() / temperature, -1)  # [K, V]
        values = logq.topk(min(cfg.top_k, logq.shape[-1]), -1).values.tolist()
        order = best_first(values, nodes)
        gains = [math.exp(s) for *_, s in order]
        order = order[: _cap(cfg, gains, nodes, draft_s)]
        level = torch.tensor([0] + [min(d + 1, logq.shape[0] - 1) for d, *_ in order], device=logq.device)
        rows = logq.index_select(0, level)  # [n+1, V] row u: the marginal u's children are drawn from
        ids = _draws(rows, cfg.top_k, generator).tolist()
        return DraftTree([ids[p][r] for _, p, r, _ in order], [p for _, p, _, _ in order],
                         [d + 1 for d, *_ in order], [r for _, _, r, _ in order], q=rows.exp(),
                         gains=_gains(cfg, gains[: len(order)]))
    return _path_tree(cfg, session.path_head(session.stages[-1].hidden, anchor.reshape(1)),
                      session.stages[-1].hidden.shape[0] - 1, nodes, nodes, draft_s, temperature, generator, started)


def build_dloop_tree(cfg: TreeConfig, dloop, session, anchor: torch.Tensor, room, nodes, temperature: float,
                     generator, draft_s: float | None = None, started: float | None = None) -> DraftTree:
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
    sub = tree_from_stage(cfg, session, stages[-1], last_anchor, nodes(m0), draft_s, temperature, generator, started)
    return DraftTree(prefix + sub.tokens, list(range(m0)) + [p + m0 for p in sub.parents],
                     list(range(1, m0 + 1)) + [d + m0 for d in sub.depths], [0] * m0 + sub.ranks, len(stages))


@torch.no_grad()
def _path_tree(cfg: TreeConfig, head: PathHead, depth: int, nodes: int, width: int, draft_s,
               temperature: float = 0.0, generator=None, started: float | None = None) -> DraftTree:
    """Best-first under the path-conditioned scores, expanded depth by depth: each depth scores (frontier node ×
    its top-k children) by cumulative log-probability and keeps the ``nodes`` best as candidates, of which the
    ``width`` best are the next frontier; then the ``nodes`` best of all candidates are the tree. ``width =
    nodes`` (``path``) is the exact best-first tree (a child never outscores its parent, so the best n nodes at a
    depth all hang below the best n of the depth above); ``width = k`` is EAGLE-2's. The head's work stays on the
    device; each depth copies its (at most ``nodes``) candidate scores to the host, where the pruning below and
    the cost rule read them.

    A child's log-probability is the softmax of the head's logits over its parent's candidates
    (:class:`PathHead`; with a candidate pool, over the pool, as the chain's q), so the search runs on C columns,
    not V.

    Drawn (:func:`_drawn`): each frontier node's k children are draws from q without replacement, scored by q's
    rank-ordered probabilities (the i-th draw by the i-th largest q), so a child's place never depends on its
    own token; the stable sort keeps each node's children a prefix of its draws; ``DraftTree.q`` row u is the q
    node u's children were drawn from (0 outside its candidates).

    Cost-aware (``cfg.cost``): the tree is grown as with a fixed budget of ``nodes`` (a cost-aware round's
    :meth:`~lit_domino.decoding.tree.TreeProposer.grown`) and the rule then verifies its best-first prefix, with
    C_draft ``draft_s`` or, with ``started`` (``time.perf_counter()`` when the round began drafting), what this
    round has drafted. Testing at every depth which frontier nodes could still reach the
    rule's choice cost more than the head steps it saved, for every drafter measured (EAGLE-3's included;
    docs/results.md, 2026-12-07 (evening)), so the tree is not pruned by the rule while it grows."""
    if depth <= 0:
        return DraftTree()
    k, drawn = cfg.top_k, _drawn(cfg, temperature)
    states, score = head.start(), None
    # depth d's candidates are ids offset[d] + 1 .. offset[d] + len(scores[d]) (0 = the anchor), best first; its
    # first ones are the frontier depth d+1 expands, so a child of frontier row r at depth d+1 has parent
    # offset[d] + 1 + r
    offset, scores, picks, toks, widths, qrows = [], [], [], [], [], []
    kept: list[float] = []  # the ``nodes`` best scores of all candidates so far, best first
    for d in range(depth):
        logits, cand, inherited = head.step(d, states)  # [F, C], C's token ids [1 | F, C] (None: C = V)
        kk = min(k, logits.shape[-1])
        logq = torch.log_softmax(logits.float() / temperature if drawn else logits.float(), -1)  # [F, C]
        if drawn:
            v, col = logq.topk(kk, -1).values, _draws(logq, kk, generator)  # [F, k]
            qrows.append((logq, cand))
        else:
            v, col = logq.topk(kk, -1)  # [F, k]
        ids = col if cand is None else cand.expand(col.shape[0], -1).gather(1, col)  # [F, k] token ids
        total = v if score is None else score[:, None] + v  # cumulative log-probabilities [F, k]
        score, j = total.reshape(-1).sort(descending=True, stable=True)  # ties: the lower rank first
        q = min(nodes, j.numel())
        score, j = score[:q], j[:q]
        tok = ids.reshape(-1).index_select(0, j)
        new = score.tolist()
        offset.append(offset[-1] + len(scores[-1]) if scores else 0)
        scores.append(new), picks.append(j), toks.append(tok), widths.append(kk)
        # exact pruning: a child never outscores its parent, and of equal scores the shallower node ranks first,
        # so a frontier node below the n-th best score found so far has no descendant in the tree: expand only
        # those at or above it, and stop once none is (the deep levels of a peaked draft cost nothing)
        kept = sorted(kept + new, reverse=True)[:nodes]
        f = min(width, q)
        if len(kept) >= nodes:
            f = sum(1 for x in new[:f] if x >= kept[-1])
        if f == 0 or d + 1 == depth:
            break
        score = score[:f]
        states = head.child(inherited, j[:f] // kk, tok[:f])
    flat = [x for depth_scores in scores for x in depth_scores]  # candidate c has id c + 1
    best = sorted((c for c, x in enumerate(flat) if x >= kept[-1]), key=lambda c: -flat[c])[:nodes]  # ties: shallower
    spent = draft_s if started is None else time.perf_counter() - started
    gain = {c: math.exp(flat[c]) for c in best}
    chosen = sorted(best[: _cap(cfg, list(gain.values()), len(best), spent)])  # parents first
    rows, tokens = torch.stack([torch.cat(picks), torch.cat(toks)]).tolist()  # one host copy
    level = [bisect.bisect_right(offset, c) - 1 for c in chosen]
    new_id = {0: 0, **{c + 1: u for u, c in enumerate(chosen, 1)}}
    tree = DraftTree([tokens[c] for c in chosen],
                     [new_id[offset[d - 1] + 1 + rows[c] // widths[d] if d else 0] for c, d in zip(chosen, level)],
                     [d + 1 for d in level], [rows[c] % widths[d] for c, d in zip(chosen, level)],
                     gains=_gains(cfg, [gain[c] for c in chosen]))
    if drawn:  # row u: the q node u's children were drawn from (0 outside its candidates; zeros if never expanded)
        parts, where = [], []
        for d, (logq, cand) in enumerate(qrows):  # depth d expanded the anchor (d = 0) or depth d-1's first rows
            found = [(u, r) for r in range(logq.shape[0])
                     if (u := new_id.get(offset[d - 1] + 1 + r if d else 0)) is not None]
            if found:
                where += [u for u, _ in found]
                sel = torch.tensor([r for _, r in found], device=logq.device)
                probs = logq.index_select(0, sel).exp()  # the tree's rows only: [F, V] exps at C = V are not cheap
                parts.append(probs if cand is None else probs.new_zeros(len(found), head.vocab_size).scatter_(
                    1, cand.expand(logq.shape[0], -1).index_select(0, sel), probs))
        tree.q = parts[0].new_zeros(len(tree) + 1, head.vocab_size).index_copy_(
            0, torch.tensor(where, device=parts[0].device), torch.cat(parts))
    return tree

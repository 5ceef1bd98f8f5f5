"""Verifying a draft tree in one target forward and walking it: the tree's inputs (ids, positions, the
ancestor mask), the greedy / sampling walk and the multi-draft walk (:mod:`lit_domino.decoding.tree`)."""

from __future__ import annotations

import numpy as np
import torch

from lit_domino.decoding.tree_config import DraftTree


def chain_first(tree: DraftTree) -> DraftTree:
    """``tree`` with its main chain first: the anchor's rank-0 child, that node's rank-0 child, .. as nodes 1..L,
    then the other nodes in their order (parents still before children; ``q``'s rows alike). Most accepted paths
    are a prefix of the main chain (most accepted nodes are rank 0 in the default preset's tree study),
    and such a prefix is where compaction puts it already (:func:`compact_cache` moves nothing)."""
    first: dict[int, int] = {}  # parent -> its rank-0 child
    for i, (par, r) in enumerate(zip(tree.parents, tree.ranks), 1):
        if r == 0:
            first.setdefault(par, i)
    chain, u = [], 0
    while u in first:
        u = first[u]
        chain.append(u)
    if chain == list(range(1, len(chain) + 1)):
        return tree
    on = set(chain)
    order = chain + [i for i in range(1, len(tree) + 1) if i not in on]
    new = {0: 0, **{old: i for i, old in enumerate(order, 1)}}
    q = None if tree.q is None else tree.q.index_select(0, torch.tensor([0] + order, device=tree.q.device))
    return DraftTree([tree.tokens[o - 1] for o in order], [new[tree.parents[o - 1]] for o in order],
                     [tree.depths[o - 1] for o in order], [tree.ranks[o - 1] for o in order], tree.stages, q,
                     None if tree.gains is None else [tree.gains[o - 1] for o in order])


def tree_inputs(tree: DraftTree, anchor: torch.Tensor, start: int, kv_len: int, dtype: torch.dtype):
    """The verify forward's ``(ids [n+1], position_ids [1, n+1], mask [1, 1, n+1, kv_len])``: node i sees the
    committed slots ``0 .. start-1``, its ancestors (the anchor included) and itself; additive (0 / dtype min).
    A chain (every node the child of the one before, as :func:`chain_first` puts a one-path tree) verifies as the
    chain engine does: ``(ids, None, None)``, consecutive positions under the target's own causal mask."""
    n, dev = len(tree), anchor.device
    ids = torch.cat([anchor.reshape(1), torch.tensor(tree.tokens, dtype=torch.long, device=dev)])
    if tree.parents == list(range(n)):
        return ids, None, None
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


def walk_multidraft(tree: DraftTree, logits: torch.Tensor, temperature: float, generator
                    ) -> tuple[list[int], list[int]]:
    """The q-aware walk (SpecTr / Sequoia without replacement; module docstring) → as :func:`walk`. Needs
    ``tree.q`` (the children drawn from it, in rank order); at T = 0 it is the greedy walk."""
    from lit_domino.decoding.sampling import residual, target_probs
    from lit_domino.models.sessions import is_greedy

    if is_greedy(temperature) or not len(tree):
        return walk(tree, logits, temperature, generator)
    if tree.q is None:
        raise ValueError("the multi-draft walk needs the tree's draft distributions (DraftTree.q)")
    probs = target_probs(logits, temperature)  # [n+1, V]
    kids: dict[int, list[tuple[int, int]]] = {}
    for i, (par, r) in enumerate(zip(tree.parents, tree.ranks)):
        kids.setdefault(par, []).append((r, i + 1))
    path, u = [], 0
    while True:
        p, nxt = probs[u], None
        if u in kids:
            q = tree.q[u].to(p.device, p.dtype).clone()
            for _, c in sorted(kids[u]):  # draw order
                x = tree.tokens[c - 1]
                px, qx = float(p[x]), float(q[x])
                if float(torch.rand((), generator=generator, device=p.device)) * qx < px:  # min(1, p/q)
                    nxt = c
                    break
                p = residual(p, q)
                q[x] = 0
                q = q / q.sum().clamp_min(1e-30)
        if nxt is None:  # no child accepted: the bonus from the residual
            bonus = int(torch.multinomial(p, 1, generator=generator))
            return path, [tree.tokens[i - 1] for i in path] + [bonus]
        path.append(nxt)
        u = nxt

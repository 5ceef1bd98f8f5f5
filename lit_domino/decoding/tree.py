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
     the Markov head on each node's token, PCTree; DFlash 2: the selector's transition from each node's
     token over its position's candidates); each depth keeps the n best of parent × top-k candidates by
     cumulative log-probability, and the n best of all of them are the tree: the exact best-first tree under
     the path-conditioned scores. A child's log-probability is normalised over its parent's candidates, as the
     chain's q: with a candidate pool (``pool_size``, Domino and DSpark) the top-P tokens of its position's base
     logits, DFlash 2's selector's c, else the vocabulary (:class:`PathHead`);
   * ``eagle``: EAGLE-2's dynamic tree for the EAGLE-3 drafter: each depth expands the top-k nodes of the frontier
     by cumulative log-probability (one batched drafter step over them, a tree mask over the drafter's own
     context: each node sees the committed steps and its ancestors), then all candidates are reranked by
     cumulative log-probability and the best n kept (parents before children). ``path`` on EAGLE-3 is the same
     expansion with a frontier of n, the exact best-first tree.

   ``draw="sample"`` (T > 0) draws each node's children from the drafter's q = softmax(logits / T) without
   replacement instead of taking its top-k; the tree's shape is then chosen on the rank-ordered probabilities of
   q (what the top-k children would score), never on a drawn token's own score, so that whether a child is in
   the tree does not depend on which token it drew: what the multi-draft rule needs.

2. verify: ONE target forward over ``[x, nodes]`` with a 4-D additive mask (each node sees the committed
   context, its ancestors and itself) and positions ``start + depth``.
3. walk from the root: at T = 0 follow the target's argmax while it is a child; at T > 0 the target samples a
   token at every node and the walk follows the sample while it is a child. The first miss is the bonus. Every
   committed token is the target's own pick or sample given its committed prefix, and the tree does not depend
   on the target's draws, so the output is exactly the target's at any temperature.
   ``acceptance="multidraft"`` (SpecTr / Sequoia, without replacement): at a node with target p and draft q, its
   children x_1, x_2, .. (in draw order) are tried in turn: x accepted with probability min(1, p(x) / q(x)),
   else p <- norm(max(p - q, 0)) and q <- q without x, renormalised; no child accepted: the bonus is drawn from
   the residual p. Exact when the children were drawn from q without replacement (``draw="sample"``).
4. compact: the accepted nodes' K/V move to slots ``start+1 .. start+acc`` (:func:`lit_domino.decoding.kv.
   compact_cache`), the cache is cropped to ``start+acc+1``, and the drafter's session is cropped to ``start`` and
   extended with the anchor and the accepted path with their target features.

``budget`` caps n (nodes beyond the anchor); ``cost`` (:class:`lit_domino.decoding.cost.VerifyCost`) makes it
cost-aware: each round verifies the best-first prefix CaDDTree's rule picks, and a path tree expands only the
nodes whose descendants that choice could hold.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from lit_domino.decoding.cost import VerifyCost
from lit_domino.decoding.round import Proposal, Verdict
from lit_domino.models.capabilities import capabilities_of
from lit_domino.runtime.command import UsageError

BUILDERS = ("chain", "ddtree", "path", "eagle")
ACCEPTANCE = ("sample", "multidraft")
"""The walk: ``sample`` (the target samples at every node, the walk follows it) or ``multidraft`` (q-aware)."""
DRAWS = ("top", "sample")
"""How a node's children are chosen: its drafter's top-k, or k draws from q without replacement (T > 0)."""
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
    acceptance: str = "sample"
    """One of :data:`ACCEPTANCE`: ``sample`` (the target samples at each node, the walk follows the sample) or
    ``multidraft`` (the q-aware rule without replacement, module docstring; needs ``draw="sample"``)."""
    draw: str = "top"
    """One of :data:`DRAWS`: ``top`` (each node's top-k children) or ``sample`` (k draws from q without
    replacement at T > 0; at T = 0 the top-k). The chain samples its tokens at T > 0 either way."""

    def __post_init__(self):
        if self.builder not in BUILDERS:
            raise TreeError(f"TreeConfig.builder must be one of {BUILDERS}, got {self.builder!r}")
        if self.acceptance not in ACCEPTANCE:
            raise TreeError(f"TreeConfig.acceptance must be one of {ACCEPTANCE}, got {self.acceptance!r}")
        if self.draw not in DRAWS:
            raise TreeError(f"TreeConfig.draw must be one of {DRAWS}, got {self.draw!r}")
        if self.acceptance == "multidraft" and self.draw == "top":
            raise TreeError("TreeConfig.acceptance='multidraft' needs draw='sample': the rule accepts a child x with "
                            "probability min(1, p(x)/q(x)), which is exact only if the children were drawn from q "
                            "(without replacement); deterministic top-k children are not, and would bias the output")
        if self.acceptance == "multidraft" and self.cost is not None and self.builder != "ddtree":
            raise TreeError(f"TreeConfig.cost with acceptance='multidraft' works with builder='ddtree' only: the "
                            f"cost rule's cut of a {self.builder!r} tree reads the drawn tokens' own scores, so "
                            f"whether a child is kept would depend on its draw (biased)")
        for name in ("budget", "top_k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise TreeError(f"TreeConfig.{name} must be an integer >= 1, got {v!r}")
            object.__setattr__(self, name, int(v))
        if self.cost is not None and not isinstance(self.cost, VerifyCost):
            raise TreeError(f"TreeConfig.cost must be a VerifyCost or None, got {type(self.cost).__name__}")

    def label(self) -> str:
        """``builder:BUDGET[kTOP_K][+cost][+drawn][+multidraft]`` (:meth:`parse` reads it back, ``+cost`` aside)."""
        core = f"{self.builder}:{self.budget}" + (f"k{self.top_k}" if self.builder != "chain" else "")
        return (core + ("+cost" if self.cost is not None else "") + ("+drawn" if self.draw == "sample" else "")
                + ("+multidraft" if self.acceptance == "multidraft" else ""))

    @classmethod
    def parse(cls, spec: str) -> "TreeConfig":
        """A :meth:`label` back into a config: ``chain``, ``ddtree:32k4``, ``eagle:32k4+drawn+multidraft``;
        a missing budget or top-k takes the default (``+multidraft`` implies ``+drawn``). ``+cost`` needs a
        measured curve, so it is refused here (:class:`TreeError` naming the spec)."""
        text = str(spec).strip()
        core, *flags = text.split("+")
        builder, _, sizes = core.partition(":")
        kw = {}
        if sizes:
            budget, _, k = sizes.partition("k")
            try:
                kw["budget"] = int(budget)
                if k:
                    kw["top_k"] = int(k)
            except ValueError:
                raise TreeError(f"tree spec {text!r}: expected builder[:BUDGET[kTOP_K]], e.g. ddtree:32k4") from None
        for flag in flags:
            if flag == "drawn":
                kw["draw"] = "sample"
            elif flag == "multidraft":
                kw["acceptance"], kw["draw"] = "multidraft", "sample"
            else:
                raise TreeError(f"tree spec {text!r}: unknown flag +{flag} (the flags are +drawn and +multidraft; "
                                f"a cost-aware tree needs a measured curve: TreeConfig(cost=...))")
        return cls(builder.strip(), **kw)


@dataclass
class DraftTree:
    """A round's tree: node i+1 (node 0 is the anchor) in lists on the host, parents before children."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    """Parent node of each node (0 = the anchor)."""
    depths: list[int] = field(default_factory=list)
    """1 .. K; the node's position is ``start + depth``."""
    ranks: list[int] = field(default_factory=list)
    """Each node's rank among its parent's candidates (0 = the drafter's top pick there; drawn children: the
    draw order, the order the multi-draft walk tries them in)."""
    stages: int = 1
    """Drafting stages the tree came from (DLoop: its chain stages and the last stage's tree)."""
    q: torch.Tensor | None = None
    """[n+1, V] row u: the draft distribution node u's children were drawn from (``draw="sample"`` at T > 0 and
    the sampled chain; what the multi-draft walk needs): with a candidate pool, q over the pool and 0 elsewhere;
    None otherwise."""

    def __len__(self) -> int:
        return len(self.tokens)


def check_tree(tree, target, drafter, *, compile: bool, longest_prompt: int, limit: int | None,
               dloop=None) -> None:
    """Everything a tree request needs, checked before decoding (:class:`TreeError` with the reason)."""
    if not isinstance(tree, TreeConfig):
        raise TreeError(f"tree must be a TreeConfig or None, got {type(tree).__name__}")
    if drafter is None:
        raise TreeError("tree verification needs a drafter (drafter=None is plain autoregressive decoding)")
    caps = capabilities_of(drafter)
    kind, builders = caps.kind, caps.tree_builders
    if not builders:
        raise TreeError(f"a {kind} drafter drafts token by token and has no tree builder here; tree verification "
                        f"needs a parallel drafter (backbone, domino, dspark) or an EAGLE-3 drafter")
    if tree.builder not in builders:
        if tree.builder == "eagle":
            raise TreeError(f"the 'eagle' tree builder is EAGLE-2's tree over an EAGLE-3 drafter's own steps; a "
                            f"{kind} drafter has none (this drafter builds: {', '.join(builders)})")
        if "eagle" in builders:
            raise TreeError(f"the {tree.builder!r} tree builder needs a parallel block a {kind} drafter lacks "
                            f"(this drafter builds: {', '.join(builders)}); use builder='eagle'")
        raise TreeError(f"the {tree.builder!r} tree builder needs a causal head a {kind} drafter lacks "
                        f"(this drafter builds: {', '.join(builders)}); use domino or dspark, or builder='ddtree'")
    if dloop is not None and dloop.needs_predictor:
        raise TreeError(f"a tree round drafts its chain stages under the log-probability gates (sum, mean, scaled, "
                        f"last); the {dloop.label()!r} gate's calibrated survival does not cover tree nodes yet")
    looped = dloop is not None and dloop.max_stages > 1
    if looped and tree.builder != "chain" and "eagle" in builders:
        raise TreeError(f"DLoop with the {tree.builder!r} tree on a {kind} drafter is not supported: its tree "
                        f"grows from the drafter's own steps, not from a drafted stage (use builder='chain' with "
                        f"DLoop, or no DLoop)")
    if looped and tree.acceptance == "multidraft":
        raise TreeError("acceptance='multidraft' with DLoop is not supported: the chain stages' draft "
                        "distributions are not kept for the walk (use acceptance='sample' with DLoop)")
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
    noise = u.log_().neg_().log_()  # -Gumbel = log Exp(1) (exponential_ measured 5x slower than rand + 2 logs)
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
        return DraftTree(toks, list(range(len(toks))), list(range(1, len(toks) + 1)), [0] * len(toks), q=q)
    if cfg.builder == "ddtree":
        if not _drawn(cfg, temperature):
            values, ids = _topk_host(st.logits, cfg.top_k)
            order = best_first(values, nodes)
            order = order[: _cap(cfg, [math.exp(s) for *_, s in order], nodes, draft_s)]
            return DraftTree([ids[d][r] for d, _, r, _ in order], [p for _, p, _, _ in order],
                             [d + 1 for d, *_ in order], [r for _, _, r, _ in order])
        # drawn: the same best-first shape on the rank-ordered marginals at T (independent of the draws), each
        # node's children drawn without replacement from its depth's marginal
        logq = torch.log_softmax(st.logits.float() / temperature, -1)  # [K, V]
        values = logq.topk(min(cfg.top_k, logq.shape[-1]), -1).values.tolist()
        order = best_first(values, nodes)
        order = order[: _cap(cfg, [math.exp(s) for *_, s in order], nodes, draft_s)]
        level = torch.tensor([0] + [min(d + 1, logq.shape[0] - 1) for d, *_ in order], device=logq.device)
        rows = logq.index_select(0, level)  # [n+1, V] row u: the marginal u's children are drawn from
        ids = _draws(rows, cfg.top_k, generator).tolist()
        return DraftTree([ids[p][r] for _, p, r, _ in order], [p for _, p, _, _ in order],
                         [d + 1 for d, *_ in order], [r for _, _, r, _ in order], q=rows.exp())
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

    Cost-aware (``cfg.cost``): each depth expands only the frontier nodes whose descendants could still be in the
    rule's choice (:meth:`VerifyCost.growable`: a frontier node's descendants at one depth have gains summing to
    at most its own), and growing stops when none could, so a round drafts only what the rule can use. The rule's
    C_draft is ``draft_s``, or with ``started`` (``time.perf_counter()`` when the round began drafting) what this
    round has drafted so far, and a deeper node must also pay one more depth of the head (this round's mean per
    depth): a path tree's drafting grows with its frontier (EAGLE-3's head is a decoder step per depth), and a
    constant C_draft let it grow depths that cost more than they added (EAGLE-3's cost-aware path tree was 0.87-0.89x
    its chain so; docs/results.md has the figures since)."""
    if depth <= 0:
        return DraftTree()
    k, drawn = cfg.top_k, _drawn(cfg, temperature)
    states, score = head.start(), None
    # depth d's candidates are ids offset[d] + 1 .. offset[d] + len(scores[d]) (0 = the anchor), best first; its
    # first ones are the frontier depth d+1 expands, so a child of frontier row r at depth d+1 has parent
    # offset[d] + 1 + r
    offset, scores, picks, toks, widths, qrows = [], [], [], [], [], []
    kept: list[float] = []  # the ``nodes`` best scores of all candidates so far, best first
    first_depth = time.perf_counter()
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
        if cfg.cost is not None and f and d + 1 < depth:  # and those whose descendants the rule could choose
            now = time.perf_counter()
            spent, per_depth = (draft_s, 0.0) if started is None else (now - started, (now - first_depth) / (d + 1))
            f = cfg.cost.growable([math.exp(x) for x in kept], [math.exp(x) for x in new[:f]], depth - d - 1, nodes,
                                  spent, extra_s=per_depth)
        if f == 0 or d + 1 == depth:
            break
        score = score[:f]
        states = head.child(inherited, j[:f] // kk, tok[:f])
    flat = [x for depth_scores in scores for x in depth_scores]  # candidate c has id c + 1
    best = sorted((c for c, x in enumerate(flat) if x >= kept[-1]), key=lambda c: -flat[c])[:nodes]  # ties: shallower
    spent = draft_s if started is None else time.perf_counter() - started
    chosen = sorted(best[: _cap(cfg, [math.exp(flat[c]) for c in best], len(best), spent)])  # parents first
    rows, tokens = torch.stack([torch.cat(picks), torch.cat(toks)]).tolist()  # one host copy
    level = [bisect.bisect_right(offset, c) - 1 for c in chosen]
    new_id = {0: 0, **{c + 1: u for u, c in enumerate(chosen, 1)}}
    tree = DraftTree([tokens[c] for c in chosen],
                     [new_id[offset[d - 1] + 1 + rows[c] // widths[d] if d else 0] for c, d in zip(chosen, level)],
                     [d + 1 for d in level], [rows[c] % widths[d] for c, d in zip(chosen, level)])
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


# --------------------------------------------------------------------------- verify, walk


def chain_first(tree: DraftTree) -> DraftTree:
    """``tree`` with its main chain first: the anchor's rank-0 child, that node's rank-0 child, .. as nodes 1..L,
    then the other nodes in their order (parents still before children; ``q``'s rows alike). Most accepted paths
    are a prefix of the main chain (74-88 % of the accepted nodes are rank 0 in the default preset's tree study),
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
                     [tree.depths[o - 1] for o in order], [tree.ranks[o - 1] for o in order], tree.stages, q)


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


# --------------------------------------------------------------------------- the proposer


class TreeProposer:
    """Tree rounds for one sequence (``generate(..., tree=cfg)``; :func:`lit_domino.decoding.round.decode` runs
    them): each round's tree (:func:`build_tree`, DLoop: :func:`build_dloop_tree`) with its main chain first, its
    verify inputs (:func:`tree_inputs`) and its walk; the result gains ``accepted_ranks`` (the sibling rank of
    every accepted node)."""

    def __init__(self, cfg: TreeConfig, block_size: int, runner, limit: int | None, dtype: torch.dtype,
                 temperature: float, generator, dloop=None):
        self.cfg, self.block_size, self.runner, self.limit, self.dtype = cfg, block_size, runner, limit, dtype
        self.temperature, self.generator, self.dloop = temperature, generator, dloop
        self.draft_s = None  # the measured draft time per round (an average), the cost rule's C_draft

    def begin(self) -> None:
        self.draft_s = None

    def draft(self, session, anchor: torch.Tensor, start: int, wanted: int) -> Proposal:
        cfg, dloop, capacity = self.cfg, self.dloop, self.runner.capacity
        room = capacity - 1 - start if self.limit is None else min(capacity, self.limit) - 1 - start
        # deeper nodes than the tokens still wanted (less the bonus) could never be emitted
        depth, nodes = min(self.block_size - 1, room, wanted - 1), min(cfg.budget, room)
        t0 = time.perf_counter()
        if depth <= 0:
            tree = DraftTree()
        elif dloop is None or dloop.max_stages == 1:  # one stage: plain rounds, as in the chain engine
            tree = build_tree(cfg, session, anchor, depth, nodes, self.temperature, self.generator, self.draft_s, t0)
        else:  # the chain engine's DLoop stages (full stages: no cap by the tokens wanted), the last one a tree
            tree = build_dloop_tree(cfg, dloop, session, anchor, lambda m: min(self.block_size - 1, room - m),
                                    lambda m: min(cfg.budget, room - m), self.temperature, self.generator,
                                    self.draft_s, t0)
        tree = chain_first(tree)
        spent = time.perf_counter() - t0
        self.draft_s = spent if self.draft_s is None else 0.8 * self.draft_s + 0.2 * spent
        kv_len = capacity if self.runner.static else start + len(tree) + 1
        ids, pos, mask = tree_inputs(tree, anchor, start, kv_len, self.dtype)
        return Proposal(ids, {"position_ids": pos, "attention_mask": mask}, tree)

    def accept(self, prop: Proposal, logits: torch.Tensor, temperature: float, generator) -> Verdict:
        walker = walk_multidraft if self.cfg.acceptance == "multidraft" else walk
        path, committed = walker(prop.drafts, logits, temperature, generator)
        return Verdict(len(path), committed, path)

    def observe(self, res, prop: Proposal, v: Verdict) -> None:
        tree = prop.drafts
        res.accepted_ranks.extend(tree.ranks[i - 1] for i in v.path)
        res.stages_per_round.append(tree.stages if len(tree) else 0)
        res.drafted_per_round.append(len(tree))

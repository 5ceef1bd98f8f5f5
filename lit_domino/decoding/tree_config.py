"""A draft tree's settings (:class:`TreeConfig`, parsed from ``builder[:budget]`` specs), the tree itself
(:class:`DraftTree`: parents, depths, tokens, the draft distributions a walk needs) and the checks of a tree setting
against a target and drafter (:func:`check_tree`). The round that drafts, verifies and walks a tree:
:mod:`lit_domino.decoding.tree`."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from lit_domino.decoding.cost import VerifyCost
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
    gains: list[float] | None = None
    """Each node's gain, its path probability under the draft (what the cost rule's E(n) sums), where a cost rule
    chose the tree, for the calibration of gains (:meth:`~lit_domino.decoding.round_costs.RoundCosts.add_gains`);
    None otherwise, and for a DLoop tree (its last stage's gains hold only if the chain stages above are accepted)."""

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

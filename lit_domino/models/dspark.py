"""DSpark: the DFlash backbone plus a sequential Markov head over the previous token and a confidence head
(DeepSeek's DSpark; vLLM's ``speculators`` ``DSparkDraftModel``).

Shapes: b batch, A anchors, B block size, K = B-1 drafted positions, N rows (blocks), d width, r rank,
V vocabulary.

The backbone's parallel block gives hidden states H_k and base logits ``L_base_k`` (block position k
predicts ``x_{a+k}``, the suite's label convention). The Markov head adds a low-rank bias that depends on
the token before position k, ``x_{k-1}`` (the anchor x_a for k = 1, then the previous pick when drafting):

* ``vanilla``: ``u_k = W1[x_{k-1}]`` (a first-order Markov bigram bias);
* ``gated``: ``u_k = σ(W_g·[H_k ; W1[x_{k-1}]] + b_g) ⊙ W1[x_{k-1}]``;
* ``rnn``: a rank-r recurrent state over the block, ``[g; c; o] = W_j·[s_{k-1} ; W1[x_{k-1}] ; H_k] + b_j``,
  ``s_k = g' s_{k-1} + (1 - g') tanh(c)`` with ``g' = σ(g)``, ``u_k = tanh(o)``; the state runs from block
  slot 0 (whose previous token is the anchor itself, as speculators feeds it), or from position 1 under
  ``sample_from_anchor``.

The anchor convention (``DSparkConfig.sample_from_anchor``): False, the suite's block above; True, DeepSpec's
(its default): the block runs B-1 query rows ``[x_a, MASK × (B-2)]`` at ``a .. a+B-2`` and row j predicts
``x_{a+j+1}`` from ``x_{a+j}``; ``ParallelDrafter.slot_hidden`` puts row j at position k = j+1 (a zero row at
0), so everything below reads the same for both: position k predicts ``x_{a+k}`` from ``x_{k-1}``.

``L_k = L_base_k + W2·u_k`` (``W2``: r -> V, zero at init so a fresh DSpark drafts what its backbone does).
The confidence head is a linear layer on ``[H_k ; W1[x_{k-1}]]`` (or ``H_k`` alone): the logit of
P(position k accepted | every earlier position accepted).

The objective is DeepSpec's, against the target's distribution p_k (what predicted ``x_{a+k}``):
``0.1·CE(L_k, x_{a+k}) + 0.9·TV(q_k, p_k) + 1.0·BCE(conf_k, c*_k)``, ``c*_k = 1 − ½‖q_k − p_k‖₁`` (no
gradient), each term weighted by the block position weights ``exp(−(k−1)/γ)`` (γ = 4: DeepSpec's).

The target's distribution: a DSpark drafter's ``feature_layers`` end with the target's last decoder layer
(feature rule ``dspark``: the DFlash layers, then ``L-1``). ``hidden_states[L]`` of an HF decoder is its
final-normed output, so ``lm_head(features[..., -d:])`` are the target's logits at that position; the fusion
reads the first ``n·d`` columns only (``num_features`` = n). The cached features carry the distribution at
every position, and the lean loss applies the LM head to the labelled positions only, chunk by chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from lit_domino.models.backbone import BackboneConfig, BlockOutput
from lit_domino.models.parallel_session import ParallelSession
from lit_domino.models.distill import DistilledDrafter, previous_tokens
from lit_domino.models.layers import init_weights, memo_on_weights
from lit_domino.models.registry import register
from lit_domino.models.sessions import StageDraft, check_pool_size, compile_for, compile_mode, is_greedy, pool_stage
from lit_domino.models.objectives import (IGNORE_INDEX, LossSettings, chunked_row_sums, distill_terms, label_rows,
    confidence_bce)
from lit_domino.models.objectives.blocks import block_objective, dense, objective_rows
from lit_domino.models.objectives.registry import weighted_mean

HEAD_TYPES = ("vanilla", "gated", "rnn")
"""The Markov head's variants (speculators' ``markov_head_type``)."""


@dataclass
class DSparkHeadConfig:
    """DSpark's sequential (Markov) head and its confidence head."""

    rank: int = 256
    """Rank r of the Markov bias ``W2·W1[x_{k-1}]`` (W1: V -> r, W2: r -> V). Default 256, the paper's."""

    head_type: str = "vanilla"
    """``vanilla`` (bigram bias), ``gated`` (gated by the hidden state) or ``rnn`` (recurrent state over the
    block): speculators' ``markov_head_type``. Default vanilla."""

    confidence: bool = True
    """Whether the drafter has the confidence head (P(position accepted | earlier accepted)). Default True."""

    confidence_with_markov: bool = True
    """The confidence head reads ``[H_k ; W1[x_{k-1}]]`` (True) or ``H_k`` alone. Default True (speculators')."""

    def __post_init__(self):
        self.validate()

    def validate(self) -> "DSparkHeadConfig":
        """Raise ``ValueError`` naming the bad field (at construction: Python, YAML and ``--set`` alike)."""
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank <= 0:
            raise ValueError(f"head.rank must be a positive integer (the DSpark Markov head's rank r), got "
                             f"{self.rank!r}")
        if self.head_type not in HEAD_TYPES:
            raise ValueError(f"head.head_type: unknown DSpark head type {self.head_type!r}; choose one of "
                             f"{', '.join(HEAD_TYPES)}")
        for name in ("confidence", "confidence_with_markov"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"head.{name} must be true or false, got {getattr(self, name)!r}")
        return self


@dataclass
class DSparkConfig(BackboneConfig):
    """The backbone's config plus DSpark's heads; ``feature_layers`` end with the target's last layer."""

    head: DSparkHeadConfig = field(default_factory=DSparkHeadConfig)
    """The Markov and confidence heads."""

    sample_from_anchor: bool = False
    """DeepSpec's anchor convention (its default): the anchor slot predicts too. A block of ``block_size`` B
    then runs B-1 query rows ``[x_a, MASK × (B-2)]`` at ``a .. a+B-2``, row j predicting ``x_{a+j+1}`` from the
    previous token ``x_{a+j}`` (DeepSpec's / speculators' block of B-1 slots); False: B rows, row k >= 1
    predicting ``x_{a+k}`` (speculators' ``sample_from_anchor: false``). Either way B-1 drafted tokens and a
    verify width of B. Default False."""

    feature_rule: ClassVar[str | None] = "dspark"

    def validate(self) -> "DSparkConfig":
        super().validate()
        self.head.validate()  # again: a field may have been set after construction
        if not isinstance(self.sample_from_anchor, bool):
            raise ValueError(f"sample_from_anchor must be true or false, got {self.sample_from_anchor!r}")
        if len(self.feature_layers) < 2:
            raise ValueError(f"a DSpark drafter's feature_layers are the fused layers followed by the target's last "
                             f"layer (its distribution): need at least 2, got {self.feature_layers}")
        return self


def markov_step(h: torch.Tensor, e: torch.Tensor, state: torch.Tensor | None, gate_w: torch.Tensor | None,
                gate_b: torch.Tensor | None, joint_w: torch.Tensor | None, joint_b: torch.Tensor | None):
    """One block position of the Markov head as a function of tensors: H_k [N, d], e = W1[x_{k-1}] [N, r], the
    rnn state [N, r] (None otherwise), the variant's weights (``gated``: W_g, b_g; ``rnn``: W_j, b_j; vanilla:
    none) -> (u_k [N, r], next state)."""
    if gate_w is None and joint_w is None:  # vanilla: the bigram input itself
        return e, state
    h = h.to(e.dtype)
    if gate_w is not None:
        return torch.sigmoid(F.linear(torch.cat([h, e], dim=-1), gate_w, gate_b)) * e, state
    g, c, o = F.linear(torch.cat([state, e, h], dim=-1), joint_w, joint_b).chunk(3, dim=-1)
    g = torch.sigmoid(g)
    return torch.tanh(o), g * state + (1.0 - g) * torch.tanh(c)


def markov_block(H: torch.Tensor, base: torch.Tensor, anchor: torch.Tensor, w1: torch.Tensor, w2_t: torch.Tensor,
                 gate_w: torch.Tensor | None, gate_b: torch.Tensor | None, joint_w: torch.Tensor | None,
                 joint_b: torch.Tensor | None, noise: torch.Tensor | None, temperature: float,
                 anchor_slot: bool, ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:meth:`MarkovHead.draft`'s sequential loop as a pure function of tensors (what ``compile`` compiles, as
    Domino's ``draft_block``) -> (picks [K], corrected logits [K, P]).

    H [K+1, d] (row 0 the anchor slot's), base [K, P] the backbone logits on each position's pool, anchor [1],
    W1 [V, r], ``w2_t`` W2ᵀ [r, V] (no pool) or the pool's W2 rows [K, r, P], ``ids`` [K, P] the pool's token ids
    (None: P = V, the whole vocabulary), the variant's weights (:func:`markov_step`), ``noise`` [K, P] (T > 0: the
    exponential race's ``-log E``) or None (greedy); ``anchor_slot``: an rnn state first steps over row 0. A
    position costs the previous pick's W1 row, the variant's step, ``base + W2·u`` in one ``addmm`` and the pick
    (its index in the row; the token id, which feeds the next position, is the pool's entry)."""
    K = base.shape[0]
    prev, state = anchor, None
    if joint_w is not None:  # rnn: a recurrent state over the block
        state = H.new_zeros(1, w1.shape[1], dtype=w1.dtype)
        if anchor_slot:  # the state starts at slot 0, whose previous token is the anchor
            _, state = markov_step(H[0:1], w1.index_select(0, anchor), state, gate_w, gate_b, joint_w, joint_b)
    rows, picks = [], []
    for i in range(K):
        u, state = markov_step(H[i + 1: i + 2], w1.index_select(0, prev), state, gate_w, gate_b, joint_w, joint_b)
        L = torch.addmm(base[i: i + 1], u.to(base.dtype), w2_t if ids is None else w2_t[i])  # [1, P] L_base + W2·u
        pick = (L if noise is None else L.float() / temperature + noise[i: i + 1]).argmax(-1)  # [1]
        prev = pick if ids is None else ids[i].index_select(0, pick)
        rows.append(L), picks.append(pick)
    return torch.cat(picks), torch.cat(rows)


_COMPILED_MARKOV_BLOCK: dict[str, Callable] = {}


def compiled_markov_block(device) -> Callable:
    """:func:`markov_block` under ``torch.compile`` (:func:`~lit_domino.models.sessions.compile_for`), one per
    mode: a pure function, so every DSpark drafter shares it (one graph per K, head type and temperature)."""
    mode = compile_mode(device)
    if mode not in _COMPILED_MARKOV_BLOCK:
        _COMPILED_MARKOV_BLOCK[mode] = compile_for(markov_block, device)
    return _COMPILED_MARKOV_BLOCK[mode]


class MarkovHead(nn.Module):
    """The low-rank sequential bias ``W2·u_k``; ``u_k`` from the previous token (and H_k / a state, by type)."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int, head_type: str):
        super().__init__()
        self.head_type, self.rank = head_type, rank
        self.w1 = nn.Embedding(vocab_size, rank)  # W1: previous token -> r
        self.w2 = nn.Linear(rank, vocab_size, bias=False)  # W2: r -> V
        if head_type == "gated":
            self.gate = nn.Linear(hidden_size + rank, rank)
        elif head_type == "rnn":
            self.joint = nn.Linear(2 * rank + hidden_size, 3 * rank)  # [gate; candidate; output]
        self.apply(init_weights)
        nn.init.normal_(self.w1.weight, std=0.01)
        nn.init.zeros_(self.w2.weight)  # no bias at init: the drafter equals its backbone

    def weights(self) -> tuple:
        """The variant's own weights as :func:`markov_step` takes them: (W_g, b_g, W_j, b_j), None where absent."""
        gate, joint = getattr(self, "gate", None), getattr(self, "joint", None)
        return (None if gate is None else gate.weight, None if gate is None else gate.bias,
                None if joint is None else joint.weight, None if joint is None else joint.bias)

    def step(self, h: torch.Tensor, e: torch.Tensor, state: torch.Tensor | None):
        """One block position: H_k [N, d], e = W1[x_{k-1}] [N, r], the rnn state [N, r] (None otherwise) ->
        (u_k [N, r], next state)."""
        return markov_step(h, e, state, *self.weights())

    def block_inputs(self, H: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: every previous token known. H [N, B, d], e [N, B, r] -> u [N, B, r]."""
        if self.head_type != "rnn":
            return self.step(H, e, None)[0]
        state, us = e.new_zeros(e.shape[0], self.rank), []
        for k in range(e.shape[1]):
            u, state = self.step(H[:, k], e[:, k], state)
            us.append(u)
        return torch.stack(us, dim=1)

    @torch.no_grad()
    def draft(self, H: torch.Tensor, base: torch.Tensor, anchor: torch.Tensor, temperature: float = 0.0,
              generator: torch.Generator | None = None, anchor_slot: bool = True,
              block_fn: Callable | None = None, pool_size: int | None = None):
        """The decode-time rollout of one block: H [K+1, d] (row k predicts the k-th drafted token; row 0 the
        anchor slot's), base [K, V] the backbone logits of rows 1..K, anchor [1] -> (tokens [K], picks [K],
        corrected logits [K, P], pool ids [K, P] | None). ``anchor_slot``: the rnn state first steps over row 0
        (the anchor predicts nothing, speculators' ``sample_from_anchor: false``); False: it starts at row 1
        (``sample_from_anchor``).

        Position i picks ``argmax(L_i/T + G_i)`` (G = 0 greedy; else Gumbel noise ``-log E``, E ~ Exp(1): an
        exact sample of softmax(L_i/T)) and feeds its pick to position i+1; q is softmax of those same
        corrected logits, so rejection sampling stays exact. ``pool_size`` P (Domino's candidate pool, applied to
        the Markov bias): the bias, the pick and q live on each position's top-P base logits, so a position reads
        P of W2's V rows (None, or P = V: the exact head). ``block_fn``: :func:`markov_block` (the default) or its
        compiled form (:func:`compiled_markov_block`)."""
        block_fn = markov_block if block_fn is None else block_fn
        ids, w2 = None, self.w2.weight  # [V, r]
        if pool_size is not None and pool_size < base.shape[-1]:
            base, ids = base.topk(pool_size, dim=-1)  # [K, P] each, every position at once
            w2_t = w2.index_select(0, ids.reshape(-1)).view(*ids.shape, -1).transpose(1, 2).to(base.dtype)
        else:
            w2_t = w2.T.to(base.dtype)  # [r, V]
        noise = None if is_greedy(temperature) else \
            -torch.empty_like(base, dtype=torch.float32).exponential_(generator=generator).log()  # [K, P]
        picks, logits = block_fn(H, base, anchor, self.w1.weight, w2_t, *self.weights(), noise, float(temperature),
                                 bool(anchor_slot), ids)
        tokens = picks if ids is None else ids.gather(-1, picks[:, None])[:, 0]
        return tokens, picks, logits, ids


@dataclass
class DSparkOutput(BlockOutput):
    """A DSpark block output: the backbone's plus the confidence logits and the target's last hidden states."""

    confidence: torch.Tensor | None = None
    """[b, A, B] the confidence head's logits (None without the head)."""
    target_hidden: torch.Tensor | None = None
    """[b, A, B, d] the target's final hidden state at ``a+k-1`` (what predicted ``x_{a+k}``): p_k =
    softmax(lm_head(·)). Set by ``forward_train``."""


class MarkovPathHead:
    """DSpark's Markov head over a tree's frontier (PCTree; :class:`lit_domino.decoding.tree.PathHead`): each node's
    children are drafted from the node's own token (and, for ``rnn``, its own recurrent state), every frontier
    node of a depth in one batch; the recurrence of :meth:`MarkovHead.draft`, row-wise. ``pool_size`` P: a node's
    children are among the top-P tokens of its position's base logits (the chain's candidate pool: the pool and
    W2's rows of it taken once per block, the bias computed on the pool only); None (or P = V): the full
    vocabulary."""

    def __init__(self, drafter, hidden: torch.Tensor, anchor: torch.Tensor, pool_size: int | None = None):
        self.head, self.hidden, self.anchor = drafter.head, hidden, anchor  # hidden [K+1, d]
        self.anchor_slot = not drafter.anchor_predicts  # as MarkovHead.draft: an rnn state steps over row 0
        base = drafter.compute_logits(hidden[1:])  # [K, V] the backbone's marginals
        self.vocab_size, w2 = base.shape[-1], self.head.w2.weight  # W2 [V, r]
        self.base, self.ids, self.w2_t = base, None, w2.T.to(base.dtype)  # the whole vocabulary, W2ᵀ [r, V] shared
        if pool_size is not None and pool_size < base.shape[-1]:
            self.base, self.ids = base.topk(pool_size, dim=-1)  # [K, P] each, every position at once
            self.w2_t = w2.index_select(0, self.ids.reshape(-1)).view(*self.ids.shape, -1).transpose(1, 2).to(
                base.dtype)  # [K, r, P] W2's rows of each position's pool

    def start(self):
        """(previous token [1], rnn state [1, r] | None): the root's; the rnn state starts at slot 0 (at row 1
        when the anchor slot predicts, ``sample_from_anchor``)."""
        head, state = self.head, None
        if head.head_type == "rnn":
            state = self.hidden.new_zeros(1, head.rank, dtype=head.w1.weight.dtype)
            if self.anchor_slot:
                _, state = head.step(self.hidden[0:1], head.w1(self.anchor), state)
        return self.anchor, state

    def step(self, i: int, states):
        """Frontier (tokens [F], rnn states [F, r] | None) at depth i → (children's logits [F, C] on position i's
        pool, the pool's token ids [1, C] (None without a pool: C = V), inherited)."""
        prev, state = states
        h = self.hidden[i + 1: i + 2].expand(prev.shape[0], -1)
        u, state = self.head.step(h, self.head.w1(prev), state)  # [F, r]
        u = u.to(self.base.dtype)
        if self.ids is None:
            return torch.addmm(self.base[i: i + 1], u, self.w2_t), None, state
        return torch.addmm(self.base[i: i + 1], u, self.w2_t[i]), self.ids[i: i + 1], state

    def child(self, inherited, rows: torch.Tensor, tokens: torch.Tensor):
        return tokens, None if inherited is None else inherited.index_select(0, rows)


class DSparkSession(ParallelSession):
    """Backbone block once, then the Markov head over positions 1..K (:meth:`MarkovHead.draft`). The target
    features it is given include the distribution layer; only the fused layers' columns are kept.
    ``pool_size`` P (a decoding option, as Domino's): the Markov bias, the pick and q on each position's top-P
    base logits (q = 0 outside them); None = the full vocabulary. ``static_capacity``, ``compile``: the
    backbone's fixed-shape (compiled) block forward (:class:`ParallelSession`); ``compile`` also compiles the
    head's loop (:func:`compiled_markov_block`)."""

    def __init__(self, drafter, pool_size: int | None = None, static_capacity: int | None = None,
                 compile: bool = False):
        super().__init__(drafter, static_capacity, compile)
        self.pool_size = check_pool_size(pool_size, drafter.config.vocab_size)
        self.head_loop = compiled_markov_block(self.device) if compile else markov_block

    @torch.no_grad()
    def extend(self, tokens, features) -> None:
        if features is not None:
            features = torch.as_tensor(features, device=self.device)
            width = self.config.num_features * self.config.hidden_size
            if features.shape[-1] == width + self.config.hidden_size:
                features = features[..., :width]
        super().extend(tokens, features)

    def path_head(self, hidden: torch.Tensor, anchor: torch.Tensor) -> MarkovPathHead:
        """The Markov head over a tree's frontier, for the block ``hidden`` [K+1, d] of :meth:`draft_hidden`, on
        the session's candidate pool (``pool_size``)."""
        return MarkovPathHead(self.drafter, hidden, anchor, self.pool_size)

    def _pick(self, hidden, anchor, base, temperature, generator, picks=None) -> StageDraft:
        drafter = self.drafter  # base [K, V]: the backbone's logits
        tokens, picks, logits, ids = drafter.head.draft(hidden, base, anchor, temperature, generator,
                                                        anchor_slot=not drafter.anchor_predicts,
                                                        block_fn=self.head_loop, pool_size=self.pool_size)
        return pool_stage(tokens, picks, logits, ids, temperature, base.shape[-1])


@register("dspark")
class DSparkDrafter(DistilledDrafter):
    """DFlash backbone + Markov head + confidence head; DeepSpec's CE + TV + confidence-BCE objective."""

    method_name = "DSpark"

    config_class = DSparkConfig
    session_class = DSparkSession
    draft_options = ("pool_size", "static_capacity", "compile")
    tree_builders = ("chain", "ddtree", "path")

    def __init__(self, config: DSparkConfig):
        super().__init__(config)
        c, h = config, config.head
        self.head = MarkovHead(c.hidden_size, c.vocab_size, h.rank, h.head_type)
        self.confidence = None
        if h.confidence:
            self.confidence = nn.Linear(c.hidden_size + (h.rank if h.confidence_with_markov else 0), 1)
            init_weights(self.confidence)

    def capabilities(self):
        """The parallel drafter's, plus its confidence head (and its table) when configured."""
        import dataclasses

        own = self.confidence is not None
        return dataclasses.replace(super().capabilities(), confidence_head=own, confidence_table=own)

    @property
    def has_confidence_head(self) -> bool:
        """Whether the drafter has its confidence head (``DSparkHeadConfig.confidence``)."""
        return self.confidence is not None

    @torch.no_grad()
    def own_confidence_logits(self, H: torch.Tensor, prev: torch.Tensor) -> torch.Tensor | None:
        """The confidence head's logits [..., K] at decode time (the acceptance predictor's interface,
        :mod:`lit_domino.decoding.acceptance`): block hidden states H [..., K, d] and each position's previous
        token prev [..., K], as ``add_head`` feeds it in training; None without the head."""
        if self.confidence is None:
            return None
        x = H
        if self.config.head.confidence_with_markov:
            x = torch.cat([H, self.head.w1(prev).to(H.dtype)], -1)
        return self.confidence(x.to(self.confidence.weight.dtype)).squeeze(-1)

    def own_confidence_table(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The confidence head as ``w_H · H_j + t[x_{j-1}]`` for a gate that reads it at every stage: (w_H [d],
        t [V] = w_E · W1[x] + b over the whole vocabulary), float32, built once per weights; None without the head."""
        if self.confidence is None:
            return None

        def build() -> tuple[torch.Tensor, torch.Tensor]:
            w = self.confidence.weight[0].detach().float()
            d = self.config.hidden_size
            b = self.confidence.bias.detach().float()
            t = (self.head.w1.weight.detach().float() @ w[d:] if self.config.head.confidence_with_markov
                 else torch.zeros(self.head.w1.weight.shape[0], device=w.device))
            return w[:d].contiguous(), (t + b).contiguous()

        sources = (self.confidence.weight, self.confidence.bias, self.head.w1.weight)
        return memo_on_weights(self, "_confidence_table", sources, build)

    @property
    def anchor_predicts(self) -> bool:
        return bool(self.config.sample_from_anchor)

    def add_head(self, out: BlockOutput, causal_inputs: str = "teacher_forced") -> DSparkOutput:
        """The Markov inputs ``out.head_state`` = u [b, A, B, r] from the true previous tokens, the confidence
        logits, and (when the base logits are materialised) ``final_logits = logits + W2·u``."""
        if causal_inputs != "teacher_forced":
            raise ValueError(f"a DSpark drafter trains teacher forced (its Markov head reads the true previous "
                             f"token), got causal_inputs={causal_inputs!r}")
        b, A, B, d = out.hidden.shape
        e = self.head.w1(previous_tokens(out.block_tokens))  # [b, A, B, r]
        s = 1 if self.anchor_predicts else 0  # the rows the head runs over (an rnn state starts at row s)
        u = self.head.block_inputs(out.hidden[:, :, s:].reshape(b * A, B - s, d),
                                   e[:, :, s:].reshape(b * A, B - s, -1)).view(b, A, B - s, -1)
        if s:  # index 0 (no query row) predicts nothing: a zero input
            u = torch.cat([u.new_zeros(b, A, 1, u.shape[-1]), u], dim=2)
        conf = None
        if self.confidence is not None:
            x = torch.cat([out.hidden, e.to(out.hidden.dtype)], -1) if self.config.head.confidence_with_markov \
                else out.hidden
            conf = self.confidence(x).squeeze(-1)  # [b, A, B]
        final = None if out.logits is None else out.logits + self.head.w2(u).to(out.logits.dtype)
        fields = {k: getattr(out, k) for k in ("hidden", "labels", "block_tokens", "logits")}
        return DSparkOutput(**fields, final_logits=final, head_state=u, confidence=conf,
                            target_hidden=getattr(out, "target_hidden", None))

    def row_inputs(self, out: BlockOutput) -> list[torch.Tensor]:
        if out.head_state is None:
            raise ValueError("a DSpark BlockOutput without head_state: run it through add_head")
        return [out.hidden, out.head_state]

    def row_logits(self, h: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of (H, u) -> (base, corrected) logits: ``L = [H ; u]·[W_lmᵀ ; W2ᵀ]``."""
        base = self.compute_logits(h)
        return base, base + self.head.w2(u).to(base.dtype)

    def block_loss(self, out: DSparkOutput, settings: LossSettings) -> tuple[torch.Tensor, dict]:
        """DeepSpec's objective ``c_ce·CE + c_tv·TV(q, p) + c_conf·BCE(conf, 1 − TV)`` (``settings.distill``
        = (c_ce, c_tv, c_conf)), each term position-weighted over the labelled positions → (loss, parts); from
        the materialised logits when the forward made them, else chunk by chunk (the LM head on the labelled
        rows only, the target's logits included). A selected objective: :meth:`objective_loss`."""
        if out.target_hidden is None:
            raise ValueError("a DSpark loss needs the target's distribution: use drafter.forward_train")
        if settings.objective is not None:
            return self.objective_loss(out, settings)
        keep, y, w = label_rows(out.labels, settings.position_weights)
        conf = None if out.confidence is None else out.confidence[keep]
        if out.final_logits is not None:  # the reference path: every logit materialised
            terms = distill_terms(out.final_logits[keep], self.compute_logits(out.target_hidden[keep]), y, conf)
            sums = [(t * w).sum() for t in terms]
        else:
            def rows_fn(y_, h, u, th, *c):
                return distill_terms(self.row_logits(h, u)[1], self.compute_logits(th), y_, c[0] if c else None)

            rows = [y, out.hidden[keep], out.head_state[keep], out.target_hidden[keep]]
            sums = chunked_row_sums(rows_fn, rows + ([conf] if conf is not None else []), w, settings.chunk_size)
        denom = w.sum()
        ce, tv, bce = (s * 0.0 if denom <= 0 else s / denom for s in sums)
        c_ce, c_tv, c_conf = settings.distill
        loss = c_ce * ce + c_tv * tv + c_conf * bce
        return loss, {"loss_ce": ce.detach(), "loss_tv": tv.detach(), "loss_conf": bce.detach(),
                      "accept_rate": (1.0 - tv).detach()}

    def objective_loss(self, out: DSparkOutput, settings: LossSettings) -> tuple[torch.Tensor, dict]:
        """A selected objective J on the corrected logits (in place of DeepSpec's ``c_ce·CE + c_tv·TV``) plus the
        confidence term ``c_conf·BCE(conf, 1 − TV)`` (position-weighted) -> (loss, parts); lean or from the
        materialised logits, as :meth:`block_loss`."""
        obj, keep, conf = settings.objective, out.labels != IGNORE_INDEX, out.confidence
        full = out.final_logits is not None
        sources = [out.final_logits] if full else [out.hidden, out.head_state]
        n = len(sources)

        def row_fn(*xs):
            q = xs[0] if full else self.row_logits(*xs[:n])[1]
            p = self.compute_logits(xs[n])
            return (q,), (p if obj.needs_target else None), (() if conf is None else (confidence_bce(q, p, xs[n + 1]),))

        rows = [x[keep] for x in sources + [out.target_hidden] + ([conf] if conf is not None else [])]
        (stats,), own = objective_rows(obj, row_fn, rows, out.labels[keep], settings.chunk_size)
        loss, logs = block_objective(obj, stats, keep, settings.position_weights)
        parts = {"loss_objective": loss.detach(), **logs}
        if own:
            bce = weighted_mean(dense(own[0], keep), keep, settings.position_weights.to(keep.device).float())
            loss, parts["loss_conf"] = loss + settings.distill[2] * bce, bce.detach()
        return loss, parts

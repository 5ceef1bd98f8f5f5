"""Domino: the DFlash backbone plus a lightweight causal correction of its logits.

Shapes: b batch, A anchors, B block size, K = B-1 drafted positions, N rows (blocks),
d width, d_s GRU state, r rank, V vocabulary.

``ΔL_i = W_up · SiLU(W_down · [H_i ; S_{i-1}])`` where H_i is the backbone hidden
state at block position i and S_{i-1} is a 1-layer GRU state (no bias) that has
consumed the frozen target embeddings of ``x_a, x_{a+1} .. x_{a+i-1}``.
Final logits ``L_i = L_base_i + ΔL_i`` for i >= 1; position 0 gets ΔL = 0.
``W_up`` starts at zero, so a fresh Domino drafter equals its backbone.

The equation has two forms, both here on :class:`DominoHead`: :meth:`~DominoHead.delta`
when every S is known at once (teacher forcing: one ``nn.GRU`` pass over the true
tokens), and :meth:`~DominoHead.rollout` when each S depends on the previous pick
(training-time test), and :meth:`~DominoHead.draft`, the same recurrence written for
decoding (over :class:`DecodeTables`, the weights laid out for it; its loop, :func:`draft_block`, is a pure
function that ``compile`` compiles).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from lit_domino.models.backbone import BackboneConfig, BlockOutput, ParallelDrafter
from lit_domino.models.parallel_session import ParallelSession
from lit_domino.models.layers import init_weights, memo_on_weights
from lit_domino.models.registry import register
from lit_domino.models.sessions import StageDraft, check_pool_size, is_greedy, pool_stage
from lit_domino.models.objectives import LossSettings, curriculum_loss, lean_curriculum_loss, uses_own_loss
from lit_domino.models.objectives.blocks import parallel_objective
from lit_domino.models.domino_rollout import (compiled_draft_block, corrected_logits, draft_block,  # noqa: F401
                                             gru_gates)

CAUSAL_INPUTS = ("teacher_forced", "training_time_test")
"""How the GRU is fed in training: the true tokens (one parallel pass) or the draft's own argmax picks."""


@dataclass
class DominoHeadConfig:
    """The Domino head on top of the backbone."""

    rank: int = 256
    """Rank r of the low-rank logit correction (W_down: d + d_s -> r, W_up: r -> V). Default 256, the paper's."""

    gru_hidden: int = 1024
    """GRU state size d_s. Default 1024, the paper's for an 8B target."""

    def __post_init__(self):
        self.validate()

    def validate(self) -> "DominoHeadConfig":
        """Raise ``ValueError`` naming the bad field (at construction: Python, YAML and ``--set`` alike)."""
        for name, what in (("rank", "the Domino correction's rank r"), ("gru_hidden", "the Domino GRU state size d_s")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"head.{name} must be a positive integer ({what}), got {value!r}")
        return self


@dataclass
class DominoConfig(BackboneConfig):
    """The backbone's config plus its head."""

    head: DominoHeadConfig = field(default_factory=DominoHeadConfig)
    """The causal correction head (rank r, GRU width d_s)."""

    def validate(self) -> "DominoConfig":
        super().validate()
        self.head.validate()  # again: a field may have been set after construction
        return self

    @classmethod
    def from_legacy(cls, legacy: dict) -> dict:
        head = {k: legacy[k] for k in ("rank", "gru_hidden") if k in legacy}
        return {"head": head} if head else {}



@dataclass
class DecodeTables:
    """The Domino head's weights laid out for decoding (:meth:`DominoHead.decode_tables`): the GRU's input
    projection of every vocabulary entry (the official Domino rollout's table, as issue #14 describes it;
    SpecForge's ``DominoDraftModel`` runs its ``nn.GRU`` on embeddings instead), so feeding a pick is a row lookup."""

    gi: torch.Tensor
    """[V, 3d_s] ``embedding · W_ihᵀ``: the GRU input projection of each token. At paper scale (V = 151k,
    d_s = 1024, bf16) 0.9 GB, in exchange for not reading W_ih (25 MB) at every drafted position."""
    w_down_h: torch.Tensor
    """[d, r] W_down's H-part, transposed."""
    w_down_s: torch.Tensor
    """[d_s, r] W_down's S-part, transposed."""
    w_up_t: torch.Tensor
    """[r, V] W_upᵀ, contiguous (a CPU BLAS reads it faster than the transposed view of W_up)."""


class DominoHead(nn.Module):
    """GRU over previous tokens + low-rank logit correction."""

    def __init__(self, hidden_size: int, gru_hidden: int, rank: int, vocab_size: int):
        super().__init__()
        self.hidden_size, self.gru_hidden = hidden_size, gru_hidden
        self.gru = nn.GRU(hidden_size, gru_hidden, num_layers=1, bias=False, batch_first=True)  # d -> d_s
        self.down = nn.Linear(hidden_size + gru_hidden, rank, bias=False)  # W_down: d + d_s -> r
        self.up = nn.Linear(rank, vocab_size, bias=False)  # W_up: r -> V
        self.apply(init_weights)
        self.reset_up()

    def reset_up(self) -> None:
        """Zero ``W_up``: the correction vanishes, the drafter equals backbone-only."""
        nn.init.zeros_(self.up.weight)

    def __getstate__(self):
        """Copies and pickles leave the decode tables behind (0.9 GB at paper scale): they are rebuilt on use."""
        state = dict(super().__getstate__())
        state.pop("_decode_tables", None)
        return state

    def correction(self, z: torch.Tensor) -> torch.Tensor:
        """The equation's output side, which every form shares (:func:`corrected_logits`): ``ΔL = W_up · SiLU(z)``
        for the rank-r pre-activation ``z = W_down · [H ; S]`` [..., r] -> [..., V]."""
        return corrected_logits(z, self.up.weight.T)

    def delta(self, H: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
        """The parallel form: H [..., d], S [..., d_s] (every state known) -> ΔL [..., V]."""
        return self.correction(self.down(torch.cat([H, S], dim=-1)))

    def rollout(self, H: torch.Tensor, base: torch.Tensor, anchor_emb: torch.Tensor,
                embed: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor | None], torch.Tensor]:
        """The sequential form: ``next_logits(prev)`` over block positions 1..K, one call per position.

        H [N, K, d] backbone hidden states, base [N, K, V] their logits, anchor_emb [N, d] the embedding
        of each block's anchor x_a; ``embed(ids [N]) -> [N, d]``. Call ``next_logits(None)`` for position 1,
        then ``next_logits(pick)`` with the token picked at the previous position: it updates S with the
        pick and returns the final logits ``L_base + ΔL`` [N, V] of the next position.

        Everything that does not depend on the previous pick is computed for the whole block up front;
        each position then costs one state matmul, the rank-r correction and one GRU update.
        """
        d, d_s, r = H.shape[-1], self.gru_hidden, self.down.weight.shape[0]
        w_down = self.down.weight  # [r, d + d_s]
        h_part = H @ w_down[:, :d].T  # [N, K, r] W_down's H-part, every position at once
        w_state = torch.cat([w_down[:, d:].T, self.gru.weight_hh_l0.T], dim=1)  # [d_s, r + 3d_s]: S's two uses
        w_ih = self.gru.weight_ih_l0.T  # [d, 3d_s]
        s = H.new_zeros(H.shape[0], d_s)  # [N, d_s]
        s = gru_gates(anchor_emb @ w_ih, s @ w_state[:, r:], s)  # S_0: consumed x_a
        state = {"s": s, "i": 0, "s_hh": None}

        def next_logits(prev: torch.Tensor | None) -> torch.Tensor:
            i = state["i"]
            if prev is not None:  # S_i: consumed the pick at position i
                state["s"] = gru_gates(embed(prev) @ w_ih, state["s_hh"], state["s"])
            s_down, state["s_hh"] = (state["s"] @ w_state).split([r, 3 * d_s], -1)  # [N, r], [N, 3d_s]
            state["i"] = i + 1
            return base[:, i] + self.correction(h_part[:, i] + s_down).to(base.dtype)  # [N, V] base + ΔL

        return next_logits

    @torch.no_grad()
    def decode_tables(self, embed_weight: torch.Tensor) -> DecodeTables:
        """:class:`DecodeTables` for the target embedding ``embed_weight`` [V, d], built once and rebuilt when any
        weight they come from changes (an optimizer step or ``load_state_dict`` bumps a tensor's version)."""
        def build() -> DecodeTables:
            d = self.hidden_size
            w_ih, w_down = self.gru.weight_ih_l0, self.down.weight
            tables = DecodeTables(
                gi=(embed_weight.to(w_ih.dtype) @ w_ih.T).contiguous(),
                w_down_h=w_down[:, :d].T.contiguous(),
                w_down_s=w_down[:, d:].T.contiguous(),
                w_up_t=self.up.weight.T.contiguous())
            if embed_weight.is_cuda:  # CUDA graphs read the tables in place instead of copying them in at every replay
                for table in vars(tables).values():
                    torch._dynamo.mark_static_address(table)
            return tables

        sources = (embed_weight, self.gru.weight_ih_l0, self.down.weight, self.up.weight)
        return memo_on_weights(self, "_decode_tables", sources, build)

    @torch.no_grad()
    def draft(self, H: torch.Tensor, base: torch.Tensor, anchor: torch.Tensor, embed_weight: torch.Tensor,
              pool_size: int | None = None, temperature: float = 0.0,
              generator: torch.Generator | None = None, block_fn: Callable = draft_block) -> "HeadDraft":
        """The decode-time rollout of one block: positions 1..K in turn, each pick fed to the GRU.

        H [K, d] backbone hidden states, base [K, V] their logits, anchor [1] the id of x_a, ``embed_weight``
        [V, d] the target's embedding. Position i's pick is ``argmax(L_i / T + G_i)``: G = 0 at T = 0; at T > 0
        Gumbel noise ``-log E``, E ~ Exp(1) drawn once for the block (the exponential race: an exact sample of
        softmax(L_i / T), and one code path for greedy and sampling). ``pool_size`` P: the correction, the pick
        and q live on the top-P tokens of each position's base logits; None (or P = V) is the exact
        full-vocabulary head.

        Built for a dispatch-bound loop (every op a fixed dispatch overhead on a CPU, a kernel launch on a GPU):
        everything that does not depend on the previous pick is computed up front, once per block (W_down's
        H-part, the pool's W_up rows) or once per weights (:meth:`decode_tables`: the GRU input projection of
        every token, the table the issue describes in the official Domino rollout), and a position costs six
        ops, seven with a pool (:func:`draft_block`; ``block_fn``: that loop or its compiled form).
        """
        t = self.decode_tables(embed_weight)
        base, ids, ups_t = self.candidate_pool(base, t, pool_size)  # the input-projection rows: looked up per pick
        noise = None if is_greedy(temperature) else \
            -torch.empty_like(base, dtype=torch.float32).exponential_(generator=generator).log()  # [K, P]
        picks, logits = block_fn(H, base, t.gi.index_select(0, anchor), t.w_down_h, t.w_down_s,
                                 self.gru.weight_hh_l0, t.gi, ups_t, ids, noise, float(temperature))
        tokens = picks if ids is None else ids.gather(-1, picks[:, None])[:, 0]
        return HeadDraft(tokens, picks, logits, ids)


    def candidate_pool(self, base: torch.Tensor, tables: DecodeTables, pool_size: int | None):
        """Base logits [K, V] → (the pool's base logits [K, P], its token ids [K, P], W_up's rows of it [K, r, P]),
        every position at once; without a pool (None or P = V): (base, None, W_upᵀ [r, V] shared by every position)."""
        if pool_size is None or pool_size >= base.shape[-1]:
            return base, None, tables.w_up_t
        base, ids = base.topk(pool_size, dim=-1)
        ups_t = self.up.weight.index_select(0, ids.reshape(-1)).view(*ids.shape, -1).transpose(1, 2)
        return base, ids, ups_t


@dataclass
class HeadDraft:
    """:meth:`DominoHead.draft`'s result for one block of K positions."""

    tokens: torch.Tensor
    """[K] the drafted token ids."""
    picks: torch.Tensor
    """[K] each pick's index into its row of ``logits`` (the pool index; the token id without a pool)."""
    logits: torch.Tensor
    """[K, P] the final logits ``L_base + ΔL`` on each position's pool (P = V without a pool)."""
    ids: torch.Tensor | None
    """[K, P] the pool's token ids; None without a pool."""


class DominoPathHead:
    """Domino's head over a tree's frontier (DARTree; :class:`lit_domino.decoding.tree.PathHead`): one GRU state per
    node, every frontier node of a depth in one batch. The recurrence of :func:`draft_block`, row-wise: S_0
    consumed x_a; a node at depth i (block position i+1) has ``L = L_base + W_up·SiLU(W_down·[H ; S_parent])``; a
    child's state consumed its token. ``pool_size`` P: a node's children are among the top-P tokens of its
    position's base logits (the chain's candidate pool, :meth:`DominoHead.draft`: the pool and W_up's rows of it
    taken once per block, the correction computed on the pool only); None (or P = V): the full vocabulary."""

    def __init__(self, drafter, hidden: torch.Tensor, anchor: torch.Tensor, pool_size: int | None = None):
        H = hidden[1:]  # [K, d]
        base = drafter.compute_logits(H)  # [K, V] the backbone's marginals
        self.vocab_size = base.shape[-1]
        self.tables = t = drafter.head.decode_tables(drafter.embed.weight)
        self.h_part = H @ t.w_down_h  # [K, r]
        self.w_hh = drafter.head.gru.weight_hh_l0  # [3d_s, d_s]
        self.no_w = self.w_hh.new_empty(self.w_hh.shape[0], 0)
        self.anchor = anchor
        self.base, self.ids, self.ups_t = drafter.head.candidate_pool(base, t, pool_size)

    def start(self) -> torch.Tensor:  # [1, d_s] S_0: consumed x_a
        return self._consume(self.anchor, self.h_part.new_zeros(1, self.w_hh.shape[1]))

    def step(self, i: int, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Frontier states [F, d_s] at depth i → (their children's logits [F, C] on position i's pool, the pool's
        token ids [1, C] (None without a pool: C = V), what the children inherit)."""
        z = torch.addmm(self.h_part[i: i + 1], states, self.tables.w_down_s)  # [F, r]
        base = self.base[i: i + 1].expand(states.shape[0], -1)
        if self.ids is None:
            return corrected_logits(z, self.ups_t, base), None, states
        return corrected_logits(z, self.ups_t[i], base), self.ids[i: i + 1], states

    def child(self, inherited: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The GRU states of the chosen children: parent rows ``rows`` [F'] consumed ``tokens`` [F']."""
        return self._consume(tokens, inherited.index_select(0, rows))

    def _consume(self, tokens: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """States s [F, d_s] after consuming ``tokens`` [F]: one fused ``gru_cell`` whose input is empty and whose
        input bias is the tokens' rows of the input-projection table (as :func:`draft_block`)."""
        return torch.gru_cell(s.new_empty(s.shape[0], 0), s, self.no_w, self.w_hh,
                              self.tables.gi.index_select(0, tokens))


class DominoSession(ParallelSession):
    """Backbone block once, then the Domino head's decode rollout over block positions 1..K.

    ``pool_size`` P (a decoding option, ``generate(..., pool_size=P)``): the correction, the pick and its
    log-probability on the top-P tokens of the base logits (q = 0 outside them); None = the full vocabulary.
    ``static_capacity``, ``compile``: the backbone's fixed-shape (compiled) block forward (:class:`ParallelSession`);
    ``compile`` also compiles the head's rollout loop (:func:`compiled_draft_block`).
    """

    def __init__(self, drafter, pool_size: int | None = None, static_capacity: int | None = None,
                 compile: bool = False):
        super().__init__(drafter, static_capacity, compile)
        self.pool_size = check_pool_size(pool_size, drafter.config.vocab_size)
        self.head_loop = compiled_draft_block(self.device) if compile else draft_block

    def path_head(self, hidden: torch.Tensor, anchor: torch.Tensor) -> DominoPathHead:
        """The head over a tree's frontier, for the block ``hidden`` [K+1, d] of :meth:`draft_hidden`, on the
        session's candidate pool (``pool_size``)."""
        return DominoPathHead(self.drafter, hidden, anchor, self.pool_size)

    def _step_head(self, temperature: float):
        """On the static path, greedy with the exact head: the rollout runs inside the block step (one call, one
        graph compiled) and needs the head's :class:`DecodeTables`."""
        if self.static_capacity is None or not is_greedy(temperature) or self.pool_size is not None:
            return None
        return self.drafter.head.decode_tables(self.drafter.embed.weight)

    def _pick(self, hidden, anchor, base, temperature, generator, picks=None) -> StageDraft:
        if picks is not None:  # the static step ran the rollout: base holds the final logits
            return pool_stage(picks, picks, base, None, temperature, base.shape[-1])
        drafter = self.drafter
        H = hidden[1:]  # [K, d]; base [K, V]: the backbone's logits
        out = drafter.head.draft(H, base, anchor, drafter.embed.weight, self.pool_size, temperature, generator,
                                 self.head_loop)
        return pool_stage(out.tokens, out.picks, out.logits, out.ids, temperature, base.shape[-1])


@register("domino")
class DominoDrafter(ParallelDrafter):
    """DFlash backbone + Domino head; loss ``λ_t·CE(L_base) + (1−λ_t)·CE(L_final)`` (the base-anchored curriculum)."""

    config_class = DominoConfig
    session_class = DominoSession
    draft_options = ("pool_size", "static_capacity", "compile")
    tree_builders = ("chain", "ddtree", "path")
    uses_curriculum = True

    def __init__(self, config: DominoConfig):
        super().__init__(config)
        c = config
        self.head = DominoHead(c.hidden_size, c.head.gru_hidden, c.head.rank, c.vocab_size)

    def block_step(self, anchor, where, ctx, caches, rows: int, fused: bool, head: DecodeTables | None = None):
        """:meth:`ParallelDrafter.block_step`, and with ``head`` (the head's decode tables: greedy, no pool) the
        rollout of :func:`draft_block` in the same call → (hidden, the final logits [K, V], the picks [K])."""
        hidden, base, _ = super().block_step(anchor, where, ctx, caches, rows, fused)
        if head is None:
            return hidden, base, None
        picks, logits = draft_block(hidden[1:], base, head.gi.index_select(0, anchor), head.w_down_h, head.w_down_s,
                                    self.head.gru.weight_hh_l0, head.gi, head.w_up_t, None, None, 0.0)
        return hidden, logits, picks

    def reset_head(self) -> None:
        """Re-initialise the head with W_up = 0 (the drafter becomes backbone-only again)."""
        self.head.apply(init_weights)
        self.head.reset_up()

    def base_view(self) -> "DominoDrafter":
        """A copy whose correction is zeroed (W_up = 0): the backbone inside Domino, decoded alone."""
        inner = copy.deepcopy(self)
        inner.head.reset_up()
        return inner

    def add_head(self, out: BlockOutput, causal_inputs: str = "teacher_forced") -> BlockOutput:
        """The head's causal state ``out.head_state`` and, when the forward materialised the base logits,
        ``out.final_logits`` = ``out.logits + ΔL`` [b, A, B, V] (ΔL = 0 at k = 0).

        The GRU starts fresh at each block's anchor ``out.block_tokens[..., 0]`` (as a session's
        stage does). ``teacher_forced``: GRU inputs are the true tokens ``x_a .. x_{a+B-2}``, one
        parallel GRU pass. ``training_time_test``: the GRU input after position i is the argmax of the
        final logits at i (no gradient through the pick). With materialised logits that is the head's
        rollout; on the lean path the picks come from a no-grad rollout chunk by chunk, then one GRU pass
        over ``x_a`` and the picks gives the same states with their gradients (the picks are constants).
        Also applied by DLoop's loop-aware training to the blocks of later stages.
        """
        if causal_inputs not in CAUSAL_INPUTS:
            raise ValueError(f"causal_inputs must be one of {CAUSAL_INPUTS}, got {causal_inputs!r}")
        b, A, B, d = out.hidden.shape
        K = B - 1
        H = out.hidden[:, :, 1:].reshape(b * A, K, d)  # [b*A, K, d] H_1 .. H_{B-1}
        if causal_inputs == "training_time_test" and out.logits is not None:
            base = out.logits[:, :, 1:].reshape(b * A, K, -1)  # [b*A, K, V]
            step = self.head.rollout(H, base, self.embed_tokens(out.block_tokens[:, :, 0].reshape(-1)),
                                     self.embed_tokens)
            rows, prev = [], None
            for _ in range(K):
                rows.append(step(prev))  # [b*A, V]
                prev = rows[-1].detach().argmax(-1)
            final = torch.stack(rows, dim=1).view(b, A, K, -1).to(out.logits.dtype)
            out.final_logits = torch.cat([out.logits[:, :, :1], final], dim=2)  # [b, A, B, V]
            return out
        if causal_inputs == "teacher_forced":
            inputs = out.block_tokens[:, :, :K].reshape(b * A, K)  # x_a .. x_{a+B-2}
        else:
            inputs = self.ttt_inputs(H, out.block_tokens[:, :, 0].reshape(-1))  # x_a, picks 1..K-1
        S, _ = self.head.gru(self.embed_tokens(inputs))  # [b*A, K, d_s]: S_0 .. S_{B-2}
        S = S.view(b, A, K, -1)
        out.head_state = torch.cat([S.new_zeros(b, A, 1, S.shape[-1]), S], dim=2)  # [b, A, B, d_s]
        if out.logits is not None:
            delta = self.head.delta(out.hidden[:, :, 1:], S).to(out.logits.dtype)  # [b, A, K, V]
            out.final_logits = torch.cat([out.logits[:, :, :1], out.logits[:, :, 1:] + delta], dim=2)
        return out

    def capabilities(self):
        """The parallel drafter's, plus its GRU state (the causal state an acceptance head may read)."""
        import dataclasses

        return dataclasses.replace(super().capabilities(), causal_state=int(self.causal_state_size))

    @property
    def causal_state_size(self) -> int:
        """d_s: the width of :meth:`causal_states` (the acceptance predictor's ``gru`` inputs)."""
        return self.head.gru_hidden

    @torch.no_grad()
    def causal_states(self, prev: torch.Tensor) -> torch.Tensor:
        """The GRU state each drafted position of a stage reads, S_{j-1} [..., k, d_s], from its previous tokens
        prev [..., k] = [x_a, d_1 .. d_{k-1}] (the acceptance predictor's interface): a fresh GRU from the anchor,
        as :func:`draft_block` runs it, so position j's state sees the tokens before j only."""
        lead = prev.shape[:-1]
        S, _ = self.head.gru(self.embed_tokens(prev.reshape(-1, prev.shape[-1])))  # [n, k, d_s]
        return S.reshape(*lead, *S.shape[-2:])

    @torch.no_grad()
    def ttt_inputs(self, H: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """Training-time test's GRU inputs ``[N, K]`` = ``[x_a, pick_1 .. pick_{K-1}]``: the rollout's argmax
        picks for blocks H [N, K, d] with anchor tokens [N], ``train_options.chunk_size`` positions at a time
        (only one chunk's ``[n, K, V]`` logits alive)."""
        N, K, _ = H.shape
        chunk = self.train_options.chunk_size
        per = N if chunk is None else max(1, chunk // K)  # blocks per chunk
        picks = []
        for c in range(0, N, per):
            Hc = H[c: c + per]
            step = self.head.rollout(Hc, self.compute_logits(Hc), self.embed_tokens(anchors[c: c + per]),
                                     self.embed_tokens)
            prev, cols = None, []
            for _ in range(K - 1):  # the pick at position K feeds nothing
                prev = step(prev).argmax(-1)
                cols.append(prev)
            picks.append(torch.stack([anchors[c: c + per], *cols], dim=1))  # [n, K]
        return torch.cat(picks)

    def row_inputs(self, out: BlockOutput) -> list[torch.Tensor]:
        if out.head_state is None:
            raise ValueError("a Domino BlockOutput without head_state: run it through add_head")
        return [out.hidden, out.head_state]

    def row_logits(self, h: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of (H, S) → (base, final) logits: ``L = [H ; c]·[W_lmᵀ ; W_upᵀ]``, ``c = SiLU(W_down·[H;S])``."""
        base = self.compute_logits(h)
        return base, base + self.head.delta(h, s).to(base.dtype)

    def block_loss(self, out: BlockOutput, settings: LossSettings) -> tuple[torch.Tensor, dict]:
        """The curriculum loss at ``settings.lam`` → (loss, {loss_base, loss_final}); from the materialised
        logits when the forward made them, else both terms in one chunked pass over the labelled positions. A
        selected objective other than ``ce``: its curriculum (:func:`~lit_domino.models.objectives.blocks.parallel_objective`)."""
        if not uses_own_loss(settings):
            return parallel_objective(self, out, settings)
        if out.final_logits is not None:
            loss, loss_base, loss_final = curriculum_loss(out.logits, out.final_logits, out.labels,
                                                          settings.position_weights, settings.lam)
        else:
            loss, loss_base, loss_final = lean_curriculum_loss(self.row_logits, self.row_inputs(out), out.labels,
                                                               settings.position_weights, settings.lam,
                                                               settings.chunk_size)
        return loss, {"loss_base": loss_base.detach(), "loss_final": loss_final.detach()}


"""The decode session of the parallel drafters (backbone, Domino, DSpark, DFlash 2): a per-layer context K/V
cache and one block forward per stage.

The block forward comes in two forms that draft the same tokens:

* dynamic (the default): growable caches (:class:`KVCache`); the new context rows and the block at their own
  lengths, eager, the LM head applied by the caller;
* static (``static_capacity``: ``generate(..., static_cache=True)``, implied by ``compile``): fixed K/V buffers
  (:class:`StaticKVCache`) and one fixed-shape step, :meth:`ParallelDrafter.block_step`, that fuses the new
  context, builds the block, runs it and applies the LM head. Under ``compile`` that step is one graph per shape:
  a round's drafting is one compiled call, a method's head (Domino's, DSpark's, DFlash 2's) a second.
"""

from __future__ import annotations

import torch

from lit_domino.models.layers import KVCache, StaticKVCache
from lit_domino.models.sessions import DraftSession, Stage, StageDraft, compile_for, pick_tokens


class ParallelSession(DraftSession):
    """Backbone session: per-layer context K/V cache (computed from fused features once).

    A round computes only the new context positions and the block. ``stages[i].hidden``
    holds each stage's block hidden states (after the final norm); for a DLoop stage,
    the previous stage's ``hidden[k+1]`` stands in as the fused feature at ``start + k``.

    ``static_capacity`` (``generate(..., static_cache=True)``): the caches are :class:`StaticKVCache` buffers
    of that many positions and every round's block step has the same shapes: its new context rows padded
    to ``block_size`` (a longer context, the prompt's, is written ahead of it), every slot past the block
    masked. ``compile`` (needs ``static_capacity``): that step runs under ``torch.compile`` (one graph).
    """

    def __init__(self, drafter, static_capacity: int | None = None, compile: bool = False):
        super().__init__(drafter)
        if compile and static_capacity is None:
            raise ValueError("compile=True needs static_capacity (the compiled block forward has fixed shapes)")
        self.static_capacity = static_capacity
        self.caches = ([KVCache() for _ in drafter.layers] if static_capacity is None
                       else static_caches(drafter, static_capacity, owner=self))
        self.block_step = compiled_block_step(drafter) if compile else drafter.block_step
        self._cached = 0  # committed positions whose context K/V are in the caches
        self._pending: list[torch.Tensor] = []  # raw features of positions _cached .. _len-1
        self._context: dict[bool, torch.Tensor] = {}  # the static step's context rows, raw (False) or fused (True)

    def _drop_stages(self) -> None:
        if self.stages:
            for c in self.caches:
                c.crop(self._cached)
            self.stages = []

    @torch.no_grad()
    def extend(self, tokens, features) -> None:
        ids, features = self._check_extend(tokens, features, need_features=True)
        self._drop_stages()
        if ids.numel():
            self._pending.append(features)
            self._len += ids.numel()

    @torch.no_grad()
    def crop(self, length: int) -> None:
        length = self._check_crop(length)
        self._drop_stages()
        if length < self._cached:
            for c in self.caches:
                c.crop(length)
            self._cached, self._pending = length, []
        elif self._pending and length < self._len:
            self._pending = [torch.cat(self._pending)[: length - self._cached]]
        self._len = length

    @torch.no_grad()
    def draft(self, anchor_token, num_tokens: int, temperature: float = 0.0,
              generator: torch.Generator | None = None) -> StageDraft:
        hidden, anchor, step = self._block(anchor_token, num_tokens, self._step_head(temperature))
        logits, picks = step if step is not None else (self.drafter.compute_logits(hidden[1:]), None)  # [K, V]
        out = self._pick(hidden, anchor, logits, temperature, generator, picks)
        self.stages[-1].tokens = out.tokens
        return out

    def _step_head(self, temperature: float):
        """What the static step needs to run the method's head too (``block_step``'s ``head``), or None: the
        head runs after the step. None here: the backbone has no head."""
        return None

    @torch.no_grad()
    def draft_hidden(self, anchor_token, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The block forward of a stage without its picks → (hidden [K+1, d] after the final norm, anchor [1]):
        what :meth:`draft` picks from, and what a tree builder (:mod:`lit_domino.decoding.tree`) expands. The
        stage is recorded (its tokens unknown: the anchor repeated) so that the next crop/extend drops it."""
        hidden, anchor, _ = self._block(anchor_token, num_tokens, None)
        return hidden, anchor

    def _block(self, anchor_token, num_tokens: int, head):
        """:meth:`draft_hidden`'s forward → (hidden [K+1, d], anchor [1], the static step's (logits [K, V], picks
        [K] | None): the LM head's logits, or with ``head`` the head's final logits and picks; None on the
        dynamic path)."""
        drafter, dev = self.drafter, self.device
        if self.stages:  # DLoop: previous stage's hidden states stand in for the unverified features
            prev = self.stages[-1]
            start = prev.start + prev.tokens.numel()
            ctx, first, fused = prev.hidden[1:], prev.start, True  # [K_prev, d] at positions prev.start ..
        else:  # the committed positions not yet in the caches: their raw target features
            start = self._len
            ctx = torch.cat(self._pending) if self._pending else None  # [new, n*d]
            first, fused = self._cached, False
        anchor = self._check_draft(anchor_token, num_tokens, start)
        rows = num_tokens if drafter.anchor_predicts else num_tokens + 1  # query rows of the block
        if self.static_capacity is not None:
            hidden, *step = self._static_block(anchor, start, rows, ctx, first, fused, head)
        else:
            if ctx is not None:
                ctx = (ctx if fused else drafter.fuse(ctx))[None]  # [1, c, d]
            ctx_pos = None if ctx is None else torch.arange(first, first + ctx.shape[1], device=dev)
            ids = torch.full((rows,), self.config.mask_token_id, dtype=torch.long, device=dev)
            ids[0] = anchor[0]
            pos = torch.arange(start, start + rows, device=dev)  # [rows]
            hidden = drafter.block_hidden(drafter.embed_tokens(ids)[None], pos, ctx, ctx_pos, None, self.caches)
            hidden, step = drafter.slot_hidden(hidden)[0], None  # [K+1, d]: row k predicts the k-th token
        if not self.stages:
            self._cached, self._pending = self._len, []
        self.stages.append(Stage(start, anchor.expand(num_tokens), hidden))
        return hidden, anchor, step

    def _static_block(self, anchor, start: int, rows: int, ctx, first: int, fused: bool, head):
        """The static path: the new context rows (``ctx`` [n, ·] at positions ``first ..``, fused or raw) in a
        fixed ``[1, block_size, ·]`` buffer, then one :meth:`ParallelDrafter.block_step` → (hidden, logits, picks).
        Rows beyond the last ``block_size`` (a prompt) are written to the caches here, ahead of the step; the
        buffer's rows past n keep an earlier round's values: the step puts them at slots past the block, never
        visible and overwritten by later rounds (so the buffers hold ``end + block_size`` slots at most)."""
        width, capacity, end = self.config.block_size, self.static_capacity, start + rows
        # the full block's rows: the step's one shape (a shorter stage's extra rows are padding the mask hides),
        # where the buffers hold them (near the context's end a shorter stage keeps its own shape)
        full = max(rows, self.config.block_size - 1 if self.drafter.anchor_predicts else self.config.block_size)
        padded = full if start + full + width <= capacity else rows
        if static_state(self.drafter).get("owner") is not self:
            raise RuntimeError("a newer static session of this drafter now owns its static K/V buffers (one "
                               "static session per drafter at a time): start this sequence again")
        if end + width > capacity:
            raise ValueError(f"the static draft cache holds {capacity} positions; a block ending at {end} needs "
                             f"{end + width} (its padded context included): give a larger static_capacity")
        n = 0 if ctx is None else ctx.shape[0]
        if n > width:  # the prompt's context: written ahead, outside the fixed-shape step
            ahead = ctx[: n - width] if fused else self.drafter.fuse(ctx[: n - width])
            pos = torch.arange(first, first + n - width, device=self.device)
            for layer, cache in zip(self.drafter.layers, self.caches):
                cache.write(*layer.self_attn.project_kv(ahead[None], pos), pos)
            ctx, first, n = ctx[n - width:], first + n - width, width
        buffer = self._context.get(fused)
        if buffer is None:
            columns = self.config.hidden_size * (1 if fused else self.config.num_features)
            buffer = self._context[fused] = torch.zeros(1, width, columns, dtype=self.drafter.dtype, device=self.device)
        if n:
            buffer[0, :n] = ctx
        where = torch.tensor([start, first, n, rows], device=self.device)
        hidden, logits, picks = self.block_step(anchor, where, buffer, self.caches, padded, fused, head)
        k = rows if self.drafter.anchor_predicts else rows - 1  # the stage's drafts
        return hidden[: k + 1], logits[:k], None if picks is None else picks[:k]

    def _pick(self, hidden, anchor, logits, temperature, generator, picks=None) -> StageDraft:
        """The stage's tokens from the block (``hidden`` [K+1, d]) and its LM head's ``logits`` [K, V]: here the
        backbone's own picks; a method with a head (Domino, DSpark, DFlash 2) corrects the logits first, unless the
        static step ran it already (``picks`` [K]: its picks, ``logits`` its final logits)."""
        tokens, logprobs, probs = pick_tokens(logits, temperature, generator)
        return StageDraft(tokens, logprobs, probs, logits)


def static_state(drafter) -> dict:
    """The drafter's decode-time static state (buffers, owner, compiled step). A deep copy (Domino's
    ``base_view``) carries the original's state along; the id check gives the copy its own."""
    state = drafter.__dict__.get("_static_state")
    if state is None or state["drafter"] != id(drafter):
        state = drafter.__dict__["_static_state"] = {"drafter": id(drafter)}
    return state


def static_caches(drafter, capacity: int, owner) -> list[StaticKVCache]:
    """The drafter's static K/V buffers of ``capacity`` positions, one per layer, made once per drafter and
    capacity and shared by its sessions: a compiled block step (a CUDA graph) keeps reading the same
    buffers, so a new sequence needs no new graph. ``owner``, the newest static session, is the only one
    allowed to draft with them (an older one refuses instead of reading overwritten slots)."""
    state = static_state(drafter)
    state["owner"] = owner
    key = (int(capacity), drafter.dtype, next(drafter.parameters()).device)
    pools = state.setdefault("caches", {})
    if key not in pools:
        pools[key] = [StaticKVCache(capacity, layer.self_attn.num_kv_heads, layer.self_attn.head_dim, *key[1:])
                      for layer in drafter.layers]
    return pools[key]


def compiled_block_step(drafter):
    """``drafter.block_step`` under ``torch.compile`` (:func:`compile_for`), once per drafter, dtype and device
    (its graphs do not guard the drafter's own weights)."""
    device = next(drafter.parameters()).device
    compiled = static_state(drafter).setdefault("compiled", {})
    if (drafter.dtype, device) not in compiled:
        compiled[drafter.dtype, device] = compile_for(drafter.block_step, device)
    return compiled[drafter.dtype, device]

"""``ParallelDrafter``: the DFlash parallel draft backbone ("backbone-only").

Shapes: b batch, T sequence length, A anchors per sequence, B block size, d
width, n feature layers, V vocabulary.

A block is ``[x_a, MASK x (B-1)]`` at absolute positions ``a .. a+B-1``; block
position k >= 1 predicts ``x_{a+k}`` (DFlash's label convention). Every draft
layer attends from the block to ``cat(k/v_proj(ctx), k/v_proj(block))`` where
ctx is the fused target feature of each position before the block
(``RMSNorm(Linear(n*d, d)(features))``); the context never enters the
residual stream. The target's embedding and LM head are used, frozen.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lit_domino.models.base import Drafter, DrafterConfig
from lit_domino.models.layers import (DecoderLayer, KVCache, RMSNorm, StaticKVCache, call_layer, flex_block_mask,
                                     init_weights)
from lit_domino.models.loop import ContextFn, check_stages, stage_blocks
from lit_domino.models.registry import register
from lit_domino.models.parallel_session import ParallelSession
from lit_domino.models.objectives import IGNORE_INDEX, LossSettings, lean_block_ce, uses_own_loss, weighted_block_ce
from lit_domino.models.objectives.blocks import parallel_objective


@dataclass
class BlockOutput:
    """What a parallel drafter's training forward returns.

    The lean forward (``with_logits=False``, what training uses) returns the hidden states only and
    the method's loss applies the LM head to the labelled positions, chunk by chunk
    (``drafter.block_loss``); ``with_logits=True`` also materialises the ``[b, A, B, V]`` logits.
    """

    hidden: torch.Tensor
    """[b, A, B, d] block hidden states after the final norm (EAGLE-3's DLoop stages: before its final norm)."""
    labels: torch.Tensor
    """[b, A, B] ``x_{a+k}`` where k >= 1, a+k < T, loss_mask = 1 and the anchor is real; else -100."""
    block_tokens: torch.Tensor
    """[b, A, B] the true tokens ``x_{a+k}`` (0 beyond the sequence), for teacher forcing."""
    logits: torch.Tensor | None = None
    """[b, A, B, V] base logits ``lm_head(hidden)``; None on the lean path (``with_logits=False``)."""
    final_logits: torch.Tensor | None = None
    """[b, A, B, V] a method with a head (Domino): ``logits + ΔL`` (ΔL = 0 at block position 0); None on the
    lean path or without a head."""
    head_state: torch.Tensor | None = None
    """[b, A, B-1, d_s] Domino: the GRU state ``S_{k-1}`` feeding block position k = 1..B-1 (what the final
    logits need besides ``hidden``); None without a head."""

    @property
    def draft_logits(self) -> torch.Tensor:
        """The logits the drafter drafts from: the head's final logits when it has one, else the base logits
        (only when materialised: ``forward_train(with_logits=True)``; else ``drafter.block_preds``)."""
        logits = self.final_logits if self.final_logits is not None else self.logits
        if logits is None:
            raise ValueError("this BlockOutput comes from the lean forward (no logits materialised): use "
                             "forward_train(..., with_logits=True) or drafter.block_preds(out)")
        return logits


def block_attention_mask(anchors: torch.Tensor, anchor_mask: torch.Tensor, T: int, B: int) -> torch.Tensor:
    """The training mask ``[b, 1, A*B, T + A*B]`` (True = attend).

    Keys are ``[ctx positions 0..T-1, block 0 (B keys), block 1, ...]``; a query
    of block j sees ctx keys at positions < a_j (none when the anchor is masked
    out) and the B keys of block j (bidirectional), nothing else.
    """
    b, A = anchors.shape
    dev = anchors.device
    ctx_pos = torch.arange(T, device=dev)  # [T]
    ctx_vis = (ctx_pos[None, None, :] < anchors[:, :, None]) & anchor_mask[:, :, None]  # [b, A, T]
    ctx_vis = ctx_vis[:, :, None, :].expand(b, A, B, T).reshape(b, A * B, T)  # [b, A*B, T]
    blk = torch.arange(A, device=dev).repeat_interleave(B)  # [A*B] block id of each query/key
    blk_vis = (blk[:, None] == blk[None, :])[None].expand(b, A * B, A * B)  # [b, A*B, A*B]
    return torch.cat([ctx_vis, blk_vis], dim=-1)[:, None]  # [b, 1, A*B, T + A*B]


def block_flex_mask(anchors: torch.Tensor, anchor_mask: torch.Tensor, T: int, B: int):
    """:func:`block_attention_mask` as a flex-attention ``BlockMask`` (the same pattern, no dense tensor)."""
    b, A = anchors.shape
    seen = torch.where(anchor_mask.bool(), anchors, torch.zeros_like(anchors))  # ctx keys < seen[j] (0 = none)

    def mask_mod(bi, h, q, kv):
        blk = q // B
        return torch.where(kv < T, kv < seen[bi, blk], (kv - T) // B == blk)

    return flex_block_mask(mask_mod, b, A * B, T + A * B, anchors.device)


@dataclass
class BackboneConfig(DrafterConfig):
    """The DFlash backbone's config: the shared fields (``DrafterConfig``) with the DFlash feature-layer rule."""


def parallel_loop_forward(
    drafter,
    input_ids: torch.Tensor,  # [b, T]
    features: torch.Tensor,  # [b, T, n*d] raw target features
    anchors: torch.Tensor,  # [b, A] stage-1 anchors a
    anchor_mask: torch.Tensor,  # [b, A] bool
    num_stages: int,
    loss_mask: torch.Tensor | None = None,  # [b, T]
    attention_mask: torch.Tensor | None = None,  # [b, T]
    detach_stage_context: bool = False,
    causal_inputs: str = "teacher_forced",
    context_fn: ContextFn | None = None,
    stage_tokens: int | None = None,
    with_logits: bool = True,
) -> list[BlockOutput]:
    """DLoop's loop-aware training forward of a parallel drafter: stages 1..S per anchor
    (``lit_domino.models.loop`` explains the unroll); stage 1 is ``forward_train``. ``with_logits=False``:
    the lean stages (no ``[b, A, B, V]`` logits; the loss computes them). Masks are dense here."""
    K = check_stages(drafter, num_stages, anchors, anchor_mask, drafter.stage_tokens(drafter.config, stage_tokens))
    B = K if drafter.anchor_predicts else K + 1  # query rows per block
    first = drafter.forward_train(input_ids, features, anchors, anchor_mask, loss_mask, attention_mask, causal_inputs,
                                  with_logits)
    outs = [first]
    if num_stages == 1:
        return outs
    b, T = input_ids.shape
    A = anchors.shape[1]
    dev = input_ids.device
    anchor_mask = anchor_mask.bool()
    anchors = torch.where(anchor_mask, anchors, torch.zeros_like(anchors)).clamp(0, T - 1)
    ctx_target = drafter.fuse(features)  # [b, T, d]
    pos_target = torch.arange(T, device=dev)[None].expand(b, T)  # [b, T]
    base_mask = block_attention_mask(anchors, anchor_mask, T, B)  # [b, 1, A*B, T + A*B]
    target_vis, block_vis = base_mask[..., :T], base_mask[..., T:]  # context < a; own block only
    own = torch.arange(A, device=dev).repeat_interleave(B)  # [A*B] anchor of each query
    subst, subst_pos, subst_vis = [], [], []  # the drafter's own hidden states standing in as context
    for s in range(2, num_stages + 1):
        prev, prev_start = outs[-1], anchors + (s - 2) * K  # stage s-1 and its anchors
        h = prev.hidden[:, :, 1:]  # [b, A, K, d]: H[k+1] (predicted x_{p+1}) stands in at p = a_{s-1} + k
        if context_fn is not None:
            h = context_fn(s - 1, h)
        if detach_stage_context:
            h = h.detach()
        subst.append(h.reshape(b, A * K, -1))
        subst_pos.append((prev_start[:, :, None] + torch.arange(K, device=dev)).reshape(b, A * K))
        key_anchor = torch.arange(A, device=dev).repeat_interleave(K)  # [A*K]
        vis = (own[:, None] == key_anchor[None, :])[None] & anchor_mask.repeat_interleave(B, 1)[:, :, None]
        subst_vis.append(vis[:, None])  # [b, 1, A*B, A*K]
        starts = anchors + (s - 1) * K  # a_s
        block_ids, pos, block_tokens, labels = stage_blocks(drafter, input_ids, starts, anchor_mask, loss_mask,
                                                            attention_mask, K)
        ctx = torch.cat([ctx_target, *subst], dim=1)  # [b, T + (s-1)·A·K, d]
        ctx_pos = torch.cat([pos_target, *subst_pos], dim=1)
        mask = torch.cat([target_vis, *subst_vis, block_vis], dim=-1)  # [b, 1, A*B, T + (s-1)AK + A*B]
        emb = drafter.embed_tokens(block_ids[..., :B]).reshape(b, A * B, -1)
        hidden = drafter.block_hidden(emb, pos[..., :B].reshape(b, A * B), ctx, ctx_pos, mask).view(b, A, B, -1)
        hidden = drafter.slot_hidden(hidden)  # [b, A, K+1, d]
        out = BlockOutput(hidden=hidden, logits=drafter.compute_logits(hidden) if with_logits else None,
                          labels=labels, block_tokens=block_tokens)
        outs.append(drafter.add_head(out, causal_inputs))
    return outs


@register("backbone")
class ParallelDrafter(Drafter):
    """DFlash backbone: fusion, ``num_layers`` context decoder layers, final norm, the target's embed/head."""

    config_class = BackboneConfig
    session_class = ParallelSession
    keeps_block_hidden = True
    draft_options = ("static_capacity", "compile")
    tree_builders = ("chain", "ddtree")
    supports_loop_training = True

    def __init__(self, config: BackboneConfig):
        super().__init__(config)
        c = config
        d = c.hidden_size
        self.fc = nn.Linear(c.num_features * d, d, bias=False)  # n*d -> d
        self.hidden_norm = RMSNorm(d, c.rms_norm_eps)
        self.layers = nn.ModuleList(
            DecoderLayer(d, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.rope_theta, c.rms_norm_eps)
            for _ in range(c.num_layers)
        )
        self.norm = RMSNorm(d, c.rms_norm_eps)
        self.apply(init_weights)

    # ------------------------------------------------------------------ pieces

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def fuse(self, features: torch.Tensor) -> torch.Tensor:  # [..., n*d] -> [..., d]
        """Fused context vector per position: ``RMSNorm(Linear(n*d, d)(features))``."""
        return self.hidden_norm(self.fc(features.to(self.dtype)))

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:  # [...] -> [..., d]
        return self.embed(ids).to(self.dtype)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [..., d] -> [..., V]
        head = self.lm_head
        return head(hidden.to(head.weight.dtype))

    def block_hidden(
        self,
        block_emb: torch.Tensor,  # [b, N, d] embeddings of the block tokens
        block_pos: torch.Tensor,  # [N] | [b, N] absolute positions
        ctx: torch.Tensor | None = None,  # [b, C, d] fused context (keys/values only)
        ctx_pos: torch.Tensor | None = None,  # [C] | [b, C]
        mask: torch.Tensor | None = None,  # bool [b|1, 1, N, keys]; None = see everything
        caches: list[KVCache] | None = None,  # one per layer; ctx keys get appended
    ) -> torch.Tensor:  # [b, N, d] after the final norm
        h = block_emb
        recompute = self.training and caches is None and self.train_options.checkpoint_layers
        for i, layer in enumerate(self.layers):
            h = call_layer(layer, h, block_pos, ctx, ctx_pos, mask, caches[i] if caches is not None else None,
                           recompute=recompute)
        return self.norm(h)

    def block_step(self, anchor: torch.Tensor, where: torch.Tensor, ctx: torch.Tensor, caches: list[StaticKVCache],
                   rows: int, fused: bool, head=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One stage's draft on the static decode path, in one call (compiled: one graph per ``fused`` and ``head``)
        → (hidden [K+1, d] in the label layout, the LM head's logits [K, V], None), for a block of ``rows`` query
        rows (the full block). A method with a head may run it here too (``head``: what it needs, its session's
        ``_step_head``), returning its final logits and picks [K] instead (Domino).

        ``where`` = [start, first, n, real]: the anchor ``anchor`` [1] sits at position start and the block's
        query rows ``[anchor, MASK ...]`` at start .. start+rows-1, of which the first ``real`` are the stage's
        (a shorter stage: the rest are padding, whose keys sit past ``start + real`` where the mask hides them, so
        the real rows compute what a block of ``real`` rows would and one graph serves every stage length);
        ``ctx`` [1, W, ·] holds the n new context rows at positions first .. first+n-1 (raw target features,
        fused here, or with ``fused`` a DLoop stage's hidden states); its other W - n rows go to the slots after
        the block, hidden too. Positions are tensors, so one graph serves every round."""
        start, first, n, real = where.unbind()
        dev = ctx.device
        i = torch.arange(ctx.shape[1], device=dev)
        ctx_pos = torch.where(i < n, first + i, start + rows + i - n)  # [W]
        ids = torch.cat([anchor, anchor.new_full((rows - 1,), self.config.mask_token_id)])  # [rows]
        pos = start + torch.arange(rows, device=dev)  # [rows]
        hidden = self.block_hidden(self.embed_tokens(ids)[None], pos, ctx if fused else self.fuse(ctx), ctx_pos,
                                   StaticKVCache.visible(start + real, caches[0].capacity), caches)
        hidden = self.slot_hidden(hidden)[0]  # [K+1, d]: row k predicts the k-th drafted token
        return hidden, self.compute_logits(hidden[1:]), None

    # ------------------------------------------------------------------ training

    def block_tokens_and_labels(self, input_ids, anchors, anchor_mask, loss_mask=None, attention_mask=None):
        """-> (block_ids [b,A,B] = [x_a, MASK..], positions [b,A,B], block_tokens [b,A,B], labels [b,A,B])."""
        b, T = input_ids.shape
        B = self.config.block_size
        ks = torch.arange(B, device=input_ids.device)  # [B]
        pos = anchors[:, :, None] + ks  # [b, A, B]
        inside = pos < T  # [b, A, B]
        flat = pos.clamp(max=T - 1).reshape(b, -1)  # [b, A*B]
        true = input_ids.gather(1, flat).view_as(pos)  # [b, A, B]
        block_tokens = torch.where(inside, true, torch.zeros_like(true))
        valid = inside & (ks >= 1) & anchor_mask[:, :, None].bool()
        if loss_mask is not None:
            valid &= loss_mask.gather(1, flat).view_as(pos).bool()
        if attention_mask is not None:
            valid &= attention_mask.gather(1, flat).view_as(pos).bool()
        labels = torch.where(valid, true, torch.full_like(true, IGNORE_INDEX))
        block_ids = torch.full_like(true, self.config.mask_token_id)
        block_ids[:, :, 0] = input_ids.gather(1, anchors)
        return block_ids, pos, block_tokens, labels

    def forward_train(
        self,
        input_ids: torch.Tensor,  # [b, T]
        features: torch.Tensor,  # [b, T, n*d] raw target features
        anchors: torch.Tensor,  # [b, A] anchor positions a
        anchor_mask: torch.Tensor,  # [b, A] bool, real anchors
        loss_mask: torch.Tensor | None = None,  # [b, T] 1 on labels (response tokens); None = all
        attention_mask: torch.Tensor | None = None,  # [b, T] 1 on real tokens; None = all
        causal_inputs: str = "teacher_forced",
        with_logits: bool = True,
    ) -> BlockOutput:
        """All A blocks of each sequence in one attention call per layer (see ``block_attention_mask``), then
        the method's head (:meth:`add_head`; ``causal_inputs`` says how a head's causal state is fed).
        ``with_logits=False`` is the lean forward: no ``[b, A, B, V]`` logits (``block_loss`` computes them
        chunk by chunk at the labelled positions). The mask is dense or a flex ``BlockMask`` as
        ``self.train_options.attention`` says."""
        b, T = input_ids.shape
        A, B = anchors.shape[1], self.config.block_size
        anchor_mask = anchor_mask.bool()
        anchors = torch.where(anchor_mask, anchors, torch.zeros_like(anchors)).clamp(0, T - 1)
        block_ids, pos, block_tokens, labels = self.block_tokens_and_labels(
            input_ids, anchors, anchor_mask, loss_mask, attention_mask)
        ctx = self.fuse(features)  # [b, T, d]
        ctx_pos = torch.arange(T, device=input_ids.device)  # [T]
        R = B - 1 if self.anchor_predicts else B  # query rows per block
        if self.train_options.use_flex(input_ids.device):
            mask = block_flex_mask(anchors, anchor_mask, T, R)
        else:
            mask = block_attention_mask(anchors, anchor_mask, T, R)  # [b, 1, A*R, T + A*R]
        emb = self.embed_tokens(block_ids[..., :R]).reshape(b, A * R, -1)  # [b, A*R, d]
        hidden = self.block_hidden(emb, pos[..., :R].reshape(b, A * R), ctx, ctx_pos, mask).view(b, A, R, -1)
        hidden = self.slot_hidden(hidden)  # [b, A, B, d]
        out = BlockOutput(hidden=hidden, logits=self.compute_logits(hidden) if with_logits else None, labels=labels,
                          block_tokens=block_tokens)
        return self.add_head(out, causal_inputs)

    @property
    def anchor_predicts(self) -> bool:
        """Whether the block's anchor slot predicts too (DeepSpec's ``sample_from_anchor``): a block of the suite's
        size B then runs B-1 query rows ``[x_a, MASK × (B-2)]`` at ``a .. a+B-2``, row j predicting ``x_{a+j+1}``
        (same B-1 drafted tokens, same verify width). False here: row k >= 1 predicts ``x_{a+k}``."""
        return False

    def slot_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """The block's query rows ``[..., R, d]`` in the suite's label layout ``[..., B, d]``: index k predicts
        ``x_{a+k}``. With :attr:`anchor_predicts` a zero row goes in front (index 0 predicts nothing, as
        always), so the labels, losses, metrics and DLoop's ``hidden[1:]`` context stay the same code."""
        if not self.anchor_predicts:
            return hidden
        return torch.cat([hidden.new_zeros(*hidden.shape[:-2], 1, hidden.shape[-1]), hidden], dim=-2)

    def add_head(self, out: BlockOutput, causal_inputs: str = "teacher_forced") -> BlockOutput:
        """Hook for a method's head on top of the backbone's blocks (Domino sets ``final_logits``); none here."""
        return out

    def block_loss(self, out: BlockOutput, settings: LossSettings) -> tuple[torch.Tensor, dict]:
        """The position-weighted block CE on the base logits → (loss, parts to log); from the materialised
        logits when the forward made them, else chunk by chunk at the labelled positions (the lean path). A
        selected objective other than ``ce``: :func:`~lit_domino.models.objectives.blocks.parallel_objective`."""
        if not uses_own_loss(settings):
            return parallel_objective(self, out, settings)
        if out.logits is not None:
            loss = weighted_block_ce(out.logits, out.labels, settings.position_weights)
        else:
            loss = lean_block_ce(self.compute_logits, out.hidden, out.labels, settings.position_weights,
                                 settings.chunk_size)
        return loss, {"loss_base": loss.detach()}

    def batch_loss(self, batch, features, settings, causal_inputs: str = "teacher_forced"):
        out = self.forward_train(batch["input_ids"], features, batch["anchors"], batch["anchor_mask"],
                                 batch.get("loss_mask"), batch.get("attention_mask"), causal_inputs,
                                 with_logits=settings.chunk_size is None)
        return self.block_loss(out, settings)

    def loop_forward(self, input_ids, features, anchors, anchor_mask, num_stages: int, loss_mask=None,
                     attention_mask=None, detach_stage_context: bool = False, causal_inputs: str = "teacher_forced",
                     stage_tokens: int | None = None, context_fn: ContextFn | None = None,
                     with_logits: bool = True) -> list[BlockOutput]:
        """DLoop's loop-aware training forward (:func:`parallel_loop_forward`)."""
        return parallel_loop_forward(self, input_ids, features, anchors, anchor_mask, num_stages, loss_mask,
                                     attention_mask, detach_stage_context, causal_inputs, context_fn, stage_tokens,
                                     with_logits)

    # ------------------------------------------------------------------ decoding

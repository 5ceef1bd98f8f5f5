"""DLoop's loop-aware training forward: unroll S drafting stages per anchor, exactly as the sessions draft them.

Shapes: b batch, T sequence length, A anchors, S stages, B block size, K = B-1 tokens
per stage, d width, V vocabulary.

**Parallel drafters** (backbone, Domino). Stage 1 at anchor ``a`` is the ordinary
training block (``drafter.forward_train``: context = fused target features at
positions ``< a``). Stage ``s > 1`` is anchored at the ground-truth token ending stage
``s-1``, ``a_s = a + (s-1)·K``: the block ``[x_{a_s}, MASK × K]`` at positions
``a_s .. a_s+K`` whose context is

* the fused target features at positions ``< a`` (the verified prefix), and
* for every earlier stage ``i < s``, that stage's final-normed block hidden states
  ``H_i[1..K]`` at positions ``a_i .. a_i+K-1``: the hidden state that predicted
  ``x_{p+1}`` stands in for the target feature at ``p`` (same alignment as
  ``ParallelSession.draft``, which appends ``prev.hidden[1:]`` as context keys).

Tokens are ground truth (at inference they are the drafts, equal to the truth whenever
the earlier stages were fully accepted, the only case in which a later stage can count).
Domino's head runs on each stage's block from a fresh GRU state at its anchor, as
``DominoSession`` does.

**EAGLE-3** (a chain drafter). Its session's second stage simply continues the chain:
the step at ``a_s`` takes the anchor token (the previous stage's last draft) and the
previous step's own output hidden state, and attends to the real prefix's step keys
plus every chain step so far. So a stage = the next ``K`` chain steps (``K = block_size-1``
by default, what the engine drafts per stage); stage ``s`` = chain steps
``(s-1)·K .. s·K-1`` from the anchor. The chain runs per anchor (queries ``[b, A]``
per step), attending to the real step-0 keys at positions ``1..a-1`` and to its own
earlier chain steps; with anchors at every position and ``S = 1`` it equals
``Eagle3Drafter.forward_train`` with ``ttt_steps = K``. The stage context that a
``detach_stage_context`` cuts is the hidden state carried into the stage plus the
earlier stages' chain keys/values (computed from the drafter's own hidden states).

Every stage comes back as a :class:`~lit_domino.models.backbone.BlockOutput` with block
position ``k = 1..K`` predicting ``x_{a_s+k}`` (EAGLE-3: ``logits[..., k, :]`` is chain
step ``(s-1)K + k-1``; position 0 is a dummy, never a label), so the per-position
losses and metrics of the parallel drafters apply unchanged.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from lit_domino.models.backbone import IGNORE_INDEX, BlockOutput, block_attention_mask

ContextFn = Callable[[int, torch.Tensor], torch.Tensor]
"""``context_fn(stage, hidden) -> hidden``: applied to the drafter's own hidden states of 1-based stage
``stage`` before they serve as the context of the next stage (tests perturb them with it)."""


def check_stages(drafter, num_stages: int, anchors: torch.Tensor | None = None,
                 anchor_mask: torch.Tensor | None = None, stage_tokens: int | None = None) -> int:
    """Validate the stage depth (>= 1) and that the deepest stage stays below the position limit."""
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
        raise ValueError(f"num_stages must be an integer >= 1 (1 = ordinary training), got {num_stages!r}")
    K = stage_tokens if stage_tokens is not None else drafter.config.block_size - 1
    limit = drafter.config.max_position_embeddings
    reach = num_stages * K  # the last drafted position is a + S·K
    if reach >= limit:
        raise ValueError(f"{num_stages} stages of {K} tokens reach {reach} positions past the anchor, beyond the "
                         f"drafter's max_position_embeddings ({limit}); lower max_stages")
    if anchors is not None:
        real = anchors[anchor_mask.bool()] if anchor_mask is not None else anchors.reshape(-1)
        if real.numel() and int(real.max()) + reach >= limit:
            raise ValueError(
                f"anchor {int(real.max())} + {num_stages} stages x {K} tokens reaches position "
                f"{int(real.max()) + reach}, beyond the drafter's max_position_embeddings ({limit}); lower "
                "max_stages or the data's max_length"
            )
    return K


def _pad_right(x: torch.Tensor | None, n: int, value: int = 0) -> torch.Tensor | None:
    return None if x is None else F.pad(x, (0, n), value=value)


def _stage_blocks(drafter, input_ids, starts, anchor_mask, loss_mask, attention_mask, K):
    """Block ids/positions/tokens/labels of blocks at ``starts`` [b, A] that may run past the sequence end."""
    T = input_ids.shape[1]
    if loss_mask is None:
        loss_mask = torch.ones_like(input_ids)
    # pad so every gather is in range; padded positions are neither labels nor real tokens
    ids = _pad_right(input_ids, int(starts.max()) + K + 1 - T if int(starts.max()) + K + 1 > T else 0)
    pad = ids.shape[1] - T
    lm = _pad_right(loss_mask, pad)
    am = _pad_right(attention_mask, pad) if attention_mask is not None else _pad_right(torch.ones_like(input_ids), pad)
    block_ids, pos, block_tokens, labels = drafter.block_tokens_and_labels(ids, starts, anchor_mask, lm, am)
    inside = pos < T
    block_tokens = torch.where(inside, block_tokens, torch.zeros_like(block_tokens))
    return block_ids, pos, block_tokens, labels


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
) -> list[BlockOutput]:
    """Stages 1..S of a backbone / Domino drafter (see the module docstring); stage 1 is ``forward_train``."""
    K = check_stages(drafter, num_stages, anchors, anchor_mask)
    B = K + 1
    is_domino = hasattr(drafter, "head_logits")
    kw = {"causal_inputs": causal_inputs} if is_domino else {}
    first = drafter.forward_train(input_ids, features, anchors, anchor_mask, loss_mask, attention_mask, **kw)
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
        block_ids, pos, block_tokens, labels = _stage_blocks(drafter, input_ids, starts, anchor_mask, loss_mask,
                                                             attention_mask, K)
        ctx = torch.cat([ctx_target, *subst], dim=1)  # [b, T + (s-1)·A·K, d]
        ctx_pos = torch.cat([pos_target, *subst_pos], dim=1)
        mask = torch.cat([target_vis, *subst_vis, block_vis], dim=-1)  # [b, 1, A*B, T + (s-1)AK + A*B]
        emb = drafter.embed_tokens(block_ids).reshape(b, A * B, -1)
        hidden = drafter.block_hidden(emb, pos.reshape(b, A * B), ctx, ctx_pos, mask).view(b, A, B, -1)
        out = BlockOutput(hidden=hidden, logits=drafter.compute_logits(hidden), labels=labels,
                          block_tokens=block_tokens)
        if is_domino:
            out.final_logits = drafter.head_logits(out, causal_inputs)
        outs.append(out)
    return outs


def eagle_loop_forward(
    drafter,
    input_ids: torch.Tensor,  # [b, T]
    features: torch.Tensor,  # [b, T, 3d]
    anchors: torch.Tensor,  # [b, A] chain starts (the anchor step's position)
    anchor_mask: torch.Tensor,  # [b, A] bool
    num_stages: int,
    loss_mask: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    detach_stage_context: bool = False,
    stage_tokens: int | None = None,
    context_fn: ContextFn | None = None,
) -> list[BlockOutput]:
    """Stages 1..S of an EAGLE-3 chain per anchor (see the module docstring). ``stage_tokens`` K defaults to
    ``block_size - 1`` (the engine's tokens per stage)."""
    K = check_stages(drafter, num_stages, anchors, anchor_mask, stage_tokens)
    if K < 1:
        raise ValueError(f"stage_tokens must be >= 1, got {K}")
    b, T = input_ids.shape
    A = anchors.shape[1]
    dev = input_ids.device
    J = num_stages * K
    anchor_mask = anchor_mask.bool() & (anchors >= 1)  # an EAGLE chain needs one real step before it
    anchors = torch.where(anchor_mask, anchors, torch.ones_like(anchors)).clamp(1, T - 1)
    if loss_mask is None:
        loss_mask = torch.ones_like(input_ids)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    ids = _pad_right(input_ids, J + 1)  # [b, T + J + 1]
    ok = (_pad_right(loss_mask, J + 1) * _pad_right(attention_mask, J + 1)).bool()
    g = drafter.fuse(features)  # [b, T, d]
    feat_prev = F.pad(g[:, :-1], (0, 0, 1, 0))  # [b, T, d] g_{p-1}
    x_real = torch.cat([drafter.input_layernorm(drafter.embed_tokens(input_ids)),
                        drafter.hidden_norm(feat_prev)], dim=-1)  # [b, T, 2d] the real steps' layer inputs
    pos_real = torch.arange(T, device=dev)[None].expand(b, T)
    p = torch.arange(T, device=dev)
    real_vis = ((p[None, None] >= 1) & (p[None, None] < anchors[:, :, None]) & anchor_mask[:, :, None])[:, None]
    same = torch.eye(A, dtype=torch.bool, device=dev)[None, None].expand(b, 1, A, A)  # [b, 1, A, A]
    h = feat_prev.gather(1, anchors[:, :, None].expand(b, A, g.shape[-1]))  # [b, A, d] g_{a-1}
    chain_x, chain_pos, steps = [], [], []
    attn = drafter.self_attn
    for j in range(J):
        if j and j % K == 0:  # entering stage j // K + 1: h is the previous stage's last hidden state
            if context_fn is not None:
                h = context_fn(j // K, h)
            if detach_stage_context:
                h = h.detach()
                chain_x = [chain_x[0]] + [x.detach() for x in chain_x[1:]]
        pos = anchors + j  # [b, A]
        tok = ids.gather(1, pos)  # [b, A] ground truth x_{a+j}
        x = torch.cat([drafter.input_layernorm(drafter.embed_tokens(tok)), drafter.hidden_norm(h)], dim=-1)
        ctx = torch.cat([x_real, *chain_x], dim=1)  # [b, T + j·A, 2d]
        ctx_pos = torch.cat([pos_real, *chain_pos], dim=1)
        mask = torch.cat([real_vis, *([same] * (j + 1))], dim=-1)  # [b, 1, A, T + (j+1)·A]
        out = h + attn(x, pos, ctx, ctx_pos, mask)
        out = out + drafter.mlp(drafter.post_attention_layernorm(out))  # [b, A, d] pre final norm
        label = ids.gather(1, pos + 1)
        valid = ok.gather(1, pos + 1) & (pos + 1 < T) & anchor_mask
        steps.append((out, drafter.compute_logits(out), torch.where(valid, label, torch.full_like(label, -100))))
        chain_x.append(x)
        chain_pos.append(pos)
        h = out
    outs = []
    for s in range(num_stages):
        hs, ls, ys = zip(*steps[s * K:(s + 1) * K])
        start = anchors + s * K
        tokens = ids.gather(1, (start[:, :, None] + torch.arange(K + 1, device=dev)).reshape(b, -1)).view(b, A, K + 1)
        inside = (start[:, :, None] + torch.arange(K + 1, device=dev)) < T
        hidden = torch.stack([torch.zeros_like(hs[0]), *hs], dim=2)  # [b, A, K+1, d]
        logits = torch.stack([torch.zeros_like(ls[0]), *ls], dim=2)  # [b, A, K+1, V]
        labels = torch.stack([torch.full_like(ys[0], IGNORE_INDEX), *ys], dim=2)  # [b, A, K+1]
        outs.append(BlockOutput(hidden=hidden, logits=logits, labels=labels,
                                block_tokens=torch.where(inside, tokens, torch.zeros_like(tokens))))
    return outs


def loop_forward(drafter, input_ids, features, anchors, anchor_mask, num_stages: int, loss_mask=None,
                 attention_mask=None, detach_stage_context: bool = False, causal_inputs: str = "teacher_forced",
                 stage_tokens: int | None = None, context_fn: ContextFn | None = None) -> list[BlockOutput]:
    """Dispatch on the drafter kind: :func:`parallel_loop_forward` or :func:`eagle_loop_forward`."""
    kind = getattr(drafter, "kind", None)
    if kind in ("backbone", "domino"):
        if stage_tokens not in (None, drafter.config.block_size - 1):
            raise ValueError(f"a parallel drafter's stage drafts block_size - 1 = {drafter.config.block_size - 1} "
                             f"tokens, got stage_tokens={stage_tokens}")
        return parallel_loop_forward(drafter, input_ids, features, anchors, anchor_mask, num_stages, loss_mask,
                                     attention_mask, detach_stage_context, causal_inputs, context_fn)
    if kind == "eagle3":
        return eagle_loop_forward(drafter, input_ids, features, anchors, anchor_mask, num_stages, loss_mask,
                                  attention_mask, detach_stage_context, stage_tokens, context_fn)
    raise ValueError(f"loop-aware training supports backbone, domino and eagle3 drafters, not {kind!r} "
                     "(a small LM has no hidden-state context to substitute)")

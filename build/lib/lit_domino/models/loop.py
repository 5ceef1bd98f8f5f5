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

The unrolls are the methods' own (``ParallelDrafter.loop_forward`` in ``backbone.py``,
``Eagle3Drafter.loop_forward`` in ``eagle.py``); this module holds what they share.

Every stage comes back as a :class:`~lit_domino.models.backbone.BlockOutput` with block
position ``k = 1..K`` predicting ``x_{a_s+k}`` (EAGLE-3: ``logits[..., k, :]`` is chain
step ``(s-1)K + k-1``; position 0 is a dummy, never a label), so the per-position
losses and metrics of the parallel drafters apply unchanged.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F


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


def pad_right(x: torch.Tensor | None, n: int, value: int = 0) -> torch.Tensor | None:
    return None if x is None else F.pad(x, (0, n), value=value)


def stage_blocks(drafter, input_ids, starts, anchor_mask, loss_mask, attention_mask, K):
    """Block ids/positions/tokens/labels of blocks at ``starts`` [b, A] that may run past the sequence end."""
    T = input_ids.shape[1]
    if loss_mask is None:
        loss_mask = torch.ones_like(input_ids)
    # pad so every gather is in range; padded positions are neither labels nor real tokens
    ids = pad_right(input_ids, int(starts.max()) + K + 1 - T if int(starts.max()) + K + 1 > T else 0)
    pad = ids.shape[1] - T
    lm = pad_right(loss_mask, pad)
    am = pad_right(attention_mask, pad) if attention_mask is not None else pad_right(torch.ones_like(input_ids), pad)
    block_ids, pos, block_tokens, labels = drafter.block_tokens_and_labels(ids, starts, anchor_mask, lm, am)
    inside = pos < T
    block_tokens = torch.where(inside, block_tokens, torch.zeros_like(block_tokens))
    return block_ids, pos, block_tokens, labels


def loop_forward(drafter, input_ids, features, anchors, anchor_mask, num_stages: int, loss_mask=None,
                 attention_mask=None, detach_stage_context: bool = False, causal_inputs: str = "teacher_forced",
                 stage_tokens: int | None = None, context_fn: ContextFn | None = None,
                 with_logits: bool = True) -> list:
    """Stages 1..S of ``drafter``'s loop-aware training forward (its own ``loop_forward``); ``with_logits=False``
    leaves the logits to the stage loss (the lean path)."""
    if not getattr(drafter, "supports_loop_training", False):
        raise ValueError(f"loop-aware training does not apply to a {drafter.kind!r} drafter (it has no hidden-state "
                         "context to substitute for the target's features)")
    return drafter.loop_forward(input_ids, features, anchors, anchor_mask, num_stages, loss_mask, attention_mask,
                                detach_stage_context, causal_inputs, stage_tokens, context_fn, with_logits)

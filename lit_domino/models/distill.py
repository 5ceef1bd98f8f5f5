"""``DistilledDrafter``: a parallel drafter trained against the target's own distribution (DSpark, DFlash 2).

Such a drafter's features follow the ``dspark`` feature rule: the first ``num_features`` layers are DFlash's
fused context, and the last feature layer is the target's final decoder layer, whose (normed) hidden state at
``a+k-1`` gives the target's distribution ``p_k = softmax(lm_head(·))`` over block position k's label
``x_{a+k}``. Both its losses (DeepSpec's TV + confidence, DFlash 2's KL) read that ``p`` from the same cached
features, so ordinary training and every stage of DLoop's loop-aware training get it without another target
forward: stage s is anchored at ``a + (s-1)·K`` on ground-truth tokens, so its ``p`` is the target's there.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from lit_domino.models.backbone import BlockOutput, ParallelDrafter
from lit_domino.models.base import DrafterMismatchError


def previous_tokens(block_tokens: torch.Tensor) -> torch.Tensor:
    """[..., B] block tokens ``x_a .. x_{a+B-1}`` -> the previous token of each slot, ``[x_a, x_a .. x_{a+B-2}]``
    (slot 0 gets the anchor itself, as speculators' ``sample_from_anchor=False`` feeds it)."""
    return torch.cat([block_tokens[..., :1], block_tokens[..., :-1]], dim=-1)


def block_starts(anchors: torch.Tensor, anchor_mask: torch.Tensor, T: int) -> torch.Tensor:
    """The start a of each block [b, A] (a masked anchor reads position 0; within the sequence)."""
    return torch.where(anchor_mask.bool(), anchors, torch.zeros_like(anchors)).clamp(0, T - 1)


def block_target_hidden(last: torch.Tensor, starts: torch.Tensor, block_size: int) -> torch.Tensor:
    """The target's final (normed) hidden states ``last`` [b, T, d] at ``a+k-1`` (what predicted ``x_{a+k}``) of
    each block position of the blocks at ``starts`` [b, A] -> [b, A, B, d]; positions past the sequence read its
    last one (they are never labels). ``lm_head`` of it is the target's distribution p (any drafter reading the
    ``dspark`` features: DSpark and DFlash 2, the backbone and Domino under an objective that needs p)."""
    b, T, d = last.shape
    pos = (starts[:, :, None] + torch.arange(block_size, device=starts.device) - 1).clamp(0, T - 1)  # [b, A, B]
    return last.gather(1, pos.reshape(b, -1, 1).expand(-1, -1, d)).view(b, *pos.shape[1:], d)


class DistilledDrafter(ParallelDrafter):
    """The backbone whose block outputs carry ``target_hidden`` [b, A, B, d]: the target's final hidden state at
    ``a+k-1`` for every block position (the subclass's output dataclass declares the field)."""

    method_name: ClassVar[str] = "distilled"
    """How error messages name the method (``DSpark``, ``DFlash 2``)."""
    supports_loop_training = True  # each stage's target distribution is read from the same cached features

    def bind_target(self, target) -> "DistilledDrafter":
        super().bind_target(target)
        last = self.config.feature_layers[-1]
        if last != target.num_layers - 1:
            raise DrafterMismatchError(
                f"a {self.method_name} drafter's last feature layer carries the target's distribution and must be "
                f"its last decoder layer ({target.num_layers - 1} in {target.name!r}), got {last}")
        return self

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """The fused context of the first n layers (the last feature layer is the target's distribution)."""
        return super().fuse(features[..., : self.config.num_features * self.config.hidden_size])

    def target_hidden(self, features: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        """The target's final hidden state at ``a+k-1`` (what predicted ``x_{a+k}``) of each block position of
        the blocks at ``starts`` [b, A] -> [b, A, B, d] (:func:`block_target_hidden` of the last feature layer)."""
        return block_target_hidden(features[..., -self.config.hidden_size:], starts, self.config.block_size)

    @staticmethod
    def _starts(anchors: torch.Tensor, anchor_mask: torch.Tensor, T: int) -> torch.Tensor:
        return block_starts(anchors, anchor_mask, T)

    def forward_train(self, input_ids, features, anchors, anchor_mask, loss_mask=None, attention_mask=None,
                      causal_inputs: str = "teacher_forced", with_logits: bool = True) -> BlockOutput:
        """The backbone's forward with the method's head, plus each block position's ``target_hidden``."""
        out = super().forward_train(input_ids, features, anchors, anchor_mask, loss_mask, attention_mask,
                                    causal_inputs, with_logits)
        out.target_hidden = self.target_hidden(features, self._starts(anchors, anchor_mask, input_ids.shape[1]))
        return out

    def loop_forward(self, input_ids, features, anchors, anchor_mask, num_stages: int, loss_mask=None,
                     attention_mask=None, detach_stage_context: bool = False, causal_inputs: str = "teacher_forced",
                     stage_tokens: int | None = None, context_fn=None, with_logits: bool = True) -> list[BlockOutput]:
        """DLoop's unroll (:func:`~lit_domino.models.backbone.parallel_loop_forward`, the method's head on every
        stage from its own anchor, as its session drafts it) with each stage's ``target_hidden``."""
        outs = super().loop_forward(input_ids, features, anchors, anchor_mask, num_stages, loss_mask, attention_mask,
                                    detach_stage_context, causal_inputs, stage_tokens, context_fn, with_logits)
        first, K = self._starts(anchors, anchor_mask, input_ids.shape[1]), self.config.block_size - 1
        for s, out in enumerate(outs[1:], start=2):
            out.target_hidden = self.target_hidden(features, first + (s - 1) * K)
        return outs

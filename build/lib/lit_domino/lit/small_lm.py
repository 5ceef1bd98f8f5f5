"""Small independent LM drafter (a tiny Qwen3ForCausalLM), trained as a plain LM on response tokens."""

from __future__ import annotations

from typing import Any

import torch

from lit_domino.lit.base import DrafterModule, StepOutput
from lit_domino.models import SmallLMDrafter
from lit_domino.models.objectives import IGNORE_INDEX


class SmallLMModule(DrafterModule):
    """Plain next-token CE on response tokens (``loss_mask``); reads no target features.

    Validation scores it as a chain drafter of ``block_size - 1`` tokens from each
    anchor: with teacher-forced logits, position k of the block is the prediction
    at ``a+k-1`` of ``x_{a+k}``. Given a correct prefix this *is* the greedy draft,
    so ``val/tau_prefix`` is exact; ``val/acc_pos_*`` are teacher-forced accuracies.

    Args (beyond :class:`~lit_domino.lit.base.DrafterModule`'s; ``num_layers`` = the LM's depth,
    ``block_size`` = the drafted chain length + 1 for the validation metrics):
        hidden_size: the LM's width; None = half the target's, rounded to its head width
            (``SmallLMConfig.from_target``). ``drafter_options`` sets any other width.
    """

    variant = "small_lm"
    drafter_class = SmallLMDrafter

    def __init__(self, hidden_size: int | None = None, **kwargs):
        if hidden_size is not None and int(hidden_size) <= 0:
            raise ValueError(f"hidden_size must be > 0, got {hidden_size}")
        super().__init__(**kwargs)

    def drafter_options(self) -> dict[str, Any]:
        return {} if self.hparams.hidden_size is None else {"hidden_size": int(self.hparams.hidden_size)}

    def forward_step(self, batch: dict, stage: str) -> StepOutput:
        out = self.drafter.forward_train(batch["input_ids"], batch["loss_mask"], batch["attention_mask"],
                                         with_logits=self.with_logits)
        chunk = self.hparams.loss_chunk_size
        loss = self.drafter.train_loss(out, chunk)
        preds = labels = None
        if stage != "train":
            preds, labels = chain_blocks(self.drafter.next_token_preds(out, chunk), batch,
                                         int(self.hparams.block_size))
        return StepOutput(loss=loss, preds=preds, labels=labels)


def chain_blocks(pred_ids: torch.Tensor, batch: dict, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced next-token picks ``[b, T]`` → block view ``[b, A, B]`` at the batch's anchors."""
    input_ids, anchors = batch["input_ids"], batch["anchors"]
    b, T = input_ids.shape
    k = torch.arange(block_size, device=input_ids.device)
    pos = anchors[:, :, None] + k  # [b, A, B] absolute position of block slot k
    inside = pos < T
    flat = pos.clamp(max=T - 1).reshape(b, -1)
    prev = (pos - 1).clamp(min=0, max=T - 1).reshape(b, -1)
    labels = input_ids.gather(1, flat).view_as(pos)
    valid = inside & (k >= 1) & batch["anchor_mask"].bool()[:, :, None]
    valid &= (batch["loss_mask"] * batch["attention_mask"]).gather(1, flat).view_as(pos).bool()
    labels = torch.where(valid, labels, torch.full_like(labels, IGNORE_INDEX))
    preds = pred_ids.gather(1, prev).view_as(pos)
    return preds, labels

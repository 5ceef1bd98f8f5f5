"""Backbone-only variant: the DFlash parallel draft backbone, trained on its base logits."""

from __future__ import annotations

from lit_domino.lit.base import DrafterModule, StepOutput
from lit_domino.objectives import weighted_block_ce


class BackboneModule(DrafterModule):
    """DFlash backbone: position-weighted block CE on the base logits (``train/loss_base``).

    Takes only :class:`~lit_domino.lit.base.DrafterModule`'s arguments.
    """

    variant = "backbone"

    def drafter_kind(self) -> str:
        return "backbone"

    def forward_step(self, batch: dict, stage: str) -> StepOutput:
        out = self.drafter.forward_train(
            batch["input_ids"], batch["features"], batch["anchors"], batch["anchor_mask"],
            loss_mask=batch["loss_mask"], attention_mask=batch["attention_mask"],
        )
        loss = weighted_block_ce(out.logits, out.labels, self.position_weights)
        preds = out.logits.detach().argmax(-1) if stage != "train" else None
        return StepOutput(loss=loss, logs={"loss_base": loss.detach()}, preds=preds, labels=out.labels)

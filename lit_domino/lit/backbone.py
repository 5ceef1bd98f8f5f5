"""Backbone-only variant: the DFlash parallel draft backbone, trained on its base logits."""

from __future__ import annotations

from lit_domino.lit.base import DrafterModule, StepOutput
from lit_domino.models import ParallelDrafter


class BackboneModule(DrafterModule):
    """DFlash backbone: position-weighted block CE on the base logits (``train/loss_base``), or the selected
    ``objective``.

    Takes only :class:`~lit_domino.lit.base.DrafterModule`'s arguments.
    """

    variant = "backbone"
    drafter_class = ParallelDrafter
    supports_objective = True

    def forward_step(self, batch: dict, stage: str) -> StepOutput:
        features, last = self.split_target_layer(batch["features"])
        out = self.drafter.forward_train(
            batch["input_ids"], features, batch["anchors"], batch["anchor_mask"],
            loss_mask=batch["loss_mask"], attention_mask=batch["attention_mask"], with_logits=self.with_logits,
        )
        self.attach_target(out, last, batch)
        loss, logs = self.drafter.block_loss(out, self.loss_settings())
        preds = self.drafter.block_preds(out, self.hparams.loss_chunk_size) if stage != "train" else None
        return StepOutput(loss=loss, logs=logs, preds=preds, labels=out.labels)

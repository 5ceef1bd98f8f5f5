"""Domino variant: parallel backbone + lightweight causal head, with the base-anchored curriculum."""

from __future__ import annotations

import dataclasses
from typing import Literal

from lit_domino.lit.base import DrafterModule, StepOutput
from lit_domino.objectives import LambdaSchedule, curriculum_loss


class DominoModule(DrafterModule):
    """Domino: ``loss = λ_t·CE(L_base) + (1−λ_t)·CE(L_final)``, both position-weighted.

    The head's rank r and GRU width d_s are the base's ``rank`` and ``gru_hidden``.

    Args (beyond :class:`~lit_domino.lit.base.DrafterModule`'s):
        causal_inputs: GRU inputs in training: ``teacher_forced`` (ground-truth
            tokens, one parallel pass; the paper's better setting) or
            ``training_time_test`` (the draft's own argmax picks, sequential).
            Validation always teacher-forces: given a correct prefix the inputs
            equal the draft's own picks, so ``val/tau_prefix`` is exact.
        curriculum: the λ schedule, counted in optimizer steps over
            ``trainer.estimated_stepping_batches`` (``kind: none`` = no base term).

    Logs ``train/loss_base``, ``train/loss_final``, ``train/lambda``.
    """

    variant = "domino"

    def __init__(
        self,
        causal_inputs: Literal["teacher_forced", "training_time_test"] = "teacher_forced",
        curriculum: LambdaSchedule = LambdaSchedule("linear"),
        **kwargs,
    ):
        if causal_inputs not in ("teacher_forced", "training_time_test"):
            raise ValueError(f"causal_inputs must be 'teacher_forced' or 'training_time_test', got {causal_inputs!r}")
        if isinstance(curriculum, dict):
            curriculum = LambdaSchedule(**curriculum)
        super().__init__(**kwargs)
        self.curriculum = curriculum
        # plain types in hparams: checkpoints stay loadable with torch.load(weights_only=True)
        self.hparams["curriculum"] = dataclasses.asdict(curriculum)

    def drafter_kind(self) -> str:
        return "domino"

    def current_lambda(self) -> float:
        """λ_t at the current optimizer step."""
        return self.curriculum.value(self.global_step, self.total_steps())

    def forward_step(self, batch: dict, stage: str) -> StepOutput:
        causal = self.hparams.causal_inputs if stage == "train" else "teacher_forced"
        out = self.drafter.forward_train(
            batch["input_ids"], batch["features"], batch["anchors"], batch["anchor_mask"],
            loss_mask=batch["loss_mask"], attention_mask=batch["attention_mask"], causal_inputs=causal,
        )
        if stage == "train":
            lam = self.current_lambda()
            loss, loss_base, loss_final = curriculum_loss(
                out.logits, out.final_logits, out.labels, self.position_weights, lam
            )
            logs = {"loss_base": loss_base.detach(), "loss_final": loss_final.detach(), "lambda": float(lam)}
            return StepOutput(loss=loss, logs=logs, labels=out.labels)
        # validation: the loss of the logits that are drafted from (the final ones)
        _, loss_base, loss_final = curriculum_loss(out.logits, out.final_logits, out.labels, self.position_weights, 0.0)
        logs = {"loss_base": loss_base.detach(), "loss_final": loss_final.detach()}
        return StepOutput(loss=loss_final, logs=logs, preds=out.final_logits.argmax(-1), labels=out.labels)

"""Domino variant: parallel backbone + lightweight causal head, with the base-anchored curriculum."""

from __future__ import annotations

import dataclasses
from typing import Literal

from lit_domino.lit.base import DrafterModule, StepOutput, method_config, refuse_moved
from lit_domino.models import DominoDrafter, DominoHeadConfig
from lit_domino.models.domino import CAUSAL_INPUTS
from lit_domino.models.objectives import LambdaSchedule


class DominoModule(DrafterModule):
    """Domino: ``loss = λ_t·CE(L_base) + (1−λ_t)·CE(L_final)``, both position-weighted (a selected ``objective``
    J in place of the CE: ``λ_t·J(L_base) + (1−λ_t)·J(L_final)``).

    Args (beyond :class:`~lit_domino.lit.base.DrafterModule`'s):
        head: the causal head, :class:`~lit_domino.models.domino.DominoHeadConfig` (its rank r and GRU
            state size d_s, declared and checked there; ``model.head.rank`` in a config).
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
    drafter_class = DominoDrafter
    supports_objective = True

    def __init__(
        self,
        head: DominoHeadConfig = DominoHeadConfig(),
        causal_inputs: Literal["teacher_forced", "training_time_test"] = "teacher_forced",
        curriculum: LambdaSchedule = LambdaSchedule("linear"),
        **kwargs,
    ):
        refuse_moved(kwargs, DominoHeadConfig)
        head = method_config(DominoHeadConfig, head)
        if causal_inputs not in CAUSAL_INPUTS:
            raise ValueError(f"causal_inputs must be one of {CAUSAL_INPUTS}, got {causal_inputs!r}")
        if isinstance(curriculum, dict):
            curriculum = LambdaSchedule(**curriculum)
        super().__init__(**kwargs)
        self.head_config = head
        self.curriculum = curriculum
        # plain types in hparams: checkpoints stay loadable with torch.load(weights_only=True)
        self.hparams["head"] = dataclasses.asdict(head)
        self.hparams["curriculum"] = dataclasses.asdict(curriculum)
        self.check_drafter_options()

    def drafter_options(self) -> dict:
        return {"head": dataclasses.asdict(self.head_config)}

    def current_lambda(self) -> float:
        """λ_t at the current optimizer step."""
        return self.curriculum.value(self.global_step, self.total_steps())

    def forward_step(self, batch: dict, stage: str) -> StepOutput:
        causal = self.hparams.causal_inputs if stage == "train" else "teacher_forced"
        features, last = self.split_target_layer(batch["features"])
        out = self.drafter.forward_train(
            batch["input_ids"], features, batch["anchors"], batch["anchor_mask"],
            loss_mask=batch["loss_mask"], attention_mask=batch["attention_mask"], causal_inputs=causal,
            with_logits=self.with_logits,
        )
        self.attach_target(out, last, batch)
        if stage == "train":
            lam = self.current_lambda()
            loss, logs = self.drafter.block_loss(out, self.loss_settings(lam))
            return StepOutput(loss=loss, logs={**logs, "lambda": float(lam)}, labels=out.labels)
        # validation: the loss of the logits that are drafted from (the final ones)
        loss, logs = self.drafter.block_loss(out, self.loss_settings(0.0))
        preds = self.drafter.block_preds(out, self.hparams.loss_chunk_size)
        return StepOutput(loss=loss, logs=logs, preds=preds, labels=out.labels)

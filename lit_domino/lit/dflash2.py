"""DFlash 2 variant: the backbone with grouped dynamic convolutions and the candidate selector, trained on
speculators' DFlash 2 objective (KL to the target's distribution + the selector's candidate cross-entropy)."""

from __future__ import annotations

import dataclasses
import math

from lit_domino.lit.backbone import BackboneModule
from lit_domino.lit.base import method_config, refuse_moved
from lit_domino.models import DFlash2Drafter, DFlash2HeadConfig
from lit_domino.models.objectives import LossSettings


class DFlash2Module(BackboneModule):
    """DFlash 2: ``loss = KL(p ‖ q_unary) + selector_weight·CE_c(selector scores, argmax p)``, both
    position-weighted (``gamma``: speculators' 4), p the target's distribution (the DataModule's ``dspark``
    feature rule delivers it with the features).

    Its training step is the backbone's (the drafter's own ``block_loss`` holds the objective).

    Args (beyond :class:`~lit_domino.lit.base.DrafterModule`'s):
        head: the convolutions and the candidate selector, :class:`~lit_domino.models.dflash2.DFlash2HeadConfig`
            (rank r, ``top_k``, ``conv_kernel_size``, ``conv_group_size``, declared and checked there; the bounds
            that need the target's widths when the drafter is built; ``model.head.rank`` in a config).
        selector_weight: α, the selector CE's weight (speculators' ``selector_loss_alpha``, 1.0). A selected
            ``objective`` replaces the KL; the selector term stays.

    Logs ``train/loss_kl``, ``train/loss_selector``, ``train/unary_accept_rate`` (1 − TV of the unary q) and
    ``train/candidate_recall`` (how often the unary top-c holds the target's argmax).
    """

    variant = "dflash2"
    drafter_class = DFlash2Drafter

    def __init__(
        self,
        head: DFlash2HeadConfig = DFlash2HeadConfig(),
        selector_weight: float = 1.0,
        **kwargs,
    ):
        refuse_moved(kwargs, DFlash2HeadConfig)
        head = method_config(DFlash2HeadConfig, head)
        if not math.isfinite(float(selector_weight)) or float(selector_weight) < 0:
            raise ValueError(f"selector_weight must be a finite number >= 0, got {selector_weight}")
        super().__init__(**kwargs)
        self.head_config = head
        self.hparams["head"] = dataclasses.asdict(head)  # plain types: torch.load(weights_only=True) reads it
        self.check_drafter_options()

    def drafter_options(self) -> dict:
        return {"head": dataclasses.asdict(self.head_config)}

    def loss_settings(self, lam: float = 0.0) -> LossSettings:
        return dataclasses.replace(super().loss_settings(lam), selector_weight=float(self.hparams.selector_weight))

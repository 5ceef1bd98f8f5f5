"""DFlash 2 variant: the backbone with grouped dynamic convolutions and the candidate selector, trained on
speculators' DFlash 2 objective (KL to the target's distribution + the selector's candidate cross-entropy)."""

from __future__ import annotations

import dataclasses
import math

from lit_domino.lit.backbone import BackboneModule
from lit_domino.lit.base import check_positive
from lit_domino.models import DFlash2Drafter
from lit_domino.models.objectives import LossSettings


class DFlash2Module(BackboneModule):
    """DFlash 2: ``loss = KL(p ‖ q_unary) + selector_weight·CE_c(selector scores, argmax p)``, both
    position-weighted (``gamma``: speculators' 4), p the target's distribution (the DataModule's ``dspark``
    feature rule delivers it with the features).

    Its training step is the backbone's (the drafter's own ``block_loss`` holds the objective).

    Args (beyond :class:`~lit_domino.lit.base.DrafterModule`'s):
        rank: rank r of the selector's transition score (paper 256).
        top_k: candidates c the selector reranks (the unary top-c; paper 16), at most the vocabulary.
        conv_kernel_size: causal taps of each dynamic convolution (paper 2), at most the block size.
        conv_group_size: channels sharing one dynamic tap (paper 16), a divisor of the width.
        selector_weight: α, the selector CE's weight (speculators' ``selector_loss_alpha``, 1.0).

    Logs ``train/loss_kl``, ``train/loss_selector``, ``train/unary_accept_rate`` (1 − TV of the unary q) and
    ``train/candidate_recall`` (how often the unary top-c holds the target's argmax).
    """

    variant = "dflash2"
    drafter_class = DFlash2Drafter

    def __init__(
        self,
        rank: int = 256,
        top_k: int = 16,
        conv_kernel_size: int = 2,
        conv_group_size: int = 16,
        selector_weight: float = 1.0,
        **kwargs,
    ):
        check_positive(rank=rank, top_k=top_k, conv_kernel_size=conv_kernel_size, conv_group_size=conv_group_size)
        if not math.isfinite(float(selector_weight)) or float(selector_weight) < 0:
            raise ValueError(f"selector_weight must be a finite number >= 0, got {selector_weight}")
        super().__init__(**kwargs)

    def drafter_options(self) -> dict:
        h = self.hparams
        return {"head": {"rank": int(h.rank), "top_k": int(h.top_k), "conv_kernel_size": int(h.conv_kernel_size),
                         "conv_group_size": int(h.conv_group_size)}}

    def loss_settings(self, lam: float = 0.0) -> LossSettings:
        return dataclasses.replace(super().loss_settings(lam), selector_weight=float(self.hparams.selector_weight))

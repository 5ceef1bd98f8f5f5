"""DSpark variant: parallel backbone + Markov head + confidence head, trained on DeepSpec's objective."""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from lit_domino.lit.backbone import BackboneModule
from lit_domino.lit.base import check_positive
from lit_domino.models import DSparkDrafter
from lit_domino.models.dspark import HEAD_TYPES
from lit_domino.models.objectives import LossSettings


class DSparkModule(BackboneModule):
    """DSpark: ``loss = ce_weight·CE + tv_weight·TV(q, p) + confidence_weight·BCE(conf, 1 − TV)``, each term
    position-weighted (``gamma``: DeepSpec's 4), p the target's distribution (the DataModule's ``dspark``
    feature rule delivers it with the features).

    Its training step is the backbone's (the drafter's own ``block_loss`` holds the objective).

    Args (beyond :class:`~lit_domino.lit.base.DrafterModule`'s):
        rank: rank r of the Markov bias W2·W1[x_{k-1}] (paper 256).
        head_type: ``vanilla`` | ``gated`` | ``rnn`` (speculators' ``markov_head_type``).
        confidence: whether the drafter has the confidence head.
        confidence_with_markov: the confidence head reads ``[H_k ; W1[x_{k-1}]]`` (else ``H_k``).
        sample_from_anchor: DeepSpec's anchor convention (the anchor slot predicts too: B-1 query rows per
            block of ``block_size`` B, the same B-1 drafted tokens); False: speculators' default layout.
        ce_weight, tv_weight, confidence_weight: the objective's weights (DeepSpec's 0.1, 0.9, 1.0).

    Logs ``train/loss_ce``, ``train/loss_tv``, ``train/loss_conf``, ``train/accept_rate`` (= 1 − TV).
    """

    variant = "dspark"
    drafter_class = DSparkDrafter

    def __init__(
        self,
        rank: int = 256,
        head_type: Literal["vanilla", "gated", "rnn"] = "vanilla",
        confidence: bool = True,
        confidence_with_markov: bool = True,
        sample_from_anchor: bool = False,
        ce_weight: float = 0.1,
        tv_weight: float = 0.9,
        confidence_weight: float = 1.0,
        **kwargs,
    ):
        check_positive(rank=rank)
        if not isinstance(sample_from_anchor, bool):
            raise ValueError(f"sample_from_anchor must be true or false, got {sample_from_anchor!r}")
        if head_type not in HEAD_TYPES:
            raise ValueError(f"unknown DSpark head_type {head_type!r}; choose one of {', '.join(HEAD_TYPES)}")
        for name, value in (("ce_weight", ce_weight), ("tv_weight", tv_weight),
                            ("confidence_weight", confidence_weight)):
            if not math.isfinite(float(value)) or float(value) < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if confidence_weight > 0 and not confidence:
            raise ValueError(f"confidence_weight={confidence_weight} asks for a confidence loss, but confidence is "
                             "false (the drafter has no confidence head): set confidence_weight: 0")
        super().__init__(**kwargs)

    def drafter_options(self) -> dict:
        h = self.hparams
        return {"head": {"rank": int(h.rank), "head_type": str(h.head_type), "confidence": bool(h.confidence),
                         "confidence_with_markov": bool(h.confidence_with_markov)},
                "sample_from_anchor": bool(h.sample_from_anchor)}

    def build_drafter(self, feature_layers: list[int] | None = None):
        """The backbone module's, then the confidence loss checked against the drafter really built (a
        ``drafter_options`` head without the confidence head would silently train none): before any step."""
        drafter = super().build_drafter(feature_layers)
        if float(self.hparams.confidence_weight) > 0 and drafter.confidence is None:
            raise ValueError(f"confidence_weight={self.hparams.confidence_weight} asks for a confidence loss, but the "
                             "drafter has no confidence head (drafter_options head.confidence is false): set "
                             "confidence_weight: 0 or keep the head")
        return drafter

    def loss_settings(self, lam: float = 0.0) -> LossSettings:
        h = self.hparams
        return dataclasses.replace(super().loss_settings(lam), distill=(float(h.ce_weight), float(h.tv_weight),
                                                                        float(h.confidence_weight)))

"""DSpark variant: parallel backbone + Markov head + confidence head, trained on DeepSpec's objective."""

from __future__ import annotations

import dataclasses
import math

from lit_domino.lit.backbone import BackboneModule
from lit_domino.lit.base import method_config, refuse_moved
from lit_domino.models import DSparkDrafter, DSparkHeadConfig
from lit_domino.models.objectives import LossSettings


class DSparkModule(BackboneModule):
    """DSpark: ``loss = ce_weight·CE + tv_weight·TV(q, p) + confidence_weight·BCE(conf, 1 − TV)``, each term
    position-weighted (``gamma``: DeepSpec's 4), p the target's distribution (the DataModule's ``dspark``
    feature rule delivers it with the features).

    Its training step is the backbone's (the drafter's own ``block_loss`` holds the objective).

    Args (beyond :class:`~lit_domino.lit.base.DrafterModule`'s):
        head: the Markov and confidence heads, :class:`~lit_domino.models.dspark.DSparkHeadConfig` (rank r,
            ``head_type``, ``confidence``, ``confidence_with_markov``, declared and checked there;
            ``model.head.rank`` in a config).
        sample_from_anchor: DeepSpec's anchor convention (the anchor slot predicts too: B-1 query rows per
            block of ``block_size`` B, the same B-1 drafted tokens); False: speculators' default layout.
        ce_weight, tv_weight, confidence_weight: the objective's weights (DeepSpec's 0.1, 0.9, 1.0). A selected
            ``objective`` replaces ``ce_weight·CE + tv_weight·TV``; the confidence term stays.

    Logs ``train/loss_ce``, ``train/loss_tv``, ``train/loss_conf``, ``train/accept_rate`` (= 1 − TV).
    """

    variant = "dspark"
    drafter_class = DSparkDrafter

    def __init__(
        self,
        head: DSparkHeadConfig = DSparkHeadConfig(),
        sample_from_anchor: bool = False,
        ce_weight: float = 0.1,
        tv_weight: float = 0.9,
        confidence_weight: float = 1.0,
        **kwargs,
    ):
        refuse_moved(kwargs, DSparkHeadConfig)
        head = method_config(DSparkHeadConfig, head)
        if not isinstance(sample_from_anchor, bool):
            raise ValueError(f"sample_from_anchor must be true or false, got {sample_from_anchor!r}")
        for name, value in (("ce_weight", ce_weight), ("tv_weight", tv_weight),
                            ("confidence_weight", confidence_weight)):
            if not math.isfinite(float(value)) or float(value) < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if confidence_weight > 0 and not head.confidence:
            raise ValueError(f"confidence_weight={confidence_weight} asks for a confidence loss, but head.confidence "
                             "is false (the drafter has no confidence head): set confidence_weight: 0")
        super().__init__(**kwargs)
        if self.objective is not None and (ce_weight, tv_weight) != (0.1, 0.9):
            raise ValueError(f"ce_weight/tv_weight weigh DeepSpec's CE + TV, which objective {self.objective.name!r} "
                             "replaces (the confidence_weight stays): drop them")
        self.head_config = head
        self.hparams["head"] = dataclasses.asdict(head)  # plain types: torch.load(weights_only=True) reads it
        self.check_drafter_options()

    def drafter_options(self) -> dict:
        return {"head": dataclasses.asdict(self.head_config),
                "sample_from_anchor": bool(self.hparams.sample_from_anchor)}

    def loss_settings(self, lam: float = 0.0) -> LossSettings:
        h = self.hparams
        return dataclasses.replace(super().loss_settings(lam), distill=(float(h.ce_weight), float(h.tv_weight),
                                                                        float(h.confidence_weight)))

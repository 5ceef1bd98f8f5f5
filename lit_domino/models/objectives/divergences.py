"""The objectives against the target's distribution p: KL, TV and the LK losses.

Notation per labelled position k: q_k the drafter's distribution, p_k the target's (both at the objective's
``temperature``), ``α_k = Σ_v min(p_k, q_k) = 1 − TV(p_k, q_k)`` the acceptance rate, ``w_k`` the method's
position weights, ``v_k`` 1 where k has a label; ``⟨x⟩ = Σ w_k v_k x_k / Σ w_k v_k`` (over the batch's blocks).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lit_domino.models.objectives import terms
from lit_domino.models.objectives.registry import (Objective, check_choice, check_number, register_objective,
    weighted_mean)

LK_VARIANTS = ("speculators", "specforge")
"""The two public LK implementations (:class:`LKAlpha`, :class:`LKLambda`)."""
NLA_EPS = 1e-5
"""speculators' floor of α inside ``−log α`` (``eager._NLA_EPS``)."""


@dataclass(frozen=True)
class AgainstTarget(Objective):
    """An objective of q and the target's p (needs the target's distribution)."""

    temperature: float = 1.0
    """T > 0: q and p are ``softmax(logits / T)`` (the acceptance rate of sampling both at T). Default 1."""

    def __post_init__(self):
        check_number("temperature", self.temperature, 0.0, low_open=True)

    @property
    def needs_target(self) -> bool:
        return True

    def log_qp(self, logits, target_logits):
        """(log q, log p) [n, V] float32 at the objective's temperature."""
        return terms.log_probs(logits, self.temperature), terms.log_probs(target_logits, self.temperature)

    def accept_log(self, stats, valid, weights) -> dict[str, torch.Tensor]:
        return {"accept_rate": weighted_mean(stats["alpha"].detach(), valid, weights)} if "alpha" in stats else {}


@dataclass(frozen=True)
class OnAcceptance(AgainstTarget):
    """An objective of the acceptance rates α alone (its one per-row statistic)."""

    @property
    def stat_names(self) -> tuple[str, ...]:
        return ("alpha",)

    def row_stats(self, logits, labels, target_logits):
        logq, logp = self.log_qp(logits, target_logits)
        return {"alpha": terms.overlap(logp, logq)}


@register_objective
@dataclass(frozen=True)
class KL(AgainstTarget):
    """Forward KL to the target: ``⟨KL(p_k ‖ q_k)⟩`` (DFlash 2's distillation term, here on any drafter)."""

    name = "kl"
    paper = "knowledge distillation against the target's distribution (DFlash 2's term; speculators' kl_div)"
    public = "speculators.losses.eager.kl_div_loss"

    @property
    def stat_names(self) -> tuple[str, ...]:
        return ("kl",)

    def row_stats(self, logits, labels, target_logits):
        logq, logp = self.log_qp(logits, target_logits)
        return {"kl": terms.kl(logp, logq)}

    def reduce(self, stats, valid, weights):
        return weighted_mean(stats["kl"], valid, weights), {}


@register_objective
@dataclass(frozen=True)
class TV(OnAcceptance):
    """Total variation to the target: ``⟨1 − α_k⟩ = ⟨TV(p_k, q_k)⟩`` (DSpark's distillation term, here alone):
    the rejection rate itself, whose gradient vanishes where q and p do not overlap."""

    name = "tv"
    paper = "DSpark / DeepSpec's TV term; LK (arXiv 2602.23881) on TV as the acceptance-optimal target"
    public = "speculators.losses.eager.tv_loss"

    def reduce(self, stats, valid, weights):
        return weighted_mean(1.0 - stats["alpha"], valid, weights), self.accept_log(stats, valid, weights)


@register_objective
@dataclass(frozen=True)
class LKAlpha(OnAcceptance):
    """LK^α: the negative log acceptance rate, ``⟨−log α_k⟩`` (its gradient is TV's over α: usable from a cold
    start; a point-mass p makes it the CE). The variants differ only where α is (numerically) 0:
    ``speculators`` floors α at 1e-5 (``−log max(α, 1e-5)``), ``specforge`` counts such a position as 0
    (``log α`` where α > 0, else 0)."""

    variant: str = "speculators"
    """``speculators`` (``neg_log_acceptance_loss``) or ``specforge`` (``compute_lk_loss(lk_loss_type="alpha")``
    on ``compute_acceptance_rate``'s masked mean of log α). Default speculators."""

    name = "lk_alpha"
    paper = "LK losses, LK^α (arXiv 2602.23881)"
    public = ("speculators.losses.eager.neg_log_acceptance_loss; specforge.core.lk_loss.compute_acceptance_rate "
              "+ compute_lk_loss(lk_loss_type='alpha')")

    def __post_init__(self):
        super().__post_init__()
        check_choice("variant", self.variant, LK_VARIANTS)

    def reduce(self, stats, valid, weights):
        alpha = stats["alpha"]
        if self.variant == "speculators":
            neg_log = -torch.log(alpha.clamp_min(NLA_EPS))
        else:  # log α where α > 0 (the safe alpha keeps the unused branch's gradient finite)
            neg_log = -torch.where(alpha > 0, torch.log(torch.where(alpha > 0, alpha, torch.ones_like(alpha))),
                                   torch.zeros_like(alpha))
        return weighted_mean(neg_log, valid, weights), self.accept_log(stats, valid, weights)


@register_objective
@dataclass(frozen=True)
class LKLambda(AgainstTarget):
    """LK^λ, the KL/TV hybrid: ``λ·KL(p ‖ q) + (1 − λ)·(1 − α)`` with ``λ = s·exp(−η·sg(α))``: KL's strong
    gradient while the overlap is low, the acceptance rate itself once it is high.

    * ``speculators`` (``lk_hybrid_loss``): one λ per position, ``⟨λ_k KL_k + (1 − λ_k)(1 − α_k)⟩``, η = 3, s = 1;
    * ``specforge`` (``compute_lk_loss(lk_loss_type="lambda")``): α averaged over the batch's labelled positions
      first, ``ᾱ = ⟨α⟩``, one ``λ = s·exp(−η·sg(ᾱ))`` per batch, loss ``λ·⟨KL⟩ + (1 − λ)(1 − ᾱ)``; η = 1
      (its ``kl_decay``), s its ``kl_scale``. SpecForge's KL term is the soft-label CE ``−Σ p log q`` (KL plus
      p's entropy, a constant: the same gradient); here it is the KL."""

    variant: str = "speculators"
    """``speculators`` (λ per position) or ``specforge`` (λ from the batch's mean α). Default speculators."""
    eta: float | None = None
    """η ≥ 0, the decay of λ in α; None = the variant's default (3 for speculators, 1 for specforge)."""
    kl_scale: float = 1.0
    """s in (0, 1], λ's value at α = 0 (SpecForge's ``kl_scale``; speculators has none: 1 there). Default 1."""

    name = "lk_lambda"
    paper = "LK losses, LK^λ hybrid (arXiv 2602.23881)"
    public = ("speculators.losses.eager.lk_hybrid_loss; specforge.core.lk_loss.compute_acceptance_rate + "
              "compute_lk_loss(lk_loss_type='lambda')")

    def __post_init__(self):
        super().__post_init__()
        check_choice("variant", self.variant, LK_VARIANTS)
        if self.eta is not None:
            check_number("eta", self.eta, 0.0)
        check_number("kl_scale", self.kl_scale, 0.0, 1.0, low_open=True)
        if self.variant == "speculators" and self.kl_scale != 1.0:
            raise ValueError(f"objective.kl_scale: speculators' lk_hybrid_loss has no KL scale (it is 1), got "
                             f"{self.kl_scale}; use variant: specforge")

    @property
    def decay(self) -> float:
        """η in effect (the setting, else the variant's default)."""
        return float(self.eta) if self.eta is not None else (3.0 if self.variant == "speculators" else 1.0)

    @property
    def stat_names(self) -> tuple[str, ...]:
        return ("kl", "alpha")

    def row_stats(self, logits, labels, target_logits):
        logq, logp = self.log_qp(logits, target_logits)
        return {"kl": terms.kl(logp, logq), "alpha": terms.overlap(logp, logq)}

    def reduce(self, stats, valid, weights):
        kl, alpha = stats["kl"], stats["alpha"]
        logs = self.accept_log(stats, valid, weights)
        if self.variant == "speculators":
            lam = torch.exp(-self.decay * alpha.detach())
            return weighted_mean(lam * kl + (1.0 - lam) * (1.0 - alpha), valid, weights), logs
        if not valid.any():  # no label: 0, still in the graph (not 1 − λ)
            return (kl.sum() + alpha.sum()) * 0.0, logs
        mean_alpha = weighted_mean(alpha, valid, weights)
        lam = float(self.kl_scale) * torch.exp(-self.decay * mean_alpha.detach())
        loss = lam * weighted_mean(kl, valid, weights) + (1.0 - lam) * (1.0 - mean_alpha)
        return loss, {**logs, "lk_lambda": lam.detach()}


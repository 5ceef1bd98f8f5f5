"""The objectives built on a block's chance of reaching each position: the acceptance-weighted Rényi-½ loss
(D-PARD) and the expected acceptance length itself.

Notation: ``α_k = Σ_v min(p_k, q_k)`` the acceptance rate of block position k (the target's p and the drafter's
q at the objective's ``temperature``), ``v_k`` 1 where k has a label; a position without one is a no-op in
every product (``α = 1`` there). The chance that a block's first k drafts are all accepted is ``Π_{i≤k} α_i``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lit_domino.models.objectives import terms
from lit_domino.models.objectives.divergences import AgainstTarget, OnAcceptance
from lit_domino.models.objectives.registry import (check_choice, check_number, neutral, register_objective,
    reverse_cumsum)


@register_objective
@dataclass(frozen=True)
class Renyi(AgainstTarget):
    """The acceptance-weighted Rényi-½ loss (D-PARD, proposed for DSpark): the Rényi divergence of order ½,
    ``D_½(p ‖ q) = −2·log Σ_v sqrt(p_v q_v)``, under D-PACE-shaped weights whose confidence is the acceptance
    rate: ``s_k = ρ + (1 − ρ)·sg(α_k)`` (1 without a label), ``P_k = Π_{i≤k} s_i``, ``W_k = Σ_{j≥k} v_j P_j``;
    loss ``Σ_k v_k W_k D_½(p_k ‖ q_k) / Σ_k v_k`` (the label count, as D-PACE). The method's position weights
    are not used (W replaces them). The fork's confidence-BCE reweighting (DSpark's head) is not part of it."""

    rho: float = 0.5
    """ρ in (0, 1), the smoothing of the acceptance rate in the weights (the fork's ``dpard_alpha``). Default
    0.5."""

    name = "renyi"
    paper = "D-PARD's acceptance-weighted Rényi-½ loss (proposed for DSpark; code only in a fork of speculators)"
    public = ("no installed public code (the unmerged Lucas-TY/speculators fork's dpard_loss_decay and "
              "renyi_half_loss); tested against a direct per-block loop over that formula")

    def __post_init__(self):
        super().__post_init__()
        check_number("rho", self.rho, 0.0, 1.0, low_open=True, high_open=True)

    @property
    def stat_names(self) -> tuple[str, ...]:
        return ("renyi", "alpha")

    def row_stats(self, logits, labels, target_logits):
        logq, logp = self.log_qp(logits, target_logits)
        return {"renyi": -2.0 * torch.logsumexp(0.5 * (logp + logq), dim=-1), "alpha": terms.overlap(logp, logq)}

    def weights(self, alpha: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """The detached weights ``W`` [..., B] of the acceptance rates [..., B]."""
        with torch.no_grad():
            rho = float(self.rho)
            prefix = torch.cumprod(neutral(rho + (1.0 - rho) * alpha, valid), dim=-1)
            return reverse_cumsum(prefix * valid)

    def reduce(self, stats, valid, weights):
        renyi = stats["renyi"]
        count = valid.sum()
        logs = self.accept_log(stats, valid, weights)
        if count == 0:
            return (renyi.sum() + stats["alpha"].sum()) * 0.0, logs
        return (renyi * self.weights(stats["alpha"], valid) * valid).sum() / count, logs


TAU_FORMS = ("neg", "log")


@register_objective
@dataclass(frozen=True)
class ExpectedTau(OnAcceptance):
    """A differentiable surrogate of the acceptance length: per block ``E[τ] = 1 + Σ_j v_j Π_{i≤j} α_i`` (the
    expected committed tokens of one round, bonus included, when each position is accepted with probability α
    given the earlier ones), differentiated through every α; loss ``−mean E[τ]`` (``form: neg``) or ``−mean
    log E[τ]`` (``form: log``) over the blocks that hold a label. No position weights: the products weigh the
    positions as decoding does."""

    form: str = "neg"
    """``neg`` (−E[τ]) or ``log`` (−log E[τ], every block's relative gain counting alike). Default neg."""

    name = "expected_tau"
    paper = "expected acceptance length surrogates: the chain loss (arXiv 2606.11552), EDR (arXiv 2610.10411)"
    public = "no public code (speculators computes E[τ] as a metric only): tested against a direct per-block loop"

    def __post_init__(self):
        super().__post_init__()
        check_choice("form", self.form, TAU_FORMS)

    def reduce(self, stats, valid, weights):
        alpha = stats["alpha"]
        reach = torch.cumprod(neutral(alpha, valid), dim=-1)  # Π_{i≤j} α_i
        tau = 1.0 + (reach * valid).sum(-1)  # [...] per block
        blocks = valid.any(-1)
        logs = self.accept_log(stats, valid, weights)
        if not blocks.any():
            return alpha.sum() * 0.0, logs
        per_block = tau if self.form == "neg" else torch.log(tau)
        logs["expected_tau"] = tau.detach()[blocks].mean()
        return -per_block[blocks].mean(), logs

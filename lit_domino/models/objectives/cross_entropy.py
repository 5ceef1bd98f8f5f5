"""The cross-entropy objectives: today's position-weighted CE, D-PACE's position weights, accept-until-fail.

Notation (a block's positions k = 1..B-1, ``v_k`` = 1 where k has a label, ``w_k`` the method's position weights,
``CE_k = −log q_k(y_k)``):

* ``ce``: ``Σ_k w_k v_k CE_k / Σ_k w_k v_k`` (summed over the batch's blocks before dividing).
* ``dpace``: ``Σ_k v_k W_k CE_k / Σ_k v_k`` with D-PACE's detached weights ``W``.
* ``accept_until_fail``: ``Σ_k w_k v_k m_k CE_k / Σ_k w_k v_k``, ``m_k = Π_{i<k} [argmax q_i = y_i]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lit_domino.models.objectives import terms
from lit_domino.models.objectives.registry import (Objective, check_choice, check_flag, check_number,
    exclusive_cumprod, neutral, register_objective, reverse_cumsum, weighted_mean)


@register_objective
@dataclass(frozen=True)
class PositionCE(Objective):
    """The position-weighted block cross-entropy, ``Σ_k w_k v_k CE_k / Σ_k w_k v_k`` with ``w_k =
    exp(−(k−1)/γ)``: every method's loss before objectives were selectable, and the backbone's, Domino's (with
    its curriculum) and EAGLE-3's (its TTT form, ``Σ_s 0.8^s·mean CE_s``) when a config names none. Selecting
    it on those methods runs their own loss, bit for bit; on DSpark and DFlash 2 it replaces their
    distillation term (their confidence / selector terms stay). No settings."""

    name = "ce"
    paper = "DFlash (z-lab's public training code): CE with exp(−(k−1)/γ) position weights"
    public = ("the suite's own block CE (objectives.losses.weighted_block_ce); SpecForge's OnlineDFlashModel "
              "loss_type='dflash' normalises the same sum the same way")

    @property
    def stat_names(self) -> tuple[str, ...]:
        return ("ce",)

    def row_stats(self, logits, labels, target_logits):
        return {"ce": terms.nll(terms.log_probs(logits), labels)}

    def reduce(self, stats, valid, weights):
        return weighted_mean(stats["ce"], valid, weights), {}


DPACE_LABELS = ("dataset", "target")
DPACE_WEIGHTS = ("dpace", "cumulative", "continuation")


@register_objective
@dataclass(frozen=True)
class DPace(Objective):
    """D-PACE: cross-entropy under per-position weights from the drafter's own confidence in the label.

    With the confidence ``c_k = q_k(y_k)`` (detached) and its smoothing ``s_k = (1 − a)·c_k + a`` (1 at positions
    without a label), the prefix ``P_k = Π_{i≤k} s_i`` approximates the chance that the block's first k drafts
    are accepted, and the weight of position k is what its log-probability contributes to the expected
    accepted length: ``W_k = Σ_{j≥k} v_j P_j`` (``weight: dpace``). The loss is ``Σ_k v_k W_k CE_k / Σ_k v_k``
    (speculators' normalisation by the label count; SpecForge divides the same sum by its batch size).
    The method's exponential position weights are not used (D-PACE replaces them)."""

    label: str = "dataset"
    """Whose token the CE and the confidence are taken on: ``dataset`` (the training sequence's token, as
    SpecForge's ``OnlineDFlashModel``) or ``target`` (the target's greedy token ``argmax p``, as speculators'
    ``dpace_loss_decay`` over its ``ce_loss``; needs the target's distribution). Default dataset."""
    dpace_alpha: float = 0.5
    """The smoothing a of the confidence, in [0, 1] (0: the raw prefix product of confidences; 1: every position
    weighs as if all were accepted). Default 0.5, both implementations'."""
    weight: str = "dpace"
    """``dpace`` (``W_k = Σ_{j≥k} v_j P_j``, the paper's), ``cumulative`` (``P_k`` only) or ``continuation``
    (``W_k / P_k``): SpecForge's ``loss_type`` dpace, dpace-cumulative-confidence-only and
    dpace-continuation-value-only (its ablations). Default dpace."""

    name = "dpace"
    paper = "D-PACE, Dynamic Position-Aware Cross-Entropy (arXiv 2605.18810)"
    public = ("speculators.losses.utils.dpace_loss_decay under speculators.losses.utils.loss_function with "
              "eager.ce_loss (label target); specforge.algorithms.common.dflash_family_model."
              "OnlineDFlashModel._dpace_weight / _dflash_objective_chunk_terms (label dataset, every weight)")

    def __post_init__(self):
        check_choice("label", self.label, DPACE_LABELS)
        check_number("dpace_alpha", self.dpace_alpha, 0.0, 1.0)
        check_choice("weight", self.weight, DPACE_WEIGHTS)

    @property
    def needs_target(self) -> bool:
        return self.label == "target"

    @property
    def stat_names(self) -> tuple[str, ...]:
        return ("ce",)

    def row_stats(self, logits, labels, target_logits):
        y = terms.target_argmax(target_logits) if self.label == "target" else labels
        return {"ce": terms.nll(terms.log_probs(logits), y)}

    def weights(self, ce: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """The detached D-PACE weights ``W`` [..., B] of the per-position CE [..., B]."""
        with torch.no_grad():
            a = float(self.dpace_alpha)
            smooth = neutral((1.0 - a) * torch.exp(-ce) + a, valid)
            prefix = torch.cumprod(smooth, dim=-1)
            if self.weight == "cumulative":
                return prefix
            suffix = reverse_cumsum(prefix * valid)
            if self.weight == "dpace":
                return suffix
            return suffix / prefix.clamp_min(torch.finfo(prefix.dtype).tiny)

    def reduce(self, stats, valid, weights):
        ce = stats["ce"]
        W = self.weights(ce, valid)
        count = valid.sum()
        if count == 0:
            return ce.sum() * 0.0, {}
        return (ce * W * valid).sum() / count, {"dpace_weight_1": (W[..., 1] * valid[..., 1]).sum().detach()
                                                / valid[..., 1].sum().clamp_min(1)}


@register_objective
@dataclass(frozen=True)
class AcceptUntilFail(Objective):
    """Accept-until-fail (Spec-AUF): the cross-entropy of each block only up to the drafter's first wrong greedy
    pick, that position included: ``m_k = Π_{i<k} [argmax q_i = y_i]`` (detached; a position without a label
    passes), loss ``Σ_k w_k v_k m_k CE_k / Σ_k w_k v_k``: the positions a greedy decode would never reach weigh
    0, the normaliser is the plain CE's (so the reached positions get exactly CE's gradient)."""

    position_decay: bool = True
    """Keep the method's position weights ``w_k`` (True) or weigh the reached positions equally (False: the
    paper reports the exponential decay stops mattering under the truncation). Default True."""

    name = "accept_until_fail"
    paper = "Spec-AUF, accept-until-fail training (arXiv 2607.01893)"
    public = "no public code: tested against a direct per-block loop over the paper's formula"

    def __post_init__(self):
        check_flag("position_decay", self.position_decay)

    @property
    def stat_names(self) -> tuple[str, ...]:
        return ("ce", "hit")

    def row_stats(self, logits, labels, target_logits):
        return {"ce": terms.nll(terms.log_probs(logits), labels), "hit": terms.greedy_hits(logits, labels)}

    def reduce(self, stats, valid, weights):
        reached = exclusive_cumprod(neutral(stats["hit"], valid))
        w = weights if self.position_decay else torch.ones_like(weights)
        return weighted_mean(stats["ce"] * reached, valid, w), {"reached": (reached * valid).sum().detach()
                                                                / valid.sum().clamp_min(1)}

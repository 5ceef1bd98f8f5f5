"""The methods' own block losses (what a config that names no objective trains on).

* Block cross-entropy: the weighted sum of per-token CE over valid labels, divided by the weight sum of
  those same valid labels (so masked positions neither count nor dilute the loss).
* Domino's base-anchored curriculum *(paper)*: ``loss = λ_t·CE(L_base) + (1 − λ_t)·CE(L_final)``, λ_t from
  a :class:`~lit_domino.models.objectives.schedules.LambdaSchedule` counted in optimizer steps.
* EAGLE-3 training-time test *(public code)*: ``Σ_s 0.8^s · L_s``.
* DSpark's DeepSpec terms (:func:`distill_terms`).

The lean form of these losses (:func:`lean_block_ce`, :func:`lean_curriculum_loss`) never builds
full-vocabulary logits for every position (:mod:`~lit_domino.models.objectives.chunks`). Same maths as the
full-logits losses. :class:`LossSettings` carries what a method's ``block_loss`` needs, the selected
objective included (:mod:`~lit_domino.models.objectives.registry`; None = the method's own loss, above).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import torch
import torch.nn.functional as F

from lit_domino.models.objectives.chunks import (DEFAULT_CHUNK_SIZE, LogitsFn, check_chunk_size, chunked_ce,
    label_rows)
from lit_domino.models.objectives.weights import IGNORE_INDEX

if TYPE_CHECKING:
    from lit_domino.models.objectives.registry import Objective

@dataclass
class LossSettings:
    """What a method's ``block_loss`` needs beyond its outputs (the LightningModule's hyper-parameters)."""

    position_weights: torch.Tensor
    """[B] weights of the block positions (:func:`position_weights`)."""
    lam: float = 0.0
    """Domino: λ of ``λ·CE(L_base) + (1−λ)·CE(L_final)`` at this step (0 = the final logits only)."""
    step_decay: float = 0.8
    """EAGLE-3: chain step k of a stage weighs ``step_decay**(k-1)`` (its training-time-test decay)."""
    chunk_size: int | None = DEFAULT_CHUNK_SIZE
    """Labelled rows (block positions / tokens) the LM head runs on at once in the lean loss, each chunk's
    logits recomputed in the backward pass (:func:`chunked_ce`). ``None`` = one chunk: a method's forward
    then materialises the full ``[..., V]`` logits of every position as before (the reference path, what
    the memory benchmark calls "old"). Default 1024 (~0.6 GB of fp32 logits per chunk at V = 151,936)."""
    distill: tuple[float, float, float] = (0.1, 0.9, 1.0)
    """DSpark: the weights (c_ce, c_tv, c_conf) of ``c_ce·CE + c_tv·TV(q, p) + c_conf·BCE(conf, 1 − TV)``
    (:func:`distill_terms`); default DeepSpec's (0.1, 0.9, 1.0)."""
    selector_weight: float = 1.0
    """DFlash 2: the weight α of the selector's candidate cross-entropy in ``KL + α·CE_c``; default 1.0
    (speculators' ``selector_loss_alpha``)."""
    objective: Objective | None = None
    """The training objective a config selected (:mod:`~lit_domino.models.objectives.registry`); None = the
    method's own loss (the position-weighted CE; Domino's curriculum; DSpark's DeepSpec terms; DFlash 2's KL +
    selector CE; EAGLE-3's TTT CE), computed exactly as before objectives were selectable."""

    def __post_init__(self):
        check_chunk_size(self.chunk_size)
        if len(self.distill) != 3 or any(not math.isfinite(float(c)) or float(c) < 0 for c in self.distill):
            raise ValueError(f"distill weights must be three finite numbers >= 0 (CE, TV, confidence), got "
                             f"{self.distill!r}")
        if not math.isfinite(float(self.selector_weight)) or float(self.selector_weight) < 0:
            raise ValueError(f"selector_weight must be a finite number >= 0, got {self.selector_weight!r}")


def token_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token cross-entropy (float32), 0 where ``labels == -100``; shape of ``labels``."""
    flat = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(),
        labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    )
    return flat.view(labels.shape)


def weighted_block_ce(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Position-weighted block cross-entropy.

    Args:
        logits: ``[..., B, V]`` (typically ``[b, A, B, V]``).
        labels: ``[..., B]``, ``-100`` where not a label.
        weights: ``[B]`` position weights (:func:`position_weights`).

    Returns:
        ``Σ w_k·CE / Σ w_k`` over the valid labels (a scalar); 0 (still attached to
        the graph) when there is no valid label.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} disagree")
    if weights.shape != labels.shape[-1:]:
        raise ValueError(f"weights {tuple(weights.shape)} do not match the block size {labels.shape[-1]}")
    ce = token_ce(logits, labels)
    valid = labels != IGNORE_INDEX
    w = weights.to(device=ce.device, dtype=ce.dtype).expand_as(ce) * valid
    denom = w.sum()
    if denom <= 0:
        return ce.sum() * 0.0
    return (ce * w).sum() / denom


def distill_terms(logits: torch.Tensor, target_logits: torch.Tensor, labels: torch.Tensor,
                  confidence: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DSpark's per-row terms, each float32 ``[n]``: ``CE(logits, labels)``, ``TV(q, p) = ½‖q − p‖₁`` with
    q = softmax(logits), p = softmax(target_logits), and ``BCE(confidence, c*)`` with ``c* = 1 − TV`` (no
    gradient through c*: the confidence head learns the acceptance rate, it does not move q); zeros without
    ``confidence`` logits ``[n]``."""
    logq = torch.log_softmax(logits.float(), -1)
    ce = -logq.gather(-1, labels[:, None])[:, 0]
    tv = 0.5 * (logq.exp() - torch.softmax(target_logits.float(), -1)).abs().sum(-1)
    if confidence is None:
        return ce, tv, torch.zeros_like(tv)
    c_star = (1.0 - tv).detach().clamp(0.0, 1.0)
    return ce, tv, F.binary_cross_entropy_with_logits(confidence.float(), c_star, reduction="none")


def confidence_bce(logits: torch.Tensor, target_logits: torch.Tensor, confidence: torch.Tensor) -> torch.Tensor:
    """DSpark's confidence term alone, per row: ``BCE(confidence, c*)``, ``c* = 1 − TV(q, p)`` detached (as
    :func:`distill_terms`; what a selected objective keeps of DeepSpec's loss)."""
    with torch.no_grad():
        tv = 0.5 * (torch.softmax(logits.float(), -1) - torch.softmax(target_logits.float(), -1)).abs().sum(-1)
    return F.binary_cross_entropy_with_logits(confidence.float(), (1.0 - tv).clamp(0.0, 1.0), reduction="none")


def lean_block_ce(head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, labels: torch.Tensor,
                  weights: torch.Tensor, chunk_size: int | None) -> torch.Tensor:
    """:func:`weighted_block_ce` of ``logits = head(hidden)`` without the full logits: hidden
    ``[..., B, d]``, labels ``[..., B]``, weights ``[B]``; the head runs on the labelled rows only."""
    keep, y, w = label_rows(labels, weights)
    (total,), _ = chunked_ce(lambda h: (head(h),), [hidden[keep]], y, w, chunk_size)
    denom = w.sum()
    return total * 0.0 if denom <= 0 else total / denom


def lean_curriculum_loss(
    logits_fn: LogitsFn,
    inputs: Sequence[torch.Tensor],
    labels: torch.Tensor,
    weights: torch.Tensor,
    lam: float,
    chunk_size: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`curriculum_loss` without full logits: ``logits_fn(*row_chunks) -> (base, final)`` on the
    labelled rows of ``inputs`` (each ``[..., B, *]``), both CE terms from one pass over the chunks.
    Same maths as :func:`curriculum_loss`, λ = 1 included (the final term is in the graph with weight 0)."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"λ must be in [0, 1], got {lam}")
    keep, y, w = label_rows(labels, weights)
    rows = [x[keep] for x in inputs]
    if lam == 0.0:  # the base term is for logging only (as in curriculum_loss): no gradient through it
        def fn(*xs):
            base, final = logits_fn(*xs)
            return base.detach(), final
    else:
        fn = logits_fn
    (sum_base, sum_final), _ = chunked_ce(fn, rows, y, w, chunk_size)
    denom = w.sum()
    if denom <= 0:
        loss_base, loss_final = sum_base * 0.0, sum_final * 0.0
    else:
        loss_base, loss_final = sum_base / denom, sum_final / denom
    if lam == 0.0:
        return loss_final, loss_base.detach(), loss_final
    return lam * loss_base + (1.0 - lam) * loss_final, loss_base, loss_final


def curriculum_loss(
    base_logits: torch.Tensor,
    final_logits: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Domino's loss ``λ·CE(L_base) + (1−λ)·CE(L_final)``, both position-weighted.

    Returns ``(loss, loss_base, loss_final)``. With ``λ = 0`` the base term is
    computed for logging only (no gradient: the backbone still gets one through the
    final logits). With ``λ = 1`` the final term keeps its graph with weight 0, so the
    head's parameters get a (zero) gradient: DDP needs every parameter in every step.
    """
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"λ must be in [0, 1], got {lam}")
    if lam == 0.0:
        with torch.no_grad():
            loss_base = weighted_block_ce(base_logits, labels, weights)
        loss_final = weighted_block_ce(final_logits, labels, weights)
        return loss_final, loss_base, loss_final
    loss_base = weighted_block_ce(base_logits, labels, weights)
    loss_final = weighted_block_ce(final_logits, labels, weights)
    return lam * loss_base + (1.0 - lam) * loss_final, loss_base, loss_final


def ttt_loss(
    step_logits: Sequence[torch.Tensor],
    step_labels: Sequence[torch.Tensor],
    decay: float = 0.8,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """EAGLE-3 training-time test loss ``Σ_s decay^s · L_s`` (s = 0..S-1).

    Each ``L_s`` is the mean token CE of step ``s`` over its valid labels.
    Returns ``(loss, [L_0, ..., L_{S-1}])``.
    """
    if len(step_logits) != len(step_labels) or not step_logits:
        raise ValueError("ttt_loss needs one label tensor per step and at least one step")
    losses = []
    for logits, labels in zip(step_logits, step_labels):
        ce = token_ce(logits, labels)
        n = (labels != IGNORE_INDEX).sum()
        losses.append(ce.sum() / n.clamp_min(1))
    total = sum(decay**s * l for s, l in enumerate(losses))
    return total, losses

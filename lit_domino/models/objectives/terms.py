"""Per-row terms of the objectives, each of rows of logits [n, V] -> [n] float32.

q is the drafter's distribution ``softmax(logits / T)``, p the target's ``softmax(target_logits / T)`` (T the
objective's ``temperature``, 1 by default: the acceptance rate of sampling both at T). The acceptance rate of a
position under speculative sampling is the overlap ``α = Σ_v min(p_v, q_v) = 1 − TV(p, q)`` (Leviathan et al.).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def log_probs(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log_softmax(logits / T)`` in float32 (no division at T = 1: the CE of today's losses, bit for bit)."""
    logits = logits.float()
    return torch.log_softmax(logits if temperature == 1.0 else logits / temperature, dim=-1)


def nll(logq: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``−log q(y)`` per row: the cross-entropy of label ``y``."""
    return -logq.gather(-1, labels[:, None])[:, 0]


def kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """``KL(p ‖ q) = Σ_v p_v (log p_v − log q_v)`` per row (0·log 0 = 0)."""
    return F.kl_div(logq, logp, reduction="none", log_target=True).sum(-1)


def overlap(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """``α = Σ_v min(p_v, q_v)`` per row: the acceptance rate of speculative sampling."""
    return torch.minimum(logp.exp(), logq.exp()).sum(-1)


def bhattacharyya(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """``BC = Σ_v sqrt(p_v q_v)`` per row (the Rényi-½ divergence is ``−2 log BC``)."""
    return torch.exp(0.5 * (logp + logq)).sum(-1)


@torch.no_grad()
def greedy_hits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """1.0 where the drafter's greedy pick (argmax) is the label, else 0.0 (no gradient)."""
    return (logits.argmax(-1) == labels).float()


@torch.no_grad()
def target_argmax(target_logits: torch.Tensor) -> torch.Tensor:
    """The target's greedy token per row (speculators' label convention: ``argmax p``)."""
    return target_logits.argmax(-1)

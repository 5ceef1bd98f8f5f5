"""Training-side metrics (torchmetrics), computed offline on validation blocks.

These are *estimates* from teacher-forced blocks of the validation data, not
measurements of real speculative decoding (that is the eval callback's
``tau`` / ``acc_rate_pos_{k:02d}``). Names say so:

* :class:`PositionAccuracy` — per block position ``k = 1..B-1``, top-1 accuracy
  of the drafter's prediction against the label (unconditional). Logged as
  ``val/acc_pos_{k:02d}``.
* :func:`tau_sim` — ``1 + Σ_k Π_{i≤k} acc_i``: the acceptance length that the
  per-position accuracies would give if position errors were independent.
  Logged as ``val/tau_sim``.
* :class:`PrefixAcceptance` — per block, ``1 + `` the number of leading correct
  positions (what greedy verification would accept on this block, given the
  data are the target's own greedy outputs), averaged over blocks; logged as
  ``val/tau_prefix``. Its conditional per-position rates
  P(k correct | 1..k-1 correct) are available from :meth:`PrefixAcceptance.rates`.

All states are sums (``dist_reduce_fx="sum"``) so they reduce correctly across
devices and batches.
"""

from __future__ import annotations

import torch
from torchmetrics import Metric

from lit_domino.models.objectives import IGNORE_INDEX, check_block_size


def _predictions(preds: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Logits ``[..., B, V]`` → argmax ids; ids ``[..., B]`` pass through."""
    if preds.dim() == labels.dim() + 1:
        preds = preds.argmax(dim=-1)
    if preds.shape != labels.shape:
        raise ValueError(f"predictions {tuple(preds.shape)} and labels {tuple(labels.shape)} disagree")
    return preds


class PositionAccuracy(Metric):
    """Top-1 accuracy per block position ``k = 1..B-1`` (position 0 is never a label).

    ``update(preds, labels)`` takes logits ``[..., B, V]`` or token ids ``[..., B]``
    and labels ``[..., B]`` (``-100`` = no label). ``compute()`` returns a float
    tensor ``[B-1]``; a position that never had a label reads 0.
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = True

    def __init__(self, block_size: int, **kwargs):
        super().__init__(**kwargs)
        self.block_size = check_block_size(block_size)
        self.add_state("correct", default=torch.zeros(block_size, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("total", default=torch.zeros(block_size, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, labels: torch.Tensor) -> None:
        if labels.shape[-1] != self.block_size:
            raise ValueError(f"labels have block size {labels.shape[-1]}, metric expects {self.block_size}")
        preds = _predictions(preds, labels)
        valid = labels != IGNORE_INDEX
        hit = (preds == labels) & valid
        dims = tuple(range(labels.dim() - 1))
        self.correct += hit.sum(dim=dims).long()
        self.total += valid.sum(dim=dims).long()

    def compute(self) -> torch.Tensor:
        acc = self.correct[1:].float() / self.total[1:].clamp_min(1).float()
        return acc


def tau_sim(acc: torch.Tensor | list[float]) -> float:
    """``1 + Σ_k Π_{i≤k} acc_i`` over positions ``k = 1..B-1``: τ (bonus included) if errors were independent."""
    acc = torch.as_tensor(acc, dtype=torch.float64).nan_to_num(0.0).clamp(0.0, 1.0)
    return float(1.0 + torch.cumprod(acc, dim=0).sum())


class PrefixAcceptance(Metric):
    """Greedy acceptance on validation blocks: leading run of correct positions per block.

    A block counts when its position 1 has a label. The run stops at the first
    wrong prediction or missing label. ``compute()`` returns ``1 + mean run``
    (bonus included, comparable to ``tau``); :meth:`rates` the conditional
    per-position rates ``[B-1]``.
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = True

    def __init__(self, block_size: int, **kwargs):
        super().__init__(**kwargs)
        self.block_size = check_block_size(block_size)
        self.add_state("accepted", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("blocks", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("reached", default=torch.zeros(block_size, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("passed", default=torch.zeros(block_size, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, labels: torch.Tensor) -> None:
        if labels.shape[-1] != self.block_size:
            raise ValueError(f"labels have block size {labels.shape[-1]}, metric expects {self.block_size}")
        preds = _predictions(preds, labels)
        labels = labels.reshape(-1, self.block_size)
        preds = preds.reshape(-1, self.block_size)
        keep = labels[:, 1] != IGNORE_INDEX
        labels, preds = labels[keep], preds[keep]
        valid = labels != IGNORE_INDEX
        hit = ((preds == labels) & valid)[:, 1:].long()
        run = torch.cumprod(hit, dim=1)  # 1 while every position so far was right
        prev = torch.cat([torch.ones_like(run[:, :1]), run[:, :-1]], dim=1)  # all before k right
        self.accepted += run.sum()
        self.blocks += labels.shape[0]
        self.reached[1:] += (prev * valid[:, 1:].long()).sum(dim=0)
        self.passed[1:] += run.sum(dim=0)

    def compute(self) -> torch.Tensor:
        return 1.0 + self.accepted.float() / self.blocks.clamp_min(1).float()

    def rates(self) -> torch.Tensor:
        """P(position k right | positions 1..k-1 right), ``k = 1..B-1`` (0 where never reached)."""
        return self.passed[1:].float() / self.reached[1:].clamp_min(1).float()

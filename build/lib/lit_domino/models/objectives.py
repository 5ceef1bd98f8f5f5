"""Training objectives: position weights, λ schedules, block losses.

Conventions (``docs/ARCHITECTURE.md``): a block has ``B`` positions; position 0
holds the known token (never a label), position ``k ≥ 1`` predicts the token at
its own absolute position. Labels are ``-100`` where there is nothing to learn.

* Position weights *(public code)*: ``w_0 = 0``, ``w_k = exp(-(k-1)/γ)`` for
  ``k = 1..B-1``; γ = 7 for B = 16 and γ = 4 for B = 8 (:func:`default_gamma`).
* Block cross-entropy: the weighted sum of per-token CE over valid labels,
  divided by the weight sum of those same valid labels (so masked positions
  neither count nor dilute the loss).
* Domino's base-anchored curriculum *(paper)*:
  ``loss = λ_t·CE(L_base) + (1 − λ_t)·CE(L_final)``, λ_t from a
  :class:`LambdaSchedule` counted in optimizer steps.
* EAGLE-3 training-time test *(public code)*: ``Σ_s 0.8^s · L_s``.

The lean form of these losses (:func:`chunked_ce`, :func:`lean_block_ce`, :func:`lean_curriculum_loss`)
never builds full-vocabulary logits for every position: it keeps only the labelled rows
(hidden states, not logits), and applies the LM head to ``chunk_size`` rows at a time, each
chunk's logits recomputed in the backward pass. Same maths as the full-logits losses above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100
"""Label value that marks 'no label here' (the block's position 0, pads, prompt tokens)."""

LambdaKind = Literal["linear", "cosine", "step", "constant", "none"]

# --------------------------------------------------------------------------- position weights


def check_block_size(block_size: int) -> int:
    """A block must draft at least one token: ``B ≥ 2``."""
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 2:
        raise ValueError(
            f"block_size must be an integer >= 2 (position 0 is the known token, positions 1..B-1 are drafted), "
            f"got {block_size!r}"
        )
    return block_size


def default_gamma(block_size: int) -> float:
    """The decay γ of the position weights for a block size.

    The papers give two points, γ = 7 for B = 16 and γ = 4 for B = 8; other block
    sizes use the straight line through them, ``γ = 1 + 3·B/8`` (B = 4 → 2.5,
    B = 32 → 13, B = 2 → 1.75), always positive.
    """
    check_block_size(block_size)
    return 1.0 + 3.0 * block_size / 8.0


def position_weights(block_size: int, gamma: float | None = None) -> torch.Tensor:
    """``[B]`` float32 weights: ``w_0 = 0``, ``w_k = exp(-(k-1)/γ)`` for ``k = 1..B-1``.

    ``gamma=None`` uses :func:`default_gamma`. ``γ ≤ 0`` raises ``ValueError``.
    """
    check_block_size(block_size)
    if gamma is None:
        gamma = default_gamma(block_size)
    gamma = float(gamma)
    if not math.isfinite(gamma) or gamma <= 0:
        raise ValueError(f"gamma (the decay of the position weights exp(-(k-1)/gamma)) must be > 0, got {gamma}")
    k = torch.arange(block_size, dtype=torch.float32)
    w = torch.exp(-(k - 1) / gamma)
    w[0] = 0.0
    return w


# --------------------------------------------------------------------------- block losses

DEFAULT_CHUNK_SIZE = 1024
"""Default rows per LM-head chunk of the lean losses (:attr:`LossSettings.chunk_size`)."""


def check_chunk_size(chunk_size) -> int | None:
    """``None`` (one chunk) or a positive integer."""
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"loss chunk_size must be a positive integer (labelled rows per LM-head chunk) or None "
                         f"(one chunk: full logits, as before), got {chunk_size!r}")
    return chunk_size


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


# --------------------------------------------------------------------------- lean (chunked) losses


LogitsFn = Callable[..., Sequence[torch.Tensor]]
"""``logits_fn(*row_chunks) -> (logits [n, V], ...)``: one or more logits per chunk of rows."""


def chunked_ce(
    logits_fn: LogitsFn,
    inputs: Sequence[torch.Tensor],
    labels: torch.Tensor,
    weights: torch.Tensor,
    chunk_size: int | None,
    argmax: int | None = None,
) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """``Σ_i w_i·CE(logits_j[i], y_i)`` for each logits ``j`` that ``logits_fn`` returns, chunk by chunk.

    Args:
        logits_fn: maps a chunk of each input (rows ``i..i+n``) to one or more logits ``[n, V]``
            (e.g. ``lm_head(h)``, or Domino's base and final logits at once).
        inputs: tensors ``[N, ...]`` whose rows are the labelled positions (hidden states, not logits).
        labels: ``[N]`` the label of each row (all real labels).
        weights: ``[N]`` each row's weight in the sum.
        chunk_size: rows per chunk; ``None`` = all rows in one chunk.
        argmax: index of the logits whose per-row argmax to return (validation picks); None = none.

    Returns:
        ``([sum_j], argmax [N] or None)``, each sum float32. With a ``chunk_size``, each chunk runs
        under ``torch.utils.checkpoint``: its logits are freed after the forward and recomputed in the
        backward pass, so only one chunk's ``[n, V]`` logits are alive at a time (None: one chunk, kept). With no rows the sums
        are 0, still attached to the graph (every parameter of ``logits_fn`` gets a zero gradient).
    """
    N = labels.shape[0]
    step = N if chunk_size is None else int(chunk_size)
    chunks = range(0, max(N, 1), max(step, 1))

    def body(y, w, *xs):
        outs = logits_fn(*xs)
        sums = tuple((F.cross_entropy(lg.float(), y, reduction="none") * w).sum() for lg in outs)
        return sums if argmax is None else (*sums, outs[argmax].argmax(-1))

    # recompute whenever chunking is asked for: even a single chunk's logits would otherwise stay alive until
    # the backward pass, next to every other loss term's (EAGLE-3's 7 steps, Domino's stages)
    recompute = chunk_size is not None and torch.is_grad_enabled()
    totals, picks = None, []
    for start in chunks:
        sl = slice(start, start + step)
        args = (labels[sl], weights[sl].float(), *(x[sl] for x in inputs))
        out = checkpoint(body, *args, use_reentrant=False) if recompute else body(*args)
        if argmax is not None:
            picks.append(out[-1])
            out = out[:-1]
        totals = list(out) if totals is None else [t + o for t, o in zip(totals, out)]
    return totals, (torch.cat(picks) if argmax is not None else None)


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


def chunked_row_sums(row_fn: Callable[..., Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
                     weights: torch.Tensor, chunk_size: int | None) -> list[torch.Tensor]:
    """``Σ_i w_i·t_j(i)`` for each per-row term ``t_j`` [n] that ``row_fn(*row_chunks)`` returns, chunk by chunk
    (:func:`chunked_ce`'s recomputation: with a ``chunk_size`` each chunk runs under ``torch.utils.checkpoint``,
    so only one chunk's ``[n, V]`` logits are alive). With no rows the sums are 0, still attached to the graph."""
    N = weights.shape[0]
    step = N if chunk_size is None else int(chunk_size)
    recompute = chunk_size is not None and torch.is_grad_enabled()

    def body(w, *xs):
        return tuple((t.float() * w).sum() for t in row_fn(*xs))

    totals = None
    for start in range(0, max(N, 1), max(step, 1)):
        sl = slice(start, start + step)
        args = (weights[sl].float(), *(x[sl] for x in inputs))
        out = checkpoint(body, *args, use_reentrant=False) if recompute else body(*args)
        totals = list(out) if totals is None else [t + o for t, o in zip(totals, out)]
    return totals


def label_rows(labels: torch.Tensor, weights: torch.Tensor | None = None):
    """The labelled positions of ``labels`` ``[..., B]``: ``(keep [..., B] bool, labels [N], weights [N])``,
    the weights being the position weights ``[B]`` of each kept row (ones when None)."""
    keep = labels != IGNORE_INDEX
    w = torch.ones(labels.shape[-1], device=labels.device) if weights is None else weights.to(labels.device)
    return keep, labels[keep], w.float().expand(labels.shape)[keep]


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


# --------------------------------------------------------------------------- λ schedules


@dataclass(frozen=True)
class LambdaSchedule:
    """The weight λ_t of the base-logit loss in Domino's curriculum, per optimizer step.

    ``value(t, total)`` for optimizer step ``t`` of ``total`` (``T``), with the
    horizon ``H = T·ratio``:

    * ``linear``: ``max(0, λ0·(1 − t/H))`` — the paper's 1 → 0 for λ0 = 1, ratio = 1
      (the public code's general form).
    * ``cosine``: ``λ0·½(1 + cos(π·t/H))`` for ``t < H``, then 0.
    * ``step``: ``λ0·0.5^⌊t/(H·step_every)⌋`` for ``t < H``, then 0 — λ0 halves
      every ``step_every`` of the horizon (default a quarter: λ0, λ0/2, λ0/4, λ0/8, 0).
    * ``constant``: ``λ0`` throughout.
    * ``none``: 0 throughout (no base term: loss = CE of the final logits).

    Args:
        kind: one of the above.
        start: λ0, in [0, 1] (the two CE terms are a convex combination).
        ratio: horizon as a fraction of training, > 0 (ratio > 1 never reaches 0).
        step_every: for ``step`` only, the fraction of the horizon between halvings, in (0, 1].
    """

    kind: LambdaKind = "linear"
    start: float = 1.0
    ratio: float = 1.0
    step_every: float = 0.25

    def __post_init__(self):
        kinds = ("linear", "cosine", "step", "constant", "none")
        if self.kind not in kinds:
            raise ValueError(f"unknown λ schedule kind {self.kind!r}; choose one of {kinds}")
        if not 0.0 <= float(self.start) <= 1.0:
            raise ValueError(f"λ schedule start must be in [0, 1], got {self.start}")
        if not float(self.ratio) > 0:
            raise ValueError(f"λ schedule ratio must be > 0, got {self.ratio}")
        if not 0.0 < float(self.step_every) <= 1.0:
            raise ValueError(f"λ schedule step_every must be in (0, 1], got {self.step_every}")

    def value(self, step: int, total_steps: int) -> float:
        """λ at optimizer step ``step`` (0-based) of ``total_steps``."""
        if self.kind == "none":
            return 0.0
        if self.kind == "constant":
            return float(self.start)
        if total_steps is None or not math.isfinite(total_steps) or total_steps <= 0:
            raise ValueError(f"λ schedule {self.kind!r} needs a positive finite number of steps, got {total_steps}")
        t = max(0, int(step))
        horizon = float(total_steps) * float(self.ratio)
        frac = t / horizon
        if self.kind == "linear":
            return max(0.0, float(self.start) * (1.0 - frac))
        if frac >= 1.0:
            return 0.0
        if self.kind == "cosine":
            return float(self.start) * 0.5 * (1.0 + math.cos(math.pi * frac))
        # step
        return float(self.start) * 0.5 ** math.floor(frac / float(self.step_every))

    __call__ = value


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

"""A selected objective over a drafter's training outputs: the labelled rows, chunk by chunk, back in block layout.

A method's ``block_loss`` hands :func:`objective_rows` its labelled rows (hidden states on the lean path, the
materialised logits on the reference path) and a ``row_fn`` that turns a chunk of them into logits, the target's
logits (when the objective needs p) and any terms of its own (DSpark's confidence BCE, DFlash 2's selector CE);
:func:`block_objective` puts the per-row statistics back in the ``[..., B]`` block layout and reduces them.
Both paths run the same code, so the lean path equals the full-logits one (``tests/models/test_objectives_lean.py``).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from lit_domino.models.objectives.chunks import chunked_rows
from lit_domino.models.objectives.registry import TARGET_RULE, Objective
from lit_domino.models.objectives.weights import IGNORE_INDEX

RowFn = Callable[..., tuple[Sequence[torch.Tensor], torch.Tensor | None, Sequence[torch.Tensor]]]
"""``row_fn(*row_chunks) -> (logits [n, V] per evaluated head, target logits [n, V] or None, own terms [n])``."""


def objective_rows(objective: Objective, row_fn: RowFn, inputs: Sequence[torch.Tensor], labels: torch.Tensor,
                   chunk_size: int | None) -> tuple[list[dict[str, torch.Tensor]], list[torch.Tensor]]:
    """The objective's per-row statistics over rows ``inputs`` (each ``[N, ...]``) with labels ``[N]``:
    ``([{stat: [N]} per logits row_fn returns], [own term [N] ...])``, ``chunk_size`` rows at a time (each chunk
    recomputed in the backward pass; None = one chunk)."""
    names = objective.stat_names
    shape: dict[str, int] = {}

    def body(y, *xs):
        logits, target, own = row_fn(*xs)
        shape["logits"], shape["own"] = len(logits), len(own)
        out = []
        for lg in logits:
            stats = objective.row_stats(lg, y, target)
            out.extend(stats[n] for n in names)
        return (*out, *own)

    flat = chunked_rows(body, [labels, *inputs], chunk_size)
    n, count = len(names), shape["logits"]
    return [dict(zip(names, flat[i * n:(i + 1) * n])) for i in range(count)], list(flat[count * n:])


def dense(rows: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Rows ``[N]`` back at the kept positions of ``keep`` ``[..., B]`` (0 elsewhere; differentiable)."""
    return torch.zeros(keep.shape, dtype=rows.dtype, device=rows.device).masked_scatter(keep, rows)


def block_objective(objective: Objective, stats: dict[str, torch.Tensor], keep: torch.Tensor,
                    weights: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``objective.reduce`` of row statistics ``{stat: [N]}`` taken at the kept positions of ``keep`` [..., B]
    (the labelled ones), with the method's position weights ``weights`` [B]."""
    return objective.reduce({k: dense(v, keep) for k, v in stats.items()}, keep,
                            weights.to(keep.device).float())


def target_rows(out, keep: torch.Tensor, objective: Objective) -> list[torch.Tensor]:
    """``[target_hidden[keep]]`` when the objective needs the target's distribution (the target's final hidden
    state at each labelled position, whose LM-head logits are p's), else ``[]``."""
    if not objective.needs_target:
        return []
    hidden = getattr(out, "target_hidden", None)
    if hidden is None:
        raise ValueError(f"objective: {objective.name!r} needs the target's distribution p, and this block output "
                         f"carries none (target_hidden): train on the {TARGET_RULE!r} features (the training "
                         "module attaches them for the backbone and Domino; DSpark and DFlash 2 read them always)")
    return [hidden[keep]]


def parallel_objective(drafter, out, settings) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A selected objective J (``settings.objective``) on a parallel drafter's block output: ``J(L_base)`` for the
    backbone; Domino's curriculum ``λ·J(L_base) + (1−λ)·J(L_final)`` (at λ = 0 the base term is logged only, as
    in its CE curriculum); from the materialised logits when the forward made them, else from
    ``drafter.row_inputs``/``row_logits`` chunk by chunk; p from ``out.target_hidden`` when J needs it.
    -> (loss, {loss_base[, loss_final], the objective's logs})."""
    obj, lam, keep = settings.objective, settings.lam, out.labels != IGNORE_INDEX
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"λ must be in [0, 1], got {lam}")
    full = out.logits is not None
    sources = [x for x in (out.logits, out.final_logits) if x is not None] if full else drafter.row_inputs(out)
    n = len(sources)

    def row_fn(*xs):
        logits = tuple(xs[:n]) if full else drafter.row_logits(*xs[:n])
        if len(logits) == 2 and lam == 0.0:
            logits = (logits[0].detach(), logits[1])
        return logits, (drafter.compute_logits(xs[n]) if len(xs) > n else None), ()

    rows = [x[keep] for x in sources] + target_rows(out, keep, obj)
    stats, _ = objective_rows(obj, row_fn, rows, out.labels[keep], settings.chunk_size)
    if len(stats) == 1:
        loss, logs = block_objective(obj, stats[0], keep, settings.position_weights)
        return loss, {"loss_base": loss.detach(), **logs}
    loss_base, _ = block_objective(obj, stats[0], keep, settings.position_weights)
    loss_final, logs = block_objective(obj, stats[1], keep, settings.position_weights)
    loss = loss_final if lam == 0.0 else lam * loss_base + (1.0 - lam) * loss_final
    return loss, {"loss_base": loss_base.detach(), "loss_final": loss_final.detach(), **logs}


def chains(steps: Sequence[torch.Tensor], fill) -> torch.Tensor:
    """EAGLE-3's training-time-test steps as chains: ``steps[s]`` ``[b, T]`` (step s at position t) ->
    ``[b, T, S+1]`` whose ``[:, m, s+1]`` is step s at position ``m + s`` (the chain whose real prefix ends at m)
    and ``[:, m, 0]`` is ``fill`` (the known token's slot); past the sequence end, ``fill``."""
    b, T = steps[0].shape
    cols = [torch.full_like(steps[0], fill)]
    for s, step in enumerate(steps):
        cols.append(torch.cat([step[:, s:], torch.full_like(step[:, :s], fill)], dim=1))
    return torch.stack(cols, dim=-1)


def chain_valid(step_labels: Sequence[torch.Tensor]) -> torch.Tensor:
    """The labelled chain positions ``[b, T, S+1]`` of the steps' labels (:func:`chains` layout)."""
    return chains([label != IGNORE_INDEX for label in step_labels], False)


def chain_objective(drafter, hidden: Sequence[torch.Tensor], labels: Sequence[torch.Tensor], step_decay: float,
                    objective: Objective, chunk_size: int | None, with_preds: bool = False):
    """A selected objective on EAGLE-3's training-time test: the S steps' rows (hidden ``[b, T, d]`` and labels
    ``[b, T]`` per step) evaluated chunk by chunk, then seen as chains (:func:`chains`: block position k = s+1 of
    the chain whose real prefix ends at m is step s at m+s, what a decode from m drafts), with position weights
    ``step_decay^(k−1)``. -> (loss, logs, per-step argmax ``[b, T]`` or None). EAGLE-3's features do not carry the
    target's distribution: an objective that needs it is refused before this (the module) or here."""
    if objective.needs_target:
        raise ValueError(f"objective: {objective.name!r} needs the target's distribution p, which EAGLE-3's "
                         f"'eagle3' features do not carry (the {TARGET_RULE!r} rule does)")
    per_step, picks = [], []
    for h, label in zip(hidden, labels):
        keep = label != IGNORE_INDEX

        def row_fn(x):
            logits = drafter.row_logits(x)[-1]
            return (logits,), None, ((logits.detach().argmax(-1),) if with_preds else ())

        (stats,), own = objective_rows(objective, row_fn, [h[keep]], label[keep], chunk_size)
        per_step.append({k: dense(v, keep) for k, v in stats.items()})
        if with_preds:
            picks.append(torch.zeros_like(label).masked_scatter(keep, own[0]))
    S = len(per_step)
    weights = torch.tensor([0.0] + [float(step_decay) ** k for k in range(S)], device=labels[0].device)
    stats = {k: chains([step[k] for step in per_step], 0.0) for k in per_step[0]}
    loss, logs = objective.reduce(stats, chain_valid(labels), weights)
    return loss, logs, (picks if with_preds else None)

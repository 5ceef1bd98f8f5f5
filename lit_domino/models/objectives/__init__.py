"""Training objectives: position weights, λ schedules, the methods' own block losses, and the registry of
objectives any block drafter (and EAGLE-3) can select.

* :mod:`~lit_domino.models.objectives.weights`: ``w_k = exp(−(k−1)/γ)``, the label conventions;
* :mod:`~lit_domino.models.objectives.chunks`: the lean (chunked, recomputed) evaluation on labelled rows;
* :mod:`~lit_domino.models.objectives.losses`: the methods' own losses (what a config that names no objective
  trains on, unchanged) and :class:`LossSettings`;
* :mod:`~lit_domino.models.objectives.schedules`: Domino's λ curriculum;
* :mod:`~lit_domino.models.objectives.registry`: :class:`Objective`, :func:`build_objective` (names, settings,
  errors); the objectives themselves in :mod:`~lit_domino.models.objectives.cross_entropy` (``ce``, ``dpace``,
  ``accept_until_fail``), :mod:`~lit_domino.models.objectives.divergences` (``kl``, ``tv``, ``lk_alpha``,
  ``lk_lambda``) and :mod:`~lit_domino.models.objectives.acceptance` (``renyi``, ``expected_tau``);
  :mod:`~lit_domino.models.objectives.blocks` evaluates one on a drafter's outputs. ``docs/objectives.md`` has
  the table of formulas, papers and the public functions each is tested against.
"""

from lit_domino.models.objectives.weights import IGNORE_INDEX, check_block_size, default_gamma, position_weights
from lit_domino.models.objectives.chunks import (DEFAULT_CHUNK_SIZE, LogitsFn, check_chunk_size, chunked_ce,
    chunked_row_sums, chunked_rows, label_rows)
from lit_domino.models.objectives.schedules import LambdaKind, LambdaSchedule
from lit_domino.models.objectives.losses import (LossSettings, confidence_bce, curriculum_loss, distill_terms,
    lean_block_ce, lean_curriculum_loss, token_ce, ttt_loss, weighted_block_ce)
from lit_domino.models.objectives.registry import (TARGET_RULE, Objective, build_objective, objective_class,
    objective_names, register_objective)
from lit_domino.models.objectives.cross_entropy import AcceptUntilFail, DPace, PositionCE
from lit_domino.models.objectives.divergences import KL, TV, LKAlpha, LKLambda
from lit_domino.models.objectives.acceptance import ExpectedTau, Renyi

__all__ = [
    "IGNORE_INDEX", "check_block_size", "default_gamma", "position_weights",
    "DEFAULT_CHUNK_SIZE", "LogitsFn", "check_chunk_size", "chunked_ce", "chunked_row_sums", "chunked_rows",
    "label_rows", "LambdaKind", "LambdaSchedule",
    "LossSettings", "confidence_bce", "curriculum_loss", "distill_terms", "lean_block_ce", "lean_curriculum_loss", "token_ce",
    "ttt_loss", "weighted_block_ce",
    "TARGET_RULE", "Objective", "build_objective", "objective_class", "objective_names", "register_objective",
    "AcceptUntilFail", "DPace", "PositionCE", "KL", "TV", "LKAlpha", "LKLambda", "ExpectedTau", "Renyi",
]


def uses_own_loss(settings: LossSettings) -> bool:
    """Whether a method trains on its own loss, as before objectives were selectable: no objective named, or
    the plain ``ce`` (which *is* the backbone's, Domino's and EAGLE-3's own loss; DSpark and DFlash 2 do not
    call this: their own loss is not the CE)."""
    return settings.objective is None or isinstance(settings.objective, PositionCE)

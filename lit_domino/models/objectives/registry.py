"""The registry of training objectives: named, configured losses any block drafter (and EAGLE-3) can select.

An objective is a frozen dataclass registered under a ``name`` (:func:`register_objective`); its fields are its
settings, each with a docstring, checked in ``__post_init__`` (a value out of range is a ``ValueError`` naming
``objective.<field>``). A config selects one as ``model.init_args.objective: {name: lk_lambda, variant:
specforge}`` (or a bare name), ``--set model.objective.name=kl``, a sweep dimension, or in Python
(:func:`build_objective` takes a name, a mapping or an instance).

It is evaluated in two steps, so that the lean path never holds the full ``[positions, V]`` logits:

1. :meth:`Objective.row_stats` ``(logits [n, V], labels [n], target_logits [n, V] | None) -> {stat: [n]}``:
   per labelled row, inside the chunked pass (:func:`~lit_domino.models.objectives.chunks.chunked_rows`: one
   chunk's logits alive at a time, recomputed in the backward pass);
2. :meth:`Objective.reduce` ``({stat: [..., B]}, valid [..., B], weights [B]) -> (loss, logs)``: across the
   positions of each block (the stats back in block layout, 0 where ``valid`` is False), where the
   block-shaped objectives (D-PACE, accept-until-fail, the acceptance-weighted and expected-τ losses) combine
   a block's positions.

``needs_target``: whether the objective reads the target's distribution p at each labelled position (the
logits the target's last layer gives there); the features carry it under the ``dspark`` feature rule
(:data:`TARGET_RULE`): DSpark and DFlash 2 always, the backbone and Domino when their objective needs it (the
training CLI then reads the ``dspark`` features and the module hands the drafter DFlash's layers only).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

TARGET_RULE = "dspark"
"""The feature rule whose features carry the target's distribution p: DFlash's layers, then the target's last
decoder layer (whose final-normed output the LM head turns into p's logits)."""

_REGISTRY: dict[str, type["Objective"]] = {}


@dataclass(frozen=True)
class Objective:
    """A training objective (see the module docstring); subclasses are frozen dataclasses of their settings."""

    name: ClassVar[str] = ""
    """The name a config selects it by."""
    paper: ClassVar[str] = ""
    """Where the objective is defined (the paper, its arXiv id where it has one)."""
    public: ClassVar[str] = ""
    """The public function(s) its tests compare it with (loss and gradient), or the reference it follows."""

    @property
    def needs_target(self) -> bool:
        """Whether it reads the target's distribution p (``target_logits`` in :meth:`row_stats`)."""
        return False

    @property
    def stat_names(self) -> tuple[str, ...]:
        """The per-row statistics :meth:`row_stats` returns, in order."""
        raise NotImplementedError

    def row_stats(self, logits: torch.Tensor, labels: torch.Tensor,
                  target_logits: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """Per labelled row: the drafter's logits [n, V] (any dtype), the labels [n], the target's logits
        [n, V] (None unless :attr:`needs_target`) -> ``{stat: [n] float32}`` for every name of :attr:`stat_names`."""
        raise NotImplementedError

    def reduce(self, stats: dict[str, torch.Tensor], valid: torch.Tensor,
               weights: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss of a batch of blocks: ``stats`` ``{stat: [..., B]}`` (0 where not ``valid``), ``valid``
        [..., B] the labelled positions, ``weights`` [B] the method's position weights -> (scalar loss,
        detached values to log). 0, still attached to the graph, when no position is valid."""
        raise NotImplementedError

    def spec(self) -> dict[str, Any]:
        """``{"name": ..., **settings}``: plain types (a checkpoint's hparams, a config, MLflow params)."""
        return {"name": self.name, **dataclasses.asdict(self)}

    def describe(self) -> str:
        """A short label for tables: the name and the settings that differ from the defaults
        (``lk_lambda[variant=specforge]``)."""
        default = type(self)()
        changed = [f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                   if getattr(self, f.name) != getattr(default, f.name)]
        return self.name + (f"[{','.join(changed)}]" if changed else "")


def register_objective(cls: type[Objective]) -> type[Objective]:
    """Class decorator: register ``cls`` under ``cls.name`` (a frozen dataclass of its settings)."""
    if not cls.name or cls.name in _REGISTRY:
        raise ValueError(f"objective name {cls.name!r} is empty or taken")
    _REGISTRY[cls.name] = cls
    return cls


def objective_names() -> list[str]:
    """The registered objectives' names (registration order)."""
    _load_catalog()
    return list(_REGISTRY)


def objective_class(name: str) -> type[Objective]:
    """The objective registered as ``name``; ``ValueError`` with the close matches otherwise."""
    _load_catalog()
    if name not in _REGISTRY:
        close = difflib.get_close_matches(str(name), list(_REGISTRY), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ValueError(f"objective: unknown objective {name!r}{hint}; choose one of {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def build_objective(spec: Any) -> Objective | None:
    """An objective from a config value: None (the method's own loss), a name (its default settings), a mapping
    ``{name: ..., <setting>: ...}`` or an :class:`Objective` (as is). Every error is one ``ValueError`` line
    naming the key: an unknown objective (with its close matches), a setting the objective does not take (with
    the ones it takes), a value out of range (the objective's own check)."""
    if spec is None or isinstance(spec, Objective):
        return spec
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ValueError(f"objective: expected a name or a mapping {{name: <objective>, <setting>: <value>}}, got "
                         f"{spec!r}; objectives: {', '.join(objective_names())}")
    cls = objective_class(spec["name"])
    settings = {k: v for k, v in spec.items() if k != "name"}
    known = [f.name for f in dataclasses.fields(cls)]
    for key in settings:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            takes = (f"; did you mean objective.{close[0]}?" if close else
                     f"; it takes {', '.join(known)}" if known else "; it takes no settings")
            raise ValueError(f"objective.{key}: the {cls.name!r} objective has no setting {key!r}{takes}")
    return cls(**settings)


def missing_target_message(objective: Objective, reads: str) -> str:
    """The one line for an objective that needs p on a drafter whose features (``reads``) do not carry it."""
    return (f"objective: {objective.name!r} needs the target's distribution p at every labelled position, which "
            f"the {TARGET_RULE!r} feature rule carries (DFlash's layers, then the target's last layer); {reads}. "
            f"Objectives without p: {', '.join(n for n in objective_names() if not _needs_target_by_default(n))}")


def _needs_target_by_default(name: str) -> bool:
    return objective_class(name)().needs_target


def _load_catalog() -> None:
    # the objectives register themselves on import; imported here, not at the top (they import this module)
    from lit_domino.models.objectives import acceptance, cross_entropy, divergences  # noqa: F401


# --------------------------------------------------------------------------- setting checks and block helpers


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    """``objective.<name>`` must be one of ``choices``."""
    if value not in choices:
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ValueError(f"objective.{name}: unknown value {value!r}{hint}; choose one of {', '.join(choices)}")


def check_number(name: str, value: Any, low: float, high: float = math.inf, *, low_open: bool = False,
                 high_open: bool = False) -> None:
    """``objective.<name>`` must be a finite (or +inf bounded) number in the interval ``[low, high]`` (ends open
    as asked)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
        ok = ok and math.isfinite(value)
    if not ok:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open or high == math.inf else ']'}"
        raise ValueError(f"objective.{name} must be a number in {interval}, got {value!r}")


def check_flag(name: str, value: Any) -> None:
    """``objective.<name>`` must be true or false."""
    if not isinstance(value, bool):
        raise ValueError(f"objective.{name} must be true or false, got {value!r}")


def weighted_mean(values: torch.Tensor, valid: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``Σ w_k·x / Σ w_k`` over the valid positions of ``values`` [..., B] (weights [B]); 0, attached to the
    graph, when the weight sum is 0."""
    w = weights.to(device=values.device, dtype=values.dtype).expand_as(values) * valid
    denom = w.sum()
    if denom <= 0:
        return values.sum() * 0.0
    return (values * w).sum() / denom


def neutral(values: torch.Tensor, valid: torch.Tensor, fill: float = 1.0) -> torch.Tensor:
    """``values`` where ``valid``, ``fill`` elsewhere (a position that is no label is a no-op in a product)."""
    return torch.where(valid, values, torch.full_like(values, fill))


def exclusive_cumprod(values: torch.Tensor) -> torch.Tensor:
    """``Π_{i<k} x_i`` along the last axis (1 at k = 0)."""
    ones = torch.ones_like(values[..., :1])
    return torch.cumprod(torch.cat([ones, values[..., :-1]], dim=-1), dim=-1)


def reverse_cumsum(values: torch.Tensor) -> torch.Tensor:
    """``Σ_{j>=k} x_j`` along the last axis."""
    return torch.flip(torch.cumsum(torch.flip(values, dims=[-1]), dim=-1), dims=[-1])

"""The search space of a sweep: the YAML file (``sweeps/space.yaml``), its validation, and the errors.

A space is ``{variant, params: {name: spec}}``; each spec is one Optuna distribution
(``int`` / ``float`` / ``categorical``) with the dotted config key it sets (``target``;
``model.X`` means ``model.init_args.X``). Everything the model would reject (an empty
range, rank < 1, λ start outside [0, 1], an unknown λ kind or DSpark head type, a key the variant's module
does not take ...) is a
:class:`SearchSpaceError` before any trial runs. :class:`SweepError` is the base of every
error that stops a sweep before it starts (space, storage, settings, study).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import optuna
import yaml

from lit_domino.runtime.paths import project_root
from lit_domino.runtime.command import UsageError

LAMBDA_KINDS = ("linear", "cosine", "step", "constant", "none")
DEFAULT_SPACE_FILE = project_root() / "sweeps" / "space.yaml"
DSPARK_SPACE_FILE = project_root() / "sweeps" / "dspark_space.yaml"
"""DSpark's space: its Markov rank (and head type), the variant ``dspark``."""
DFLASH2_SPACE_FILE = project_root() / "sweeps" / "dflash2_space.yaml"
"""DFlash 2's space: its selector's rank, candidates and loss weight, the variant ``dflash2``."""
OBJECTIVES_SPACE_FILE = project_root() / "sweeps" / "objectives_space.yaml"
"""The training objective as a dimension (``model.objective``: null = the drafter's own loss), the variant ``domino``."""


class SweepError(UsageError):
    """A sweep cannot start: bad space, storage, settings or study (the message says which and why)."""


class SearchSpaceError(SweepError):
    """The search space file is malformed (empty range, unknown type, value outside what the model accepts)."""


class StorageError(SweepError):
    """The Optuna storage URL cannot be opened."""


class StudyMismatchError(SweepError):
    """A study of this name exists with a different search space, objective or settings."""


POSITIVE_HEAD_FIELDS = ("rank", "gru_hidden", "top_k", "conv_kernel_size", "conv_group_size")
"""The methods' head fields (``model.head.<field>``) that are positive integers."""
_TYPES = ("int", "float", "categorical")
_PARAM_KEYS = {"type", "target", "low", "high", "log", "step", "choices", "help"}
_CHOICE_TYPES = (str, int, float, bool, type(None))


def config_key(target: str) -> str:
    """``model.head.rank`` / ``model.curriculum.kind`` → the config key under ``model.init_args``."""
    parts = target.split(".")
    if parts[0] == "model" and (len(parts) < 2 or parts[1] != "init_args"):
        parts = ["model", "init_args", *parts[1:]]
    return ".".join(parts)


def _domain_check(name: str, target: str, values: list) -> str | None:
    """What the model would reject among the range's extreme values, else None."""
    key = config_key(target)
    bad = None
    if key in ("model.init_args.num_layers", *(f"model.init_args.head.{f}" for f in POSITIVE_HEAD_FIELDS)):
        bad = [v for v in values if not isinstance(v, int) or isinstance(v, bool) or v < 1]
        what = "a positive integer"
    elif key == "model.init_args.curriculum.kind":
        bad = [v for v in values if v not in LAMBDA_KINDS]
        what = f"one of {LAMBDA_KINDS}"
    elif key == "model.init_args.curriculum.start":
        bad = [v for v in values if not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0]
        what = "in [0, 1] (λ0 weighs the base-logit loss)"
    elif key == "model.init_args.curriculum.ratio":
        bad = [v for v in values if not isinstance(v, (int, float)) or not v > 0]
        what = "> 0 (the horizon as a fraction of training)"
    elif key == "model.init_args.curriculum.step_every":
        bad = [v for v in values if not isinstance(v, (int, float)) or not 0.0 < v <= 1.0]
        what = "in (0, 1]"
    elif key == "model.init_args.head.head_type":  # DSpark's Markov head variants
        from lit_domino.models.dspark import HEAD_TYPES

        bad = [v for v in values if v not in HEAD_TYPES]
        what = f"one of {HEAD_TYPES}"
    elif key == "model.init_args.objective":  # null (the drafter's own loss) or the registry's objectives
        from lit_domino.models.objectives import build_objective, objective_names

        def refused(value) -> bool:
            try:
                build_objective(value)
            except ValueError:
                return True
            return False

        bad = [v for v in values if refused(v)]
        what = f"null (the drafter's own loss) or an objective: {', '.join(objective_names())}"
    elif key == "model.init_args.lr":
        bad = [v for v in values if not isinstance(v, (int, float)) or not v > 0]
        what = "> 0"
    if bad:
        return f"parameter {name!r} ({target}): {bad} not allowed, must be {what}"
    return None


@dataclass(frozen=True)
class ParamSpec:
    """One swept hyper-parameter: its Optuna distribution and the config key it sets."""

    name: str
    type: str
    target: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple | None = None

    def suggest(self, trial: optuna.trial.BaseTrial):
        if self.type == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        if self.type == "float":
            return trial.suggest_float(self.name, float(self.low), float(self.high), step=self.step, log=self.log)
        return trial.suggest_categorical(self.name, list(self.choices))

    def to_dict(self) -> dict:
        d = {"type": self.type, "target": self.target}
        if self.type == "categorical":
            d["choices"] = list(self.choices)
        else:
            d.update(low=self.low, high=self.high, log=bool(self.log))
            if self.step is not None:
                d["step"] = self.step
        return d


@dataclass(frozen=True)
class SearchSpace:
    """The swept parameters of one variant (``sweeps/space.yaml``)."""

    params: tuple[ParamSpec, ...]
    variant: str = "domino"

    def to_dict(self) -> dict:
        return {"variant": self.variant, "params": {p.name: p.to_dict() for p in self.params}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def suggest(self, trial: optuna.trial.BaseTrial) -> dict[str, Any]:
        return {p.name: p.suggest(trial) for p in self.params}

    def overrides(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Sampled values → dotted config overrides (``model.init_args.head.rank`` ...)."""
        return {config_key(p.target): values[p.name] for p in self.params if p.name in values}


def _number(name: str, key: str, value, integer: bool):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise SearchSpaceError(f"parameter {name!r}: {key} must be a finite number, got {value!r}")
    if integer and int(value) != value:
        raise SearchSpaceError(f"parameter {name!r} is an int range: {key} must be an integer, got {value!r}")
    return int(value) if integer else float(value)


def parse_param(name: str, spec: Any) -> ParamSpec:
    """Validate one entry of the space's ``params`` mapping."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", name):
        raise SearchSpaceError(f"parameter name {name!r} must be an identifier (letters, digits, '_', '.')")
    if not isinstance(spec, Mapping):
        raise SearchSpaceError(f"parameter {name!r} must be a mapping with type/target/..., got {spec!r}")
    unknown = set(spec) - _PARAM_KEYS
    if unknown:
        raise SearchSpaceError(f"parameter {name!r}: unknown keys {sorted(unknown)}; allowed {sorted(_PARAM_KEYS)}")
    kind = spec.get("type")
    if kind not in _TYPES:
        raise SearchSpaceError(f"parameter {name!r}: type must be one of {_TYPES}, got {kind!r}")
    target = spec.get("target")
    if not isinstance(target, str) or target.split(".")[0] not in ("model", "data", "trainer") or "." not in target:
        raise SearchSpaceError(f"parameter {name!r}: target must be a dotted config key under model/data/trainer "
                               f"(e.g. model.head.rank), got {target!r}")
    if kind == "categorical":
        if "low" in spec or "high" in spec or "log" in spec or "step" in spec:
            raise SearchSpaceError(f"parameter {name!r} is categorical: give choices, not low/high/log/step")
        choices = spec.get("choices")
        if not isinstance(choices, (list, tuple)) or len(choices) == 0:
            raise SearchSpaceError(f"parameter {name!r}: empty choices (a categorical needs at least one value)")
        if not all(isinstance(c, _CHOICE_TYPES) for c in choices):
            raise SearchSpaceError(f"parameter {name!r}: choices must be strings, numbers, booleans or null")
        if len(set(map(repr, choices))) != len(choices):
            raise SearchSpaceError(f"parameter {name!r}: duplicate choices in {list(choices)}")
        p = ParamSpec(name, kind, target, choices=tuple(choices))
        extremes = list(choices)
    else:
        if "choices" in spec:
            raise SearchSpaceError(f"parameter {name!r} is a {kind} range: give low/high, not choices")
        for key in ("low", "high"):
            if key not in spec:
                raise SearchSpaceError(f"parameter {name!r}: missing {key}")
        integer = kind == "int"
        low, high = _number(name, "low", spec["low"], integer), _number(name, "high", spec["high"], integer)
        if low > high:
            raise SearchSpaceError(f"parameter {name!r}: empty range, low={low} > high={high}")
        if low == high:
            raise SearchSpaceError(f"parameter {name!r}: empty range, low == high == {low} leaves nothing to sweep "
                                   "(fix the value with --set instead)")
        log_scale = spec.get("log", False)
        if not isinstance(log_scale, bool):
            raise SearchSpaceError(f"parameter {name!r}: log must be true or false, got {log_scale!r}")
        if log_scale and low <= 0:
            raise SearchSpaceError(f"parameter {name!r}: a log-scale range needs low > 0, got low={low}")
        step = spec.get("step")
        if step is not None:
            step = _number(name, "step", step, integer)
            if step <= 0:
                raise SearchSpaceError(f"parameter {name!r}: step must be > 0, got {step}")
            if log_scale and (not integer or step != 1):
                raise SearchSpaceError(f"parameter {name!r}: log scale cannot be combined with a step")
            if step > high - low:
                raise SearchSpaceError(f"parameter {name!r}: empty range, step {step} is wider than high - low")
        p = ParamSpec(name, kind, target, low, high, log_scale, step)
        extremes = [low, high]
    problem = _domain_check(name, target, extremes)
    if problem:
        raise SearchSpaceError(problem)
    return p


def parse_space(data: Any, source: str = "search space") -> SearchSpace:
    """A :class:`SearchSpace` from the parsed YAML (``{variant, params: {name: spec}}``)."""
    if not isinstance(data, Mapping):
        raise SearchSpaceError(f"{source}: expected a mapping with 'params', got {type(data).__name__}")
    unknown = set(data) - {"variant", "params"}
    if unknown:
        raise SearchSpaceError(f"{source}: unknown top-level keys {sorted(unknown)} (allowed: variant, params)")
    params = data.get("params")
    if not isinstance(params, Mapping) or not params:
        raise SearchSpaceError(f"{source}: 'params' is empty; a sweep needs at least one parameter")
    variant = data.get("variant", "domino")
    if not isinstance(variant, str) or not variant:
        raise SearchSpaceError(f"{source}: variant must be a config name (e.g. domino), got {variant!r}")
    specs = []
    for name, spec in params.items():
        try:
            specs.append(parse_param(name, spec))
        except SearchSpaceError as err:
            raise SearchSpaceError(f"{source}: {err}") from None
    targets = [config_key(p.target) for p in specs]
    dup = sorted({t for t in targets if targets.count(t) > 1})
    if dup:
        raise SearchSpaceError(f"{source}: several parameters set the same config key(s) {dup}")
    return SearchSpace(tuple(specs), variant)


def load_space(path: str | Path = DEFAULT_SPACE_FILE) -> SearchSpace:
    """Read and validate a search-space YAML file."""
    path = Path(path)
    if not path.is_file():
        raise SearchSpaceError(f"search space file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise SearchSpaceError(f"search space file {path} is not valid YAML: {err}") from None
    return parse_space(data, str(path))

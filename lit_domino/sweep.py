"""Optuna sweeps over the Domino head: search space, objective, study creation/resume, summary.

``sweeps/domino.py`` is the thin CLI over this module; ``sweeps/space.yaml`` the
default search space. One *study* is a set of trials in an Optuna storage
(SQLite ``sqlite:///sweeps/<study>.db`` by default, an Optuna journal file
``journal:<path>`` / ``<path>.journal``, or any RDB URL) plus one MLflow
experiment ``sweep-<study>`` holding the study's run (``sweep_role=study``) and,
nested under it (``mlflow.parentRunId``), one run per trial with its params,
training curves and decoding metrics.

A trial (:func:`train_and_decode`, the default *evaluator*):

1. samples the space (:class:`SearchSpace`) and writes the values into the merged
   variant + preset config (``lit_domino.experiment.load_config``);
2. trains through ``lit_domino.experiment.train_variant`` (artifact cache: an
   identical config is reused; a retried trial resumes from ``last.ckpt``), with
   :class:`PruningCallback` reporting ``val/tau_sim`` once per validation — step =
   the epoch when validation runs once per epoch, the optimizer step when it runs
   every ``val_check_interval`` steps/fraction of an epoch;
3. decodes a *validation* prompt set for real (``lit_domino.decoding.metrics.benchmark``:
   our AR baseline + the drafter, same process) and returns the mean over domains
   of ``tau`` (or ``speedup``).

Validation prompts are taken from the END of each embedded eval set, so the first
prompts of each set — the ablation's test prompts — stay unseen by the sweep.

Crash handling: every trial records its worker (host, pid, process start time).
``--resume`` (:func:`recover_study`) fails RUNNING trials whose worker process is
gone (same host) or whose heartbeat is stale (RDB storages), marks their MLflow
runs FAILED, and re-enqueues each failed trial's parameters once
(``RetryHeartbeatStaleTrialCallback``), so a resumed sweep retrains the same
configuration from its last checkpoint. ``n_trials`` is the study's total of
finished (COMPLETE + PRUNED) trials, shared by all workers.
"""

from __future__ import annotations

import copy
import importlib
import json
import logging
import math
import os
import re
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import optuna
import yaml
from optuna.trial import TrialState

from lit_domino.paths import project_root

log = logging.getLogger(__name__)

OBJECTIVES = ("tau", "speedup")
PRUNE_MONITOR = "val/tau_sim"
DEFAULT_PROMPTS = "embedded-math,embedded-code,embedded-chat"
SPACE_ATTR = "lit_domino:search_space"
SETTINGS_ATTR = "lit_domino:settings"
RUN_ATTR = "lit_domino:mlflow_run_id"
EXPERIMENT_ATTR = "lit_domino:mlflow_experiment"
LAMBDA_KINDS = ("linear", "cosine", "step", "constant", "none")


DEFAULT_SPACE_FILE = project_root() / "sweeps" / "space.yaml"


class SweepError(ValueError):
    """A sweep cannot start: bad space, storage, settings or study (the message says which and why)."""


class SearchSpaceError(SweepError):
    """The search space file is malformed (empty range, unknown type, value outside what the model accepts)."""


class StorageError(SweepError):
    """The Optuna storage URL cannot be opened."""


class StudyMismatchError(SweepError):
    """A study of this name exists with a different search space, objective or settings."""


# =========================================================================== search space

_TYPES = ("int", "float", "categorical")
_PARAM_KEYS = {"type", "target", "low", "high", "log", "step", "choices", "help"}
_CHOICE_TYPES = (str, int, float, bool, type(None))


def _config_path(target: str) -> str:
    """``model.rank`` / ``model.curriculum.kind`` → the config key under ``model.init_args``."""
    parts = target.split(".")
    if parts[0] == "model" and (len(parts) < 2 or parts[1] != "init_args"):
        parts = ["model", "init_args", *parts[1:]]
    return ".".join(parts)


def _domain_check(name: str, target: str, values: list) -> str | None:
    """What the model would reject among the range's extreme values, else None."""
    key = _config_path(target)
    bad = None
    if key in ("model.init_args.rank", "model.init_args.gru_hidden", "model.init_args.num_layers"):
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
        """Sampled values → dotted config overrides (``model.init_args.rank`` ...)."""
        return {_config_path(p.target): values[p.name] for p in self.params if p.name in values}


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
                               f"(e.g. model.rank), got {target!r}")
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
    targets = [_config_path(p.target) for p in specs]
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


# =========================================================================== settings


@dataclass
class SweepSettings:
    """Everything a worker needs; the fields in :data:`OBJECTIVE_FIELDS` define the objective and must
    agree between every worker of a study.

    Args:
        study_name: the Optuna study (and MLflow experiment ``sweep-<study_name>``).
        storage: Optuna storage URL; None = ``sqlite:///<project>/sweeps/<study_name>.db``.
        objective: ``tau`` (mean over domains of the papers' τ) or ``speedup`` (vs our AR baseline).
        preset: ``smoke`` | ``default`` | ``paper`` (sizes of the trained drafters).
        seed: training seed of every trial.
        overrides: fixed dotted config overrides applied to every trial (``--set``).
        max_steps: train each trial for exactly this many optimizer steps (validating every
            ``val_check_interval`` steps, default at the end); None = the preset's epochs.
        val_check_interval: validate (and report ``val/tau_sim`` for pruning) every this many
            steps (int) or fraction of an epoch (float); None = the preset's.
        prompts: benchmark list (``name[:n],...``, embedded sets work offline); the LAST
            ``prompts_per_domain`` prompts of each set are the validation prompts.
        prompts_per_domain / max_new_tokens / temperature: decoding of the validation prompts.
        n_trials: the study's target of finished (COMPLETE + PRUNED) trials, all workers together.
        pruner: ``median`` | ``none`` | an ``optuna.pruners.BasePruner``.
        n_startup_trials / n_warmup_steps: MedianPruner settings.
        sampler_seed: TPE seed (None = random); worker i of ``--workers`` uses seed + i.
        heartbeat: RDB heartbeat interval in seconds (stale trials of dead workers on other hosts
            are failed after 2 intervals); 0 disables.
        max_retries: how often a crashed trial's parameters are retried.
        evaluator: ``module:function`` taking a :class:`TrialContext` and returning a
            :class:`TrialOutcome`; None = :func:`train_and_decode`.
        experiment: MLflow experiment; None = ``sweep-<study_name>``.
        threads: torch threads of this worker (None = torch's default).
        progress: progress bars of training/decoding.
    """

    study_name: str = "domino"
    storage: str | None = None
    objective: str = "tau"
    preset: str = "default"
    seed: int = 0
    overrides: dict[str, Any] = field(default_factory=dict)
    max_steps: int | None = None
    val_check_interval: int | float | None = None
    prompts: str = DEFAULT_PROMPTS
    prompts_per_domain: int = 4
    max_new_tokens: int = 64
    temperature: float = 0.0
    n_trials: int = 20
    pruner: Any = "median"
    n_startup_trials: int = 3
    n_warmup_steps: int = 0
    sampler_seed: int | None = None
    heartbeat: int = 60
    max_retries: int = 1
    evaluator: str | None = None
    experiment: str | None = None
    threads: int | None = None
    progress: bool = False

    def check(self) -> "SweepSettings":
        if not isinstance(self.study_name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", self.study_name):
            raise SweepError(f"study name {self.study_name!r} must be letters, digits, '_', '.', '-' "
                             "(it names the storage file and the MLflow experiment)")
        if self.objective not in OBJECTIVES:
            raise SweepError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        presets = sorted(p.stem for p in (project_root() / "experiments" / "configs" / "presets").glob("*.yaml"))
        if self.preset not in presets:
            raise SweepError(f"unknown preset {self.preset!r}; choose one of {presets}")
        for name in ("n_trials", "prompts_per_domain", "max_new_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SweepError(f"{name} must be a positive integer, got {value!r}")
        if self.max_steps is not None and (not isinstance(self.max_steps, int) or self.max_steps < 1):
            raise SweepError(f"max_steps must be a positive integer, got {self.max_steps!r}")
        v = self.val_check_interval
        if v is not None and not ((isinstance(v, int) and v >= 1) or (isinstance(v, float) and 0 < v <= 1)):
            raise SweepError(f"val_check_interval must be a step count >= 1 or a fraction of an epoch in (0, 1], "
                             f"got {v!r}")
        if self.temperature < 0:
            raise SweepError(f"temperature must be >= 0, got {self.temperature}")
        if self.max_retries < 0 or self.heartbeat < 0:
            raise SweepError("max_retries and heartbeat must be >= 0")
        if isinstance(self.pruner, str) and self.pruner not in ("median", "none"):
            raise SweepError(f"pruner must be 'median' or 'none', got {self.pruner!r}")
        parse_prompt_spec(self.prompts)
        return self

    def storage_url(self) -> str:
        return self.storage or default_storage(self.study_name)

    def experiment_name(self) -> str:
        return self.experiment or f"sweep-{self.study_name}"

    def fingerprint(self) -> dict:
        """The settings that define the objective (must agree across a study's workers)."""
        out = {k: copy.deepcopy(getattr(self, k)) for k in OBJECTIVE_FIELDS}
        if callable(out["evaluator"]):
            fn = out["evaluator"]
            out["evaluator"] = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"
        return out


OBJECTIVE_FIELDS = ("objective", "preset", "seed", "overrides", "max_steps", "val_check_interval", "prompts",
                    "prompts_per_domain", "max_new_tokens", "temperature", "evaluator")


def parse_prompt_spec(spec: str) -> list[tuple[str, int | None]]:
    from lit_domino.data.benchmarks import parse_benchmark_list

    try:
        items = parse_benchmark_list(spec)
    except ValueError as err:
        raise SweepError(f"prompts {spec!r}: {err}") from None
    if not items:
        raise SweepError("prompts: at least one benchmark is needed")
    return items


# =========================================================================== storage


def default_storage(study_name: str) -> str:
    return f"sqlite:///{project_root() / 'sweeps' / f'{study_name}.db'}"


def _redact(url: str) -> str:
    return re.sub(r"//([^:/@]+):([^@]+)@", r"//\1:***@", url)


def _journal_path(url: str) -> Path | None:
    if url.startswith("journal:"):
        rest = url[len("journal:"):]
        rest = rest[2:] if rest.startswith("//") else rest
        return Path(rest).expanduser()
    if "://" not in url and url.endswith((".journal", ".log")):
        return Path(url).expanduser()
    return None


def open_storage(url: str, *, heartbeat: int = 0, max_retries: int = 1, create_dirs: bool = False):
    """An Optuna storage for ``url``, or :class:`StorageError` saying why it cannot be opened.

    ``sqlite:///path.db`` / any SQLAlchemy RDB URL → ``RDBStorage`` (heartbeat when > 0);
    ``journal:<path>`` or a path ending ``.journal``/``.log`` → ``JournalStorage`` on a file.
    """
    from optuna.storages import JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
    from optuna.storages.journal import JournalFileBackend

    if not isinstance(url, str) or not url.strip():
        raise StorageError("the storage URL is empty; use sqlite:///path.db, journal:path.journal or an RDB URL")
    hint = ("use sqlite:///<path>.db, journal:<path>.journal (an Optuna journal file) or an RDB URL such as "
            "postgresql://user:password@host/db")
    journal = _journal_path(url)
    if journal is not None:
        journal = journal.resolve()
        if create_dirs:
            journal.parent.mkdir(parents=True, exist_ok=True)
        if not journal.parent.is_dir():
            raise StorageError(f"cannot open the Optuna journal {journal}: directory {journal.parent} does not exist")
        try:
            return JournalStorage(JournalFileBackend(str(journal)))
        except Exception as err:
            raise StorageError(f"cannot open the Optuna journal {journal}: {type(err).__name__}: {err}") from None
    if "://" not in url:
        raise StorageError(f"storage {url!r} is neither a URL nor a journal file; {hint}")
    engine_kwargs = None
    if url.startswith("sqlite:"):
        path = url[len("sqlite:///"):] if url.startswith("sqlite:///") else ""
        if path and path != ":memory:":
            db = Path(path)
            if create_dirs:
                db.parent.mkdir(parents=True, exist_ok=True)
            if not db.parent.is_dir():
                raise StorageError(f"cannot open the Optuna storage {url}: directory {db.parent} does not exist")
        engine_kwargs = {"connect_args": {"timeout": 60}}
    try:
        with _quiet_experimental():
            retry = RetryHeartbeatStaleTrialCallback(max_retry=max_retries) if heartbeat else None
            return RDBStorage(
                url, engine_kwargs=engine_kwargs,
                heartbeat_interval=heartbeat or None, grace_period=2 * heartbeat if heartbeat else None,
                heartbeat_stale_trial_callback=retry,
            )
    except Exception as err:
        raise StorageError(f"cannot open the Optuna storage {_redact(url)}: {type(err).__name__}: "
                           f"{str(err).splitlines()[0] if str(err) else ''}; {hint}") from None


# =========================================================================== study


def make_pruner(settings: SweepSettings) -> optuna.pruners.BasePruner:
    if isinstance(settings.pruner, optuna.pruners.BasePruner):
        return settings.pruner
    if settings.pruner == "none":
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=settings.n_startup_trials,
                                       n_warmup_steps=settings.n_warmup_steps)


def make_sampler(settings: SweepSettings) -> optuna.samplers.BaseSampler:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=settings.sampler_seed, constant_liar=True,
                                          n_startup_trials=max(1, settings.n_startup_trials))


def _diff(stored: Mapping, mine: Mapping) -> list[str]:
    keys = sorted(set(stored) | set(mine))
    return [f"{k}: study has {stored.get(k, '<absent>')!r}, you gave {mine.get(k, '<absent>')!r}"
            for k in keys if stored.get(k, "<absent>") != mine.get(k, "<absent>")]


def check_study(study: optuna.Study, space: SearchSpace, settings: SweepSettings) -> None:
    """Raise :class:`StudyMismatchError` if ``study`` was created with another space or objective settings."""
    attrs = study.user_attrs
    stored = attrs.get(SPACE_ATTR)
    if stored is None:
        if study.trials:
            raise StudyMismatchError(
                f"study {study.study_name!r} exists in this storage with {len(study.trials)} trials but was not "
                "created by lit_domino's sweep (no search space recorded); pick another --study-name")
        return
    stored = json.loads(stored)
    mine = space.to_dict()
    if stored != mine:
        lines = []
        if stored.get("variant") != mine["variant"]:
            lines.append(f"variant: study has {stored.get('variant')!r}, you gave {mine['variant']!r}")
        lines += _diff({k: json.dumps(v, sort_keys=True) for k, v in stored.get("params", {}).items()},
                       {k: json.dumps(v, sort_keys=True) for k, v in mine["params"].items()})
        raise StudyMismatchError(
            f"study {study.study_name!r} exists with a DIFFERENT search space:\n  " + "\n  ".join(lines)
            + "\nuse a new --study-name for a new space, or pass the study's own space file "
              "(`sweeps/domino.py summary` prints it)")
    stored_settings = json.loads(attrs.get(SETTINGS_ATTR, "{}"))
    diff = _diff(stored_settings, json.loads(json.dumps(settings.fingerprint())))
    if diff:
        raise StudyMismatchError(
            f"study {study.study_name!r} was created with other objective settings (every worker of a study must "
            "measure the same objective):\n  " + "\n  ".join(diff))


def create_or_load_study(settings: SweepSettings, space: SearchSpace, *, create: bool = True) -> optuna.Study:
    """Open (or create) the study, recording / checking its search space and objective settings."""
    settings.check()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = settings.storage_url()
    storage = open_storage(url, heartbeat=settings.heartbeat, max_retries=settings.max_retries,
                           create_dirs=settings.storage is None)
    try:
        study = optuna.load_study(study_name=settings.study_name, storage=storage,
                                  sampler=make_sampler(settings), pruner=make_pruner(settings))
    except KeyError:
        if not create:
            raise SweepError(f"no study {settings.study_name!r} in {_redact(url)}") from None
        study = optuna.create_study(study_name=settings.study_name, storage=storage, direction="maximize",
                                    sampler=make_sampler(settings), pruner=make_pruner(settings),
                                    load_if_exists=True)
    check_study(study, space, settings)
    if SPACE_ATTR not in study.user_attrs:
        study.set_user_attr(SPACE_ATTR, space.to_json())
        study.set_user_attr(SETTINGS_ATTR, json.dumps(settings.fingerprint(), sort_keys=True))
        study.set_user_attr("objective", settings.objective)
        study.set_user_attr("variant", space.variant)
    return study


def load_existing_study(study_name: str, storage: str | None = None) -> optuna.Study:
    """An existing study (for ``summary``), with a clear error when it is not there."""
    url = storage or default_storage(study_name)
    store = open_storage(url)
    try:
        return optuna.load_study(study_name=study_name, storage=store)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(store)]
        raise SweepError(f"no study {study_name!r} in {_redact(url)}; studies there: {names or 'none'}") from None


# --------------------------------------------------------------------------- MLflow


def _client(uri: str | None = None):
    """An MLflow client on ``uri`` or the suite's store (``$MLFLOW_TRACKING_URI`` or ``<project>/mlflow.db``,
    the store ``train_variant`` writes to)."""
    from mlflow.tracking import MlflowClient

    from lit_domino.tracking import default_tracking_uri

    uri = uri if isinstance(uri, str) else default_tracking_uri()
    return MlflowClient(uri), uri


def ensure_study_run(study: optuna.Study, settings: SweepSettings, space: SearchSpace) -> str:
    """The study's MLflow run (created once, its id kept as a study user attr), set RUNNING."""
    from lit_domino.tracking import ensure_experiment, flatten_config, log_params

    client, uri = _client(settings)
    run_id = study.user_attrs.get(RUN_ATTR)
    if run_id:
        try:
            run = client.get_run(run_id)
            if run.info.status != "RUNNING":
                client.update_run(run_id, status="RUNNING")
            return run_id
        except Exception as err:  # the MLflow store was reset: start a new study run
            log.warning("study run %s not found in %s (%s); creating a new one", run_id, uri, err)
    exp_id = ensure_experiment(settings.experiment_name(), uri)
    run = client.create_run(exp_id, run_name=settings.study_name, tags={
        "sweep": settings.study_name, "sweep_role": "study", "variant": space.variant, "preset": settings.preset,
        "objective": settings.objective, "optuna.storage": _redact(settings.storage_url()),
    })
    run_id = run.info.run_id
    log_params(client, run_id, {**flatten_config({"settings": settings.fingerprint()}),
                                **{f"space.{p.name}": json.dumps(p.to_dict()) for p in space.params}})
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "space.yaml"
        path.write_text(yaml.safe_dump(space.to_dict(), sort_keys=False))
        client.log_artifact(run_id, str(path))
    study.set_user_attr(RUN_ATTR, run_id)
    study.set_user_attr(EXPERIMENT_ATTR, settings.experiment_name())
    return run_id


def _set_run_status(client, run_id: str | None, status: str, only_if_running: bool = True) -> None:
    if not run_id:
        return
    try:
        run = client.get_run(run_id)
        if not only_if_running or run.info.status == "RUNNING":
            client.set_terminated(run_id, status)
    except Exception as err:
        log.warning("could not set MLflow run %s to %s: %s", run_id, status, err)


# --------------------------------------------------------------------------- recovery


def _worker_identity() -> dict:
    import psutil

    return {"worker_host": socket.gethostname(), "worker_pid": os.getpid(),
            "worker_started": round(psutil.Process().create_time(), 2)}


def _worker_dead(trial) -> bool:
    """A RUNNING trial whose worker process (on this host) is gone."""
    import psutil

    attrs = trial.user_attrs
    if attrs.get("worker_host") != socket.gethostname() or "worker_pid" not in attrs:
        return False
    try:
        proc = psutil.Process(int(attrs["worker_pid"]))
        return abs(proc.create_time() - float(attrs.get("worker_started", proc.create_time()))) > 1.0 \
            or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def stale_trials(study: optuna.Study) -> list:
    """RUNNING trials whose worker process on this host no longer exists."""
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) if _worker_dead(t)]


def _retried_numbers(study: optuna.Study) -> set[int]:
    done = set()
    for t in study.get_trials(deepcopy=False):
        done.update(t.system_attrs.get("retry_history", []))
    return done


def recover_study(study: optuna.Study, settings: SweepSettings, echo: Callable[[str], None] = print) -> dict:
    """After a crash: fail the trials of dead workers, mark their MLflow runs FAILED, retry failed trials once.

    Returns ``{"failed": [numbers], "retried": [numbers]}``.
    """
    from optuna.storages import RetryHeartbeatStaleTrialCallback, fail_stale_trials

    failed = []
    for t in stale_trials(study):
        try:
            if study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                failed.append(t.number)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass
    with _quiet_experimental():
        fail_stale_trials(study)  # heartbeat-stale trials of workers on other hosts (RDB storages)
    client, _ = _client(settings)
    with _quiet_experimental():
        retry = RetryHeartbeatStaleTrialCallback(max_retry=settings.max_retries)
    retried_before = _retried_numbers(study)
    retried = []
    for t in study.get_trials(deepcopy=True, states=(TrialState.FAIL,)):
        run_id = t.user_attrs.get("mlflow_run_id")
        if t.number in failed and run_id:
            try:
                client.set_tag(run_id, "optuna.state", "FAIL")
            except Exception as err:
                log.warning("could not tag MLflow run %s: %s", run_id, err)
        _set_run_status(client, run_id, "FAILED")
        if t.number in retried_before:
            continue
        if len(t.system_attrs.get("retry_history", [])) >= settings.max_retries:
            continue
        with _quiet_experimental():
            retry(study, t)
        retried.append(t.number)
    others = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
    if failed:
        echo(f"resume: trials {failed} were RUNNING on dead workers; marked FAIL")
    if retried:
        echo(f"resume: re-enqueued the parameters of failed trials {retried} (they resume from their last checkpoint)")
    if others:
        echo(f"resume: trials {others} are still RUNNING on live workers (or workers on other hosts; those are "
             f"failed once their heartbeat is {2 * settings.heartbeat}s old)")
    return {"failed": failed, "retried": retried}


class _quiet_experimental:
    def __enter__(self):
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


# =========================================================================== objective


@dataclass
class TrialOutcome:
    """What an evaluator returns: the decoding metrics (``tau``, ``speedup``, ``{domain}/...``) and the
    MLflow run that holds the trial's training (None: the sweep creates the trial's run itself)."""

    metrics: dict[str, float]
    run_id: str | None = None
    from_cache: bool = False
    rows: list[dict] = field(default_factory=list)


@dataclass
class TrialContext:
    """One trial as an evaluator sees it."""

    trial: optuna.Trial
    settings: SweepSettings
    space: SearchSpace
    params: dict[str, Any]
    cfg: dict
    experiment: str
    parent_run_id: str | None
    run_name: str
    run_id: str | None = None

    def set_run(self, run_id: str) -> None:
        """Record the MLflow run of this trial (so a crash can mark it FAILED)."""
        self.run_id = run_id
        self.trial.set_user_attr("mlflow_run_id", run_id)

    def start_run(self) -> str:
        """Create this trial's MLflow run, nested under the study's (for evaluators that do not train
        through ``train_variant``)."""
        from lit_domino.tracking import ensure_experiment, run_tags

        client, uri = _client(self.settings)
        exp_id = ensure_experiment(self.experiment, uri)
        tags = run_tags(self.space.variant, self.settings.preset, self.settings.seed,
                        extra={"mlflow.parentRunId": self.parent_run_id} if self.parent_run_id else None)
        run = client.create_run(exp_id, run_name=self.run_name, tags=tags)
        self.set_run(run.info.run_id)
        return run.info.run_id

    def report(self, value: float, step: int) -> None:
        """Report an intermediate value; raises ``optuna.TrialPruned`` when the pruner says so."""
        self.trial.report(float(value), step=int(step))
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"trial {self.trial.number} pruned at step {step} ({PRUNE_MONITOR}={value:.4g})")

    def pruning_callback(self):
        return PruningCallback(self.trial, PRUNE_MONITOR, context=self)


def PruningCallback(trial, monitor: str = PRUNE_MONITOR, granularity: str = "auto", context=None):
    """``PyTorchLightningPruningCallback`` reporting once per validation at the right step.

    ``granularity``: ``epoch`` (step = ``current_epoch``), ``step`` (step = ``global_step``,
    for ``val_check_interval`` below one epoch or in steps) or ``auto`` (epoch when
    validation runs once per epoch, else step). The upstream callback always reports the
    epoch, so several validations per epoch would report the same step (ignored by
    Optuna after the first). Also records the trial's MLflow run id as soon as training starts.
    """
    from optuna_integration import PyTorchLightningPruningCallback

    class _Pruning(PyTorchLightningPruningCallback):
        def __init__(self):
            super().__init__(trial, monitor)
            if granularity not in ("auto", "epoch", "step"):
                raise ValueError(f"granularity must be auto, epoch or step, got {granularity!r}")
            self.granularity = granularity
            self.context = context
            self.reported: list[tuple[int, float]] = []

        def on_fit_start(self, trainer, pl_module):
            super().on_fit_start(trainer, pl_module)
            run_id = getattr(trainer.logger, "run_id", None)
            if run_id and self.context is not None:
                self.context.set_run(run_id)

        def step_for(self, trainer, pl_module) -> int:
            mode = self.granularity
            if mode == "auto":
                per_epoch = (trainer.check_val_every_n_epoch is not None
                             and trainer.val_check_batch >= trainer.num_training_batches)
                mode = "epoch" if per_epoch else "step"
            return int(pl_module.current_epoch if mode == "epoch" else trainer.global_step)

        def on_validation_end(self, trainer, pl_module):
            if trainer.sanity_checking:
                return
            if self.is_ddp_backend:  # the upstream DDP protocol (epoch steps)
                return super().on_validation_end(trainer, pl_module)
            score = trainer.callback_metrics.get(self.monitor)
            if score is None:
                import warnings

                warnings.warn(f"the metric {self.monitor!r} is not in the validation logs; nothing to prune on")
                return
            step = self.step_for(trainer, pl_module)
            value = float(score)
            if any(step == s for s, _ in self.reported):
                return  # each step is reported once
            self.reported.append((step, value))
            self._trial.report(value, step=step)
            if self._trial.should_prune():
                raise optuna.TrialPruned(f"trial {self._trial.number} pruned at step {step} "
                                         f"({self.monitor}={value:.4g})")

    return _Pruning()


def trial_config(settings: SweepSettings, space: SearchSpace, params: Mapping[str, Any]) -> dict:
    """The merged training config of one trial: variant + preset + seed + fixed overrides + sampled values."""
    from lit_domino.experiment import load_config

    overrides = {**{_config_path(k) if k.startswith("model.") else k: v for k, v in settings.overrides.items()},
                 **space.overrides(params)}
    if settings.max_steps is not None:
        overrides.update({"trainer.max_steps": settings.max_steps, "trainer.max_epochs": -1,
                          "trainer.check_val_every_n_epoch": None,
                          "trainer.val_check_interval": settings.val_check_interval or settings.max_steps})
    elif settings.val_check_interval is not None:
        overrides["trainer.val_check_interval"] = settings.val_check_interval
    cfg = load_config(space.variant, settings.preset, settings.seed, overrides)
    curriculum = cfg["model"].get("init_args", {}).get("curriculum")
    if isinstance(curriculum, dict):
        from lit_domino.objectives import LambdaSchedule

        try:
            LambdaSchedule(**curriculum)
        except (TypeError, ValueError) as err:
            raise SweepError(f"trial config has an invalid λ schedule {curriculum}: {err}") from None
    return cfg


def validation_prompts(settings: SweepSettings) -> dict[str, list]:
    """``{domain: [BenchmarkPrompt]}``: the last ``prompts_per_domain`` prompts of each benchmark."""
    from lit_domino.data.benchmarks import BENCHMARKS, load_benchmark

    out = {}
    for name, n in parse_prompt_spec(settings.prompts):
        if name not in BENCHMARKS:
            raise SweepError(f"unknown benchmark {name!r} in prompts; choose from {sorted(BENCHMARKS)}")
        out[name] = list(load_benchmark(name, n)[-settings.prompts_per_domain:])
    return out


def decode_metrics(drafter_dir: str | Path, target_spec, settings: SweepSettings) -> tuple[dict, list[dict]]:
    """Decode the validation prompts with the drafter (and our AR baseline); flat metrics + benchmark rows.

    ``{benchmark}/tau``, ``{benchmark}/speedup``, ``{benchmark}/accepted_per_round``, ``{benchmark}/tpot_ms``,
    ``{benchmark}/acc_rate_pos_XX`` and the means over benchmarks ``tau``, ``speedup``, ``acc_rate_pos_XX``
    (the ablation's metric names).
    """
    from lit_domino.decoding.metrics import benchmark
    from lit_domino.models.io import load_drafter
    from lit_domino.target import load_target

    target = load_target(target_spec)
    drafter = load_drafter(drafter_dir, target)
    drafter.eval()
    rows = benchmark(target, {"drafter": drafter}, validation_prompts(settings), max_new_tokens=settings.max_new_tokens,
                     temperatures=(settings.temperature,), hf_baseline=False, progress=settings.progress,
                     seed=settings.seed)
    mine = [r for r in rows if r["kind"] == "drafter"]
    metrics: dict[str, float] = {}
    per_key: dict[str, list[float]] = {}
    for r in mine:
        d = r["benchmark"]
        for key, value in r.items():
            if key in ("tau", "speedup", "accepted_per_round", "tpot_ms") or key.startswith("acc_rate_pos_"):
                if isinstance(value, (int, float)) and math.isfinite(value):
                    metrics[f"{d}/{key}"] = float(value)
                    per_key.setdefault(key, []).append(float(value))
    for key, values in per_key.items():
        metrics[key] = sum(values) / len(values)
    return metrics, rows


def train_and_decode(ctx: TrialContext) -> TrialOutcome:
    """The default evaluator: ``train_variant`` (pruned on ``val/tau_sim``) then real decoding."""
    from lit_domino.experiment import train_variant

    callback = ctx.pruning_callback()
    trained = train_variant(ctx.cfg, experiment=ctx.experiment, run_name=ctx.run_name, callbacks=[callback],
                            parent_run_id=ctx.parent_run_id, progress=ctx.settings.progress)
    if trained.run_id and not trained.from_cache:
        ctx.set_run(trained.run_id)
        client, _ = _client(ctx.settings)
        client.update_run(trained.run_id, status="RUNNING")  # decoding still belongs to this run
    metrics, rows = decode_metrics(trained.drafter_dir, ctx.cfg["data"]["target"], ctx.settings)
    for key in ("val/tau_sim", "val/tau_prefix", "val/loss", "train_seconds", "optimizer_steps"):
        if key in trained.report and trained.report[key] is not None:
            metrics.setdefault(key.replace("/", "_") if key.startswith("val/") else f"train/{key}",
                               float(trained.report[key]))
    return TrialOutcome(metrics, trained.run_id, trained.from_cache, rows)


def resolve_evaluator(spec: str | Callable | None) -> Callable[[TrialContext], TrialOutcome]:
    if spec is None:
        return train_and_decode
    if callable(spec):
        return spec
    module, sep, name = str(spec).partition(":")
    if not sep or not module or not name:
        raise SweepError(f"evaluator must be 'module:function', got {spec!r}")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise SweepError(f"cannot import evaluator {spec!r}: {err}") from None
    if not callable(fn):
        raise SweepError(f"evaluator {spec!r} is not callable")
    return fn


def _log_trial(client, run_id: str, ctx: TrialContext, state: str, outcome: TrialOutcome | None = None,
               value: float | None = None) -> None:
    from lit_domino.tracking import log_params

    try:
        client.set_tag(run_id, "sweep", ctx.settings.study_name)
        client.set_tag(run_id, "optuna.trial", str(ctx.trial.number))
        client.set_tag(run_id, "optuna.state", state)
        log_params(client, run_id, {f"trial.{k}": str(v) for k, v in ctx.params.items()})
        if outcome is not None:
            if outcome.from_cache and outcome.run_id:
                client.set_tag(run_id, "drafter_run_id", outcome.run_id)
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            metrics = [Metric(k, float(v), now, 0) for k, v in outcome.metrics.items()
                       if isinstance(v, (int, float)) and math.isfinite(float(v))]
            if value is not None and math.isfinite(value):
                metrics.append(Metric("objective", float(value), now, 0))
            for i in range(0, len(metrics), 500):
                client.log_batch(run_id, metrics=metrics[i:i + 500])
            if outcome.rows:
                client.log_dict(run_id, outcome.rows, "sweep/decode_rows.json")
    except Exception as err:  # tracking trouble never loses a trial result
        log.warning("could not log trial %s to MLflow run %s: %s", ctx.trial.number, run_id, err)


def make_objective(settings: SweepSettings, space: SearchSpace, parent_run_id: str | None,
                   echo: Callable[[str], None] = print) -> Callable[[optuna.Trial], float]:
    evaluator = resolve_evaluator(settings.evaluator)
    experiment = settings.experiment_name()

    def objective(trial: optuna.Trial) -> float:
        for key, value in _worker_identity().items():
            trial.set_user_attr(key, value)
        params = space.suggest(trial)
        retry_of = trial.storage.get_trial_system_attrs(trial._trial_id).get("failed_trial")
        cfg = trial_config(settings, space, params)
        ctx = TrialContext(trial, settings, space, params, cfg, experiment, parent_run_id,
                           f"{settings.study_name}-t{trial.number:03d}")
        echo(f"[trial {trial.number}] start {params}" + (f" (retry of trial {retry_of})" if retry_of is not None
                                                          else ""))
        client, _ = _client(settings)
        t0 = time.time()
        try:
            outcome = evaluator(ctx)
        except optuna.TrialPruned:
            if ctx.run_id:
                _log_trial(client, ctx.run_id, ctx, "PRUNED")
                _set_run_status(client, ctx.run_id, "KILLED", only_if_running=False)
            echo(f"[trial {trial.number}] pruned after {time.time() - t0:.0f}s")
            raise
        except BaseException as err:
            if ctx.run_id:
                _log_trial(client, ctx.run_id, ctx, "FAIL")
                _set_run_status(client, ctx.run_id, "KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED",
                                only_if_running=False)
            raise
        if settings.objective not in outcome.metrics:
            raise SweepError(f"the evaluator returned no {settings.objective!r} metric (got {sorted(outcome.metrics)})")
        value = float(outcome.metrics[settings.objective])
        run_id = ctx.run_id if (ctx.run_id and not outcome.from_cache) else None
        if run_id is None:  # a cached drafter (its run belongs to an earlier trial) or an evaluator without a run
            run_id = ctx.start_run()
            from lit_domino.tracking import flatten_config, log_params

            log_params(client, run_id, flatten_config(cfg))
        _log_trial(client, run_id, ctx, "COMPLETE" if math.isfinite(value) else "FAIL", outcome, value)
        _set_run_status(client, run_id, "FINISHED" if math.isfinite(value) else "FAILED", only_if_running=False)
        for key in ("tau", "speedup"):
            if key in outcome.metrics:
                trial.set_user_attr(key, float(outcome.metrics[key]))
        trial.set_user_attr("mlflow_run_id", run_id)
        if parent_run_id:
            try:
                client.log_metric(parent_run_id, "trial_value", value, step=trial.number)
            except Exception as err:
                log.warning("could not log to the study run: %s", err)
        echo(f"[trial {trial.number}] {settings.objective} = {value:.4f} ({time.time() - t0:.0f}s)")
        return value

    return objective


# =========================================================================== running


def _counts(study: optuna.Study) -> dict[str, int]:
    out = {s.name: 0 for s in TrialState}
    for t in study.get_trials(deepcopy=False):
        out[t.state.name] += 1
    return out


def finished_trials(study: optuna.Study) -> int:
    c = _counts(study)
    return c["COMPLETE"] + c["PRUNED"]


def _enough(study: optuna.Study, n_trials: int) -> bool:
    c = _counts(study)
    return c["COMPLETE"] + c["PRUNED"] + c["RUNNING"] >= n_trials


def prepare_shared_artifacts(settings: SweepSettings, space: SearchSpace) -> None:
    """Build the target, the regenerated data and the prompt set once, before several workers start
    (the artifact cache has no cross-process lock)."""
    if settings.evaluator is not None:
        return
    from lit_domino.experiment import instantiate

    cfg = trial_config(settings, space, _first_values(space))
    dm = instantiate({"class_path": "lit_domino.data.datamodule.DrafterDataModule", "init_args": cfg["data"]})
    dm.prepare_data()
    validation_prompts(settings)


def _first_values(space: SearchSpace) -> dict:
    out = {}
    for p in space.params:
        if p.type == "categorical":
            out[p.name] = p.choices[0]
        elif p.type == "int":
            out[p.name] = int(p.low)
        else:
            out[p.name] = float(p.low)
    return out


def run_worker(settings: SweepSettings, space: SearchSpace, *, resume: bool = False,
               echo: Callable[[str], None] = print) -> optuna.Study:
    """One worker: attach to (or create) the study and run trials until it holds ``n_trials`` finished ones.

    ``resume``: first recover from a crash (:func:`recover_study`). An exception in a
    trial fails that trial, marks its MLflow run FAILED and stops this worker (rerun with
    ``--resume`` to retry it).
    """
    if settings.threads:
        import torch

        torch.set_num_threads(int(settings.threads))
    study = create_or_load_study(settings, space)
    if resume:
        recover_study(study, settings, echo)
    else:
        stale = stale_trials(study)
        if stale:
            echo(f"note: trials {[t.number for t in stale]} are RUNNING on dead workers; rerun with --resume to retry")
    parent = ensure_study_run(study, settings, space)
    client, _ = _client(settings)
    done = finished_trials(study)
    if _enough(study, settings.n_trials) and not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if done >= settings.n_trials:
            echo(f"study {settings.study_name!r} already has {done} finished trials (target {settings.n_trials}); "
                 "raise --n-trials to run more")
        else:
            running = _counts(study)["RUNNING"]
            echo(f"study {settings.study_name!r}: {done} finished + {running} running trials cover the target "
                 f"{settings.n_trials}; nothing to start (if those workers died, rerun with --resume)")
        _finish_study_run(study, settings, client, parent)
        return study
    echo(f"study {settings.study_name!r}: {done}/{settings.n_trials} finished trials; storage "
         f"{_redact(settings.storage_url())}; MLflow experiment {settings.experiment_name()!r}")

    def stop_when_done(study_: optuna.Study, trial) -> None:
        if trial.state == TrialState.COMPLETE:
            try:
                client.log_metric(parent, "best_value", study_.best_value, step=trial.number)
            except Exception:
                pass
        if _enough(study_, settings.n_trials):
            study_.stop()

    objective = make_objective(settings, space, parent, echo)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study.optimize(objective, n_trials=None, callbacks=[stop_when_done], gc_after_trial=True)
    except BaseException:
        if not study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            _set_run_status(client, parent, "FAILED")
        raise
    _finish_study_run(study, settings, client, parent)
    return study


def _finish_study_run(study, settings, client, parent) -> None:
    c = _counts(study)
    if c["RUNNING"] == 0 and c["WAITING"] == 0 and c["COMPLETE"] + c["PRUNED"] >= settings.n_trials:
        try:
            client.log_metric(parent, "finished_trials", c["COMPLETE"] + c["PRUNED"])
            if c["COMPLETE"]:
                client.log_metric(parent, "best_value", study.best_value, step=study.best_trial.number)
                client.set_tag(parent, "best_trial", str(study.best_trial.number))
        except Exception as err:
            log.warning("could not log the study summary to MLflow: %s", err)
        _set_run_status(client, parent, "FINISHED")


# =========================================================================== summary


def summarize(study: optuna.Study, out_dir: str | Path | None = None, *, log_to_mlflow: bool = True,
              tracking_uri: str | None = None, echo: Callable[[str], None] = print) -> dict:
    """Print the best trial and parameter importances; write the Optuna plots (PNG) and log them to the
    study's MLflow run. Returns ``{"best": ..., "importances": ..., "plots": [paths], "counts": ...}``."""
    import matplotlib.pyplot as plt  # the CLI runs headless (MPLBACKEND=Agg); a notebook keeps its backend

    out = Path(out_dir) if out_dir else project_root() / "results" / "sweeps" / study.study_name
    out.mkdir(parents=True, exist_ok=True)
    counts = {k: v for k, v in _counts(study).items() if v}
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    objective = study.user_attrs.get("objective", "value")
    echo(f"study {study.study_name!r}: {sum(counts.values())} trials {counts}; objective = {objective} (maximize)")
    result: dict[str, Any] = {"counts": counts, "best": None, "importances": None, "plots": []}
    space = study.user_attrs.get(SPACE_ATTR)
    if space:
        result["space"] = json.loads(space)
        echo("search space of this study (reuse it with --space):")
        echo("  " + yaml.safe_dump(result["space"], sort_keys=False).rstrip().replace("\n", "\n  "))
    if not complete:
        echo("no completed trials yet: nothing to summarise")
        return result
    best = study.best_trial
    result["best"] = {"number": best.number, "value": best.value, "params": best.params,
                      "mlflow_run_id": best.user_attrs.get("mlflow_run_id"),
                      **{k: best.user_attrs[k] for k in ("tau", "speedup") if k in best.user_attrs}}
    echo(f"best trial #{best.number}: {objective} = {best.value:.4f}")
    for k, v in best.params.items():
        echo(f"  {k:>20} = {v}")
    if best.user_attrs.get("mlflow_run_id"):
        echo(f"  MLflow run {best.user_attrs['mlflow_run_id']}")
    plots = {}
    with _quiet_experimental():
        import warnings

        warnings.simplefilter("ignore")
        from optuna.visualization import matplotlib as ovm

        if len(complete) < 2:
            echo(f"parameter importances: need at least 2 completed trials (have {len(complete)})")
        else:
            try:
                imp = optuna.importance.get_param_importances(study)
                result["importances"] = dict(imp)
                echo("parameter importances:")
                for k, v in imp.items():
                    echo(f"  {k:>20}  {v:.3f}")
                plots["importances"] = ovm.plot_param_importances
            except Exception as err:
                echo(f"parameter importances unavailable: {type(err).__name__}: {err}")
        plots["history"] = ovm.plot_optimization_history
        plots["slice"] = ovm.plot_slice
        if any(t.intermediate_values for t in study.get_trials(deepcopy=False)):
            plots["intermediate_values"] = ovm.plot_intermediate_values
        for name, fn in plots.items():
            try:
                ax = fn(study)
                fig = (ax.flat[0] if hasattr(ax, "flat") else ax).figure
                from matplotlib.ticker import NullFormatter

                for a in fig.axes:  # log axes: major ticks only (minor labels overlap)
                    if a.get_xscale() == "log":
                        a.xaxis.set_minor_formatter(NullFormatter())
                path = out / f"{name}.png"
                fig.savefig(path, dpi=100, bbox_inches="tight")
                plt.close(fig)
                result["plots"].append(path)
            except Exception as err:
                echo(f"plot {name} skipped: {type(err).__name__}: {err}")
    (out / "summary.json").write_text(json.dumps({k: v for k, v in result.items() if k != "plots"}, indent=2,
                                                 default=str))
    echo(f"plots: {', '.join(str(p) for p in result['plots'])}")
    run_id = study.user_attrs.get(RUN_ATTR)
    if log_to_mlflow and run_id:
        try:
            client, _ = _client(tracking_uri)
            for path in [*result["plots"], out / "summary.json"]:
                client.log_artifact(run_id, str(path), "optuna")
            if result["importances"]:
                for k, v in result["importances"].items():
                    client.log_metric(run_id, f"importance/{k}", float(v))
            echo(f"logged to MLflow run {run_id} (artifacts optuna/)")
        except Exception as err:
            echo(f"could not log the plots to MLflow: {err}")
    return result


def settings_dict(settings: SweepSettings) -> dict:
    d = asdict(settings)
    if not isinstance(d.get("pruner"), str):
        d["pruner"] = type(settings.pruner).__name__
    return d

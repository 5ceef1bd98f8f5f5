"""The settings of a sweep worker (:class:`SweepSettings`): defaults, checks, and the fingerprint of the
objective that every worker of one study must share (:data:`OBJECTIVE_FIELDS`)."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from lit_domino.data.benchmarks import parse_benchmark_list
from lit_domino.studies.sweep.space import SweepError
from lit_domino.studies.sweep.storage import default_storage

OBJECTIVES = ("tau", "speedup")
DEFAULT_PROMPTS = "embedded-math,embedded-code,embedded-chat"


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
        heartbeat: Optuna's RDB heartbeat interval in seconds: a RUNNING trial whose heartbeat is
            older than 2 intervals (its worker died, on any host) is failed and retried; 0 disables
            it (then ``--resume`` takes every RUNNING trial for a dead worker's). Journal storages
            have no heartbeat in Optuna 5.
        max_retries: how often a crashed trial's parameters are retried
            (``optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=...)``).
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
        from lit_domino.training.configs import PRESETS  # torch-free

        if self.preset not in PRESETS:
            raise SweepError(f"unknown preset {self.preset!r}; choose one of {list(PRESETS)}")
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
    try:
        items = parse_benchmark_list(spec)
    except ValueError as err:
        raise SweepError(f"prompts {spec!r}: {err}") from None
    if not items:
        raise SweepError("prompts: at least one benchmark is needed")
    return items

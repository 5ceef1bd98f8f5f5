"""One trial: its config, the default evaluator (train, then decode for real), pruning, and the Optuna
objective that wraps an evaluator with the MLflow bookkeeping.

A trial (:func:`train_and_decode`, the default *evaluator*):

1. samples the space and writes the values into the merged variant + preset config
   (:func:`trial_config`, via ``lit_domino.training.configs.load_config``);
2. trains through ``lit_domino.training.experiment.train_variant`` (artifact cache: an identical config
   is reused; a retried trial resumes from ``last.ckpt``), with :class:`PruningCallback`
   reporting ``val/tau_sim`` once per validation — step = the epoch when validation runs once
   per epoch, the optimizer step when it runs every ``val_check_interval`` steps/fraction of an epoch;
3. decodes a *validation* prompt set for real (:func:`decode_metrics`) and returns the mean over
   domains of ``tau`` (or ``speedup``).

Validation prompts are taken from the END of each embedded eval set, so the first prompts of
each set — the ablation's test prompts — stay unseen by the sweep.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import socket
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import optuna
from optuna_integration import PyTorchLightningPruningCallback

from lit_domino.data.benchmarks import BENCHMARKS, load_benchmark
from lit_domino.decoding.harness import benchmark
from lit_domino.training.configs import load_config
from lit_domino.training.experiment import train_variant
from lit_domino.interop import load_drafter
from lit_domino.decoding.metric_names import drafter_metrics
from lit_domino.models.objectives import LambdaSchedule
from lit_domino.studies.sweep.settings import SweepSettings, parse_prompt_spec
from lit_domino.studies.sweep.space import SearchSpace, SweepError, config_key
from lit_domino.studies.sweep.storage import get_trial, retry_history
from lit_domino.studies.sweep.tracking import log_trial, mark_run_failed, mlflow_client, set_run_status, start_trial_run
from lit_domino.target.load import load_target
from lit_domino.runtime.tracking import flatten_config, log_params

log = logging.getLogger(__name__)

PRUNE_MONITOR = "val/tau_sim"


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
        run_id = start_trial_run(self.experiment, self.run_name, self.space.variant, self.settings,
                                 self.parent_run_id)
        self.set_run(run_id)
        return run_id

    def report(self, value: float, step: int) -> None:
        """Report an intermediate value; raises ``optuna.TrialPruned`` when the pruner says so."""
        self.trial.report(float(value), step=int(step))
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"trial {self.trial.number} pruned at step {step} ({PRUNE_MONITOR}={value:.4g})")

    def pruning_callback(self) -> PruningCallback:
        return PruningCallback(self.trial, PRUNE_MONITOR, context=self)


class PruningCallback(PyTorchLightningPruningCallback):
    """``PyTorchLightningPruningCallback`` reporting once per validation at the right step.

    ``granularity``: ``epoch`` (step = ``current_epoch``), ``step`` (step = ``global_step``,
    for ``val_check_interval`` below one epoch or in steps) or ``auto`` (epoch when
    validation runs once per epoch, else step). The upstream callback always reports the
    epoch, so several validations per epoch would report the same step (ignored by
    Optuna after the first). Also records the trial's MLflow run id as soon as training starts.
    """

    def __init__(self, trial: optuna.Trial, monitor: str = PRUNE_MONITOR, granularity: str = "auto",
                 context: TrialContext | None = None):
        super().__init__(trial, monitor)
        if granularity not in ("auto", "epoch", "step"):
            raise ValueError(f"granularity must be auto, epoch or step, got {granularity!r}")
        self.trial = trial
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
            warnings.warn(f"the metric {self.monitor!r} is not in the validation logs; nothing to prune on")
            return
        step = self.step_for(trainer, pl_module)
        value = float(score)
        if any(step == s for s, _ in self.reported):
            return  # each step is reported once
        self.reported.append((step, value))
        self.trial.report(value, step=step)
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"trial {self.trial.number} pruned at step {step} ({self.monitor}={value:.4g})")


def trial_config(settings: SweepSettings, space: SearchSpace, params: Mapping[str, Any]) -> dict:
    """The merged training config of one trial: variant + preset + seed + fixed overrides + sampled values."""
    overrides = {**{config_key(k) if k.startswith("model.") else k: v for k, v in settings.overrides.items()},
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
        try:
            LambdaSchedule(**curriculum)
        except (TypeError, ValueError) as err:
            raise SweepError(f"trial config has an invalid λ schedule {curriculum}: {err}") from None
    return cfg


def validation_prompts(settings: SweepSettings) -> dict[str, list]:
    """``{domain: [BenchmarkPrompt]}``: the last ``prompts_per_domain`` prompts of each benchmark."""
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
    target = load_target(target_spec)
    drafter = load_drafter(drafter_dir, target)
    drafter.eval()
    rows = benchmark(target, {"drafter": drafter}, validation_prompts(settings), max_new_tokens=settings.max_new_tokens,
                     temperatures=(settings.temperature,), hf_baseline=False, progress=settings.progress,
                     seed=settings.seed)
    metrics = drafter_metrics([r for r in rows if r["kind"] == "drafter"])  # the study layer's names and means
    return metrics, rows


def train_and_decode(ctx: TrialContext) -> TrialOutcome:
    """The default evaluator: ``train_variant`` (pruned on ``val/tau_sim``) then real decoding."""
    callback = ctx.pruning_callback()
    trained = train_variant(ctx.cfg, experiment=ctx.experiment, run_name=ctx.run_name, callbacks=[callback],
                            parent_run_id=ctx.parent_run_id, progress=ctx.settings.progress)
    if trained.run_id and not trained.from_cache:
        ctx.set_run(trained.run_id)
        client, _ = mlflow_client()
        client.update_run(trained.run_id, status="RUNNING")  # decoding still belongs to this run
    metrics, rows = decode_metrics(trained.drafter_dir, ctx.cfg["data"]["target"], ctx.settings)
    for key in ("val/tau_sim", "val/tau_prefix", "val/loss", "train_seconds", "optimizer_steps"):
        if key in trained.report and trained.report[key] is not None:
            metrics.setdefault(key.replace("/", "_") if key.startswith("val/") else f"train/{key}",
                               float(trained.report[key]))
    return TrialOutcome(metrics, trained.run_id, trained.from_cache, rows)


def resolve_evaluator(spec: str | Callable | None) -> Callable[[TrialContext], TrialOutcome]:
    """``None`` → :func:`train_and_decode`; a callable as is; ``module:function`` imported."""
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


def make_objective(study: optuna.Study, settings: SweepSettings, space: SearchSpace, parent_run_id: str | None,
                   echo: Callable[[str], None] = print) -> Callable[[optuna.Trial], float]:
    """The function ``study.optimize`` runs: sample, evaluate, log the trial's MLflow run and end it
    FINISHED / FAILED / KILLED (pruned: tag ``optuna.state=PRUNED``)."""
    evaluator = resolve_evaluator(settings.evaluator)
    experiment = settings.experiment_name()

    def objective(trial: optuna.Trial) -> float:
        trial.set_user_attr("worker_host", socket.gethostname())  # provenance only (liveness: Optuna's heartbeat)
        trial.set_user_attr("worker_pid", os.getpid())
        params = space.suggest(trial)
        history = retry_history(get_trial(study, trial.number))
        client, _ = mlflow_client()
        if history:  # a live worker may have failed the previous attempt (stale heartbeat): its run ends FAILED
            mark_run_failed(client, get_trial(study, history[-1]).user_attrs.get("mlflow_run_id"))
            trial.set_user_attr("mlflow_run_id", None)  # copied from the attempt; this trial records its own run
        cfg = trial_config(settings, space, params)
        ctx = TrialContext(trial, settings, space, params, cfg, experiment, parent_run_id,
                           f"{settings.study_name}-t{trial.number:03d}")
        echo(f"[trial {trial.number}] start {params}" + (f" (retry of trial {history[0]})" if history else ""))

        def record(run_id: str, state: str, outcome: TrialOutcome | None = None, value: float | None = None) -> None:
            log_trial(client, run_id, study_name=settings.study_name, number=trial.number, params=params,
                      state=state, outcome=outcome, value=value)

        t0 = time.time()
        try:
            outcome = evaluator(ctx)
        except optuna.TrialPruned:
            if ctx.run_id:
                record(ctx.run_id, "PRUNED")
                set_run_status(client, ctx.run_id, "KILLED", only_if_running=False)
            echo(f"[trial {trial.number}] pruned after {time.time() - t0:.0f}s")
            raise
        except BaseException as err:
            if ctx.run_id:
                record(ctx.run_id, "FAIL")
                set_run_status(client, ctx.run_id, "KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED",
                               only_if_running=False)
            raise
        if settings.objective not in outcome.metrics:
            raise SweepError(f"the evaluator returned no {settings.objective!r} metric (got {sorted(outcome.metrics)})")
        value = float(outcome.metrics[settings.objective])
        run_id = ctx.run_id if (ctx.run_id and not outcome.from_cache) else None
        if run_id is None:  # a cached drafter (its run belongs to an earlier trial) or an evaluator without a run
            run_id = ctx.start_run()
            log_params(client, run_id, flatten_config(cfg))
        record(run_id, "COMPLETE" if math.isfinite(value) else "FAIL", outcome, value)
        set_run_status(client, run_id, "FINISHED" if math.isfinite(value) else "FAILED", only_if_running=False)
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

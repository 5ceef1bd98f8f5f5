"""Optuna sweeps over the Domino head: search space, objective, study creation/resume, summary.

``sweeps/domino.py`` (:mod:`lit_domino.studies.sweep_command`) is the thin CLI over this package; ``sweeps/space.yaml`` the default search
space. One *study* is a set of trials in an Optuna storage (SQLite ``sqlite:///sweeps/<study>.db``
by default, an Optuna journal file ``journal:<path>`` / ``<path>.journal``, or any RDB URL) plus
one MLflow experiment ``sweep-<study>`` holding the study's run (``sweep_role=study``) and, nested
under it (``mlflow.parentRunId``), one run per trial with its params, training curves and
decoding metrics.

Modules, one concern each:

* :mod:`~lit_domino.studies.sweep.space` — the search-space YAML (:class:`SearchSpace`, :class:`ParamSpec`)
  and the sweep's errors;
* :mod:`~lit_domino.studies.sweep.settings` — :class:`SweepSettings`, their checks and the objective's fingerprint;
* :mod:`~lit_domino.studies.sweep.storage` — storage URLs, :func:`open_storage` (Optuna's heartbeat and
  retry), creating / loading / checking a study;
* :mod:`~lit_domino.studies.sweep.tracking` — the MLflow study run and the nested trial runs;
* :mod:`~lit_domino.studies.sweep.objective` — a trial's config, the train-and-decode evaluator, pruning;
* :mod:`~lit_domino.studies.sweep.worker` — running workers, the stop condition, recovery after a crash;
* :mod:`~lit_domino.studies.sweep.summary` — best trial, importances, plots.

Crash handling: Optuna's heartbeat (RDB storages): a RUNNING trial whose worker stopped beating
for 2 ``heartbeat`` intervals is failed and its parameters re-enqueued once
(``RetryHeartbeatStaleTrialCallback``); ``--resume`` (:func:`recover_study`) does so for the trials
of dead workers, marks their MLflow runs FAILED and also retries trials failed by an exception, so a
resumed sweep retrains the same configuration from its last checkpoint. ``n_trials`` is the study's
total of finished (COMPLETE + PRUNED) trials, shared by all workers.
"""

from lit_domino.studies.sweep.objective import (
    PRUNE_MONITOR,
    PruningCallback,
    TrialContext,
    TrialOutcome,
    decode_metrics,
    make_objective,
    resolve_evaluator,
    train_and_decode,
    trial_config,
    validation_prompts,
)
from lit_domino.studies.sweep.settings import DEFAULT_PROMPTS, OBJECTIVE_FIELDS, OBJECTIVES, SweepSettings, parse_prompt_spec
from lit_domino.studies.sweep.space import (
    DEFAULT_SPACE_FILE,
    LAMBDA_KINDS,
    ParamSpec,
    SearchSpace,
    SearchSpaceError,
    StorageError,
    StudyMismatchError,
    SweepError,
    load_space,
    parse_param,
    parse_space,
)
from lit_domino.studies.sweep.storage import (
    SETTINGS_ATTR,
    SPACE_ATTR,
    check_study,
    create_or_load_study,
    default_storage,
    finished_trials,
    load_existing_study,
    make_pruner,
    make_sampler,
    open_storage,
    trial_counts,
)
from lit_domino.studies.sweep.summary import summarize
from lit_domino.studies.sweep.tracking import EXPERIMENT_ATTR, RUN_ATTR, ensure_study_run, finish_study_run
from lit_domino.studies.sweep.worker import (
    launch_workers,
    prepare_shared_artifacts,
    recover_study,
    run_sweep,
    run_worker,
    target_covered,
)

__all__ = [
    "DEFAULT_PROMPTS", "DEFAULT_SPACE_FILE", "EXPERIMENT_ATTR", "LAMBDA_KINDS", "OBJECTIVES", "OBJECTIVE_FIELDS",
    "PRUNE_MONITOR", "ParamSpec", "PruningCallback", "RUN_ATTR", "SETTINGS_ATTR", "SPACE_ATTR", "SearchSpace",
    "SearchSpaceError", "StorageError", "StudyMismatchError", "SweepError", "SweepSettings", "TrialContext",
    "TrialOutcome", "check_study", "create_or_load_study", "decode_metrics", "default_storage", "ensure_study_run",
    "finish_study_run", "finished_trials", "launch_workers", "load_existing_study", "load_space", "make_objective",
    "make_pruner", "make_sampler", "open_storage", "parse_param", "parse_prompt_spec", "parse_space",
    "prepare_shared_artifacts", "recover_study", "resolve_evaluator", "run_sweep", "run_worker", "summarize",
    "target_covered", "train_and_decode", "trial_config", "trial_counts", "validation_prompts",
]

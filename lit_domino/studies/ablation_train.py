"""The ablation's stage 2: every variant x seed trained (or found cached), in this process or in worker processes
(:func:`~lit_domino.runtime.jobs.run_in_workers`), stopped as a whole by Ctrl-C or SIGTERM, KILLED and resumable."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from lit_domino.runtime import cache
from lit_domino.runtime.jobs import STOP_TIMEOUT, JobEvents, run_in_workers  # noqa: F401 (STOP_TIMEOUT: re-export)
from lit_domino.runtime.quiet import verbose
from lit_domino.training.configs import EMBEDDED_PREFIX
from lit_domino.studies.common import stage_log

if TYPE_CHECKING:
    from lit_domino.runtime.jobclock import JobClock
    from lit_domino.training.datamodule import DrafterDataModule

INTERRUPTED = "rerun the same command to resume"


log_line = stage_log("ablation")
"""This study's log line: ``[ablation <seconds>s] msg``."""


def training_jobs(jobs: int | str, configs: list[dict]) -> int:
    """How many trainings run at once: ``auto`` = one per usable CPU core, at most 2 and at most one per
    training, when the trainings run on the CPU (a 1-thread training uses a core better than half of a
    2-thread one: tiny models scale badly across threads); 1 on accelerators. An int is taken as given."""
    import torch

    from lit_domino.runtime.threads import usable_cpus

    if jobs != "auto":
        if int(jobs) < 1:
            raise ValueError(f"jobs must be >= 1 or 'auto', got {jobs!r}")
        return int(jobs)
    on_cpu = all(c["trainer"].get("accelerator") == "cpu" or
                 (c["trainer"].get("accelerator") in ("auto", None) and not torch.cuda.is_available()) for c in configs)
    return max(1, min(2, usable_cpus(), len(configs))) if on_cpu else 1


def target_load_state(spec: str) -> str | None:
    """``"shipped"`` / ``"cached"`` when loading ``spec`` trains nothing (a local or hub model: ``"cached"``),
    None when the embedded target's recipe trains it here."""
    if not spec.startswith(EMBEDDED_PREFIX):
        return "cached"
    from lit_domino.target.load import embedded_target_state
    return embedded_target_state(spec[len(EMBEDDED_PREFIX):])


def data_modules(configs: list[dict]) -> list[tuple[str, DrafterDataModule]]:
    """One DataModule per distinct data the trainings read (the seeds and the variants of one feature rule
    share it), named for the log: regenerating and caching it once, here, before the trainings fan out,
    keeps the parallel workers from waiting on each other's data locks."""
    from lit_domino.training.configs import module_class, resolve_feature_rule
    from lit_domino.training.datamodule import DrafterDataModule, regen_options

    seen, out = set(), []
    for cfg in configs:
        data = resolve_feature_rule(dict(cfg["data"]), module_class(cfg),  # an objective may need p's layer
                                    ((cfg.get("model") or {}).get("init_args") or {}).get("objective"))
        key = json.dumps({k: v for k, v in data.items() if k not in ("seed", "batch_size", "num_anchors",
                                                                    "group_by_length", "num_workers")},
                         sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        dm = DrafterDataModule(**data)
        dm.regen_options = regen_options(cfg["tracking"].get("variant"), cfg["tracking"].get("preset"),
                                         cfg.get("seed_everything"))  # named by a missing set's error
        out.append((f"features {data['feature_rule']} {dm.feature_layers}", dm))
    return out


def training_names(configs: list[dict]) -> list[str]:
    return [f"train {c['tracking']['variant']} s{c['seed_everything']}" for c in configs]


def plan_trainings(configs: list[dict], clock: JobClock, reference: dict) -> list[int]:
    """Put every training on the clock (before the job's first stage, so that every ETA counts them);
    returns the indices of those not in the cache."""
    from lit_domino.training.experiment import drafter_artifact

    todo = [i for i, c in enumerate(configs) if not cache.is_complete(drafter_artifact(c), warn=False)]
    for i, (name, cfg) in enumerate(zip(training_names(configs), configs)):
        clock.plan(name, reference.get("train", {}).get(cfg["tracking"]["variant"], 0.0), cached=i not in todo,
                   parallel=clock.jobs > 1 and len(todo) > 1)
    return todo


def train_all(configs: list[dict], experiment: str, clock: JobClock, reference: dict, progress: bool,
              parent_run_id: str | None = None) -> list:
    """Train (or find cached) every config; ``clock.jobs`` at once in worker processes, the longest first
    (by reference seconds) so the workers finish together. Returns the trained drafters in config order.
    ``parent_run_id``: the study run the new training runs are nested under.

    A training that fails lets the others running finish (nothing half-trained is lost: they resume from
    checkpoints anyway), then its error is raised."""
    from lit_domino.training.cli import CHECKPOINT_DIR, recorded_run
    from lit_domino.training.distributed import is_distributed
    from lit_domino.training.experiment import drafter_artifact, interruptible, train_variant

    t0 = clock.t0
    names = training_names(configs)
    todo = plan_trainings(configs, clock, reference)
    if any(is_distributed(c) for c in configs):  # DDP: Lightning's extra ranks re-run the calling script, never this one
        return _train_distributed(configs, experiment, clock, names, progress, parent_run_id)
    parallel = clock.jobs > 1 and len(todo) > 1
    states = {}
    for i, (name, cfg) in enumerate(zip(names, configs)):
        path = drafter_artifact(cfg)
        states[name] = (" (cached)" if i not in todo else
                        " (resuming from its last checkpoint)" if (path / CHECKPOINT_DIR / "last.ckpt").exists() else
                        " (restarting its interrupted MLflow run)" if recorded_run(path / CHECKPOINT_DIR)[0]
                        else "")
    total = len(configs)
    results: dict[int, object] = {}
    with interruptible(hint=False):  # SIGINT/SIGTERM: every training stops KILLED and resumable, then one line
        for i, (name, cfg) in enumerate(zip(names, configs)):
            if parallel and i in todo:
                continue  # trained below, in the workers
            log_line(f"stage 2/4 train [{i + 1}/{total}] {name[6:]}{states[name]}; {clock.eta()}", t0)
            clock.start(name)
            try:
                results[i] = train_variant(cfg, experiment=experiment, progress=progress, parent_run_id=parent_run_id)
            except KeyboardInterrupt as err:
                log_line(_interrupted(name[6:], err), t0)
                raise KeyboardInterrupt(INTERRUPTED) from None
            clock.finish(name, cached=results[i].from_cache)
        if len(results) == total:
            return [results[i] for i in range(total)]
        _train_in_workers(configs, experiment, clock, todo, states, results, parent_run_id)
    return [results[i] for i in range(total)]


def _train_distributed(configs: list[dict], experiment: str, clock: JobClock, names: list[str], progress: bool,
                       parent_run_id: str | None) -> list:
    """Every training in one launch of ``lit_domino.training.distributed`` (all ranks train each config in turn)."""
    from lit_domino.training.distributed import train_distributed

    strategy = configs[0]["trainer"].get("strategy")
    log_line(f"stage 2/4 train {len(configs)} drafters under trainer.strategy={strategy}, devices="
         f"{configs[0]['trainer'].get('devices')} (one launch: lit_domino.training.distributed); {clock.eta()}", clock.t0)
    for name in names:
        clock.start(name)
    trained = train_distributed(configs, experiment, parent_run_id=parent_run_id, progress=progress)
    for name, t in zip(names, trained):
        clock.finish(name, cached=t.from_cache)
    return trained


def _interrupted(name: str, err: BaseException) -> str:
    """The log line of a training that stopped at an interrupt."""
    step = getattr(err, "step", None)
    return f"stage 2/4 train {name} interrupted{'' if step is None else f' at step {step}'}; the rerun resumes it"


def _mark_killed(artifact: Path) -> None:
    """The MLflow run of a training whose worker had to be killed: KILLED rather than left RUNNING."""
    from lit_domino.runtime.tracking import open_client
    from lit_domino.training.cli import CHECKPOINT_DIR, RUN_ID_FILE

    try:
        run_id = (artifact / CHECKPOINT_DIR / RUN_ID_FILE).read_text().strip()
        client = open_client()
        if client.get_run(run_id).info.status == "RUNNING":
            client.set_terminated(run_id, "KILLED")
    except Exception as err:  # noqa: BLE001 (best effort, never masks the interrupt)
        logging.getLogger(__name__).warning("could not mark the MLflow run of %s KILLED: %s", artifact, err)


def _train_worker_setup() -> None:
    """A training worker: SIGINT and SIGTERM stop its training at the next batch, quietly (the parent prints the
    one line), and only Lightning's warnings (the parent logs the stages)."""
    from lit_domino.training.experiment import install_stop_handlers

    install_stop_handlers(hint=False)
    if not verbose():  # the trainings' own output goes to their train.log (runtime/quiet.py)
        logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
        logging.getLogger("lightning.fabric").setLevel(logging.WARNING)


def _train_in_worker(cfg: dict, experiment: str, parent_run_id: str | None = None):
    from lit_domino.training.experiment import train_variant

    return train_variant(cfg, experiment=experiment, progress=False, parent_run_id=parent_run_id)


class _TrainingLog(JobEvents):
    """The log lines (and the clock) of the trainings in the workers; a killed training's run marked KILLED."""

    def __init__(self, configs: list[dict], clock: JobClock, todo: list[int], states: dict):
        self.configs, self.clock, self.todo, self.states = configs, clock, todo, states
        self.names, self.t0, self.submitted = training_names(configs), clock.t0, 0

    def name(self, i: int) -> str:
        return self.names[i][6:]

    def start(self, i):
        self.submitted += 1
        self.clock.start(self.names[i])
        log_line(f"stage 2/4 train [{self.submitted}/{len(self.todo)}] {self.name(i)}{self.states[self.names[i]]} "
             f"started; {self.clock.eta()}", self.t0)

    def done(self, i, result):
        seconds = self.clock.finish(self.names[i], cached=result.from_cache)
        log_line(f"stage 2/4 train {self.name(i)} done in {seconds / 60:.1f} min; {self.clock.eta()}", self.t0)

    def failed(self, i, err):
        log_line(f"stage 2/4 train {self.name(i)} failed: {err!r}", self.t0)

    def interrupted(self, i, err):
        log_line(_interrupted(self.name(i), err), self.t0)

    def finished_while_stopping(self, i):
        log_line(f"stage 2/4 train {self.name(i)} finished before it could stop", self.t0)

    def failed_while_stopping(self, i, err):
        log_line(f"stage 2/4 train {self.name(i)} failed while stopping: {err!r}", self.t0)

    def killed(self, i):
        from lit_domino.training.experiment import drafter_artifact

        _mark_killed(drafter_artifact(self.configs[i]))
        log_line(f"stage 2/4 train {self.name(i)} did not stop: killed; the rerun resumes it", self.t0)

    def never_started(self, i):
        log_line(f"stage 2/4 train {self.name(i)} stopped before it started", self.t0)


def _train_in_workers(configs: list[dict], experiment: str, clock: JobClock, todo: list[int], states: dict,
                      results: dict, parent_run_id: str | None = None) -> None:
    """The trainings ``todo`` in ``clock.jobs`` spawned worker processes, into ``results``; see :func:`train_all`.
    An interrupt (here or in a worker) stops every training (:func:`~lit_domino.runtime.jobs.stop_workers`), then
    raises one ``KeyboardInterrupt``."""
    from lit_domino.runtime.threads import usable_cpus
    from lit_domino.training.experiment import stop_requested

    names = training_names(configs)
    order = sorted(todo, key=lambda i: -clock.stages[names[i]].reference)
    threads = max(1, usable_cpus() // clock.jobs)
    log_line(f"stage 2/4 train {len(todo)} drafters, {clock.jobs} at a time in worker processes ({threads} thread(s) "
         f"each; progress bars off); {clock.eta()}", clock.t0)
    try:
        run_in_workers(_train_in_worker, {i: (configs[i], experiment, parent_run_id) for i in todo}, order,
                       clock.jobs, threads, _TrainingLog(configs, clock, todo, states), setup=_train_worker_setup,
                       stop_signal=stop_requested, results=results)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(INTERRUPTED) from None

"""The ablation study: train every variant, decode for real, rebuild the papers' tables.

Stages (each visible as it runs, each cached):

1. the target (``load_target``: the embedded tiny Qwen3 is built once and cached);
2. every variant x seed trained through the one DataModule (``experiment.train_variant``:
   a finished drafter with the same config is reused, a killed one resumes);
3. real speculative decoding of every drafter on every benchmark, all methods
   interleaved per prompt in one process against our AR baseline and HF ``generate``
   (plus HF prompt-lookup and HF assisted generation with the small draft LM); the
   measured rows are cached under a key of all drafters + the evaluation settings, so
   a rerun with nothing changed reprints the tables and anything changed re-measures
   every method together (ratios always come from one run);
4. the main table and the Domino ablations (Markdown + JSON in ``results/``) and
   MLflow (``lit_domino.studies.study_runs``): the study's run, with the seed-aggregated τ and speedup, the
   tables and the plots, and the variants' training runs nested under it, each with its decoding
   metrics and plots.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import math
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from lit_domino.runtime import cache
from lit_domino.training.configs import (EMBEDDED_PREFIX, ConfigError, check_arguments, check_preset, did_you_mean,
                                         load_config, parse_override, study_overrides)
from lit_domino.runtime.paths import project_root
from lit_domino.runtime.command import CommandParser, run_command
from lit_domino.runtime.quiet import set_verbose, verbose
from lit_domino.studies.common import cached_rows, log_metrics
from lit_domino.decoding.metric_names import COMPILED_AR, MethodKey, drafter_metrics
from lit_domino.runtime.threads import pinned_threads
from lit_domino.runtime.jsonio import write_json
from lit_domino.studies.tables import (EXACT_HEAD, EXACT_HEAD_METRICS, STUDY_FILE, aggregate, fmt, load_spec,
                                       records_from_rows, speedup_metrics, tables_from_rows, write_table)
from lit_domino.runtime.tracking import default_tracking_uri, ensure_run, run_tags
from lit_domino.studies.study_runs import StudyRun, plot_study

if TYPE_CHECKING:
    from lit_domino.training.datamodule import DrafterDataModule
    from lit_domino.runtime.jobclock import JobClock

# Everything above imports no torch, Lightning or MLflow: ``main`` checks its arguments first (in well under
# 2 s), and the functions import the heavy modules where they need them.



def _study(preset: str, variants: list[str] | None = None) -> tuple[dict, dict, list[str]]:
    """The study file, the table membership and the variants to run; :class:`ConfigError` (one line on the
    command line) for a preset or a variant that the study does not have. YAML only: no heavy import."""
    check_preset(preset)  # the presets are the config files' (one place); the study plans each of them
    study = yaml.safe_load(STUDY_FILE.read_text())
    if preset not in study["presets"]:
        raise ConfigError(f"the ablation study ({STUDY_FILE.name}) has no plan for preset {preset!r}; add a "
                          f"presets.{preset} section (it plans {', '.join(study['presets'])})")
    tables = {name: list(study["variants"][name]) for name in ("main", "ablations")}
    known = tables["main"] + tables["ablations"]
    unknown = [v for v in variants or () if v not in known]
    if unknown:
        raise ConfigError("unknown variants " + ", ".join(f"{v!r}{did_you_mean(v, known)}" for v in unknown)
                          + f"; the study has {', '.join(known)}")
    return study, tables, list(variants or known)


def study_plan(preset: str, variants: list[str] | None = None, seeds: list[int] | None = None) -> dict:
    """Variants, seeds and evaluation settings of the ablation under ``preset``; ``plan["tables"]`` is the
    study file's table membership ``{"main": [...], "ablations": [...]}`` (the main table's rows in order)."""
    from lit_domino.models.sessions import check_pool_size

    study, tables, chosen = _study(preset, variants)
    plan = dict(study["presets"][preset])
    plan["variants"] = chosen
    plan["seeds"] = [int(s) for s in (seeds if seeds else plan["seeds"])]
    plan["tables"] = tables
    # Domino variants whose inner backbone is decoded alone too: only those an ablation row reports
    # (``inner_backbone: true``), each extra row costs a full decode of every prompt
    plan["inner_backbone"] = sorted({v for ab in study.get("ablations") or () if ab.get("inner_backbone")
                                     for v in (ab["from"], ab["to"]) if v in plan["variants"]})
    # Domino's candidate pool K at decode (None: the exact full-vocabulary head), checked here, before any
    # training; the variants an ablation row names as ``<variant>@full`` are decoded with the exact head too
    plan["pool_size"] = plan.get("pool_size")
    try:
        check_pool_size(plan["pool_size"], None)  # V is checked once the target is loaded
    except ValueError:
        raise ValueError(f"{STUDY_FILE}: presets.{preset}.pool_size must be null (the full vocabulary) or an "
                         f"integer >= 1, got {plan['pool_size']!r}") from None
    named = {v for ab in study.get("ablations") or () for v in (ab["from"], ab["to"])}
    plan["exact_head"] = [] if plan["pool_size"] is None else sorted(
        v for v in plan["variants"] if f"{v}{EXACT_HEAD}" in named)
    return plan


def study_configs(preset: str, plan: dict, overrides: dict | None = None) -> tuple[list[dict], list[str]]:
    """Every variant x seed's training config with the overrides that reach it (``configs.study_overrides``:
    ``model.head.rank`` only for the variants whose module takes it, ``methods.<kind>.<key>`` for that method's), and
    the notes naming the variants an override skipped. Each variant's config is parsed by the training parser
    here, so a mistyped key or value fails before any training or cache reuse, naming the variant."""
    per_variant, notes = study_overrides(plan["variants"], preset, overrides)  # keys and numbers: no Lightning yet
    from lit_domino.training.cli import check_config

    configs = []
    for variant in plan["variants"]:
        mine = [load_config(variant, preset, seed, per_variant[variant]) for seed in plan["seeds"]]
        try:
            check_config(mine[0])  # the seeds' configs differ in seed_everything alone
        except ConfigError as err:
            raise ConfigError(f"variant {variant}: {err}") from None
        configs += mine
    return configs, notes


ROWS_FORMAT = 2
"""The measured rows' layout (2: each row carries its ``MethodKey``); part of their cache key, so rows cached
in an older layout are measured again instead of misread."""


def eval_key(plan: dict, drafter_dirs: list, target) -> dict:
    """The measured rows' cache key: every drafter, the evaluation plan (table membership aside) and the target."""
    return {"rows": ROWS_FORMAT, "drafters": [str(d) for d in drafter_dirs],
            "plan": {k: v for k, v in plan.items() if k not in ("tables", "reference_seconds")},
            "target": target.fingerprint()}


def eval_name(preset: str) -> str:
    return f"ablation-{preset}"


def default_out_dir(preset: str, plan: dict) -> Path:
    """``results/ablation-<preset>`` for the whole study; a subset (other variants, seeds or ``--set``
    overrides) gets its own folder beside it, so it never replaces the full study's tables."""
    full = study_plan(preset)
    parts = []
    if plan["variants"] != full["variants"]:
        parts.append("+".join(plan["variants"]))
    if plan["seeds"] != full["seeds"]:
        parts.append("s" + "-".join(str(s) for s in plan["seeds"]))
    if plan.get("overrides"):
        parts.append("set-" + cache.config_hash(plan["overrides"], 8))
    return project_root() / "results" / "-".join([f"ablation-{preset}", *parts])


def _warn_if_replacing(out_dir: Path, plan: dict, t0: float) -> None:
    """Say so when ``out_dir`` holds the tables of another plan (they are about to be replaced)."""
    try:
        before = json.loads((out_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return
    now = {"variants": plan["variants"], "seeds": plan["seeds"], "overrides": plan.get("overrides")}
    was = {k: before.get(k) for k in now}
    if was != now:
        _log(f"note: {out_dir} holds the results of another run ({was}); this run ({now}) replaces them", t0)


def _log(msg: str, t0: float) -> None:
    print(f"[ablation {time.time() - t0:6.0f}s] {msg}", flush=True)


# --------------------------------------------------------------------------- stages 1-2: target, data, trainings


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


def _target_state(spec: str) -> str | None:
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


_STARTED = None
"""A training worker's view of its parent's shared flags: ``_STARTED[i]`` = 1 once training ``i`` runs."""


def _train_worker_init(threads: int, started) -> None:
    """A training worker: ``threads`` torch threads and only Lightning's warnings (the parent logs the stages).
    SIGINT and SIGTERM stop its training at the next batch, quietly: the parent prints the one line."""
    import torch

    from lit_domino.training.experiment import STOP_SIGNALS, install_stop_handlers

    global _STARTED
    _STARTED = started
    install_stop_handlers(hint=False)
    # tqdm's default lock is a named semaphore: a worker killed at the end of an interrupted job (_stop_trainings)
    # left it to the resource tracker's "leaked semaphore" warning; a thread lock serves one process as well
    with contextlib.suppress(ImportError):
        import tqdm

        tqdm.tqdm.set_lock(threading.RLock())
    if hasattr(signal, "pthread_sigmask"):  # blocked by the parent while it started this process (_signals_blocked)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    torch.set_num_threads(threads)
    if not verbose():  # the trainings' own output goes to their train.log (runtime/quiet.py)
        logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
        logging.getLogger("lightning.fabric").setLevel(logging.WARNING)


def _train_in_worker(cfg: dict, experiment: str, index: int, parent_run_id: str | None = None):
    from lit_domino.training.experiment import train_variant

    _STARTED[index] = 1  # an interrupted parent waits for this training to stop (one not started it need not)
    return train_variant(cfg, experiment=experiment, progress=False, parent_run_id=parent_run_id)


@contextlib.contextmanager
def _signals_blocked():
    """SIGINT and SIGTERM held back while the pool starts a worker: the worker inherits the blocked mask and lifts
    it once its handlers are in place (a Ctrl-C during its imports printed a traceback per worker); here they are
    delivered when the block ends."""
    from lit_domino.training.experiment import STOP_SIGNALS

    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


STOP_TIMEOUT = 30.0
"""Seconds an interrupted ablation waits for its training workers to stop (they stop at their next batch, well
under a second on the CPU presets) before it kills them."""

INTERRUPTED = "rerun the same command to resume"


def _interrupted(name: str, err: BaseException) -> str:
    """The log line of a training that stopped at an interrupt."""
    step = getattr(err, "step", None)
    return f"stage 2/4 train {name} interrupted{'' if step is None else f' at step {step}'}; the rerun resumes it"


def _mark_killed(artifact: Path) -> None:
    """The MLflow run of a training whose worker had to be killed: KILLED rather than left RUNNING."""
    from mlflow.tracking import MlflowClient

    from lit_domino.training.cli import CHECKPOINT_DIR, RUN_ID_FILE

    try:
        run_id = (artifact / CHECKPOINT_DIR / RUN_ID_FILE).read_text().strip()
        client = MlflowClient(default_tracking_uri())
        if client.get_run(run_id).info.status == "RUNNING":
            client.set_terminated(run_id, "KILLED")
    except Exception as err:  # noqa: BLE001 (best effort, never masks the interrupt)
        logging.getLogger(__name__).warning("could not mark the MLflow run of %s KILLED: %s", artifact, err)


def _stop_trainings(pool: ProcessPoolExecutor, running: dict, started, configs: list[dict], names: list[str],
                    t0: float) -> None:
    """The job was interrupted: pass the stop request to every worker (a signal sent to this process alone does
    not reach them; one already stopping ignores the repeat) and wait for each started training to end, KILLED
    and resumable; past :data:`STOP_TIMEOUT` (or at a second Ctrl-C) kill what is left. A worker still starting
    (importing torch: 30 s and more on a busy machine) has nothing to save and is not waited for."""
    from lit_domino.training.experiment import drafter_artifact, stop_requested

    signum = stop_requested() or signal.SIGINT
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        with contextlib.suppress(OSError, ValueError):
            if proc.is_alive():
                os.kill(proc.pid, signum)
    pending, deadline = dict(running), time.monotonic() + STOP_TIMEOUT
    try:
        while time.monotonic() < deadline:
            waited = {f: i for f, i in pending.items() if started[i]}
            if not waited:
                break
            done, _ = wait(waited, timeout=min(0.5, deadline - time.monotonic()), return_when=FIRST_COMPLETED)
            for future in done:
                name = names[pending.pop(future)][6:]
                try:
                    future.result()
                    _log(f"stage 2/4 train {name} finished before it could stop", t0)
                except KeyboardInterrupt as err:
                    _log(_interrupted(name, err), t0)
                except BaseException as err:  # noqa: BLE001 (the interrupt is what the job ends with)
                    _log(f"stage 2/4 train {name} failed while stopping: {err!r}", t0)
    except KeyboardInterrupt:  # a second Ctrl-C: stop waiting
        pass
    # the workers are idle now (or stuck): end them at once rather than wait for their interpreters to wind down
    # (torch, Lightning and MLflow took 16 s on a busy 2-core machine)
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        with contextlib.suppress(OSError, ValueError):
            proc.kill()
    for i in pending.values():
        if started[i]:
            _mark_killed(drafter_artifact(configs[i]))
            _log(f"stage 2/4 train {names[i][6:]} did not stop: killed; the rerun resumes it", t0)
        else:
            _log(f"stage 2/4 train {names[i][6:]} stopped before it started", t0)


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
            _log(f"stage 2/4 train [{i + 1}/{total}] {name[6:]}{states[name]}; {clock.eta()}", t0)
            clock.start(name)
            try:
                results[i] = train_variant(cfg, experiment=experiment, progress=progress, parent_run_id=parent_run_id)
            except KeyboardInterrupt as err:
                _log(_interrupted(name[6:], err), t0)
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
    _log(f"stage 2/4 train {len(configs)} drafters under trainer.strategy={strategy}, devices="
         f"{configs[0]['trainer'].get('devices')} (one launch: lit_domino.training.distributed); {clock.eta()}", clock.t0)
    for name in names:
        clock.start(name)
    trained = train_distributed(configs, experiment, parent_run_id=parent_run_id, progress=progress)
    for name, t in zip(names, trained):
        clock.finish(name, cached=t.from_cache)
    return trained


def _train_in_workers(configs: list[dict], experiment: str, clock: JobClock, todo: list[int], states: dict,
                      results: dict, parent_run_id: str | None = None) -> None:
    """The trainings ``todo`` in ``clock.jobs`` spawned worker processes, into ``results``; see :func:`train_all`.
    An interrupt (here or in a worker) stops every training (:func:`_stop_trainings`), then raises one
    ``KeyboardInterrupt``."""
    from lit_domino.runtime.threads import usable_cpus

    t0, names = clock.t0, training_names(configs)
    order = sorted(todo, key=lambda i: -clock.stages[names[i]].reference)
    threads = max(1, usable_cpus() // clock.jobs)
    _log(f"stage 2/4 train {len(todo)} drafters, {clock.jobs} at a time in worker processes ({threads} thread(s) "
         f"each; progress bars off); {clock.eta()}", t0)
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no forked torch thread pools or locks
    started = ctx.RawArray("b", len(configs))  # set by the workers: which trainings are underway
    pool = ProcessPoolExecutor(clock.jobs, mp_context=ctx, initializer=_train_worker_init,
                               initargs=(threads, started))
    running, error = {}, None
    try:
        pending = list(order)
        while pending or running:
            while pending and len(running) < clock.jobs and error is None:
                i = pending.pop(0)
                clock.start(names[i])
                _log(f"stage 2/4 train [{len(todo) - len(pending)}/{len(todo)}] {names[i][6:]}{states[names[i]]} "
                     f"started; {clock.eta()}", t0)
                with _signals_blocked():  # the worker this may start inherits the mask (see _train_worker_init)
                    running[pool.submit(_train_in_worker, configs[i], experiment, i, parent_run_id)] = i
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                i = running.pop(future)
                try:
                    results[i] = future.result()
                except KeyboardInterrupt as err:  # a worker was interrupted alone: the job stops as a whole
                    _log(_interrupted(names[i][6:], err), t0)
                    raise KeyboardInterrupt(INTERRUPTED) from None
                except BaseException as err:  # noqa: BLE001 (re-raised once the running ones finish)
                    error = error or err
                    _log(f"stage 2/4 train {names[i][6:]} failed: {err!r}", t0)
                    continue
                seconds = clock.finish(names[i], cached=results[i].from_cache)
                _log(f"stage 2/4 train {names[i][6:]} done in {seconds / 60:.1f} min; {clock.eta()}", t0)
        if error is not None:
            raise error
    except KeyboardInterrupt:
        _stop_trainings(pool, running, started, configs, names, t0)
        raise KeyboardInterrupt(INTERRUPTED) from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def load_prompts(plan: dict) -> dict:
    """The plan's benchmarks; ``benchmark_files`` (``{benchmark: local copy in the hub schema}``, paths relative to the
    checkout, as the rehearsal's) are read instead of the hub."""
    from lit_domino.data.benchmarks import load_benchmark
    from lit_domino.runtime.paths import project_path

    files = plan.get("benchmark_files") or {}
    return {name: load_benchmark(name, n, **({"data_files": str(project_path(files[name]))} if name in files else {}))
            for name, n in plan["prompts"].items()}


def evaluate(target, trained: list, plan: dict, progress: bool = True) -> list[dict]:
    """Decode every drafter (and the peers) on every benchmark in this process → benchmark rows."""
    from lit_domino.decoding.harness import benchmark
    from lit_domino.interop import load_drafter

    drafters, pools, assistant = {}, {}, None
    for t in trained:
        d = load_drafter(t.drafter_dir, target=target, map_location=target.device)
        key = MethodKey(t.variant, t.seed)
        drafters[key] = d
        pools[key] = [plan.get("pool_size")] + ([None] if t.variant in plan.get("exact_head", ()) else [])
        inner = d.base_view() if t.variant in plan.get("inner_backbone", ()) else None
        if inner is not None:  # Domino's backbone decoded alone: did it collapse without the curriculum?
            drafters[replace(key, view="backbone")] = inner
        assistant = assistant or d.hf_model()  # the small LM is HF assisted generation's assistant
    peers = [p for p in plan.get("peers", []) if p != "assisted" or assistant is not None]
    with pinned_threads(plan.get("threads")):
        return benchmark(target, drafters, load_prompts(plan), max_new_tokens=int(plan["max_new_tokens"]),
                         temperatures=plan.get("temperatures", [0.0]), peers=peers, assistant_model=assistant,
                         pool_sizes=pools, progress=progress, compiled_baseline=bool(plan.get("compiled_baseline")))


def peer_table(records: list[dict], domains: list[str]) -> str:
    """Markdown: our drafters' speedups beside the two HF peers, per domain."""
    speed = aggregate(records, "speedup")
    names = sorted({r["variant"] for r in records})
    lines = ["| method | " + " | ".join(domains + ["avg"]) + " |", "|---|" + "---|" * (len(domains) + 1)]
    for v in names:
        lines.append(f"| {v} | " + " | ".join(fmt(speed.get((v, d)), suffix="x") for d in domains + ["avg"]) + " |")
    return "\n".join(lines)


def log_to_mlflow(preset: str, trained: list, records: list[dict], out_dir: Path, main_variants: list[str],
                  study: StudyRun, domains: list[str]) -> None:
    """Decoding metrics + plots into each variant's training run (tag ``table``: ``main`` for the
    ``main_variants``, the plan's ``tables["main"]``, else ``ablations``; tag ``decode_pool_size``: the
    candidate pool a Domino variant decoded with, absent for the exact head; the exact head's metrics beside a
    pool: ``exact_head/...``), each run nested under the ``study`` run; into the study run the seed-aggregated
    metrics, the tables and every plot (``lit_domino.studies.study_runs``).

    A cached drafter whose training run is not in the current store (a deleted ``mlflow.db``, another
    ``MLFLOW_TRACKING_URI``) gets a run recreated from its report (``tracking.ensure_run``), with a warning."""
    from mlflow.tracking import MlflowClient

    from lit_domino.decoding.plots import plot_position_acceptance, plot_tau_histogram

    uri = default_tracking_uri()
    client = MlflowClient(uri)
    plots = []
    for t in trained:
        if not t.run_id:
            continue
        t.run_id = ensure_run(
            t.run_id, f"ablation-{preset}", f"{t.variant}-{preset}-s{t.seed}",
            tags=run_tags(t.variant, preset, t.seed, extra={"drafter_dir": str(t.drafter_dir)}),
            metrics={f"train/{k}": t.report[k] for k in ("drafter_parameters", "train_seconds", "train_tokens_per_s",
                                                           "peak_rss_mb") if t.report.get(k) is not None},
            tracking_uri=uri)
        study.adopt([t.run_id])
        mine = [r for r in records if r["variant"] == t.variant and r["seed"] == t.seed and r["temperature"] == 0]
        if not mine:
            continue
        per_domain = {r["domain"]: r for r in mine}
        log_metrics(client, t.run_id, drafter_metrics(mine))
        client.set_tag(t.run_id, "table", "main" if t.variant in main_variants else "ablations")
        pools = {r.get("pool_size") for r in mine} - {None}
        if pools:
            client.set_tag(t.run_id, "decode_pool_size", ",".join(map(str, sorted(pools))))
        exact = [r for r in records if r["variant"] == t.variant + EXACT_HEAD and r["seed"] == t.seed
                 and r["temperature"] == 0]
        if exact:  # the same drafter decoded with the exact head, for the pool rows
            log_metrics(client, t.run_id, {f"{EXACT_HEAD_METRICS}/{k}": v for k, v in drafter_metrics(exact).items()})
        for name, fig in (("acceptance_per_position.png", plot_position_acceptance(per_domain, t.variant)),
                          ("tau_histogram.png", plot_tau_histogram(per_domain, t.variant))):
            path = out_dir / "plots" / f"{t.variant}-s{t.seed}-{name}"
            path.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path, dpi=100)
            client.log_artifact(t.run_id, str(path), "plots")
            plots.append(path)
    greedy = [r for r in records if r["temperature"] == 0]
    spec = load_spec(STUDY_FILE)
    path = out_dir / "plots" / "study-tau-speedup.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    plot_study(greedy, spec.variants, spec.labels).savefig(path, dpi=100)
    study.log(greedy, domains, sorted(out_dir.glob("*.md")) + sorted(out_dir.glob("*.json")), [path, *plots])


def run_ablation(preset: str = "default", variants: list[str] | None = None, seeds: list[int] | None = None,
                 out_dir: Path | None = None, progress: bool = True, overrides: dict | None = None,
                 train_only: bool = False, jobs: int | str = "auto") -> dict:
    """The whole study; returns ``{"tables": ..., "records": ..., "trained": ..., "seconds": ...}``.

    ``overrides``: dotted config keys of the variants' training configs (for example
    ``{"data.train_examples": {"math": 4000}}``): a model key (``model.head.rank``) reaches the variants whose
    module takes it and ``methods.<kind>.<key>`` the preset's section of that drafter method, the log naming
    the variants skipped (:func:`study_configs`); they change the drafters' cache keys, so the plain study's
    artifacts are left alone. Pair them with ``out_dir``.

    ``train_only``: stop after stage 2 (the drafters are cached); a later run without it decodes.
    Decoding is timed, so train on a busy machine and decode alone.

    ``jobs``: trainings at once in worker processes (``auto``: :func:`training_jobs`). The log has one line
    per stage with the job's ETA (:class:`~lit_domino.runtime.jobclock.JobClock`, from the study file's
    ``reference_seconds``); ``stage_times.json`` beside the tables holds what each stage took.

    MLflow: the study's run (``lit_domino.studies.study_runs``) is RUNNING from the first training to the end of the
    job, which it ends with (FINISHED, FAILED, KILLED)."""
    with StudyRun() as study:
        return _run_ablation(preset, variants, seeds, out_dir, progress, overrides, train_only, jobs, study)


def _run_ablation(preset: str, variants: list[str] | None, seeds: list[int] | None, out_dir: Path | None,
                  progress: bool, overrides: dict | None, train_only: bool, jobs: int | str, study: StudyRun) -> dict:
    """:func:`run_ablation` inside its study run (opened once the configs are checked)."""
    plan = study_plan(preset, variants, seeds)
    if overrides:
        plan["overrides"] = dict(overrides)
    out_dir = Path(out_dir or default_out_dir(preset, plan))
    configs, notes = study_configs(preset, plan, overrides)  # a mistyped --set fails here, before anything is built
    from lit_domino.training.cli import EXPORT_DIR  # Lightning: once the keys are checked (a mistyped one answers in < 2 s)
    from lit_domino.training.experiment import drafter_artifact
    from lit_domino.runtime.jobclock import JobClock, StageProgress
    from lit_domino.target.load import load_target

    reference = plan.get("reference_seconds") or {}
    spec = configs[0]["data"]["target"]
    target_state = _target_state(spec)
    target_cached = target_state is not None
    busy = not target_cached or not all(cache.is_complete(drafter_artifact(c), warn=False) for c in configs)
    clock = JobClock(calibration=reference.get("calibration") if busy else None, jobs=training_jobs(jobs, configs))
    t0 = clock.t0
    _warn_if_replacing(out_dir, plan, t0)
    out_dir.mkdir(parents=True, exist_ok=True)
    clock.plan("target", reference.get("target", 0.0), cached=target_cached)
    clock.plan("regenerate data", reference.get("regenerate", 0.0))  # cached-ness known once the target is
    plan_trainings(configs, clock, reference)
    if not train_only:  # whether the decode is cached is known once the target is loaded (below)
        clock.plan("decode", reference.get("decode", 0.0))
        clock.plan("tables", reference.get("tables", 0.0))
    for note in notes:  # which variants a method's --set key skipped
        _log(note, t0)
    _log(f"preset {preset}: {len(configs)} trainings ({', '.join(plan['variants'])} x seeds {plan['seeds']}); "
         f"trainings {clock.jobs} at a time", t0)

    _log(f"stage 1/4 target {spec}{f' ({target_state})' if target_cached else ''}; {clock.eta()}", t0)
    clock.start("target")
    if not target_cached and spec.startswith(EMBEDDED_PREFIX):  # built here: its steps revise the ETA
        from lit_domino.target.load import embedded_target_dir

        def echo(step, total):
            _log(f"stage 1/4 target: step {step}/{total}; {clock.eta()}", t0)

        embedded_target_dir(spec[len(EMBEDDED_PREFIX):], progress=progress,
                            callbacks=[StageProgress(clock, "target", echo)])
    # decoded where the trainings ran (the GPU when there is one): a paper run decoded an 8B target on the CPU
    target = load_target(spec, device=configs[0]["data"].get("target_device", "auto"))
    clock.finish("target", cached=target_cached)

    modules = data_modules(configs)
    found = [dm.cached() for _, dm in modules]
    for (name, _), parts in zip(modules, found):
        clock.plan(name, reference.get("features", 0.0), cached=parts["features"])
    clock.stages["regenerate data"].cached = all(parts["regen"] for parts in found)
    if clock.stages["regenerate data"].cached:
        clock.stages["regenerate data"].reference = 0.0
    if not train_only:
        key = eval_key(plan, [drafter_artifact(c) / EXPORT_DIR for c in configs], target)
        if cache.is_complete(cache.artifact_dir("evals", key, name=eval_name(preset)), warn=False):
            clock.plan("decode", cached=True)
    regen_cached = clock.stages["regenerate data"].cached
    _log(f"stage 1/4 regenerate the training data{' (cached)' if regen_cached else ''}; {clock.eta()}", t0)
    clock.start("regenerate data")
    modules[0][1].regenerate(progress=progress)
    clock.finish("regenerate data", cached=regen_cached)
    for name, dm in modules:  # every feature cache the trainings share, once, before they fan out
        cached = clock.stages[name].cached
        _log(f"stage 1/4 {name}{' (cached)' if cached else ''}; {clock.eta()}", t0)
        clock.start(name)
        dm.prepare_data()
        clock.finish(name, cached=cached)

    study.open(f"ablation-{preset}", default_out_dir(preset, plan).name, {"preset": preset}, list(plan["prompts"]))
    trained = train_all(configs, f"ablation-{preset}", clock, reference, progress, parent_run_id=study.run_id)
    if train_only:
        write_json(clock.summary(), out_dir / "stage_times.json")
        _log(f"trained {len(trained)} drafters; stopping before decoding (--train-only)\n{clock.report()}", t0)
        return {"trained": trained, "seconds": time.time() - t0}

    def decode() -> list[dict]:
        _log(f"stage 3/4 decode {len(trained)} drafters on {plan['prompts']} (+ AR baseline, HF generate, peers); "
             f"{clock.eta()}", t0)
        return evaluate(target, trained, plan, progress=progress)

    reused = []

    def on_reuse():
        reused.append(True)
        _log("stage 3/4 decode: nothing changed, reusing the measured rows", t0)

    clock.start("decode")
    rows = cached_rows(eval_key(plan, [t.drafter_dir for t in trained], target), eval_name(preset), decode,
                       on_reuse=on_reuse)
    compile_s = sum(r.get("warmup_s", 0.0) for r in rows if r["method"] == COMPILED_AR)
    clock.finish("decode", cached=bool(reused), **({"compiled_plain_warmup_seconds": round(compile_s, 1)}
                                                   if plan.get("compiled_baseline") else {}))
    clock.start("tables")

    _log("stage 4/4 tables", t0)
    records = records_from_rows(rows)
    domains = list(plan["prompts"])
    tables = tables_from_rows(rows, domains, load_spec(STUDY_FILE))  # the notebook's too (analysis.rebuild_tables)
    for name, table in tables.items():
        write_table(table, out_dir, name)
    peers = peer_table(records, domains)
    (out_dir / "peers.md").write_text(peers + "\n")
    write_json(rows, out_dir / "rows.json")
    write_json([t.report for t in trained], out_dir / "training.json")
    seconds = time.time() - t0
    summary = {"preset": preset, "seconds": round(seconds, 1), "seeds": plan["seeds"], "variants": plan["variants"],
               "overrides": plan.get("overrides"),
               # per variant, the mean over seeds of the domains' mean: over the eager plain decoder ("speedup")
               # and, where the decode ran it, over the compiled plain decoder ("speedup_vs_compiled_ar")
               "speedups": {m: {v: round(mean, 4) for (v, d), (mean, _) in aggregate(records, m).items()
                                if d == "avg" and math.isfinite(mean)} for m in speedup_metrics(records)}}
    write_json(summary, out_dir / "summary.json")
    clock.finish("tables")
    write_json(clock.summary(), out_dir / "stage_times.json")  # before the MLflow upload of out_dir's JSON
    log_to_mlflow(preset, trained, records, out_dir, plan["tables"]["main"], study, domains)

    pool = ("the exact head" if plan["pool_size"] is None
            else f"a {plan['pool_size']}-token candidate pool (the {EXACT_HEAD} rows: the exact head)")
    print(f"\n## Main table ({preset}; speedup = our plain decoder's time per token (eager; compiled where the "
          f"study runs it) / speculative, prefill excluded; Domino decoded with {pool})\n")
    print(tables["main"]["markdown"])
    print(f"\n## Domino ablations ({preset})\n")
    print(tables["ablations"]["markdown"])
    print(f"\n## Speedup beside the Hugging Face peers ({preset})\n")
    print(peers)
    print(f"\nwritten to {out_dir}; MLflow experiment ablation-{preset} at {default_tracking_uri()}")
    _log(f"done in {seconds / 60:.1f} min\n{clock.report()}", t0)
    return {"tables": tables, "records": records, "rows": rows, "trained": trained, "seconds": seconds}


@contextlib.contextmanager
def _interrupt_not_exit():
    """Lightning ends a fit stopped by Ctrl-C (the embedded target's build) with ``SystemExit(1)``: the command
    ends as interrupted instead (rc 130, its one line), not with a silent rc 1."""
    from lit_domino.runtime.tracking import _interrupt_of

    try:
        yield
    except SystemExit as exc:
        if _interrupt_of(exc) is None:
            raise
        raise KeyboardInterrupt(INTERRUPTED) from None


def seed_list(text: str) -> list[int]:
    """``"0,1"`` → ``[0, 1]``: the argparse type of ``--seeds`` (an error at parse time names the bad item)."""
    seeds = []
    for item in (s.strip() for s in text.split(",")):
        if not item.isdigit():
            raise argparse.ArgumentTypeError(f"seeds are integers >= 0 separated by commas, got {item!r} in {text!r}")
        seeds.append(int(item))
    return seeds


def jobs_arg(text: str) -> int | str:
    """``--jobs``: ``auto`` or an integer >= 1."""
    if text == "auto":
        return text
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--jobs is 'auto' or an integer >= 1, got {text!r}")
    return int(text)


def build_parser() -> CommandParser:
    """``experiments/ablation.py``'s arguments (one-line errors; building it imports nothing heavy)."""
    parser = CommandParser(prog="ablation", description="Train every drafter variant, decode for real, "
                           "print the papers' tables (cached under ./artifacts, runs in MLflow).")
    parser.add_argument("--preset", default="default", help="smoke | default | paper (default: default)")
    parser.add_argument("--variants", default=None, help="comma-separated subset (default: all of the study)")
    parser.add_argument("--seeds", default=None, type=seed_list, help="comma-separated seeds >= 0 (default: the preset's)")
    parser.add_argument("--out", default=None, help="output directory (default: results/ablation-<preset>, with the "
                        "subset appended for --variants/--seeds/--set runs)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (stage logs only)")
    parser.add_argument("--verbose", action="store_true",
                        help="Lightning's own output of every training (banners, tips, warnings) on the console; "
                             "by default it goes to each training's train.log in its artifact folder")
    parser.add_argument("--set", type=parse_override, action="append", default=[], metavar="KEY=VALUE",
                        help="override a training config key, VALUE in YAML, e.g. "
                             "--set 'data.train_examples={math: 4000, code: 1000, chat: 1000}' (repeatable); a model "
                             "key (model.head.rank) reaches the variants whose module takes it, methods.<kind>.<key> "
                             "(methods.domino.head.rank=16) the preset's section of that drafter method")
    parser.add_argument("--train-only", action="store_true",
                        help="train (or find cached) every drafter, then stop; rerun without it to decode and tabulate")
    parser.add_argument("--jobs", default="auto", type=jobs_arg,
                        help="trainings at once, in worker processes (default auto: 2 on a CPU machine with 2+ "
                             "cores, 1 with accelerators)")
    return parser


def _main(argv: list[str]) -> dict:
    args = build_parser().parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()] if args.variants else None
    overrides = dict(args.set)
    # what YAML alone can refuse, before torch is imported: the preset, the variants, the --set sections, the target
    _, _, chosen = _study(args.preset, variants)
    check_arguments(args.preset, overrides)
    study_overrides(chosen, args.preset, overrides)  # model keys and numbers, read from the modules' source
    set_verbose(args.verbose)  # the workers inherit it
    if args.no_progress:  # the libraries' own bars too (dataset saves, weight loading)
        import datasets
        import transformers

        datasets.disable_progress_bars()
        transformers.utils.logging.disable_progress_bar()
    from lit_domino.training.experiment import interruptible

    with interruptible(), _interrupt_not_exit():  # SIGTERM as Ctrl-C: one line, rc 130 (run_command)
        return run_ablation(
            args.preset,
            variants=variants,
            seeds=args.seeds,
            out_dir=args.out,
            progress=not args.no_progress,
            overrides=overrides,
            train_only=args.train_only,
            jobs=args.jobs,
        )


def main(argv: list[str] | None = None) -> dict:
    """Command line of ``experiments/ablation.py`` (the console script: :func:`console_main`): errors the
    user can fix are one line (``ablation: error: ...``, rc 2), an interrupt ``ablation: interrupted`` (rc 130)."""
    try:
        return run_command("ablation", _main, argv)
    except SystemExit:
        gc.freeze()  # the process ends: skip the final collection of torch's heap (7 of 7.5 s on a busy machine)
        raise


def console_main() -> None:
    """The ``lit-domino-ablation`` console script: :func:`main` without its return value (a console script's
    return is its exit status, and ``sys.exit`` of the study's dict printed it and ended with rc 1)."""
    main()

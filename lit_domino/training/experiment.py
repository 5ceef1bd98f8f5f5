"""One drafter variant, end to end: the core of ablation.py, the DLoop study and the sweeps.

:func:`train_variant` trains the variant of a composed config (``lit_domino.training.configs.load_config``)
through the artifact cache: a finished drafter with the same config is reused, a killed run resumes
from its last checkpoint. The training itself is ``lit_domino.training.cli.DrafterCLI`` — the parser, links,
run-directory layout and MLflow tracking of ``experiments/train.py`` — with the artifact directory as
its run directory (``checkpoints/``, ``drafter/``, ``config.yaml``) plus ``report.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import psutil
from lightning.pytorch.callbacks import Callback

from lit_domino.runtime import cache
from lit_domino.runtime.jobs import STOP_SIGNALS
from lit_domino.runtime.quiet import quiet_lightning
from lit_domino.training.cli import CHECKPOINT_DIR, EXPORT_DIR, RUN_ID_FILE, DrafterCLI, check_config, cli_args
from lit_domino.target.load import target_identity
from lit_domino.runtime.tracking import _interrupt_of, mark_failed_on_error

TRAINER_COSMETIC = ("enable_progress_bar", "enable_model_summary", "log_every_n_steps", "default_root_dir", "logger",
                    "callbacks", "num_sanity_val_steps")
"""Trainer settings that cannot change a trained drafter; every other one is in its cache key."""


MODEL_COMPUTE = ("loss_chunk_size", "attention", "activation_checkpointing")
"""Model settings that change how a training step computes (memory, kernels), never its maths: not in the key."""


def _model_key(model):
    if not isinstance(model, dict) or not isinstance(model.get("init_args"), dict):
        return model
    args = {k: v for k, v in model["init_args"].items() if k not in MODEL_COMPUTE}
    return {**model, "init_args": args}


def training_key(cfg: dict) -> dict:
    """What determines a trained drafter (its cache key): seed, model, data and the optimisation length."""
    trainer = cfg.get("trainer", {})
    return {
        "target": target_identity(cfg["data"]["target"]),
        "seed": cfg.get("seed_everything"),
        "model": _model_key(cfg.get("model")),
        "data": cfg.get("data"),
        "trainer": {k: v for k, v in sorted(trainer.items()) if k not in TRAINER_COSMETIC},
    }


# --------------------------------------------------------------------------- Ctrl-C and SIGTERM

# STOP_SIGNALS (runtime.jobs): the signals that stop a training, Ctrl-C and a polite kill (systemd, a job scheduler,
# ``kill``), the same as stop a job runner's jobs

REPEAT_WINDOW = 1.0
"""Seconds within which a second stop signal is the same request delivered twice (the terminal's signal to the
process group and the ablation's parent forwarding it), not a second Ctrl-C that asks to stop at once."""


class Interrupted(KeyboardInterrupt):
    """The interrupt a stop signal raises (a ``KeyboardInterrupt``, so every handler of Ctrl-C sees it);
    ``signum`` says which signal it was."""

    def __init__(self, signum: int, message: str | None = None, step: int | None = None):
        super().__init__(message or f"interrupted by {signal.Signals(signum).name}")
        self.signum, self.step = signum, step

    def __reduce__(self):  # with every argument: it crosses from a training worker to its parent
        return type(self), (self.signum, str(self), self.step)


class _StopRequest:
    """This process's pending stop request and where it may be raised (see :func:`interruptible`)."""

    def __init__(self):
        self.reset()
        self.depth = 0  # open interruptible() blocks
        self.in_loop = 0  # inside a fit's loop: StopAtSafePoint raises at the next batch
        self.hint = True  # whether the raised interrupt prints tracking.RESUME_HINT

    def reset(self) -> None:
        self.signum: int | None = None
        self.at = 0.0

    def interrupt(self, message: str | None = None) -> Interrupted:
        err = Interrupted(self.signum or signal.SIGINT, message)
        if not self.hint:
            err._lit_domino_hinted = True  # tracking.hint_resume stays quiet: the caller prints one line instead
        return err


_STOP = _StopRequest()


def _in_finalizer(frame) -> bool:
    """Whether ``frame`` runs inside a ``__del__`` or a weakref finalizer: an exception raised there is printed
    as "Exception ignored" and lost (the interrupt that Lightning's ``Profiler.__del__`` swallowed)."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or (code.co_name == "__call__" and code.co_filename.endswith("weakref.py")):
            return True
        frame = frame.f_back
    return False


def _on_stop_signal(signum, frame) -> None:
    """Record the stop request; raise it now unless a safe point comes soon or raising here would be lost.

    Inside a fit's loop the request is raised at the next batch (:class:`StopAtSafePoint`): never in the middle
    of an MLflow write or a checkpoint save. A second signal (after :data:`REPEAT_WINDOW`) raises at once."""
    now = time.monotonic()
    first = _STOP.signum is None
    if first:
        _STOP.signum, _STOP.at = signum, now
    elif now - _STOP.at < REPEAT_WINDOW:
        return  # the same request twice
    if _STOP.depth and (not first or not _STOP.in_loop) and not _in_finalizer(frame):
        raise _STOP.interrupt()


def stop_requested() -> int | None:
    """The signal of this process's pending stop request (None: none)."""
    return _STOP.signum


def install_stop_handlers(hint: bool = True) -> None:
    """Make SIGINT and SIGTERM stop requests in this process for good (a training worker's initializer): while no
    :func:`interruptible` block is open they are only recorded, so an idle worker never dies in its queue.
    ``hint``: as :func:`interruptible`'s, for every block that does not say."""
    _STOP.hint = hint
    for sig in STOP_SIGNALS:
        signal.signal(sig, _on_stop_signal)


@contextlib.contextmanager
def interruptible(hint: bool | None = None) -> Iterator[None]:
    """SIGINT and SIGTERM stop the block with :class:`Interrupted` (a ``KeyboardInterrupt``), at once or, inside a
    fit's loop, at the next batch; one delivered while nothing could raise it (before the block, in a finalizer)
    is raised at the next safe point or when the block ends. SIGTERM thus stops a training like Ctrl-C (its
    MLflow run KILLED, the resume state kept) instead of Lightning's ``SIGTERMException`` (a FAILED run).

    ``hint``: whether the interrupt prints ``tracking.RESUME_HINT`` (None: as the enclosing block; False where
    the caller prints its own line, the ablation). Nests; outside the main thread it only runs the block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    outer_hint = _STOP.hint
    if hint is not None:
        _STOP.hint = hint
    for sig in STOP_SIGNALS:
        signal.signal(sig, _on_stop_signal)
    _STOP.depth += 1
    try:
        if _STOP.signum is not None:  # delivered while nothing could raise it (an idle worker)
            raise _STOP.interrupt()
        yield
        if _STOP.signum is not None:  # delivered where raising it would have been lost
            raise _STOP.interrupt()
    finally:
        _STOP.depth -= 1
        _STOP.hint = outer_hint
        if not _STOP.depth:
            _STOP.reset()
            for sig, handler in previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


class StopAtSafePoint(Callback):
    """Raise a pending stop request (:func:`interruptible`) at the next batch of the fit, train or validation:
    Lightning's own Ctrl-C handling then ends the run KILLED with ``last.ckpt`` intact."""

    def __init__(self):
        self._in_loop = False

    def _check(self, *_args, **_kwargs) -> None:
        if _STOP.signum is not None and _STOP.depth:
            raise _STOP.interrupt()

    def _leave_loop(self) -> None:
        if self._in_loop:
            self._in_loop, _STOP.in_loop = False, _STOP.in_loop - 1

    def on_train_start(self, trainer, pl_module) -> None:
        if _STOP.depth and trainer.world_size == 1 and threading.current_thread() is threading.main_thread():
            # Lightning's SIGTERM handler (installed for the fit) raises SIGTERMException, which ends the run
            # FAILED; here SIGTERM is a stop request like Ctrl-C (under DDP Lightning's keeps the ranks in step)
            signal.signal(signal.SIGTERM, _on_stop_signal)
        self._in_loop, _STOP.in_loop = True, _STOP.in_loop + 1
        self._check()

    def on_train_end(self, trainer, pl_module) -> None:
        self._leave_loop()
        self._check()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._leave_loop()

    on_fit_start = on_train_epoch_start = on_validation_start = _check
    on_train_batch_start = on_train_batch_end = on_validation_batch_start = on_validation_batch_end = _check


class TrainStats(Callback):
    """Tokens/s over the fit and the process's peak resident memory.

    Tokens and seconds are carried in checkpoints, so a training that was interrupted and resumed
    reports the sums over its segments (the time of steps replayed after the last checkpoint aside)."""

    def __init__(self):
        self.tokens, self.seconds, self.peak_rss_mb = 0, 0.0, 0.0
        self._t0 = None

    def _rss(self):
        self.peak_rss_mb = max(self.peak_rss_mb, psutil.Process().memory_info().rss / 2**20)

    def _elapsed(self) -> float:
        return self.seconds + (time.perf_counter() - self._t0 if self._t0 is not None else 0.0)

    def state_dict(self) -> dict:
        return {"tokens": self.tokens, "seconds": self._elapsed()}

    def load_state_dict(self, state: dict) -> None:
        self.tokens, self.seconds = int(state["tokens"]), float(state["seconds"])

    def on_train_start(self, trainer, pl_module):
        self._t0 = time.perf_counter()
        self._rss()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.tokens += int(batch["attention_mask"].sum())
        if batch_idx % 10 == 0:
            self._rss()

    def on_train_end(self, trainer, pl_module):
        self.seconds, self._t0 = self._elapsed(), None
        self._rss()


@dataclass
class TrainedDrafter:
    """A trained (or cached) drafter: where it is, how it was made, how training went."""

    variant: str
    preset: str
    seed: int
    drafter_dir: Path
    report: dict = field(default_factory=dict)
    run_id: str | None = None
    from_cache: bool = False


def drafter_artifact(cfg: dict, root: Path | None = None) -> Path:
    t = cfg["tracking"]
    return cache.artifact_dir("drafters", training_key(cfg), name=f"{t['variant']}-s{cfg['seed_everything']}",
                              root=root)


RANK_ENV = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")
"""Where DDP launchers put a process's rank: torchrun (RANK), Lightning's own launcher of the extra
processes (LOCAL_RANK, NODE_RANK), SLURM, LSF."""


def is_rank_zero() -> bool:
    """Whether this process is global rank 0 of a distributed launch (True outside one).

    Read from the launcher's environment (:data:`RANK_ENV`), so it holds before the Trainer exists:
    under ``trainer.strategy: ddp`` every rank runs the calling script, and only rank 0 may build or
    write shared artifacts. Callers that do more than train (decode, write tables) do it on rank 0.
    """
    return all(int(os.environ.get(k) or 0) == 0 for k in RANK_ENV)


def train_variant(
    cfg: dict,
    *,
    experiment: str = "train",
    run_name: str | None = None,
    table: str | None = None,
    callbacks: Iterable = (),
    parent_run_id: str | None = None,
    progress: bool = True,
    root: Path | None = None,
) -> TrainedDrafter:
    """Train the variant of ``cfg`` (or reuse the cached drafter); the drafter is exported with ``save_pretrained``.

    The config is parsed first (``cli.check_config``): a mistyped key is an error, never a reused drafter.

    Under a distributed strategy (``trainer.strategy: ddp``, several devices) every rank calls this:
    global rank 0 holds the artifact's build lock, trains, writes ``drafter/``, ``report.json`` and the
    completion marker, and owns the one MLflow run; the other ranks take part in the same fit without the
    lock, write nothing, then wait for rank 0 to finish the artifact and return the same result."""
    check_config(cfg)
    t = cfg["tracking"]
    variant, preset, seed = t["variant"], t.get("preset"), int(cfg["seed_everything"])
    path = drafter_artifact(cfg, root)
    if not is_rank_zero():
        with interruptible():
            return _train_on_other_rank(cfg, path, experiment, run_name, table, callbacks, parent_run_id, progress)
    # SIGINT/SIGTERM: the run KILLED, the checkpoints kept (see interruptible); one delivered while the drafter
    # is exported is raised once the artifact is complete (a rerun then reuses it)
    with interruptible(), cache.building(path):  # one training per drafter: a concurrent caller waits, reuses it
        if cache.is_complete(path):
            return _cached(path, variant, preset, seed)
        path.mkdir(parents=True, exist_ok=True)
        cli, stats = _fit(cfg, path, experiment, run_name, table, callbacks, parent_run_id, progress)
        trainer, logger = cli.trainer, cli.trainer.logger
        run_id = getattr(logger, "run_id", None)  # None: tracking disabled
        with mark_failed_on_error([logger]):
            report = {
                "variant": variant, "preset": preset, "seed": seed, "run_id": run_id,
                "drafter_parameters": int(cli.model.drafter.num_parameters()),
                "train_seconds": round(stats.seconds, 1),
                "train_tokens_per_s": round(stats.tokens / stats.seconds, 1) if stats.seconds else None,
                "peak_rss_mb": round(stats.peak_rss_mb, 1),
                "optimizer_steps": int(trainer.global_step),
                "world_size": int(trainer.world_size),
                **{k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")},
            }
            for key in ("drafter_parameters", "train_seconds", "train_tokens_per_s", "peak_rss_mb"):
                if report[key] is not None and run_id is not None:
                    logger.experiment.log_metric(run_id, f"train/{key}", report[key])
        (path / "report.json").write_text(json.dumps(report, indent=2))
        cache.mark_complete(path, training_key(cfg))
        for ckpt in (path / CHECKPOINT_DIR).glob("*.ckpt"):  # resume state, useless once finished
            os.remove(ckpt)
        return TrainedDrafter(variant, preset, seed, path / EXPORT_DIR, report, run_id, False)


def _cached(path: Path, variant: str, preset: str | None, seed: int, from_cache: bool = True) -> TrainedDrafter:
    report = json.loads((path / "report.json").read_text())
    return TrainedDrafter(variant, preset, seed, path / EXPORT_DIR, report, report.get("run_id"), from_cache)


def _fit(cfg, path, experiment, run_name, table, callbacks, parent_run_id, progress):
    """The fit of :func:`train_variant` (the same on every rank): the CLI on the artifact as run directory,
    resumed from its ``last.ckpt`` when there is one."""
    t = cfg["tracking"]
    variant, preset, seed = t["variant"], t.get("preset"), int(cfg["seed_everything"])
    args = cli_args(cfg)
    args["tracking"] = {**args.get("tracking", {}), "experiment": experiment,
                        "run_name": run_name or f"{variant}-{preset}-s{seed}", "table": table}
    args["trainer"] = {**args.get("trainer", {}), "default_root_dir": str(path)}
    args["trainer"]["enable_progress_bar"] = progress and args["trainer"].get("enable_progress_bar", True)
    args["trainer"].setdefault("enable_model_summary", False)
    args["checkpoint"] = {**args.get("checkpoint", {}), "dirpath": str(path / CHECKPOINT_DIR)}
    args["export"] = {**args.get("export", {}), "dirpath": str(path / EXPORT_DIR)}
    stats = TrainStats()
    tags = {"mlflow.parentRunId": parent_run_id} if parent_run_id else None
    last = path / CHECKPOINT_DIR / "last.ckpt"
    # an interrupted training continues its MLflow run (one run per artifact), from its last
    # checkpoint when it has one, else from scratch
    resume = last.exists() or (path / CHECKPOINT_DIR / RUN_ID_FILE).is_file()
    with quiet_lightning(path / TRAIN_LOG):  # Lightning's banners, tips and warnings: in the artifact's log
        return _fit_quietly(args, path, resume, tags, stats, callbacks, last, variant, seed)


TRAIN_LOG = "train.log"
"""Lightning's own output of an internal training (``--verbose`` prints it instead), in the artifact folder."""


def _fit_quietly(args, path, resume, tags, stats, callbacks, last, variant, seed):
    cli = DrafterCLI(args=args, run=False, resume=resume, logger_tags=tags,
                     callbacks=[stats, StopAtSafePoint(), *callbacks])
    trainer = cli.trainer
    try:
        with mark_failed_on_error([trainer.logger]):
            trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=str(last) if last.exists() else None)
            if trainer.interrupted:  # Lightning < 2.1 returned from an interrupted fit
                raise _STOP.interrupt()
    except (KeyboardInterrupt, SystemExit) as exc:
        cause = _interrupt_of(exc)  # Lightning ends an interrupted fit with SystemExit(1)
        if cause is None:
            raise
        step = int(trainer.global_step)
        err = Interrupted(getattr(cause, "signum", signal.SIGINT), f"training of {variant} s{seed} interrupted at "
                          f"step {step}", step)
        err._lit_domino_hinted = getattr(cause, "_lit_domino_hinted", False)  # the hint is printed once
        raise err from None
    return cli, stats


def _train_on_other_rank(cfg, path, experiment, run_name, table, callbacks, parent_run_id, progress):
    """A rank other than 0: the same fit (DDP needs every rank in it), no lock, no writes; then the
    artifact as rank 0 finished it."""
    t = cfg["tracking"]
    variant, preset, seed = t["variant"], t.get("preset"), int(cfg["seed_everything"])
    if cache.is_complete(path, warn=False):  # rank 0 reuses it too: nobody trains
        return _cached(path, variant, preset, seed)
    _fit(cfg, path, experiment, run_name, table, callbacks, parent_run_id, progress)
    # rank 0 holds the build lock until the artifact is complete (or its build failed): wait for it
    with cache.building(path, isolate_rng=False):
        pass
    if not cache.is_complete(path, warn=False):
        raise RuntimeError(f"global rank 0 did not finish the drafter {path} (see its log); rerun to resume")
    return _cached(path, variant, preset, seed, from_cache=False)


__all__ = ["RUN_ID_FILE", "Interrupted", "StopAtSafePoint", "TrainStats", "TrainedDrafter",
           "drafter_artifact", "install_stop_handlers", "interruptible", "is_rank_zero",
           "stop_requested", "train_variant", "training_key"]

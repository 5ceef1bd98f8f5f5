"""The clock of a long job (the ablation): measured seconds per stage and an ETA for the whole job.

Every stage is planned up front with its *reference seconds*: what it took in a measured run on a
quiet 2-core machine (the study file's ``reference_seconds``, copied from that run's
``stage_times.json``). A stage found in the cache costs nothing. The ETA is the remaining stages'
reference seconds times this machine's *slowness*: before a stage has finished, a one-second
calibration workload timed against the reference machine's figure (a noisy measure, trusted by its square
root: :data:`CALIBRATION_WEIGHT`), replaced as soon as the running stage reports its progress
(:meth:`JobClock.progress`; the embedded target's training does, :class:`StageProgress`) by its own rate;
once stages have finished, their measured seconds over their reference seconds. Stages that run in
parallel workers (the trainings) count ``1 / jobs`` of their time. So a busy or a slower machine gets
an ETA in its own seconds, and the estimate is revised at every stage. An ETA from the calibration alone is
printed as provisional (``job ETA ~30 min (provisional: ...)``); on the default preset the first measured one
follows at 5 % of the target's steps.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import torch
from lightning.pytorch.callbacks import Callback


@dataclass
class Stage:
    name: str
    """What the log and ``stage_times.json`` call it (``target``, ``train domino s0``, ...)."""
    reference: float
    """Its seconds on the reference machine (0 = unknown or cached: it adds nothing to the ETA)."""
    cached: bool = False
    parallel: bool = False
    """Runs beside other parallel stages (counts 1/jobs of its time in the ETA)."""
    started: float | None = None
    seconds: float | None = None
    """Measured wall seconds, once done."""
    info: dict = field(default_factory=dict)
    marks: list = field(default_factory=list)
    """``(time, fraction done)`` of its first and latest :meth:`JobClock.progress` report."""


MIN_PROGRESS = 0.02
"""A running stage's rate revises the slowness once it spans this fraction of the stage (the embedded target:
32 of 1,600 steps); before that, one slow first step would dominate it."""

CALIBRATION_WEIGHT = 0.5
"""Before any stage has finished, the slowness is (calibration ratio) ** CALIBRATION_WEIGHT: the calibration is
a noisy measure of a machine's speed: fresh runs whose stages ran at nearly one speed measured calibrations far
apart, and trusted fully it put their first ETAs further off than its square root did (measured: docs/results.md,
'figures behind the code's comments'). So an ETA from the calibration alone is labelled provisional
(:meth:`JobClock.eta`) until the job's own progress measures the machine."""


def calibration_seconds(threads: int | None = None) -> float:
    """Seconds of a fixed fp32 workload like the suite's (matmuls of a d = 192 layer, forward and backward,
    about 27 GFLOP) on ``threads`` torch threads (None: the current setting)."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(2048, 192, generator=g)
        w = torch.randn(192, 576, generator=g, requires_grad=True)
        (x @ w).sum().backward()  # warm-up
        start = time.perf_counter()
        for _ in range(20):
            (x @ w).relu().sum().backward()
        return time.perf_counter() - start
    finally:
        torch.set_num_threads(before)


class JobClock:
    """Stages of one job: plan them (with reference seconds), start and finish them, read the ETA.

    ``calibration``: the reference machine's :func:`calibration_seconds` (its best of three; None = no calibration: the
    slowness is 1 until a stage reports progress or finishes; see :data:`CALIBRATION_WEIGHT`). ``jobs``: how many
    parallel stages run at once."""

    def __init__(self, calibration: float | None = None, jobs: int = 1):
        self.t0 = time.time()
        self.jobs = max(1, int(jobs))
        self.stages: dict[str, Stage] = {}
        self.calibrated: float | None = None
        self.calibration: float | None = None  # this machine's calibration_seconds(), when measured
        if calibration:
            self.calibration = min(calibration_seconds() for _ in range(3))  # the least disturbed of three
            self.calibrated = (self.calibration / float(calibration)) ** CALIBRATION_WEIGHT

    def plan(self, name: str, reference: float = 0.0, *, cached: bool = False, parallel: bool = False) -> None:
        self.stages[name] = Stage(name, 0.0 if cached else float(reference or 0.0), cached, parallel)

    def start(self, name: str) -> None:
        if name not in self.stages:
            self.plan(name)
        self.stages[name].started = time.time()

    def finish(self, name: str, **info) -> float:
        """Mark ``name`` done (``info`` goes to its record, e.g. ``cached=True``); returns its seconds."""
        stage = self.stages[name]
        stage.seconds = time.time() - (stage.started or time.time())
        stage.info.update(info)
        if info.get("cached"):
            stage.cached, stage.reference = True, 0.0
        return stage.seconds

    def progress(self, name: str, fraction: float) -> None:
        """The running stage ``name`` is ``fraction`` (0..1) done. Until a stage has finished, the slowness is
        its rate between its first and latest report (fixed costs before the first report do not count)."""
        marks = self.stages[name].marks
        mark = (time.time(), min(1.0, max(0.0, float(fraction))))
        marks[:] = [marks[0], mark] if marks else [mark]

    def _progress_rate(self) -> float | None:
        for s in self.stages.values():
            if s.seconds is None and s.reference > 0 and len(s.marks) == 2:
                (t0, f0), (t1, f1) = s.marks
                if f1 - f0 >= MIN_PROGRESS:
                    return (t1 - t0) / ((f1 - f0) * s.reference)
        return None

    def _finished_with_reference(self) -> list[Stage]:
        return [s for s in self.stages.values() if s.seconds is not None and not s.cached and s.reference > 0]

    def measured(self) -> bool:
        """Whether the slowness comes from this job's own stages (a finished one, or the running stage's
        progress) rather than from the calibration guess."""
        return bool(self._finished_with_reference()) or self._progress_rate() is not None

    def slowness(self) -> float:
        """This machine's seconds per reference second (1 = as fast as the reference machine)."""
        done = self._finished_with_reference()
        if done:
            ref = sum(s.reference / (self.jobs if s.parallel else 1) for s in done)
            took = sum(s.seconds / (self.jobs if s.parallel else 1) for s in done)
            return took / ref
        return self._progress_rate() or self.calibrated or 1.0

    def eta_seconds(self) -> float:
        """Seconds until every planned stage is done, at the current :meth:`slowness`."""
        f, now, left = self.slowness(), time.time(), 0.0
        for s in self.stages.values():
            if s.seconds is not None or s.cached:
                continue
            if s.marks:  # what its progress says is left
                t1, f1 = s.marks[-1]
                remaining = (1.0 - f1) * s.reference * f - (now - t1)
            else:
                remaining = s.reference * f - (now - s.started if s.started else 0.0)
            left += max(0.0, remaining) / (self.jobs if s.parallel else 1)
        return left

    def eta(self) -> str:
        known = any(s.reference > 0 for s in self.stages.values() if s.seconds is None and not s.cached)
        if not known:
            return "job ETA: no reference times for what is left"
        if not self.measured():  # the calibration alone overestimates on a faster machine than the reference
            return f"job ETA ~{self.eta_seconds() / 60:.0f} min (provisional: this machine's speed is not measured yet)"
        return f"job ETA {self.eta_seconds() / 60:.1f} min"

    def elapsed(self) -> float:
        return time.time() - self.t0

    # ------------------------------------------------------------------ the record

    def finished(self) -> list[Stage]:
        """The finished stages in the order they started."""
        return sorted((s for s in self.stages.values() if s.seconds is not None), key=lambda s: s.started or 0.0)

    def summary(self) -> dict:
        """``stage_times.json``: seconds per finished stage (each marked cached or not), the total, the machine."""
        stages = [{"stage": s.name, "seconds": round(s.seconds, 1), "cached": s.cached, **s.info}
                  for s in self.finished()]
        return {"total_seconds": round(self.elapsed(), 1), "stages": stages, "jobs": self.jobs,
                "machine": {"cpus": os.cpu_count(), "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
                            "torch_threads": torch.get_num_threads(),
                            "calibration_seconds": None if self.calibration is None else round(self.calibration, 3),
                            "slowness_vs_reference": round(self.slowness(), 3)}}

    def report(self) -> str:
        """Where the time went: one line per finished stage, its share of the wall time, then the total.

        Parallel stages overlap, so their shares can add up to more than their phase's."""
        total = max(self.elapsed(), 1e-9)
        lines = ["where the time went:"]
        for s in self.finished():
            extra = " (cached)" if s.cached else " (in parallel)" if s.parallel and self.jobs > 1 else ""
            lines.append(f"  {s.name:<32} {s.seconds / 60:6.1f} min  {100 * s.seconds / total:5.1f} %{extra}")
        lines.append(f"  {'total':<32} {total / 60:6.1f} min")
        return "\n".join(lines)


class StageProgress(Callback):
    """A Lightning callback that reports a training's optimizer steps to a :class:`JobClock` stage, and calls
    ``echo(step, max_steps)`` once the training passes each fraction in ``at`` (a log line with the ETA).
    The default's first fraction, 5 % (80 of the default target's 1,600 steps), is the job's first
    measured ETA: at 2.5 % the first steps' warm-up still weighed in (measured: docs/results.md)."""

    def __init__(self, clock: JobClock, stage: str, echo=None, at=(0.05, 0.5)):
        self.clock, self.stage, self.echo, self.pending = clock, stage, echo, sorted(at)

    def on_train_batch_end(self, trainer, *args) -> None:
        total = trainer.max_steps
        if not total or total <= 0:
            return
        self.clock.progress(self.stage, trainer.global_step / total)
        while self.pending and trainer.global_step >= self.pending[0] * total:
            self.pending.pop(0)
            if self.echo is not None:
                self.echo(trainer.global_step, total)

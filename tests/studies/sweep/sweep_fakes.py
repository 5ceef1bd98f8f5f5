"""Helpers of the sweep tests: a fast deterministic evaluator, settings that use it, the CLI module."""

from __future__ import annotations

import importlib.util
import math
import os
import signal
import time
from pathlib import Path

from lit_domino.studies import sweep

ROOT = Path(__file__).resolve().parents[3]


def cli():
    """``sweeps/domino.py`` as a module (its ``main(argv)`` returns the exit code)."""
    spec = importlib.util.spec_from_file_location("sweeps_domino_cli", ROOT / "sweeps" / "domino.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def fake_value(p: dict) -> float:
    """The fake objective of sampled params ``p``."""
    return (1.0 + math.log2(p["rank"]) / 9 + 0.3 * p["lambda_start"] - 0.2 * abs(p["lambda_ratio"] - 1.0)
            + 0.2 * (p["lambda_kind"] == "linear") + 0.05 * math.log2(p["gru_hidden"]) / 8)


def add_trials(study, space, n: int) -> None:
    """``n`` finished trials of the fake objective, told directly (no worker, no MLflow runs)."""
    for _ in range(n):
        trial = study.ask()
        study.tell(trial, fake_value(space.suggest(trial)))


def wait_for(ready, timeout: float = 120.0) -> None:
    """Poll ``ready()`` (or a path's existence) until true or ``timeout`` s passed (the test's asserts then fail)."""
    check = ready.exists if isinstance(ready, Path) else ready
    give_up = time.monotonic() + timeout
    while not check() and time.monotonic() < give_up:
        time.sleep(0.05)


def fake_evaluator(ctx: sweep.TrialContext) -> sweep.TrialOutcome:
    """A deterministic objective of the sampled params, with the sweep's MLflow and pruning plumbing.

    ``$SWEEP_TEST_CRASH = kill|raise:<trial number>:<marker file>`` kills the worker process
    (SIGKILL: the trial stays RUNNING, its heartbeat stops) or raises in that trial, once (the
    marker file remembers). With ``kill``, trial ``<number> - 1`` finishes only after the kill (it
    waits for the marker), so the trial counts the workers see are the same on every run: the other
    worker finishes its first trial, starts the doomed one, and when this one finishes, finished +
    RUNNING trials cover the target (two workers finishing at once would both start another trial).
    ``$SWEEP_TEST_WORKERS = <folder>:<n>``: a trial waits until ``n`` processes have started one
    (each leaves its pid in the folder), so every worker runs a trial however slowly it starts.
    """
    workers = os.environ.get("SWEEP_TEST_WORKERS")
    if workers:
        folder, n = workers.rsplit(":", 1)
        (Path(folder) / str(os.getpid())).touch()
        wait_for(lambda: len(list(Path(folder).iterdir())) >= int(n))
    ctx.start_run()
    value = fake_value(ctx.params)
    for step in range(2):
        ctx.report(value * (0.8 + 0.2 * step), step)
    crash = os.environ.get("SWEEP_TEST_CRASH")
    if crash:
        mode, number, marker = crash.split(":", 2)
        if mode == "kill" and ctx.trial.number == int(number) - 1:
            wait_for(Path(marker))
        if ctx.trial.number == int(number) and not Path(marker).exists():
            Path(marker).touch()
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("injected crash in a trial")
    return sweep.TrialOutcome({"tau": value, "speedup": value / 2, "embedded-math/tau": value})


def fake_settings(tmp_path, name: str, **kw) -> sweep.SweepSettings:
    base = dict(study_name=name, storage=f"sqlite:///{tmp_path / f'{name}.db'}", preset="smoke", n_trials=3,
                evaluator="sweep_fakes:fake_evaluator", sampler_seed=0, heartbeat=0, n_startup_trials=2)
    base.update(kw)
    return sweep.SweepSettings(**base)


def states(study) -> dict:
    out = {}
    for t in study.get_trials(deepcopy=False):
        out[t.state.name] = out.get(t.state.name, 0) + 1
    return out

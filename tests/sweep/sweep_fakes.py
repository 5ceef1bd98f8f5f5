"""Helpers of the sweep tests: a fast deterministic evaluator, settings that use it, the CLI module."""

from __future__ import annotations

import importlib.util
import math
import os
import signal
import time
from pathlib import Path

from lit_domino import sweep

ROOT = Path(__file__).resolve().parents[2]


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


def fake_evaluator(ctx: sweep.TrialContext) -> sweep.TrialOutcome:
    """A deterministic objective of the sampled params, with the sweep's MLflow and pruning plumbing.

    ``$SWEEP_TEST_CRASH = kill|raise:<trial number>:<marker file>`` kills the worker process
    (SIGKILL: the trial stays RUNNING, its heartbeat stops) or raises in that trial, once (the
    marker file remembers). ``$SWEEP_TEST_WORKERS = <folder>:<n>``: a trial waits until ``n``
    processes have started one (each leaves its pid in the folder), so every worker runs a trial
    however slowly it starts.
    """
    workers = os.environ.get("SWEEP_TEST_WORKERS")
    if workers:
        folder, n = workers.rsplit(":", 1)
        (Path(folder) / str(os.getpid())).touch()
        give_up = time.monotonic() + 120
        while len(list(Path(folder).iterdir())) < int(n) and time.monotonic() < give_up:
            time.sleep(0.05)
    ctx.start_run()
    value = fake_value(ctx.params)
    for step in range(2):
        ctx.report(value * (0.8 + 0.2 * step), step)
    crash = os.environ.get("SWEEP_TEST_CRASH")
    if crash:
        mode, number, marker = crash.split(":", 2)
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

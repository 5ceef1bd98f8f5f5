"""Optuna sweeps (lit_domino.sweep, sweeps/domino.py): space validation, storage and study errors,
kill + resume with several worker processes, pruning granularity, summary plots, and one sweep through
the real train_variant + speculative decoding path."""

from __future__ import annotations

import importlib.util
import math
import os
import signal
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from lit_domino import sweep

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def _cli():
    spec = importlib.util.spec_from_file_location("sweeps_domino_cli", ROOT / "sweeps" / "domino.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --------------------------------------------------------------------------- a fast stand-in evaluator


def fake_evaluator(ctx: sweep.TrialContext) -> sweep.TrialOutcome:
    """A deterministic objective of the sampled params, with the sweep's MLflow and pruning plumbing.

    ``$SWEEP_TEST_CRASH = kill|raise:<trial number>:<marker file>`` kills the worker process
    (SIGKILL: the trial stays RUNNING) or raises in that trial, once (the marker file remembers).
    """
    ctx.start_run()
    p = ctx.params
    value = (1.0 + math.log2(p["rank"]) / 9 + 0.3 * p["lambda_start"] - 0.2 * abs(p["lambda_ratio"] - 1.0)
             + 0.2 * (p["lambda_kind"] == "linear") + 0.05 * math.log2(p["gru_hidden"]) / 8)
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
                evaluator="test_sweep:fake_evaluator", sampler_seed=0, heartbeat=0, n_startup_trials=2)
    base.update(kw)
    return sweep.SweepSettings(**base)


def _states(study) -> dict:
    out = {}
    for t in study.get_trials(deepcopy=False):
        out[t.state.name] = out.get(t.state.name, 0) + 1
    return out


@pytest.fixture
def importable_tests(monkeypatch):
    """Spawned workers import this module's fake evaluator as ``test_sweep:fake_evaluator``."""
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")]))


# --------------------------------------------------------------------------- search space


def test_shipped_space():
    space = sweep.load_space()
    by = {p.name: p for p in space.params}
    assert space.variant == "domino"
    assert (by["rank"].low, by["rank"].high, by["rank"].log, by["rank"].target) == (16, 512, True, "model.rank")
    assert set(by["lambda_kind"].choices) == {"linear", "cosine", "step", "constant", "none"}
    assert {"gru_hidden", "lambda_start", "lambda_ratio"} <= set(by)
    cfg = sweep.trial_config(sweep.SweepSettings(preset="smoke", max_steps=5), space,
                             {"rank": 17, "gru_hidden": 40, "lambda_kind": "cosine", "lambda_start": 0.5,
                              "lambda_ratio": 0.75})
    init = cfg["model"]["init_args"]
    assert (init["rank"], init["gru_hidden"]) == (17, 40)
    assert init["curriculum"] == {"kind": "cosine", "start": 0.5, "ratio": 0.75, "step_every": 0.25}
    assert cfg["trainer"]["max_steps"] == 5 and cfg["trainer"]["val_check_interval"] == 5  # validation happens


@pytest.mark.parametrize("spec, message", [
    ({"type": "int", "low": 512, "high": 16, "target": "model.rank"}, "empty range"),
    ({"type": "float", "low": 0.5, "high": 0.5, "target": "model.curriculum.start"}, "empty range"),
    ({"type": "categorical", "choices": [], "target": "model.curriculum.kind"}, "empty choices"),
    ({"type": "int", "low": 0, "high": 64, "log": True, "target": "model.rank"}, "log-scale range needs low > 0"),
    ({"type": "int", "low": 0, "high": 64, "target": "model.rank"}, "positive integer"),
    ({"type": "float", "low": 0.5, "high": 1.5, "target": "model.curriculum.start"}, r"in \[0, 1\]"),
    ({"type": "categorical", "choices": ["linear", "exp"], "target": "model.curriculum.kind"}, "one of"),
    ({"type": "uniform", "low": 1, "high": 2, "target": "model.rank"}, "type must be one of"),
    ({"type": "int", "low": 1, "high": 2}, "target must be a dotted config key"),
    ({"type": "int", "low": 1.5, "high": 8, "target": "model.rank"}, "must be an integer"),
])
def test_space_errors(spec, message):
    with pytest.raises(sweep.SearchSpaceError, match=message):
        sweep.parse_space({"params": {"p": spec}})


def test_space_file_errors(tmp_path, capsys):
    with pytest.raises(sweep.SearchSpaceError, match="'params' is empty"):
        sweep.parse_space({"variant": "domino", "params": {}})
    with pytest.raises(sweep.SearchSpaceError, match="same config key"):
        sweep.parse_space({"params": {"a": {"type": "int", "low": 1, "high": 4, "target": "model.rank"},
                                      "b": {"type": "int", "low": 1, "high": 4, "target": "model.init_args.rank"}}})
    with pytest.raises(sweep.SearchSpaceError, match="does not exist"):
        sweep.load_space(tmp_path / "missing.yaml")
    bad = tmp_path / "space.yaml"
    bad.write_text(yaml.safe_dump({"params": {"rank": {"type": "int", "low": 64, "high": 32, "target": "model.rank"}}}))
    rc = _cli().main(["run", "--space", str(bad), "--storage", f"sqlite:///{tmp_path / 'x.db'}", "--preset", "smoke"])
    err = capsys.readouterr().err
    assert rc == 2 and "empty range" in err and "rank" in err
    assert not (tmp_path / "x.db").exists()  # nothing created before the space is valid


# --------------------------------------------------------------------------- storage and study errors


@pytest.mark.parametrize("url, message", [
    ("sqlite:////no/such/dir/study.db", "does not exist"),
    ("journal:/no/such/dir/study.journal", "does not exist"),
    ("nosuchdialect://user@host/db", "cannot open the Optuna storage"),
    ("just-a-name", "neither a URL nor a journal file"),
    ("", "empty"),
])
def test_storage_errors(url, message):
    with pytest.raises(sweep.StorageError, match=message):
        sweep.open_storage(url)


def test_storage_error_from_the_cli(tmp_path, capsys):
    cli = _cli()
    assert cli.main(["summary", "--storage", "sqlite:////no/such/dir/s.db"]) == 2
    assert "cannot open the Optuna storage" in capsys.readouterr().err
    assert cli.main(["summary", "--study-name", "absent", "--storage", f"sqlite:///{tmp_path / 's.db'}"]) == 2
    assert "no study 'absent'" in capsys.readouterr().err


def test_different_space_or_objective_is_an_error(tmp_path, importable_tests):
    space = sweep.load_space()
    settings = fake_settings(tmp_path, "mismatch", n_trials=1)
    sweep.run_worker(settings, space, echo=lambda *_: None)
    data = space.to_dict()
    data["params"]["rank"]["high"] = 256
    other = sweep.parse_space(data)
    with pytest.raises(sweep.StudyMismatchError, match=r"DIFFERENT search space(.|\n)*rank"):
        sweep.create_or_load_study(settings, other)
    with pytest.raises(sweep.StudyMismatchError, match="objective"):
        sweep.create_or_load_study(fake_settings(tmp_path, "mismatch", objective="speedup"), space)
    sweep.create_or_load_study(settings, sweep.load_space())  # the same space attaches fine


def test_journal_storage(tmp_path, importable_tests):
    settings = fake_settings(tmp_path, "journal", storage=f"journal:{tmp_path / 'j.journal'}", n_trials=2)
    study = sweep.run_worker(settings, sweep.load_space(), echo=lambda *_: None)
    assert _states(study) == {"COMPLETE": 2}


# --------------------------------------------------------------------------- crash and resume


def test_kill_a_worker_then_resume(tmp_path, importable_tests, monkeypatch, capsys):
    """Two worker processes on one study; the one running trial 1 is SIGKILLed; --resume finishes the study."""
    from mlflow.tracking import MlflowClient

    from lit_domino.tracking import default_tracking_uri

    cli = _cli()
    storage = f"sqlite:///{tmp_path / 'kill.db'}"
    args = ["run", "--study-name", "kill", "--storage", storage, "--preset", "smoke", "--n-trials", "3",
            "--evaluator", "test_sweep:fake_evaluator", "--sampler-seed", "0", "--heartbeat", "0"]
    monkeypatch.setenv("SWEEP_TEST_CRASH", f"kill:1:{tmp_path / 'killed'}")
    assert cli.main(args + ["--workers", "2"]) == 1  # a worker died
    assert "failed; rerun with --resume" in capsys.readouterr().err
    study = optuna.load_study(study_name="kill", storage=storage)
    assert _states(study) == {"COMPLETE": 2, "RUNNING": 1}
    assert study.trials[1].state == TrialState.RUNNING and (tmp_path / "killed").exists()
    pids = {t.user_attrs["worker_pid"] for t in study.trials}
    assert len(pids) == 2 and os.getpid() not in pids  # two worker processes attached to the study

    assert cli.main(args + ["--resume"]) == 0
    out = capsys.readouterr().out
    assert "trials [1] were RUNNING on dead workers" in out
    study = optuna.load_study(study_name="kill", storage=storage)
    assert _states(study) == {"COMPLETE": 3, "FAIL": 1}
    retry = study.trials[3]
    assert retry.system_attrs["failed_trial"] == 1 and retry.params == study.trials[1].params
    client = MlflowClient(default_tracking_uri())
    parent = study.user_attrs[sweep.RUN_ATTR]
    assert client.get_run(parent).info.status == "FINISHED"
    assert client.get_run(study.trials[1].user_attrs["mlflow_run_id"]).info.status == "FAILED"
    for t in study.get_trials(states=(TrialState.COMPLETE,)):
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        assert run.data.tags["mlflow.parentRunId"] == parent and run.info.status == "FINISHED"
        assert run.data.metrics["objective"] == pytest.approx(t.value)
        assert run.data.params["trial.rank"] == str(t.params["rank"])
    # done: another run of the same command has nothing left to do
    assert cli.main(args) == 0 and "already has 3 finished trials" in capsys.readouterr().out


def test_exception_in_a_trial_then_resume(tmp_path, importable_tests, monkeypatch):
    from mlflow.tracking import MlflowClient

    from lit_domino.tracking import default_tracking_uri

    space, settings = sweep.load_space(), fake_settings(tmp_path, "boom")
    monkeypatch.setenv("SWEEP_TEST_CRASH", f"raise:1:{tmp_path / 'raised'}")
    with pytest.raises(RuntimeError, match="injected crash"):
        sweep.run_worker(settings, space, echo=lambda *_: None)
    study = optuna.load_study(study_name="boom", storage=settings.storage)
    assert _states(study) == {"COMPLETE": 1, "FAIL": 1}
    client = MlflowClient(default_tracking_uri())
    assert client.get_run(study.trials[1].user_attrs["mlflow_run_id"]).info.status == "FAILED"
    assert client.get_run(study.user_attrs[sweep.RUN_ATTR]).info.status == "FAILED"  # never left RUNNING
    study = sweep.run_worker(settings, space, resume=True, echo=lambda *_: None)
    assert _states(study) == {"COMPLETE": 3, "FAIL": 1}
    assert study.trials[2].params == study.trials[1].params  # the failed configuration is retried first
    assert client.get_run(study.user_attrs[sweep.RUN_ATTR]).info.status == "FINISHED"


# --------------------------------------------------------------------------- pruning granularity


def _fit_with_pruning(trial, **trainer_kwargs):
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(1, 1)

        def training_step(self, batch, i):
            return self.w(batch[0]).pow(2).mean()

        def validation_step(self, batch, i):
            self.log("val/tau_sim", 1.0 + self.global_step / 10)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    cb = sweep.PruningCallback(trial)
    data = lambda: DataLoader(TensorDataset(torch.zeros(4, 1)), batch_size=1)  # noqa: E731
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=1, callbacks=[cb], **trainer_kwargs)
    trainer.fit(Tiny(), data(), data())
    return cb


def test_pruning_reports_once_per_validation_at_the_right_step():
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.NopPruner())
    trial = study.ask()
    cb = _fit_with_pruning(trial, max_epochs=2)  # once per epoch: step = epoch
    assert [s for s, _ in cb.reported] == [0, 1]
    trial = study.ask()
    cb = _fit_with_pruning(trial, max_epochs=2, val_check_interval=2)  # every 2 steps: step = optimizer step
    assert [s for s, _ in cb.reported] == [2, 4, 6, 8]
    assert study._storage.get_trial(trial._trial_id).intermediate_values == pytest.approx({2: 1.2, 4: 1.4, 6: 1.6, 8: 1.8})
    pruning = optuna.create_study(direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=5.0))
    with pytest.raises(optuna.TrialPruned, match="pruned at step 0"):
        _fit_with_pruning(pruning.ask(), max_epochs=3)


# --------------------------------------------------------------------------- summary


def test_summary_prints_best_and_writes_plots(tmp_path, importable_tests, capsys):
    from mlflow.tracking import MlflowClient

    from lit_domino.tracking import default_tracking_uri

    settings = fake_settings(tmp_path, "summ", n_trials=4)
    sweep.run_worker(settings, sweep.load_space(), echo=lambda *_: None)
    out = tmp_path / "plots"
    assert _cli().main(["summary", "--study-name", "summ", "--storage", settings.storage, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "best trial #" in text and "parameter importances:" in text and "rank" in text
    for name in ("history", "importances", "slice"):
        assert (out / f"{name}.png").stat().st_size > 1000
    study = optuna.load_study(study_name="summ", storage=settings.storage)
    client = MlflowClient(default_tracking_uri())
    logged = {f.path for f in client.list_artifacts(study.user_attrs[sweep.RUN_ATTR], "optuna")}
    assert {"optuna/history.png", "optuna/importances.png", "optuna/slice.png"} <= logged


def test_summary_with_too_few_trials(tmp_path, importable_tests, capsys):
    settings = fake_settings(tmp_path, "one", n_trials=1)
    study = sweep.run_worker(settings, sweep.load_space(), echo=lambda *_: None)
    result = sweep.summarize(study, tmp_path / "p", log_to_mlflow=False)
    assert "need at least 2 completed trials (have 1)" in capsys.readouterr().out
    assert result["importances"] is None and result["best"]["number"] == 0
    assert (tmp_path / "p" / "history.png").exists() and not (tmp_path / "p" / "importances.png").exists()


# --------------------------------------------------------------------------- the real path


class _PruneTrialOne(optuna.pruners.BasePruner):
    def prune(self, study, trial) -> bool:
        return trial.number == 1


def test_real_sweep_trains_and_decodes(tiny_target_dir, tmp_path):
    """Real train_variant (+ pruning callback) and real speculative decoding on a tiny random target."""
    import torch
    from mlflow.tracking import MlflowClient

    from lit_domino.tracking import default_tracking_uri

    torch.set_num_threads(1)
    settings = sweep.SweepSettings(
        study_name="real", storage=f"sqlite:///{tmp_path / 'real.db'}", preset="smoke", n_trials=2, sampler_seed=1,
        heartbeat=0, pruner=_PruneTrialOne(), max_steps=2, prompts_per_domain=1, max_new_tokens=8,
        overrides={"data.target": str(tiny_target_dir), "data.train_examples": {"math": 4, "code": 2, "chat": 2},
                   "data.val_examples": {"math": 2, "code": 1, "chat": 1}, "data.max_new_tokens": 16,
                   "data.batch_size": 4, "data.num_anchors": 4, "data.max_length": 128})
    space = sweep.load_space()
    study = sweep.run_worker(settings, space, echo=lambda *_: None)
    done, pruned = study.trials
    assert done.state == TrialState.COMPLETE and pruned.state == TrialState.PRUNED
    assert math.isfinite(done.value) and done.value >= 1.0  # mean τ over benchmarks, bonus token included
    assert list(done.intermediate_values) == [2]  # val/tau_sim reported at optimizer step 2
    client = MlflowClient(default_tracking_uri())
    parent = study.user_attrs[sweep.RUN_ATTR]
    run = client.get_run(done.user_attrs["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["mlflow.parentRunId"] == parent
    assert run.data.tags["variant"] == "domino" and run.data.params["model.rank"] == str(done.params["rank"])
    for key in ("objective", "tau", "speedup", "embedded-math/tau", "embedded-chat/speedup", "val/tau_sim"):
        assert key in run.data.metrics, key
    assert len(client.get_metric_history(run.info.run_id, "train/loss")) >= 1  # the training curve
    killed = client.get_run(pruned.user_attrs["mlflow_run_id"])
    assert killed.info.status == "KILLED" and killed.data.tags["optuna.state"] == "PRUNED"

    # the same configuration again: the cached drafter is reused, decoded, and logged as a new nested run
    study.enqueue_trial(done.params)
    settings.n_trials = 3
    study = sweep.run_worker(settings, space, echo=lambda *_: None)
    again = study.trials[2]
    assert again.state == TrialState.COMPLETE and again.value == pytest.approx(done.value, rel=0, abs=1e-9)
    run = client.get_run(again.user_attrs["mlflow_run_id"])
    assert run.info.run_id != done.user_attrs["mlflow_run_id"]
    assert run.data.tags["drafter_run_id"] == done.user_attrs["mlflow_run_id"]
    assert run.data.tags["mlflow.parentRunId"] == parent

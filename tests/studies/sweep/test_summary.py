"""lit_domino.studies.sweep.summary: best trial, importances and plots, on disk and in the study's MLflow run."""

from __future__ import annotations

import optuna
from mlflow.tracking import MlflowClient
from sweep_fakes import add_trials, cli, fake_settings

from lit_domino.studies import sweep
from lit_domino.runtime.tracking import default_tracking_uri


def test_summary_prints_best_and_writes_plots(tmp_path, capsys):
    space, settings = sweep.load_space(), fake_settings(tmp_path, "summ", n_trials=4)
    study = sweep.create_or_load_study(settings, space)
    sweep.ensure_study_run(study, settings, space)
    add_trials(study, space, 4)
    out = tmp_path / "plots"
    assert cli().main(["summary", "--study-name", "summ", "--storage", settings.storage, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "best trial #" in text and "parameter importances:" in text and "rank" in text
    for name in ("history", "importances", "slice"):
        assert (out / f"{name}.png").stat().st_size > 1000
    study = optuna.load_study(study_name="summ", storage=settings.storage)
    client = MlflowClient(default_tracking_uri())
    logged = {f.path for f in client.list_artifacts(study.user_attrs[sweep.RUN_ATTR], "optuna")}
    assert {"optuna/history.png", "optuna/importances.png", "optuna/slice.png"} <= logged


def test_summary_with_too_few_trials(tmp_path, capsys):
    space, settings = sweep.load_space(), fake_settings(tmp_path, "one", n_trials=1)
    study = sweep.create_or_load_study(settings, space)
    add_trials(study, space, 1)
    result = sweep.summarize(study, tmp_path / "p", log_to_mlflow=False)
    assert "need at least 2 completed trials (have 1)" in capsys.readouterr().out
    assert result["importances"] is None and result["best"]["number"] == 0
    assert (tmp_path / "p" / "history.png").exists() and not (tmp_path / "p" / "importances.png").exists()


def test_summary_warns_when_every_finished_trial_has_the_same_objective(tmp_path, capsys):
    """Issue 34: the quick sweep of docs/mlflow.md gave every trial the same τ to 16 digits (20 steps: the zero-started
    correction flips no pick), and the summary presented a best trial and importances as if they meant something."""
    space, settings = sweep.load_space(), fake_settings(tmp_path, "flat", n_trials=3)
    study = sweep.create_or_load_study(settings, space)
    for _ in range(3):
        trial = study.ask()
        space.suggest(trial)
        study.tell(trial, 1.3151515151515152)
    result = sweep.summarize(study, tmp_path / "p", log_to_mlflow=False)
    text = capsys.readouterr().out
    assert "warning: all 3 finished trials have the same tau = 1.3151515151515152" in text
    assert "too few training steps" in text and "--max-steps" in text
    assert result["warning"].startswith("warning: all 3 finished trials")
    assert text.index("warning: all 3") < text.index("best trial #")  # before the numbers it makes meaningless


def test_no_same_objective_warning_when_trials_differ_or_only_one_finished(tmp_path, capsys):
    from lit_domino.studies.sweep.summary import same_objective_warning

    assert same_objective_warning([1.5]) is None and same_objective_warning([]) is None
    assert same_objective_warning([1.3152, 1.3153]) is None
    assert same_objective_warning([1.0, 1.0 + 1e-15], "tau") is not None  # equal up to float noise
    space, settings = sweep.load_space(), fake_settings(tmp_path, "varied", n_trials=4)
    study = sweep.create_or_load_study(settings, space)
    add_trials(study, space, 4)
    result = sweep.summarize(study, tmp_path / "p", log_to_mlflow=False)
    assert "finished trials have the same" not in capsys.readouterr().out and "warning" not in result

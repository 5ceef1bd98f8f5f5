"""The ablation's study run (lit_domino.studies.study_runs): seed aggregates, one run per study across reruns,
the training runs nested under it, the job's outcome as its status, the experiment's mode and saved view."""

from __future__ import annotations

import json
import statistics

import pytest

from lit_domino.runtime import tracking
from lit_domino.studies import study_runs


@pytest.fixture
def client(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return MlflowClient(tracking.ensure_store(uri))


def _records():
    out = []
    for seed, (math_tau, code_tau) in enumerate([(3.0, 2.0), (4.0, 2.0)]):
        out += [{"variant": "domino", "seed": seed, "domain": "math", "tau": math_tau, "speedup": 1.5},
                {"variant": "domino", "seed": seed, "domain": "code", "tau": code_tau, "speedup": 1.1}]
    out.append({"variant": "domino@full", "seed": 0, "domain": "math", "tau": 3.5, "speedup": 1.2})
    return out


def test_study_metrics_are_the_seed_mean_and_spread_per_variant_and_benchmark():
    m = study_runs.study_metrics(_records(), ["math", "code"])
    assert m["domino/tau"] == pytest.approx(2.75)  # seeds' means over benchmarks: 2.5 and 3.0
    assert m["domino/tau_spread"] == pytest.approx(statistics.stdev([2.5, 3.0]))
    assert m["domino/math/tau"] == pytest.approx(3.5) and m["domino/math/tau_spread"] == pytest.approx(2 ** 0.5 / 2)
    assert m["domino/code/tau_spread"] == 0.0 and m["domino/code/speedup"] == pytest.approx(1.1)
    assert m["domino_full/math/tau"] == 3.5  # MLflow takes no '@'
    assert not [k for k in m if "@" in k]


def test_one_study_run_per_study_with_the_trainings_nested_and_the_jobs_outcome(client):
    exp = tracking.ensure_experiment("ablation-x")
    training = client.create_run(exp, run_name="domino-x-s0").info.run_id
    client.set_terminated(training, "FINISHED")
    with study_runs.StudyRun() as study:
        first = study.open("ablation-x", "ablation-x", {"preset": "x"}, ["math", "code"])
        assert client.get_run(first).info.status == "RUNNING"
        study.adopt([training, None])
        study.log(_records(), ["math", "code"], [], [])
    run = client.get_run(first)
    assert run.info.status == "FINISHED" and run.info.run_name == "ablation-x"
    assert run.data.tags["study"] == "ablation-x" and run.data.tags["table"] == "summary"
    assert run.data.metrics["domino/tau"] == pytest.approx(2.75)
    assert client.get_run(training).data.tags[study_runs.PARENT_TAG] == first

    with pytest.raises(KeyboardInterrupt):  # a rerun of the same study reopens its run; Ctrl-C ends it KILLED
        with study_runs.StudyRun() as again:
            assert again.open("ablation-x", "ablation-x", {"preset": "x"}, ["math"]) == first
            raise KeyboardInterrupt
    assert client.get_run(first).info.status == "KILLED"
    with pytest.raises(ValueError):
        with study_runs.StudyRun() as other:
            subset = other.open("ablation-x", "ablation-x-domino", {"preset": "x"}, ["math"])
            raise ValueError("boom")
    assert subset != first and client.get_run(subset).info.status == "FAILED"
    with study_runs.StudyRun():  # never opened (the job failed its checks): no run at all
        pass
    assert len(client.search_runs([exp])) == 3


def test_the_experiment_is_for_model_training_with_a_saved_tau_speedup_view(client):
    with study_runs.StudyRun() as study:
        study.open("ablation-y", "ablation-y", {}, ["math", "code"])
    exp = client.get_experiment_by_name("ablation-y")
    assert exp.tags[tracking.EXPERIMENT_KIND_TAG] == tracking.MODEL_TRAINING
    view = json.loads(exp.tags[tracking.SAVED_VIEW_PREFIX + study_runs.VIEW_ID])
    state = json.loads(view["state"])
    assert view["name"] == study_runs.VIEW_NAME
    assert state["selectedColumns"] == ["metrics.`tau`", "metrics.`speedup`", "metrics.`speedup_vs_compiled_ar`",
                                        "metrics.`math/tau`",
                                        "metrics.`code/tau`", "tags.`variant`", "tags.`seed`"]
    assert "orderByKey" not in state  # sorted by a metric, the UI stops nesting the runs
    # a view the user overrode in the UI is kept
    client.set_experiment_tag(exp.experiment_id, tracking.SAVED_VIEW_PREFIX + study_runs.VIEW_ID, "mine")
    assert not tracking.save_runs_view(client, exp.experiment_id, study_runs.VIEW_ID, "x", {})
    assert client.get_experiment(exp.experiment_id).tags[tracking.SAVED_VIEW_PREFIX + study_runs.VIEW_ID] == "mine"

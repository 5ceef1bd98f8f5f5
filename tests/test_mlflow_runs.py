"""One MLflow run per training, each step once: a rebuilt drafter does not reopen its finished run (a new run
supersedes it), and a resumed training does not log the steps it replays twice."""

from __future__ import annotations

import signal
import time

import lightning as L
import pytest

from lit_domino.training import configs, experiment
from lit_domino.runtime import tracking

# 16 training examples in batches of 4: 4 steps an epoch, 8 in all; train/* logged every step
TINY = {"data.train_examples": {"math": 8, "code": 4, "chat": 4}, "data.val_examples": {"math": 2, "code": 1, "chat": 1},
        "data.max_new_tokens": 16, "data.batch_size": 4, "data.num_anchors": 4, "data.max_length": 128,
        "trainer.max_epochs": 2, "trainer.log_every_n_steps": 1}
STEPS = 8


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A private SQLite store: the runs of one test, nobody else's."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return MlflowClient(tracking.ensure_store(uri))


def _config(tiny_target_dir, **overrides):
    return configs.load_config("backbone", "smoke", overrides={**TINY, "data.target": str(tiny_target_dir),
                                                                  **overrides})


def _history(client, run_id, key="train/loss"):
    return [(m.step, m.value, m.timestamp) for m in sorted(client.get_metric_history(run_id, key),
                                                           key=lambda m: (m.step, m.timestamp))]


def _all_history(client, run_id):
    return {k: _history(client, run_id, k) for k in client.get_run(run_id).data.metrics}


def _runs(client, name):
    return client.search_runs([client.get_experiment_by_name(name).experiment_id])


def test_rebuilt_drafter_starts_a_new_run_that_supersedes_the_finished_one(tiny_target_dir, tmp_path, store,
                                                                            one_thread):
    cfg = _config(tiny_target_dir, **{"trainer.max_epochs": 1})
    first = experiment.train_variant(cfg, experiment="rebuild", progress=False, root=tmp_path)
    old = first.run_id
    before = _all_history(store, old)
    assert [s for s, _, _ in before["train/loss"]] == list(range(STEPS // 2))
    assert store.get_run(old).data.tags["training_complete"] == "true"

    weights = first.drafter_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a truncated file: rebuilt
    rebuilt = experiment.train_variant(cfg, experiment="rebuild", progress=False, root=tmp_path)

    assert not rebuilt.from_cache and rebuilt.run_id != old
    assert sorted(r.info.run_id for r in _runs(store, "rebuild")) == sorted([old, rebuilt.run_id])
    old_run, new_run = store.get_run(old), store.get_run(rebuilt.run_id)
    assert old_run.info.status == "FINISHED" and new_run.info.status == "FINISHED"
    assert old_run.data.tags["superseded_by"] == rebuilt.run_id
    assert new_run.data.tags["supersedes"] == old
    assert "superseded_by" not in new_run.data.tags
    assert _all_history(store, old) == before  # the finished run is left as it was
    assert [s for s, _, _ in _history(store, rebuilt.run_id)] == list(range(STEPS // 2))
    assert rebuilt.report["run_id"] == rebuilt.run_id
    assert (rebuilt.drafter_dir.parent / "checkpoints" / "mlflow_run_id").read_text().strip() == rebuilt.run_id


def test_recorded_run_continues_only_an_interrupted_training(tmp_path, store):
    """The run recorded beside the checkpoints: continued when its training was interrupted; superseded when the
    training completed, even where a later stage changed its status (a sweep marks a run whose decoding failed
    FAILED, and RUNNING while it decodes); a new run when the store does not have it."""
    from lit_domino.training.cli import recorded_run

    exp = tracking.ensure_experiment("recorded")

    def folder(status=None, tags=None, run_id=None):
        if run_id is None:
            run_id = store.create_run(exp, tags=tags or {}).info.run_id
            if status != "RUNNING":
                store.set_terminated(run_id, status)
        (tmp_path / run_id).mkdir()
        (tmp_path / run_id / "mlflow_run_id").write_text(run_id + "\n")
        return tmp_path / run_id, run_id

    for status in ("RUNNING", "KILLED", "FAILED"):
        path, run_id = folder(status)
        assert recorded_run(path) == (run_id, None), status
    for status, tags in (("FINISHED", None), ("FAILED", {"training_complete": "true"}),
                         ("RUNNING", {"training_complete": "true"})):
        path, run_id = folder(status, tags)
        assert recorded_run(path) == (None, run_id), (status, tags)
    path, _ = folder(run_id="0" * 32)
    assert recorded_run(path) == (None, None)
    assert recorded_run(tmp_path / "nothing-recorded") == (None, None)


class _Interrupt(L.Callback):
    """Ctrl-C before optimizer step ``step`` (as KeyboardInterrupt arrives in the main thread)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise KeyboardInterrupt


def _interrupt(cfg, step, **kwargs):
    handler = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises((KeyboardInterrupt, SystemExit)):
            experiment.train_variant(cfg, callbacks=[_Interrupt(step)], progress=False, **kwargs)
    finally:
        signal.signal(signal.SIGINT, handler)  # Lightning ignores further Ctrl-C while it shuts down


def test_resumed_training_logs_each_step_once(tiny_target_dir, tmp_path, store, one_thread):
    """last.ckpt at step 5, Ctrl-C after step 6: the interrupted process logged steps 0-5 (the point of step 5
    after the checkpoint); the resumed training continues from the checkpoint and logs 5-7. The run keeps 0-4
    of the first process and 5-7 of the resumed one: each step once, the discarded trajectory's point gone."""
    cfg = _config(tiny_target_dir, **{"checkpoint.resume_every_n_steps": 5})
    _interrupt(cfg, 6, experiment="resume", root=tmp_path)
    path = experiment.drafter_artifact(cfg, root=tmp_path)
    run_id = (path / "checkpoints" / "mlflow_run_id").read_text().strip()
    assert store.get_run(run_id).info.status == "KILLED"
    assert [s for s, _, _ in _history(store, run_id)] == list(range(6))

    resumed_at = int(time.time() * 1000)
    done = experiment.train_variant(cfg, experiment="resume", progress=False, root=tmp_path)
    assert done.run_id == run_id and [r.info.run_id for r in _runs(store, "resume")] == [run_id]
    run = store.get_run(run_id)
    assert run.info.status == "FINISHED" and "supersedes" not in run.data.tags
    for key, points in _all_history(store, run_id).items():
        if key == "epoch":  # Lightning logs it with the train and the val metrics of a step, in every run
            continue
        steps = [s for s, _, _ in points]
        assert len(steps) == len(set(steps)), f"{key} logs a step twice: {steps}"
    history = _history(store, run_id)
    assert [s for s, _, _ in history] == list(range(STEPS))
    assert all((t >= resumed_at) == (s >= 5) for s, _, t in history)  # steps from 5 on: the resumed trajectory
    assert run.data.metrics["train/loss"] == history[-1][1]  # the latest value: the last step's


def test_training_interrupted_before_its_first_checkpoint_restarts_its_history(tiny_target_dir, tmp_path, store,
                                                                                one_thread):
    """No checkpoint to resume from: the rerun trains from step 0 in the same run; the first attempt's points
    (all from a discarded trajectory) are replaced, not doubled."""
    cfg = _config(tiny_target_dir, **{"trainer.max_epochs": 1, "checkpoint.resume_every_n_steps": 0})
    _interrupt(cfg, 2, experiment="restart", root=tmp_path)
    path = experiment.drafter_artifact(cfg, root=tmp_path)
    assert not (path / "checkpoints" / "last.ckpt").exists()
    run_id = (path / "checkpoints" / "mlflow_run_id").read_text().strip()
    assert [s for s, _, _ in _history(store, run_id)] == [0, 1]
    done = experiment.train_variant(cfg, experiment="restart", progress=False, root=tmp_path)
    assert done.run_id == run_id
    assert [s for s, _, _ in _history(store, run_id)] == list(range(STEPS // 2))


def test_drop_metrics_from_recomputes_the_latest_values(store):
    exp = tracking.ensure_experiment("drop")
    run_id = store.create_run(exp).info.run_id
    for step in range(10):
        store.log_metric(run_id, "a", float(step), step=step)
        store.log_metric(run_id, "b", 10.0 * step, step=step)
    store.log_metric(run_id, "late", 1.0, step=7)
    assert tracking.drop_metrics_from(store, run_id, 5) == 11
    assert [m.step for m in store.get_metric_history(run_id, "a")] == [0, 1, 2, 3, 4]
    assert store.get_run(run_id).data.metrics == {"a": 4.0, "b": 40.0}  # "late" had only dropped points
    store.log_metric(run_id, "a", 99.0, step=5)  # the resumed training logs on
    assert store.get_run(run_id).data.metrics["a"] == 99.0


def test_a_store_that_cannot_drop_points_skips_the_logged_steps(tiny_target_dir, tmp_path, store, monkeypatch,
                                                                 one_thread, caplog):
    """A tracking server cannot delete points: the resumed training leaves out the steps already logged."""
    monkeypatch.setattr(tracking, "drop_metrics_from", lambda *a, **k: None)
    cfg = _config(tiny_target_dir, **{"trainer.max_epochs": 1, "checkpoint.resume_every_n_steps": 2})
    _interrupt(cfg, 3, experiment="no-delete", root=tmp_path)  # last.ckpt at step 2, steps 0-2 logged
    with caplog.at_level("WARNING", logger="lit_domino.runtime.tracking"):
        done = experiment.train_variant(cfg, experiment="no-delete", progress=False, root=tmp_path)
    assert "cannot delete metric points" in caplog.text
    assert [s for s, _, _ in _history(store, done.run_id)] == list(range(STEPS // 2))


def test_a_recorded_run_missing_from_the_store_gives_a_new_run(tiny_target_dir, tmp_path, store, monkeypatch,
                                                               one_thread, caplog):
    """The run beside an interrupted training's checkpoints is gone (a deleted mlflow.db): a new run, a warning."""
    cfg = _config(tiny_target_dir, **{"trainer.max_epochs": 1, "checkpoint.resume_every_n_steps": 0})
    _interrupt(cfg, 2, experiment="gone", root=tmp_path)
    path = experiment.drafter_artifact(cfg, root=tmp_path)
    gone = (path / "checkpoints" / "mlflow_run_id").read_text().strip()
    other = f"sqlite:///{tmp_path / 'other.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", other)
    with caplog.at_level("WARNING", logger="lit_domino.training.cli"):
        done = experiment.train_variant(cfg, experiment="gone", progress=False, root=tmp_path)
    assert gone in caplog.text and "not in the tracking store" in caplog.text
    from mlflow.tracking import MlflowClient

    client = MlflowClient(other)
    assert done.run_id != gone and client.get_run(done.run_id).info.status == "FINISHED"
    assert [s for s, _, _ in _history(client, done.run_id)] == list(range(STEPS // 2))


def test_the_ablation_says_restarting_only_for_an_interrupted_run(tmp_path, store, monkeypatch, capsys):
    """The plan line of a training whose recorded run finished (a rebuilt drafter) no longer claims it restarts
    an interrupted MLflow run."""
    from lit_domino.studies import ablation
    from lit_domino.training.configs import load_config
    from lit_domino.training.experiment import TrainedDrafter
    from lit_domino.runtime.jobclock import JobClock

    monkeypatch.setenv("LIT_DOMINO_CACHE", str(tmp_path / "cache"))
    exp = tracking.ensure_experiment("plan")
    configs = [load_config("backbone", "smoke", seed) for seed in (3, 4)]
    for cfg, status in zip(configs, ("FINISHED", "KILLED")):
        run_id = store.create_run(exp).info.run_id
        store.set_terminated(run_id, status)
        folder = experiment.drafter_artifact(cfg) / "checkpoints"
        folder.mkdir(parents=True)
        (folder / "mlflow_run_id").write_text(run_id)
    monkeypatch.setattr(experiment, "train_variant", lambda cfg, **_: TrainedDrafter(
        "backbone", "smoke", cfg["seed_everything"], tmp_path, {}, None, False))
    ablation.train_all(configs, "plan", JobClock(jobs=1), {}, progress=False)
    lines = [l for l in capsys.readouterr().out.splitlines() if "stage 2/4 train [" in l]
    assert len(lines) == 2 and "backbone s3;" in lines[0] and "restarting" not in lines[0]
    assert "backbone s4 (restarting its interrupted MLflow run)" in lines[1]

"""Runs that share a cache, end to end: two ablations started together on a fresh project train their drafter once
(one MLflow run, one artifact) and both succeed, and a cold or a warm data cache gives the same drafter."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import lit_domino

ROOT = Path(lit_domino.__file__).resolve().parent.parent

SMALL = {"data.train_examples": {"math": 4, "code": 2, "chat": 2}, "data.val_examples": {"math": 2, "code": 1, "chat": 1},
         "data.max_new_tokens": 16, "data.batch_size": 4, "data.num_anchors": 4, "data.max_length": 128,
         "trainer.max_epochs": 1}


def _weights(drafter_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(drafter_dir) / "model.safetensors"))


@pytest.mark.slow
def test_two_ablations_started_together_on_a_fresh_project_both_succeed(tiny_target_dir, tmp_path):
    """Two ``--train-only`` ablations of one drafter started at once on a fresh cache and a fresh MLflow store (no
    process made it before): both exit 0, the drafter is trained once (one MLflow training run, one artifact; the
    other job waits and reuses it) and the two jobs share one study run. The store's creation (MLflow's schema
    migrations) and the study run's find-or-create happen once, under the lock beside the database."""
    cache_dir, uri, go = tmp_path / "cache", f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "go"
    overrides = {**SMALL, "data.target": str(tiny_target_dir)}
    code = textwrap.dedent(f"""
        import json, time
        from pathlib import Path
        import torch
        torch.set_num_threads(1)
        from lit_domino.studies.ablation import run_ablation
        deadline = time.time() + 120
        while not Path({str(go)!r}).exists() and time.time() < deadline:  # start both together
            time.sleep(0.01)
        out = run_ablation("smoke", ["backbone"], [7], out_dir=Path({str(tmp_path / "results")!r}), progress=False,
                           overrides={overrides!r}, train_only=True, jobs=1)
        t, = out["trained"]
        print(json.dumps({{"dir": str(t.drafter_dir), "run_id": t.run_id, "from_cache": t.from_cache}}))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LIT_DOMINO_CACHE": str(cache_dir), "MLFLOW_TRACKING_URI": uri}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    time.sleep(1.0)
    go.write_text("go")
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-3000:] for _, err in outs]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert sorted(r["from_cache"] for r in results) == [False, True]  # one trained, the other waited and reused
    assert results[0]["dir"] == results[1]["dir"] and results[0]["run_id"] == results[1]["run_id"]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("ablation-smoke")
    runs = client.search_runs([exp.experiment_id])
    assert sorted(r.data.tags.get("study_role", "training") for r in runs) == ["study", "training"]
    assert [r.info.run_id for r in runs if "study_role" not in r.data.tags] == [results[0]["run_id"]]
    history = client.get_metric_history(results[0]["run_id"], "train/loss")
    assert len({m.step for m in history}) == len(history)  # each step logged once
    drafter_dir = Path(results[0]["dir"])
    report = json.loads((drafter_dir.parent / "report.json").read_text())
    assert report["run_id"] == results[0]["run_id"]
    assert (drafter_dir.parent / "checkpoints" / "mlflow_run_id").read_text().strip() == report["run_id"]


@pytest.mark.slow
def test_cold_and_warm_data_cache_train_the_same_drafter(tiny_target_dir, tmp_path, monkeypatch, one_thread):
    from lit_domino.training import configs, experiment

    cfg = configs.load_config("domino", "smoke", overrides={**SMALL, "data.target": str(tiny_target_dir),
                                                               "tracking.enabled": False})
    monkeypatch.setenv("LIT_DOMINO_CACHE", str(tmp_path / "cache"))
    cold = experiment.train_variant(cfg, progress=False)  # regenerates data and builds features first
    assert not cold.from_cache
    cold_weights = _weights(cold.drafter_dir)
    shutil.rmtree(cold.drafter_dir.parent)  # the drafter only: the data cache stays warm
    warm = experiment.train_variant(cfg, progress=False)
    assert not warm.from_cache and warm.drafter_dir == cold.drafter_dir
    warm_weights = _weights(warm.drafter_dir)
    assert cold_weights.keys() == warm_weights.keys()
    for name, w in cold_weights.items():
        assert torch.equal(w, warm_weights[name]), name

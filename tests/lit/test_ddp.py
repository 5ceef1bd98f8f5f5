"""Multi-process training through Lightning's ``ddp`` strategy (gloo on CPU), via ``train_variant``.

A 2-process run with per-device batch b trains the same drafter as a 1-process run with batch 2b: each step's
two shards are exactly the single process's batch, and with more anchor slots than labelled positions both runs
train the same blocks. Ranks still draw different anchors (the probe draw of each step's generator differs),
only rank 0 writes the artifact, and the run is one MLflow run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lit_domino.training import configs, experiment
from lit_domino.training.cli import ConfigError

SCRIPT = Path(__file__).with_name("ddp_train.py")
ROOT = Path(__file__).resolve().parents[2]


def _run(target_dir, out: Path, devices: int, batch_size: int) -> None:
    out.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(target_dir), str(out), str(devices), str(batch_size)],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


@pytest.mark.slow
def test_two_process_ddp_equals_one_process_with_the_same_global_batch(tiny_target_dir, tmp_path):
    from mlflow.tracking import MlflowClient

    _run(tiny_target_dir, tmp_path / "one", devices=1, batch_size=4)
    _run(tiny_target_dir, tmp_path / "two", devices=2, batch_size=2)
    one = json.loads((tmp_path / "one" / "result0.json").read_text())
    two = [json.loads((tmp_path / "two" / f"result{r}.json").read_text()) for r in (0, 1)]
    assert [t["is_rank_zero"] for t in two] == [True, False]
    assert two[0]["report"]["world_size"] == 2 and one["report"]["world_size"] == 1
    # every rank returns rank 0's artifact and its one MLflow run
    assert two[0]["drafter_dir"] == two[1]["drafter_dir"] and two[0]["run_id"] == two[1]["run_id"] is not None
    assert two[0]["report"]["optimizer_steps"] == one["report"]["optimizer_steps"] == 8

    steps1 = json.loads((tmp_path / "one" / "rank0.json").read_text())["steps"]
    ranks = [json.loads((tmp_path / "two" / f"rank{r}.json").read_text())["steps"] for r in (0, 1)]
    assert len(steps1) == len(ranks[0]) == len(ranks[1]) == 8
    for single, r0, r1 in zip(steps1, ranks[0], ranks[1]):
        assert r0["indices"] + r1["indices"] == single["indices"]  # the shards are the single process's batch
        assert not set(r0["indices"]) & set(r1["indices"])
        assert r0["probe_anchors"] != r1["probe_anchors"]  # ranks draw different anchors
        assert sorted(r0["anchors"] + r1["anchors"]) == sorted(single["anchors"])
        if r0["labels"] == r1["labels"]:  # equal label counts: the mean of the ranks' losses is the global one
            assert (r0["loss"] + r1["loss"]) / 2 == pytest.approx(single["loss"], abs=1e-4)
    # rank 0's draws are the single-process draws of the same step
    assert [s["probe_anchors"] for s in ranks[0]] == [s["probe_anchors"] for s in steps1]

    init = torch.load(tmp_path / "one" / "init.pt")
    w1 = load_file(Path(one["drafter_dir"]) / "model.safetensors")
    w2 = load_file(Path(two[0]["drafter_dir"]) / "model.safetensors")
    moved = max(float((w1[k] - init[k]).abs().max()) for k in w1)
    apart = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    assert moved > 1e-3, "training must move the weights for the comparison to mean anything"
    assert apart < 1e-5, f"2-process weights differ from 1-process ones by {apart} (training moved them {moved})"

    client = MlflowClient()
    runs = client.search_runs([client.get_experiment_by_name("ddp-test").experiment_id])
    assert len(runs) == 2  # one per training, not one per rank
    assert {r.info.status for r in runs} == {"FINISHED"}


def test_a_strategy_the_environment_cannot_run_is_a_clear_error():
    from lit_domino.training.cli import check_config

    cfg = configs.load_config("backbone", "smoke", overrides={"trainer.strategy": "fsdp", "trainer.devices": 2,
                                                                 "trainer.accelerator": "cpu"})
    with pytest.raises(ConfigError, match=r"trainer.strategy='fsdp'.*cannot run here.*GPU"):
        check_config(cfg)


def test_rank_zero_is_read_from_the_launchers_environment(monkeypatch):
    for key in experiment.RANK_ENV:
        monkeypatch.delenv(key, raising=False)
    assert experiment.is_rank_zero()
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("NODE_RANK", "0")
    assert experiment.is_rank_zero()
    monkeypatch.setenv("NODE_RANK", "1")  # local rank 0 of the second node: not global rank 0
    assert not experiment.is_rank_zero()
    monkeypatch.delenv("NODE_RANK")
    monkeypatch.setenv("RANK", "3")
    assert not experiment.is_rank_zero()


def test_eval_callback_decodes_on_rank_zero_only(monkeypatch):
    import types

    from lit_domino.training import callbacks

    calls = []

    def fake_evaluate(*args, **kwargs):
        calls.append(1)
        return {"tau": 2.0}, {"math": {"tau": 2.0}}

    monkeypatch.setattr(callbacks, "evaluate_speculative", fake_evaluate)
    cb = callbacks.SpeculativeEvalCallback({"math": [[1, 2, 3]]}, plots=False)
    module = types.SimpleNamespace(drafter=object(), target=object())
    sent = ({"tau": 3.5}, {"math": {"tau": 3.5}})
    for rank in (1, 0):
        broadcasts = []
        strategy = types.SimpleNamespace(broadcast=lambda obj, src=0: broadcasts.append(obj) or sent)
        trainer = types.SimpleNamespace(is_global_zero=rank == 0, world_size=2, strategy=strategy, global_step=4,
                                        loggers=[])
        assert cb._evaluate(trainer, module) == {"tau": 3.5}  # every rank logs what rank 0 broadcast
        assert broadcasts == [None] if rank else broadcasts == [({"tau": 2.0}, {"math": {"tau": 2.0}})]
    assert len(calls) == 1  # rank 1 never decoded

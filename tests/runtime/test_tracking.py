"""lit_domino.runtime.tracking under concurrency and interruption: a fresh store shared by two processes,
a run id the store does not know, Ctrl-C during ``fit``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

import lit_domino
from lit_domino.runtime import tracking

ROOT = Path(lit_domino.__file__).resolve().parent.parent


@pytest.mark.slow  # two Python processes importing MLflow
def test_two_processes_create_a_fresh_store_at_once(tmp_path):
    """Both workers start together on a store that does not exist yet: both succeed, one experiment."""
    uri, go = f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}", tmp_path / "go"
    code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from lit_domino.runtime import tracking
        import mlflow.tracking  # the slow imports before the start line, so both race on the store
        deadline = time.time() + 60
        while not Path({str(go)!r}).exists() and time.time() < deadline:
            time.sleep(0.01)
        print(tracking.ensure_experiment("race", {uri!r}))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    time.sleep(0.5)
    go.write_text("go")
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    ids = [out.strip().splitlines()[-1] for out, _ in outs]
    assert ids[0] == ids[1]


def test_importing_tracking_is_cheap():
    """Workers import the tracking helpers first: that must not import Lightning (seconds)."""
    code = "import sys, lit_domino.runtime.tracking; assert 'lightning' not in sys.modules and 'mlflow' not in sys.modules"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_missing_run_is_recreated_with_a_warning(caplog):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking.default_tracking_uri())
    exp = tracking.ensure_experiment("robust-test")
    known = client.create_run(exp).info.run_id
    assert tracking.ensure_run(known, "robust-test") == known  # a run the store has: unchanged

    gone = uuid.uuid4().hex  # the id a cached drafter remembers from a deleted mlflow.db
    with caplog.at_level("WARNING", logger="lit_domino.runtime.tracking"):
        new = tracking.ensure_run(gone, "robust-test", "domino-smoke-s0", tags={"variant": "domino"},
                                  params={"seed": 0}, metrics={"train/train_seconds": 1.5})
    assert new != gone and gone in caplog.text
    run = client.get_run(new)
    assert run.data.tags["recreated_from"] == gone and run.data.tags["variant"] == "domino"
    assert run.data.params["seed"] == "0" and run.data.metrics["train/train_seconds"] == 1.5
    client.log_metric(new, "math/tau", 3.0)  # what the ablation logs next: no MlflowException
    assert tracking.ensure_run(gone, "robust-test") == new  # a rerun reuses the replacement


def _tiny_module(interrupt_at: int):
    import lightning as L
    import torch

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch, batch_idx):
            if batch_idx == interrupt_at:
                raise KeyboardInterrupt  # what Ctrl-C raises in the main thread
            return (self.w - batch[0].float().mean()).pow(2).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Tiny()


def test_ctrl_c_during_fit_ends_the_run_killed_with_a_resume_hint(capsys):
    import lightning as L
    import torch
    from mlflow.tracking import MlflowClient
    from torch.utils.data import DataLoader, TensorDataset

    logger = tracking.make_mlflow_logger("robust-test", "interrupted", variant="backbone")
    trainer = L.Trainer(max_steps=5, accelerator="cpu", logger=logger, enable_progress_bar=False,
                        enable_checkpointing=False, enable_model_summary=False,
                        callbacks=[tracking.MarkFailedOnError()])
    loader = DataLoader(TensorDataset(torch.arange(8)), batch_size=2)
    handler = signal.getsignal(signal.SIGINT)
    try:
        # as experiment.train_variant runs it: Lightning turns Ctrl-C into SystemExit(1)
        with pytest.raises((SystemExit, KeyboardInterrupt)):
            with tracking.mark_failed_on_error([logger]):
                trainer.fit(_tiny_module(interrupt_at=1), loader)
    finally:
        signal.signal(signal.SIGINT, handler)  # Lightning ignores further Ctrl-C while it shuts down
    assert MlflowClient(tracking.default_tracking_uri()).get_run(logger.run_id).info.status == "KILLED"
    err = capsys.readouterr().err
    assert err.count(tracking.RESUME_HINT) == 1 and "rerun the same command" in tracking.RESUME_HINT


def test_ctrl_c_outside_fit_prints_the_hint_once(capsys):
    with pytest.raises(KeyboardInterrupt):
        with tracking.mark_failed_on_error():
            with tracking.mark_failed_on_error():  # nested handlers: still one line
                raise KeyboardInterrupt
    assert capsys.readouterr().err.count(tracking.RESUME_HINT) == 1
    with pytest.raises(RuntimeError):
        with tracking.mark_failed_on_error():
            raise RuntimeError("not an interrupt")
    assert tracking.RESUME_HINT not in capsys.readouterr().err

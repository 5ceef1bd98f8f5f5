"""Ctrl-C and SIGTERM stop a training at once, its MLflow run KILLED, and the rerun resumes it (issue 34, item 2).

In-process: the stop handlers (lit_domino.training.experiment.interruptible), a real training stopped by a real signal
(SIGTERM; SIGINT raised inside a finalizer, where Python loses it), the ablation's single-process trainings.
Slow: a real two-worker smoke ablation stopped by a real signal, then rerun.
"""

from __future__ import annotations

import gc
import glob
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import lightning as L
import pytest

from lit_domino.training import configs, experiment
from lit_domino.runtime import tracking

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _handlers_restored():
    """Every test leaves Python's own SIGINT/SIGTERM handling in place (Lightning sets SIG_IGN on Ctrl-C)."""
    before = {sig: signal.getsignal(sig) for sig in experiment.STOP_SIGNALS}
    yield
    after = {sig: signal.getsignal(sig) for sig in experiment.STOP_SIGNALS}
    for sig, handler in before.items():
        signal.signal(sig, handler)
    assert after == before, "the stop handlers were not restored"


def _tiny_config(tiny_target_dir, epochs: int, seed: int = 0, **extra) -> dict:
    return configs.load_config("backbone", "smoke", seed, overrides={
        "data.target": str(tiny_target_dir), "data.train_examples": {"math": 4, "code": 2, "chat": 2},
        "data.val_examples": {"math": 2, "code": 1, "chat": 1}, "data.max_new_tokens": 16, "data.batch_size": 4,
        "data.num_anchors": 4, "data.max_length": 128, "trainer.max_epochs": epochs, **extra})


def _run_status(run_id: str) -> str:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking.default_tracking_uri()).get_run(run_id).info.status


# --------------------------------------------------------------------------- the handlers


def test_sigterm_raises_an_interrupt_and_the_handlers_come_back():
    with pytest.raises(experiment.Interrupted) as caught:
        with experiment.interruptible():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # interrupted long before
    assert isinstance(caught.value, KeyboardInterrupt) and caught.value.signum == signal.SIGTERM
    assert experiment.stop_requested() is None  # nothing left pending for the next block


class _SignalsInDel:
    """Sends ``signum`` to this process from ``__del__``: Python runs the handler inside the finalizer, where a
    raised KeyboardInterrupt is printed as "Exception ignored" and lost."""

    def __init__(self, signum):
        self.signum = signum

    def __del__(self):
        os.kill(os.getpid(), self.signum)
        for _ in range(100_000):  # the handler runs here, still inside __del__
            pass


def test_a_signal_inside_a_finalizer_still_stops_the_block():
    done = False
    with pytest.raises(KeyboardInterrupt):
        with experiment.interruptible():
            _SignalsInDel(signal.SIGINT)  # collected at once
            gc.collect()
            done = True
    assert done  # not raised inside __del__ (lost there) but when the block ended


# --------------------------------------------------------------------------- a real training


class _SignalAt(L.Callback):
    """At optimizer step ``step``: ``signum`` to this process, from a finalizer (``in_del``, as Lightning's
    ``Profiler.__del__`` swallowed it) or directly."""

    def __init__(self, step: int, signum, in_del: bool):
        self.step, self.signum, self.in_del, self.sent = step, signum, in_del, False

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step >= self.step and not self.sent:
            self.sent = True
            if self.in_del:
                _SignalsInDel(self.signum)
                gc.collect()
            else:
                os.kill(os.getpid(), self.signum)


class _CountSteps(L.Callback):
    def __init__(self):
        self.batches = 0

    def on_train_batch_end(self, *args):
        self.batches += 1


@pytest.mark.parametrize("signum, in_del", [(signal.SIGTERM, False), (signal.SIGINT, True)],
                         ids=["sigterm", "sigint-in-a-finalizer"])
def test_a_signal_stops_the_training_killed_and_the_rerun_resumes(tiny_target_dir, tmp_path, one_thread, capsys,
                                                                   signum, in_del):
    """SIGTERM used to end in Lightning's SIGTERMException (run FAILED); a SIGINT that landed in a finalizer was
    lost and the training ran to its end. Both now stop at the next batch: KILLED, hint once, resumable."""
    cfg = _tiny_config(tiny_target_dir, epochs=3)  # 2 steps an epoch: last.ckpt at step 2, the signal at 3
    with pytest.raises(experiment.Interrupted) as caught:
        experiment.train_variant(cfg, experiment="interrupts", callbacks=[_SignalAt(3, signum, in_del)],
                                 progress=False, root=tmp_path)
    assert caught.value.signum == signum and caught.value.step == 3  # stopped at the very next batch
    path = experiment.drafter_artifact(cfg, root=tmp_path)
    run_id = (path / "checkpoints" / "mlflow_run_id").read_text().strip()
    assert _run_status(run_id) == "KILLED"
    assert (path / "checkpoints" / "last.ckpt").is_file()
    assert capsys.readouterr().err.count(tracking.RESUME_HINT) == 1

    counter = _CountSteps()
    done = experiment.train_variant(cfg, experiment="interrupts", callbacks=[counter], progress=False, root=tmp_path)
    assert done.report["optimizer_steps"] == 6 and counter.batches < 6  # resumed, not restarted
    assert done.run_id == run_id and _run_status(run_id) == "FINISHED"


def test_single_process_ablation_trainings_stop_with_one_line(tiny_target_dir, tmp_path, one_thread, capsys,
                                                              monkeypatch):
    """``--jobs 1``: the ablation's trainings in this process stop like the workers' (KILLED, no per-training
    hint; the job's one interrupt says how to resume), the next training is not started."""
    from lit_domino.studies import ablation
    from lit_domino.runtime.jobclock import JobClock

    monkeypatch.setenv("LIT_DOMINO_CACHE", str(tmp_path))
    configs = [_tiny_config(tiny_target_dir, epochs=20, seed=s) for s in (0, 1)]
    first = experiment.drafter_artifact(configs[0])

    def interrupt_after_the_first_checkpoint():
        while not (first / "checkpoints" / "last.ckpt").exists():
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_after_the_first_checkpoint, daemon=True).start()
    with pytest.raises(KeyboardInterrupt, match="^rerun the same command to resume$"):
        ablation.train_all(configs, "interrupts-jobs1", JobClock(jobs=1), {}, progress=False)
    out, err = capsys.readouterr()
    assert "train backbone s0 interrupted at step" in out and "backbone s1" not in out
    assert tracking.RESUME_HINT not in err
    run_id = (first / "checkpoints" / "mlflow_run_id").read_text().strip()
    assert _run_status(run_id) == "KILLED"
    assert not experiment.drafter_artifact(configs[1]).exists()


# --------------------------------------------------------------------------- a real parallel ablation (slow)


@pytest.fixture
def smoke_cache(tmp_path_factory, copy_smoke_data):
    """A fresh artifact cache for each smoke run below, holding only copies of the session's smoke data (regenerated
    sets, feature caches), so the runs train their drafters from scratch but do not each regenerate the same
    answers (under xdist the two runs
    land on different workers, so a module-scoped cache never shared them anyway). What is tested, a signal
    during the trainings and their resumption, starts after those stages."""
    root = tmp_path_factory.mktemp("smoke-interrupts")
    copy_smoke_data(root)
    return root


def _ablation(cache: Path, seeds: str, epochs: int) -> tuple[list[str], dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "LIT_DOMINO_CACHE": str(cache),
           "MLFLOW_TRACKING_URI": f"sqlite:///{cache / 'mlflow.db'}", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1"}
    cmd = [sys.executable, str(ROOT / "experiments" / "ablation.py"), "--preset", "smoke", "--variants", "domino",
           "--seeds", seeds, "--train-only", "--no-progress", "--jobs", "2", "--set", f"trainer.max_epochs={epochs}"]
    return cmd, env


@pytest.mark.slow
@pytest.mark.parametrize("signame, to, seeds, resume", [("SIGINT", "group", "5,6", True),
                                                        ("SIGTERM", "parent", "7,8", False)],
                         ids=["ctrl-c-to-the-group", "sigterm-to-the-parent"])
def test_a_signal_stops_every_worker_of_a_parallel_ablation_and_the_rerun_resumes(smoke_cache, signame, to, seeds,
                                                                                   resume):
    """Two trainings in two worker processes; the signal once both have written a checkpoint. Ctrl-C reaches the
    whole process group (a terminal's); SIGTERM only the parent, which passes it on. Either way: rc 130 within
    seconds, one line, no traceback, both runs KILLED (what a rerun resumes from: their checkpoints and KILLED
    runs, the same after either signal); after Ctrl-C the rerun resumes both and finishes their runs.

    Three epochs: the signal goes once both trainings have a checkpoint (after their first epoch), so neither
    finishes before it unless it runs three times as fast as the other; the rerun trains the two epochs left (with
    five: four; resuming is proven by the resumed runs and their log lines, not by how many epochs remain)."""
    from mlflow.tracking import MlflowClient

    cmd, env = _ablation(smoke_cache, seeds, epochs=3)  # 16 steps an epoch; last.ckpt after each
    err_file = smoke_cache / f"stderr-{signame}.txt"
    with open(err_file, "w") as err:
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True,
                                start_new_session=True)
        names = [f"domino-s{s}-*" for s in seeds.split(",")]
        try:
            deadline = time.monotonic() + 900
            while not all(glob.glob(str(smoke_cache / "drafters" / n / "checkpoints" / "last.ckpt")) for n in names):
                assert proc.poll() is None and time.monotonic() < deadline, "the trainings never checkpointed"
                time.sleep(0.1)
            sent = time.monotonic()
            if to == "group":
                os.killpg(proc.pid, getattr(signal, signame))
            else:
                proc.send_signal(getattr(signal, signame))
            out, _ = proc.communicate(timeout=60)
            seconds = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    stderr = err_file.read_text()
    print(f"{signame} to the {to}: rc {proc.returncode} after {seconds:.1f} s")
    assert proc.returncode == 130, stderr[-3000:]
    assert seconds < 10
    assert stderr.strip().splitlines()[-1] == "ablation: interrupted: rerun the same command to resume"
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr[-3000:]
    assert tracking.RESUME_HINT not in stderr  # the one line says it
    assert out.count(" interrupted at step ") == 2, out
    dirs = [Path(glob.glob(str(smoke_cache / "drafters" / n))[0]) for n in names]
    run_ids = [(d / "checkpoints" / "mlflow_run_id").read_text().strip() for d in dirs]
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    assert [client.get_run(r).info.status for r in run_ids] == ["KILLED", "KILLED"]
    assert all((d / "checkpoints" / "last.ckpt").is_file() for d in dirs)
    if not resume:
        return

    rerun = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert rerun.stdout.count("(resuming from its last checkpoint) started") == 2, rerun.stdout
    assert [client.get_run(r).info.status for r in run_ids] == ["FINISHED", "FINISHED"]


def test_ctrl_c_in_a_bare_lightning_fit_ends_the_ablation_as_interrupted():
    """Lightning ends a fit stopped by Ctrl-C with SystemExit(1) (the embedded target's build in the ablation's
    stage 1): the command used to exit 1 without a word; it ends as interrupted (rc 130 and its line)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from lit_domino.studies import ablation

    class Interrupting(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch, batch_idx):
            if batch_idx == 1:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)  # interrupted long before
            return (self.w - batch[0].float().mean()).pow(2).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = L.Trainer(max_steps=4, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_checkpointing=False, enable_model_summary=False)
    with pytest.raises(KeyboardInterrupt, match="rerun the same command to resume"):
        with experiment.interruptible(), ablation._interrupt_not_exit():
            trainer.fit(Interrupting(), DataLoader(TensorDataset(torch.arange(8)), batch_size=2))

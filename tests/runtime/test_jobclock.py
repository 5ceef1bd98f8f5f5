"""The job clock's ETA: reference seconds scaled by the measured slowness, parallel stages shared."""

import pytest

from lit_domino.runtime import jobclock
from lit_domino.runtime.jobclock import JobClock


@pytest.fixture
def now(monkeypatch):
    t = [1000.0]
    monkeypatch.setattr(jobclock.time, "time", lambda: t[0])
    return t


def test_eta_follows_the_measured_slowness_of_finished_stages(now):
    clock = JobClock(jobs=2)
    assert not clock.measured()
    clock.plan("target", 600)
    clock.plan("cached data", 300, cached=True)  # costs nothing
    for name in ("train a", "train b"):
        clock.plan(name, 200, parallel=True)
    clock.plan("decode", 100)
    assert clock.eta_seconds() == pytest.approx(600 + 200 + 100)  # parallel trainings share 2 workers
    clock.start("target")
    now[0] += 300
    assert clock.eta_seconds() == pytest.approx(300 + 200 + 100)  # the running stage's elapsed time counts
    now[0] += 900  # the target took 1200 s: this machine is 2x slower than the reference
    clock.finish("target")
    assert clock.slowness() == pytest.approx(2.0)
    assert clock.eta_seconds() == pytest.approx(2 * (200 + 100))
    assert clock.eta() == "job ETA 10.0 min"
    clock.start("train a")
    clock.start("train b")
    now[0] += 400
    clock.finish("train a")
    clock.finish("train b", cached=True)  # found in the cache after all: no longer in the slowness
    assert clock.slowness() == pytest.approx((1200 + 400 / 2) / (600 + 200 / 2))
    summary = clock.summary()
    assert [s["stage"] for s in summary["stages"]] == ["target", "train a", "train b"]
    assert summary["stages"][2]["cached"] and summary["jobs"] == 2
    assert "where the time went" in clock.report() and "(in parallel)" in clock.report()


def test_eta_before_any_stage_uses_the_calibration(monkeypatch):
    monkeypatch.setattr(jobclock, "calibration_seconds", lambda threads=None: 3.0)
    clock = JobClock(calibration=2.0)  # the reference machine ran the workload in 2 s: 1.5x slower, it says
    clock.plan("target", 100)
    factor = 1.5 ** jobclock.CALIBRATION_WEIGHT  # a noisy measure: only partly trusted
    assert 1.0 < clock.slowness() < 1.5 and clock.slowness() == pytest.approx(factor)
    assert clock.eta_seconds() == pytest.approx(100 * factor)
    assert not clock.measured() and "provisional" in clock.eta()  # a guess until the job measures itself
    empty = JobClock()
    empty.plan("target", 0)
    assert "no reference times" in empty.eta()


def test_the_calibration_workload_measures_and_restores_threads():
    import torch

    before = torch.get_num_threads()
    assert jobclock.calibration_seconds(threads=1) > 0
    assert torch.get_num_threads() == before


def test_a_running_stage_that_reports_progress_revises_the_eta(now, monkeypatch):
    monkeypatch.setattr(jobclock, "calibration_seconds", lambda threads=None: 1.0)
    clock = JobClock(calibration=2.0)  # the calibration says: 2x faster than the reference machine
    clock.plan("target", 1000)
    clock.plan("decode", 100)
    clock.start("target")
    now[0] += 60  # tokenizer, packing: a fixed cost before the first step
    clock.progress("target", 0.001)
    now[0] += 15
    clock.progress("target", 0.011)  # less than MIN_PROGRESS of the stage so far: the calibration still rules
    assert clock.slowness() == pytest.approx(0.5 ** jobclock.CALIBRATION_WEIGHT)
    now[0] += 45  # 5 % of the stage in 60 s: 1.2x the reference machine's time, whatever the calibration said
    clock.progress("target", 0.051)
    assert clock.slowness() == pytest.approx(60 / (0.05 * 1000))
    assert clock.measured() and "provisional" not in clock.eta()
    assert clock.eta_seconds() == pytest.approx(1.2 * (0.949 * 1000 + 100))
    now[0] += 2000
    clock.finish("target")  # finished stages take over
    assert clock.slowness() == pytest.approx(2120 / 1000)


def test_stage_progress_callback_reports_steps_and_echoes_at_fractions(now):
    from types import SimpleNamespace

    clock = JobClock()
    clock.plan("target", 100)
    clock.start("target")
    said = []
    etas = []
    cb = jobclock.StageProgress(clock, "target", echo=lambda step, total: (said.append(step), etas.append(clock.eta())))
    trainer = SimpleNamespace(max_steps=1600, global_step=0)
    for step in range(1, 901):
        now[0] += 0.5
        trainer.global_step = step
        cb.on_train_batch_end(trainer, None, None, None, step - 1)
    assert said == [80, 800]  # once each, when passed (the default fractions: 5 % and 50 %)
    assert all("provisional" not in eta for eta in etas)  # the first echo already has a measured rate
    assert clock.slowness() == pytest.approx(0.5 / (100 / 1600))  # 0.5 s per step, 1/16 s per reference step

"""lit_domino.studies.sweep.settings: defaults, checks, and the fingerprint every worker of a study shares."""

from __future__ import annotations

import pytest
from sweep_fakes import fake_evaluator

from lit_domino.studies import sweep


def test_defaults_and_fingerprint():
    s = sweep.SweepSettings(preset="smoke").check()
    assert s.storage_url() == sweep.default_storage("domino") and s.storage_url().endswith("sweeps/domino.db")
    assert s.experiment_name() == "sweep-domino"
    assert sweep.SweepSettings(experiment="mine").experiment_name() == "mine"
    assert tuple(s.fingerprint()) == sweep.OBJECTIVE_FIELDS
    s.fingerprint()["overrides"]["x"] = 1  # a copy: the settings are untouched
    assert s.overrides == {}
    assert sweep.SweepSettings(evaluator=fake_evaluator).fingerprint()["evaluator"] == "sweep_fakes:fake_evaluator"


@pytest.mark.parametrize("kw, message", [
    ({"study_name": "a b"}, "study name"),
    ({"objective": "loss"}, "objective must be one of"),
    ({"preset": "huge"}, "unknown preset"),
    ({"n_trials": 0}, "n_trials must be a positive integer"),
    ({"max_steps": 0}, "max_steps"),
    ({"val_check_interval": 1.5}, "val_check_interval"),
    ({"temperature": -1.0}, "temperature"),
    ({"heartbeat": -1}, "heartbeat must be >= 0"),
    ({"pruner": "hyperband"}, "pruner must be"),
    ({"prompts": ""}, "prompts"),
])
def test_settings_errors(kw, message):
    with pytest.raises(sweep.SweepError, match=message):
        sweep.SweepSettings(**{"preset": "smoke", **kw}).check()

"""lit_domino.studies.sweep.storage: storage URLs and their errors, journal files, and a study's recorded space and
objective settings."""

from __future__ import annotations

import optuna
import pytest
from sweep_fakes import add_trials, cli, fake_settings, states

from lit_domino.studies import sweep


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


def test_storage_kinds(tmp_path):
    rdb = sweep.open_storage(f"sqlite:///{tmp_path / 'a.db'}", heartbeat=5)
    assert isinstance(rdb, optuna.storages.RDBStorage)
    assert (rdb.get_heartbeat_interval(), rdb.grace_period) == (5, 10)  # a dead worker's trial: stale after 2 beats
    assert isinstance(rdb.get_heartbeat_stale_trial_callback(), optuna.storages.RetryHeartbeatStaleTrialCallback)
    assert sweep.open_storage(f"sqlite:///{tmp_path / 'b.db'}").get_heartbeat_interval() is None  # heartbeat=0: off
    assert isinstance(sweep.open_storage(str(tmp_path / "c.journal")), optuna.storages.JournalStorage)
    assert isinstance(sweep.open_storage(f"journal:{tmp_path / 'd.log'}"), optuna.storages.JournalStorage)


def test_storage_error_from_the_cli(tmp_path, capsys):
    main = cli().main
    assert main(["summary", "--storage", "sqlite:////no/such/dir/s.db"]) == 2
    assert "cannot open the Optuna storage" in capsys.readouterr().err
    assert main(["summary", "--study-name", "absent", "--storage", f"sqlite:///{tmp_path / 's.db'}"]) == 2
    assert "no study 'absent'" in capsys.readouterr().err


def test_different_space_or_objective_is_an_error(tmp_path):
    space = sweep.load_space()
    settings = fake_settings(tmp_path, "mismatch", n_trials=1)
    add_trials(sweep.create_or_load_study(settings, space), space, 1)
    data = space.to_dict()
    data["params"]["rank"]["high"] = 256
    other = sweep.parse_space(data)
    with pytest.raises(sweep.StudyMismatchError, match=r"DIFFERENT search space(.|\n)*rank"):
        sweep.create_or_load_study(settings, other)
    with pytest.raises(sweep.StudyMismatchError, match="objective"):
        sweep.create_or_load_study(fake_settings(tmp_path, "mismatch", objective="speedup"), space)
    sweep.create_or_load_study(settings, sweep.load_space())  # the same space attaches fine


def test_journal_storage(tmp_path):
    settings = fake_settings(tmp_path, "journal", storage=f"journal:{tmp_path / 'j.journal'}", n_trials=2)
    study = sweep.run_worker(settings, sweep.load_space(), echo=lambda *_: None)
    assert states(study) == {"COMPLETE": 2}

"""Lightning's banners, tips and warnings stay off the console during internal trainings (in a log file)."""

from __future__ import annotations

import logging
import warnings

from lit_domino.runtime import quiet


def chatter():
    logging.getLogger("lightning.pytorch.utilities.rank_zero").info("GPU available: False, used: False")
    warnings.warn("LightningCLI's args parameter is intended to run from within Python", UserWarning)


def test_chatter_goes_to_the_log_file_not_the_console(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(quiet.VERBOSE_ENV, raising=False)
    log = logging.getLogger("lightning.pytorch")
    before = (log.level, log.propagate, list(log.handlers))
    with quiet.quiet_lightning(tmp_path / "train.log"):
        chatter()
    out = capsys.readouterr()
    assert "GPU available" not in out.out + out.err and "LightningCLI" not in out.out + out.err
    text = (tmp_path / "train.log").read_text()
    assert "GPU available: False" in text and "LightningCLI's args parameter" in text
    assert (log.level, log.propagate, list(log.handlers)) == before  # restored after the block


def test_verbose_leaves_the_console_alone(tmp_path, monkeypatch, recwarn):
    monkeypatch.setenv(quiet.VERBOSE_ENV, "1")
    with quiet.quiet_lightning(tmp_path / "train.log"):
        chatter()
    assert not (tmp_path / "train.log").exists()
    assert any("LightningCLI" in str(w.message) for w in recwarn)


def test_errors_are_not_hidden(tmp_path, monkeypatch):
    monkeypatch.delenv(quiet.VERBOSE_ENV, raising=False)
    try:
        with quiet.quiet_lightning(tmp_path / "train.log"):
            raise RuntimeError("boom")
    except RuntimeError as err:
        assert str(err) == "boom"
    else:
        raise AssertionError("the error was swallowed")

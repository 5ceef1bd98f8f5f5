"""lit_domino.configs + cli.check_config: configs compose from deltas; a mistyped key is a loud error."""

import pytest

from lit_domino.cli import ConfigError, check_config
from lit_domino.configs import load_config
from lit_domino.experiment import drafter_artifact, train_variant, training_key


@pytest.mark.parametrize("override,message", [
    ({"model.rnak": 3}, "unknown config key model.rnak; did you mean model.rank?"),
    ({"trainer.max_step": 3}, "unknown config key trainer.max_step; did you mean trainer.max_steps"),
    ({"data.batch_sise": 3}, "unknown config key data.batch_sise; did you mean data.batch_size"),
    ({"model.curriculum.knd": "none"}, "unknown config key model.curriculum.knd; did you mean model.curriculum.kind?"),
    ({"nosuch.key": 1}, "unknown config section(s) 'nosuch'"),
    ({"data.batch_size": "x"}, "refuses this config"),
])
def test_mistyped_keys_are_errors_with_close_matches(override, message):
    with pytest.raises(ConfigError) as err:
        check_config(load_config("domino", "smoke", 0, override))
    assert message in str(err.value)


def test_a_method_key_on_another_method_is_an_error():
    check_config(load_config("domino", "smoke", 0, {"model.rank": 16}))  # the Domino module takes it
    with pytest.raises(ConfigError, match="model.rank"):
        check_config(load_config("backbone", "smoke", 0, {"model.rank": 16}))


def test_a_typo_is_never_answered_from_the_cache(tmp_path):
    """``--set trainer.max_step=3`` must not report a cached drafter: the config is parsed before the cache."""
    cfg = load_config("backbone", "smoke", 0, {"trainer.max_step": 3})
    path = drafter_artifact(cfg, root=tmp_path)
    path.mkdir(parents=True)
    (path / ".complete").write_text("ok")  # a finished artifact under that key (an old-format marker)
    (path / "report.json").write_text("{}")
    with pytest.raises(ConfigError, match="trainer.max_step"):
        train_variant(cfg, root=tmp_path, progress=False)


def test_every_trainer_setting_that_can_change_a_drafter_is_in_its_cache_key():
    base = load_config("backbone", "smoke", 0)
    key = training_key(base)
    for setting in ({"trainer.val_check_interval": 0.5}, {"trainer.deterministic": True}, {"trainer.limit_train_batches": 3}):
        assert training_key(load_config("backbone", "smoke", 0, setting)) != key, setting
    for cosmetic in ({"trainer.enable_progress_bar": False}, {"trainer.log_every_n_steps": 7}):
        assert training_key(load_config("backbone", "smoke", 0, cosmetic)) == key, cosmetic


@pytest.mark.parametrize("argv,message", [
    (["--seeds", "abc"], "seeds are integers >= 0"),
    (["--seeds", "0,-1"], "got '-1'"),
    (["--preset", "smoke", "--variants", "domino", "--set", "model.rnak=3"], "unknown config key model.rnak; did you mean model.rank?"),
    (["--preset", "smoke", "--variants", "domino", "--set", "model.rank=0"], "rank must be a positive integer, got 0"),
])
def test_the_ablation_command_line_fails_in_one_line(argv, message, capsys):
    from lit_domino.ablation import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err

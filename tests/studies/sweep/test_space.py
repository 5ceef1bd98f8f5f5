"""lit_domino.studies.sweep.space: the shipped space, and every malformed space is an error before anything runs."""

from __future__ import annotations

import pytest
import yaml
from sweep_fakes import cli

from lit_domino.studies import sweep


def test_shipped_space():
    space = sweep.load_space()
    by = {p.name: p for p in space.params}
    assert space.variant == "domino"
    assert (by["rank"].low, by["rank"].high, by["rank"].log, by["rank"].target) == (16, 512, True, "model.head.rank")
    assert set(by["lambda_kind"].choices) == {"linear", "cosine", "step", "constant", "none"}
    assert {"gru_hidden", "lambda_start", "lambda_ratio"} <= set(by)
    assert sweep.parse_space(space.to_dict()) == space  # the recorded form reads back as the same space
    assert space.overrides({"rank": 17, "lambda_kind": "cosine"}) == {"model.init_args.head.rank": 17,
                                                                    "model.init_args.curriculum.kind": "cosine"}


def test_shipped_dspark_space_sweeps_the_markov_rank():
    """DSpark's rank (and head type) sweep through the same machinery: the first trial's config parses with
    the training parser, and a key only another method takes is refused before any trial runs."""
    from lit_domino.training.cli import ConfigError
    from lit_domino.studies.sweep.worker import check_trial_config

    space = sweep.load_space(sweep.space.DSPARK_SPACE_FILE)
    by = {p.name: p for p in space.params}
    assert space.variant == "dspark" and (by["rank"].low, by["rank"].target) == (8, "model.head.rank")
    settings = sweep.SweepSettings(preset="smoke", max_steps=5)
    init = sweep.trial_config(settings, space, {"rank": 24, "head_type": "rnn"})["model"]["init_args"]
    assert (init["head"]["rank"], init["head"]["head_type"]) == (24, "rnn")
    check_trial_config(settings, space)
    other = sweep.parse_space({"variant": "dspark", "params": {
        "gru_hidden": {"type": "int", "low": 8, "high": 16, "target": "model.head.gru_hidden"}}})
    with pytest.raises(ConfigError, match="unknown config key model.head.gru_hidden; model.head takes confidence"):
        check_trial_config(settings, other)


def test_shipped_dflash2_space_sweeps_the_selector():
    """DFlash 2's selector (rank, candidates, its loss weight) sweeps the same way: the trial's config parses with
    the training parser and reaches the module; DSpark's head type is refused before any trial runs."""
    from lit_domino.training.cli import ConfigError
    from lit_domino.studies.sweep.worker import check_trial_config

    space = sweep.load_space(sweep.space.DFLASH2_SPACE_FILE)
    by = {p.name: p for p in space.params}
    assert space.variant == "dflash2" and {"rank", "top_k", "selector_weight"} == set(by)
    settings = sweep.SweepSettings(preset="smoke", max_steps=5)
    init = sweep.trial_config(settings, space, {"rank": 24, "top_k": 6, "selector_weight": 0.5})["model"]["init_args"]
    assert (init["head"]["rank"], init["head"]["top_k"], init["selector_weight"]) == (24, 6, 0.5)
    check_trial_config(settings, space)
    other = sweep.parse_space({"variant": "dflash2", "params": {
        "head_type": {"type": "categorical", "choices": ["vanilla", "rnn"], "target": "model.head.head_type"}}})
    with pytest.raises(ConfigError, match="unknown config key model.head.head_type; model.head takes conv_group_size"):
        check_trial_config(settings, other)


@pytest.mark.parametrize("spec, message", [
    ({"type": "categorical", "choices": ["vanilla", "lstm"], "target": "model.head.head_type"}, "one of"),
    ({"type": "int", "low": -4, "high": 64, "target": "model.head.rank"}, "positive integer"),
    ({"type": "int", "low": 512, "high": 16, "target": "model.head.rank"}, "empty range"),
    ({"type": "float", "low": 0.5, "high": 0.5, "target": "model.curriculum.start"}, "empty range"),
    ({"type": "categorical", "choices": [], "target": "model.curriculum.kind"}, "empty choices"),
    ({"type": "int", "low": 0, "high": 64, "log": True, "target": "model.head.rank"}, "log-scale range needs low > 0"),
    ({"type": "int", "low": 0, "high": 64, "target": "model.head.rank"}, "positive integer"),
    ({"type": "float", "low": 0.5, "high": 1.5, "target": "model.curriculum.start"}, r"in \[0, 1\]"),
    ({"type": "categorical", "choices": ["linear", "exp"], "target": "model.curriculum.kind"}, "one of"),
    ({"type": "uniform", "low": 1, "high": 2, "target": "model.head.rank"}, "type must be one of"),
    ({"type": "int", "low": 1, "high": 2}, "target must be a dotted config key"),
    ({"type": "int", "low": 1.5, "high": 8, "target": "model.head.rank"}, "must be an integer"),
])
def test_space_errors(spec, message):
    with pytest.raises(sweep.SearchSpaceError, match=message):
        sweep.parse_space({"params": {"p": spec}})


def test_space_file_errors(tmp_path, capsys):
    with pytest.raises(sweep.SearchSpaceError, match="'params' is empty"):
        sweep.parse_space({"variant": "domino", "params": {}})
    with pytest.raises(sweep.SearchSpaceError, match="same config key"):
        sweep.parse_space({"params": {
            "a": {"type": "int", "low": 1, "high": 4, "target": "model.head.rank"},
            "b": {"type": "int", "low": 1, "high": 4, "target": "model.init_args.head.rank"}}})
    with pytest.raises(sweep.SearchSpaceError, match="does not exist"):
        sweep.load_space(tmp_path / "missing.yaml")
    bad = tmp_path / "space.yaml"
    bad.write_text(yaml.safe_dump({"params": {"rank": {"type": "int", "low": 64, "high": 32,
                                                       "target": "model.head.rank"}}}))
    rc = cli().main(["run", "--space", str(bad), "--storage", f"sqlite:///{tmp_path / 'x.db'}", "--preset", "smoke"])
    err = capsys.readouterr().err
    assert rc == 2 and "empty range" in err and "rank" in err
    assert not (tmp_path / "x.db").exists()  # nothing created before the space is valid

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
    assert (by["rank"].low, by["rank"].high, by["rank"].log, by["rank"].target) == (16, 512, True, "model.rank")
    assert set(by["lambda_kind"].choices) == {"linear", "cosine", "step", "constant", "none"}
    assert {"gru_hidden", "lambda_start", "lambda_ratio"} <= set(by)
    assert sweep.parse_space(space.to_dict()) == space  # the recorded form reads back as the same space
    assert space.overrides({"rank": 17, "lambda_kind": "cosine"}) == {"model.init_args.rank": 17,
                                                                    "model.init_args.curriculum.kind": "cosine"}


@pytest.mark.parametrize("spec, message", [
    ({"type": "int", "low": 512, "high": 16, "target": "model.rank"}, "empty range"),
    ({"type": "float", "low": 0.5, "high": 0.5, "target": "model.curriculum.start"}, "empty range"),
    ({"type": "categorical", "choices": [], "target": "model.curriculum.kind"}, "empty choices"),
    ({"type": "int", "low": 0, "high": 64, "log": True, "target": "model.rank"}, "log-scale range needs low > 0"),
    ({"type": "int", "low": 0, "high": 64, "target": "model.rank"}, "positive integer"),
    ({"type": "float", "low": 0.5, "high": 1.5, "target": "model.curriculum.start"}, r"in \[0, 1\]"),
    ({"type": "categorical", "choices": ["linear", "exp"], "target": "model.curriculum.kind"}, "one of"),
    ({"type": "uniform", "low": 1, "high": 2, "target": "model.rank"}, "type must be one of"),
    ({"type": "int", "low": 1, "high": 2}, "target must be a dotted config key"),
    ({"type": "int", "low": 1.5, "high": 8, "target": "model.rank"}, "must be an integer"),
])
def test_space_errors(spec, message):
    with pytest.raises(sweep.SearchSpaceError, match=message):
        sweep.parse_space({"params": {"p": spec}})


def test_space_file_errors(tmp_path, capsys):
    with pytest.raises(sweep.SearchSpaceError, match="'params' is empty"):
        sweep.parse_space({"variant": "domino", "params": {}})
    with pytest.raises(sweep.SearchSpaceError, match="same config key"):
        sweep.parse_space({"params": {"a": {"type": "int", "low": 1, "high": 4, "target": "model.rank"},
                                      "b": {"type": "int", "low": 1, "high": 4, "target": "model.init_args.rank"}}})
    with pytest.raises(sweep.SearchSpaceError, match="does not exist"):
        sweep.load_space(tmp_path / "missing.yaml")
    bad = tmp_path / "space.yaml"
    bad.write_text(yaml.safe_dump({"params": {"rank": {"type": "int", "low": 64, "high": 32, "target": "model.rank"}}}))
    rc = cli().main(["run", "--space", str(bad), "--storage", f"sqlite:///{tmp_path / 'x.db'}", "--preset", "smoke"])
    err = capsys.readouterr().err
    assert rc == 2 and "empty range" in err and "rank" in err
    assert not (tmp_path / "x.db").exists()  # nothing created before the space is valid

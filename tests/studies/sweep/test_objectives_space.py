"""sweeps/objectives_space.yaml: the training objective as a sweep dimension parses, its trial configs reach the
module, and an objective the registry does not know is refused before any trial runs."""

from __future__ import annotations

import pytest

from lit_domino.studies import sweep


def test_the_objectives_space_sweeps_the_registrys_objectives():
    from lit_domino.models.objectives import objective_names
    from lit_domino.studies.sweep.worker import check_trial_config

    space = sweep.load_space(sweep.space.OBJECTIVES_SPACE_FILE)
    (param,) = space.params
    assert space.variant == "domino" and param.target == "model.objective"
    assert None in param.choices and set(param.choices) - {None} <= set(objective_names()) - {"ce"}
    assert sweep.parse_space(space.to_dict()) == space
    assert space.overrides({"objective": "dpace"}) == {"model.init_args.objective": "dpace"}
    settings = sweep.SweepSettings(preset="smoke", max_steps=5)
    init = sweep.trial_config(settings, space, {"objective": "lk_lambda"})["model"]["init_args"]
    assert init["objective"] == "lk_lambda"
    check_trial_config(settings, space)


@pytest.mark.parametrize("choices", [["kl", "kll"], ["ce", {"name": "kl"}]])
def test_an_unknown_objective_is_refused_before_any_trial(choices):
    with pytest.raises(sweep.SearchSpaceError):
        sweep.parse_space({"params": {"objective": {"type": "categorical", "choices": choices,
                                                    "target": "model.objective"}}})

"""The objective registry: names, settings, one-line errors (unknown objective with close matches, a setting it
does not take, a value out of range), and what each objective declares (p needed, its paper, its public code)."""

import dataclasses

import pytest

from lit_domino.models.objectives import Objective, build_objective, objective_class, objective_names


def test_the_registry_holds_the_2026_objectives():
    assert objective_names() == ["ce", "dpace", "accept_until_fail", "kl", "tv", "lk_alpha", "lk_lambda", "renyi",
                                 "expected_tau"]
    for name in objective_names():
        cls = objective_class(name)
        assert cls.paper and cls.public and cls.__doc__, name
        fields = dataclasses.fields(cls)
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
        for f in fields:  # a docstring per setting: the attribute docstring follows the field in the source
            assert f'{f.name}: ' in (cls.__doc__ or "") or f.name in _attribute_docs(cls), (name, f.name)


def _attribute_docs(cls) -> set[str]:
    import ast
    import inspect

    names = set()
    for klass in cls.__mro__:
        if not (isinstance(klass, type) and issubclass(klass, Objective)):
            continue
        body = ast.parse(inspect.getsource(klass).lstrip()).body[0].body
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                names.add(node.target.id)
    return names


def test_which_objectives_need_the_targets_distribution():
    needs = {n: build_objective(n).needs_target for n in objective_names()}
    assert needs == {"ce": False, "dpace": False, "accept_until_fail": False, "kl": True, "tv": True,
                     "lk_alpha": True, "lk_lambda": True, "renyi": True, "expected_tau": True}
    assert build_objective({"name": "dpace", "label": "target"}).needs_target  # speculators' convention: argmax p


def test_specs_round_trip_and_describe_what_differs():
    for spec in ["kl", {"name": "lk_lambda", "variant": "specforge", "kl_scale": 0.5},
                 {"name": "dpace", "label": "target", "dpace_alpha": 0.25}]:
        obj = build_objective(spec)
        assert build_objective(obj.spec()) == obj and build_objective(obj) is obj
    assert build_objective({"name": "lk_lambda", "variant": "specforge"}).describe() == "lk_lambda[variant=specforge]"
    assert build_objective("kl").describe() == "kl"
    assert build_objective(None) is None
    assert build_objective({"name": "lk_lambda"}).decay == 3.0
    assert build_objective({"name": "lk_lambda", "variant": "specforge"}).decay == 1.0


@pytest.mark.parametrize("spec,message", [
    ("kll", "objective: unknown objective 'kll' (did you mean kl?); choose one of ce, dpace, "),
    ({"name": "lk-lambda"}, "unknown objective 'lk-lambda' (did you mean lk_lambda"),
    ({"name": "kl", "tempreature": 2}, "objective.tempreature: the 'kl' objective has no setting 'tempreature'; "
                                       "did you mean objective.temperature?"),
    ({"name": "ce", "gamma": 2}, "objective.gamma: the 'ce' objective has no setting 'gamma'; it takes no settings"),
    ({"name": "dpace", "dpace_alpha": 1.5}, "objective.dpace_alpha must be a number in [0.0, 1.0], got 1.5"),
    ({"name": "dpace", "label": "argmax"}, "objective.label: unknown value 'argmax'; choose one of dataset, target"),
    ({"name": "kl", "temperature": 0}, "objective.temperature must be a number in (0.0, inf), got 0"),
    ({"name": "tv", "temperature": float("nan")}, "objective.temperature must be a number in (0.0, inf)"),
    ({"name": "lk_lambda", "variant": "specforge", "kl_scale": 1.5}, "objective.kl_scale must be a number in (0.0, "
                                                                     "1.0], got 1.5"),
    ({"name": "lk_lambda", "kl_scale": 0.5}, "objective.kl_scale: speculators' lk_hybrid_loss has no KL scale"),
    ({"name": "lk_lambda", "eta": -1}, "objective.eta must be a number in [0.0, inf), got -1"),
    ({"name": "lk_alpha", "variant": "sglang"}, "objective.variant: unknown value 'sglang'; choose one of "
                                                "speculators, specforge"),
    ({"name": "renyi", "rho": 1.0}, "objective.rho must be a number in (0.0, 1.0), got 1.0"),
    ({"name": "accept_until_fail", "position_decay": "yes"}, "objective.position_decay must be true or false"),
    ({"name": "expected_tau", "form": "exp"}, "objective.form: unknown value 'exp'; choose one of neg, log"),
    ({"temperature": 2}, "objective: expected a name or a mapping {name: <objective>, <setting>: <value>}"),
    (3, "objective: expected a name or a mapping"),
])
def test_bad_objectives_are_one_line(spec, message):
    with pytest.raises(ValueError) as err:
        build_objective(spec)
    assert message in str(err.value) and "\n" not in str(err.value)

"""The objectives study (experiments/objectives.py): its plan and configs, its tables' verdicts and recommendation
rule, one-line errors, the per-step cost, and (slow) the smoke study end to end."""

import dataclasses
import json
import math

import pytest

from lit_domino.runtime.command import UsageError
from lit_domino.studies.objectives import OWN, name_of, rows_of, study_configs, study_plan
from lit_domino.studies.objectives_tables import drafter_table, report, wins
from lit_domino.training.configs import load_config
from lit_domino.training.experiment import drafter_artifact


def test_the_plan_names_every_objective_and_checks_it():
    plan = study_plan("default")
    assert plan.drafters == ["backbone", "domino", "dspark", "dflash2"] and plan.seeds == [0, 1]
    assert plan.objectives[0] == OWN and plan.specs[OWN] is None and plan.pool_size == 64
    assert "ce" not in rows_of(plan, "domino") and "ce" in rows_of(plan, "dspark")  # Domino's own loss is the CE
    smoke = study_plan("smoke", drafters=["domino"], objectives=["kl"], seeds=[3])
    assert smoke.objectives == [OWN, "kl"] and smoke.seeds == [3]  # own is always there: every Δ is against it


@pytest.mark.parametrize("kwargs,message", [
    ({"drafters": ["domnio"]}, "unknown drafters 'domnio' (did you mean domino?)"),
    ({"objectives": ["kll"]}, "unknown objectives 'kll' (did you mean kl?)"),
])
def test_unknown_names_are_one_line(kwargs, message):
    with pytest.raises(UsageError) as err:
        study_plan("smoke", **kwargs)
    assert message in str(err.value)


def test_the_own_row_is_the_ablations_drafter_and_the_others_set_the_objective():
    plan = study_plan("smoke", drafters=["backbone", "dspark"], objectives=["lk_lambda_sf"])
    entries = study_configs(plan)
    assert [(d, row) for d, row, _ in entries] == [("backbone", OWN), ("backbone", "lk_lambda_sf"), ("dspark", OWN),
                                                   ("dspark", "lk_lambda_sf")]
    own = entries[0][2]
    assert drafter_artifact(own) == drafter_artifact(load_config("backbone", "smoke", 0))  # one cache entry
    lk = entries[1][2]
    assert lk["model"]["init_args"]["objective"] == {"name": "lk_lambda", "variant": "specforge"}
    assert lk["tracking"]["variant"] == "backbone+lk_lambda_sf" and drafter_artifact(lk) != drafter_artifact(own)


def _records(values: dict, domains=("math", "code", "chat")) -> list[dict]:
    """Records of drafter 'domino' rows: ``{row: [[τ per domain] per seed]}``; speedup = τ / 2."""
    out = []
    for row, seeds in values.items():
        for seed, taus in enumerate(seeds):
            for d, tau in zip(domains, taus):
                out.append({"variant": name_of("domino", row), "seed": seed, "domain": d, "tau": tau,
                            "speedup": tau / 2, "acc_rate_pos_01": tau / 10, "acc_rate_pos_02": tau / 20})
    return out


def test_a_win_is_beyond_the_seed_spread_and_two_domains_make_a_default():
    plan = study_plan("default", drafters=["domino"], objectives=["kl", "dpace", "auf"])
    records = _records({OWN: [[3.0, 4.0, 5.0], [3.2, 4.2, 5.2]],
                        "kl": [[3.6, 4.6, 5.1], [3.6, 4.6, 5.3]],       # math and code beyond the spread
                        "dpace": [[3.8, 4.0, 5.0], [3.8, 4.2, 5.2]],    # math only
                        "auf": [[2.0, 3.0, 4.0], [2.0, 3.0, 4.0]]})     # worse everywhere
    table = drafter_table(records, plan, "domino", ["math", "code", "chat"])
    by = {r["objective"]: r for r in table["rows"]}
    assert by["kl"]["wins"] == ["math", "code"] and by["dpace"]["wins"] == ["math"] and by["auf"]["wins"] == []
    assert table["recommended"].startswith("kl (wins math, code)")
    assert math.isclose(by["kl"]["delta_pct"], 100 * ((3.6 + 4.6 + 5.2) / 3 / 4.1 - 1))
    assert "worse" in by["auf"]["verdict"] and OWN not in [r for r in by if "wins" in by[r]]
    one_seed = dataclasses.replace(plan, seeds=[0])
    assert drafter_table(records, one_seed, "domino", ["math"])["recommended"].startswith("n/a: 1 seed")
    assert wins({"a": (1.0, 0.1)}, {"a": (1.2, 0.1)}, ["a"]) == ["a"]
    assert wins({"a": (1.0, 0.1)}, {"a": (1.1, 0.1)}, ["a"]) == []  # 0.1 < hypot(0.1, 0.1)


def test_the_report_writes_tables_curves_and_figures(tmp_path):
    plan = study_plan("smoke", drafters=["domino"], objectives=["kl"])
    records = _records({OWN: [[3.0, 4.0, 5.0]], "kl": [[3.5, 4.0, 5.0]]},
                       domains=list(plan.prompts))
    tables, files, plots = report(records, plan, tmp_path)
    assert all(p.is_file() for p in files + plots)
    saved = json.loads((tmp_path / "objectives-smoke.json").read_text())
    assert saved["position_acceptance"]["domino"]["kl"] == [pytest.approx(0.4167, abs=1e-3),
                                                            pytest.approx(0.2083, abs=1e-3)]
    assert "KL(p ‖ q)" in tables["markdown"] and "DFlash 2's own term" in tables["markdown"]


def test_the_command_refuses_bad_input_in_one_line(capsys):
    from lit_domino.studies.objectives_command import main

    for argv, message in ((["--drafters", "backbon"], "unknown drafters 'backbon' (did you mean backbone?)"),
                          (["--set", "model.objective=kl"], "the study sets each row's objective"),
                          (["--preset", "paper"], "has no plan for preset 'paper'"),
                          (["--seeds", "x"], "seeds are integers")):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.count("\n") == 1 and message in err, err


def test_the_step_cost_times_every_drafter_and_objective():
    from lit_domino.studies.objectives_cost import cost_table, step_costs

    costs = step_costs("smoke", drafters=["backbone"], objectives=["kl"], repeats=1, warmup=0)
    assert [(c["drafter"], c["objective"]) for c in costs] == [("backbone", OWN), ("backbone", "kl")]
    assert costs[0]["ratio"] == 1.0 and all(c["ms"] > 0 for c in costs)
    assert "| kl |" in cost_table(costs)


@pytest.mark.slow
def test_the_smoke_study_end_to_end(tmp_path):
    """Two objectives of the backbone, one seed: trained, decoded losslessly per domain, tabled, in MLflow."""
    from mlflow.tracking import MlflowClient

    from lit_domino.runtime.tracking import default_tracking_uri
    from lit_domino.studies.objectives import run_objectives_study

    lean = {"data.train_examples": {"math": 24, "code": 12, "chat": 12}, "trainer.max_epochs": 1}  # ~2 min in all
    out = run_objectives_study("smoke", drafters=["backbone"], objectives=["kl"], out_dir=tmp_path, progress=False,
                               jobs=1, overrides=lean)
    assert [t.variant for t in out["trained"]] == ["backbone/own", "backbone/kl"]
    assert {r["domain"] for r in out["records"]} == set(out["plan"].prompts)
    assert all(r["match_baseline"] == 1.0 for r in out["records"])
    (table,) = out["tables"]["drafters"]
    assert [r["objective"] for r in table["rows"]] == [OWN, "kl"]
    assert json.loads((tmp_path / "summary.json").read_text())["lossless"] is True
    assert (tmp_path / "acceptance-per-position-smoke.png").is_file()
    client = MlflowClient(default_tracking_uri())
    study = client.get_run(out["run_id"])
    assert study.info.status == "FINISHED" and "backbone/kl/tau" in study.data.metrics
    kl = client.get_run(out["trained"][1].run_id)
    assert kl.data.tags["mlflow.parentRunId"] == out["run_id"] and kl.data.tags["objective"] == "kl"

"""The DLoop study's plan, configs and tables (no training: the end-to-end run is experiments/dloop.py --preset smoke)."""

from __future__ import annotations

import math

import pytest

from lit_domino.studies import dloop as ds
from lit_domino.decoding.dloop import DLoopConfig


def test_plan_defaults_and_overrides():
    plan = ds.study_plan("smoke")
    assert plan["drafters"] == ["backbone", "domino", "dspark", "dflash2", "eagle3"]
    assert plan["thresholds"] == [-0.25, -0.5, -0.75, -1.0, -2.0] and plan["stages"] == [1, 2, 3, 4]
    plan = ds.study_plan("smoke", drafters=["domino"], thresholds=ds.parse_list("-0.5,-1"),
                         stages=ds.parse_list("1,3", int), table_dloop={"threshold": -1, "max_stages": 2})
    settings = ds.dloop_settings(plan)
    assert settings[0] is None  # N = 1 is DLoop off: decoded once, not once per threshold
    assert settings[1:4] == [DLoopConfig(-0.5, 3), DLoopConfig(-1.0, 3), DLoopConfig(-1.0, 2)]  # + the table's gate
    assert settings[4:] == [DLoopConfig(**g) for g in plan["gates"]]  # + the alternative gates of study.yaml
    assert {g["gate"] for g in plan["gates"]} == {"mean", "scaled", "last"}
    for kind in ("dspark", "dflash2"):  # the distilled drafters loop-train too
        assert ds.study_plan("smoke", drafters=[kind])["drafters"] == [kind]


def test_domino_decodes_with_the_ablations_candidate_pool(tmp_path):
    """The DLoop study's Domino rows decode with the same pool as the ablation's, preset by preset."""
    from lit_domino.studies.ablation import study_plan as ablation_plan

    for preset in ("smoke", "default", "paper"):
        assert ds.study_plan(preset)["pool_size"] == ablation_plan(preset)["pool_size"]
    assert ds.study_plan("default")["pool_size"] is not None and ds.study_plan("paper")["pool_size"] is None
    # the pool is set in one place: a pool_size in the DLoop study file is refused, naming where it belongs
    study = tmp_path / "study.yaml"
    study.write_text(ds.STUDY_FILE.read_text().replace("    seed: 0\n", "    seed: 0\n    pool_size: 16\n", 1))
    with pytest.raises(ValueError, match="presets.smoke.pool_size: .*studies/ablation.yaml"):
        ds.study_plan("smoke", study_file=study)


def test_evaluate_passes_the_pool_and_repeats_to_every_decode(monkeypatch, tmp_path):
    plan = ds.study_plan("smoke", drafters=["domino"], thresholds=[-0.5], stages=[1, 3])
    names = {"domino": {"plain": "domino/plain", "loop": "domino/loop-detach"}}
    trained = {n: type("Trained", (), {"drafter_dir": n})() for n in ("domino/plain", "domino/loop-detach",
                                                                      "domino/control-n1")}
    calls = []
    monkeypatch.setattr(ds, "load_drafter", lambda path, target: path)
    monkeypatch.setattr(ds, "load_benchmark", lambda name, n: [name] * n)
    monkeypatch.setattr(ds, "benchmark", lambda target, drafters, prompts, **kw: calls.append((drafters, kw)) or [])
    ds.evaluate(None, trained, names, plan, progress=False)
    assert [sorted(d) for d, _ in calls] == [["domino/loop-detach", "domino/plain"], ["domino/control-n1"]]
    assert all(kw["pool_sizes"] == [64] and kw["repeats"] == plan["repeats"] == 1 for _, kw in calls)
    assert ds.study_plan("default")["repeats"] == 2
    study = tmp_path / "study.yaml"
    study.write_text(ds.STUDY_FILE.read_text().replace("repeats: 2", "repeats: 0", 1))
    with pytest.raises(ValueError, match="repeats must be a positive integer"):
        ds.study_plan("default", study_file=study)


@pytest.mark.parametrize("kwargs,match", [
    (dict(thresholds=[-0.5, 0.25]), "positive"),
    (dict(thresholds=[float("nan")]), "threshold"),
    (dict(stages=[0, 2]), "N must be integers >= 1"),
    (dict(stages=[]), "at least one"),
    (dict(drafters=["small_lm"]), r"drafters \[.small_lm.\] cannot be loop-trained"),
    (dict(table_dloop={"threshold": -0.5, "max_stages": 1}), "max_stages >= 2"),
    (dict(table_dloop={"threshold": 0.5, "max_stages": 3}), "positive"),
    (dict(table_dloop={"gate": "conf", "threshold": 1.5, "max_stages": 3}), r"in \(0, 1\]"),
    (dict(table_dloop={"gate": "cost", "threshold": None, "max_stages": 3}), r"\['eagle3'\] draft token by token"),
    (dict(table_dloop={"threshold": -0.5, "max_stages": 3, "truncate": 0.3}), "read an acceptance predictor"),
    (dict(table_dloop={"threshold": -0.5, "max_stages": 3, "cut": 0.3}), "takes gate, threshold"),
])
def test_bad_grids_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ds.study_plan("smoke", **kwargs)
    with pytest.raises(ValueError, match="unknown preset"):
        ds.study_plan("huge")
    with pytest.raises(ValueError, match="comma-separated"):
        ds.parse_list("1,x", int)


def test_cli_refuses_bad_input_before_training(capsys):
    from lit_domino.studies.dloop_command import main

    for argv, match in ((["--thresholds", "-0.5,0.5"], "positive"), (["--stages", "0"], ">= 1"),
                        (["--table-dloop", "x"], "[GATE@]THRESHOLD[:MAX_STAGES]"),
                        (["--table-dloop", "conf@0:3"], "(0, 1]"), (["--table-dloop", "cost:3"], "token by token")):
        with pytest.raises(SystemExit):
            main(argv)
        assert match in capsys.readouterr().err


def test_predictor_gates_plan_for_parallel_drafters():
    plan = ds.study_plan("smoke", drafters=["backbone", "domino"], table_dloop={"gate": "conf", "threshold": 0.6,
                                                                               "max_stages": 3, "truncate": 0.3})
    assert plan["table_dloop"] == {"gate": "conf", "threshold": 0.6, "max_stages": 3, "truncate": 0.3}
    assert ds.dloop_label(ds.DLoopConfig(**plan["table_dloop"])) == "conf@0.6:3+trunc@0.3"
    assert ds.study_plan("smoke", drafters=["backbone"], table_dloop={"gate": "cost", "max_stages": 3})


def test_loop_config_derives_from_the_base_and_is_keyed_by_it(tmp_path):
    from lit_domino.training.experiment import drafter_artifact

    plan = ds.study_plan("smoke")
    base = ds.base_config("domino", plan)
    a = ds.loop_config(base, tmp_path / "base-a", plan, detach=True)
    init = a["model"]["init_args"]
    assert a["model"]["class_path"] == ds.LOOP_CLASS
    assert init["init_from"] == str(tmp_path / "base-a") and init["detach_stage_context"] is True
    assert init["max_stages"] == 3 and init["causal_inputs"] == "teacher_forced"  # the base's GRU inputs
    assert "curriculum" not in init  # LoopModule's default λ = 0: the base finished its curriculum there
    assert "target" not in init and "block_size" not in init  # the training parser links them from data
    assert a["data"] == base["data"] and a["trainer"]["max_epochs"] == 1
    b = ds.loop_config(base, tmp_path / "base-a", plan, detach=False)
    c = ds.loop_config(base, tmp_path / "base-b", plan, detach=True)
    ctl = ds.loop_config(base, tmp_path / "base-a", plan, detach=True, max_stages=1)
    assert ctl["model"]["init_args"]["max_stages"] == 1 and ctl["tracking"]["variant"] == "domino_loop_n1"
    paths = {drafter_artifact(x) for x in (a, b, c, ctl)}
    assert len(paths) == 4 and drafter_artifact(a) == drafter_artifact(ds.loop_config(base, tmp_path / "base-a",
                                                                                     plan, detach=True))
    eagle = ds.base_config("eagle3", plan)
    assert eagle["data"]["block_size"] == 4  # 3 chain steps per stage
    # the fine-tune module accepts exactly these arguments
    import inspect

    from lit_domino.lit.base import DrafterModule
    from lit_domino.lit.loop import LoopModule

    known = set(inspect.signature(LoopModule.__init__).parameters) | set(
        inspect.signature(DrafterModule.__init__).parameters)
    assert set(init) <= known, set(init) - known


def fake_rows(plan, names):
    """Benchmark-shaped rows: τ grows with the gate's depth and with loop-aware training."""
    rows = []
    for kind in plan["drafters"]:
        for variant, name in names[kind].items():
            boost = 0.3 if variant != "plain" else 0.0
            for dl in ds.dloop_settings(plan):
                label = "off" if dl is None else dl.label()
                extra = 0.0 if dl is None else 0.2 * (dl.max_stages - 1)
                for d in plan["prompts"]:
                    tau = 2.0 + boost + extra
                    rows.append({"benchmark": d, "method": f"{name}+{label}", "kind": "drafter", "drafter": name,
                                 "temperature": 0.0, "dloop": label, "tau": tau, "speedup": tau / 2.0,
                                 "rounds": 10, "tokens": 10 * tau + 3, "num_prompts": 3, "match_baseline": 1.0,
                                 "stages_per_round": 1.0 if dl is None else 1.5})
    rows.append({"benchmark": "embedded-math", "method": "ar", "kind": "ar", "drafter": None, "temperature": 0.0,
                 "dloop": "off", "tau": 1.0, "speedup": 1.0})
    return rows


def test_tables_have_the_papers_shape():
    plan = ds.study_plan("smoke", thresholds=[-0.5, -1.0], stages=[1, 2, 3])
    names = {k: {"plain": f"{k}/plain", "loop detach": f"{k}/loop-detach", "loop grad": f"{k}/loop-grad",
                 "loop": f"{k}/loop-detach"} for k in plan["drafters"]}
    rows = fake_rows(plan, names)
    table = ds.dloop_table(rows, names, plan)
    assert [(r["drafter"], r["setting"]) for r in table["rows"][:4]] == [("backbone", s) for s in ds.SETTINGS]
    by = {(r["drafter"], r["setting"]): r for r in table["rows"]}
    assert by[("domino", "plain")]["avg/tau"] == 2.0
    assert by[("domino", "loop only")]["avg/tau"] == pytest.approx(2.4)  # gate -0.5:3
    assert by[("domino", "loop-aware training only")]["avg/tau"] == pytest.approx(2.3)
    assert by[("domino", "both")]["avg/tau"] == pytest.approx(2.7)
    assert by[("domino", "both")]["delta_speedup_pct"] == pytest.approx(35.0)
    assert "| eagle3 | both |" in table["markdown"] and "embedded-code τ" in table["markdown"]
    grid = ds.grid_table(rows, names, plan)
    # 5 drafters x 2 trainings x (off + 2 thresholds x 2 depths) x 3 domains
    assert len(plan["drafters"]) == 5 and len(grid["records"]) == 5 * 2 * 5 * 3
    rec = next(r for r in grid["records"] if r["threshold"] == -1.0 and r["max_stages"] == 3)
    assert rec["fwd_per_token"] == pytest.approx(10 / (10 * rec["tau"]))  # rounds / tokens after the first
    reports = {"domino/loop-detach": {"val/loss_stage1": 1.0, "val/loss_stage3": 2.0}}
    det = ds.detach_table(rows, names, reports, plan)
    assert any("domino" in v for v in det["verdicts"])
    assert ds.fwd_per_token({"kind": "ar"}) == 1.0 and math.isnan(ds.fwd_per_token({"kind": "drafter", "tokens": 0,
                                                                                     "rounds": 0}))


def test_table_metrics_names():
    plan = ds.study_plan("smoke", thresholds=[-0.5], stages=[1, 3])
    names = {k: {"plain": f"{k}/plain", "loop detach": f"{k}/loop-detach", "loop": f"{k}/loop-detach"}
             for k in plan["drafters"]}
    rows = fake_rows(plan, names)
    tables = {"grid": ds.grid_table(rows, names, plan), "dloop": ds.dloop_table(rows, names, plan)}
    metrics = ds.table_metrics(tables)
    assert metrics["domino.plain.embedded-math.tau"] == 2.0
    assert metrics["domino.loop-aware_training_only.avg.speedup"] == pytest.approx(1.15)
    assert metrics["grid.domino.plain.off.N1.embedded-code.fwd_per_token"] == pytest.approx(10 / (10 * 2.0))
    assert metrics["grid.eagle3.loop-aware.g-0.5.N3.embedded-chat.tau"] == pytest.approx(2.7)
    # "loop only"/"both" of the dloop table: gate -0.5:3 is in the grid; every value is finite
    assert len([k for k in metrics if not k.startswith("grid.")]) == len(plan["drafters"]) * 4 * 4 * 2
    assert all(math.isfinite(v) for v in metrics.values())


def test_study_stages_3_and_4_cache_rows_write_strict_json_and_log(tmp_path, monkeypatch):
    """run_dloop_study with training and decoding faked: rows cached (a rerun reuses them), strict JSON, MLflow."""
    import json

    from mlflow.tracking import MlflowClient

    from lit_domino.runtime.tracking import default_tracking_uri

    plan = ds.study_plan("smoke", thresholds=[-0.5], stages=[1, 3])
    names = {k: {"plain": f"{k}/plain", "loop detach": f"{k}/loop-detach", "loop": f"{k}/loop-detach"}
             for k in plan["drafters"]}

    class Trained:
        def __init__(self, name):
            self.drafter_dir = tmp_path / name.replace("/", "-")

    class Target:
        def fingerprint(self):
            return "fake-target"

    trained = {n: Trained(n) for k in names.values() for v, n in k.items() if v != "loop"}
    decoded = []

    def evaluate(*args, **kwargs):
        decoded.append(1)
        rows = fake_rows(plan, names)
        rows[0]["speedup"] = float("nan")  # a NaN cell must reach the JSON as null
        return rows

    monkeypatch.setattr(ds, "train_all", lambda *a, **k: (names, trained, {n: {} for n in trained}))
    monkeypatch.setattr(ds, "evaluate", evaluate)
    monkeypatch.setattr(ds, "load_target", lambda spec: Target())
    out = ds.run_dloop_study("smoke", thresholds=[-0.5], stages=[1, 3], out_dir=tmp_path / "out", progress=False)
    again = ds.run_dloop_study("smoke", thresholds=[-0.5], stages=[1, 3], out_dir=tmp_path / "again", progress=False,
                               mlflow_enabled=False)
    assert decoded == [1] and json.dumps(again["rows"]) == json.dumps(out["rows"])  # reused, NaN kept
    assert math.isnan(again["rows"][0]["speedup"])
    plan_of = ds.study_plan
    for change in ({"pool_size": None}, {"gates": []}, {"repeats": 3}):  # what evaluate() decodes by: the key
        monkeypatch.setattr(ds, "study_plan", lambda *a, change=change, **k: {**plan_of(*a, **k), **change})
        ds.run_dloop_study("smoke", thresholds=[-0.5], stages=[1, 3], out_dir=tmp_path / "changed", progress=False,
                           mlflow_enabled=False)
    assert decoded == [1, 1, 1, 1]
    monkeypatch.setattr(ds, "study_plan", plan_of)

    def strict(path):
        return json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{path.name}: bare {c}"))

    for name in ("grid", "dloop", "detach", "summary", "rows"):
        strict(tmp_path / "out" / f"{name}-smoke.json")
    assert strict(tmp_path / "out" / "rows-smoke.json")[0]["speedup"] is None
    run = MlflowClient(default_tracking_uri()).get_run(out["run_id"])
    assert run.data.metrics == ds.table_metrics(out["tables"])
    assert run.data.metrics["domino.both.avg.tau"] == pytest.approx(2.7)


def test_calibration_bins_stages_by_each_gate_and_plots(tmp_path):
    """Stage records of the DLoop-off rows -> per gate: P(whole stage accepted) by confidence bin, the gate's
    open rate at the table's threshold; the PNG is written."""
    plan = ds.study_plan("smoke", thresholds=[-0.5], stages=[1, 3])
    names = {k: {"plain": f"{k}/plain", "loop": f"{k}/loop-detach"} for k in plan["drafters"]}
    rows = fake_rows(plan, {k: {"plain": v["plain"], "loop detach": v["loop"]} for k, v in names.items()})
    for r in rows:  # confident stages (sum log q near 0) are accepted whole, unconfident ones are not
        if r.get("dloop") == "off" and r["kind"] == "drafter":
            r["stage_records"] = [[-0.05 * i, -0.01 * i, 3, 3 if i < 10 else 1] for i in range(40)]
    calib = ds.calibration(rows, names, plan, bins=4)
    recs = {(r["drafter"], r["training"], r["gate"]): r for r in calib["records"]}
    assert set(g for *_, g in recs) == {"sum", "mean", "scaled", "last"}
    s = recs[("domino", "plain", "sum")]
    assert s["n_stages"] == 40 * len(plan["prompts"]) and s["whole_stage_rate"] == pytest.approx(0.25)
    assert [b["accepted"] for b in s["bins"]] == [0.0, 0.0, 0.0, 1.0]  # most confident bin: all accepted
    assert s["open_rate_at_table_g"] == pytest.approx(11 / 40)  # sum >= -0.5: i <= 10
    assert s["accepted_when_open"] == pytest.approx(10 / 11)
    assert recs[("domino", "plain", "mean")]["open_rate_at_table_g"] == pytest.approx(31 / 40)  # sum/3 >= -0.5
    png = ds.calibration_plot(calib, tmp_path / "calibration.png", -0.5)
    assert png.exists() and png.stat().st_size > 1000
    table = ds.gates_table(rows, {k: {"plain": v["plain"], "loop": v["loop"]} for k, v in names.items()}, plan)
    assert [r["gate"] for r in table["rows"][:4]] == ["-0.5:3", "mean@-0.1:3", "scaled@-0.5:3", "last@-0.3:3"]


def test_a_gate_setting_that_can_never_open_is_refused_before_training():
    with pytest.raises(ValueError, match="never positive"):
        ds.study_plan("smoke", gates=[{"gate": "mean", "threshold": 0.2, "max_stages": 3}])
    with pytest.raises(ValueError, match="gate must be one of"):
        ds.study_plan("smoke", gates=[{"gate": "median", "threshold": -0.2}])

"""The DLoop study's plan, configs and tables (no training: the end-to-end run is experiments/dloop.py --preset smoke)."""

from __future__ import annotations

import dataclasses
import math
import statistics

import pytest

from lit_domino.studies import dloop as ds
from lit_domino.decoding.dloop import DLoopConfig


def test_plan_defaults_and_overrides():
    plan = ds.study_plan("smoke")
    assert plan.drafters == ["backbone", "domino", "dspark", "dflash2", "eagle3"]
    assert plan.thresholds == [-0.5, -1.0] and plan.stages == [1, 3]  # the smoke preset's own grid
    paper = ds.study_plan("paper")
    assert paper.thresholds == [-0.25, -0.5, -0.75, -1.0, -2.0] and paper.stages == [1, 2, 3, 4]  # the file's
    assert paper.block_sizes == [4, 8, 16] and ds.study_plan("default").block_sizes == [4]
    plan = ds.study_plan("smoke", drafters=["domino"], thresholds=ds.parse_list("-0.5,-1"),
                         stages=ds.parse_list("1,3", int), table_dloop={"threshold": -1, "max_stages": 2})
    settings = ds.dloop_settings(plan)
    assert settings[0] is None  # N = 1 is DLoop off: decoded once, not once per threshold
    assert settings[1:4] == [DLoopConfig(-0.5, 3), DLoopConfig(-1.0, 3), DLoopConfig(-1.0, 2)]  # + the table's gate
    assert settings[4:7] == [DLoopConfig(**g) for g in plan.gates]  # + the gates of study.yaml
    assert [ds.dloop_label(c) for c in settings[4:]] == ["conf@0.5:3", "cost:3", "trunc@0.3"]  # the sweep's: in
    assert plan.sweep_gates == [{"threshold": -0.5, "max_stages": 3}, {"gate": "conf", "threshold": 0.5,
                                                                          "max_stages": 3}]
    for kind in ("dspark", "dflash2"):  # the distilled drafters loop-train too
        assert ds.study_plan("smoke", drafters=[kind]).drafters == [kind]
    assert ds.study_plan("smoke", block_sizes=[4, 16]).block_sizes == [4, 16]


def test_predictor_gates_are_skipped_for_eagle3_with_the_reason():
    """A gate a drafter cannot use is skipped (planned, printed, in the tables), never an error."""
    plan = ds.study_plan("smoke")
    skipped = {(s["drafter"], s["gate"]) for s in plan.skipped}
    assert skipped == {("eagle3", "conf@0.5:3"), ("eagle3", "cost:3"), ("eagle3", "trunc@0.3")}
    assert all("token by token" in s["why"] for s in plan.skipped)
    eagle = [ds.dloop_label(c) for c in ds.drafter_settings(plan, "eagle3")]
    assert eagle == ["off", "-0.5:3", "-1:3"]
    assert len(ds.drafter_settings(plan, "dspark")) == len(ds.dloop_settings(plan)) == 6
    # the table's gate needs one drafter that can use it
    with pytest.raises(ValueError, match="no drafter of \\['eagle3'\\] can use the DLoop table's gate cost:3"):
        ds.study_plan("smoke", drafters=["eagle3"], table_dloop={"gate": "cost", "max_stages": 3})


def test_domino_decodes_with_the_ablations_candidate_pool(tmp_path):
    """The DLoop study's Domino rows decode with the same pool as the ablation's, preset by preset."""
    from lit_domino.studies.ablation import study_plan as ablation_plan

    for preset in ("smoke", "default", "paper"):
        assert ds.study_plan(preset).pool_size == ablation_plan(preset).pool_size
    assert ds.study_plan("default").pool_size is not None and ds.study_plan("paper").pool_size is None
    # the pool is set in one place: a pool_size in the DLoop study file is refused, naming where it belongs
    study = tmp_path / "study.yaml"
    study.write_text(ds.STUDY_FILE.read_text().replace("    seed: 0\n", "    seed: 0\n    pool_size: 16\n", 1))
    with pytest.raises(ValueError, match="presets.smoke.pool_size: .*studies/ablation.yaml"):
        ds.study_plan("smoke", study_file=study)


class FakeDrafter:
    def __init__(self, path, block_size=8):
        self.path = path
        self.config = type("Config", (), {"block_size": block_size})()


def test_evaluate_passes_the_pool_gates_and_block_sizes_to_every_decode(monkeypatch, tmp_path):
    import lit_domino.studies.acceptance as acc

    plan = ds.study_plan("smoke", drafters=["domino", "eagle3"], thresholds=[-0.5], stages=[1, 3],
                         block_sizes=[4, 16])
    names = {k: {"plain": f"{k}/plain", "loop": f"{k}/loop-detach"} for k in plan.drafters}
    names["domino"]["control n1"] = "domino/control-n1"
    trained = {n: type("Trained", (), {"drafter_dir": n})() for v in names.values() for n in v.values()}
    calls, attached, aliases = [], [], []
    monkeypatch.setattr(ds, "load_drafter", lambda path, target: FakeDrafter(path, 4 if "eagle3" in path else 8))
    monkeypatch.setattr(ds, "load_benchmark", lambda name, n: [name] * n)
    monkeypatch.setattr(ds, "_has_predictor", lambda d, predictor: predictor == f"p-{d.path}")
    monkeypatch.setattr(acc, "study_predictors", lambda target, drafters, preset: (
        attached.extend(d.path for d in drafters.values()), aliases.extend(drafters),
        {n: (f"p-{d.path}", "dir") for n, d in drafters.items()})[2])
    monkeypatch.setattr(ds, "benchmark", lambda target, drafters, prompts, **kw: calls.append((drafters, kw)) or [
        {"kind": "drafter", "drafter": n, "dloop": "off", "benchmark": "embedded-math"} for n in drafters])
    rows = ds.evaluate(None, trained, names, plan, progress=False)
    # the control fine-tune decodes every setting beside the plain and loop-aware drafters (one AR baseline)
    assert [sorted(d) for d, _ in calls] == [["domino/control-n1", "domino/loop-detach", "domino/plain",
                                              "eagle3/loop-detach", "eagle3/plain"], ["domino/plain"]]
    assert all(kw["pool_sizes"] == [64] and kw["repeats"] == plan.repeats == 1 for _, kw in calls)
    assert all(kw["record_stages"] for _, kw in calls)  # the whole-stage rate is read from the stage records
    grid = calls[0][1]["dloops"]
    labels = lambda cfgs: [ds.dloop_label(c) for c in cfgs]
    assert labels(grid["domino/plain"]) == ["off", "-0.5:3", "conf@0.5:3", "cost:3", "trunc@0.3"]
    assert labels(grid["eagle3/plain"]) == ["off", "-0.5:3"]  # the predictor gates skipped (planned, with reasons)
    assert sorted(attached) == ["domino/control-n1", "domino/loop-detach", "domino/plain"]  # not EAGLE-3
    # the plain one: the acceptance study's artifact name
    assert sorted(aliases) == ["domino", "domino/control-n1", "domino/loop-detach"]
    assert labels(grid["domino/control-n1"]) == labels(grid["domino/plain"])
    # the sweep: B = 4 for Domino (trained 8) with the sweep's gates; EAGLE-3 trained at 4 is decoded there once;
    # B = 16 is above both trained block sizes: skipped rows with the reason
    assert calls[1][1]["block_size"] == 4 and labels(calls[1][1]["dloops"]["domino/plain"]) == ["off", "-0.5:3",
                                                                                              "conf@0.5:3"]
    assert "block_size" not in calls[0][1]
    # each decode is given its drafters' predictors (none for EAGLE-3), the sweep the plain drafter's again
    assert calls[0][1]["predictors"] == {n: f"p-{n}" for n in ("domino/control-n1", "domino/loop-detach",
                                                                 "domino/plain")}
    assert calls[1][1]["predictors"] == {"domino/plain": "p-domino/plain"}
    assert [r["sweep"] for r in rows if r.get("sweep")] == [4]
    skipped = [(r["drafter"], r["block_size"]) for r in rows if r["kind"] == "skipped"]
    assert skipped == [("domino/plain", 16), ("eagle3/plain", 16)]
    assert "16 > its trained block size 8" in next(r["why"] for r in rows if r["kind"] == "skipped")
    assert ds.study_plan("default").repeats == 3
    study = tmp_path / "study.yaml"
    study.write_text(ds.STUDY_FILE.read_text().replace("repeats: 3", "repeats: 0", 1))
    with pytest.raises(ValueError, match="repeats must be a positive integer"):
        ds.study_plan("default", study_file=study)


def test_a_drafter_without_a_predictor_decodes_without_the_predictor_gates(monkeypatch, capsys):
    import lit_domino.studies.acceptance as acc

    plan = ds.study_plan("smoke", drafters=["backbone"])
    dloops = {"a": ds.drafter_settings(plan, "backbone"), "b": ds.drafter_settings(plan, "backbone")}
    monkeypatch.setattr(acc, "study_predictors", lambda target, drafters, preset: {"a": ("pred-a", "dir-a")})
    predictors, rows = ds.predictors_needed(None, {"a": object(), "b": object()}, dloops, plan)
    assert predictors == {"a": "pred-a"}
    assert len(dloops["a"]) == 6 and [ds.dloop_label(c) for c in dloops["b"]] == ["off", "-0.5:3", "-1:3"]
    assert [(r["drafter"], r["dloop"]) for r in rows] == [("b", "conf@0.5:3"), ("b", "cost:3"), ("b", "trunc@0.3")]
    assert "b: conf@0.5:3 skipped: no acceptance predictor" in capsys.readouterr().out


@pytest.mark.parametrize("kwargs,match", [
    (dict(thresholds=[-0.5, 0.25]), "positive"),
    (dict(thresholds=[float("nan")]), "threshold"),
    (dict(stages=[0, 2]), "N must be integers >= 1"),
    (dict(stages=[]), "at least one"),
    (dict(drafters=["small_lm"]), r"drafters \[.small_lm.\] cannot be loop-trained"),
    (dict(table_dloop={"threshold": -0.5, "max_stages": 1}), "max_stages >= 2"),
    (dict(table_dloop={"threshold": 0.5, "max_stages": 3}), "positive"),
    (dict(table_dloop={"gate": "conf", "threshold": 1.5, "max_stages": 3}), r"in \(0, 1\]"),
    (dict(drafters=["eagle3"], table_dloop={"gate": "cost", "threshold": None, "max_stages": 3}), "token by token"),
    (dict(drafters=["eagle3"], table_dloop={"threshold": -0.5, "max_stages": 3, "truncate": 0.3}),
     "reads an acceptance predictor"),
    (dict(block_sizes=[1, 4]), "block size B must be an integer >= 2"),
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
                        (["--table-dloop", "conf@0:3"], "(0, 1]"),
                        (["--drafters", "eagle3", "--table-dloop", "cost:3"], "token by token"),
                        (["--block-sizes", "1"], ">= 2"), (["--block-sizes", "x"], "comma-separated")):
        with pytest.raises(SystemExit):
            main(argv)
        assert match in capsys.readouterr().err


def test_predictor_gates_plan_for_parallel_drafters():
    plan = ds.study_plan("smoke", drafters=["backbone", "domino"], table_dloop={"gate": "conf", "threshold": 0.6,
                                                                               "max_stages": 3, "truncate": 0.3})
    assert plan.table_dloop == {"gate": "conf", "threshold": 0.6, "max_stages": 3, "truncate": 0.3}
    assert ds.dloop_label(ds.DLoopConfig(**plan.table_dloop)) == "conf@0.6:3+trunc@0.3"
    assert ds.study_plan("smoke", drafters=["backbone"], table_dloop={"gate": "cost", "max_stages": 3})


def test_loop_config_derives_from_the_base_and_is_keyed_by_it(tmp_path, monkeypatch):
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
    # LoopModule's DataModule would pick the default rule's layers: a DSpark (or EAGLE-3) fine-tune names its base's
    import lit_domino.models as models

    monkeypatch.setattr(models, "read_config", lambda d: type("Config", (), {"feature_layers": [1, 3, 5]})())
    spark = ds.loop_config(ds.base_config("dspark", plan), tmp_path / "spark", plan, detach=True)
    assert spark["data"]["feature_layers"] == [1, 3, 5] and a["data"].get("feature_layers") is None
    # a drafter's own fine-tune length beside the preset's (DSpark's loop steps cost more)
    plan = dataclasses.replace(plan, loop_trainer_by_drafter={"dspark": {"limit_train_batches": 0.25}})
    spark = ds.loop_config(ds.base_config("dspark", plan), tmp_path / "spark", plan, detach=True)
    assert spark["trainer"]["limit_train_batches"] == 0.25 and spark["trainer"]["max_epochs"] == 1
    assert "limit_train_batches" not in ds.loop_config(base, tmp_path / "base-a", plan, detach=True)["trainer"]
    study = tmp_path / "study.yaml"
    assert "      dspark: {limit_train_batches: 4}" in ds.STUDY_FILE.read_text()  # the smoke preset's
    study.write_text(ds.STUDY_FILE.read_text().replace("      dspark: {limit_train_batches: 4}",
                                                       "      dspak: {limit_train_batches: 4}", 1))
    with pytest.raises(ValueError, match=r"loop_trainer_by_drafter names \['dspak'\]"):
        ds.study_plan("smoke", study_file=study)
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
    for kind in plan.drafters:
        for variant, name in names[kind].items():
            boost = {"plain": 0.0, ds.CONTROL: 0.1}.get(variant, 0.3)
            for dl in ds.drafter_settings(plan, kind):
                label = "off" if dl is None else dl.label()
                extra = 0.0 if dl is None else 0.2 * (dl.max_stages - 1)
                stages = 1.0 if dl is None else 1.5
                for d in plan.prompts:
                    tau = 2.0 + boost + extra
                    rows.append({"benchmark": d, "method": f"{name}+{label}", "kind": "drafter", "drafter": name,
                                 "temperature": 0.0, "dloop": label, "tau": tau, "speedup": tau / 2.0,
                                 "rounds": 10, "tokens": 10 * tau + 3, "num_prompts": 3, "match_baseline": 1.0,
                                 "stages_per_round": stages, "block_size": 8, "draft_ms_per_round": 1.0 * stages,
                                 "verify_ms_per_round": 4.0 * stages, "other_ms_per_round": 1.0,
                                 "decode_s_by_prompt": [t / tau for t in (1.0, 2.0, 4.0)]})
    rows.append({"benchmark": "embedded-math", "method": "ar", "kind": "ar", "drafter": None, "temperature": 0.0,
                 "dloop": "off", "tau": 1.0, "speedup": 1.0})
    return rows


def test_tables_have_the_papers_shape():
    plan = ds.study_plan("smoke", thresholds=[-0.5, -1.0], stages=[1, 2, 3])
    names = {k: {"plain": f"{k}/plain", "loop detach": f"{k}/loop-detach", "loop grad": f"{k}/loop-grad",
                 ds.CONTROL: f"{k}/control-n1", "loop": f"{k}/loop-detach"} for k in plan.drafters}
    rows = fake_rows(plan, names)
    table = ds.dloop_table(rows, names, plan)
    assert [(r["drafter"], r["setting"]) for r in table["rows"][:6]] == [("backbone", s) for s in ds.SETTINGS]
    by = {(r["drafter"], r["setting"]): r for r in table["rows"]}
    assert by[("domino", "plain")]["avg/tau"] == 2.0
    assert by[("domino", "loop only")]["avg/tau"] == pytest.approx(2.4)  # gate -0.5:3
    assert by[("domino", "loop-aware training only")]["avg/tau"] == pytest.approx(2.3)
    assert by[("domino", "both")]["avg/tau"] == pytest.approx(2.7)
    assert by[("domino", "both")]["delta_speedup_pct"] == pytest.approx(35.0)
    # the control fine-tune (more training, no loop) is every section's reference for the loop-aware rows
    assert by[("domino", "control fine-tune")]["avg/tau"] == pytest.approx(2.1)
    assert by[("domino", "control + loop")]["avg/tau"] == pytest.approx(2.5)
    assert by[("domino", "both")]["paired_vs_control_pct"] == pytest.approx(100 * (2.7 / 2.1 - 1))
    assert by[("domino", "both")]["paired_vs_control_se"] == pytest.approx(0.0, abs=1e-9)  # one ratio per prompt
    assert by[("domino", "loop only")]["paired_vs_control_pct"] is None  # the plain drafter's rows: no control
    # GPU projection: the 1.5-stage rounds verified in the one-stage rounds' 4 ms, draft and other as measured
    assert by[("domino", "both")]["avg/projected_speedup"] == pytest.approx(1.35 * 8.5 / 6.5)
    assert by[("domino", "plain")]["avg/projected_speedup"] == pytest.approx(1.0)  # off: nothing to project
    assert by[("domino", "both")]["projected_vs_control_pct"] == pytest.approx(100 * (1.35 * 8.5 / 6.5 / 1.05 - 1))
    gain = ds.loop_gain_table(table, rows, plan)
    g = {(r["gate"], r["drafter"]): r for r in gain["rows"]}
    assert g[("-0.5:3", "domino")]["against"] == "control fine-tune"
    assert g[("-0.5:3", "domino")]["embedded-math/delta_pct"] == pytest.approx(100 * (2.7 / 2.1 - 1))
    assert g[("-0.5:3", "domino")]["avg/projected_delta_pct"] == pytest.approx(100 * (1.35 * 8.5 / 6.5 / 1.05 - 1))
    assert ("cost:3", "eagle3") not in g and ("-0.5:3", "eagle3") in g  # a gate EAGLE-3 cannot use: no gain row
    # one section per gate: the table's, then conf, cost and truncation; EAGLE-3's loop rows there say why not
    assert [line for line in table["markdown"].splitlines() if line.startswith("### ")] == [
        "### gate -0.5:3 (the table's gate)", "### gate conf@0.5:3", "### gate cost:3", "### gate trunc@0.3"]
    gates = {(r["gate"], r["drafter"], r["setting"]): r for r in table["gate_rows"]}
    assert gates[("cost:3", "dspark", "both")]["avg/tau"] == pytest.approx(2.7)
    assert "token by token" in gates[("cost:3", "eagle3", "both")]["skipped"]
    assert gates[("cost:3", "eagle3", "plain")]["avg/tau"] == 2.0  # DLoop off: every drafter has it
    assert "| eagle3 | both |" in table["markdown"] and "embedded-code τ" in table["markdown"]
    grid = ds.grid_table(rows, names, plan)
    # 5 drafters x 2 trainings x (off + 2 thresholds x 2 depths) x 3 domains
    assert len(plan.drafters) == 5 and len(grid["records"]) == 5 * 2 * 5 * 3
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
             for k in plan.drafters}
    rows = fake_rows(plan, names)
    tables = {"grid": ds.grid_table(rows, names, plan), "dloop": ds.dloop_table(rows, names, plan)}
    metrics = ds.table_metrics(tables)
    assert metrics["domino.plain.embedded-math.tau"] == 2.0
    assert metrics["domino.loop-aware_training_only.avg.speedup"] == pytest.approx(1.15)
    assert metrics["grid.domino.plain.off.N1.embedded-code.fwd_per_token"] == pytest.approx(10 / (10 * 2.0))
    assert metrics["grid.eagle3.loop-aware.g-0.5.N3.embedded-chat.tau"] == pytest.approx(2.7)
    # "loop only"/"both" of the dloop table: gate -0.5:3 is in the grid; every value is finite
    # (tau, speedup and the projected speedup)
    assert len([k for k in metrics if not k.startswith(("grid.", "gate."))]) == len(plan.drafters) * 4 * 4 * 3
    # the other gates' tables: 4 parallel drafters x 4 settings, EAGLE-3's 2 (no loop rows: skipped), x 4 columns x 3
    assert len([k for k in metrics if k.startswith("gate.")]) == 3 * (4 * 4 + 2) * 4 * 3
    assert metrics["gate.conf_0.5:3.domino.both.avg.tau"] == pytest.approx(2.7)  # "@": not in MLflow's names
    assert "gate.conf_0.5:3.eagle3.both.avg.tau" not in metrics
    assert all(math.isfinite(v) for v in metrics.values())


def test_study_stages_3_and_4_cache_rows_write_strict_json_and_log(tmp_path, monkeypatch):
    """run_dloop_study with training and decoding faked: rows cached (a rerun reuses them), strict JSON, MLflow."""
    import json

    from mlflow.tracking import MlflowClient

    from lit_domino.runtime.tracking import default_tracking_uri

    plan = ds.study_plan("smoke", thresholds=[-0.5], stages=[1, 3])
    names = {k: {"plain": f"{k}/plain", "loop detach": f"{k}/loop-detach", "loop": f"{k}/loop-detach"}
             for k in plan.drafters}

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
        monkeypatch.setattr(ds, "study_plan", lambda *a, change=change, **k: dataclasses.replace(plan_of(*a, **k), **change))
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
    names = {k: {"plain": f"{k}/plain", "loop": f"{k}/loop-detach"} for k in plan.drafters}
    rows = fake_rows(plan, {k: {"plain": v["plain"], "loop detach": v["loop"]} for k, v in names.items()})
    for r in rows:  # confident stages (sum log q near 0) are accepted whole, unconfident ones are not
        if r.get("dloop") == "off" and r["kind"] == "drafter":
            r["stage_records"] = [[-0.05 * i, -0.01 * i, 3, 3 if i < 10 else 1] for i in range(40)]
    calib = ds.calibration(rows, names, plan, bins=4)
    recs = {(r["drafter"], r["training"], r["gate"]): r for r in calib["records"]}
    assert set(g for *_, g in recs) == {"sum", "mean", "scaled", "last"}
    s = recs[("domino", "plain", "sum")]
    assert s["n_stages"] == 40 * len(plan.prompts) and s["whole_stage_rate"] == pytest.approx(0.25)
    assert [b["accepted"] for b in s["bins"]] == [0.0, 0.0, 0.0, 1.0]  # most confident bin: all accepted
    assert s["open_rate_at_table_g"] == pytest.approx(11 / 40)  # sum >= -0.5: i <= 10
    assert s["accepted_when_open"] == pytest.approx(10 / 11)
    assert recs[("domino", "plain", "mean")]["open_rate_at_table_g"] == pytest.approx(31 / 40)  # sum/3 >= -0.5
    png = ds.calibration_plot(calib, tmp_path / "calibration.png", -0.5)
    assert png.exists() and png.stat().st_size > 1000
    table = ds.gates_table(rows, {k: {"plain": v["plain"], "loop": v["loop"]} for k, v in names.items()}, plan)
    assert [r["gate"] for r in table["rows"][:5]] == ["off", "-0.5:3", "conf@0.5:3", "cost:3", "trunc@0.3"]
    by = {(r["drafter"], r["training"], r["gate"]): r for r in table["rows"]}
    assert by[("domino", "plain", "-0.5:3")]["delta_pct"] == pytest.approx(20.0)  # speedup 1.2 against 1.0 off
    assert "token by token" in by[("eagle3", "loop-aware", "cost:3")]["skipped"]
    assert "| eagle3 | plain | cost:3 | skipped: the gate cost:3 reads an acceptance predictor" in table["markdown"]


def test_gates_table_gives_the_throughput_beside_the_mean_speedup():
    """A gate that wins on long sequences and loses on short ones: the speedup (mean per-prompt time per token)
    falls, the domains' total decode time falls too; the table says both."""
    plan = ds.study_plan("smoke", thresholds=[-0.5], stages=[1, 3])
    names = {k: {"plain": f"{k}/plain", "loop": f"{k}/loop-detach"} for k in plan.drafters}
    rows = fake_rows(plan, {k: {"plain": v["plain"], "loop detach": v["loop"]} for k, v in names.items()})
    for r in rows:
        if r.get("drafter") == "domino/plain" and r["dloop"] in ("off", "cost:3"):
            gate = r["dloop"] == "cost:3"  # 10 rounds of 10 ms plain; the gate: 8 rounds of 11 ms, 0.97x speedup
            r.update(speedup=0.97 if gate else 1.0, rounds=8 if gate else 10, draft_ms_per_round=3.0 if gate else 2.0,
                     verify_ms_per_round=7.5, other_ms_per_round=0.5,  # and prompt by prompt: 1.1x, 1.2x, 1.1x
                     decode_s_by_prompt=[1.0, 1.0, 6.0] if gate else [1.1, 1.2, 6.6])
        if r.get("drafter") == "domino/plain" and r["dloop"] == "-0.5:3":  # a row without its times
            for key in ("draft_ms_per_round", "verify_ms_per_round", "other_ms_per_round", "decode_s_by_prompt"):
                r.pop(key)
    table = ds.gates_table(rows, {k: {"plain": v["plain"], "loop": v["loop"]} for k, v in names.items()}, plan)
    by = {(r["drafter"], r["training"], r["gate"]): r for r in table["rows"]}
    cost = by[("domino", "plain", "cost:3")]
    assert cost["delta_pct"] == pytest.approx(-3.0)
    assert cost["throughput_delta_pct"] == pytest.approx(100 * (100 / 88 - 1))  # 100 ms of rounds against 88
    assert by[("domino", "plain", "off")]["throughput_delta_pct"] is None
    assert math.isnan(by[("domino", "plain", "-0.5:3")]["throughput_delta_pct"])  # no per-round times: printed –
    header, sep, *lines = table["markdown"].splitlines()
    assert "Δ throughput vs off" in header and header.count("|") == sep.count("|")
    logs = [math.log(1.1), math.log(1.2), math.log(1.1)] * len(plan.prompts)  # each domain's prompts, paired
    mean = sum(logs) / len(logs)
    se = math.exp(mean) * statistics.stdev(logs) / len(logs) ** 0.5
    assert cost["paired_delta_pct"] == pytest.approx(100 * math.expm1(mean))
    assert cost["paired_se_pct"] == pytest.approx(100 * se)
    assert math.isnan(by[("domino", "plain", "-0.5:3")]["paired_delta_pct"])  # no per-prompt times: printed –
    assert any(line.startswith("| domino | plain | cost:3 |") and
               line.endswith(f"| -3.0 % | – | +13.6 % | {100 * math.expm1(mean):+.1f} % (±{200 * se:.1f}) | 0.97x |")
               for line in lines)  # verified as fast as the rounds off: the projection is the measured speedup
    assert all(line.count("|") == header.count("|") for line in lines if line.startswith("|"))  # skipped rows too


def test_a_gate_setting_that_can_never_open_is_refused_before_training():
    with pytest.raises(ValueError, match="never positive"):
        ds.study_plan("smoke", gates=[{"gate": "mean", "threshold": 0.2, "max_stages": 3}])
    with pytest.raises(ValueError, match="gate must be one of"):
        ds.study_plan("smoke", gates=[{"gate": "median", "threshold": -0.2}])


def gain_rows(plan, names):
    """Benchmark-shaped rows of the plain drafters at B = 8 (the main decode) and B = 4 (the sweep): the more
    stages a drafter's target accepts whole, the more its loop gains."""
    rows = []
    for i, kind in enumerate(plan.drafters):
        for bs, sweep in ((8, None), (4, 4)):
            rate = 0.1 * (i + 1) * (1.5 if bs == 4 else 1.0)
            for d in plan.prompts:
                recs = [[-0.1, -0.1, bs - 1, bs - 1 if j < round(100 * rate) else 0] for j in range(100)]
                for dl, speed in (("off", 1.2), ("-0.5:3", 1.2 * (0.9 + rate)), ("conf@0.5:3", 1.2 * (0.95 + rate))):
                    row = {"benchmark": d, "kind": "drafter", "drafter": names[kind]["plain"], "temperature": 0.0,
                           "dloop": dl, "block_size": bs, "speedup": speed, "tau": 2.0, "stages_per_round": 1.0,
                           "match_baseline": 1.0, "method": f"{kind}+{dl}"}
                    if dl == "off":
                        row["stage_records"] = recs
                    if sweep:
                        row["sweep"] = sweep
                    if dl != "conf@0.5:3" or kind != "eagle3":
                        rows.append(row)
    return rows


def test_gain_against_whole_stage_acceptance_points_fit_and_figure(tmp_path):
    plan = ds.study_plan("smoke")
    names = {k: {"plain": f"{k}/plain", "loop": f"{k}/loop-detach"} for k in plan.drafters}
    rows = gain_rows(plan, names)
    gain = ds.gain_points(rows, names, plan)
    pts = {(p["gate"], p["drafter"], p["domain"], p["block_size"]): p for p in gain["points"]}
    # one point per drafter x domain x block size and figure gate (EAGLE-3 has no conf rows)
    assert len(pts) == len(gain["points"]) == (5 + 4) * 3 * 2
    p = pts[("-0.5:3", "domino", "embedded-code", 4)]
    assert p["whole_stage_rate"] == pytest.approx(0.3) and p["gain_pct"] == pytest.approx(-10 + 30)
    assert pts[("-0.5:3", "domino", "embedded-code", 8)]["whole_stage_rate"] == pytest.approx(0.2)
    fit = gain["fits"]["-0.5:3"]  # gain = 100 (rate - 0.1) exactly: pays from a whole-stage rate of 0.1
    assert fit["b"] == pytest.approx(100) and fit["pays_from"] == pytest.approx(0.1) and fit["r"] == pytest.approx(1)
    assert gain["fits"]["conf@0.5:3"]["pays_from"] == pytest.approx(0.05)
    assert "crosses 0 at a whole-stage rate of 0.10" in gain["markdown"]
    # the main tables read the trained block size only: the sweep's rows stay out of them
    assert ds.cell_index(rows)[("domino/plain", "off", "embedded-code")]["block_size"] == 8
    png = ds.gain_plot(gain, tmp_path / "gain.png")
    assert png.exists() and png.stat().st_size > 5000
    assert ds.gain_plot({"points": [], "fits": {}}, tmp_path / "none.png") is None
    assert ds.line_fit([(0.1, 1.0)])["b"] is None and ds.line_fit([(0.1, 1.0), (0.1, 2.0)])["b"] is None
    assert ds.line_fit([(0.1, 1.0), (0.2, 0.0)])["pays_from"] is None  # falling: the loop never starts to pay
    metrics = ds.table_metrics({"dloop": ds.dloop_table(rows, names, plan), "grid": {"records": []}, "gain": gain})
    assert metrics["gain.conf_0.5:3.dspark.B4.embedded-chat.whole_stage_rate"] == pytest.approx(0.45)


def test_a_row_that_is_not_lossless_stops_the_study(tmp_path):
    rows = [{"kind": "ar", "match_baseline": 1.0}, {"kind": "skipped", "drafter": "eagle3/plain"},
            {"kind": "drafter", "method": "domino/plain", "benchmark": "embedded-math", "match_baseline": 1.0}]
    ds.check_lossless(rows, tmp_path / "rows.json", "DLoop study")
    assert not (tmp_path / "rows.json").exists()
    rows.append({"kind": "drafter", "method": "dspark/plain+dloop(cost:3)", "benchmark": "embedded-code",
                 "match_baseline": 0.5, "sweep": 4})
    rows.append({"kind": "drafter", "method": "x", "benchmark": "embedded-chat", "match_baseline": float("nan")})
    with pytest.raises(ds.NotLosslessError, match=r"2 DLoop study rows are not lossless.*cost:3\) on embedded-code "
                                                  r"\(B = 4\): 0.5, x on embedded-chat: nan"):
        ds.check_lossless(rows, tmp_path / "rows.json", "DLoop study")
    assert (tmp_path / "rows.json").exists()

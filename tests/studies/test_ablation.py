"""The ablation study: plan validation, and the smoke preset end to end (tables, MLflow, cache reuse)."""

import dataclasses
import json

import pytest

from lit_domino.studies.ablation import main, run_ablation, study_plan
from lit_domino.training.configs import available_variants, load_config, parse_override
from lit_domino.runtime.threads import usable_cpus


def test_plan_and_config_errors():
    with pytest.raises(ValueError, match="unknown preset"):
        study_plan("huge")
    with pytest.raises(ValueError, match="unknown variants"):
        study_plan("smoke", variants=["domino", "medusa"])
    with pytest.raises(ValueError, match="unknown variant"):
        load_config("medusa", "smoke")
    with pytest.raises(ValueError, match="unknown preset"):
        load_config("domino", "huge")


def test_every_study_variant_has_a_config():
    plan = study_plan("default")
    assert set(plan.variants) <= set(available_variants())
    assert len(plan.seeds) >= 2  # the default preset reports mean ± spread over seeds


def test_table_membership_comes_from_the_study_file():
    import yaml

    from lit_domino.studies.ablation import ROWS_FORMAT, STUDY_FILE, eval_key

    study = yaml.safe_load(STUDY_FILE.read_text())
    plan = study_plan("smoke", variants=["domino"])
    assert plan.tables == {"main": study["variants"]["main"], "ablations": study["variants"]["ablations"]}
    assert plan.variants == ["domino"]  # membership is the study's, whatever subset runs

    class Target:
        def fingerprint(self):
            return "fp"

    key = eval_key(plan, ["artifacts/drafters/domino-s0-abc"], Target())
    # the measured rows' cache key: the evaluation settings, not the table membership or the ETA's
    # reference times; the inner backbone is decoded for the curriculum ablation's variants only
    smoke = {k: v for k, v in study["presets"]["smoke"].items() if k != "reference_seconds"}
    old_plan = {**smoke, "variants": ["domino"], "seeds": [0], "inner_backbone": ["domino"], "exact_head": ["domino"]}
    assert study_plan("smoke").inner_backbone == ["domino", "domino_nocurriculum"]
    assert study_plan("smoke", variants=["domino_ttt", "backbone"]).inner_backbone == []
    assert key == {"rows": ROWS_FORMAT, "drafters": ["artifacts/drafters/domino-s0-abc"], "plan": old_plan,
                   "target": "fp"}


def test_overrides_and_links(tmp_path):
    """Overrides land in the composed config; the training parser (the one pipeline) links data to the model."""
    from lit_domino.training.cli import DrafterCLI, cli_args

    cfg = load_config("domino", "smoke", seed=3, overrides={"model.head.rank": 7, "data.block_size": 4})
    assert cfg["model"]["init_args"]["head"]["rank"] == 7 and cfg["data"]["block_size"] == 4
    cfg["tracking"]["enabled"] = False
    cfg["trainer"]["default_root_dir"] = str(tmp_path)
    cli = DrafterCLI(args=cli_args(cfg), run=False)
    h = cli.model.hparams
    assert h.head["rank"] == 7 and h.block_size == 4 and h.target == cfg["data"]["target"]
    assert cli.datamodule.hparams.seed == cfg["seed_everything"] == 3


def test_command_line_overrides_are_yaml(capsys):
    items = ["data.train_examples={math: 4000, code: 10}", "model.head.rank=32", "model.gamma=null"]
    assert dict(map(parse_override, items)) == {
        "data.train_examples": {"math": 4000, "code": 10}, "model.head.rank": 32, "model.gamma": None}
    with pytest.raises(SystemExit):
        main(["--set", "model.head.rank"])
    assert "KEY=VALUE" in capsys.readouterr().err


class Reached(Exception):
    """Raised where the study would build its target: everything before it (planning, config checks) passed."""


def test_a_method_key_is_applied_to_that_methods_variants_and_the_log_names_those_skipped(tmp_path, monkeypatch,
                                                                                          capsys):
    """``--set model.head.rank=8`` on the whole study: the variants with a head get it, the others are named as
    skipped (before: an error listing EAGLE-3's keys); ``methods.domino.head.gru_hidden`` reaches the preset's
    section."""
    from lit_domino.studies import ablation
    from lit_domino.target import load as target, recipe as tiny_target

    def reached(*args, **kwargs):
        raise Reached

    monkeypatch.setattr(target, "load_target", reached)
    monkeypatch.setattr(tiny_target, "build_tiny_target", reached)
    seen = {}
    real = ablation.study_configs

    def spy(preset, plan, overrides=None):
        configs, notes = real(preset, plan, overrides)
        seen.update({c["tracking"]["variant"]: c["model"]["init_args"] for c in configs})
        return configs, notes

    monkeypatch.setattr(ablation, "study_configs", spy)
    with pytest.raises(Reached):
        main(["--preset", "smoke", "--train-only", "--out", str(tmp_path), "--set", "model.head.rank=8",
              "--set", "methods.domino.head.gru_hidden=16"])
    out = capsys.readouterr().out
    assert ("model.head.rank=8: applied to domino, dspark, dflash2, domino_ttt, domino_nocurriculum; not to eagle3, "
            "small_lm, backbone (no such key)") in out
    assert ("methods.domino.head.gru_hidden=16: applied to domino, domino_ttt, domino_nocurriculum; not to eagle3, "
            "small_lm, backbone, dspark, dflash2 (other methods)") in out
    assert [seen[v].get("head") for v in ("domino", "domino_ttt", "backbone", "eagle3")] \
        == [{"rank": 8, "gru_hidden": 16}, {"rank": 8, "gru_hidden": 16}, None, None]
    assert seen["dspark"]["head"]["rank"] == 8 and "gru_hidden" not in seen["dspark"]["head"]


def test_a_bad_preset_is_answered_in_one_line_before_torch_is_imported():
    """``experiments/ablation.py --preset nosuch`` took 11-21 s and a traceback: the heavy imports came first."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "experiments" / "ablation.py"
    code = ("import runpy, sys\nsys.argv = [sys.argv[1], '--preset', 'nosuch']\ntry:\n"
            "    runpy.run_path(sys.argv[0], run_name='__main__')\nexcept SystemExit as exit_:\n"
            "    print(exit_.code, sorted(m for m in ('torch', 'lightning', 'mlflow', 'transformers') if m in sys.modules))")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, str(script)], capture_output=True, text=True, timeout=60)
    seconds = time.perf_counter() - t0
    assert proc.stderr == "ablation: error: unknown preset 'nosuch'; choose one of default, paper, rehearsal, smoke\n"
    assert proc.stdout.strip() == "2 []"  # rc 2, and none of the heavy libraries imported
    assert seconds < 2.0, seconds


@pytest.mark.slow
def test_smoke_ablation_end_to_end(smoke_ablation, tmp_path):
    from mlflow.tracking import MlflowClient

    from lit_domino.runtime.tracking import default_tracking_uri

    # --train-only trains every drafter and stops; the full run then only decodes (the session's smoke_ablation)
    plan = study_plan("smoke")
    n_trainings = len(plan.variants) * len(plan.seeds)  # every variant of the study file, once per seed
    first, out, results = smoke_ablation["first"], smoke_ablation["out"], smoke_ablation["results"]
    assert "tables" not in first
    assert len(first["trained"]) == n_trainings and not any(t.from_cache for t in first["trained"])
    assert all(t.from_cache for t in out["trained"])
    main = out["tables"]["main"]
    assert [r["variant"] for r in main["rows"]] == plan.tables["main"]  # the study file's rows, in its order
    assert {"backbone", "domino", "dspark", "dflash2"} <= set(plan.tables["main"])
    for row in main["rows"]:  # one seed: each cell is its drafter's decode row (the preset's pool where it has one)
        for metric in ("tau", "speedup"):
            measured = _decode_cells(out["rows"], row["variant"], metric)
            assert list(measured) == list(plan.prompts)
            for col in plan.prompts:
                assert row[f"{col}/{metric}"] == (pytest.approx(measured[col]), 0.0), (row["variant"], col, metric)
            avg = sum(measured.values()) / len(measured)
            assert row[f"avg/{metric}"] == (pytest.approx(avg), 0.0), (row["variant"], metric)
    studies = [r["study"] for r in out["tables"]["ablations"]["rows"]]
    assert studies == ["head", "causal_inputs", "curriculum", "pool", "pool"]
    # Domino is decoded with the preset's candidate pool, and once more with the exact head for the pool rows only
    pools = {(r["drafter"], r["pool_size"]) for r in out["rows"] if r["kind"] == "drafter"}
    assert {p for d, p in pools if d.startswith("domino")} == {64, None}
    assert ("domino/s0", None) in pools and ("domino_ttt/s0", None) not in pools and ("backbone/s0", None) in pools
    for name in ("main.md", "main.json", "ablations.md", "ablations.json", "peers.md", "stage_times.json"):
        assert (results / name).is_file()
    times = json.loads((results / "stage_times.json").read_text())
    names = [s["stage"] for s in times["stages"]]
    assert names[:2] == ["target", "regenerate data"] and names[-2:] == ["decode", "tables"]
    assert sorted(n.split(" [")[0] for n in names if n.startswith("features")) == [
        "features dflash", "features dspark", "features eagle3"]  # one feature cache per feature rule
    assert len([n for n in names if n.startswith("train ")]) == n_trainings
    assert times["jobs"] == min(2, usable_cpus())  # trainings two at a time on a CPU machine with 2+ cores
    assert all(s["cached"] for s in times["stages"] if s["stage"].startswith("train "))  # trained by --train-only
    assert times["total_seconds"] >= sum(s["seconds"] for s in times["stages"]) - 1.0
    # the backbone inside Domino is decoded alone only where the curriculum ablation reports it
    assert sorted({r["drafter"] for r in out["rows"] if str(r["drafter"]).endswith("/backbone")}) == [
        "domino/s0/backbone", "domino_nocurriculum/s0/backbone"]
    # every decoded method reproduced the target's greedy output
    assert all(r["match_baseline"] == 1.0 for r in out["rows"] if r["kind"] == "drafter")
    client = MlflowClient(default_tracking_uri())
    exp = client.get_experiment_by_name("ablation-smoke")
    runs = client.search_runs([exp.experiment_id])
    variants = {r.data.tags.get("variant") for r in runs if r.info.status == "FINISHED"}
    assert set(plan.variants) <= variants
    domino = next(r for r in runs if r.data.tags.get("variant") == "domino")
    assert "tau" in domino.data.metrics and "speedup" in domino.data.metrics
    # the pooled decode is the run's own metrics; the exact head's, beside it, are exact_head/...
    assert domino.data.tags["decode_pool_size"] == "64" and "exact_head/tau" in domino.data.metrics
    ttt = next(r for r in runs if r.data.tags.get("variant") == "domino_ttt")
    assert ttt.data.tags["decode_pool_size"] == "64" and "exact_head/tau" not in ttt.data.metrics
    backbone = next(r for r in runs if r.data.tags.get("variant") == "backbone")
    assert "decode_pool_size" not in backbone.data.tags
    _check_study_run(client, exp, runs, plan, {t.run_id for t in out["trained"]})
    # a rerun reuses every trained drafter and the measured rows
    again = run_ablation("smoke", out_dir=tmp_path / "again", progress=False)
    assert all(t.from_cache for t in again["trained"])
    assert json.dumps(again["rows"]) == json.dumps(out["rows"])  # (NaN != NaN, so compare as JSON)


def _decode_cells(rows: list[dict], variant: str, metric: str) -> dict[str, float]:
    """Benchmark → ``metric`` of ``variant``'s own decode (seed 0, T = 0, not a view), read straight off the rows:
    the pooled decode where the variant has one, else its only one."""
    from lit_domino.decoding.metric_names import MethodKey

    mine = [(MethodKey.of(r["key"]), r) for r in rows if r["kind"] == "drafter" and r["temperature"] == 0]
    mine = [(k, r) for k, r in mine if k.drafter == variant and k.view is None and k.seed == 0]
    pooled = [(k, r) for k, r in mine if k.pool is not None]
    cells = {}
    for _, r in pooled or mine:
        assert r["benchmark"] not in cells, (variant, r["benchmark"])
        cells[r["benchmark"]] = float(r[metric])
    return cells


def _check_study_run(client, exp, runs, plan, trained: set) -> None:
    """The store as a researcher compares ablations: a model-training experiment with the saved τ/speedup view, one
    study run (seed-aggregated metrics, tables and plots as its artifacts) with every training run nested under it,
    no separate tables run, and one param name per setting with no machine path."""
    from lit_domino.runtime import tracking
    from lit_domino.studies import study_runs

    assert exp.tags[tracking.EXPERIMENT_KIND_TAG] == tracking.MODEL_TRAINING
    view = json.loads(json.loads(exp.tags[tracking.SAVED_VIEW_PREFIX + study_runs.VIEW_ID])["state"])
    assert view["selectedColumns"][:2] == ["metrics.`tau`", "metrics.`speedup`"]
    studies = [r for r in runs if r.data.tags.get("study") == "ablation-smoke"]  # (a --set run has its own)
    assert len(studies) == 1 and studies[0].info.status == "FINISHED" and studies[0].info.run_name == "ablation-smoke"
    study = studies[0]
    assert study.data.tags["study_role"] == "study" and study.data.tags["table"] == "summary"
    assert not [r for r in runs if r.info.run_name.startswith("tables-")]
    trainings = [r for r in runs if r.info.run_id in trained]
    assert len(trainings) == len(trained)
    assert {r.data.tags.get("mlflow.parentRunId") for r in trainings} == {study.info.run_id}
    metrics = study.data.metrics
    for run in trainings:  # one seed: the study's mean is the run's own value, the spread 0
        variant = run.data.tags["variant"]
        assert metrics[f"{variant}/tau"] == pytest.approx(run.data.metrics["tau"])
        assert metrics[f"{variant}/tau_spread"] == 0.0 and f"{variant}/speedup" in metrics
        for domain in plan.prompts:
            assert f"{variant}/{domain}/tau" in metrics and f"{variant}/{domain}/speedup_spread" in metrics
        params = run.data.params
        assert "rank" not in params and "seed" not in params  # one name per setting (model.head.rank, seed_everything)
        assert not [k for k in params if "/" in k], "Lightning's hparams names (curriculum/kind) are not logged"
        assert not [k for k, v in params.items() if v.startswith("/")], "no machine paths"
    artifacts = {a.path for folder in ("tables", "plots") for a in client.list_artifacts(study.info.run_id, folder)}
    assert {"tables/main.md", "tables/ablations.json", "tables/rows.json", "plots/study-tau-speedup.png"} <= artifacts


def test_a_subset_run_does_not_replace_the_full_studys_results(tmp_path, monkeypatch, capsys):
    from lit_domino.studies import ablation

    full = study_plan("smoke")
    assert ablation.default_out_dir("smoke", full).name == "ablation-smoke"
    subset = study_plan("smoke", variants=["backbone", "domino"], seeds=[1])
    assert ablation.default_out_dir("smoke", subset).name == "ablation-smoke-backbone+domino-s1"
    tuned = dataclasses.replace(full, overrides={"model.head.rank": 8})
    assert ablation.default_out_dir("smoke", tuned).name.startswith("ablation-smoke-set-")
    # an explicit --out that holds another plan's tables is replaced with a note, not silently
    (tmp_path / "summary.json").write_text(json.dumps({"variants": ["domino"], "seeds": [0], "overrides": None}))
    ablation._warn_if_replacing(tmp_path, subset, 0.0)
    assert "replaces them" in capsys.readouterr().out
    ablation._warn_if_replacing(tmp_path, dataclasses.replace(full, variants=["domino"], seeds=[0]), 0.0)
    assert capsys.readouterr().out == ""


def test_domino_is_decoded_with_the_presets_pool_and_once_with_the_exact_head(tmp_path, monkeypatch):
    import yaml

    from dataclasses import replace

    from lit_domino.decoding.metric_names import MethodKey
    from lit_domino.studies import ablation, ablation_plan
    from lit_domino.studies.tables import ablation_table

    plan = study_plan("smoke")
    pool = yaml.safe_load(ablation.STUDY_FILE.read_text())["presets"]["smoke"]["pool_size"]
    assert isinstance(pool, int)  # the smoke preset decodes with a pool: CI runs the pool rows
    assert plan.pool_size == pool and plan.exact_head == ["domino"]  # the pool rows name domino@full
    assert study_plan("smoke", variants=["backbone", "domino_ttt"]).exact_head == []
    assert study_plan("paper").pool_size is None and study_plan("paper").exact_head == []

    def row(key, tau):
        return {"kind": "drafter", "key": key.as_dict(), "drafter": key.base().label(), "method": key.label(),
                "pool_size": key.pool, "benchmark": "math", "temperature": 0.0, "tau": tau, "speedup": tau / 2}

    domino = MethodKey("domino", 0)
    rows = [row(replace(domino, pool=16), 3.0), row(domino, 3.1), row(MethodKey("backbone", 0), 2.0),
            row(replace(domino, view="backbone"), 1.5)]
    records = ablation.records_from_rows(rows)
    assert [(r["variant"], r["pool_size"]) for r in records] == [("domino", 16), ("domino@full", None),
                                                                 ("backbone", None)]
    assert records[0]["backbone_tau"] == records[1]["backbone_tau"] == 1.5
    pool_rows = [r for r in ablation_table(records)["rows"] if r["study"] == "pool"]
    assert [(r["metric"], r["from_value"][0], r["to_value"][0]) for r in pool_rows] == [
        ("tau", 3.1, 3.0), ("speedup", 1.55, 1.5)]
    # the exact head alone (a preset without a pool): plain variants, and no pool rows
    exact = ablation.records_from_rows([r for r in rows if r["pool_size"] is None])
    assert [r["variant"] for r in exact] == ["domino", "backbone"]
    assert not [r for r in ablation_table(exact)["rows"] if r["study"] == "pool"]
    # a pool that is not a positive integer fails at planning, before any training
    study = yaml.safe_load(ablation.STUDY_FILE.read_text())
    study["presets"]["smoke"]["pool_size"] = 0
    bad = tmp_path / "ablation.yaml"
    bad.write_text(yaml.safe_dump(study, allow_unicode=True))
    monkeypatch.setattr(ablation_plan, "STUDY_FILE", bad)
    with pytest.raises(ValueError, match="presets.smoke.pool_size must be null"):
        study_plan("smoke")


def test_every_training_is_on_the_clock_before_the_first_stage():
    from lit_domino.studies.ablation import plan_trainings
    from lit_domino.runtime.jobclock import JobClock

    configs = [load_config(v, "smoke", s) for v in ("backbone", "domino") for s in (7, 8)]  # seeds nothing trained
    clock = JobClock(jobs=2)
    todo = plan_trainings(configs, clock, {"train": {"backbone": 10.0, "domino": 20.0}})
    assert todo == [0, 1, 2, 3]
    assert [s.reference for s in clock.stages.values()] == [10.0, 10.0, 20.0, 20.0]
    assert all(s.parallel for s in clock.stages.values())
    assert clock.eta_seconds() == 60.0 / 2  # two workers share the four trainings


def test_tables_give_the_speedup_over_both_plain_decoders_labelled():
    """Where the decode ran the compiled plain decoder, the main table has its speedup columns beside the eager
    one's, and the ablation rows of metric speedup say both; the labels name which plain decoder each is over.
    Rows of a decode without it keep today's columns."""
    from lit_domino.decoding.metric_names import MethodKey
    from lit_domino.studies.tables import ablation_table, main_table, records_from_rows

    def row(variant, seed, domain, tau, eager, compiled=None):
        key = MethodKey(variant, seed)
        r = {"kind": "drafter", "key": key.as_dict(), "drafter": key.label(), "method": key.label(),
             "pool_size": None, "benchmark": domain, "temperature": 0.0, "tau": tau, "speedup": eager}
        return r if compiled is None else {**r, "speedup_vs_compiled_ar": compiled}

    rows = [row(v, s, d, 3.0 + s, e + 0.1 * s, c + 0.1 * s) for v, e, c in (("backbone", 1.2, 0.5),
                                                                              ("domino", 1.5, 0.7))
            for s in (0, 1) for d in ("math", "code")]
    records = records_from_rows(rows)
    main = main_table(records, ["math", "code"])
    assert main["speedups"] == ["speedup", "speedup_vs_compiled_ar"]
    header = main["markdown"].splitlines()[0]
    assert "avg speedup (eager plain)" in header and "avg speedup (compiled plain)" in header
    domino = next(r for r in main["rows"] if r["variant"] == "domino")
    assert domino["avg/speedup_vs_compiled_ar"][0] == pytest.approx(0.75)
    head = next(r for r in ablation_table(records)["rows"] if r["study"] == "head")
    assert head["compiled_from"][0] == pytest.approx(0.55) and head["compiled_to"][0] == pytest.approx(0.75)
    assert "speedup (compiled plain)" in ablation_table(records)["markdown"]
    eager_only = records_from_rows([{k: v for k, v in r.items() if k != "speedup_vs_compiled_ar"} for r in rows])
    assert main_table(eager_only, ["math", "code"])["speedups"] == ["speedup"]
    assert "compiled" not in ablation_table(eager_only)["markdown"]

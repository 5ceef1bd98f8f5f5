"""notebooks/analysis.ipynb end to end (nbclient) on an MLflow store this test fills, and lit_domino.studies.analysis."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "analysis.ipynb"
VARIANTS = ["eagle3", "small_lm", "backbone", "domino", "domino_ttt", "domino_nocurriculum"]
BENCHMARKS = ["embedded-math", "embedded-code", "embedded-chat"]
BLOCK = 7  # drafted positions per round


def _curve(variant: str, rng: random.Random) -> list[float]:
    base = {"eagle3": 0.55, "small_lm": 0.5, "backbone": 0.6, "domino": 0.75, "domino_ttt": 0.7,
            "domino_nocurriculum": 0.68}[variant]
    return [max(0.05, min(1.0, base - 0.04 * k + rng.uniform(-0.03, 0.03))) for k in range(BLOCK)]


def _tau(curve: list[float]) -> float:
    tau, p = 1.0, 1.0
    for a in curve:
        p *= a
        tau += p
    return tau


def fill_store(uri: str, root: Path, preset: str = "smoke", seeds=(0, 1)) -> dict:
    """Runs shaped like lit_domino.studies.ablation's: the study run (rows.json, seed-aggregated metrics such as
    ``domino/tau``, which are no benchmark) with one run per variant x seed nested under it, plus a sweep study
    with two trials (which the ablation tables must ignore)."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.create_experiment(f"ablation-{preset}", artifact_location=(root / "mlruns").as_uri())
    rng = random.Random(0)
    rows, expected = [], {}
    tables = client.create_run(exp, run_name=f"ablation-{preset}", tags={
        "study": f"ablation-{preset}", "study_role": "study", "table": "summary", "preset": preset})
    for variant in VARIANTS:
        for seed in seeds:
            run = client.create_run(exp, run_name=f"{variant}-{preset}-s{seed}", tags={
                "variant": variant, "preset": preset, "seed": str(seed), "mlflow.parentRunId": tables.info.run_id,
                "table": "main" if variant in ("eagle3", "small_lm", "backbone", "domino") else "ablations"})
            rid = run.info.run_id
            metrics = [Metric("train/loss", 3.0 - step, 0, step) for step in range(3)]  # a training curve
            per = {}
            for b in BENCHMARKS:
                curve = _curve(variant, rng)
                tau = _tau(curve)
                speed = 0.6 * tau + rng.uniform(-0.1, 0.1)
                per[b] = {"tau": tau, "speedup": speed, **{f"acc_rate_pos_{k + 1:02d}": a for k, a in enumerate(curve)}}
                if variant.startswith("domino"):
                    per[b]["backbone_tau"] = tau * 0.8
                metrics += [Metric(f"{b}/{key}", v, 0, 0) for key, v in per[b].items()]
                hist = [0] + [rng.randint(1, 20) for _ in range(BLOCK + 1)]
                rows.append({"benchmark": b, "method": f"{variant}/s{seed}", "kind": "drafter",
                             "key": {"drafter": variant, "seed": seed},  # the typed key rows carry
                             "drafter": f"{variant}/s{seed}", "temperature": 0.0, "tau": tau, "speedup": speed,
                             "tau_histogram": hist})
            metrics += [Metric(key, sum(p[key] for p in per.values()) / len(per), 0, 0) for key in per[BENCHMARKS[0]]]
            client.log_batch(rid, metrics=metrics)
            expected[(variant, seed)] = sum(p["tau"] for p in per.values()) / len(per)
            client.set_terminated(rid, "FINISHED")
    # a failed run and a training-only run: neither belongs in the tables
    failed = client.create_run(exp, run_name="domino-crashed", tags={"variant": "domino", "preset": preset, "seed": "5"})
    client.log_metric(failed.info.run_id, "tau", 99.0)
    client.set_terminated(failed.info.run_id, "FAILED")
    train_only = client.create_run(exp, run_name="train-only", tags={"variant": "domino", "preset": preset, "seed": "6"})
    client.set_terminated(train_only.info.run_id, "FINISHED")
    client.log_dict(tables.info.run_id, rows, "tables/rows.json")
    client.log_metric(tables.info.run_id, "domino/tau", 99.0)  # a seed aggregate of the study run
    client.set_terminated(tables.info.run_id, "FINISHED")
    # a sweep: study run + trials (tag sweep), as lit_domino.studies.sweep writes them
    sexp = client.create_experiment("sweep-demo", artifact_location=(root / "mlruns-sweep").as_uri())
    study = client.create_run(sexp, run_name="demo", tags={"sweep": "demo", "sweep_role": "study", "variant": "domino"})
    for n, (rank, kind) in enumerate([(32, "linear"), (128, "cosine")]):
        t = client.create_run(sexp, run_name=f"demo-t{n:03d}", tags={
            "variant": "domino", "preset": preset, "seed": "0", "sweep": "demo", "optuna.trial": str(n),
            "mlflow.parentRunId": study.info.run_id})
        client.log_param(t.info.run_id, "trial.rank", str(rank))
        client.log_param(t.info.run_id, "trial.lambda_kind", kind)
        for key, v in (("tau", 2.0 + n), ("speedup", 1.0 + n), ("objective", 2.0 + n)):
            client.log_metric(t.info.run_id, key, v)
        client.set_terminated(t.info.run_id, "FINISHED")
    client.set_terminated(study.info.run_id, "FINISHED")
    return expected


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One filled store for the module (creating an MLflow SQLite store takes seconds)."""
    root = tmp_path_factory.mktemp("mlflow_store")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    expected = fill_store(uri, root)
    return uri, expected


def test_analysis_reads_runs_and_rebuilds_tables(store):
    from lit_domino.studies import analysis

    uri, expected = store
    runs = analysis.load_runs(uri)
    assert len(runs) == len(VARIANTS) * 2  # the failed, training-only, sweep and study runs are left out
    assert set(runs["variant"]) == set(VARIANTS) and set(runs["seed"]) == {0, 1}
    assert analysis.domains(runs) == BENCHMARKS
    for _, r in runs.iterrows():
        assert r["tau"] == pytest.approx(expected[(r["variant"], r["seed"])])
    assert len(analysis.load_runs(uri, include_sweeps=True)) == len(runs) + 2
    tables = analysis.rebuild_tables(runs, "smoke")
    main = tables["main"]
    assert [r["variant"] for r in main["rows"]] == ["eagle3", "small_lm", "backbone", "domino"]
    for row in main["rows"]:
        for col in main["columns"]:
            assert math.isfinite(row[f"{col}/tau"][0]) and math.isfinite(row[f"{col}/speedup"][0])
    assert [r["study"] for r in tables["ablations"]["rows"]] == ["head", "causal_inputs", "curriculum"]
    curves = analysis.acceptance_curves(runs)
    assert sorted(curves["position"].unique()) == list(range(1, BLOCK + 1))
    hist = analysis.tau_histograms(uri)
    assert set(hist["variant"]) == set(VARIANTS) and hist["rounds"].sum() > 0
    trials = analysis.sweep_trials(uri)
    assert list(trials["trial"]) == [1, 0] and list(trials["rank"]) == [128, 32]
    for fig in (analysis.plot_acceptance_curves(runs, "smoke"), analysis.plot_tau_histograms(runs, hist, "smoke"),
                analysis.plot_tau_histograms(runs, None, "smoke"), analysis.plot_speedup_bars(runs, "smoke"),
                analysis.plot_sweep(trials, "rank", "demo")):
        assert fig.axes


def test_analysis_degrades_on_missing_or_empty_store(tmp_path):
    from lit_domino.studies import analysis

    uri = f"sqlite:///{tmp_path / 'nothing.db'}"
    runs = analysis.load_runs(uri)
    assert runs.empty and not (tmp_path / "nothing.db").exists()  # reading never creates a store
    assert analysis.rebuild_tables(runs) == {} and analysis.tau_histograms(uri).empty
    assert analysis.sweep_trials(uri).empty and analysis.summary_frame(runs).empty
    for fig in (analysis.plot_acceptance_curves(runs), analysis.plot_speedup_bars(runs),
                analysis.plot_tau_histograms(runs)):
        assert fig.axes


def _execute(uri: str, tmp_path: Path, monkeypatch):
    from lit_domino.studies.analysis import execute_notebook

    monkeypatch.delenv("LIT_DOMINO_PRESET", raising=False)
    nb = execute_notebook(NOTEBOOK, tmp_path / "executed.ipynb", uri, timeout=120)
    assert (tmp_path / "executed.ipynb").is_file()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    text += "".join(o.get("data", {}).get("text/markdown", "") for o in outputs if "data" in o)
    images = sum("image/png" in o.get("data", {}) for o in outputs)
    return text, images


@pytest.mark.slow  # starts a Jupyter kernel
def test_notebook_executes_end_to_end(store, tmp_path, monkeypatch):
    uri, _ = store
    assert not any(c.get("outputs") for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code"), \
        "commit the notebook without outputs"
    text, images = _execute(uri, tmp_path, monkeypatch)
    assert "12 result runs" in text
    assert "Main table (smoke)" in text and "Domino ablations (smoke)" in text
    assert "Domino (TF + curriculum)" in text and "Study `demo`" in text
    assert images >= 4  # acceptance curves, τ histogram, speedup bars, sweep scatter


@pytest.mark.slow  # starts a Jupyter kernel
def test_notebook_says_no_runs_on_an_empty_store(tmp_path, monkeypatch):
    text, images = _execute(f"sqlite:///{tmp_path / 'empty.db'}", tmp_path, monkeypatch)
    assert "no runs" in text and "no sweep trials" in text
    assert images == 0


@pytest.mark.slow
def test_the_notebooks_tables_are_the_ones_the_job_wrote(smoke_ablation, tmp_path, monkeypatch):
    """The smoke ablation's own store: the rebuilt tables (and what the executed notebook displays) are
    ``results/``' Markdown, pool and exact-head rows included; the pooled runs' ``exact_head/...`` metrics are
    no benchmark."""
    import os

    from lit_domino.studies import analysis

    results, uri = smoke_ablation["results"], os.environ["MLFLOW_TRACKING_URI"]
    written = {name: (results / f"{name}.md").read_text() for name in ("main", "ablations")}
    runs = analysis.load_runs(uri)
    assert "exact_head/tau" in runs and "exact_head" not in analysis.domains(runs)
    tables = analysis.rebuild_tables(runs, "smoke", uri)
    for name, markdown in written.items():
        assert tables[name]["markdown"] + "\n" == markdown
    pool = [r for r in tables["ablations"]["rows"] if r["study"] == "pool"]
    assert [(r["from"], r["to"], r["metric"]) for r in pool] == [("domino@full", "domino", "tau"),
                                                                   ("domino@full", "domino", "speedup")]
    # without the study run's rows (another store), the runs' own metrics give the same main table
    fallback = analysis.rebuild_tables(runs, "smoke", f"sqlite:///{tmp_path / 'no-store.db'}")
    assert fallback["main"]["markdown"] + "\n" == written["main"]
    assert "@full" not in fallback["ablations"]["markdown"]  # the exact head's rows need the raw rows
    hist = analysis.tau_histograms(uri, "smoke")
    assert {"domino", "domino@full"} <= set(hist["variant"])  # the exact head's rounds are not Domino's pooled ones

    text, _ = _execute(uri, tmp_path, monkeypatch)
    for markdown in written.values():
        assert markdown.strip() in text

"""The before/after comparison of a study's outputs: timings aside, any changed byte or value is reported."""

from __future__ import annotations

import json

from lit_domino.studies.same_outputs import compare_files, compare_mlflow, main


def _write(root, tau=3.25, seconds=12.0, table="| tau |\n|---|\n| 3.25 |\n", png=b"\x89PNG1"):
    root.mkdir()
    (root / "main.md").write_text(table)
    (root / "fig.png").write_bytes(png)
    (root / "summary.json").write_text(json.dumps({"seconds": seconds, "rows": [{"tau": tau, "stages": {"seconds": 1}}]}))
    (root / "stage_times.json").write_text(json.dumps({"total_seconds": seconds, "machine": {"load": seconds / 10}}))
    return root


def test_two_runs_that_differ_only_in_their_timings_are_the_same(tmp_path, capsys):
    a, b = _write(tmp_path / "a"), _write(tmp_path / "b", seconds=99.5)
    assert compare_files(a, b) == []
    assert main([str(a), str(b)]) == 0 and "4 files: the same" in capsys.readouterr().out


def test_every_changed_value_byte_or_file_is_named(tmp_path, capsys):
    a = _write(tmp_path / "a")
    b = _write(tmp_path / "b", tau=3.2500000000000004, table="| tau |\n|---|\n| 3.26 |\n", png=b"\x89PNG2")
    (b / "extra.json").write_text("{}")
    problems = compare_files(a, b)
    assert problems == ["extra.json: only after", "fig.png: bytes differ", "main.md: bytes differ",
                        "summary.json: .rows[0].tau: 3.25 vs 3.2500000000000004"]
    assert main([str(a), str(b)]) == 1 and "4 difference(s)" in capsys.readouterr().out


def test_study_runs_are_matched_by_experiment_and_name(tmp_path, monkeypatch):
    from lit_domino.runtime.tracking import open_client
    from lit_domino.studies import same_outputs

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = open_client(uri)
    exp = client.create_experiment("ablation-smoke")
    run = client.create_run(exp, run_name="ablation-smoke", tags={"study_role": "study"})
    client.log_param(run.info.run_id, "preset", "smoke")
    client.log_metric(run.info.run_id, "backbone/tau", 3.25)
    client.log_metric(run.info.run_id, "study/seconds", 32.5)  # a timing: never compared
    client.create_run(exp, run_name="backbone-s0", tags={"variant": "backbone", "table": "main"})  # a training's
    tables = client.create_run(client.create_experiment("trees-smoke"), run_name="trees-smoke", tags={"table": "trees"})
    client.log_metric(tables.info.run_id, "domino/tau", 4.5)
    runs = same_outputs.study_runs(uri)
    assert runs == {("ablation-smoke", "ablation-smoke"): {"params": {"preset": "smoke"},
                                                          "metrics": {"backbone/tau": 3.25}},
                    ("trees-smoke", "trees-smoke"): {"params": {}, "metrics": {"domino/tau": 4.5}}}
    assert compare_mlflow(uri, uri) == []
    other = {key: {**run, "metrics": {"backbone/tau": 3.5}} for key, run in runs.items() if key[0] == "ablation-smoke"}
    other[("trees-smoke", "trees-smoke")] = runs[("trees-smoke", "trees-smoke")]
    other[("dloop-smoke", "dloop-smoke")] = {"params": {}, "metrics": {}}
    monkeypatch.setattr(same_outputs, "study_runs", lambda u: runs if u == uri else other)
    assert compare_mlflow(uri, "other") == ["mlflow dloop-smoke/dloop-smoke: only after",
                                            "mlflow ablation-smoke/ablation-smoke: .metrics.backbone/tau: 3.25 vs 3.5"]

"""experiments/bench.py end to end on tiny models: Markdown + JSON in results/, an MLflow run."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: threads only contend


def bench_module():
    spec = importlib.util.spec_from_file_location("bench_cli", ROOT / "experiments" / "bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_cli_on_embedded_benchmarks(tiny_target_dir, tmp_path):
    from mlflow.tracking import MlflowClient

    bench = bench_module()
    out = tmp_path / "results"
    argv = ["--target", str(tiny_target_dir), "--drafters", "bb=random:backbone,slm=random:small_lm",
            "--benchmarks", "embedded-math:2,embedded-chat:1", "--temperatures", "0",
            "--dloop", "off,-0.5:2", "--block-size", "4", "--max-new-tokens", "8",
            "--peers", "prompt_lookup,assisted", "--assistant", "slm", "--out", str(out),
            "--no-progress", "--experiment", "bench-test"]
    rows = bench.main(argv)
    md = list(out.glob("bench-*.md"))
    js = list(out.glob("bench-*.json"))
    assert len(md) == 1 and len(js) == 1
    text = md[0].read_text()
    assert "speedup_vs_hf_generate" in text and "bb+dloop(-0.5:2)" in text
    data = json.loads(js[0].read_text())
    assert {r["benchmark"] for r in data["rows"]} == {"embedded-math:2", "embedded-chat:1"}
    options = vars(bench_module_parse_args(argv))
    assert data["args"] == options  # the flattened CLI options, as every earlier result file holds them
    assert all(r["match_baseline"] == 1.0 for r in rows)  # lossless at T = 0, peers included
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("bench-test")
    run = client.search_runs([exp.experiment_id])[0]
    assert run.info.status == "FINISHED"
    assert any(k.endswith("/speedup") for k in run.data.metrics)
    assert run.data.params == {k: str(v) for k, v in options.items()}  # the same options, as MLflow params


def bench_module_parse_args(argv):
    from lit_domino.studies.bench import parse_args

    return parse_args(argv)


OLD_ARGS = {  # a result file's "args" as the command wrote them before the plan existed (same keys, same values)
    "debug": False, "target": "random", "drafters": "bb=random:backbone, dom=random:domino",
    "benchmarks": "random:1, embedded-math:2", "temperatures": "0, 0.7", "dloop": "off,-0.5:2", "acceptance": "",
    "trees": "off,chain", "block_size": 4, "pool_sizes": "full,16", "max_new_tokens": 4,
    "peers": "prompt_lookup,assisted", "assistant": "small", "prompt_lookup_tokens": 3, "no_hf_baseline": True,
    "repeats": 2, "seed": 5, "threads": 1, "device": "cpu", "static_cache": True, "compile": False,
    "dtype": "bfloat16", "out": "res", "experiment": "bench-x", "no_mlflow": True, "no_progress": True}


def test_the_plan_keeps_the_options_as_the_runs_args():
    """The JSON's ``args`` and the MLflow params are the plan's options: the flattened CLI options, keys and values
    (and order) as before; the plan itself holds them resolved."""
    from lit_domino.decoding import DLoopConfig
    from lit_domino.studies.bench import command_options, parse_args
    from lit_domino.studies.bench_plan import OPTIONS, bench_plan

    argv = ["--target", "random", "--drafters", "bb=random:backbone, dom=random:domino", "--benchmarks",
            "random:1, embedded-math:2", "--temperatures", "0, 0.7", "--dloop", "off,-0.5:2", "--trees", "off,chain",
            "--block-size", "4", "--pool-sizes", "full,16", "--max-new-tokens", "4", "--peers",
            "prompt_lookup,assisted", "--assistant", "small", "--prompt-lookup-tokens", "3", "--no-hf-baseline",
            "--repeats", "2", "--seed", "5", "--threads", "1", "--static-cache", "--dtype", "bfloat16", "--out",
            "res", "--experiment", "bench-x", "--no-mlflow", "--no-progress"]
    plan = bench_plan(vars(parse_args(argv)))
    assert list(plan.args().items()) == list(OLD_ARGS.items())
    assert plan.drafters == (("bb", "random:backbone"), ("dom", "random:domino"))
    assert plan.benchmarks == (("random:1", "random", 1), ("embedded-math:2", "embedded-math", 2))
    assert plan.temperatures == (0.0, 0.7) and plan.pool_sizes == (None, 16) and plan.repeats == 2
    assert plan.dloops == (None, DLoopConfig.parse("-0.5:2")) and plan.trees[0] is None
    assert plan.trees[1].builder == "chain" and plan.hf_peers == ["prompt_lookup", "assisted"]
    assert (plan.hf_baseline, plan.mlflow, plan.progress, plan.static_cache) == (False, False, False, True)
    assert set(OPTIONS) == set(vars(parse_args([]))) - {"debug"}  # the plan reads every flag of the command
    # a dict that leaves options out takes the command's defaults (kept after the given ones, in its args)
    given = command_options({"target": "random", "benchmarks": "random:1"})
    assert list(given)[:2] == ["target", "benchmarks"] and given == {**vars(parse_args([])), **given}
    with pytest.raises(TypeError, match="missing .*dloop"):
        bench_plan({"target": "random"})


def test_bench_cli_errors(capsys):
    from lit_domino.studies.bench import load_drafters
    from lit_domino.runtime.command import UsageError

    bench = bench_module()
    with pytest.raises(UsageError, match="name=path"):
        load_drafters("oops", None, "cpu")
    with pytest.raises(SystemExit) as done:  # one line, rc 2 (tests/test_commands.py has the rest)
        bench.main(["--target", "random", "--dloop", "0.5:2", "--benchmarks", "random:1", "--no-mlflow"])
    assert done.value.code == 2 and "never positive" in capsys.readouterr().err


def test_bench_refuses_a_predictor_gate_without_a_predictor(capsys):
    bench = bench_module()
    with pytest.raises(SystemExit) as done:
        bench.main(["--target", "random", "--drafters", "bb=random:backbone", "--dloop", "off,conf@0.5:2",
                    "--benchmarks", "random:1", "--max-new-tokens", "4", "--no-mlflow", "--no-hf-baseline"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "--dloop conf@0.5:2 (drafter bb)" in err and "no confidence head" in err


def test_bench_pool_sizes_option():
    from lit_domino.studies.bench_plan import parse_pool_sizes

    from lit_domino.runtime.command import UsageError

    assert parse_pool_sizes("full,16, 64") == [None, 16, 64]
    with pytest.raises(UsageError, match="pool-sizes"):
        parse_pool_sizes("16,lots")


def test_bench_compile_without_a_cpp_compiler_is_refused(monkeypatch, capsys):
    monkeypatch.setenv("CXX", "no-such-c++-compiler")
    bench = bench_module()
    with pytest.raises(SystemExit) as done:
        bench.main(["--target", "random", "--compile", "--benchmarks", "random:1", "--no-mlflow"])
    assert done.value.code == 2
    assert "--compile: compile=True on a CPU needs a C++ compiler" in capsys.readouterr().err


def saved_predictor(directory: Path, key: str | None = None) -> Path:
    """A GRU-state acceptance predictor for ``dom=random:domino`` on ``--target random``, saved as the acceptance
    study's artifact lays it out (``<dir>/predictor``); ``key``: another drafter's key instead."""
    import torch

    from lit_domino.decoding.acceptance import AcceptanceHead, AcceptancePredictor, Calibration, drafter_key
    from lit_domino.studies.bench import load_drafters, load_target_spec

    target = load_target_spec("random", "cpu", "float32")
    d = load_drafters("dom=random:domino", target, "cpu")[0]["dom"]
    head = AcceptanceHead(d.config.hidden_size, d.causal_state_size, "gru")
    with torch.no_grad():
        torch.nn.init.normal_(head.proj.weight, std=0.3)
    AcceptancePredictor(key or drafter_key(d), head, Calibration([1.0] * 8, [0.6] * 8)).save(directory / "predictor")
    return directory


def test_bench_takes_a_trained_predictor_per_drafter(tmp_path, capsys):
    from lit_domino.decoding import acceptance
    from lit_domino.studies.bench_plan import PREDICTOR_FILE

    assert PREDICTOR_FILE == acceptance.PREDICTOR_FILE  # the torch-free check looks for the file the predictor saves
    bench = bench_module()
    art = saved_predictor(tmp_path / "art")
    common = ["--target", "random", "--drafters", "dom=random:domino", "--benchmarks", "random:1",
              "--max-new-tokens", "8", "--no-mlflow", "--no-hf-baseline", "--no-progress", "--out", str(tmp_path)]
    rows = bench.main(common + ["--dloop", "off,conf@0.5:2,trunc@0.5", "--acceptance", f"dom={art}"])
    methods = {r["method"] for r in rows}
    assert {"dom+dloop(conf@0.5:2)", "dom+dloop(trunc@0.5)"} <= methods, methods
    assert all(r["match_baseline"] == 1.0 for r in rows)  # lossless at T = 0 under the predictor gates
    for argv, needle in [
            (["--acceptance", f"other={art}"], "--acceptance other: no drafter of that name in --drafters (dom)"),
            (["--acceptance", f"dom={tmp_path / 'none'}"], "no acceptance predictor there"),
            (["--acceptance", "dom"], "expected name=DIR"),
            (["--acceptance", f"dom={saved_predictor(tmp_path / 'stale', key='0' * 16)}"],
             "--acceptance dom: this acceptance predictor was built for another drafter")]:
        with pytest.raises(SystemExit) as done:
            bench.main(common + ["--dloop", "conf@0.5:2"] + argv)
        assert done.value.code == 2 and needle in capsys.readouterr().err, argv


def test_bench_keys_a_predictor_to_the_drafter_cast_to_the_targets_dtype(tmp_path):
    """``--acceptance``: the predictor is checked on the drafter as trained (its key), then keyed by the drafter cast
    to the target's dtype, the one ``generate`` checks it against; the artifact's own key is refused there."""
    import torch

    from lit_domino.decoding import DLoopConfig, generate
    from lit_domino.decoding.acceptance import NoAcceptancePredictor, check_predictor, drafter_key, load_predictor
    from lit_domino.studies.bench import load_drafters, load_target_spec

    art = saved_predictor(tmp_path / "art")
    target = load_target_spec("random", "cpu", "float32")
    target.model.to(torch.bfloat16)
    drafters, predictors = load_drafters("dom=random:domino", target, "cpu", f"dom={art}")
    d, pred = drafters["dom"], predictors["dom"]
    saved = load_predictor(art / "predictor")
    assert next(d.parameters()).dtype == torch.bfloat16 and pred.drafter_key == drafter_key(d) != saved.drafter_key
    assert pred.head is saved.head or torch.equal(pred.head.proj.weight, saved.head.proj.weight)
    with pytest.raises(NoAcceptancePredictor, match="built for another drafter"):
        check_predictor(d, saved)
    res = generate(target, d, torch.tensor([[5, 6, 7]]), max_new_tokens=6, dloop=DLoopConfig.parse("conf@0.5:2"),
                   predictor=pred)
    assert len(res.tokens) == 6


def test_bench_cli_trees(tiny_target_dir, tmp_path):
    """``--trees``: each drafter decodes with every tree its builders cover (rows ``+tree(label)``), lossless at
    T = 0; a tree no drafter builds and a malformed spec are usage errors."""
    from lit_domino.runtime.command import UsageError
    from lit_domino.studies.bench import parse_args, run_bench
    from lit_domino.studies.bench_plan import bench_plan

    bench = bench_module()
    rows = bench.main(["--target", str(tiny_target_dir), "--drafters", "bb=random:backbone,ea=random:eagle3",
                       "--benchmarks", "embedded-math:1", "--trees", "off,ddtree:8k2,eagle:8k2+drawn+multidraft",
                       "--block-size", "4", "--max-new-tokens", "8", "--out", str(tmp_path), "--no-progress",
                       "--no-mlflow", "--no-hf-baseline"])
    methods = {r["method"] for r in rows}
    assert {"bb", "ea", "bb+tree(ddtree:8k2)", "ea+tree(eagle:8k2+drawn+multidraft)"} <= methods
    assert not any("bb+tree(eagle" in m or "ea+tree(ddtree" in m for m in methods)
    assert all(r["match_baseline"] == 1.0 for r in rows)
    base = dict(target=str(tiny_target_dir), drafters="bb=random:backbone", benchmarks="random:1",
                out=str(tmp_path), no_mlflow=True)
    args = vars(parse_args([]))
    for trees, match in (("eagle:8k2", "no drafter in --drafters builds a 'eagle' tree"),
                         ("ddtree:x", "--trees: .*expected builder")):
        with pytest.raises(UsageError, match=match):
            run_bench({**args, **base, "trees": trees})
    with pytest.raises(UsageError, match="no drafter in --drafters builds a 'eagle' tree"):
        run_bench(bench_plan({**args, **base, "trees": "eagle:8k2"}))  # a plan: the same check, once the drafters load

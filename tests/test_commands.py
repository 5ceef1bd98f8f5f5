"""Every command answers bad input with one line ``prog: error: ...`` and exit status 2, before any model is
loaded or artifact built (issue 34, items 1, 6 and 8): in-process, with the model loaders replaced by ones that
fail the test; one subprocess run times a real argument error and checks that torch was never imported."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import pkgutil
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lit_domino.runtime.command import UsageError

ROOT = Path(__file__).resolve().parents[1]


def command(path: str):
    """A command file (``experiments/bench.py``) as a module; its ``main(argv)`` is the command."""
    spec = importlib.util.spec_from_file_location(f"cmd_{Path(path).stem}", ROOT / path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def refuses(main, argv, capsys, prog: str, *needles: str) -> str:
    """``main(argv)`` exits with status 2 and one stderr line ``prog: error: ...`` holding every needle."""
    try:
        rc = main(argv)
    except SystemExit as done:
        rc = done.code
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, lines
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), lines
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@functools.cache
def import_whole_package() -> None:
    import lit_domino

    for module in pkgutil.walk_packages(lit_domino.__path__, "lit_domino."):
        importlib.import_module(module.name)


@pytest.fixture(autouse=True)
def no_models(monkeypatch):
    """Loading a target or drafter, or building the embedded target, fails the test: bad input must be
    answered before any of them.

    Every module of the package is imported first: one that a command imports for the first time while these
    patches are on would keep the failing stand-in under its own name (``from ... import load_target``) for the
    rest of the process, and fail an unrelated test that runs later in the same worker."""
    import_whole_package()
    import lit_domino.interop
    import lit_domino.models.io
    import lit_domino.target.load
    import lit_domino.target.recipe

    def loaded(*args, **kwargs):
        raise AssertionError(f"a model was loaded or built before the bad input was refused: {args}")

    monkeypatch.setattr(lit_domino.target.load, "load_target", loaded)
    monkeypatch.setattr(lit_domino.interop, "load_drafter", loaded)
    monkeypatch.setattr(lit_domino.models.io, "load_saved", loaded)
    monkeypatch.setattr(lit_domino.target.recipe, "build_tiny_target", loaded)
    monkeypatch.setattr(lit_domino.target.recipe, "train_model", loaded)


def closed_port() -> int:
    """A local port nothing listens on (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drafter_dir(path: Path, cfg: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


# --------------------------------------------------------------------------- bench.py


@pytest.mark.parametrize("argv, needles", [
    (["--drafters", "x=/nonexistent"], ["--drafters x", "'/nonexistent' does not exist"]),
    (["--pool-sizes", "0"], ["--pool-sizes", "at least 1"]),
    (["--pool-sizes", "16,lots"], ["--pool-sizes", "'lots'"]),
    (["--peers", "nosuch"], ["'nosuch'", "prompt_lookup, assisted, dflash"]),
    (["--peers", "assisted"], ["--assistant"]),
    (["--drafters", "oops"], ["name=path"]),
    (["--drafters", "a=random:backbone,a=random:domino"], ["more than once"]),
    (["--target", "/no/such/target"], ["--target", "does not exist"]),
    (["--repeats", "0"], ["--repeats must be >= 1"]),
    (["--temperatures", "-1"], ["--temperatures"]),
    (["--dtype", "float8"], ["--dtype"]),
    (["--max-new-tokens", "abc"], ["--max-new-tokens", "invalid int"]),
    (["--benchmarks", " , "], ["--benchmarks is empty"]),
    (["--benchmarks", "random:0"], ["--benchmarks: random:N takes a prompt count N >= 1"]),
])
def test_bench_refuses_bad_input_before_the_target(argv, needles, capsys):
    refuses(command("experiments/bench.py").main, argv, capsys, "bench.py", *needles)


def test_bench_refuses_a_model_directory_as_a_drafter(tmp_path, capsys):
    target = drafter_dir(tmp_path / "qwen", {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"})
    refuses(command("experiments/bench.py").main, ["--drafters", f"d={target}"], capsys, "bench.py",
            "is a model directory (Qwen3ForCausalLM), not a drafter")
    run = tmp_path / "run"
    drafter_dir(run / "drafter", {"kind": "backbone"})
    refuses(command("experiments/bench.py").main, ["--drafters", f"d={run}"], capsys, "bench.py",
            "training run directory", str(run / "drafter"))


@pytest.mark.parametrize("argv, needles", [
    (["--target", "random", "--dloop", "0.5:2"], ["--dloop", "never positive"]),
    (["--target", "random", "--dloop", "sum@x"], ["--dloop", "cannot parse DLoop spec"]),
    (["--target", "random", "--dloop", "conf@1.5:3"], ["--dloop", "in (0, 1]"]),
    (["--target", "random", "--dloop", "cost@0.5:3"], ["--dloop", "no threshold"]),
    (["--target", "random", "--drafters", "d=random:nosuch"], ["unknown drafter kind", "backbone"]),
    (["--target", "random", "--benchmarks", "nosuch:3"], ["--benchmarks", "unknown benchmark 'nosuch'"]),
])
def test_bench_library_checks_come_before_the_target(argv, needles, capsys, monkeypatch):
    monkeypatch.setattr("lit_domino.testing.random_target", lambda *a, **k: pytest.fail("target built"))
    refuses(command("experiments/bench.py").main, argv, capsys, "bench.py", *needles)


def test_debug_keeps_the_traceback():
    with pytest.raises(UsageError, match="prompt_lookup, assisted, dflash"):
        command("experiments/bench.py").main(["--peers", "nosuch", "--debug"])


# --------------------------------------------------------------------------- export.py


def test_export_refuses_bad_sources_and_outputs(tmp_path, capsys):
    main = command("experiments/export.py").main
    refuses(main, [str(tmp_path / "missing"), str(tmp_path / "out"), "--format", "dflash"], capsys, "export.py",
            "does not exist")
    target = drafter_dir(tmp_path / "target", {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"})
    refuses(main, [str(target), str(tmp_path / "out"), "--format", "dflash"], capsys, "export.py",
            "is a model directory", "not a drafter")
    slm = drafter_dir(tmp_path / "slm", {"kind": "small_lm"})
    refuses(main, [str(slm), str(tmp_path / "out"), "--format", "dflash", "--target", "embedded:default"], capsys,
            "export.py", "'small_lm' drafter cannot be written as 'dflash'")
    refuses(main, [str(tmp_path), str(tmp_path / "out"), "--format", "dflash"], capsys, "export.py",
            "not a drafter directory")
    refuses(main, [str(slm), str(tmp_path / "out"), "--format", "yaml"], capsys, "export.py", "invalid choice")


def test_export_never_overwrites_its_source(tmp_path, capsys):
    main = command("experiments/export.py").main
    src = drafter_dir(tmp_path / "domino", {"kind": "domino"})
    before = (src / "config.json").read_text()
    refuses(main, [str(src), str(src), "--format", "specforge-domino"], capsys, "export.py",
            "is the source drafter directory", "would overwrite")
    refuses(main, [str(src), str(src / "export"), "--format", "specforge-domino"], capsys, "export.py",
            "inside the source drafter directory")
    run = tmp_path / "run"
    drafter_dir(run / "drafter", {"kind": "domino"})
    refuses(main, [str(run), str(run / "drafter"), "--format", "specforge-domino"], capsys, "export.py",
            "is the source drafter directory")
    assert (src / "config.json").read_text() == before and not (src / "export").exists()


# --------------------------------------------------------------------------- regenerate.py


@pytest.mark.parametrize("argv, needles", [
    (["--shard", "3/2"], ["--shard 3/2", "0 <= i < N"]),
    (["--shard", "x"], ["--shard must be i/N"]),
    (["--shard", "0/4", "--merge"], ["--shard and --merge do not go together"]),
    (["--splits", "test"], ["--splits"]),
    (["--variant", "nosuch"], ["unknown variant 'nosuch'"]),
    (["--concurrency", "0"], ["--concurrency must be >= 1"]),
    (["--server-extra", "[1]", "--server", "http://127.0.0.1:1"], ["--server-extra must be a JSON object"]),
])
def test_regenerate_refuses_bad_input_at_once(argv, needles, capsys):
    refuses(command("experiments/regenerate.py").main, ["--preset", "smoke", *argv], capsys, "regenerate.py", *needles)


def test_regenerate_checks_the_server_before_any_work(capsys):
    url = f"http://127.0.0.1:{closed_port()}"
    t0 = time.monotonic()
    refuses(command("experiments/regenerate.py").main, ["--preset", "smoke", "--server", url], capsys,
            "regenerate.py", url, "did not answer")
    assert time.monotonic() - t0 < 10  # one attempt, no retries with backoff


def test_regenerate_merge_without_chunks_trains_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LIT_DOMINO_CACHE", str(tmp_path))
    main = command("experiments/regenerate.py").main
    refuses(main, ["--preset", "smoke", "--merge"], capsys, "regenerate.py", "nothing to merge",
            "no regenerated chunk of the train split")
    for split in ("train", "eval"):  # chunks of some other config: the target decides, and it was never built
        (tmp_path / "regen" / f"{split}-0123" / "shard_00000").mkdir(parents=True)
    refuses(main, ["--preset", "smoke", "--merge"], capsys, "regenerate.py",
            "the target embedded:smoke is not built yet")


def test_regenerate_merge_names_the_missing_chunks(tiny_target_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LIT_DOMINO_CACHE", str(tmp_path))
    for split in ("train", "eval"):
        (tmp_path / "regen" / f"{split}-0123" / "shard_00000").mkdir(parents=True)
    argv = ["--preset", "smoke", "--set", f"data.target={tiny_target_dir}", "--set",
            "data.train_examples={math: 3}", "--merge"]
    refuses(command("experiments/regenerate.py").main, argv, capsys, "regenerate.py",
            "cannot merge the train split", "chunk(s) are not regenerated yet (chunks 0", "--shard i/N workers")
    assert not any((tmp_path / "regen").glob("train-*/dataset"))  # nothing merged


# --------------------------------------------------------------------------- serve_bench.py


def test_serve_bench_refuses_bad_input(capsys):
    main = command("experiments/serve_bench.py").main
    url = f"http://127.0.0.1:{closed_port()}"
    refuses(main, ["--url", url], capsys, "serve_bench.py", url, "did not answer")
    refuses(main, ["--url", url, "--concurrency", "0"], capsys, "serve_bench.py", "--concurrency", "positive")
    refuses(main, ["--url", url, "--concurrency", "1,x"], capsys, "serve_bench.py", "--concurrency")
    refuses(main, ["--url", "localhost:8000"], capsys, "serve_bench.py", "http://")
    refuses(main, ["--url", url, "--chat-template-kwargs", "{nope"], capsys, "serve_bench.py", "not valid JSON")
    refuses(main, [], capsys, "serve_bench.py", "--url")


# --------------------------------------------------------------------------- dloop.py


def test_dloop_table_takes_the_suites_gate_specs(monkeypatch):
    import lit_domino.studies.dloop as ds

    seen = {}
    monkeypatch.setattr(ds, "run_dloop_study", lambda preset, **kw: seen.update(kw, preset=preset))
    command("experiments/dloop.py").main(["--table-dloop", "mean@-0.1:3"])
    assert seen["preset"] == "smoke" and seen["table_dloop"] == {"threshold": -0.1, "max_stages": 3, "gate": "mean"}
    command("experiments/dloop.py").main(["--table-dloop", "-0.75"])  # the sum gate, default stages
    assert seen["table_dloop"] == {"threshold": -0.75, "max_stages": 3}
    plan = ds.study_plan("smoke", table_dloop=seen["table_dloop"] | {"gate": "last"})
    assert ds.DLoopConfig(threshold=-0.75, max_stages=3, gate="last") in ds.dloop_settings(plan)


@pytest.mark.parametrize("argv, needles", [
    (["--table-dloop", "x"], ["cannot parse DLoop spec 'x'", "mean@-0.1:3"]),
    (["--table-dloop", "nosuch@-0.5:3"], ["gate must be one of"]),
    (["--table-dloop", "-0.5:1"], ["max_stages >= 2"]),
    (["--stages", "0"], [">= 1"]),
    (["--preset", "huge"], ["unknown preset 'huge'"]),
])
def test_dloop_refuses_bad_input_before_training(argv, needles, capsys, monkeypatch):
    import lit_domino.studies.dloop as ds

    monkeypatch.setattr(ds, "run_dloop_study", lambda *a, **k: pytest.fail("the study ran"))
    refuses(command("experiments/dloop.py").main, argv, capsys, "dloop.py", *needles)


# --------------------------------------------------------------------------- the other commands


def test_head_cost_memory_bench_parity_refuse_bad_input(tmp_path, capsys):
    head_cost = command("experiments/head_cost.py").main
    refuses(head_cost, ["--sizes", "100:4096"], capsys, "head_cost.py", "multiple of 16")
    refuses(head_cost, ["--sizes", "abc"], capsys, "head_cost.py", "'d:V'")
    refuses(head_cost, ["--pool-sizes", "0"], capsys, "head_cost.py", "--pool-sizes")
    refuses(head_cost, ["--sizes", "32:256", "--pool-sizes", "300"], capsys, "head_cost.py", "300", "1..256")
    refuses(head_cost, ["--accept", "9"], capsys, "head_cost.py", "accept")
    refuses(head_cost, ["--heads", "domino,medusa"], capsys, "head_cost.py", "unknown head 'medusa'")
    memory_bench = command("experiments/memory_bench.py").main
    refuses(memory_bench, ["--paths", "foo"], capsys, "memory_bench.py", "--paths")
    refuses(memory_bench, ["--methods", "nosuch"], capsys, "memory_bench.py", "'nosuch'", "backbone")
    refuses(memory_bench, ["--hidden", "6"], capsys, "memory_bench.py", "--hidden")
    parity = command("experiments/parity.py").main
    refuses(parity, ["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")], capsys, "parity.py",
            "a.json", "does not exist")
    (tmp_path / "bad.json").write_text("{")
    refuses(parity, ["compare", str(tmp_path / "bad.json"), str(tmp_path / "bad.json")], capsys, "parity.py",
            "not readable JSON")
    refuses(parity, ["capture", str(tmp_path / "no" / "dir" / "x.json")], capsys, "parity.py", "does not exist")


def test_sweep_refuses_bad_input_before_optuna(capsys):
    main = command("sweeps/domino.py").main
    refuses(main, ["run", "--workers", "0"], capsys, "sweeps/domino.py", "--workers must be >= 1")
    refuses(main, ["run", "--preset", "nosuch"], capsys, "sweeps/domino.py", "unknown preset 'nosuch'")
    refuses(main, ["run", "--space", "/no/space.yaml"], capsys, "sweeps/domino.py", "does not exist")
    refuses(main, ["run", "--objective", "nosuch", "--preset", "smoke"], capsys, "sweeps/domino.py", "objective")


# --------------------------------------------------------------------------- a real process


REAL_ERRORS = [  # (command, argv, the start of its one line)
    ("bench.py", ["--drafters", "x=/nonexistent", "--peers", "prompt_lookup"],
     "bench.py: error: --drafters x: '/nonexistent' does not exist"),
    ("bench.py", ["--target", "random", "--dloop", "0.5:2"],
     "bench.py: error: --dloop: DLoopConfig.threshold=0.5 is positive"),
    ("dloop.py", ["--table-dloop", "x"], "dloop.py: error: cannot parse DLoop spec 'x'"),
    ("trees.py", ["--budgets", "16,0"], "trees.py: error: --budgets: a tree budget is at least 1 node per round"),
    ("export.py", ["slm", "out", "--format", "dflash", "--target", "embedded:default"],
     "export.py: error: a 'small_lm' drafter cannot be written as 'dflash'"),
    ("memory_bench.py", ["--methods", "nosuch"], "memory_bench.py: error: --methods: unknown method(s) 'nosuch'"),
    # model keys and their types read from the modules' source (configs.static_module): no Lightning import
    ("ablation.py", ["--set", "model.rnak=8"],
     "ablation: error: model.rnak: no variant of this run takes it (eagle3, small_lm, backbone, domino"),
    ("ablation.py", ["--set", "model.lr=abc"], "ablation: error: variant eagle3: model.lr: expected a float, got 'abc'"),
    ("train.py", ["fit", "--variant", "domino", "--set", "model.rnak=8"],
     "train: error: unknown config key model.rnak; did you mean model.head.rank?"),
]


@pytest.mark.parametrize("script, argv, line", REAL_ERRORS, ids=[f"{c[0]} {c[1][-1]}" for c in REAL_ERRORS])
def test_a_real_argument_error_is_fast_and_imports_no_torch(script, argv, line, tmp_path):
    """The command as a user runs it: one line, rc 2, well under 2 s, and torch never imported (-X importtime
    lists the modules the process imported by import statements; importlib.import_module, which the lazy
    packages use, is not listed, but torch's own imports are)."""
    drafter_dir(tmp_path / "slm", {"kind": "small_lm"})  # export.py's source
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LIT_DOMINO_CACHE", "MLFLOW_TRACKING_URI")}
    t0 = time.monotonic()
    try:  # a regression would build the default target (minutes): the timeout fails the test instead
        proc = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "experiments" / script), *argv],
                              capture_output=True, text=True, cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT)},
                              timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{script} did not answer {argv} within 60 s")
    seconds = time.monotonic() - t0
    lines = proc.stderr.strip().splitlines()
    imported = {entry.split("|")[-1].strip() for entry in lines if entry.startswith("import time:")}
    errors = [entry for entry in lines if not entry.startswith("import time:")]
    assert proc.returncode == 2 and len(errors) == 1 and errors[0].startswith(line), errors
    assert "lit_domino.runtime.command" in imported and not {"torch", "transformers", "lightning"} & imported
    assert seconds < 2.0, seconds


# --------------------------------------------------------------------------- acceptance.py


def test_acceptance_runs_the_plan_it_checked(monkeypatch):
    import lit_domino.studies.acceptance as study

    seen = {}
    monkeypatch.setattr(study, "run_acceptance_study", lambda plan, **kw: seen.update(kw, plan=plan))
    command("experiments/acceptance.py").main(["--drafters", "domino,eagle3", "--label", "soft", "--no-mlflow"])
    plan = seen["plan"]
    assert plan.preset == "smoke" and plan.drafters == ("domino",) and plan.label == "soft"
    assert list(plan.skipped) == ["eagle3"] and seen["mlflow_enabled"] is False  # eagle3: noted, never trained
    command("experiments/acceptance.py").main([])
    assert seen["plan"].drafters == ("backbone", "domino", "dspark", "dflash2")  # the study file's


@pytest.mark.parametrize("argv, needles", [
    (["--preset", "huge"], ["--preset", "unknown preset 'huge'"]),
    (["--preset", "rehearsal"], ["acceptance.yaml", "no plan for preset 'rehearsal'"]),
    (["--drafters", "backbone,nosuch"], ["--drafters", "nosuch"]),
    (["--drafters", " , "], ["--drafters", "none given"]),
    (["--drafters", "eagle3,small_lm"], ["none keeps block hidden states"]),
    (["--label", "fuzzy"], ["--label", "invalid choice"]),
])
def test_acceptance_refuses_bad_input(argv, needles, capsys, monkeypatch):
    import lit_domino.studies.acceptance as study

    monkeypatch.setattr(study, "run_acceptance_study", lambda *a, **k: pytest.fail("the study ran"))
    refuses(command("experiments/acceptance.py").main, argv, capsys, "acceptance.py", *needles)

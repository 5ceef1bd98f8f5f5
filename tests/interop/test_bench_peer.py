"""experiments/bench.py with ``--peers dflash``: the official loop's row next to ours, on a drafter exported
to (and read back from) the DFlash layout."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from lit_domino.interop import export_drafter
from lit_domino.models import build_drafter, drafter_config
from lit_domino.target.load import load_target

ROOT = Path(__file__).resolve().parents[2]


def bench_module():
    spec = importlib.util.spec_from_file_location("bench_cli_interop", ROOT / "experiments" / "bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_dflash_peer_row(tiny_target_dir, tmp_path, one_thread):
    target = load_target(tiny_target_dir)
    torch.manual_seed(0)
    drafter = build_drafter(drafter_config("backbone", target, block_size=4), target)
    exported = export_drafter(drafter, tmp_path / "bb-dflash", format="dflash")
    rows = bench_module().main(["--target", str(tiny_target_dir), "--drafters", f"bb={exported}",
                                "--benchmarks", "random:2", "--max-new-tokens", "10", "--peers", "dflash",
                                "--no-hf-baseline", "--no-mlflow", "--no-progress", "--out", str(tmp_path / "res")])
    by = {r["method"]: r for r in rows}
    assert set(by) == {"ar", "bb", "bb@dflash_generate"}
    peer, ours = by["bb@dflash_generate"], by["bb"]
    assert peer["kind"] == "peer" and peer["match_baseline"] == 1.0 and ours["match_baseline"] == 1.0
    # the official loop decodes the same drafter losslessly at T = 0: the same acceptances, its own timing
    assert peer["tau"] == pytest.approx(ours["tau"])
    assert peer["speedup"] == pytest.approx(by["ar"]["tpot_ms"] / peer["tpot_ms"])
    data = json.loads(next((tmp_path / "res").glob("bench-*.json")).read_text())
    assert any(r["method"] == "bb@dflash_generate" for r in data["rows"])


def test_dflash_peer_needs_a_backbone(tiny_target_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_module().main(["--target", str(tiny_target_dir), "--drafters", "d=random:domino", "--benchmarks",
                             "random:1", "--peers", "dflash", "--no-mlflow", "--out", str(tmp_path)])
    assert exit_.value.code == 2 and "--peers dflash decodes a backbone" in capsys.readouterr().err

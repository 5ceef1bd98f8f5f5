"""experiments/gpu/decode_check.py: fails clearly without CUDA, and its dry run (``--device cpu``) goes through
every step of the GPU check on the CPU, so the first GPU run is not spent finding the script's own bugs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from lit_domino.decoding.engine import cpp_compiler

ROOT = Path(__file__).resolve().parents[2]


def decode_check():
    spec = importlib.util.spec_from_file_location("decode_check", ROOT / "experiments" / "gpu" / "decode_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_decode_check_needs_cuda():
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        decode_check().main(["--prompts", "1"])


def test_draft_ratios_average_each_domino_row_over_the_backbone():
    rows = [{"benchmark": b, "method": m, "drafter": d, "draft_ms_per_round": ms}
            for b, scale in (("math", 1.0), ("code", 2.0))
            for m, d, ms in (("ar", None, 0.0), ("backbone", "backbone", 1.0 * scale), ("domino", "domino", 1.5 * scale),
                             ("domino+pool(64)", "domino", 1.2 * scale if b == "math" else 2.8))]
    assert decode_check().draft_ratios(rows) == pytest.approx({"domino": 1.5, "domino+pool(64)": 1.3})


@pytest.mark.slow
@pytest.mark.skipif(cpp_compiler() is None, reason="inductor needs a C++ compiler on a CPU")
def test_decode_check_dry_run_on_cpu(tmp_path):
    """The smoke preset's target (shared with the rest of the suite) and one-epoch drafters, eager and compiled
    (inductor on the CPU), the official loop on the same backbone, and the JSON report."""
    report = decode_check().main(["--device", "cpu", "--prompts", "1", "--max-new-tokens", "12",
                                  "--pool-sizes", "full", "--out", str(tmp_path)])
    assert report["device"] == "cpu (dry run)" and report["lossless"]
    methods = {(r["benchmark"], r["method"]) for r in report["rows"]}
    assert methods == {(f"embedded-{d}", m) for d in ("math", "code", "chat") for m in ("ar", "backbone", "domino")}
    assert all(r["compiled_over_eager"] > 0 and r["match_baseline"] == 1.0 for r in report["rows"])
    assert set(report["draft_ratios"]) == {"eager", "compiled"} and report["draft_ratios"]["eager"]["domino"] > 0
    official = report["official_loop"]
    if importlib.util.find_spec("dflash") is None:  # requirements-peers.txt; without it the check says so
        assert "dflash is not importable" in official["skipped"]
    else:
        assert official["lossless"] and set(official["ours_over_official"]) == {"embedded-math", "embedded-code",
                                                                                 "embedded-chat"}
    assert len(list(tmp_path.glob("decode-check-*.json"))) == 1

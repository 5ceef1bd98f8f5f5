"""experiments/gpu/decode_check.py: fails clearly without CUDA; its dry run (``--device cpu``) runs inside the GPU
check's (``experiments/gpu/check.py --device cpu``, tests/test_rehearsal.py), so the first GPU run is not spent
finding the script's own bugs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch


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


# The dry run on the CPU (--device cpu) is part of experiments/gpu/check.py's dry run: tests/test_rehearsal.py.

"""experiments/gpu/decode_check.py: fails clearly without CUDA (the check itself runs on a GPU machine)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_decode_check_needs_cuda():
    spec = importlib.util.spec_from_file_location("decode_check", ROOT / "experiments" / "gpu" / "decode_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        mod.main(["--prompts", "1"])

"""The MLflow comparison in a real browser: ``tests/studies/browser/check_mlflow_ui.py`` on the smoke ablation the session
already ran (the ``smoke_ablation`` fixture), headless Debian Chromium. ``.ci/run`` installs the browser and sets
``LIT_DOMINO_REQUIRE_BROWSER=1``, so there a missing browser fails instead of skipping."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

CHECK = Path(__file__).parent / "browser" / "check_mlflow_ui.py"


def _check_module():
    spec = importlib.util.spec_from_file_location("check_mlflow_ui", CHECK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.browser
def test_the_readme_comparison_steps_in_a_browser(smoke_ablation, tmp_path):
    check = _check_module()
    missing = [what for what, ok in (("chromium", check.CHROMIUM.exists()),
                                     ("playwright", importlib.util.find_spec("playwright") is not None)) if not ok]
    if missing:
        if os.environ.get("LIT_DOMINO_REQUIRE_BROWSER"):
            pytest.fail(f"{', '.join(missing)} missing (apt-get install -y chromium; pip install -e '.[dev]')")
        pytest.skip(f"{', '.join(missing)} not installed")
    out = Path(os.environ.get("LIT_DOMINO_SCREENSHOTS") or tmp_path)
    with check.mlflow_ui(os.environ["MLFLOW_TRACKING_URI"]) as url:
        seen = check.check(url, "ablation-smoke", out, ("domino-smoke-s0", "backbone-smoke-s0"))
    assert [p.name for p in seen.screenshots] == ["1-runs.png", "2-study-runs.png", "3-compare.png", "4-plot.png"]
    assert all(p.stat().st_size > 10_000 for p in seen.screenshots)  # a page, not a blank

"""The "compare ablations" steps of docs/mlflow.md, driven in a real browser: ``mlflow ui`` on an ablation's store, headless
Chromium (Debian's ``chromium`` package through Playwright's Python API; nothing is downloaded), one screenshot per
step.

    python tests/studies/browser/check_mlflow_ui.py                       # runs the smoke ablation into a temporary store
    python tests/studies/browser/check_mlflow_ui.py --store sqlite:///mlflow.db --preset default --out docs/screenshots

Steps (each asserts what it must show, else the check fails naming the step):

1. the experiment list → **Model training** (MLflow 3.17 opens in its GenAI mode) → experiment ``ablation-<preset>``:
   its Runs page, the study run at the top level;
2. **Views → τ and speedup**, the study run expanded: the training runs nested under it, the columns ``tau`` and
   ``speedup`` with numbers;
3. two runs selected (Domino and backbone-only) → **Compare**, the parallel-coordinates plot set to
   ``tracking.variant`` and the metrics ``tau``, ``speedup``;
4. the study run → **Artifacts** → ``plots/study-tau-speedup.png``: the image shown.

``tests/studies/test_browser.py`` runs it on the smoke ablation the test session already made.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

CHROMIUM = Path(os.environ.get("LIT_DOMINO_CHROMIUM", "/usr/bin/chromium"))
"""The browser: Debian's ``chromium`` package (``apt-get install -y chromium``), never one Playwright downloads."""
STUDY_PLOT = "plots/study-tau-speedup.png"
VIEWPORT = {"width": 1600, "height": 1000}
TIMEOUT_MS = 20_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def mlflow_ui(store: str, timeout: float = 90.0) -> Iterator[str]:
    """``mlflow ui`` on ``store`` at a free port (its job runner off: nothing here needs it); yields its URL and
    stops the server and its workers (one process group) after."""
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", store, "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"mlflow ui did not start on {store}:\n{log.read().decode()[-3000:]}")
                time.sleep(0.3)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@dataclass
class Seen:
    """What the browser showed, step by step (for the report and the test's asserts)."""

    screenshots: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        self.notes.append(text)
        print(f"[browser] {text}", flush=True)


def _expect(condition: bool, step: str, what: str) -> None:
    if not condition:
        raise AssertionError(f"{step}: {what}")


def check(url: str, experiment: str, out_dir: Path, runs: tuple[str, str]) -> Seen:
    """Drive docs/mlflow.md's steps on the UI at ``url``; ``runs``: the two run names to compare. Screenshots go to
    ``out_dir`` (``1-runs.png`` ... ``4-plot.png``)."""
    from playwright.sync_api import sync_playwright

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    seen = Seen()
    if not CHROMIUM.exists():
        raise FileNotFoundError(f"{CHROMIUM} is missing: apt-get install -y chromium (or set LIT_DOMINO_CHROMIUM)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])  # root in CI
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(TIMEOUT_MS)

            def shot(name: str) -> None:
                page.wait_for_timeout(500)  # the grid's last repaint
                path = out_dir / name
                page.screenshot(path=str(path))
                seen.screenshots.append(path)

            # 1. the experiment, in model-training mode
            step = "1 experiment"
            page.goto(url + "/#/experiments")
            page.get_by_role("link", name=experiment, exact=True).first.wait_for()
            page.get_by_text("Model training", exact=True).first.click()
            page.get_by_role("link", name=experiment, exact=True).first.click()
            page.wait_for_url("**/runs**")
            _hide_assistant(page)
            study = page.get_by_role("row").filter(has_text=experiment)
            study.first.wait_for()
            _expect("workflowType=machine_learning" in page.url, step, f"not in model-training mode: {page.url}")
            _expect(page.get_by_text("Evaluation runs", exact=True).count() == 0, step, "the GenAI pages are shown")
            seen.note(f"{step}: Runs page of {experiment} ({page.url.split('?')[0].split('#')[1]})")
            shot("1-runs.png")

            # 2. the study's runs with τ and speedup
            step = "2 study runs"
            page.get_by_role("button", name="Views").first.click()
            page.get_by_text("τ and speedup", exact=True).first.click()
            page.get_by_role("columnheader", name="tau", exact=True).first.wait_for()
            study.first.locator("[col-id='attributes.`Run Name`'] button").first.click()  # expand the study run
            for name in runs:
                page.get_by_role("row").filter(has_text=name).first.wait_for()
            headers = list(dict.fromkeys(h.strip() for h in page.get_by_role("columnheader").all_inner_texts() if h.strip()))
            _expect("tau" in headers and "speedup" in headers, step, f"no tau/speedup column: {headers}")
            tau = _cell(page, runs[0], "metrics.`tau`").inner_text().strip()
            _expect(_number(tau), step, f"{runs[0]} shows no τ: {tau!r}")
            seen.note(f"{step}: columns {headers}; {runs[0]} τ {tau}")
            shot("2-study-runs.png")

            # 3. the compare view of the two
            step = "3 compare"
            for name in runs:
                page.locator(".ag-pinned-left-cols-container [role='row']").filter(has_text=name).first.locator(
                    "input.ag-checkbox-input").first.check()
            page.get_by_role("button", name="Compare", exact=True).first.click()
            page.wait_for_url("**/compare-runs**")
            _hide_assistant(page)
            for name in runs:
                page.get_by_text(name).first.wait_for()
            # the parallel-coordinates plot on the variant, τ and speedup (MLflow's default: the first params and
            # metrics by name)
            page.get_by_role("button", name="Clear All").click()
            pickers = page.locator("input[type=search]")
            for picker, keys in ((0, ("tracking.variant",)), (1, ("tau", "speedup"))):
                for key in keys:
                    pickers.nth(picker).click()
                    pickers.nth(picker).fill(key)
                    page.locator(f".du-bois-light-select-item-option[title='{key}']").first.click()
                page.keyboard.press("Escape")
            axes = page.locator(".js-plotly-plot").first.inner_text()
            _expect(all(k in axes for k in ("tracking.variant", "tau", "speedup")), step, f"plot axes: {axes!r}")
            seen.note(f"{step}: {' vs '.join(runs)}, parallel coordinates over tracking.variant, tau, speedup")
            shot("3-compare.png")

            # 4. a plot artifact of the study run
            step = "4 plot"
            page.go_back()
            page.locator(".ag-pinned-left-cols-container a").filter(has_text=experiment).first.click()
            page.wait_for_url("**/runs/**")
            _hide_assistant(page)
            page.get_by_role("tab", name="Artifacts").first.click()
            page.get_by_text("plots", exact=True).first.click()
            page.get_by_text(Path(STUDY_PLOT).name, exact=True).first.click()
            page.get_by_text(STUDY_PLOT, exact=True).first.wait_for()  # the preview's title
            page.wait_for_function("() => [...document.images].some(i => i.complete && i.naturalWidth > 300)")
            seen.note(f"{step}: {STUDY_PLOT} shown")
            shot("4-plot.png")
        except Exception:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(out_dir / "failed.png"))
                seen.note(f"failed at {page.url}; its screenshot: {out_dir / 'failed.png'}")
            raise
        finally:
            browser.close()
    return seen


def _hide_assistant(page) -> None:
    """Close MLflow 3's assistant side panel (it takes a third of the screen) when it is open."""
    close = page.locator("[data-component-id='mlflow.assistant.chat_panel.close']")
    if close.count():
        close.first.click()


def _cell(page, run: str, column: str):
    """The cell of ``column`` in the row of run ``run``: the grid draws a row in two halves (the pinned name
    and checkbox, the scrolled columns), joined by ``row-index``."""
    index = page.locator(".ag-pinned-left-cols-container [role='row']").filter(has_text=run).first.get_attribute(
        "row-index")
    return page.locator(f".ag-center-cols-container [row-index='{index}'] [col-id='{column}']").first


def _number(text: str) -> bool:
    try:
        float(text.replace("…", "").replace("...", ""))
        return True
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", help="tracking URI of a store with an ablation (default: run the smoke ablation "
                                         "into a temporary store and cache)")
    parser.add_argument("--preset", default="smoke", help="the ablation's preset (experiment ablation-<preset>)")
    parser.add_argument("--out", default="docs/screenshots", help="where the screenshots go")
    args = parser.parse_args(argv)
    store = args.store
    with tempfile.TemporaryDirectory() as tmp:
        if store is None:
            os.environ.setdefault("LIT_DOMINO_CACHE", str(Path(tmp) / "artifacts"))
            store = os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{Path(tmp) / 'mlflow.db'}"
            from lit_domino.studies.ablation import run_ablation

            run_ablation(args.preset, out_dir=Path(tmp) / "results", progress=False)
        with mlflow_ui(store) as url:
            seen = check(url, f"ablation-{args.preset}", Path(args.out),
                         (f"domino-{args.preset}-s0", f"backbone-{args.preset}-s0"))
    print("\n".join(["screenshots:", *(f"  {p}" for p in seen.screenshots)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

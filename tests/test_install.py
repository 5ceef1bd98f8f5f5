"""A non-editable install (a wheel of the tracked files) runs the smoke ablation from any directory: the YAML configs
and the shipped target come with the package, and nothing looks for the checkout."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lit_domino"


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=30)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are what a wheel is built from")
    return [p for p in out.stdout.decode().split("\0") if p]


def test_console_scripts_name_functions_that_return_no_results():
    """A console script's return value is its exit status: ``main`` returns the study's dict (rc 1 and the dict
    printed on stderr), so the script must name a function returning None."""
    scripts = _pyproject()["project"]["scripts"]
    assert scripts
    for name, target in scripts.items():
        module, _, attr = target.partition(":")
        func = getattr(importlib.import_module(module), attr, None)
        assert callable(func), f"{name}: {target} does not exist"
        assert func.__annotations__.get("return") in (None, "None"), f"{name}: {target} must return None"


def test_package_data_covers_every_tracked_data_file():
    """What the package reads at run time besides its modules (configs, the shipped target) is in package-data."""
    patterns = _pyproject()["tool"]["setuptools"]["package-data"]["lit_domino"]
    shipped = {p.relative_to(PACKAGE).as_posix() for pattern in patterns for p in PACKAGE.glob(pattern) if p.is_file()}
    data = {p[len("lit_domino/"):] for p in _tracked() if p.startswith("lit_domino/") and not p.endswith(".py")}
    assert data and data <= shipped, f"not in package-data: {sorted(data - shipped)}"
    assert any(p.startswith("configs/studies/") for p in data) and any(p.startswith("assets/targets/") for p in data)


def _copy_tracked(dest: Path) -> None:
    for rel in _tracked():
        src, out = ROOT / rel, dest / rel
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the work tree, not yet committed
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():  # experiments/configs -> ../lit_domino/configs
            os.symlink(os.readlink(src), out)
        else:
            shutil.copy2(src, out)


def _run(cmd: list, cwd: Path, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} rc {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_a_non_editable_install_runs_the_smoke_ablation_from_any_directory(tmp_path):
    t0 = time.monotonic()
    src, dist, work = tmp_path / "src", tmp_path / "dist", tmp_path / "work"
    _copy_tracked(src)
    # the wheel is built by this interpreter's setuptools (an installed dependency, no network): exactly what
    # `pip install <checkout>` installs
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
          "-w", dist, src], tmp_path)
    (wheel,) = dist.glob("lit_domino-*.whl")
    # the venv sits inside an unrelated project: its pyproject.toml is not this package's checkout
    other = tmp_path / "other-project"
    other.mkdir()
    (other / "pyproject.toml").write_text('[project]\nname = "other"\n')
    venv = other / ".venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel], tmp_path)
    # the dependencies: this environment's site-packages as plain path entries (a .pth line adds a folder to
    # sys.path without running the .pth files inside it, so the checkout's editable finder stays out)
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path)
                .stdout.strip())
    deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "_lit_domino_test_deps.pth").write_text("".join(f"{d}\n" for d in deps))

    work.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "LIT_DOMINO_CACHE", "MLFLOW_TRACKING_URI", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONNOUSERSITE="1", TOKENIZERS_PARALLELISM="false")
    where = _run([python, "-c", "import sys, lit_domino; from lit_domino.runtime.paths import project_root; "
                  "from lit_domino.training.configs import CONFIG_DIR; "
                  "print(lit_domino.__file__, project_root(), CONFIG_DIR, "
                  "any('editable' in m for m in sys.modules), sep='\\n')"], work, env).stdout.split("\n")
    assert Path(where[0]).is_relative_to(site), f"lit_domino imported from {where[0]}, not the installed copy"
    assert Path(where[1]) == work.resolve()  # results go where the command runs, not to other-project
    assert Path(where[2]).is_relative_to(site) and where[3] == "False"

    # the smallest job that still reads the packaged study file, preset and variant config, and the shipped target
    proc = _run([venv / "bin" / "lit-domino-ablation", "--preset", "smoke", "--variants", "backbone", "--no-progress",
                 "--set", "data.train_examples={math: 4, code: 2, chat: 2}",
                 "--set", "data.val_examples={math: 2, code: 1, chat: 1}", "--set", "trainer.max_epochs=1"],
                work, env, timeout=400)
    assert "stage 1/4 target embedded:smoke (shipped)" in proc.stdout
    (out,) = (work / "results").glob("ablation-smoke-backbone-set-*")
    main = (out / "main.md").read_text()
    assert "| backbone-only (DFlash) |" in main  # the label from the packaged studies/ablation.yaml
    assert (out / "ablations.md").is_file() and (out / "rows.json").is_file()
    assert f"written to {out}" in proc.stdout and "{'tables'" not in proc.stdout + proc.stderr
    assert (work / "artifacts" / "drafters").is_dir() and (work / "mlflow.db").is_file()
    assert not (other / "results").exists() and not (src / "results").exists()
    print(f"install + smoke ablation from a wheel: {time.monotonic() - t0:.0f} s")

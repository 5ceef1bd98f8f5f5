"""Where the project lives (no heavy imports: worker processes import this first)."""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]
"""The ``lit_domino`` package folder (a checkout's, or an installed copy's in site-packages)."""


def project_root() -> Path:
    """The checkout this package runs from (the folder holding ``lit_domino/`` and ``pyproject.toml``), else the
    cwd: an installed copy writes its results, cache and MLflow store where it is run. Only the package's own
    parent counts: a venv inside another project (``other/.venv/lib/.../site-packages``) must not adopt that
    project's ``pyproject.toml``."""
    root = PACKAGE_DIR.parent
    if (root / "pyproject.toml").is_file():
        return root
    return Path.cwd().resolve()


def project_path(path: str | Path) -> Path:
    """A path a preset or study file names: absolute, or relative to the cwd when it is there, else to the
    checkout (:func:`project_root`), so that a preset can name files that ship with the checkout (the rehearsal's
    local copies of the paper's prompt sets) and still run from any directory."""
    path = Path(path).expanduser()
    if path.is_absolute() or path.exists():
        return path
    return project_root() / path

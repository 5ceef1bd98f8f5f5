"""Where the project lives (no heavy imports: worker processes import this first)."""

from __future__ import annotations

from pathlib import Path


def project_root() -> Path:
    """The repository root: the nearest ancestor of this package holding ``pyproject.toml`` (else the cwd)."""
    here = Path(__file__).resolve().parent
    for parent in [here, *here.parents]:
        if (parent / "pyproject.toml").is_file():
            return parent
    return Path.cwd().resolve()

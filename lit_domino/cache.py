"""The artifact cache: one root holding every built artifact, keyed by config hash.

Layout: ``<root>/<kind>/<name>-<hash>/`` where ``hash`` is a SHA-256 of the canonical
JSON of the config that made the artifact. A finished artifact holds ``artifact.json``
(that config; not ``config.json``, which model directories use) and a ``.complete`` marker; anything without the marker is an interrupted build and
is never reused as finished (builders may resume from its partial content).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

CACHE_ENV = "LIT_DOMINO_CACHE"
"""Environment variable that overrides the cache root (default ``./artifacts``)."""

_COMPLETE = ".complete"
ARTIFACT_CONFIG = "artifact.json"
"""The config that built an artifact (model directories keep their own ``config.json``)."""


def cache_root() -> Path:
    """The cache root: ``$LIT_DOMINO_CACHE`` if set, else ``./artifacts`` (relative to the cwd)."""
    return Path(os.environ.get(CACHE_ENV, "artifacts")).expanduser().resolve()


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, paths and tuples → plain JSON types (dict keys sorted later by json.dumps)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def config_hash(obj: Any, length: int = 12) -> str:
    """A stable short hash of a config (dataclass or dict): same config → same hash, on any machine."""
    blob = json.dumps(to_jsonable(obj), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def artifact_dir(kind: str, config: Any, name: str | None = None, root: Path | None = None) -> Path:
    """The directory of the artifact ``kind`` built from ``config`` (not created)."""
    tag = f"{name}-{config_hash(config)}" if name else config_hash(config)
    return (root or cache_root()) / kind / tag


def is_complete(path: Path) -> bool:
    """True when ``path`` holds a finished artifact."""
    return (Path(path) / _COMPLETE).is_file()


def mark_complete(path: Path, config: Any) -> None:
    """Write the artifact's config next to it and mark it finished (last step of a build)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / ARTIFACT_CONFIG).write_text(json.dumps(to_jsonable(config), indent=2, sort_keys=True))
    (path / _COMPLETE).write_text("ok\n")


def clear(path: Path) -> None:
    """Remove a (possibly partial) artifact."""
    shutil.rmtree(path, ignore_errors=True)

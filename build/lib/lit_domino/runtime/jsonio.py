"""Strict JSON: :func:`to_json` / :func:`write_json` (NaN and ±inf → ``null``, numpy/torch numbers → Python,
Paths → str), written atomically through the artifact cache's writer."""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable, Mapping
from pathlib import Path, PurePath
from typing import Any

from lit_domino.runtime import cache



def _key(k) -> str:
    """A dict key as JSON names it (``None`` → ``"null"``, ``True`` → ``"true"``, ``3`` → ``"3"``)."""
    if isinstance(k, str):
        return k
    return json.dumps(k) if k is None or isinstance(k, bool) else str(k)  # as json.dumps names them


def _plain(obj, convert: Callable | None, finite_only: bool):
    """:func:`to_json`'s walk; ``finite_only=False`` keeps NaN/±inf (to find where they are)."""
    if convert is not None:
        obj = convert(obj)
    if isinstance(obj, bool) or obj is None or isinstance(obj, (str, int)):
        return obj
    if isinstance(obj, float):
        return float(obj) if math.isfinite(obj) or not finite_only else None
    if isinstance(obj, Mapping):
        return {_key(k): _plain(v, convert, finite_only) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v, convert, finite_only) for v in obj]
    if isinstance(obj, PurePath):
        return str(obj)
    if hasattr(obj, "tolist") and hasattr(obj, "dtype"):  # numpy / torch scalars and arrays
        return _plain(obj.tolist(), convert, finite_only)
    return obj  # anything else: json.dumps says it cannot encode it


def to_json(obj: Any, convert: Callable[[Any], Any] | None = None) -> Any:
    """``obj`` as plain JSON types: NaN and ±inf → None, numpy/torch numbers → Python, Paths → str,
    tuples → lists, dict keys → str. ``convert`` is applied to every value first (e.g. table cells → dicts)."""
    return _plain(obj, convert, finite_only=True)


def write_json(obj: Any, path: str | Path, indent: int = 1, convert: Callable[[Any], Any] | None = None) -> Path:
    """Write :func:`to_json` of ``obj`` to ``path`` as strict JSON (no bare NaN/Infinity), atomically; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return cache.write_text_atomic(path, json.dumps(to_json(obj, convert), indent=indent, allow_nan=False))


def finite(x) -> bool:
    """True for a real, finite number (not None, NaN, ±inf, a bool or a string)."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)
